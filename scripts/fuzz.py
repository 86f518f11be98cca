#!/usr/bin/env python3
"""Fuzz campaign: mutated capture files and HTTP/SSE/JSON streams through the
real recording chain (reassembly → http1 → streams → redaction → token
collector), with hypothesis drawing the mutations.

Three kinds of case, from a seed corpus taken from ``pcaps/``:

* ``capture``: the bytes of a small capture file, mutated (bit flips, inserted
  tokens, deleted/duplicated ranges, truncation), replayed from a file;
* ``flows``: the reassembled byte streams of a capture (both directions of
  every connection), one to three of them mutated with HTTP/SSE/JSON-aware
  tokens (deep nesting, huge numbers, lone surrogates, chunk sizes, gzip
  headers, a small gzip bomb …), each cut at random points;
* ``json``: one SSE data item, mutated, through every dialect, the JSON-text
  redaction, the secret-field scrubber and the token masker;
* ``upgrade``: a keep-alive connection that switches to HTTP/2 with
  ``Upgrade: h2c`` at any position (0–3 HTTP/1.1 exchanges before it, 0–2
  HTTP/2 streams after it; bytes from real h2 endpoints, ``h2c_wire.py``), the
  preface before or after the 101, refused, coalesced with the request, a 101
  before the request is whole, garbage or nothing instead of the preface, an
  HTTP/1.1 request pipelined after the offer; each write cut at random
  offsets, one in four mutated. Unmutated, the rows are checked against what
  the server streamed (a wrong row is a crash too).
* ``caps``: a chat stream (SSE or NDJSON) built at the stream stage's caps,
  lowered for the run (line cap, events without output, request body): item
  lines at and just over the line cap, floods of empty events around the
  events cap, items after the end marker, a request body around its cap, its
  bytes cut at random points. Besides crashing nothing, the stream must carry
  exactly the flags the generator knows it earned, and its text must be the
  content of the items that were neither over the cap nor after the marker.
* ``overlaps``: the TCP segments of a capture with overlapping retransmissions
  inserted (a random part of a data segment sent again right after it), of the
  same bytes or with one byte changed. Beyond crashes this checks an oracle:
  the stored streams (states, texts, counts) are those of the capture without
  them, and only the changed copies give ``overlap-mismatch`` (at least one on
  a capture clean of retransmissions, none with the same bytes).
* ``ints``: one or all of the integers in the JSON of a bundled stream's item
  (and of its request) set to a value at the edge of a width (2^31-1, 2^31,
  2^32, 2^63-1, 2^63, 2^64, -1, -2^63-1, 10^30, 1e400, a boolean), the exchange
  re-framed and put through the pipeline into a real SQLite store beside an
  unchanged "canary" copy on another connection (issue #24).
* ``diff`` (not in the default campaign: ``--kind diff``, ``make fuzz-diff``):
  differential, the pure core against the native one (``fuzz_diff.py``). A
  case is one of the bundled captures (``pcaps/**``, up to 64 KiB) with its
  file bytes mutated, or its TCP segments reordered / duplicated / overlapped
  (same or changed bytes) / dropped / truncated / the capture cut off, or its
  flows mutated and cut at random offsets (the eBPF road); it is stored once
  by each core, in a worker process of its own (``SPARSEETY_PURE=1`` for the
  pure one), through the default recording chain (redaction, token rows) into
  a fresh SQLite file. Any difference between the two stores (every table,
  every column) or between the replay summaries is a crash; the case is
  reduced and saved to ``--out`` with both dumps (``diff-N.*``).

A crash is an exception escaping the chain, a connection dropped by the
pipeline's last-resort handler (``internal_errors``), a stream opened but never
closed, or text still held by the redactor after the flush; for ``ints`` also
a row the database refused (an integer that reached the writer unchecked), an
integer stored outside its column's width on PostgreSQL (32-bit ``Integer``,
64-bit ``BigInteger``), or a canary stored differently from a clean run. A hang is a case
running longer than ``--timeout`` seconds (SIGALRM). Crashing inputs are saved
to ``--out``. Prints cases, crashes, hangs, max RSS and time; exit code 1 when
anything crashed or hung.

Usage: ``python scripts/fuzz.py [--cases 100000] [--kind capture,flows,...]
[--seconds S]`` (``make fuzz``; ``make fuzz-diff`` for ``--kind diff``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sniffer.capture.pcap import CaptureFileError, read_capture  # noqa: E402
from sniffer.core.credentials import scrub_json_secrets  # noqa: E402
from sniffer.core.events import (  # noqa: E402
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    EndReason,
    FlowData,
    FlowEvent,
    HttpBody,
    HttpEnd,
    HttpRequest,
    HttpResponse,
    PipelineError,
    Segment,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamFlagged,
    StreamOpened,
)
from sniffer.core.pipeline import Pipeline  # noqa: E402
from sniffer.core.reassembly import Reassembler  # noqa: E402
from sniffer.core.streams import StreamAssembler  # noqa: E402
from sniffer.llm.dialects import REGISTRY  # noqa: E402
from sniffer.record.redact import Redactor, StreamRedactor, _mask_tokens_json  # noqa: E402
from sniffer.record.token_collector import TokenCollector  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from fuzz_diff import (  # noqa: E402
    NATIVE_HTTP_HELP,
    SEG_OPS,
    Case,
    DiffRunner,
    cut_flows,
    mutate_segments,
    pcap_of,
    save,
)
from h2c_wire import chat_request, upgrade_wire  # noqa: E402

SEEDS = (
    "nonstream_chat",
    "chat_mixed_tpc3",
    "client_abort",
    "error_midstream",
    "dialect_tgi_stream",
    "dialect_ollama_stream",
    "dialect_anthropic_nonstream",
    "dialect_responses_nonstream",
    "sec_pii",
    "sec_secrets",
    "include_usage",
    "fault_lost",
)

#: The bundled streams whose items the ``ints`` cases edit: every dialect,
#: n > 1, usage chunks, logprobs (token ids), reasoning and tool calls.
INT_SEEDS = (
    "n2",
    "include_usage",
    "completions",
    "reasoning_tools",
    "llamacpp_style",
    "dialect_anthropic_stream",
    "dialect_anthropic_nonstream",
    "dialect_responses_stream",
    "dialect_responses_nonstream",
    "dialect_tgi_stream",
    "dialect_tgi_nonstream",
    "dialect_ollama_stream",
    "dialect_ollama_nonstream",
    "sec_pii",
)

#: Tokens inserted by mutation: HTTP framing, SSE syntax, hostile JSON.
TOKENS: tuple[bytes, ...] = (
    b"[" * 3000,
    b"{" * 3000,
    b'{"a":' * 1500,
    b"9" * 5000,
    b"1e999999",
    b"-0.0e-9999",
    b'"\\ud83d"',
    b'"\\u0000"',
    b"\xff\xfe\xed",
    b"\r\n",
    b"\n\n",
    b"\r\n\r\n",
    b"data: ",
    b"data: [DONE]\n\n",
    b"event: error\n",
    b": ping\n",
    b"\xef\xbb\xbf",
    b'{"choices":[{"index":0,"delta":{"content":"x"}}]}',
    b'{"choices":null,"usage":{"prompt_tokens":1e400}}',
    b'"index":-99999999999999999999',
    b"null",
    b"0\r\n\r\n",
    b"ffffffffffffffff\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: 99999999999\r\n",
    b"Content-Length: -1\r\n",
    b"Content-Encoding: gzip\r\n",
    b"Content-Encoding: deflate, gzip\r\n",
    b"Content-Type: text/event-stream\r\n",
    b"Content-Type: application/x-ndjson\r\n",
    b"Authorization Bearer sk-abcdefghijklmnopqrstuvwxyz\r\n",
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",
    gzip.compress(b"\0" * (4 << 20), 9),
    b"138 1234 5678 a@b.co sk-" + b"A" * 40,
)

_MUTATION = st.tuples(
    st.sampled_from(("flip", "insert", "delete", "dup", "truncate", "byte")),
    st.floats(0.0, 1.0, allow_nan=False),
    st.integers(0, 4096),
)
MUTATIONS = st.lists(_MUTATION, min_size=1, max_size=6)
_FRACTION = st.floats(0.0, 0.999, allow_nan=False)


def mutate(data: bytes, ops: list[tuple[str, float, int]], floor: int = 0) -> bytes:
    """Apply ``ops`` to ``data`` (positions as fractions of the length, never
    before ``floor``: a capture's file header)."""
    b = bytearray(data)
    for kind, frac, arg in ops:
        n = len(b)
        pos = floor + int(frac * max(0, n - floor))
        if kind == "flip" and pos < n:
            b[pos] ^= 1 << (arg % 8)
        elif kind == "byte" and pos < n:
            b[pos] = arg % 256
        elif kind == "insert":
            b[pos:pos] = TOKENS[arg % len(TOKENS)]
        elif kind == "delete":
            del b[pos : pos + 1 + arg % 512]
        elif kind == "dup":
            b[pos:pos] = b[pos : pos + 1 + arg % 2048]
        elif kind == "truncate" and pos > floor:
            del b[pos:]
    return bytes(b)


# --------------------------------------------------------------------- corpus


@dataclass
class Exchange:
    """A bundled stream's exchange, as the fuzzer re-frames it: the request's
    path and JSON body, the response's content type and its items (SSE data,
    NDJSON lines, or one JSON body)."""

    path: str
    request: str
    ctype: str
    items: list[str]


@dataclass
class Corpus:
    captures: list[bytes] = field(default_factory=list)
    flows: list[list[FlowEvent]] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    segments: list[list[Segment]] = field(default_factory=list)
    #: per capture in ``segments``: what it stores, and whether it carries
    #: retransmissions or gaps of its own (then a changed copy may go unseen)
    baselines: list[tuple[Any, bool]] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)


def load_corpus(pcaps: Path) -> Corpus:
    c = Corpus()
    for name in dict.fromkeys((*SEEDS, *INT_SEEDS)):
        path = pcaps / f"{name}.pcap"
        if not path.exists():
            path = pcaps / "faults" / f"{name}.pcap"
        if not path.exists():
            continue
        r = Reassembler()
        flows: list[FlowEvent] = []
        last = 0.0
        for seg in read_capture(path):
            flows.extend(r.feed(seg))
            last = seg.ts
        flows.extend(r.flush(last))
        if name in INT_SEEDS:
            c.exchanges.extend(_exchanges(flows))
        if name not in SEEDS:
            continue
        c.captures.append(path.read_bytes())
        c.flows.append(flows)
        segs = list(read_capture(path))
        c.segments.append(segs)
        pipe = Pipeline()
        events = [ev for seg in segs for ev in pipe.feed(seg)]
        events += pipe.flush(segs[-1].ts if segs else 0.0)
        counts = pipe.reassembly_counts()
        c.baselines.append((_stored(events), bool(counts["retransmission"] or counts["gap"])))
        for ev in flows:
            if isinstance(ev, FlowData):
                for line in bytes(ev.data).split(b"\n"):
                    if line.startswith(b"data: {"):
                        c.items.append(line[6:].decode("utf-8", "replace"))
    c.items = c.items[:200]
    return c


def _exchanges(flows: list[FlowEvent]) -> list[Exchange]:
    """The exchanges of one capture's flows, read with the sniffer's own HTTP
    stage (a seed, not a result under test)."""
    from sniffer.core.events import HttpBody, HttpRequest, HttpResponse
    from sniffer.core.http1 import HttpParser

    http = HttpParser()
    heads: dict[tuple[int, int], list[Any]] = {}
    for flow in flows:
        for ev in http.feed(flow):
            key = (ev.conn, getattr(ev, "exchange", -1))
            entry = heads.setdefault(key, ["", bytearray(), "", bytearray()])
            if isinstance(ev, HttpRequest):
                entry[0] = ev.target
            elif isinstance(ev, HttpResponse) and not ev.informational:
                entry[2] = dict(ev.headers).get("content-type", "").split(";")[0]
            elif isinstance(ev, HttpBody):
                entry[1 if ev.from_client else 3] += ev.data
    out: list[Exchange] = []
    for path, req, ctype, body in heads.values():
        text = bytes(body).decode("utf-8", "replace")
        if not path or not req or not text:
            continue
        if ctype == "text/event-stream":
            items = [ln[5:].lstrip(" ") for ln in text.splitlines() if ln.startswith("data:")]
        elif "ndjson" in ctype:
            items = [ln for ln in text.splitlines() if ln.strip()]
        else:
            items = [text]
        out.append(Exchange(path, bytes(req).decode("utf-8", "replace"), ctype, items))
    return out


# ---------------------------------------------------------------------- cases


class Crash(Exception):
    pass


class Hang(Exception):
    pass


_LAST_INTERNAL: list[str] = [""]


def _chain(pipe: Pipeline, events: list[Any], chain: StreamRedactor, col: TokenCollector) -> None:
    for ev in events:
        if isinstance(ev, PipelineError) and ev.stage == "pipeline":
            _LAST_INTERNAL[0] = ev.message
    col.observe(events)
    chain.events(events)


def _check(pipe: Pipeline, opened: int, closed: int, chain: StreamRedactor) -> None:
    if pipe.internal_errors:
        raise Crash(f"pipeline dropped a connection: {_LAST_INTERNAL[0][:120]}")
    if opened != closed:
        raise Crash(f"{opened} streams opened, {closed} closed")
    st_ = pipe.streams.stats
    if st_.streams_opened != st_.streams_closed:
        raise Crash("stream stats disagree")
    if chain.held:
        raise Crash(f"redactor still holds {chain.held} chunk events")


def _count(events: list[Any], acc: list[int]) -> None:
    for ev in events:
        t = type(ev)
        if t is StreamOpened:
            acc[0] += 1
        elif t is StreamClosed:
            acc[1] += 1


def run_capture(data: bytes, tmpdir: str) -> None:
    path = os.path.join(tmpdir, "case.pcap")
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        reader = read_capture(path)
    except CaptureFileError:
        return
    pipe = Pipeline()
    red = Redactor()
    chain, col = StreamRedactor(red), TokenCollector(redactor=red)
    acc = [0, 0]
    last = 0.0
    for seg in reader:
        out = pipe.feed(seg)
        last = seg.ts
        if out:
            _count(out, acc)
            _chain(pipe, out, chain, col)
    out = pipe.flush(last)
    _count(out, acc)
    _chain(pipe, out, chain, col)
    chain.events(chain.flush())
    col.take()
    _check(pipe, acc[0], acc[1], chain)


def run_flows(flows: list[FlowEvent], cuts: list[float]) -> None:
    pipe = Pipeline()
    red = Redactor()
    chain, col = StreamRedactor(red), TokenCollector(redactor=red)
    acc = [0, 0]
    ci = 0
    last = 0.0
    for ev in flows:
        last = ev.ts
        if isinstance(ev, FlowData) and cuts:
            data = bytes(ev.data)
            k = 1 + int(cuts[ci % len(cuts)] * 3)
            ci += 1
            step = max(1, len(data) // k)
            parts = [
                FlowData(ev.conn, ev.ts, ev.from_client, data[i : i + step])
                for i in range(0, len(data), step)
            ]
            out = pipe.feed_flows(parts)
        else:
            out = pipe.feed_flows([ev])
        _count(out, acc)
        _chain(pipe, out, chain, col)
    out = pipe.flush(last + 1)
    _count(out, acc)
    _chain(pipe, out, chain, col)
    chain.events(chain.flush())
    col.take()
    _check(pipe, acc[0], acc[1], chain)


#: How an ``upgrade`` case departs from a clean upgrade.
UPGRADE_VARIANTS = (
    "clean",
    "coalesced",
    "early",
    "refused",
    "garbage",
    "no-preface",
    "pipelined",
)
#: Variants after which the client sent no HTTP/2 preface: an h2c error is due.
UPGRADE_NO_PREFACE = ("garbage", "no-preface", "pipelined")


def upgrade_case(seed: int) -> tuple[str, list[tuple[bool, bytes]], list[str], int]:
    """The wire of one ``upgrade`` case, the text of each exchange, and the
    exchange that carried the offer (-1: refused)."""
    before, after = seed % 4, (seed // 4) % 3
    preface_first = bool((seed // 12) % 2)
    variant = UPGRADE_VARIANTS[(seed // 24) % len(UPGRADE_VARIANTS)]
    up = upgrade_wire(
        before,
        port=18499,
        preface_first=preface_first or variant == "coalesced",
        after=after,
        refused=variant == "refused",
        pieces=1 + seed % 3,
    )
    wire = list(up.wire)
    texts = ["".join(p) for p in up.pieces]
    if up.upgraded < 0:
        return variant, wire, texts, -1
    i = next(k for k, (fc, d) in enumerate(wire) if fc and b"Upgrade: h2c" in d)
    j = next(k for k, (fc, d) in enumerate(wire) if fc and d.startswith(b"PRI * HTTP/2.0"))
    if variant == "coalesced":
        wire[i : j + 1] = [(True, wire[i][1] + wire[j][1])]
    elif variant == "early":
        srv = next(k for k, (fc, _) in enumerate(wire) if k > i and not fc)
        req = wire[i][1]
        moved = [w for k, w in enumerate(wire) if i < k < srv]
        wire[i : srv + 1] = [(True, req[:-10]), wire[srv], (True, req[-10:]), *moved]
    elif variant == "garbage":
        wire[j] = (True, b"\x00\x01 not HTTP/2 at all \xff" * 3)
    elif variant == "no-preface":
        del wire[j]
    elif variant == "pipelined":
        del wire[j]
        wire[i] = (True, wire[i][1] + chat_request(18499, "pipelined"))
    return variant, wire, texts, up.upgraded


def run_upgrade(
    seed: int, ops: list[tuple[str, float, int]], cuts: list[float], which: int
) -> None:
    variant, wire, texts, upgraded = upgrade_case(seed)
    mutated = which % 4 == 0
    if mutated:
        k = which % len(wire)
        wire[k] = (wire[k][0], mutate(wire[k][1], ops))
    flows: list[FlowEvent] = [
        ConnectionOpened(1, 0.5, ("127.0.0.1", 40000), ("127.0.0.1", 18499), True)
    ]
    ts = 1.0
    for n, (fc, data) in enumerate(wire):
        at = (
            sorted({int(cuts[(n + m) % len(cuts)] * len(data)) for m in range(len(cuts))})
            if cuts
            else []
        )
        for a, b in zip([0, *at], [*at, len(data)], strict=True):
            if b > a:
                flows.append(FlowData(1, ts, fc, data[a:b]))
                ts += 0.001
    flows.append(ConnectionClosed(1, ts + 1, "fin"))
    pipe = Pipeline()
    red = Redactor()
    chain, col = StreamRedactor(red), TokenCollector(redactor=red)
    acc = [0, 0]
    events: list[Any] = []
    for ev in flows:
        out = pipe.feed_flows([ev])
        events += out
        _count(out, acc)
        _chain(pipe, out, chain, col)
    out = pipe.flush(ts + 2)
    events += out
    _count(out, acc)
    _chain(pipe, out, chain, col)
    chain.events(chain.flush())
    col.take()
    _check(pipe, acc[0], acc[1], chain)
    if mutated:
        return
    exchange = {e.stream: e.exchange for e in events if type(e) is StreamOpened}
    text: dict[int, str] = {}
    for e in events:
        if type(e) is ChunkEvent and e.stream in exchange:
            text[exchange[e.stream]] = text.get(exchange[e.stream], "") + (e.text or "")
    state = {exchange[e.stream]: e.state.value for e in events if type(e) is StreamClosed}
    errors = [e for e in events if type(e) is PipelineError]
    # without a preface the streams after the upgraded one may be lost (recorded)
    due = range(len(texts) if variant not in UPGRADE_NO_PREFACE else upgraded + 1)
    got = [(ex, state.get(ex), text.get(ex, "")) for ex in due]
    if got != [(ex, "complete", texts[ex]) for ex in due]:
        raise Crash(f"upgrade {variant} seed {seed}: rows {got} != {texts}")
    h2c = [e for e in errors if e.kind == "h2c"]
    if variant in UPGRADE_NO_PREFACE and not h2c:
        raise Crash(f"upgrade {variant} seed {seed}: no h2c error recorded")
    if variant not in UPGRADE_NO_PREFACE and errors:
        raise Crash(f"upgrade {variant} seed {seed}: errors {errors[:2]}")


def _stored(events: list[Any]) -> list[tuple[Any, ...]]:
    """What the store keeps of each stream, but for capture times and flags."""
    texts: dict[int, list[str]] = {}
    for ev in events:
        if type(ev) is ChunkEvent:
            texts.setdefault(ev.stream, []).append(ev.text)
    return [
        (e.stream, e.state, e.reason, e.text_len, e.chunk_count, texts.get(e.stream, []))
        for e in events
        if type(e) is StreamClosed
    ]


def run_overlaps(
    segs: list[Segment], baseline: tuple[Any, bool], plan: list[tuple[float, float, float, bool]]
) -> None:
    """``segs`` with, after each data segment the plan picks, a copy of part of
    it (``(which, start, length, changed)`` as fractions)."""
    data = [i for i, s in enumerate(segs) if s.payload]
    if not data:
        return
    extra: dict[int, list[Segment]] = {}
    changed = 0
    for which, start, length, alter in plan:
        i = data[int(which * len(data)) % len(data)]
        seg = segs[i]
        n = len(seg.payload)
        a = int(start * n) % n
        b = a + 1 + int(length * (n - a - 1))
        piece = seg.payload[a:b]
        if alter:
            piece = bytes([piece[0] ^ 0x20]) + piece[1:]
            changed += 1
        extra.setdefault(i, []).append(seg._replace(seq=(seg.seq + a) & 0xFFFFFFFF, payload=piece))
    pipe = Pipeline()
    red = Redactor()
    chain, col = StreamRedactor(red), TokenCollector(redactor=red)
    acc = [0, 0]
    events: list[Any] = []
    for i, seg in enumerate(segs):
        for s in (seg, *extra.get(i, ())):
            out = pipe.feed(s)
            if out:
                _count(out, acc)
                _chain(pipe, out, chain, col)
                events += out
    out = pipe.flush(segs[-1].ts)
    _count(out, acc)
    _chain(pipe, out, chain, col)
    events += out
    chain.events(chain.flush())
    col.take()
    _check(pipe, acc[0], acc[1], chain)
    want, dirty = baseline
    if _stored(events) != want:
        raise Crash("overlapping retransmissions changed what is stored")
    mismatches = pipe.reassembly_counts()["overlap-mismatch"]
    if not changed and mismatches:
        raise Crash("the same bytes again gave an overlap mismatch")
    if changed and not dirty and not mismatches:
        raise Crash("a changed copy gave no overlap mismatch")
    rows = sum(1 for e in events if type(e) is PipelineError and e.kind == "overlap-mismatch")
    flagged = any(type(e) in (StreamClosed, StreamFlagged) and e.flags for e in events)
    if mismatches and not (rows and flagged):
        raise Crash("an overlap mismatch left no errors row or no flag")


def run_json(item: str) -> None:
    for _match, factory in REGISTRY:
        dialect = factory()
        dialect.event(item, "message")
        dialect.event(item, "ndjson")
        dialect.body(item)
    red = Redactor()
    red.json_text(item)
    red.text(item)
    scrub_json_secrets(item)
    _mask_tokens_json(item)


#: The caps of the ``caps`` cases, lowered from the defaults so that a case
#: costs kilobytes: line cap (characters), events without output, request bytes.
CAP_LINE, CAP_QUIET, CAP_REQUEST = 96, 12, 256


def _cap_item(content: str, ndjson: bool) -> str:
    if ndjson:
        return (
            f'{{"model":"m","message":{{"role":"assistant","content":"{content}"}},"done":false}}'
        )
    return f'{{"choices":[{{"index":0,"delta":{{"content":"{content}"}}}}]}}'


def run_caps(
    ndjson: bool, plan: list[tuple[str, int]], request_len: int, cuts: list[float]
) -> None:
    """One ``caps`` case: ``plan`` is the body, in order: ("text", n) a content
    item whose line is ``CAP_LINE - 2 + n`` characters long (n in 0..4: at and
    just over the cap), ("empty", n) n events without output, ("done", 0) the
    end marker (what follows comes after it)."""
    header = len(_cap_item("", ndjson)) + (0 if ndjson else len("data: "))  # around the content
    lines: list[str] = []
    text: list[str] = []
    over = after = False
    quiet = 0
    done = False
    for what, n in plan:
        if what == "text":
            content = "x" * (CAP_LINE - 2 + n - header)
            line = _cap_item(content, ndjson)
            if not ndjson:
                line = "data: " + line
            lines.append(line)
            if len(line) > CAP_LINE:  # dropped by the decoder, before or after the marker
                over = True
            elif done:
                after, quiet = True, quiet + 1
            else:
                text.append(content)
        elif what == "empty":
            lines += ["{}" if ndjson else "data:"] * n
            after = after or (done and n > 0)
            quiet += n
        elif not done:
            lines.append(
                '{"model":"m","message":{"content":""},"done":true}' if ndjson else "data: [DONE]"
            )
            done = True
    body = "".join(line + ("\n" if ndjson else "\n\n") for line in lines).encode()
    request = (
        b'{"model":"m","stream":true,"n":1,"messages":[{"content":"' + b"p" * request_len + b'"}]}'
    )
    ctype = "application/x-ndjson" if ndjson else "text/event-stream"
    path = "/api/chat" if ndjson else "/v1/chat/completions"
    a = StreamAssembler(max_line=CAP_LINE, max_quiet_events=CAP_QUIET, max_request_body=CAP_REQUEST)
    out: list[StoreEvent] = []
    at = sorted({int(c * len(body)) for c in cuts})
    pieces = [body[i:j] for i, j in zip([0, *at], [*at, len(body)], strict=True)]
    for ev in (
        ConnectionOpened(1, 0.0, ("127.0.0.1", 1), ("127.0.0.1", 2), True),
        HttpRequest(1, 0, 1.0, "POST", path, "1.1", ()),
        HttpBody(1, 0, 1.0, True, request),
        HttpEnd(1, 0, 1.0, True, EndReason.COMPLETE),
        HttpResponse(1, 0, 2.0, 200, "OK", "1.1", (("content-type", ctype),)),
        *(HttpBody(1, 0, 3.0, False, p) for p in pieces if p),
        HttpEnd(1, 0, 4.0, False, EndReason.COMPLETE),
    ):
        a.feed_into(ev, out)
    closed = [e for e in out if isinstance(e, StreamClosed)]
    if len(closed) != 1:
        raise Crash(f"{len(closed)} StreamClosed")
    c = closed[0]
    # an NDJSON done line carries no output either, but it is the marker, not quiet
    want = {
        StreamFlag.ITEM_OVER_CAP: over,
        StreamFlag.EVENTS_CAPPED: quiet > CAP_QUIET,
        StreamFlag.AFTER_DONE: after,
        StreamFlag.REQUEST_CUT: len(request) > CAP_REQUEST,
    }
    got = {f: f in c.flags for f in want}
    if got != want:
        raise Crash(f"flags {sorted(c.flags)}, expected {sorted(f for f, v in want.items() if v)}")
    stored = "".join(e.text for e in out if isinstance(e, ChunkEvent))
    if stored != "".join(text) or c.text_len != len(stored):
        raise Crash(f"text of {len(stored)} characters, expected {len(''.join(text))}")
    rows = sum(1 for e in out if isinstance(e, ChunkEvent) and e.kind in ("other", "after_done"))
    if rows > CAP_QUIET:
        raise Crash(f"{rows} rows of events without output stored (cap {CAP_QUIET})")


_CAP_PLAN = st.lists(
    st.one_of(
        st.tuples(st.just("text"), st.integers(0, 4)),
        st.tuples(st.just("empty"), st.integers(0, 2 * CAP_QUIET)),
        st.tuples(st.just("done"), st.just(0)),
    ),
    max_size=10,
)


#: Integers at the edges of every width (and what a float or a boolean does
#: where an integer goes): the store's 32- and 64-bit columns, the tokenizers'
#: 32-bit unsigned ids, JSON numbers no column holds.
INT_EDGES: tuple[Any, ...] = (
    0,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    2**64,
    -1,
    -(2**31) - 1,
    -(2**63) - 1,
    10**30,
    float("inf"),
    True,
)


def _int_paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where a parsed JSON value holds integers (not booleans)."""
    out: list[tuple[Any, ...]] = []
    stack = [(obj, path)]
    while stack:
        v, p = stack.pop()
        if type(v) is int:
            out.append(p)
        elif type(v) is dict:
            stack.extend((x, (*p, k)) for k, x in v.items())
        elif type(v) is list:
            stack.extend((x, (*p, i)) for i, x in enumerate(v))
    return sorted(out, key=repr)


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def edge_ints(text: str, which: int, every: bool) -> str:
    """``text`` (JSON) with one integer (``every``: all of them) set to an edge value."""
    import json

    try:
        obj = json.loads(text)
    except ValueError:
        return text
    paths = _int_paths(obj)
    if not paths:
        return text
    chosen = paths if every else [paths[which % len(paths)]]
    for k, path in enumerate(chosen):
        _set(obj, path, INT_EDGES[(which + k) % len(INT_EDGES)])
    return json.dumps(obj)  # inf as Infinity, which Python's parser (the fallback) reads


def _framed(x: Exchange, items: list[str], request: str) -> tuple[bytes, bytes]:
    """The exchange as HTTP/1.1 bytes: the request with a Content-Length, the
    response chunked (one chunk per SSE event / NDJSON line) or with a Content-Length."""
    body = request.encode()
    req = (
        f"POST {x.path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    if x.ctype == "text/event-stream" or "ndjson" in x.ctype:
        sse = x.ctype == "text/event-stream"
        pieces = [(f"data: {i}\n\n" if sse else f"{i}\n").encode() for i in items]
        chunked = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces)
        resp = (
            (
                f"HTTP/1.1 200 OK\r\ncontent-type: {x.ctype}\r\ntransfer-encoding: chunked\r\n\r\n"
            ).encode()
            + chunked
            + b"0\r\n\r\n"
        )
    else:
        data = items[0].encode() if items else b""
        resp = (
            f"HTTP/1.1 200 OK\r\ncontent-type: {x.ctype or 'application/json'}\r\n"
            f"content-length: {len(data)}\r\n\r\n"
        ).encode() + data
    return req, resp


#: what a clean run of each bundled exchange stores (by ``id()`` of the exchange)
_CLEAN: dict[int, list[Any]] = {}


class IntStore:
    """One SQLite file for the ``ints`` cases (ids from its blocks, so that
    cases never collide), and the checks on what each case stored."""

    def __init__(self, tmpdir: str) -> None:
        from sniffer.store.models import metadata
        from sniffer.store.writer import StoreWriter

        self.writer = StoreWriter(os.path.join(tmpdir, "ints.db"))
        self.rejected = 0.0
        #: (table, column, lo, hi): the width of every integer column on PostgreSQL
        self.widths: list[tuple[str, str, int, int]] = []
        for table in ("streams", "chunks", "errors", "connections"):
            for col in metadata.tables[table].columns:
                kind = type(col.type).__name__
                if kind == "Integer":
                    self.widths.append((table, col.name, -(2**31), 2**31 - 1))
                elif kind == "BigInteger":
                    self.widths.append((table, col.name, -(2**63), 2**63 - 1))

    def close(self) -> None:
        self.writer.close()

    def run(self, x: Exchange, items: list[str], request: str) -> None:
        from sniffer.core.events import ConnectionClosed, ConnectionOpened
        from sniffer.core.pipeline import PipelineConfig

        w = self.writer
        pipe = Pipeline(PipelineConfig(conn_ids=w.conn_ids, stream_ids=w.stream_ids))
        bad, canary = w.conn_ids(), w.conn_ids()
        flows: list[FlowEvent] = []
        ts = 1.0
        for conn, port, its, req in (
            (bad, 40001, items, request),
            (canary, 40002, x.items, x.request),
        ):
            wire = _framed(x, its, req)
            flows.append(ConnectionOpened(conn, ts, ("127.0.0.1", port), ("127.0.0.1", 8000), True))
            flows.append(FlowData(conn, ts + 0.1, True, wire[0]))
            flows.append(FlowData(conn, ts + 0.2, False, wire[1]))
            flows.append(ConnectionClosed(conn, ts + 0.3, "fin"))
        out = pipe.feed_flows(flows) + pipe.flush(ts + 1)
        if pipe.internal_errors:
            raise Crash(f"pipeline dropped a connection: {_LAST_INTERNAL[0][:120]}")
        closed = {e.stream: e for e in out if isinstance(e, StreamClosed)}
        opened = {e.stream: e.conn for e in out if isinstance(e, StreamOpened)}
        if set(closed) != set(opened):
            raise Crash("a stream opened and never closed")
        w.write_many(out)
        w.flush()
        if w.stats["rejected_rows"] != self.rejected:
            self.rejected = w.stats["rejected_rows"]
            raise Crash("the database refused a row: an integer reached the store unchecked")
        streams = ",".join(str(s) for s in opened)
        lite = w._lite
        assert lite is not None
        for table, col, lo, hi in self.widths:
            key = {"streams": "id", "connections": "id"}.get(table, "stream_id")
            ids = ",".join(str(c) for c in (bad, canary)) if table == "connections" else streams
            if not ids:
                continue
            got = lite.query(f"SELECT min({col}), max({col}) FROM {table} WHERE {key} IN ({ids})")
            low, high = got[0]
            if low is not None and not lo <= low <= high <= hi:
                raise Crash(f"{table}.{col} holds {low}..{high}, wider than its column")
        # the canary is stored as a clean run stores it
        mine = [e for s, e in closed.items() if opened[s] == canary]
        clean = IntStore.clean(x)
        got = [(e.state, e.text_len, e.chunk_count, e.finish_reasons) for e in mine]
        if got != clean:
            raise Crash(f"canary stored as {got}, a clean run gives {clean}")

    @staticmethod
    def clean(x: Exchange) -> list[Any]:
        """What a clean run of exchange ``x`` alone stores (cached)."""
        from sniffer.core.events import ConnectionClosed, ConnectionOpened

        found = _CLEAN.get(id(x))
        if found is None:
            req, resp = _framed(x, x.items, x.request)
            flows: list[FlowEvent] = [
                ConnectionOpened(1, 1.0, ("127.0.0.1", 40002), ("127.0.0.1", 8000), True),
                FlowData(1, 1.1, True, req),
                FlowData(1, 1.2, False, resp),
                ConnectionClosed(1, 1.3, "fin"),
            ]
            pipe = Pipeline()
            out = pipe.feed_flows(flows) + pipe.flush(2.0)
            found = [
                (e.state, e.text_len, e.chunk_count, e.finish_reasons)
                for e in out
                if isinstance(e, StreamClosed)
            ]
            _CLEAN[id(x)] = found
        return found


def run_ints(store: IntStore, x: Exchange, which: int, every: bool, request: bool) -> None:
    """One bundled exchange with integers at the edges (one item, or its request)."""
    items = list(x.items)
    req = x.request
    if request:
        req = edge_ints(req, which, every)
    elif items:
        k = which % len(items)
        items[k] = edge_ints(items[k], which // len(items), every)
    store.run(x, items, req)


# ----------------------------------------------------------------------- diff

#: Seed captures of the ``diff`` cases: every bundled capture up to this size.
DIFF_MAX_SEED = 64 << 10

_SEG_PLAN = st.lists(
    st.tuples(st.sampled_from(SEG_OPS), _FRACTION, st.integers(0, 1 << 16)),
    min_size=1,
    max_size=6,
)


@dataclass
class DiffSeed:
    name: str
    data: bytes
    segments: list[Segment]
    flows: list[FlowEvent]


def load_diff_seeds(pcaps: Path) -> list[DiffSeed]:
    """The ``diff`` cases' seeds: each capture's bytes, segments and flows
    (reassembled by the pure reassembler: an input, not a result under test)."""
    out: list[DiffSeed] = []
    for path in sorted(pcaps.rglob("*.pcap")):
        if path.stat().st_size > DIFF_MAX_SEED:
            continue
        try:
            segs = list(read_capture(path))
        except CaptureFileError:
            continue
        r = Reassembler()
        flows: list[FlowEvent] = []
        for seg in segs:
            flows.extend(r.feed(seg))
        flows.extend(r.flush(segs[-1].ts if segs else 0.0))
        out.append(DiffSeed(str(path.relative_to(pcaps)), path.read_bytes(), segs, flows))
    return out


def make_diff_case(
    seed: DiffSeed,
    way: str,
    ops: list[tuple[str, float, int]],
    segplan: list[tuple[str, float, int]],
    cuts: list[float],
    which: int,
) -> Case:
    """One ``diff`` case from ``seed``: ``way`` "file" mutates the file's bytes,
    "segments" its segments (re-encoded as a capture file), "flows" its flows
    (mutated, cut)."""
    if way == "file":
        return ("pcap", mutate(seed.data, ops, floor=24))
    if way == "segments":
        return ("pcap", pcap_of(mutate_segments(seed.segments, segplan)))
    flows = list(seed.flows)
    idx = [i for i, ev in enumerate(flows) if isinstance(ev, FlowData)]
    if idx and which % 4:  # one in four only cut, not mutated
        for j in range(1 + which % 3):
            i = idx[(which + j * 7919) % len(idx)]
            ev = flows[i]
            assert isinstance(ev, FlowData)
            flows[i] = FlowData(ev.conn, ev.ts, ev.from_client, mutate(bytes(ev.data), ops))
    return ("flows", cut_flows(flows, cuts, keep_close=which % 5 != 0))


#: What ``make_diff_case``'s ``way`` does (the campaign counts each).
DIFF_WAYS = ("file", "segments", "flows")


def _diff_key(where: str) -> str:
    """A difference's signature: its table and columns, not its values."""
    head, _, rest = where.partition(": ")
    if " row " in head:
        cols = [part.split(": ", 1)[0] for part in rest.split("; ")]
        return f"{head.split(' row ')[0]}: {', '.join(cols)}"[:120]
    if head == "summary":
        return "summary: " + ", ".join(p.split(": ", 1)[0] for p in rest.split("; "))[:100]
    return where[:100]


def run_diff(runner: DiffRunner, case: Case) -> int:
    """Both cores on ``case``; returns the chunk rows the pure one stored."""
    where, answers = runner.compare(case)
    if where is not None:
        raise Difference(where)
    return max(0, len(answers[0].get("tables", {}).get("chunks", [""])) - 1)


class Difference(Exception):
    """The two cores stored a case differently."""


# ------------------------------------------------------------------- campaign


@dataclass
class Report:
    cases: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    hangs: int = 0
    seconds: float = 0.0
    max_rss_mb: float = 0.0
    examples: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.by_kind.items()))
        return (
            f"fuzz: {self.cases} cases ({kinds}) in {self.seconds:.0f} s ({rate:.0f}/s): "
            f"{sum(self.crashes.values())} crashes, {self.hangs} hangs, "
            f"max RSS {self.max_rss_mb:.0f} MB"
        )


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang


#: The default campaign's kinds, as often as each is drawn (``diff`` is asked
#: for by name: it needs the native core and two worker processes).
KINDS = (
    "capture",
    "flows",
    "flows",
    "flows",
    "json",
    "upgrade",
    "caps",
    "overlaps",
    "ints",
    "ints",
)
ALL_KINDS = (*dict.fromkeys(KINDS), "diff")


#: Cases per hypothesis run (see ``campaign``).
ROUND = 1000


class _TimeUp(Exception):
    """``--seconds`` ran out: the campaign stops at the next case."""


# One branch per case kind around shared state (report, timer, workers) (C901).
def campaign(  # noqa: C901
    cases: int,
    *,
    pcaps: Path = REPO / "pcaps",
    timeout: float = 10.0,
    out: Path | None = None,
    progress: bool = False,
    derandomize: bool = False,
    kinds: tuple[str, ...] = KINDS,
    seconds: float | None = None,
    diff_tokens: bool = True,
    native_http: bool = False,
) -> Report:
    """``cases`` cases drawn from ``kinds`` (or as many as ``seconds`` allow)."""
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        raise ValueError(f"unknown kinds {sorted(unknown)}; known: {', '.join(ALL_KINDS)}")
    corpus = load_corpus(pcaps)
    diff_seeds = load_diff_seeds(pcaps) if "diff" in kinds else []
    # the workers' tracebacks name the core; a hang is theirs to time (no SIGALRM)
    runner = (
        DiffRunner(tokens=diff_tokens, timeout=timeout, native_http=native_http)
        if "diff" in kinds
        else None
    )
    report = Report()
    started = time.perf_counter()
    stop_at = None if seconds is None else started + seconds
    tmpdir = tempfile.mkdtemp(
        prefix="sparseety-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    ints = IntStore(tmpdir)
    use_alarm = hasattr(signal, "setitimer")
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _alarm)

    def record_diff(case: Case, exc: Difference) -> None:
        assert runner is not None
        sig = f"diff: {_diff_key(str(exc))}"
        report.crashes[sig] += 1
        if sig not in report.examples and out is not None:
            small = runner.reduce(case, budget=min(120.0, 4 * timeout))
            where, answers = runner.compare(small)
            if where is None:  # the reducer's last step lost it: keep the whole case
                small = case
                where, answers = runner.compare(case)
            name = save(out, len(report.examples), small, answers, where or str(exc))
            report.examples[sig] = name

    def record(kind: str, data: bytes | str, exc: BaseException) -> None:
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else "?"
        sig = f"{kind}: {type(exc).__name__}: {str(exc)[:80]} at {where}"
        report.crashes[sig] += 1
        if sig not in report.examples and out is not None:
            out.mkdir(parents=True, exist_ok=True)
            name = f"crash-{len(report.examples)}.{kind}"
            (out / name).write_bytes(data if isinstance(data, bytes) else data.encode())
            report.examples[sig] = name

    # hypothesis keeps a record of every case it drew for as long as a run
    # lasts (tens of kB each): the campaign is a series of runs of ROUND cases.
    strategies = dict(
        kind=st.sampled_from(kinds),
        seed=st.integers(0, 10_000),
        ops=MUTATIONS,
        cuts=st.lists(st.floats(0.0, 1.0, allow_nan=False), max_size=6),
        which=st.integers(0, 10_000),
        plan=_CAP_PLAN,
        oplan=st.lists(
            st.tuples(_FRACTION, _FRACTION, _FRACTION, st.booleans()), min_size=1, max_size=4
        ),
        segplan=_SEG_PLAN,
        way=st.sampled_from(DIFF_WAYS),
    )

    def one(
        kind: str,
        seed: int,
        ops: list[tuple[str, float, int]],
        cuts: list[float],
        which: int,
        plan: list[tuple[str, int]],
        oplan: list[tuple[float, float, float, bool]],
        segplan: list[tuple[str, float, int]],
        way: str,
    ) -> None:
        if stop_at is not None and time.perf_counter() >= stop_at:
            raise _TimeUp
        if kind == "diff":
            assert runner is not None
            case = make_diff_case(
                diff_seeds[seed % len(diff_seeds)], way, ops, segplan, cuts, which
            )
            report.cases += 1
            report.by_kind[f"diff-{way}"] += 1
            try:
                if run_diff(runner, case):
                    report.by_kind["diff cases that stored chunks"] += 1
            except Difference as exc:
                record_diff(case, exc)
            if progress and report.cases % 500 == 0:
                tell()
            return
        report.cases += 1
        report.by_kind[kind] += 1
        data: bytes | str = b""
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            if kind == "capture":
                data = mutate(corpus.captures[seed % len(corpus.captures)], ops, floor=24)
                run_capture(data, tmpdir)
            elif kind == "flows":
                flows = list(corpus.flows[seed % len(corpus.flows)])
                idx = [i for i, ev in enumerate(flows) if isinstance(ev, FlowData)]
                if idx:
                    for j in range(1 + which % 3):
                        i = idx[(which + j * 7919) % len(idx)]
                        ev = flows[i]
                        assert isinstance(ev, FlowData)
                        flows[i] = FlowData(
                            ev.conn, ev.ts, ev.from_client, mutate(bytes(ev.data), ops)
                        )
                data = b"\n--flow--\n".join(bytes(e.data) for e in flows if isinstance(e, FlowData))
                run_flows(flows, cuts)
            elif kind == "upgrade":
                data = f"upgrade seed={seed} which={which} ops={ops} cuts={cuts}".encode()
                run_upgrade(seed, ops, cuts, which)
            elif kind == "caps":
                request_len = CAP_REQUEST - 60 + seed % 120  # around the request cap
                data = repr((seed % 2, plan, request_len, cuts)).encode()
                run_caps(seed % 2 == 1, plan, request_len, cuts)
            elif kind == "overlaps":
                k = seed % len(corpus.segments)
                data = repr(oplan).encode() + b"\n" + corpus.captures[k]
                run_overlaps(corpus.segments[k], corpus.baselines[k], oplan)
            elif kind == "ints":
                x = corpus.exchanges[seed % len(corpus.exchanges)]
                data = f"{x.path}\n{x.request}\n" + "\n".join(x.items)
                run_ints(ints, x, which, every=len(cuts) == 6, request=len(cuts) == 1)
            else:
                item = corpus.items[seed % len(corpus.items)]
                data = mutate(item.encode(), ops).decode("utf-8", "replace")
                run_json(data)
        except Hang:
            report.hangs += 1
            record(kind, data, Hang(f"over {timeout} s"))
        except Exception as exc:  # a crash: count it, keep going
            record(kind, data, exc)
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if progress and report.cases % 5000 == 0:
            tell()

    def tell() -> None:
        report.seconds = time.perf_counter() - started
        report.max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(report.line(), flush=True)

    try:
        rounds = 0
        while report.cases < cases:
            before = report.cases
            run = settings(
                max_examples=min(ROUND, cases - report.cases),
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
                verbosity=Verbosity.quiet,
            )(given(**strategies)(one))
            if derandomize:  # a fixed series: round k has its own seed
                run = hypothesis_seed(rounds)(run)
            rounds += 1
            run()
            if report.cases == before:
                break
    except _TimeUp:
        pass
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)
        if runner is not None:
            runner.close()
        ints.close()
        for f in Path(tmpdir).iterdir():
            f.unlink()
        os.rmdir(tmpdir)
    report.seconds = time.perf_counter() - started
    report.max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds before a case is a hang")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "fuzz")
    ap.add_argument(
        "--kind",
        default=",".join(dict.fromkeys(KINDS)),
        help=f"comma-separated kinds to draw from ({', '.join(ALL_KINDS)}; default: all but diff)",
    )
    ap.add_argument("--seconds", type=float, help="stop after this long, whatever --cases says")
    ap.add_argument("--no-tokens", action="store_true", help="diff: no token pass (faster)")
    ap.add_argument("--native-http", action="store_true", help="diff: " + NATIVE_HTTP_HELP)
    ns = ap.parse_args(argv)
    wanted = [k.strip() for k in ns.kind.split(",") if k.strip()]
    kinds = tuple(k for k in KINDS if k in wanted) + tuple(k for k in wanted if k not in KINDS)
    report = campaign(
        ns.cases,
        timeout=ns.timeout,
        out=ns.out,
        progress=True,
        kinds=kinds,
        seconds=ns.seconds,
        diff_tokens=not ns.no_tokens,
        native_http=ns.native_http,
    )
    print(report.line())
    for sig, n in report.crashes.most_common():
        print(f"  {n:6d}  {sig}  ({report.examples.get(sig, '')})")
    return 1 if report.crashes or report.hangs else 0


if __name__ == "__main__":
    sys.exit(main())
