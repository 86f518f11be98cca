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
        "--security-only", action="store_true", help="only the security fixtures (sec_*)"
    )
    ap.add_argument(
        "--only", nargs="*", metavar="NAME", help="only these security fixtures (e.g. sec_big_int)"
    )
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    for make in SECURITY_FIXTURES:
        if ns.only and make.__name__ not in ns.only:
            continue
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
