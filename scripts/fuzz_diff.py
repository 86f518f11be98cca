#!/usr/bin/env python3
"""Differential fuzzing: the same case through the pure and the native core,
each into a real SQLite store, and every stored row compared.

A case is a capture file (``("pcap", bytes)``: replayed as ``sparseety
replay`` replays it, in one process, with the default recording chain:
redaction and token rows on) or ordered flow events (``("flows", events)``:
the eBPF road, ``Pipeline.feed_flows`` with the same chain). Each core runs
in its own worker process (``SPARSEETY_PURE=1`` for the pure one: the core is
chosen at import), kept for the whole campaign; a case goes to both, each
stores it in a fresh database (a copy of an empty, migrated one) and sends
back a dump of every table (every column, in row order, ``repr`` of each
value) and the replay summary without its timings. Nothing is left out of
the comparison: no column the recording chain writes reads a clock (the only
wall-clock column, ``checkpoints.written_at``, belongs to the daemon), and
``node`` is the host name in both workers.

A difference, or a case that crashes or hangs a worker (either core, or
both: an exception out of the replay other than "not a capture file" is a
crash), is saved under ``--out`` as ``diff-N.pcap`` / ``diff-N.flows`` (a pickle of
the events) with ``diff-N.pure.txt``, ``diff-N.native.txt`` and
``diff-N.txt`` (the first differing table, row and column), after the case
has been reduced: frames (or flow events) are dropped while the difference
stays.

Case makers (``make_case``), from a seed capture's bytes, segments or flows:

* ``file``: the capture file's bytes mutated (``fuzz.mutate``);
* ``segments``: the capture's TCP segments reordered, duplicated, overlapped
  (part of a segment sent again, the same bytes or one changed), dropped,
  truncated (a payload cut short, the capture cut off), a flag toggled, a
  sequence number moved, the clock stepped (past the hole and idle timeouts,
  backwards), re-encoded as a capture file (Ethernet, IPv4/IPv6, TCP);
* ``flows``: the capture's flow events, one to three payloads mutated, every
  payload cut at random offsets, the connection sometimes left unclosed.

Used by ``scripts/fuzz.py --kind diff`` (``make fuzz-diff``); run alone it
replays saved cases: ``python scripts/fuzz_diff.py bench/out/fuzz/diff-0.pcap``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pickle
import select
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sniffer import PURE_ENV  # noqa: E402
from sniffer.capture.pcap import CaptureFileError  # noqa: E402
from sniffer.core.events import (  # noqa: E402
    ConnectionClosed,
    FlowData,
    FlowEvent,
    Segment,
)

#: A case: ("pcap", capture file bytes) or ("flows", ordered flow events).
Case = tuple[str, Any]

#: Columns left out of the comparison: (table, column). Only wall-clock
#: columns belong here; the recording chain writes none (see the docstring).
NONDETERMINISTIC: frozenset[tuple[str, str]] = frozenset({("checkpoints", "written_at")})

#: Summary fields of a replay that measure time or name files.
UNTIMED_SKIP = ("seconds", "token_seconds", "path")

CORES = ("pure", "native")

NATIVE_HTTP_HELP = (
    "the native worker's pipelines get the native HTTP/1 parser too "
    "(core.native.native_pipeline), beside the native reassembler"
)

# ------------------------------------------------------------------ encoding

_TCP_FLAGS = 0x3F


def encode_frame(seg: Segment) -> bytes:
    """``seg`` as an Ethernet frame (IPv4 or IPv6, TCP without options;
    checksums zero: the capture layer does not check them)."""
    payload = seg.payload
    tcp = struct.pack(
        "!HHIIBBHHH",
        seg.sport & 0xFFFF,
        seg.dport & 0xFFFF,
        seg.seq & 0xFFFFFFFF,
        seg.ack & 0xFFFFFFFF,
        5 << 4,
        seg.flags & _TCP_FLAGS,
        65535,
        0,
        0,
    )
    src, dst = ipaddress.ip_address(seg.src), ipaddress.ip_address(seg.dst)
    if src.version == 4 and dst.version == 4:
        ip = struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + len(tcp) + len(payload),
            0,
            0x4000,
            64,
            6,
            0,
            src.packed,
            dst.packed,
        )
        ethertype = 0x0800
    else:
        s6 = src if src.version == 6 else ipaddress.IPv6Address(f"::ffff:{src}")
        d6 = dst if dst.version == 6 else ipaddress.IPv6Address(f"::ffff:{dst}")
        ip = struct.pack(
            "!IHBB16s16s", 6 << 28, len(tcp) + len(payload), 6, 64, s6.packed, d6.packed
        )
        ethertype = 0x86DD
    eth = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01" + struct.pack("!H", ethertype)
    return eth + ip + tcp + payload


def pcap_of(segs: list[Segment]) -> bytes:
    """A nanosecond pcap file of ``segs`` (Ethernet), in the order given."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1))
    for seg in segs:
        frame = encode_frame(seg)
        ns = max(0, round(seg.ts * 1e9))
        out += struct.pack("<IIII", ns // 10**9 & 0xFFFFFFFF, ns % 10**9, len(frame), len(frame))
        out += frame
    return bytes(out)


def pcap_records(data: bytes) -> tuple[bytes, list[bytes]] | None:
    """A classic pcap file split into its header and records (None: not one
    this can split; the reducer then leaves the case whole)."""
    if len(data) < 24:
        return None
    magic = data[:4]
    order = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<"}.get(magic) or {
        b"\xa1\xb2\xc3\xd4": ">",
        b"\xa1\xb2\x3c\x4d": ">",
    }.get(magic)
    if order is None:
        return None
    head, recs, at = data[:24], [], 24
    while at + 16 <= len(data):
        incl = struct.unpack_from(order + "I", data, at + 8)[0]
        end = at + 16 + incl
        if end > len(data):
            break
        recs.append(data[at:end])
        at = end
    if at < len(data):
        recs.append(data[at:])  # a damaged tail stays one piece
    return head, recs


# --------------------------------------------------------------- case makers

#: Segment-level mutations.
SEG_OPS = (
    "reorder",
    "duplicate",
    "overlap",
    "overlap-changed",
    "drop",
    "truncate",
    "cut",
    "flags",
    "seq",
    "delay",
)

#: TCP flag bits the ``flags`` mutation toggles: FIN, SYN, RST, PSH, ACK.
_FLAG_BITS = (0x01, 0x02, 0x04, 0x08, 0x10)

#: Time steps the ``delay`` mutation inserts (seconds): past the hole timeout,
#: backwards, past the idle timeout.
_DELAYS = (1.5, -0.5, 400.0, 0.000001)


def mutate_segments(segs: list[Segment], plan: list[tuple[str, float, int]]) -> list[Segment]:
    """``segs`` with the ``plan``'s mutations: (op, where as a fraction, argument)."""
    out = list(segs)
    for op, frac, arg in plan:
        if not out:
            break
        i = min(len(out) - 1, int(frac * len(out)))
        seg = out[i]
        n = len(seg.payload)
        if op == "reorder":
            j = min(len(out) - 1, i + 1 + arg % 4)
            out[i], out[j] = out[j], out[i]
        elif op == "duplicate":
            out.insert(min(len(out), i + 1 + arg % 3), seg)
        elif op in ("overlap", "overlap-changed") and n:
            a = arg % n
            b = a + 1 + (arg // 7) % (n - a)
            piece = seg.payload[a:b]
            if op == "overlap-changed":
                piece = bytes([piece[0] ^ 0x20]) + piece[1:]
            out.insert(i + 1, seg._replace(seq=(seg.seq + a) & 0xFFFFFFFF, payload=piece))
        elif op == "drop":
            del out[i]
        elif op == "truncate" and n:
            out[i] = seg._replace(payload=seg.payload[: arg % n])
        elif op == "cut" and i > 0:
            del out[i:]
        elif op == "flags":
            out[i] = seg._replace(flags=seg.flags ^ _FLAG_BITS[arg % len(_FLAG_BITS)])
        elif op == "seq":  # a jump forwards or backwards, maybe across the 32-bit wrap
            step = (arg * 977) % (1 << 32) if arg % 2 else -(1 + arg % 4096)
            out[i] = seg._replace(seq=(seg.seq + step) & 0xFFFFFFFF)
        elif op == "delay":  # every segment from i on, later (or earlier)
            dt = _DELAYS[arg % len(_DELAYS)]
            out[i:] = [s._replace(ts=max(0.0, s.ts + dt)) for s in out[i:]]
    return out


def cut_flows(
    flows: list[FlowEvent], cuts: list[float], keep_close: bool = True
) -> list[list[FlowEvent]]:
    """``flows`` in feeds (one ``feed_flows`` call each), every payload split
    at the ``cuts`` (fractions, taken in turn); without ``keep_close`` the
    connections' closes are dropped (the flush closes them)."""
    feeds: list[list[FlowEvent]] = []
    ci = 0
    for ev in flows:
        if isinstance(ev, FlowData) and cuts:
            data = bytes(ev.data)
            at = sorted({int(cuts[(ci + m) % len(cuts)] * len(data)) for m in range(1 + ci % 3)})
            ci += 1
            parts = [
                FlowData(ev.conn, ev.ts, ev.from_client, data[a:b])
                for a, b in zip([0, *at], [*at, len(data)], strict=True)
                if b > a
            ]
            feeds.extend([p] for p in parts)
        elif isinstance(ev, ConnectionClosed) and not keep_close:
            continue
        else:
            feeds.append([ev])
    return feeds


# ------------------------------------------------------------------- worker


def _dump(db: str) -> dict[str, list[str]]:
    """Every table of ``db``: its column names, then one line per row (``repr``
    of each value, in row order), the NONDETERMINISTIC columns left out."""
    out: dict[str, list[str]] = {}
    con = sqlite3.connect(db)
    try:
        names = [
            r[0]
            for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        for name in names:
            cur = con.execute(f'SELECT * FROM "{name}" ORDER BY rowid')
            cols = [c[0] for c in cur.description]
            keep = [k for k, c in enumerate(cols) if (name, c) not in NONDETERMINISTIC]
            lines = ["\t".join(cols[k] for k in keep)]
            lines += ["\t".join(repr(row[k]) for k in keep) for row in cur]
            out[name] = lines
    finally:
        con.close()
    return out


class _Runner:
    """One worker's state: the empty database it copies per case, the
    tokenizer registry (loaded once), a scratch folder."""

    def __init__(self, work: str, tokens: bool, native_http: bool = False) -> None:
        from sniffer.store.writer import StoreWriter

        if native_http:
            _use_native_http()
        self.work = work
        self.template = os.path.join(work, "template.db")
        StoreWriter(self.template).close()
        self.registry: Any = None
        if tokens:
            from sniffer.llm.tokens import TokenizerRegistry

            self.registry = TokenizerRegistry()
            self.registry.preload()

    def chain(self) -> Any:
        from sniffer.record.chain import RecordingChain, RecordingOptions

        opts = RecordingOptions(tokens=self.registry is not None)
        return RecordingChain.from_config(opts, tokens=self.registry)

    def run(self, case: Case) -> dict[str, Any]:
        db = os.path.join(self.work, "case.db")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(db + suffix)
        shutil.copyfile(self.template, db)
        kind, data = case
        summary: Any
        try:
            summary = self._replay(data, db) if kind == "pcap" else self._flows(data, db)
        except CaptureFileError as exc:  # not a capture at all: an answer like any
            summary = f"{type(exc).__name__}: {exc}"
        # any other exception is a crash (``worker_main``), whichever core raised it
        return {"summary": summary, "tables": _dump(db)}

    def _replay(self, data: bytes, db: str) -> Any:
        from sniffer.runtime.replay import replay

        path = os.path.join(self.work, "case.pcap")
        with open(path, "wb") as fh:
            fh.write(data)
        result = replay(path, db, chain=self.chain(), jobs=1)
        return {k: v for k, v in sorted(asdict(result).items()) if k not in UNTIMED_SKIP}

    def _flows(self, feeds: list[list[FlowEvent]], db: str) -> Any:
        from sniffer.core.pipeline import Pipeline, PipelineConfig
        from sniffer.store.writer import StoreWriter

        w = StoreWriter(db)
        try:
            chain = self.chain()
            chain.attach(w)
            make = _pipeline_factory or Pipeline
            pipe = make(PipelineConfig(conn_ids=w.conn_ids, stream_ids=w.stream_ids))
            last = 0.0
            for feed in feeds:
                if feed:
                    last = max(last, feed[-1].ts)
                chain.write(pipe.feed_flows(feed))
            chain.write(pipe.flush(last + 1.0))
            chain.drain()
            chain.flush()
            tok = chain.tokenize() if chain.tokens is not None else None
            st = pipe.streams.stats
            return {
                "streams": st.streams_closed,
                "chunk_events": st.chunk_events,
                "states": dict(sorted(st.states.items())),
                "errors": dict(sorted(st.errors.items())),
                "internal_errors": pipe.internal_errors,
                "tokens": None if tok is None else (tok.streams, tok.tokens, tok.anomalies),
                "redactions": chain.redactions,
            }
        finally:
            w.close()


def _use_native_http() -> None:
    """Every pipeline of this worker gets the native HTTP stage
    (``sniffer.core.native.native_pipeline``): for as long as
    ``PipelineConfig(native=True)`` selects only the native reassembler."""
    from sniffer.core import native
    from sniffer.runtime import replay

    if native.NATIVE is None:
        return
    replay.Pipeline = native.native_pipeline  # type: ignore[assignment,misc]
    globals()["_pipeline_factory"] = native.native_pipeline


#: What the flows cases build their pipeline with (``_use_native_http`` swaps it).
_pipeline_factory: Any = None


def _read_msg(fh: Any) -> Any:
    head = fh.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(fh.read(n))


def _write_msg(fh: Any, obj: Any) -> None:
    blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(struct.pack("<Q", len(blob)) + blob)
    fh.flush()


def worker_main(tokens: bool, native_http: bool = False) -> int:
    """Serve cases on stdin, answer on stdout (length-prefixed pickles)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the stages print goes to stderr, not into the answers
    inp = sys.stdin.buffer
    from sniffer import core_name

    with tempfile.TemporaryDirectory(prefix="sparseety-diff-", dir=_scratch()) as work:
        runner = _Runner(work, tokens, native_http)
        _write_msg(out, core_name())
        while True:
            case = _read_msg(inp)
            if case is None:
                return 0
            try:
                answer: Any = runner.run(case)
            except BaseException:  # a crash is an answer too
                answer = {"crash": traceback.format_exc()}
            _write_msg(out, answer)


def _scratch() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


# ------------------------------------------------------------------- parent


class WorkerHang(Exception):
    pass


class Worker:
    """A worker process for one core (started with ``SPARSEETY_PURE=1`` for the pure one)."""

    def __init__(self, core: str, tokens: bool, native_http: bool = False) -> None:
        self.core = core
        self.tokens = tokens
        self.native_http = native_http
        self.proc: subprocess.Popen[bytes] | None = None
        self.name = ""
        self.start()

    def start(self) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
        env.pop(PURE_ENV, None)
        if self.core == "pure":
            env[PURE_ENV] = "1"
        args = [sys.executable, str(Path(__file__).resolve()), "--worker"]
        if not self.tokens:
            args.append("--no-tokens")
        if self.native_http:
            args.append("--native-http")
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=str(REPO)
        )
        self.name = str(self._answer(120.0))
        if (self.core == "pure") != (self.name == "pure core"):
            raise RuntimeError(f"the {self.core} worker runs the {self.name}")

    def send(self, case: Case) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        _write_msg(self.proc.stdin, case)

    def _answer(self, timeout: float) -> Any:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        buf = bytearray()
        need = 8
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise WorkerHang(f"{self.core} worker: no answer in {timeout} s")
            got = os.read(fd, max(65536, need - len(buf)))
            if not got:
                raise WorkerHang(f"{self.core} worker exited (code {proc.wait()})")
            buf += got
            if need == 8 and len(buf) >= 8:
                need = 8 + struct.unpack_from("<Q", buf)[0]
        return pickle.loads(bytes(buf[8:need]))

    def answer(self, timeout: float) -> Any:
        try:
            return self._answer(timeout)
        except WorkerHang:
            self.restart()
            raise

    def restart(self) -> None:
        self.stop(kill=True)
        self.start()

    def stop(self, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        else:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Where two answers first differ (None: they do not), in words."""
    if "crash" in a or "crash" in b:
        return (
            "crash: "
            + ("\n".join(a.get("crash", "-").splitlines()[-3:]))
            + " | "
            + ("\n".join(b.get("crash", "-").splitlines()[-3:]))
        )
    ta, tb = a["tables"], b["tables"]
    for table in sorted(set(ta) | set(tb)):
        ra, rb = ta.get(table), tb.get(table)
        if ra == rb:
            continue
        if ra is None or rb is None:
            return f"table {table} only in {'native' if ra is None else 'pure'}"
        cols = ra[0].split("\t")
        if ra[0] != rb[0]:
            return f"{table}: columns {ra[0]!r} != {rb[0]!r}"
        for k in range(1, max(len(ra), len(rb))):
            la = ra[k] if k < len(ra) else None
            lb = rb[k] if k < len(rb) else None
            if la == lb:
                continue
            if la is None or lb is None:
                return f"{table}: {len(ra) - 1} rows (pure) != {len(rb) - 1} rows (native)"
            va, vb = la.split("\t"), lb.split("\t")
            diff = [
                f"{c}: {x[:200]} != {y[:200]}"
                for c, x, y in zip(cols, va, vb, strict=False)
                if x != y
            ]
            return f"{table} row {k}: " + "; ".join(diff)
    if a["summary"] != b["summary"]:
        sa, sb = a["summary"], b["summary"]
        if isinstance(sa, dict) and isinstance(sb, dict):
            keys = [k for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
            return "summary: " + "; ".join(f"{k}: {sa.get(k)} != {sb.get(k)}" for k in keys)
        return f"summary: {str(sa)[:300]} != {str(sb)[:300]}"
    return None


class DiffRunner:
    """The two workers, and the comparison of their answers."""

    def __init__(
        self, tokens: bool = True, timeout: float = 30.0, native_http: bool = False
    ) -> None:
        self.timeout = timeout
        self.workers = [Worker(core, tokens, native_http) for core in CORES]

    def close(self) -> None:
        for w in self.workers:
            w.stop()

    def __enter__(self) -> DiffRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def answers(self, case: Case) -> list[Any]:
        for w in self.workers:
            w.send(case)  # both work at once
        out: list[Any] = []
        hung: list[str] = []
        for w in self.workers:
            try:
                out.append(w.answer(self.timeout))
            except WorkerHang as exc:
                hung.append(str(exc))
                out.append({"crash": f"hang: {exc}"})
        return out

    def compare(self, case: Case) -> tuple[str | None, list[Any]]:
        answers = self.answers(case)
        return first_difference(answers[0], answers[1]), answers

    def reduce(self, case: Case, budget: float = 120.0) -> Case:
        """A smaller case with a difference still (frames or flow feeds
        dropped, halves first, then one at a time), within ``budget`` seconds."""
        kind, data = case
        if kind == "pcap":
            split = pcap_records(data)
            if split is None:
                return case
            head, items = split

            def build(xs: list[Any]) -> Case:
                return ("pcap", head + b"".join(xs))
        else:
            items = list(data)

            def build(xs: list[Any]) -> Case:
                return ("flows", xs)

        deadline = time.monotonic() + budget
        chunk = max(1, len(items) // 2)
        while chunk >= 1 and time.monotonic() < deadline:
            i = 0
            changed = False
            while i < len(items) and time.monotonic() < deadline:
                trial = items[:i] + items[i + chunk :]
                if trial and self.compare(build(trial))[0] is not None:
                    items = trial
                    changed = True
                else:
                    i += chunk
            if not changed:
                chunk //= 2
        return build(items)


def save(out: Path, n: int, case: Case, answers: list[Any], where: str) -> str:
    """Write case ``n`` and both answers under ``out``; returns the case's file name."""
    out.mkdir(parents=True, exist_ok=True)
    kind, data = case
    name = f"diff-{n}.{'pcap' if kind == 'pcap' else 'flows'}"
    (out / name).write_bytes(data if kind == "pcap" else pickle.dumps(data))
    for core, ans in zip(CORES, answers, strict=True):
        lines = [f"summary: {ans.get('summary')!r}"] if "crash" not in ans else [ans["crash"]]
        for table, rows in sorted(ans.get("tables", {}).items()):
            lines.append(f"== {table}")
            lines += rows
        (out / f"diff-{n}.{core}.txt").write_text("\n".join(lines) + "\n")
    (out / f"diff-{n}.txt").write_text(where + "\n")
    return name


def load_case(path: Path) -> Case:
    if path.suffix == ".flows":
        return ("flows", pickle.loads(path.read_bytes()))
    return ("pcap", path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", type=Path, help="saved cases to run through both cores")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-tokens", action="store_true", help="no token pass (faster)")
    ap.add_argument("--native-http", action="store_true", help=NATIVE_HTTP_HELP)
    ns = ap.parse_args(argv)
    if ns.worker:
        return worker_main(tokens=not ns.no_tokens, native_http=ns.native_http)
    bad = 0
    with DiffRunner(tokens=not ns.no_tokens, native_http=ns.native_http) as runner:
        for path in ns.cases:
            where, _ = runner.compare(load_case(path))
            print(f"{path}: {where or 'same stores'}")
            bad += where is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
