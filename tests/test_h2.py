"""HTTP/2 (h2c): the passive frame + HPACK decoder, through the whole pipeline.

The wire bytes come from a real HTTP/2 implementation: two ``h2`` endpoints
(client and server) talking to each other in memory, so frames, HPACK
encoding (dynamic table included), padding and CONTINUATION are what a peer
sends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import (
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    FlowData,
    FlowEvent,
    FlowGap,
    HttpTrailers,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.core.h2 import PREFACE, H2Conn, find_frame_start
from sniffer.core.pipeline import Pipeline

CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 8443)

Wire = list[tuple[bool, bytes]]  # (from_client, bytes)


class Peers:
    """A real h2 client and server, in memory; records every byte each sent."""

    def __init__(self) -> None:
        self.c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.s = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.wire: Wire = []
        self.c.initiate_connection()
        self.s.initiate_connection()
        self.pump()

    def pump(self) -> None:
        for _ in range(10):
            moved = False
            cb = self.c.data_to_send()
            if cb:
                self.wire.append((True, cb))
                self.s.receive_data(cb)
                moved = True
            sb = self.s.data_to_send()
            if sb:
                self.wire.append((False, sb))
                self.c.receive_data(sb)
                moved = True
            if not moved:
                return

    def request(self, body: dict[str, object], path: str = "/v1/chat/completions") -> int:
        sid = self.c.get_next_available_stream_id()
        raw = json.dumps(body).encode()
        self.c.send_headers(
            sid,
            [
                (":method", "POST"),
                (":path", path),
                (":scheme", "http"),
                (":authority", "127.0.0.1:8443"),
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-secret"),
                ("content-length", str(len(raw))),
            ],
        )
        self.c.send_data(sid, raw, end_stream=True)
        self.pump()
        return sid

    def respond_head(self, sid: int, ctype: str = "text/event-stream") -> None:
        self.s.send_headers(sid, [(":status", "200"), ("content-type", ctype)])
        self.pump()

    def sse(self, sid: int, obj: object, end: bool = False, pad: int = 0) -> None:
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        self.s.send_data(sid, data, end_stream=end, pad_length=pad or None)
        self.pump()


def chunk(text: str | None = None, finish: str | None = None) -> dict[str, object]:
    d: dict[str, object] = {} if text is None else {"content": text}
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": d, "finish_reason": finish}],
    }


CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def run(
    wire: Sequence[tuple[bool, bytes]],
    *,
    split: Callable[[bytes], list[bytes]] | None = None,
    opened: bool = True,
    extra: Sequence[FlowEvent] = (),
) -> list[StoreEvent]:
    p = Pipeline()
    flows: list[FlowEvent] = []
    if opened:
        flows.append(ConnectionOpened(1, 0.5, CLIENT, SERVER, True))
    ts = 1.0
    for fc, data in wire:
        for piece in split(data) if split else [data]:
            flows.append(FlowData(1, ts, fc, piece))
            ts += 0.01
    flows.extend(extra)
    flows.append(ConnectionClosed(1, ts + 1, "fin"))
    return p.feed_flows(flows)


def of(events: Sequence[StoreEvent], t: type) -> list:
    return [e for e in events if isinstance(e, t)]


def one_stream(p: Peers, words: Sequence[str]) -> int:
    sid = p.request(CHAT)
    p.respond_head(sid)
    for w in words:
        p.sse(sid, chunk(w))
    p.sse(sid, chunk(finish="stop"))
    p.sse(sid, b"[DONE]", end=True)
    return sid


def test_prior_knowledge_stream_is_an_openai_chat_row() -> None:
    p = Peers()
    one_stream(p, ["Hel", "lo", "!"])
    out = run(p.wire)
    (op,) = of(out, StreamOpened)
    assert op.dialect == "openai.chat"
    assert op.method == "POST" and op.path == "/v1/chat/completions"
    assert all(n != "authorization" for n, _ in op.request_headers)
    assert ("host", "127.0.0.1:8443") in op.request_headers
    (resp,) = of(out, StreamResponse)
    assert resp.status == 200 and resp.streaming
    texts = [c.text for c in of(out, ChunkEvent) if c.text]
    assert texts == ["Hel", "lo", "!"]
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.COMPLETE, closed.reason
    assert closed.done_seen and closed.chunk_count == 3
    assert not of(out, PipelineError)


def test_interleaved_streams_each_become_an_exchange() -> None:
    p = Peers()
    sids = [p.request(CHAT) for _ in range(3)]
    for sid in sids:
        p.respond_head(sid)
    for i in range(4):
        for k, sid in enumerate(sids):
            p.sse(sid, chunk(f"s{k}w{i}"))
    for sid in reversed(sids):
        p.sse(sid, chunk(finish="stop"), end=True)
    out = run(p.wire)
    opened = of(out, StreamOpened)
    assert [o.exchange for o in opened] == [0, 1, 2]  # stream ids 1, 3, 5
    by_stream = {o.stream: o.exchange for o in opened}
    texts: dict[int, list[str]] = {}
    for c in of(out, ChunkEvent):
        if c.text:
            texts.setdefault(by_stream[c.stream], []).append(c.text)
    assert texts == {k: [f"s{k}w{i}" for i in range(4)] for k in range(3)}
    assert all(c.state is StreamState.COMPLETE for c in of(out, StreamClosed))


def test_padding_continuation_and_dynamic_table() -> None:
    p = Peers()
    # Small max frame size on the client side forces CONTINUATION frames.
    big = [("x-big-" + str(i), "v" * 200) for i in range(200)]
    sid = p.c.get_next_available_stream_id()
    p.c.send_headers(
        sid,
        [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"),
         (":authority", "a"), ("content-type", "application/json"), *big],
    )  # fmt: skip
    p.c.send_data(sid, json.dumps(CHAT).encode(), end_stream=True, pad_length=17)
    p.pump()
    p.respond_head(sid)
    p.sse(sid, chunk("A"), pad=9)
    p.sse(sid, chunk(finish="stop"), end=True, pad=1)
    raw = b"".join(b for fc, b in p.wire if fc)
    assert b"\x00\x00\x09" in raw or len(raw) > 16384  # a header block past one frame
    # The second request re-uses dynamic-table entries of the first.
    one_stream(p, ["B"])
    out = run(p.wire)
    ops = of(out, StreamOpened)
    assert [o.dialect for o in ops] == ["openai.chat", "openai.chat"]
    assert ("x-big-199", "v" * 200) in ops[0].request_headers
    assert [c.text for c in of(out, ChunkEvent) if c.text] == ["A", "B"]
    assert not of(out, PipelineError)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=30))
def test_arbitrary_splits_give_the_same_result(cuts: list[int]) -> None:
    p = Peers()
    one_stream(p, ["a", "b", "c"])

    def split(data: bytes) -> list[bytes]:
        pieces, i, k = [], 0, 0
        while i < len(data):
            n = cuts[k % len(cuts)]
            pieces.append(data[i : i + n])
            i += n
            k += 1
        return pieces

    out = run(p.wire, split=split)
    assert [c.text for c in of(out, ChunkEvent) if c.text] == ["a", "b", "c"]
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.COMPLETE


def test_rst_stream_truncates_that_stream_only() -> None:
    p = Peers()
    a = p.request(CHAT)
    b = p.request(CHAT)
    p.respond_head(a)
    p.respond_head(b)
    p.sse(a, chunk("x"))
    p.sse(b, chunk("y"))
    p.c.reset_stream(a, error_code=8)  # client cancels a
    p.pump()
    p.sse(b, chunk(finish="stop"), end=True)
    out = run(p.wire)
    states = {c.stream: c for c in of(out, StreamClosed)}
    ops = {o.exchange: o.stream for o in of(out, StreamOpened)}
    assert states[ops[0]].state is StreamState.TRUNCATED
    assert states[ops[1]].state is StreamState.COMPLETE


@pytest.mark.parametrize("whole", [True, False])
def test_reset_after_the_whole_content_length_keeps_the_response(whole: bool) -> None:
    """curl resets a stream with STREAM_CLOSED once it has read the body its
    Content-Length announced (before the server's END_STREAM): that response is
    whole; a reset before the last byte still cuts it (recorded)."""
    p = Peers()
    sid = p.request({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    answer = {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Whole."},
                     "finish_reason": "stop"}],
    }  # fmt: skip
    raw = json.dumps(answer).encode()
    p.s.send_headers(
        sid,
        [(":status", "200"), ("content-type", "application/json"),
         ("content-length", str(len(raw)))],
    )  # fmt: skip
    p.s.send_data(sid, raw if whole else raw[:-1])
    p.pump()
    p.c.reset_stream(sid, error_code=5)  # STREAM_CLOSED
    p.pump()
    out = run(p.wire)
    (closed,) = of(out, StreamClosed)
    if whole:
        assert closed.state is StreamState.COMPLETE, closed.reason
        assert [c.text for c in of(out, ChunkEvent) if c.text] == ["Whole."]
        assert not of(out, PipelineError)
    else:
        assert closed.state is not StreamState.COMPLETE
        assert [e.message for e in of(out, PipelineError)] == ["RST_STREAM STREAM_CLOSED"]


def test_a_content_length_of_non_ascii_digits_is_no_length() -> None:
    """``²`` is a digit to ``str.isdigit`` (latin-1 header bytes) but no number:
    the response is read without a length, nothing raises."""
    import hpack
    from hyperframe.frame import DataFrame, HeadersFrame

    h = H2Conn(1)
    h.data(True, 0.0, PREFACE)
    req = HeadersFrame(1, hpack.Encoder().encode([(":method", "GET"), (":path", "/")]))
    req.flags.add("END_HEADERS")
    req.flags.add("END_STREAM")
    h.data(True, 0.1, req.serialize())
    block = hpack.Encoder().encode([(b":status", b"200"), (b"content-length", b"\xb2")])
    head = HeadersFrame(1, block)
    head.flags.add("END_HEADERS")
    body = DataFrame(1, b"x")
    body.flags.add("END_STREAM")
    evs = h.data(False, 0.2, head.serialize() + body.serialize())
    assert [type(e).__name__ for e in evs] == ["HttpResponse", "HttpBody", "HttpEnd"]


def test_goaway_and_rst_with_error_are_recorded() -> None:
    p = Peers()
    a = p.request(CHAT)
    p.respond_head(a)
    p.s.reset_stream(a, error_code=2)
    p.s.close_connection(error_code=11, additional_data=b"calm down")
    p.pump()
    out = run(p.wire)
    kinds = {e.kind: e.message for e in of(out, PipelineError)}
    assert kinds["h2-rst"] == "RST_STREAM INTERNAL_ERROR"
    assert kinds["h2-goaway"] == "GOAWAY ENHANCE_YOUR_CALM: calm down"
    (closed,) = of(out, StreamClosed)
    assert closed.state is not StreamState.COMPLETE


def test_trailers_come_out_as_trailer_events() -> None:
    p = Peers()
    sid = p.request(CHAT)
    p.respond_head(sid)
    p.sse(sid, chunk("x"))
    p.s.send_headers(sid, [("x-end", "1")], end_stream=True)
    p.pump()
    h = H2Conn(1)
    evs = []
    for fc, data in p.wire:
        evs.extend(h.data(fc, 1.0, data))
    (tr,) = [e for e in evs if isinstance(e, HttpTrailers)]
    assert tr.headers == (("x-end", "1"),) and not tr.from_client
    out = run(p.wire)
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.TRUNCATED  # no finish: ended, but not whole


def test_midstream_start_decodes_what_it_can() -> None:
    """Capture begins after the first exchange: the second request's header block
    refers to dynamic-table entries never seen (recorded error); a later stream whose
    headers are literal or reference entries added since still decodes."""
    p = Peers()
    one_stream(p, ["early"])
    start = len(p.wire)
    one_stream(p, ["second"])
    wire = p.wire[start:]
    flows: list[FlowEvent] = [FlowGap(1, 0.9, True, None, "midstream")]
    out = Pipeline().feed_flows(
        [
            ConnectionOpened(1, 0.5, CLIENT, SERVER, False),
            *[FlowData(1, 1.0 + i / 100, fc, d) for i, (fc, d) in enumerate(wire)],
            ConnectionClosed(1, 3.0, "fin"),
        ]
    )
    del flows
    errs = of(out, PipelineError)
    assert any(e.kind == "hpack" for e in errs), errs
    # The stream is a row with the error, never complete.
    closed = of(out, StreamClosed)
    assert closed and all(c.state is not StreamState.COMPLETE for c in closed)


def test_find_frame_start_after_garbage() -> None:
    p = Peers()
    one_stream(p, ["a"])
    server = b"".join(d for fc, d in p.wire if not fc)
    assert find_frame_start(server) == 0
    assert find_frame_start(b"\xff\xfe" + server) == 2
    assert PREFACE.startswith(b"PRI")


def test_garbage_after_preface_is_an_error_not_a_crash() -> None:
    p = Pipeline()
    out = p.feed_flows(
        [
            ConnectionOpened(1, 0.5, CLIENT, SERVER, True),
            FlowData(1, 1.0, True, PREFACE + b"\x00\x00\x05\x01\x05\x00\x00\x00\x01\xff\xff\xff"),
            FlowData(1, 1.1, True, b"\xff\xff"),
            ConnectionClosed(1, 2.0, "fin"),
        ]
    )
    assert any(isinstance(e, PipelineError) for e in out)
    assert isinstance(out[-1], ConnectionClosed)


def upgrade_wire() -> Wire:
    """``Upgrade: h2c`` between real h2 endpoints: GET /health becomes stream 1,
    then a chat stream on stream 3."""
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    s = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    settings_header = c.initiate_upgrade_connection()
    wire: Wire = [
        (
            True,
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: " + settings_header + b"\r\n\r\n",
        )
    ]
    s.initiate_upgrade_connection(settings_header)
    s.send_headers(1, [(":status", "200"), ("content-type", "application/json")])
    s.send_data(1, b'{"ok":true}', end_stream=True)
    wire.append(
        (False, b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
         + s.data_to_send())
    )  # fmt: skip
    p = Peers.__new__(Peers)
    p.c, p.s, p.wire = c, s, wire
    cb = c.data_to_send()
    p.wire.append((True, cb))
    s.receive_data(cb)
    c.receive_data(wire[1][1].split(b"\r\n\r\n", 1)[1])
    p.pump()
    one_stream(p, ["up", "graded"])
    return p.wire


def test_upgrade_h2c_continues_exchange_zero_as_stream_one() -> None:
    out = run(upgrade_wire())
    ops = of(out, StreamOpened)
    assert [(o.exchange, o.method, o.path) for o in ops] == [
        (0, "GET", "/health"),
        (1, "POST", "/v1/chat/completions"),
    ]
    assert [c.text for c in of(out, ChunkEvent) if c.text] == ["up", "graded"]
    closed = {c.stream: c for c in of(out, StreamClosed)}
    assert all(c.state is StreamState.COMPLETE for c in closed.values()), closed
    statuses = [r.status for r in of(out, StreamResponse)]
    assert statuses == [200, 200]
    assert not of(out, PipelineError)


# ------------------------------------------------- h2c upgrade on keep-alive

UPGRADE_HEADERS = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
)
UPGRADE_101 = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"


def sse_body(words: Sequence[str]) -> bytes:
    events = [chunk(w) for w in words] + [chunk(finish="stop")]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n"
    )


def h1_request(extra: bytes = b"") -> bytes:
    body = json.dumps(CHAT).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8443\r\n"
        b"Content-Type: application/json\r\n" + extra
        + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


def h1_sse(words: Sequence[str]) -> bytes:
    body = sse_body(words)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    )  # fmt: skip


def upgraded_keepalive(
    before: int, *, preface_first: bool = False, after: int = 1
) -> tuple[Wire, list[tuple[int, str]]]:
    """A keep-alive connection: ``before`` HTTP/1.1 chat streams, then a chat
    request carrying ``Upgrade: h2c`` (answered on HTTP/2 stream 1 by a real h2
    server endpoint), then ``after`` more HTTP/2 chat streams (3, 5, …). The
    client's connection preface goes before the server's 101 (``preface_first``,
    pipelined) or after it. Returns the wire and, per exchange in order, the text
    the client received."""
    wire: Wire = []
    expect: list[tuple[int, str]] = []
    for i in range(before):
        words = [f"one{i}", f"-two{i}"]
        wire += [(True, h1_request()), (False, h1_sse(words))]
        expect.append((i, "".join(words)))
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    s = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    settings_header = c.initiate_upgrade_connection()
    wire.append(
        (True, h1_request(b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                          b"HTTP2-Settings: " + settings_header + b"\r\n"))
    )  # fmt: skip
    preface = c.data_to_send()
    if preface_first:
        wire.append((True, preface))
    s.initiate_upgrade_connection(settings_header)
    s.send_headers(1, [(":status", "200"), ("content-type", "text/event-stream")])
    words = ["up", "-graded"]
    s.send_data(1, sse_body(words), end_stream=True)
    frames = s.data_to_send()
    wire.append((False, UPGRADE_101 + frames))
    expect.append((before, "".join(words)))
    if not preface_first:
        wire.append((True, preface))
    c.receive_data(frames)
    s.receive_data(preface)
    p = Peers.__new__(Peers)
    p.c, p.s, p.wire = c, s, wire
    p.pump()
    for k in range(after):
        words = [f"h2{k}", f"-more{k}"]
        one_stream(p, words)
        expect.append((before + 1 + k, "".join(words)))
    return p.wire, expect


def rows(out: Sequence[StoreEvent]) -> list[tuple[int, str, str, str]]:
    """(exchange, path, state, text) of every stream, in exchange order."""
    text: dict[int, str] = {}
    for ch in of(out, ChunkEvent):
        text[ch.stream] = text.get(ch.stream, "") + (ch.text or "")
    state = {c.stream: c.state.value for c in of(out, StreamClosed)}
    return sorted(
        (o.exchange, o.path, state.get(o.stream, "open"), text.get(o.stream, ""))
        for o in of(out, StreamOpened)
    )


def complete(expect: Sequence[tuple[int, str]]) -> list[tuple[int, str, str, str]]:
    return [(ex, "/v1/chat/completions", "complete", t) for ex, t in expect]


@pytest.mark.parametrize("preface_first", [False, True], ids=["preface-after-101", "preface-first"])
@pytest.mark.parametrize("before", [0, 1, 2], ids=["1st", "2nd", "3rd"])
def test_upgrade_at_any_position_of_a_keepalive_connection(
    before: int, preface_first: bool
) -> None:
    """The request carrying ``Upgrade: h2c`` is stream 1's request (RFC 7540
    §3.2) whichever request of the connection it is: its response is the one on
    stream 1, the HTTP/1.1 exchanges before it keep their rows, later streams
    are the exchanges after it; a preface pipelined before the 101 is held
    until the 101 shows the switch."""
    wire, expect = upgraded_keepalive(before, preface_first=preface_first, after=2)
    out = run(wire)
    assert rows(out) == complete(expect)
    assert not of(out, PipelineError)
    versions = {o.exchange: o for o in of(out, StreamOpened)}
    assert len(versions) == before + 3


def test_preface_in_the_same_segment_as_the_upgrade_request() -> None:
    """The client writes its request and the preface at once (one segment): the
    bytes after the request's end are held like a later segment."""
    wire, expect = upgraded_keepalive(1, preface_first=True, after=1)
    i = next(k for k, (fc, d) in enumerate(wire) if fc and b"Upgrade: h2c" in d)
    assert wire[i + 1][0] and wire[i + 1][1].startswith(PREFACE)
    wire[i : i + 2] = [(True, wire[i][1] + wire[i + 1][1])]
    out = run(wire)
    assert rows(out) == complete(expect)
    assert not of(out, PipelineError)


def test_101_before_the_upgrade_request_is_whole() -> None:
    """The server answers 101 while the request's body is still coming: the body
    is read to its end as HTTP/1.1, the server's frames are decoded after it."""
    wire, expect = upgraded_keepalive(2, after=1)
    i = next(k for k, (fc, d) in enumerate(wire) if fc and b"Upgrade: h2c" in d)
    req = wire[i][1]
    assert not wire[i + 1][0] and wire[i + 1][1].startswith(UPGRADE_101)
    wire[i : i + 2] = [(True, req[:-10]), wire[i + 1], (True, req[-10:])]
    out = run(wire)
    assert rows(out) == complete(expect)
    assert not of(out, PipelineError)


@pytest.mark.parametrize("pipelined", [False, True])
def test_preface_after_http1_requests_switches_once_they_are_answered(pipelined: bool) -> None:
    """A client preface (prior knowledge) after HTTP/1.1 requests on the
    connection (hypercorn switches there): the HTTP/1.1 answers still due are
    read as HTTP/1.1 first; stream 1 is the next exchange."""
    p = Peers()
    one_stream(p, ["s", "1"])
    one_stream(p, ["s", "3"])
    (fc, preface), *h2_rest = p.wire
    assert fc and preface.startswith(PREFACE)
    reqs = [(True, h1_request()), (True, h1_request())]
    resps = [(False, h1_sse(["a"])), (False, h1_sse(["b"]))]
    if pipelined:  # both answers still due when the preface comes
        wire: Wire = [*reqs, (True, preface), *resps, *h2_rest]
    else:
        wire = [reqs[0], resps[0], reqs[1], resps[1], (True, preface), *h2_rest]
    out = run(wire)
    assert rows(out) == complete([(0, "a"), (1, "b"), (2, "s1"), (3, "s3")])
    assert not of(out, PipelineError)


def test_refused_upgrade_with_a_pipelined_preface() -> None:
    """The client pipelines its preface after an ``Upgrade: h2c`` request that
    the server refuses (hypercorn refuses it on a request with a body, then
    takes the preface as prior knowledge after its answer): the answer is
    HTTP/1.1, HTTP/2 follows; the pipelined preface is recorded."""
    p = Peers()
    one_stream(p, ["after"])
    (_, preface), *h2_rest = p.wire
    wire: Wire = [
        (True, h1_request(UPGRADE_HEADERS)),
        (True, preface),
        (False, h1_sse(["re", "fused"])),
        *h2_rest,
    ]
    out = run(wire)
    assert rows(out) == complete([(0, "refused"), (1, "after")])
    (err,) = of(out, PipelineError)
    assert err.kind == "h2c" and "preface" in err.message and err.stream is None


def test_client_bytes_over_the_hold_cap_are_read_as_http1() -> None:
    """No answer to the offer while the client sends on: past the cap the bytes
    are read as HTTP/1.1 (the requests in them are rows), with an error."""
    from sniffer.core.http1 import MAX_UPGRADE_HELD

    up = h1_request(UPGRADE_HEADERS)
    n = MAX_UPGRADE_HELD // len(h1_request()) + 2
    wire: Wire = [(True, up)] + [(True, h1_request()) for _ in range(n)]
    out = run(wire)
    opened = of(out, StreamOpened)
    assert [o.exchange for o in opened] == list(range(n + 1))
    errs = [e for e in of(out, PipelineError) if e.kind == "h2c"]
    assert len(errs) == 1 and "read as HTTP/1.1" in errs[0].message


def test_refused_upgrade_stays_http1() -> None:
    """The server answers the ``Upgrade: h2c`` request with a plain 200: the
    connection stays HTTP/1.1, and the next request on it is HTTP/1.1."""
    up = h1_request(UPGRADE_HEADERS)
    wire: Wire = [
        (True, h1_request()), (False, h1_sse(["a", "b"])),
        (True, up), (False, h1_sse(["c", "d"])),
        (True, h1_request()), (False, h1_sse(["e"])),
    ]  # fmt: skip
    out = run(wire)
    assert rows(out) == complete([(0, "ab"), (1, "cd"), (2, "e")])
    assert not of(out, PipelineError)


def test_request_pipelined_after_a_refused_upgrade_is_recorded() -> None:
    """The client sends its next HTTP/1.1 request before the answer to its
    ``Upgrade: h2c`` request (not allowed: had the server switched, it would
    read it as HTTP/2): held until the server refuses, then parsed as HTTP/1.1,
    and recorded as an error of the connection."""
    up = h1_request(UPGRADE_HEADERS)
    wire: Wire = [(True, up + h1_request()), (False, h1_sse(["c", "d"]) + h1_sse(["e"]))]
    out = run(wire)
    assert rows(out) == complete([(0, "cd"), (1, "e")])
    (err,) = of(out, PipelineError)
    assert err.kind == "h2c" and "pipelined" in err.message and err.stream is None


def test_request_pipelined_after_an_accepted_upgrade_is_an_error() -> None:
    """The client pipelines an HTTP/1.1 request after its ``Upgrade: h2c``
    request and the server switches: those bytes are no HTTP/2 preface. The
    upgraded request still gets its stream-1 response; the error is recorded."""
    wire, expect = upgraded_keepalive(1, after=0)
    i = next(k for k, (fc, d) in enumerate(wire) if fc and b"Upgrade: h2c" in d)
    wire[i] = (True, wire[i][1] + h1_request())
    wire = [(fc, d) for fc, d in wire if not (fc and d.startswith(PREFACE))]
    out = run(wire)
    assert rows(out) == complete(expect)
    kinds = [(e.kind, e.message) for e in of(out, PipelineError)]
    assert any(k == "h2c" and "pipelined" in m for k, m in kinds), kinds


@pytest.mark.parametrize(
    "garbage", [b"\x00\x01garbage that is not HTTP/2 at all", b"GET / HTTP/1.1\r\n\r\n"]
)
def test_bytes_after_101_that_are_no_preface_are_an_error(garbage: bytes) -> None:
    wire, expect = upgraded_keepalive(2, after=0)
    wire = [(fc, garbage if fc and d.startswith(PREFACE) else d) for fc, d in wire]
    out = run(wire)
    assert rows(out) == complete(expect)  # the server's stream-1 answer is whole
    errs = of(out, PipelineError)
    assert [e.kind for e in errs] == ["h2c"], errs
    assert "preface" in errs[0].message


def test_preface_that_never_comes_is_an_error() -> None:
    wire, expect = upgraded_keepalive(1, after=0)
    wire = [(fc, d) for fc, d in wire if not (fc and d.startswith(PREFACE))]
    out = run(wire)
    assert rows(out) == complete(expect)
    errs = of(out, PipelineError)
    assert [e.kind for e in errs] == ["h2c"], errs
    assert "preface" in errs[0].message


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([0, 1, 2]),
    st.booleans(),
    st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=30),
)
def test_upgraded_keepalive_split_anywhere_gives_the_same_rows(
    before: int, preface_first: bool, cuts: list[int]
) -> None:
    wire, expect = upgraded_keepalive(before, preface_first=preface_first, after=1)

    def split(data: bytes) -> list[bytes]:
        pieces, i, k = [], 0, 0
        while i < len(data):
            pieces.append(data[i : i + cuts[k % len(cuts)]])
            i += cuts[k % len(cuts)]
            k += 1
        return pieces

    out = run(wire, split=split)
    assert rows(out) == complete(expect)
    assert not of(out, PipelineError)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.binary(max_size=64)), max_size=20), st.booleans())
def test_random_frames_never_raise(pieces: list[tuple[bool, bytes]], mid: bool) -> None:
    """Random frame headers and bodies (after a real preface, or as a mid-connection
    start): errors are recorded, nothing raises."""
    h = H2Conn(1, midstream=mid)
    if not mid:
        h.data(True, 0.0, PREFACE)
    for i, (fc, body) in enumerate(pieces):
        # a frame header whose length matches the body half of the time
        ftype = body[0] % 11 if body else 0
        sid = (body[1] % 4) if len(body) > 1 else 1
        length = len(body) if i % 2 else (body[2] if len(body) > 2 else 0)
        head = length.to_bytes(3, "big") + bytes([ftype, body[3] if len(body) > 3 else 0])
        h.data(fc, float(i), head + sid.to_bytes(4, "big") + body)
    h.gap(True, 99.0)
    h.close(100.0, "fin")


def test_lost_frame_marks_open_streams_and_recording_goes_on() -> None:
    """A server write lost (exact gap): the streams open then can never be
    complete, but frames after the gap are found again and still recorded."""
    p = Peers()
    a = p.request(CHAT)
    b = p.request(CHAT)
    p.respond_head(a)
    p.respond_head(b)
    p.sse(a, chunk("a1"))
    p.sse(b, chunk("b1"))
    lost_at = len(p.wire)
    p.sse(a, chunk("a2"))  # this write is lost
    p.sse(b, chunk("b2"))
    p.sse(a, chunk(finish="stop"), end=True)
    p.sse(b, chunk(finish="stop"), end=True)
    (fc, lost), *_ = p.wire[lost_at:]
    assert not fc
    flows: list[FlowEvent] = [ConnectionOpened(1, 0.5, CLIENT, SERVER, True)]
    for i, (fc, data) in enumerate(p.wire):
        if i == lost_at:
            flows.append(FlowGap(1, 1.0 + i / 100, False, len(lost), "lost"))
        else:
            flows.append(FlowData(1, 1.0 + i / 100, fc, data))
    flows.append(ConnectionClosed(1, 5.0, "fin"))
    out = Pipeline().feed_flows(flows)
    texts = [c.text for c in of(out, ChunkEvent) if c.text]
    assert texts == ["a1", "b1", "b2"]
    closed = of(out, StreamClosed)
    assert len(closed) == 2 and all(c.state is StreamState.GAP for c in closed)


def test_midstream_with_roles_guessed_wrong_is_reoriented() -> None:
    """No handshake, no preface, and the reassembler's guess of the client is the
    server: the first request's :method shows the roles; rows are oriented right."""
    p = Peers()
    one_stream(p, ["x", "y"])
    wire = list(p.wire)
    fc0, first = wire[0]
    assert fc0 and first.startswith(PREFACE)
    wire[0] = (True, first[len(PREFACE) :])  # capture began just after the preface
    flows: list[FlowEvent] = [ConnectionOpened(1, 0.5, SERVER, CLIENT, False)]  # wrong way
    flows += [FlowData(1, 1.0 + i / 100, not fc, d) for i, (fc, d) in enumerate(wire)]
    flows.append(ConnectionClosed(1, 3.0, "fin"))
    out = Pipeline().feed_flows(flows)
    (opened,) = of(out, ConnectionOpened)
    assert (opened.client, opened.server) == (CLIENT, SERVER)
    (op,) = of(out, StreamOpened)
    assert (op.client, op.server, op.dialect) == (CLIENT, SERVER, "openai.chat")
    assert [c.text for c in of(out, ChunkEvent) if c.text] == ["x", "y"]
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.COMPLETE, closed.reason
