#!/usr/bin/env python3
"""Measure each fixture's time to first token from the capture, independently of
the sniffer, and write it into the expected files as ``ttft_ms``.

A different route from the pipeline's: scapy reads the packets; each TCP
direction is put in sequence order here (first copy of a byte wins); every
byte gets the capture time at which it became readable in order (the packet
that delivered it, or the later one that filled the hole before it). Then, per
exchange on each connection:

* the request time is when the last byte of the request head became readable;
* the first content is the first body item that carries output — an SSE event
  (when its terminating empty line arrives) or an NDJSON line (at its newline)
  holding non-empty text, reasoning or a tool call, judged by each API's
  documented fields (OpenAI chat and completions, Responses, Anthropic
  Messages, TGI, Ollama); for a non-streamed body, when its last byte arrives;

A connection that switches to HTTP/2 (``Upgrade: h2c``: the 101, then frames;
the client's preface right after its upgrade request) goes on with its HTTP/2
streams: stream 1 answers the upgraded request, streams 3, 5, … are the next
exchanges; a request's time is then when its header block's last frame
became readable, and the body is what the DATA frames carry (frame headers,
padding and HPACK read here, with the ``hpack`` package).

``ttft_ms`` is the difference, in milliseconds rounded to the microsecond of
the capture clock; ``null`` when the exchange carries no output (or the capture
does not show its request). Compressed response bodies are not measured
(no ``ttft_ms``). Exchanges whose expected result is not exact
(``check_text`` false: lost or cut bytes) get no ``ttft_ms``.

Usage: ``python scripts/measure_ttft.py [--check] [PCAP ...]`` (default: every
fixture in pcaps/ and pcaps/faults/). ``make pcaps`` runs it after recording.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hpack
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.utils import PcapReader

REPO = Path(__file__).resolve().parents[1]
MOD = 1 << 32
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass
class Direction:
    """One TCP direction's bytes in sequence order, with the time each became readable."""

    base: int | None = None
    pending: dict[int, tuple[bytes, float]] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    ready: list[float] = field(default_factory=list)  # capture time per byte of data

    def add(self, seq: int, payload: bytes, ts: float, syn: bool) -> None:
        if syn:
            self.base = (seq + 1) % MOD
            return
        if not payload:
            return
        if self.base is None:  # no handshake captured: start at the first byte seen
            self.base = seq
        off = (seq - self.base) % MOD
        if off > MOD // 2:  # before the base (a retransmission of old bytes)
            return
        self.pending.setdefault(off, (payload, ts))
        self._advance(ts)

    def _advance(self, ts: float) -> None:
        moved = True
        while moved:
            moved = False
            end = len(self.data)
            for off in sorted(self.pending):
                payload, _ = self.pending[off]
                if off <= end < off + len(payload):
                    new = payload[end - off :]
                    self.data += new
                    self.ready += [ts] * len(new)
                    moved = True
                    break
                if off + len(payload) <= end:
                    del self.pending[off]
                    moved = True
                    break


def read_directions(pcap: Path, server_port: int) -> dict[tuple[int, bool], Direction]:
    """(client port, from client) → Direction, packets in capture order."""
    dirs: dict[tuple[int, bool], Direction] = {}
    reader = PcapReader(str(pcap))
    try:
        while True:
            try:
                pkt = reader.read_packet()
            except EOFError:
                break
            except Exception:  # a cut record at the end of a truncated file
                break
            if TCP not in pkt or (IP not in pkt and IPv6 not in pkt):
                continue
            tcp = pkt[TCP]
            if server_port not in (tcp.sport, tcp.dport):
                continue
            from_client = tcp.dport == server_port
            port = tcp.sport if from_client else tcp.dport
            d = dirs.setdefault((port, from_client), Direction())
            d.add(int(tcp.seq), bytes(tcp.payload), float(pkt.time), bool(tcp.flags & 0x02))
    finally:
        reader.close()
    return dirs


@dataclass
class Message:
    head_end: int  # offset just after the head's empty line
    headers: dict[str, str]
    status: int | None
    body: bytes  # decoded (de-chunked) body bytes that are in the capture
    body_raw: list[int]  # raw offset of each decoded body byte
    end: int | None  # offset just after the message, None if cut


def parse_messages(
    data: bytes, responses: bool, methods: list[str] | None = None, pos: int = 0
) -> list[Message]:
    out: list[Message] = []
    while pos < len(data):
        if not responses and data.startswith(PREFACE, pos):
            break  # HTTP/2 from here on (h2c_streams)
        head_end = data.find(b"\r\n\r\n", pos)
        if head_end < 0:
            break
        head_end += 4
        lines = data[pos:head_end].decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if responses else None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = bytearray()
        raw: list[int] = []
        end: int | None
        method = methods[len(out)] if methods and len(out) < len(methods) else "GET"
        if responses and (method == "HEAD" or status in (204, 304) or (status or 0) < 200):
            end = head_end
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            p = head_end
            end = None
            while True:
                nl = data.find(b"\r\n", p)
                if nl < 0:
                    break
                size = int(data[p:nl].split(b";")[0].strip() or b"0", 16)
                start = nl + 2
                if size == 0:
                    trailer = data.find(b"\r\n", start)
                    end = trailer + 2 if trailer >= 0 else None
                    break
                piece = data[start : start + size]
                body += piece
                raw += range(start, start + len(piece))
                if len(piece) < size:
                    break
                p = start + size + 2
        elif "content-length" in headers:
            n = int(headers["content-length"])
            piece = data[head_end : head_end + n]
            body += piece
            raw += range(head_end, head_end + len(piece))
            end = head_end + n if len(piece) == n else None
        elif responses:  # until close
            piece = data[head_end:]
            body += piece
            raw += range(head_end, len(data))
            end = len(data)
        else:
            end = head_end
        out.append(Message(head_end, headers, status, bytes(body), raw, end))
        if end is None or status == 101:  # after a 101: HTTP/2 (h2c_streams)
            break
        pos = end
    return out


def _frames(data: bytes, pos: int) -> list[tuple[int, int, int, int, int]]:
    """HTTP/2 frames from ``pos``: (type, flags, stream, payload start, payload end)."""
    out = []
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        if pos + 9 + length > len(data):
            break
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        out.append((data[pos + 3], data[pos + 4], sid, pos + 9, pos + 9 + length))
        pos += 9 + length
    return out


def h2c_streams(
    c: bytes, c_at: int, s: bytes, s_at: int
) -> tuple[dict[int, int], dict[int, Message]]:
    """After an h2c switch (the client's preface at ``c_at``, the server's frames
    at ``s_at``): per client stream, the offset of its request head's last byte;
    per stream, the server's response (headers, DATA payload with raw offsets)."""
    heads: dict[int, int] = {}
    for ftype, flags, sid, _, end in _frames(c, c_at + len(PREFACE)):
        if ftype in (1, 9) and flags & 0x4 and sid not in heads:  # END_HEADERS
            heads[sid] = end - 1
    resps: dict[int, Message] = {}
    dec = hpack.Decoder()
    block = b""
    for ftype, flags, sid, start, end in _frames(s, s_at):
        if ftype in (1, 9):  # HEADERS, CONTINUATION
            if ftype == 1:
                pad = s[start] if flags & 0x8 else 0
                start += (1 if flags & 0x8 else 0) + (5 if flags & 0x20 else 0)
                block = s[start : end - pad]
            else:
                block += s[start:end]
            if flags & 0x4:
                fields = {k.lower(): v for k, v in dec.decode(block)}
                status = int(fields.get(":status", "0"))
                if sid not in resps and status >= 200:
                    resps[sid] = Message(end, fields, status, b"", [], None)
        elif ftype == 0 and sid in resps:  # DATA
            pad = s[start] if flags & 0x8 else 0
            start += 1 if flags & 0x8 else 0
            m = resps[sid]
            m.body += s[start : end - pad]
            m.body_raw += range(start, end - pad)
            if flags & 0x1:
                m.end = end
    return heads, resps


def _text(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def carries_output(obj: Any, event: str = "") -> bool:
    """Does one streamed item carry output text, reasoning or a tool call
    (by each API's documented fields)?"""
    if not isinstance(obj, dict):
        return False
    kind = obj.get("type") or event
    # OpenAI chat / completions
    for ch in obj.get("choices") or []:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta") or {}
        if _text(ch.get("text")) or _text(delta.get("content")):
            return True
        if _text(delta.get("reasoning_content")) or _text(delta.get("reasoning")):
            return True
        if delta.get("tool_calls"):
            return True
    # OpenAI Responses
    if kind in (
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
    ):
        return _text(obj.get("delta"))
    if kind == "response.output_item.added":
        return (obj.get("item") or {}).get("type") == "function_call"
    # Anthropic Messages
    if kind == "content_block_start":
        block = obj.get("content_block") or {}
        return block.get("type") == "tool_use" or _text(block.get("text"))
    if kind == "content_block_delta":
        d = obj.get("delta") or {}
        return any(_text(d.get(k)) for k in ("text", "thinking", "partial_json"))
    # TGI
    token = obj.get("token")
    if isinstance(token, dict):
        return _text(token.get("text")) and not token.get("special")
    # Ollama
    msg = obj.get("message")
    if isinstance(msg, dict) and (
        _text(msg.get("content")) or _text(msg.get("thinking")) or msg.get("tool_calls")
    ):
        return True
    return _text(obj.get("response")) or _text(obj.get("thinking"))


_LINE = re.compile(rb"\r\n|\r|\n")


def first_output_offset(msg: Message) -> int | None:
    """Offset (in the decoded body) of the byte whose arrival delivers the first
    item with output; None if no item carries output."""
    ctype = msg.headers.get("content-type", "")
    body = msg.body
    if ctype.startswith("text/event-stream"):
        data: list[str] = []
        event = ""
        pos = 0
        for m in _LINE.finditer(body):
            line = body[pos : m.start()].decode("utf-8", "replace")
            if line == "":
                if data:
                    payload = "\n".join(data)
                    try:
                        obj = json.loads(payload)
                    except ValueError:
                        obj = None
                    if carries_output(obj, event):
                        return m.start()  # the empty line's line end dispatches the event
                data, event = [], ""
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif line.startswith("event:"):
                event = line[6:].strip()
            pos = m.end()
        return None
    if "ndjson" in ctype:
        pos = 0
        for line in body.split(b"\n"):
            end = pos + len(line)
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if carries_output(obj):
                return end if end < len(body) else len(body) - 1
            pos = end + 1
        return None
    # a whole body: read when its last byte arrives
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return len(body) - 1 if body and _whole_has_output(obj) else None


def _whole_has_output(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    for ch in obj.get("choices") or []:
        msg = ch.get("message") or {}
        if _text(ch.get("text")) or _text(msg.get("content")) or msg.get("tool_calls"):
            return True
        if _text(msg.get("reasoning_content")):
            return True
    for item in obj.get("output") or []:  # Responses
        if item.get("type") in ("message", "reasoning", "function_call"):
            return True
    for block in obj.get("content") or []:  # Anthropic
        if isinstance(block, dict) and (
            block.get("type") == "tool_use" or _text(block.get("text"))
        ):
            return True
    if _text(obj.get("generated_text")) or _text(obj.get("response")):  # TGI, Ollama
        return True
    msg = obj.get("message")
    return isinstance(msg, dict) and (_text(msg.get("content")) or bool(msg.get("tool_calls")))


def measure(pcap: Path, exp: dict[str, Any]) -> dict[tuple[int, int], float | None]:
    """(client port, exchange) → ttft in ms (None: no output)."""
    dirs = read_directions(pcap, exp["server_port"])
    out: dict[tuple[int, int], float | None] = {}
    ports = {s["client_port"] for s in exp["streams"]}
    for port in ports:
        c, s = dirs.get((port, True)), dirs.get((port, False))
        if c is None or s is None:
            continue
        reqs = parse_messages(bytes(c.data), False)
        starts = [0] + [r.end or 0 for r in reqs[:-1]]
        methods = [bytes(c.data[st : st + 16]).split(b" ", 1)[0].decode() for st in starts]
        # a capture that began inside a response shows its tail first: skip to a status line
        skip = 0 if s.data.startswith(b"HTTP/1.") else s.data.find(b"\r\nHTTP/1.") + 2
        resps = parse_messages(bytes(s.data), True, methods, skip)
        req_ends = [r.head_end - 1 for r in reqs]
        if resps and resps[-1].status == 101 and len(resps) == len(reqs):
            # h2c: the upgraded request is answered on stream 1, then streams 3, 5, …
            heads, answers = h2c_streams(
                bytes(c.data), reqs[-1].end or 0, bytes(s.data), resps[-1].end or 0
            )
            resps = [*resps[:-1], *(answers[sid] for sid in sorted(answers) if sid % 2)]
            req_ends += [heads[sid] for sid in sorted(heads) if sid > 1]
        for want in exp["streams"]:
            if want["client_port"] != port:
                continue
            ex = want["exchange"]
            # a capture that began mid-connection shows neither the first exchanges
            # nor their requests: pair the exchanges it does show from the end
            shown = len(req_ends)
            k = ex - (
                max(w["exchange"] for w in exp["streams"] if w["client_port"] == port) + 1 - shown
            )
            if not 0 <= k < len(req_ends) or k >= len(resps):
                continue
            if resps[k].headers.get("content-encoding", "identity").lower() != "identity":
                continue  # compressed body: not read by this route (no ttft_ms is written)
            t_req = c.ready[req_ends[k]]
            off = first_output_offset(resps[k])
            if off is None:
                out[(port, ex)] = None
                continue
            t_out = s.ready[resps[k].body_raw[off]]
            out[(port, ex)] = round((t_out - t_req) * 1000, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pcaps", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="only compare with the files")
    ns = ap.parse_args(argv)
    paths = ns.pcaps or sorted(
        p for p in (REPO / "pcaps").rglob("*.pcap") if p.with_suffix(".expected.json").exists()
    )  # pcaps/h2/ has its own ground truth (NAME.expected-h2.json)
    bad = 0
    for pcap in paths:
        path = pcap.with_suffix(".expected.json")
        exp = json.loads(path.read_text(encoding="utf-8"))
        got = measure(pcap, exp)
        changed = False
        for want in exp["streams"]:
            key = (want["client_port"], want["exchange"])
            if not want.get("check_text", True) or key not in got:
                continue
            if want.get("ttft_ms", "absent") != got[key]:
                changed = True
                if ns.check:
                    print(f"{pcap.name} {key}: file {want.get('ttft_ms')} measured {got[key]}")
                    bad += 1
                want["ttft_ms"] = got[key]
        print(f"{pcap.name:36s} {got}")
        if changed and not ns.check:
            path.write_text(json.dumps(exp, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
