#!/usr/bin/env python3
"""Craft TCP/capture fault variants of recorded fixtures (run after record_pcaps.py).

Each variant is written as ``pcaps/faults/fault_NAME.pcap`` with a
``fault_NAME.expected.json`` beside it, derived from its base's ground truth
and the transformation (see pcaps/README.md). Packets keep their capture
timestamps. Fault fixtures live in their own folder (``FAULTS_DIR``) so that
``sparseety replay pcaps/*.pcap`` (the README's tour) replays only the clean
recordings: one of the faults is a deliberately truncated file (exit code 1).

Usage: ``python scripts/craft_faults.py [--pcaps DIR] [--out DIR]``
"""

from __future__ import annotations

import argparse
import copy
import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet, Raw
from scapy.utils import rdpcap, wrpcap

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_pcaps import summarize_stream, write_expected

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sniffer.core.sse import DEFAULT_MAX_LINE
from sniffer.core.streams import MAX_QUIET_EVENTS, MAX_REQUEST_BODY

REPO = Path(__file__).resolve().parents[1]
#: Where every crafted fault fixture (capture and expected file) is written.
FAULTS_DIR = REPO / "pcaps" / "faults"
MOD = 1 << 32


# ---------------------------------------------------------------------------
# Looking at a base capture
# ---------------------------------------------------------------------------


@dataclass
class Seg:
    index: int  # position in the packet list
    from_client: bool
    client_port: int
    seq: int
    payload: bytes


def segments(pkts: list[Packet], server_port: int) -> list[Seg]:
    out = []
    for i, p in enumerate(pkts):
        if TCP not in p:
            continue
        t = p[TCP]
        from_client = t.dport == server_port
        out.append(
            Seg(i, from_client, t.sport if from_client else t.dport, t.seq, bytes(t.payload))
        )
    return out


def isn(pkts: list[Packet], server_port: int, client_port: int, from_client: bool) -> int:
    """Initial sequence number of one direction (from its SYN)."""
    for p in pkts:
        t = p[TCP]
        if not t.flags & 0x02:
            continue
        if from_client and t.sport == client_port and t.dport == server_port:
            return int(t.seq)
        if not from_client and t.sport == server_port and t.dport == client_port:
            return int(t.seq)
    raise ValueError("no SYN for that direction")


def server_bytes(
    pkts: list[Packet], server_port: int, client_port: int, keep: Callable[[Seg], bool]
) -> tuple[bytes, list[tuple[int, Seg]]]:
    """In-order server→client bytes of one connection from the segments ``keep``
    accepts (contiguous from the start), and each data segment's stream offset."""
    base = isn(pkts, server_port, client_port, False) + 1
    located: list[tuple[int, Seg]] = []
    for s in segments(pkts, server_port):
        if s.from_client or s.client_port != client_port or not s.payload:
            continue
        located.append(((s.seq - base) % MOD, s))
    located.sort(key=lambda x: x[0])
    buf = bytearray()
    for off, s in located:
        if not keep(s):
            continue
        if off > len(buf):
            break  # a hole: stop at the contiguous prefix
        buf += s.payload[len(buf) - off :] if off + len(s.payload) > len(buf) else b""
    return bytes(buf), located


@dataclass
class Resp:
    start: int
    end: int | None  # None: the response is cut off in these bytes
    body: bytes  # de-chunked body bytes available


def parse_responses(data: bytes) -> list[Resp]:
    """Split a server→client byte stream into HTTP/1.1 responses (Content-Length or
    chunked; a response without either runs to the end)."""
    out: list[Resp] = []
    pos = 0
    while pos < len(data):
        head_end = data.find(b"\r\n\r\n", pos)
        if head_end < 0:
            out.append(Resp(pos, None, b""))
            break
        head = data[pos:head_end].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        body_start = head_end + 4
        if "content-length" in headers:
            n = int(headers["content-length"])
            end = body_start + n
            if end > len(data):
                out.append(Resp(pos, None, data[body_start:]))
                break
            out.append(Resp(pos, end, data[body_start:end]))
            pos = end
            continue
        if headers.get("transfer-encoding", "").lower() != "chunked":
            out.append(Resp(pos, None, data[body_start:]))
            break
        body = bytearray()
        p = body_start
        end_at: int | None = None
        while True:
            line_end = data.find(b"\r\n", p)
            if line_end < 0:
                break
            size = int(data[p:line_end].split(b";")[0], 16)
            chunk_start = line_end + 2
            if size == 0:
                if data[chunk_start : chunk_start + 2] == b"\r\n":
                    end_at = chunk_start + 2
                break
            body += data[chunk_start : min(chunk_start + size, len(data))]
            if chunk_start + size + 2 > len(data):
                break
            p = chunk_start + size + 2
        out.append(Resp(pos, end_at, bytes(body)))
        if end_at is None:
            break
        pos = end_at
    return out


def load(pcaps: Path, name: str) -> tuple[list[Packet], dict[str, Any]]:
    pkts = list(rdpcap(str(pcaps / f"{name}.pcap")))
    exp = json.loads((pcaps / f"{name}.expected.json").read_text(encoding="utf-8"))
    return pkts, exp


def data_segments(pkts: list[Packet], exp: dict[str, Any], client_port: int) -> list[Seg]:
    return [
        s
        for s in segments(pkts, exp["server_port"])
        if not s.from_client and s.client_port == client_port and s.payload
    ]


def derive(
    base: dict[str, Any], name: str, description: str, streams: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    return {
        "fixture": name,
        "description": description,
        "base": base["fixture"],
        "server_host": base["server_host"],
        "server_port": base["server_port"],
        "streams": streams,
        "errors_min": extra.pop("errors_min", 0),
        "extra_streams_max": extra.pop("extra_streams_max", 0),
        **extra,
    }


def prefix_entry(entry: dict[str, Any], body: bytes, state: str) -> dict[str, Any]:
    """A stream entry whose text is only known up to ``body`` (what precedes the fault)."""
    chat = entry["path"].endswith("/chat/completions")
    s = summarize_stream(body, chat)
    out = copy.deepcopy(entry)
    out.update(state=state, check_text=False, done_seen=None, usage=None)
    out.pop("sse_events", None)
    out["choices"] = {}
    for k in entry["choices"]:
        got = s["choices"].get(int(k), {"text": "", "chunks": 0})
        out["choices"][k] = {"text_prefix": got["text"], "chunks_min": got["chunks"]}
    return out


def fix_checksums(p: Packet) -> None:
    if IP in p:
        del p[IP].len
        del p[IP].chksum
    if IPv6 in p:
        del p[IPv6].plen
    del p[TCP].chksum


def with_payload(p: Packet, seq: int, payload: bytes) -> Packet:
    q = p.copy()
    q[TCP].seq = seq
    q[TCP].remove_payload()
    q[TCP].add_payload(Raw(payload))
    fix_checksums(q)
    return q


# ---------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------


def fault_reorder(pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    pkts, exp = load(pcaps, "chat_english")
    d = data_segments(pkts, exp, exp["streams"][0]["client_port"])
    for k in (len(d) // 3, 2 * len(d) // 3):
        i, j = d[k].index, d[k + 1].index
        ti, tj = pkts[i].time, pkts[j].time
        pkts[i], pkts[j] = pkts[j], pkts[i]
        pkts[i].time, pkts[j].time = ti, tj  # arrival times stay in capture order
    return pkts, derive(
        exp,
        "fault_reorder",
        "chat_english with two pairs of adjacent response data segments swapped",
        exp["streams"],
    )


def fault_dup(pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    pkts, exp = load(pcaps, "chat_cjk")
    d = data_segments(pkts, exp, exp["streams"][0]["client_port"])
    picks = sorted({d[0].index, d[len(d) // 4].index, d[len(d) // 2].index, d[-1].index})
    for i in reversed(picks):  # insert from the end so earlier indices stay valid
        dup = pkts[i].copy()
        at = min(i + 2, len(pkts))
        dup.time = pkts[at - 1].time
        pkts.insert(at, dup)
    return pkts, derive(
        exp,
        "fault_dup",
        "chat_cjk with 4 response data segments retransmitted (exact duplicates)",
        exp["streams"],
    )


def fault_overlap(pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    pkts, exp = load(pcaps, "chat_emoji")
    d = data_segments(pkts, exp, exp["streams"][0]["client_port"])
    k = len(d) // 2
    a, b = d[k], d[k + 1]
    assert (b.seq - a.seq) % MOD == len(a.payload), "segments not contiguous"
    ha, hb = len(a.payload) // 2, len(b.payload) // 2
    span = with_payload(pkts[b.index], (a.seq + ha) % MOD, a.payload[ha:] + b.payload[:hb])
    head = with_payload(pkts[b.index], a.seq, a.payload[: len(a.payload) // 3])
    span.time = head.time = pkts[b.index].time
    pkts.insert(b.index + 1, head)
    pkts.insert(b.index + 1, span)
    return pkts, derive(
        exp,
        "fault_overlap",
        "chat_emoji with two overlapping retransmissions (same bytes, split differently): "
        "one spans a segment boundary, one repeats the head of a segment",
        exp["streams"],
    )


def fault_lost(pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    pkts, exp = load(pcaps, "chat_code")
    entry = exp["streams"][0]
    port = entry["client_port"]
    d = data_segments(pkts, exp, port)
    lost = d[len(d) // 2]
    data, _ = server_bytes(pkts, exp["server_port"], port, lambda s: s.index != lost.index)
    resp = parse_responses(data)[0]
    out = prefix_entry(entry, resp.body, "gap")
    out["gap"] = True
    del pkts[lost.index]
    return pkts, derive(
        exp,
        "fault_lost",
        "chat_code with one response data segment in the middle of the stream lost",
        [out],
    )


def _exchange_ranges(pkts: list[Packet], exp: dict[str, Any], port: int) -> list[Resp]:
    data, _ = server_bytes(pkts, exp["server_port"], port, lambda s: True)
    return parse_responses(data)


def fault_midstream(pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    pkts, exp = load(pcaps, "keepalive_3")
    port = exp["streams"][0]["client_port"]
    resps = _exchange_ranges(pkts, exp, port)
    assert len(resps) == 3 and resps[0].end is not None
    data, located = server_bytes(pkts, exp["server_port"], port, lambda s: True)
    first = [(off, s) for off, s in located if off < resps[0].end]
    cut_off, cut_seg = first[len(first) // 2]
    cut = cut_seg.index
    return pkts[cut:], derive(
        exp,
        "fault_midstream",
        "keepalive_3 with capture starting in the middle of the FIRST exchange's response "
        "(no SYN, no first request): its tail is recovered from the first chunk that "
        "starts after the cut (state midway, request fields null, no TTFT); exchanges 2 "
        "and 3 must be complete",
        [_recovered_entry(exp["streams"][0], data, resps[0], cut_off), *exp["streams"][1:]],
    )


def _recovered_entry(entry: dict[str, Any], data: bytes, resp: Resp, cut: int) -> dict[str, Any]:
    """What a capture that began at server byte ``cut`` recovers of ``resp``: the
    events of every chunk whose size line starts at or after the cut (the server
    writes one whole SSE event per chunk; a chunk whose start was not captured
    cannot be framed with certainty)."""
    head_end = data.index(b"\r\n\r\n", resp.start) + 4
    pos, tail = head_end, bytearray()
    while True:
        line_end = data.index(b"\r\n", pos)
        size = int(data[pos:line_end].split(b";")[0], 16)
        if size == 0:
            break
        chunk = data[line_end + 2 : line_end + 2 + size]
        if pos >= cut:
            assert chunk.startswith(b"data:"), chunk[:20]
            tail += chunk
        pos = line_end + 2 + size + 2
    s = summarize_stream(bytes(tail), entry["path"].endswith("/chat/completions"))
    out = copy.deepcopy(entry)
    out.update(
        method=None,
        path=None,
        status=None,
        state="midway",
        gap=True,
        done_seen=s["done"],
        usage=s["usage"],
        ttft_ms=None,
        exchange=0,
    )
    out.pop("sse_events", None)  # no response head: the harness's SSE count does not apply
    out["choices"] = {
        str(k): {"text": c["text"], "finish_reason": c["finish_reason"], "chunks": c["chunks"]}
        for k, c in sorted(s["choices"].items())
    }
    return out


def fault_seqwrap(pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    pkts, exp = load(pcaps, "keepalive_3")
    sp = exp["server_port"]
    port = exp["streams"][0]["client_port"]
    resps = _exchange_ranges(pkts, exp, port)
    assert resps[0].end is not None
    isn_c, isn_s = isn(pkts, sp, port, True), isn(pkts, sp, port, False)
    new_c = MOD - 100  # wraps inside the first request
    new_s = MOD - resps[0].end // 2  # wraps in the middle of the first response
    for p in pkts:
        t = p[TCP]
        if t.dport == sp:
            t.seq = (t.seq - isn_c + new_c) % MOD
            if t.flags & 0x10:
                t.ack = (t.ack - isn_s + new_s) % MOD
        else:
            t.seq = (t.seq - isn_s + new_s) % MOD
            if t.flags & 0x10:
                t.ack = (t.ack - isn_c + new_c) % MOD
        t.options = [o for o in t.options if o[0] != "SAck"]
        fix_checksums(p)
    return pkts, derive(
        exp,
        "fault_seqwrap",
        "keepalive_3 with sequence numbers rewritten so both directions wrap past 2^32 "
        "(client inside request 1, server in the middle of response 1); checksums recomputed",
        exp["streams"],
    )


def pcap_records(raw: bytes) -> list[tuple[int, int]]:
    """(offset, caplen) of every record of a classic pcap file."""
    magic = raw[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    out = []
    off = 24
    while off + 16 <= len(raw):
        caplen = struct.unpack(endian + "I", raw[off + 8 : off + 12])[0]
        out.append((off, caplen))
        off += 16 + caplen
    return out


def fault_truncated_file(pcaps: Path, out_dir: Path) -> dict[str, Any]:
    name = "keepalive_3"
    pkts, exp = load(pcaps, name)
    port = exp["streams"][2]["client_port"]
    resps = _exchange_ranges(pkts, exp, port)
    assert len(resps) == 3
    _, located = server_bytes(pkts, exp["server_port"], port, lambda s: True)
    third = [s for off, s in located if off >= resps[2].start]
    victim = third[len(third) // 2]
    raw = (pcaps / f"{name}.pcap").read_bytes()
    records = pcap_records(raw)
    assert len(records) == len(pkts)
    off, caplen = records[victim.index]
    (out_dir / "fault_truncated_file.pcap").write_bytes(raw[: off + 16 + caplen // 2])
    before, _ = server_bytes(pkts, exp["server_port"], port, lambda s: s.index < victim.index)
    cut = parse_responses(before)[2]
    last = prefix_entry(exp["streams"][2], cut.body, "truncated")
    last["accept_states"] = ["truncated", "gap"]
    last["gap"] = None  # either way is right: the capture ended mid-packet
    expected = derive(
        exp,
        "fault_truncated_file",
        "keepalive_3 with the file cut in the middle of a record inside the third "
        "response: exchanges 1 and 2 complete, exchange 3 never complete",
        [*exp["streams"][:2], last],
        errors_min=1,
    )
    write_expected(out_dir / "fault_truncated_file.expected.json", expected)
    return expected


# ---------------------------------------------------------------------------
# Security fixtures (issue 12): synthesized from raw HTTP bytes, no base capture.
# Kept together so they can move as one group. Each is ``sec_NAME.pcap`` with
# its ``sec_NAME.expected.json`` (what ``replay`` stores WITHOUT a redactor:
# credentials are removed anyway, personal data is not).
# ---------------------------------------------------------------------------

SEC_SERVER_PORT = 18499
SEC_T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _sec_packets(
    client_port: int, flows: list[tuple[bytes, bytes]], t0: float, mss: int = 16000
) -> list[Packet]:
    """One TCP connection on 127.0.0.1: handshake, each (request, response) in
    MSS-sized segments, FIN from both sides."""
    from scapy.layers.l2 import Ether

    cli, srv = ("127.0.0.1", client_port), ("127.0.0.1", SEC_SERVER_PORT)
    seq = {True: 1000, False: 5000}
    pkts: list[Packet] = []
    t = [t0]

    def emit(from_client: bool, flags: str, payload: bytes = b"") -> None:
        a, b = (cli, srv) if from_client else (srv, cli)
        p = (
            Ether()
            / IP(src=a[0], dst=b[0])
            / TCP(
                sport=a[1], dport=b[1], flags=flags, seq=seq[from_client], ack=seq[not from_client]
            )
        )
        if payload:
            p = p / Raw(payload)
        p.time = t[0]
        t[0] += 0.001
        pkts.append(p)
        seq[from_client] = (
            seq[from_client] + len(payload) + (1 if "S" in flags or "F" in flags else 0)
        ) % MOD

    seq[True] -= 1
    emit(True, "S")
    seq[False] -= 1
    emit(False, "SA")
    emit(True, "A")
    for req, resp in flows:
        for i in range(0, len(req), mss):
            emit(True, "PA", req[i : i + mss])
        for i in range(0, len(resp), mss):
            emit(False, "PA", resp[i : i + mss])
    emit(True, "FA")
    emit(False, "FA")
    emit(True, "A")
    return pkts


def _sec_request(body: bytes, target: str = "/v1/chat/completions", extra: bytes = b"") -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{SEC_SERVER_PORT}\r\n"
        "Content-Type: application/json\r\n".encode()
        + extra
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _sec_sse(pieces: list[str], model: str = "fake") -> bytes:
    events = []
    for i, p in enumerate(pieces):
        delta = {"role": "assistant", "content": p} if i == 0 else {"content": p}
        events.append(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
        )
    events.append(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + chunked
    )


def _sec_json_response(obj: Any, status: str = "200 OK", gzip_body: bytes | None = None) -> bytes:
    body = gzip_body if gzip_body is not None else json.dumps(obj).encode()
    enc = b"content-encoding: gzip\r\n" if gzip_body is not None else b""
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n".encode()
        + enc
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _sec_chat(content: str, **extra: Any) -> bytes:
    req = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": content}]}
    req.update(extra)
    return json.dumps(req).encode()


def _sec_stream(port: int, exchange: int, text: str, chunks: int, **kw: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "fake",
        "stream": True,
        "status": 200,
        "client_port": port,
        "state": "complete",
        "gap": False,
        "done_seen": True,
        "choices": {"0": {"text": text, "finish_reason": "stop", "chunks": chunks}},
        "usage": None,
        "check_text": True,
        "exchange": exchange,
    }
    entry.update(kw)
    return entry


def _sec_expected(
    name: str, description: str, streams: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    return {
        "fixture": name,
        "description": description,
        "base": None,
        "server_host": "127.0.0.1",
        "server_port": SEC_SERVER_PORT,
        "streams": streams,
        "errors_min": extra.pop("errors_min", 0),
        "extra_streams_max": extra.pop("extra_streams_max", 0),
        **extra,
    }


def sec_deep_json(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """A request body nested 100,000 levels deep, then an ordinary stream on the
    same keep-alive connection: the first exchange is recorded with an error,
    the connection goes on."""
    port = 40101
    deep = (
        b'{"model":"fake","stream":true,"messages":[{"role":"user","content":"hi"}],"x":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}"
    )
    pieces = ["Deep", " water", " runs", " still."]
    flows = [
        (_sec_request(deep), _sec_sse(pieces)),
        (_sec_request(_sec_chat("hello")), _sec_sse(pieces)),
    ]
    first = _sec_stream(port, 0, "", 0, state="error", model=None, done_seen=None, check_text=False)
    first["choices"] = {}
    exp = _sec_expected(
        "sec_deep_json",
        "request body nested 100,000 levels deep (exchange 0: error recorded, no crash), "
        "then an ordinary stream on the same connection (complete)",
        [first, _sec_stream(port, 1, "".join(pieces), len(pieces))],
        errors_min=1,
    )
    return _sec_packets(port, flows, SEC_T0), exp


def sec_gzip_bomb(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """A non-streaming reply whose gzip body expands 1000:1 to 256 MiB, then an
    ordinary small gzip reply on the same connection."""
    import gzip

    port = 40102
    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)
    good_obj = {
        "id": "c2",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Fine."},
                "finish_reason": "stop",
            }
        ],
    }
    req = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "x"}]}).encode()
    flows = [
        (_sec_request(req), _sec_json_response(None, gzip_body=bomb)),
        (
            _sec_request(req),
            _sec_json_response(None, gzip_body=gzip.compress(json.dumps(good_obj).encode())),
        ),
    ]
    first = _sec_stream(
        port, 0, "", 0, stream=False, state="error", done_seen=False, check_text=False
    )
    first["choices"] = {}
    second = _sec_stream(port, 1, "Fine.", 1, stream=False, done_seen=False)
    exp = _sec_expected(
        "sec_gzip_bomb",
        f"gzip bomb ({len(bomb)} bytes expanding to 256 MiB): decoding stops at the "
        "expansion cap with a decode error; the next gzip reply decodes",
        [first, second],
        errors_min=1,
    )
    return _sec_packets(port, flows, SEC_T0 + 10), exp


#: Planted values (the security tests look for them in the database files).
SEC_PLANTED = {
    "api_key": "sk-PLANTEDplantedPLANTED0123456789",
    "password": "hunter2-PLANTED",
    "client_secret": "cs-PLANTED-secret-777",
    "userinfo": "admin:PLANTEDpass",
    "query_key": "qk-PLANTED-999",
    "header_line": "sk-HEADERLINEplanted0123456789abcd",
    "echo_key": "sk-ECHOplantedECHOplanted012345678",
}


def sec_secrets(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """Credentials where they travel: JSON fields at any depth, URL userinfo and
    query, an API key in the prompt and streamed back across chunks, a request
    whose Authorization line h11 rejects, a 401 body echoing the key."""
    port = 40103
    p = SEC_PLANTED
    body = _sec_chat(
        f"my key is {p['api_key']} ok",
        api_key=p["api_key"],
        metadata={
            "auth": {"password": p["password"], "deep": [{"client_secret": p["client_secret"]}]}
        },
    )
    target = f"http://{p['userinfo']}@127.0.0.1:{SEC_SERVER_PORT}/v1/chat/completions?api_key={p['query_key']}&x=1"
    key = p["api_key"]
    pieces = ["Your key ", key[:6], key[6:20], key[20:], " is noted."]
    bad = _sec_request(
        _sec_chat("x"), extra=f"Authorization Bearer {p['header_line']}\r\n".encode()
    )
    err = {
        "error": {
            "message": f"Incorrect API key provided: {p['echo_key']}",
            "type": "invalid_request_error",
        }
    }
    flows = [
        (_sec_request(body, target), _sec_sse(pieces)),
        (bad, _sec_json_response({"error": {"message": "bad request"}}, "400 Bad Request")),
    ]
    flows2 = [(_sec_request(_sec_chat("hi")), _sec_json_response(err, "401 Unauthorized"))]
    first = _sec_stream(port, 0, "Your key <SECRET> is noted.", len(pieces))
    first["path"] = f"http://<CREDENTIAL>@127.0.0.1:{SEC_SERVER_PORT}/v1/chat/completions"
    second = _sec_stream(
        port, 1, "", 0, status=400, state="error", done_seen=None, check_text=False, model=None
    )
    second["choices"] = {}
    third = _sec_stream(
        port + 1,
        0,
        "",
        0,
        stream=True,
        status=401,
        state="error",
        done_seen=False,
        check_text=False,
    )
    third["choices"] = {}
    exp = _sec_expected(
        "sec_secrets",
        "planted credentials: JSON fields (api_key, password, client_secret at depth), URL "
        "userinfo and api_key query, an sk- key in the prompt and streamed back over 3 chunks, "
        "a rejected 'Authorization Bearer …' header line, a 401 body echoing a key",
        [first, second, third],
        errors_min=1,
        extra_streams_max=1,
    )
    pkts = _sec_packets(port, flows, SEC_T0 + 20) + _sec_packets(port + 1, flows2, SEC_T0 + 30)
    return pkts, exp


#: Personal data planted in sec_pii (stored as is WITHOUT a redactor; the
#: security tests replay it with redaction on and look for these).
SEC_PII_PIECES = [
    "Call ",
    "138",
    " 1234",
    " 5678",
    " or mail ",
    "john",
    ".doe@",
    "example.com",
    " now.",
]
SEC_PII_PROMPT = "my phone is 13912345678 and my mail is a.b@example.org"


def _sec_sse_logprobs(pieces: list[str]) -> bytes:
    events = []
    for i, p in enumerate(pieces):
        b = list(p.encode())
        lp = {
            "content": [
                {
                    "token": p,
                    "logprob": -0.5,
                    "bytes": b,
                    "top_logprobs": [{"token": p, "logprob": -0.5, "bytes": b}],
                }
            ]
        }
        delta = {"role": "assistant", "content": p} if i == 0 else {"content": p}
        events.append(
            {
                "id": "c3",
                "object": "chat.completion.chunk",
                "model": "fake",
                "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": None}],
            }
        )
    events.append(
        {
            "id": "c3",
            "object": "chat.completion.chunk",
            "model": "fake",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


def sec_pii(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """A phone number and an e-mail address streamed over several chunks (with
    logprobs: one token string per chunk), and personal data in the prompt."""
    port = 40104
    req = _sec_chat(SEC_PII_PROMPT, logprobs=True, top_logprobs=1)
    flows = [(_sec_request(req), _sec_sse_logprobs(SEC_PII_PIECES))]
    exp = _sec_expected(
        "sec_pii",
        "a phone number and an e-mail address each split over 3 streamed chunks with logprobs; "
        "personal data in the prompt (stored as is without a redactor; the security tests "
        "replay it with redaction on)",
        [_sec_stream(port, 0, "".join(SEC_PII_PIECES), len(SEC_PII_PIECES))],
    )
    return _sec_packets(port, flows, SEC_T0 + 40), exp


# ---------------------------------------------------------------------------
# TCP ambiguity and clock fixtures (issue 24): synthesized segment by segment,
# no base capture. The expected results come from the segments as put on the
# wire, read by a model of TCP of this script's own (``_WireLog``): the first
# copy of every byte is what is stored (the reassembler's documented rule), a
# segment carrying bytes that already arrived is a retransmission, one of them
# whose bytes differ is an overlap mismatch, one starting beyond the bytes
# received so far is out of order.
# ---------------------------------------------------------------------------

TCP_SERVER_PORT = 18498


class _WireLog:
    """What one direction of a connection put on the wire: the first copy of
    every byte, and the counts of the TCP model above."""

    def __init__(self) -> None:
        self.first: dict[int, int] = {}  # offset → the byte that arrived first
        self.prefix = 0  # bytes received contiguously from offset 0
        self.retransmission = 0
        self.mismatch = 0
        self.out_of_order = 0

    def add(self, off: int, payload: bytes) -> None:
        seen = [i for i in range(off, off + len(payload)) if i in self.first]
        if seen:
            self.retransmission += 1
            if any(self.first[i] != payload[i - off] for i in seen):
                self.mismatch += 1
        if off > self.prefix:
            self.out_of_order += 1
        for i, b in enumerate(payload):
            self.first.setdefault(off + i, b)
        while self.prefix in self.first:
            self.prefix += 1

    def stream(self) -> bytes:
        """The direction's bytes as stored (first copies, up to the first hole)."""
        return bytes(self.first[i] for i in range(self.prefix))


class _Wire:
    """One TCP connection on 127.0.0.1 built segment by segment: each data
    segment is placed at a byte offset of its direction, so retransmissions,
    overlaps and reordering are exactly what the fixture says. Capture times
    advance by ``step`` per packet unless a segment says otherwise."""

    def __init__(self, client_port: int, t0: float, step: float = 0.001) -> None:
        self.client_port = client_port
        self.isn = {True: 1000 + client_port, False: 5000 + client_port}
        self.length = {True: 0, False: 0}  # bytes sent so far per direction
        self.fin = {True: False, False: False}
        self.log = {True: _WireLog(), False: _WireLog()}
        self.t = t0
        self.step = step
        self.pkts: list[Packet] = []

    def _emit(self, from_client: bool, flags: str, seq: int, payload: bytes = b"") -> None:
        from scapy.layers.l2 import Ether

        cli, srv = ("127.0.0.1", self.client_port), ("127.0.0.1", TCP_SERVER_PORT)
        a, b = (cli, srv) if from_client else (srv, cli)
        # the cumulative ACK: what the other direction delivered in order (and its FIN)
        other = not from_client
        ack = (self.isn[other] + 1 + self.log[other].prefix + self.fin[other]) % MOD
        p = Ether() / IP(src=a[0], dst=b[0]) / TCP(sport=a[1], dport=b[1], flags=flags, seq=seq)
        if "A" in flags:
            p[TCP].ack = ack
        if payload:
            p = p / Raw(payload)
        p.time = self.t
        self.t += self.step
        self.pkts.append(p)

    def open(self) -> _Wire:
        self._emit(True, "S", self.isn[True])
        self._emit(False, "SA", self.isn[False])
        self._emit(True, "A", self.isn[True] + 1)
        return self

    def segment(self, from_client: bool, off: int, payload: bytes) -> None:
        """A data segment at byte ``off`` of its direction (as put on the wire)."""
        self.log[from_client].add(off, payload)
        self.length[from_client] = max(self.length[from_client], off + len(payload))
        self._emit(from_client, "PA", (self.isn[from_client] + 1 + off) % MOD, payload)

    def send(self, from_client: bool, data: bytes, mss: int = 16000) -> None:
        """``data`` in order, after what this direction sent so far."""
        start = self.length[from_client]
        for i in range(0, len(data), mss):
            self.segment(from_client, start + i, data[i : i + mss])

    def close(self) -> list[Packet]:
        for fc in (True, False):
            assert self.log[fc].prefix == self.length[fc], "a hole before the FIN"
            self._emit(fc, "FA", (self.isn[fc] + 1 + self.length[fc]) % MOD)
            self.fin[fc] = True
        self._emit(True, "A", (self.isn[True] + 2 + self.length[True]) % MOD)
        return self.pkts

    def counts(self) -> dict[str, int]:
        """This connection's retransmissions, mismatches, out-of-order segments."""
        logs = self.log.values()
        return {
            "retransmission": sum(g.retransmission for g in logs),
            "overlap-mismatch": sum(g.mismatch for g in logs),
            "out-of-order": sum(g.out_of_order for g in logs),
        }


def _tcp_sse(pieces: list[str]) -> bytes:
    """An SSE chat response, one HTTP chunk per event (as servers write them)."""
    head, _, chunked = _sec_sse(pieces).partition(b"\r\n\r\n")
    events = [e + b"\n\n" for e in _dechunk(chunked).split(b"\n\n") if e]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return head + b"\r\n\r\n" + chunks + b"0\r\n\r\n"


def _dechunk(chunked: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        line_end = chunked.index(b"\r\n", pos)
        size = int(chunked[pos:line_end], 16)
        if size == 0:
            return bytes(out)
        out += chunked[line_end + 2 : line_end + 2 + size]
        pos = line_end + 2 + size + 2


def _altered(data: bytes, at: int) -> bytes:
    """``data`` with one letter at or after ``at`` changed (same length)."""
    i = next(k for k in range(at, len(data)) if chr(data[k]).isalpha())
    return data[:i] + (b"Z" if data[i : i + 1] != b"Z" else b"Q") + data[i + 1 :]


def _tcp_entry(
    wire: _Wire, exchange: int, resp_start: int, resp_end: int, **kw: Any
) -> dict[str, Any]:
    """A stream entry from the response bytes as stored (first copies)."""
    data = wire.log[False].stream()[resp_start:resp_end]
    (resp,) = parse_responses(data)
    s = summarize_stream(resp.body, True)
    entry = _sec_stream(wire.client_port, exchange, "", 0, **kw)
    entry["choices"] = {
        str(k): {"text": c["text"], "finish_reason": c["finish_reason"], "chunks": c["chunks"]}
        for k, c in sorted(s["choices"].items())
    }
    entry["done_seen"] = s["done"]
    return entry


def fault_overlap_mismatch(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """TCP bytes that arrive twice with different content (Ptacek & Newsham's
    evasion of a passive sniffer) on a keep-alive connection: in the request of
    exchange 0 (a retransmission overlapping the start of its last segment, one
    letter changed), in the response of exchange 1 (a retransmission of a
    buffered out-of-order segment's end, one letter changed, reaching into the
    next segment's bytes); exchange 2 clean. A canary stream on another
    connection has exact retransmissions only."""
    port = 40201
    w = _Wire(port, SEC_T0 + 50).open()
    req0 = _sec_request(_sec_chat("What is the capital of France?"))
    k = len(req0) - 20
    w.segment(True, 0, req0[:k])
    w.segment(True, k, req0[k:])
    w.segment(True, k - 8, _altered(req0[k - 8 :], 8))  # starts 8 bytes before the last segment
    pieces0 = ["Paris", " is", " the", " capital."]
    w.send(False, _tcp_sse(pieces0))
    ends = [len(w.log[False].stream())]
    w.send(True, _sec_request(_sec_chat("And of Italy?")))
    pieces1 = ["Rome", " is", " the", " capital", " of", " Italy."]
    resp1 = _tcp_sse(pieces1)
    base = w.length[False]
    cuts = [0, len(resp1) // 4, len(resp1) // 2, 3 * len(resp1) // 4, len(resp1)]
    r = [(base + cuts[i], resp1[cuts[i] : cuts[i + 1]]) for i in range(4)]
    assert all(len(piece) < 1024 for _, piece in r)  # compared within one delivered chunk
    w.segment(False, *r[0])
    w.segment(False, *r[2])  # ahead of a hole: buffered
    h = len(r[2][1]) // 2
    w.segment(False, r[2][0] + h, _altered(r[2][1][h:], 0) + r[3][1][:10])
    w.segment(False, *r[1])
    w.segment(False, *r[3])
    ends.append(w.length[False])
    w.send(True, _sec_request(_sec_chat("Thanks.")))
    pieces2 = ["You", " are", " welcome."]
    w.send(False, _tcp_sse(pieces2))
    ends.append(w.length[False])
    a = w.close()

    canary = _Wire(port + 1, SEC_T0 + 50.0005).open()
    canary.send(True, _sec_request(_sec_chat("canary")))
    pieces_c = ["The", " canary", " sings", " on."]
    resp_c = _tcp_sse(pieces_c)
    q = len(resp_c) // 3
    canary.segment(False, 0, resp_c[:q])
    canary.segment(False, 0, resp_c[:q])  # an exact duplicate
    canary.segment(False, q, resp_c[q:])
    canary.segment(False, q // 2, resp_c[q // 2 : q + 10])  # exact, spanning a boundary
    b = canary.close()

    assert w.log[True].mismatch == 1 and w.log[False].mismatch == 1
    streams = [
        _tcp_entry(w, 0, 0, ends[0], flags=["overlap-mismatch"]),
        _tcp_entry(w, 1, ends[0], ends[1], flags=["overlap-mismatch"]),
        _tcp_entry(w, 2, ends[1], ends[2], flags=[]),
        _tcp_entry(canary, 0, 0, len(resp_c), flags=[]),
    ]
    # the stored text is the first copy's: the texts the server sent
    assert [s["choices"]["0"]["text"] for s in streams] == [
        "".join(x) for x in (pieces0, pieces1, pieces2, pieces_c)
    ]
    counts = {k: w.counts()[k] + canary.counts()[k] for k in w.counts()}
    exp = _sec_expected(
        "fault_overlap_mismatch",
        "TCP bytes that arrive twice with different content on a keep-alive connection: "
        "the request of exchange 0 and the response of exchange 1 (a buffered segment) "
        "each get a retransmission with one letter changed; the first copy is stored, "
        "both streams are flagged overlap-mismatch with an errors row each; exchange 2 "
        "and a canary stream on another connection (exact retransmissions) stay clean",
        streams,
        errors_min=2,
        error_kinds={"reassembly:overlap-mismatch": counts["overlap-mismatch"]},
        reassembly=counts,
    )
    exp["server_port"] = TCP_SERVER_PORT
    return sorted(a + b, key=lambda p: float(p.time)), exp


def fault_clock_backwards(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """The capture clock steps back 2 s between the request of exchange 0 and
    its response (its TTFT and duration come out negative: not real), then runs
    on steadily: exchange 1 on the same connection and a canary stream on
    another connection are unaffected."""
    port = 40203
    t0 = SEC_T0 + 60
    w = _Wire(port, t0).open()
    w.send(True, _sec_request(_sec_chat("What time is it?")))
    w.t -= 2.0  # the clock steps back (NTP, a merged capture)
    pieces0 = ["It", " is", " noon."]
    w.send(False, _tcp_sse(pieces0), mss=120)
    end0 = w.length[False]
    w.send(True, _sec_request(_sec_chat("Thanks.")))
    pieces1 = ["Any", " time."]
    w.send(False, _tcp_sse(pieces1), mss=120)
    a = w.close()
    canary = _Wire(port + 1, w.t + 0.01).open()
    canary.send(True, _sec_request(_sec_chat("canary")))
    pieces_c = ["Tick", " tock."]
    canary.send(False, _tcp_sse(pieces_c), mss=120)
    b = canary.close()
    streams = [
        _tcp_entry(w, 0, 0, end0, flags=["clock-backwards"]),
        _tcp_entry(w, 1, end0, w.length[False], flags=[]),
        _tcp_entry(canary, 0, 0, canary.length[False], flags=[]),
    ]
    exp = _sec_expected(
        "fault_clock_backwards",
        "the capture clock steps back 2 s between the request of exchange 0 and its "
        "response: the chunks are stored as captured, the stream flagged clock-backwards "
        "(its negative TTFT and duration are not real); exchange 1 and a canary stream on "
        "another connection are unaffected",
        streams,
    )
    exp["server_port"] = TCP_SERVER_PORT
    return a + b, exp


#: Crafted TCP and clock fixtures (``--only`` takes their names).
TCP_FIXTURES: list[Callable[[Path], tuple[list[Packet], dict[str, Any]]]] = [
    fault_overlap_mismatch,
    fault_clock_backwards,
]
#: Integers at the edges of the store's column widths (issue #24): 2^63 is one
#: past SQLite's INTEGER and PostgreSQL's BIGINT, 2^31 one past PostgreSQL's INTEGER.
BIG = 2**63


def _sse_body(datas: list[str], named: bool = False) -> bytes:
    """An SSE response, chunked, one event per data string (``named``: an
    ``event:`` line with the data's ``type``, as Anthropic sends)."""
    events = []
    for d in datas:
        name = json.loads(d).get("type") if named and d.startswith("{") else None
        events.append((f"event: {name}\n" if name else "") + f"data: {d}\n\n")
    chunked = b"".join(f"{len(e.encode()):x}\r\n".encode() + e.encode() + b"\r\n" for e in events)
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n"
    )


def _chat_chunk(index: Any, content: str | None = None, finish: str | None = None) -> str:
    delta = {} if content is None else {"content": content}
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return json.dumps(
        {"id": "c9", "object": "chat.completion.chunk", "model": "fake", "choices": [choice]}
    )


def sec_big_int(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """Integers wider than their columns from the server and the client, on one
    keep-alive connection, and an ordinary "canary" stream on another: a chat
    chunk whose ``choices[0].index`` is 2^63 and a usage chunk whose counts are
    2^63 and 2^64 (OpenAI), a content block ``index`` of 2^63 (Anthropic), a
    token id of 2^63 (TGI), a request whose ``n``, ``seed`` and ``max_tokens``
    are 2^63, 2^64 and 2^63. Each such item is recorded as invalid (an error
    row); the rest of each stream and the canary are stored exactly."""
    port = 40105
    openai = [
        json.dumps(
            {
                "id": "c9",
                "object": "chat.completion.chunk",
                "model": "fake",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Before"}}],
            }
        ),
        _chat_chunk(BIG, "LOST"),
        _chat_chunk(0, " after"),
        _chat_chunk(0, None, "stop"),
        json.dumps(
            {
                "id": "c9",
                "object": "chat.completion.chunk",
                "model": "fake",
                "choices": [],
                "usage": {"prompt_tokens": BIG, "completion_tokens": 2 * BIG, "total_tokens": 3},
            }
        ),
        "[DONE]",
    ]
    usage_in = {"input_tokens": 7, "output_tokens": 1}
    anthropic = [
        json.dumps(
            {
                "type": "message_start",
                "message": {
                    "id": "m9",
                    "type": "message",
                    "role": "assistant",
                    "model": "fake",
                    "content": [],
                    "usage": usage_in,
                },
            }
        ),
        json.dumps(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        ),
        json.dumps(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"},
            }
        ),
        json.dumps(
            {
                "type": "content_block_delta",
                "index": BIG,
                "delta": {"type": "text_delta", "text": "LOST"},
            }
        ),
        json.dumps(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": " there"},
            }
        ),
        json.dumps({"type": "content_block_stop", "index": 0}),
        json.dumps(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 2},
            }
        ),
        json.dumps({"type": "message_stop"}),
    ]
    tgi = [
        json.dumps(
            {
                "index": 1,
                "token": {"id": 15043, "text": "Hel", "logprob": -0.1, "special": False},
                "generated_text": None,
                "details": None,
            }
        ),
        json.dumps(
            {
                "index": 2,
                "token": {"id": BIG, "text": "LOST", "logprob": -0.2, "special": False},
                "generated_text": None,
                "details": None,
            }
        ),
        json.dumps(
            {
                "index": 3,
                "token": {"id": 29877, "text": "lo", "logprob": -0.3, "special": False},
                "generated_text": "HelLOSTlo",
                "details": {"finish_reason": "length", "generated_tokens": 3, "input_length": 2},
            }
        ),
    ]
    wide_request = _sec_chat("count", stream=False, n=BIG, seed=2 * BIG, max_tokens=BIG)
    fine = {
        "id": "c10",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Fine."},
                "finish_reason": "stop",
            }
        ],
    }
    anthropic_req = json.dumps(
        {
            "model": "fake",
            "stream": True,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    tgi_req = json.dumps(
        {"inputs": "Hel", "parameters": {"max_new_tokens": 3, "details": True}}
    ).encode()
    flows = [
        (_sec_request(_sec_chat("hi")), _sse_body(openai)),
        (_sec_request(anthropic_req, "/v1/messages"), _sse_body(anthropic, named=True)),
        (_sec_request(tgi_req, "/generate_stream"), _sse_body(tgi)),
        (_sec_request(wide_request), _sec_json_response(fine)),
    ]
    canary_pieces = ["The", " canary", " still", " sings."]
    flows2 = [(_sec_request(_sec_chat("canary")), _sec_sse(canary_pieces))]
    chat = _sec_stream(port, 0, "Before after", 2)
    messages = _sec_stream(
        port,
        1,
        "Hi there",
        2,
        path="/v1/messages",
        usage={"prompt_tokens": 7, "completion_tokens": 2},
        server_usage={"input_tokens": 7, "output_tokens": 2},
    )
    messages["choices"]["0"]["finish_reason"] = "end_turn"
    generate = _sec_stream(
        port,
        2,
        "Hello",
        2,
        path="/generate_stream",
        model=None,
        done_seen=True,
        usage={"prompt_tokens": 2, "completion_tokens": 3},
        server_usage=None,
    )
    generate["choices"]["0"]["finish_reason"] = "length"
    wide = _sec_stream(port, 3, "Fine.", 1, stream=False, done_seen=False)
    canary = _sec_stream(port + 1, 0, "".join(canary_pieces), len(canary_pieces))
    exp = _sec_expected(
        "sec_big_int",
        "integers past the store's column widths: a chat chunk with choices[0].index 2^63 and a "
        "usage chunk with counts 2^63 and 2^64, an Anthropic content block index 2^63, a TGI "
        "token id 2^63, a request with n 2^63, seed 2^64, max_tokens 2^63 (each such item an "
        "error row, the rest stored); a canary stream on another connection, complete",
        [chat, messages, generate, wide, canary],
        errors_min=5,
    )
    pkts = _sec_packets(port, flows, SEC_T0 + 50) + _sec_packets(port + 1, flows2, SEC_T0 + 50.0005)
    pkts.sort(key=lambda p: float(p.time))
    return pkts, exp


SECURITY_FIXTURES: list[Callable[[Path], tuple[list[Packet], dict[str, Any]]]] = [
    sec_deep_json,
    sec_gzip_bomb,
    sec_secrets,
    sec_pii,
    sec_big_int,
]


# ---------------------------------------------------------------------------
# h2c upgrades on a keep-alive connection: HTTP/1.1 exchanges, then a request
# carrying ``Upgrade: h2c`` answered on HTTP/2 stream 1, then more streams; the
# bytes come from real h2 endpoints (scripts/h2c_wire.py), the expected result
# from the pieces the server streamed.
# ---------------------------------------------------------------------------


def _wire_packets(client_port: int, wire: list[tuple[bool, bytes]], t0: float) -> list[Packet]:
    """One TCP connection on 127.0.0.1 carrying ``wire`` (each write in
    MSS-sized segments, in the order sent), handshake and FINs around it."""
    from scapy.layers.l2 import Ether

    cli, srv = ("127.0.0.1", client_port), ("127.0.0.1", SEC_SERVER_PORT)
    seq = {True: 999, False: 4999}
    pkts: list[Packet] = []
    t = [t0]

    def emit(from_client: bool, flags: str, payload: bytes = b"") -> None:
        a, b = (cli, srv) if from_client else (srv, cli)
        tcp = TCP(sport=a[1], dport=b[1], flags=flags, seq=seq[from_client])
        if "A" in flags:
            tcp.ack = seq[not from_client]
        p = Ether() / IP(src=a[0], dst=b[0]) / tcp
        if payload:
            p = p / Raw(payload)
        p.time = t[0]
        t[0] += 0.001
        pkts.append(p)
        grow = len(payload) + (1 if "S" in flags or "F" in flags else 0)
        seq[from_client] = (seq[from_client] + grow) % MOD

    emit(True, "S")
    emit(False, "SA")
    emit(True, "A")
    for from_client, data in wire:
        for i in range(0, len(data), 16000):
            emit(from_client, "PA", data[i : i + 16000])
    emit(True, "FA")
    emit(False, "FA")
    emit(True, "A")
    return pkts


def _h2c_fixture(
    name: str, description: str, port: int, before: int, preface_first: bool, t0: float
) -> tuple[list[Packet], dict[str, Any]]:
    from h2c_wire import upgrade_wire

    up = upgrade_wire(before, port=SEC_SERVER_PORT, preface_first=preface_first, after=2)
    streams = []
    for ex, pieces in enumerate(up.pieces):
        entry = _sec_stream(port, ex, "".join(pieces), len(pieces))
        entry["sse_events"] = len(pieces) + 2  # the pieces, the finish chunk, [DONE]
        streams.append(entry)
    return _wire_packets(port, up.wire, t0), _sec_expected(name, description, streams)


def h2c_upgrade_second(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """``Upgrade: h2c`` on the second request of a keep-alive connection."""
    return _h2c_fixture(
        "h2c_upgrade_second",
        "keep-alive: an HTTP/1.1 chat stream, then a chat request with Upgrade: h2c "
        "answered on HTTP/2 stream 1 after a 101 (exchange 1), then chats on streams 3 "
        "and 5 (exchanges 2, 3)",
        40111,
        1,
        False,
        SEC_T0 + 50,
    )


def h2c_preface_first(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """The client's preface pipelined before the server's 101, on the third request."""
    return _h2c_fixture(
        "h2c_preface_first",
        "keep-alive: two HTTP/1.1 chat streams, then a chat request with Upgrade: h2c "
        "whose client sends its HTTP/2 preface before the server's 101 (pipelined); "
        "stream 1 answers it (exchange 2), then chats on streams 3 and 5",
        40112,
        2,
        True,
        SEC_T0 + 60,
    )


#: Crafted protocol cases (not faults of a base recording).
H2C_FIXTURES: list[Callable[[Path], tuple[list[Packet], dict[str, Any]]]] = [
    h2c_upgrade_second,
    h2c_preface_first,
]


# ---------------------------------------------------------------------------
# Caps and end markers (issue 24): synthesized like the security fixtures.
# ``cap_NAME.pcap``: one exchange past one of the sniffer's caps (an item line
# over the decoders' line cap, a request body over the request cap, a flood of
# events carrying no output) or with items after ``data: [DONE]``, then a
# canary stream on another connection whose text must come out exact. Long
# bodies travel gzip-encoded (a real server's Content-Encoding), their noise
# tuned to stay under the sniffer's expansion-ratio cap, so the files stay
# small. The expected values are what this script put on the wire.
# ---------------------------------------------------------------------------

#: The sniffer's caps these fixtures go past (its configuration, not its output).
CAP_LINE = DEFAULT_MAX_LINE
CAP_REQUEST = MAX_REQUEST_BODY
CAP_QUIET = MAX_QUIET_EVENTS
CAP_T0 = SEC_T0 + 100


def _noise(n: int, seed: int) -> str:
    """``n`` letters, mostly "a" with a sprinkling of others at seeded places:
    gzip shrinks them about 60:1 (under the sniffer's 100:1 expansion cap)."""
    import random

    r = random.Random(seed)
    buf = bytearray(b"a" * n)
    for _ in range(n // 160):
        buf[r.randrange(n)] = r.choice(b"bcdefghijklmnopqrstuvwxyz")
    return buf.decode()


def _gzip(body: bytes) -> bytes:
    import gzip

    packed = gzip.compress(body, compresslevel=6, mtime=0)
    assert len(body) / len(packed) < 95, "too compressible for the expansion cap"
    return packed


def _cap_chunk(content: str | None = None, finish: str | None = None, role: bool = False) -> str:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    return json.dumps(
        {
            "id": "c9",
            "object": "chat.completion.chunk",
            "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _cap_sse_response(
    body: bytes, gzipped: bool = False, ctype: str = "text/event-stream"
) -> bytes:
    """A chunked streamed response carrying ``body`` (gzip-encoded if asked)."""
    if gzipped:
        body = _gzip(body)
    step = 60_000
    chunked = b"".join(
        f"{len(body[i : i + step]):x}\r\n".encode() + body[i : i + step] + b"\r\n"
        for i in range(0, len(body), step)
    )
    enc = b"content-encoding: gzip\r\n" if gzipped else b""
    return (
        f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\n".encode()
        + enc
        + b"transfer-encoding: chunked\r\n\r\n"
        + chunked
        + b"0\r\n\r\n"
    )


def _cap_events(items: list[str]) -> bytes:
    return b"".join(f"data: {i}\n\n".encode() for i in items)


CANARY = ["The", " canary", " sings", " on", "."]


def _cap_fixture(
    name: str,
    description: str,
    port: int,
    flow: tuple[bytes, bytes],
    entry: dict[str, Any],
    **extra: Any,
) -> tuple[list[Packet], dict[str, Any]]:
    """The exchange on ``port``, then the canary stream on ``port + 1``."""
    canary = _sec_stream(port + 1, 0, "".join(CANARY), len(CANARY), flags=[])
    exp = _sec_expected(name, description, [entry, canary], **extra)
    pkts = _sec_packets(port, [flow], CAP_T0) + _sec_packets(
        port + 1, [(_sec_request(_sec_chat("canary")), _sec_sse(CANARY))], CAP_T0 + 5
    )
    return pkts, exp


def cap_sse_line(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """An SSE content event whose data line is over the line cap, between
    ordinary content events: that event is dropped, the stream says so."""
    port = 40201
    long_text = _noise(CAP_LINE + 4096, seed=1)
    items = [
        _cap_chunk("Before", role=True),
        _cap_chunk(" the"),
        _cap_chunk(long_text),
        _cap_chunk(" after."),
        _cap_chunk(finish="stop"),
        "[DONE]",
    ]
    response = _cap_sse_response(_cap_events(items), gzipped=True)
    entry = _sec_stream(
        port,
        0,
        "Before the after.",
        3,
        flags=["item-over-cap"],
        stream_errors=["sse/line"],
    )
    return _cap_fixture(
        "cap_sse_line",
        f"an SSE content event of {len(items[2])} characters (over the "
        f"{CAP_LINE}-character line cap) between ordinary ones, gzip-encoded: it is "
        "dropped, the stream is flagged item-over-cap (verify fails it) with an sse "
        "error row; a canary stream on another connection is exact",
        port,
        (_sec_request(_sec_chat("long")), response),
        entry,
        errors_min=1,
    )


def cap_ndjson_line(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """An Ollama chat NDJSON line over the line cap between ordinary lines."""
    port = 40203

    def line(content: str, done: bool = False) -> str:
        obj: dict[str, Any] = {
            "model": "fake",
            "created_at": "2026-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": content},
            "done": done,
        }
        if done:
            obj["done_reason"] = "stop"
        return json.dumps(obj)

    lines = [
        line("Lines"),
        line(_noise(CAP_LINE + 4096, seed=2)),
        line(" survive."),
        line("", True),
    ]
    body = "".join(f"{x}\n" for x in lines).encode()
    response = _cap_sse_response(body, gzipped=True, ctype="application/x-ndjson")
    request = json.dumps(
        {"model": "fake", "messages": [{"role": "user", "content": "long"}], "stream": True}
    ).encode()
    entry = _sec_stream(
        port,
        0,
        "Lines survive.",
        2,
        path="/api/chat",
        done_seen=True,
        flags=["item-over-cap"],
        stream_errors=["ndjson/line"],
    )
    return _cap_fixture(
        "cap_ndjson_line",
        f"an Ollama /api/chat NDJSON line of {len(lines[1])} characters (over the "
        f"{CAP_LINE}-character line cap) between ordinary lines, gzip-encoded: it is "
        "dropped, the stream is flagged item-over-cap (verify fails it) with an ndjson "
        "error row; a canary stream on another connection is exact",
        port,
        (_sec_request(request, "/api/chat"), response),
        entry,
        errors_min=1,
    )


def cap_empty_events(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """More empty SSE events (``data:`` and a blank line) than the stream stage
    stores per stream, between the content and the finish."""
    port = 40205
    quiet = CAP_QUIET + 2000
    body = (
        _cap_events([_cap_chunk("Quiet", role=True), _cap_chunk(" please.")])
        + b"data:\n\n" * quiet
        + _cap_events([_cap_chunk(finish="stop"), "[DONE]"])
    )
    entry = _sec_stream(
        port,
        0,
        "Quiet please.",
        2,
        flags=["events-capped"],
        stream_errors=["streams/events-capped"],
        quiet_events=quiet,
    )
    return _cap_fixture(
        "cap_empty_events",
        f"{quiet} empty SSE events (data: and a blank line, no output) between the "
        f"content and the finish, over the {CAP_QUIET} stored per stream: the rest are "
        "counted in an events-capped error row, the stream is complete and flagged "
        "events-capped (a warning); a canary stream on another connection is exact",
        port,
        (_sec_request(_sec_chat("quiet")), _cap_sse_response(body)),
        entry,
        errors_min=1,
    )


def cap_request_cut(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """A request body over the request cap (a long prompt, gzip-encoded), its
    parameters before the messages."""
    port = 40207
    params = {
        "model": "fake",
        "stream": True,
        "temperature": 0.25,
        "top_p": 0.5,
        "n": 1,
        "max_tokens": 77,
        "seed": 42,
        "stream_options": {"include_usage": False},
    }
    body = {**params, "messages": [{"role": "user", "content": _noise(CAP_REQUEST, seed=3)}]}
    raw = json.dumps(body).encode()
    packed = _gzip(raw)
    pieces = ["Long", " prompt,", " short", " answer."]
    entry = _sec_stream(
        port,
        0,
        "".join(pieces),
        len(pieces),
        request={k: params[k] for k in ("temperature", "top_p", "n", "max_tokens", "seed")},
        flags=["request-cut"],
        stream_errors=["streams/request-cut"],
    )
    return _cap_fixture(
        "cap_request_cut",
        f"a request body of {len(raw)} bytes (over the {CAP_REQUEST}-byte request cap; "
        "gzip-encoded) whose parameters come before the long prompt: model, stream "
        "and the sampling parameters are read from the part kept, the stream is "
        "flagged request-cut (a warning) with an error row; the response is exact; a "
        "canary stream on another connection is exact",
        port,
        (
            _sec_request(packed, extra=b"Content-Encoding: gzip\r\n"),
            _sec_sse(pieces),
        ),
        entry,
        errors_min=1,
    )


def cap_after_done(_pcaps: Path) -> tuple[list[Packet], dict[str, Any]]:
    """Content events (and a second end marker) after ``data: [DONE]``."""
    port = 40209
    after = [_cap_chunk(" Ghost"), _cap_chunk(" text."), "[DONE]"]
    items = [
        _cap_chunk("Done", role=True),
        _cap_chunk(" is done."),
        _cap_chunk(finish="stop"),
        "[DONE]",
        *after,
    ]
    entry = _sec_stream(port, 0, "Done is done.", 2, flags=["after-done"], after_done=after)
    return _cap_fixture(
        "cap_after_done",
        "two content events and a second [DONE] after data: [DONE]: the answer is "
        "what came before the marker; the rest is stored apart (chunk kind "
        "after_done, raw as sent) and the stream is flagged after-done (a warning); a "
        "canary stream on another connection is exact",
        port,
        (_sec_request(_sec_chat("after")), _cap_sse_response(_cap_events(items))),
        entry,
    )


CAP_FIXTURES: list[Callable[[Path], tuple[list[Packet], dict[str, Any]]]] = [
    cap_sse_line,
    cap_ndjson_line,
    cap_empty_events,
    cap_request_cut,
    cap_after_done,
]


FAULTS: list[Callable[[Path], tuple[list[Packet], dict[str, Any]]]] = [
    fault_reorder,
    fault_dup,
    fault_overlap,
    fault_lost,
    fault_midstream,
    fault_seqwrap,
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pcaps", type=Path, default=REPO / "pcaps", help="the recorded base fixtures")
    ap.add_argument("--out", type=Path, default=FAULTS_DIR, help="where the faults are written")
    ap.add_argument(
        "--security-only",
        action="store_true",
        help="only the synthesized fixtures (sec_*, h2c_*: no base recording needed)",
    )
    ap.add_argument("--caps-only", action="store_true", help="only the cap fixtures (cap_*)")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only these synthesized fixtures (sec_*, h2c_*, cap_* and the TCP/clock ones)",
    )
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    if ns.only:
        makers = {
            m.__name__: m for m in [*SECURITY_FIXTURES, *H2C_FIXTURES, *TCP_FIXTURES, *CAP_FIXTURES]
        }
        unknown = set(ns.only) - set(makers)
        if unknown:
            print(f"unknown fixtures: {sorted(unknown)}", file=sys.stderr)
            return 2
        for name in ns.only:
            pkts, expected = makers[name](ns.pcaps)
            wrpcap(str(ns.out / f"{name}.pcap"), pkts)
            write_expected(ns.out / f"{name}.expected.json", expected)
            print(f"{name:22s} {len(pkts):5d} packets  (synthesized)")
        return 0
    for make in CAP_FIXTURES:
        pkts, expected = make(ns.pcaps)
        name = expected["fixture"]
        wrpcap(str(ns.out / f"{name}.pcap"), pkts)
        write_expected(ns.out / f"{name}.expected.json", expected)
        print(f"{name:22s} {len(pkts):5d} packets  (synthesized)")
    if ns.caps_only:
        return 0
    for make in [*SECURITY_FIXTURES, *H2C_FIXTURES, *TCP_FIXTURES]:
        pkts, expected = make(ns.pcaps)
        name = expected["fixture"]
        wrpcap(str(ns.out / f"{name}.pcap"), pkts)
        write_expected(ns.out / f"{name}.expected.json", expected)
        print(f"{name:22s} {len(pkts):5d} packets  (synthesized)")
    if ns.security_only or ns.only:
        return 0
    for fault in FAULTS:
        pkts, expected = fault(ns.pcaps)
        name = expected["fixture"]
        wrpcap(str(ns.out / f"{name}.pcap"), pkts)
        write_expected(ns.out / f"{name}.expected.json", expected)
        print(f"{name:22s} {len(pkts):5d} packets  from {expected['base']}")
    expected = fault_truncated_file(ns.pcaps, ns.out)
    print(f"{'fault_truncated_file':22s}   cut    from {expected['base']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
