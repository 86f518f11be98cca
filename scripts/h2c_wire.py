"""Keep-alive connections that switch from HTTP/1.1 to HTTP/2 with
``Upgrade: h2c``, as the bytes two real HTTP/2 endpoints (the ``h2`` package,
client and server in memory) put on the wire: for the crafted fixtures
(``craft_faults.py``) and the fuzz campaign (``fuzz.py``).

``upgrade_wire`` gives the wire, in the order it was sent, and per exchange the
content pieces the server streamed: the ground truth of what the client read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import h2.config
import h2.connection

Wire = list[tuple[bool, bytes]]  # (from the client, bytes), in the order sent

MODEL = "fake"
PATH = "/v1/chat/completions"
SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"


@dataclass
class Upgraded:
    """A crafted connection and what its client received."""

    wire: Wire
    pieces: list[list[str]] = field(default_factory=list)  # per exchange, in order
    upgraded: int = -1  # the exchange that carried Upgrade: h2c (-1: refused)


def chat_body(prompt: str) -> bytes:
    return json.dumps(
        {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    ).encode()


def chat_request(port: int, prompt: str, extra: bytes = b"") -> bytes:
    body = chat_body(prompt)
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\n".encode()
        + extra
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def upgrade_headers(settings: bytes) -> bytes:
    return (
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: "
        + settings
        + b"\r\n"
    )


def sse_body(pieces: list[str]) -> bytes:
    """An OpenAI chat stream: one chunk per piece, a finish chunk, ``[DONE]``."""
    events: list[object] = []
    for i, p in enumerate(pieces):
        delta = {"role": "assistant", "content": p} if i == 0 else {"content": p}
        events.append(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
        )
    events.append(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def h1_sse_response(pieces: list[str]) -> bytes:
    body = sse_body(pieces)
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )


def _pump(c: h2.connection.H2Connection, s: h2.connection.H2Connection, wire: Wire) -> None:
    for _ in range(10):
        moved = False
        cb = c.data_to_send()
        if cb:
            wire.append((True, cb))
            s.receive_data(cb)
            moved = True
        sb = s.data_to_send()
        if sb:
            wire.append((False, sb))
            c.receive_data(sb)
            moved = True
        if not moved:
            return


def upgrade_wire(
    before: int,
    *,
    port: int = 8000,
    preface_first: bool = False,
    after: int = 1,
    refused: bool = False,
    pieces: int = 3,
) -> Upgraded:
    """``before`` HTTP/1.1 chat streams on one connection, then a chat request
    with ``Upgrade: h2c``: answered on HTTP/2 stream 1 after a 101 (the client's
    preface sent before the 101, pipelined, or after it), then ``after`` chats
    on streams 3, 5, …; or, ``refused``, answered in HTTP/1.1 and followed by
    ``after`` more HTTP/1.1 chats."""
    out = Upgraded([])
    wire = out.wire

    def words(n: int) -> list[str]:
        return [f"{'' if i == 0 else ' '}w{n}.{i}" for i in range(pieces)]

    for i in range(before):
        w = words(len(out.pieces))
        wire += [(True, chat_request(port, f"h1 {i}")), (False, h1_sse_response(w))]
        out.pieces.append(w)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    s = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    settings = c.initiate_upgrade_connection()
    wire.append((True, chat_request(port, "upgrade", upgrade_headers(settings))))
    if refused:
        for i in range(after + 1):
            w = words(len(out.pieces))
            if i:
                wire.append((True, chat_request(port, f"after {i}")))
            wire.append((False, h1_sse_response(w)))
            out.pieces.append(w)
        return out
    out.upgraded = len(out.pieces)
    preface = c.data_to_send()
    if preface_first:
        wire.append((True, preface))
    s.initiate_upgrade_connection(settings)
    s.send_headers(1, [(":status", "200"), ("content-type", "text/event-stream")])
    w = words(len(out.pieces))
    s.send_data(1, sse_body(w), end_stream=True)
    frames = s.data_to_send()
    wire.append((False, SWITCHING + frames))
    out.pieces.append(w)
    if not preface_first:
        wire.append((True, preface))
    c.receive_data(frames)
    s.receive_data(preface)
    _pump(c, s, wire)
    for i in range(after):
        sid = c.get_next_available_stream_id()
        body = chat_body(f"h2 {i}")
        c.send_headers(
            sid,
            [
                (":method", "POST"),
                (":path", PATH),
                (":scheme", "http"),
                (":authority", f"127.0.0.1:{port}"),
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
            ],
        )
        c.send_data(sid, body, end_stream=True)
        _pump(c, s, wire)
        s.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream")])
        w = words(len(out.pieces))
        s.send_data(sid, sse_body(w), end_stream=True)
        _pump(c, s, wire)
        out.pieces.append(w)
    return out
