"""The composed pipeline: bad input never raises, and every stream is closed."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import (
    ACK,
    FIN,
    PSH,
    RST,
    SYN,
    ChunkEvent,
    PipelineError,
    Segment,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamFlagged,
    StreamOpened,
)
from sniffer.core.pipeline import Pipeline, PipelineConfig

ENDPOINTS = [("127.0.0.1", 40001), ("127.0.0.1", 40002), ("::1", 40003)]
SERVER = 8000

HTTPISH = [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n",
    b'{"model":"m","stream":true}   ',
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"e\r\ndata: {bad}\n\n\r\n",
    b'2a\r\ndata: {"choices":[{"delta":{"content":"x"}}]}\n\n\r\n',
    b"0\r\n\r\n",
    b"\x16\x03\x01\x00\xff",
    b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nnope",
]

segments = st.builds(
    lambda ep, to_server, seq, flags, payload, junk: (ep, to_server, seq, flags, payload or junk),
    st.sampled_from(ENDPOINTS),
    st.booleans(),
    st.integers(0, 2**32 - 1) | st.integers(0, 4000),
    st.sampled_from([ACK, ACK | PSH, SYN, SYN | ACK, FIN | ACK, RST, 0]),
    st.sampled_from([*HTTPISH, b""]),
    st.binary(max_size=64),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(segments, max_size=40), st.booleans())
def test_arbitrary_segments_never_raise_and_streams_close(
    raw: list[tuple[tuple[str, int], bool, int, int, bytes]], midstream_ports: bool
) -> None:
    pipe = Pipeline(
        PipelineConfig(server_ports=frozenset({SERVER}) if midstream_ports else frozenset())
    )
    out = []
    for i, ((ip, port), to_server, seq, flags, payload) in enumerate(raw):
        server_ip = "::1" if ":" in ip else "127.0.0.1"
        if to_server:
            seg = Segment(float(i), ip, port, server_ip, SERVER, seq, 0, flags, payload)
        else:
            seg = Segment(float(i), server_ip, SERVER, ip, port, seq, 0, flags, payload)
        out.extend(pipe.feed(seg))
    out.extend(pipe.flush(float(len(raw))))
    opened = {e.stream for e in out if isinstance(e, StreamOpened)}
    closed = [e.stream for e in out if isinstance(e, StreamClosed)]
    assert sorted(closed) == sorted(opened)
    assert pipe.internal_errors == 0
    assert pipe.open_streams == 0


# ------------------------------------------------------------ TCP overlaps

CLI = ("127.0.0.1", 40100)
SRV = ("127.0.0.1", SERVER)
ISN = {True: 1000, False: 900_000}


def _chat_exchange(words: list[str]) -> tuple[bytes, bytes]:
    """A chat request and its SSE reply (one HTTP chunk per event)."""
    messages = [{"role": "user", "content": "q"}]
    body = json.dumps({"model": "m", "stream": True, "messages": messages})
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body.encode()
    )
    events = [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    items = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    response = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(i), i) for i in items)
        + b"0\r\n\r\n"
    )
    return request, response


Send = tuple[bool, int, bytes]  # (from client, byte offset of the direction, payload)


def _conversation(
    sends: list[Send], lengths: dict[bool, int], pipe: Pipeline | None = None
) -> list[StoreEvent]:
    """The pipeline's output for a connection whose data segments are ``sends``
    (each ACK acknowledging what the other side sent in order so far), between
    a handshake and a FIN from each side."""
    pipe = pipe or Pipeline()
    prefix = {True: 0, False: 0}
    out: list[StoreEvent] = []
    ts = 1.0

    def seg(fc: bool, off: int, payload: bytes, flags: int = ACK | PSH) -> Segment:
        src, dst = (CLI, SRV) if fc else (SRV, CLI)
        ack = (ISN[not fc] + 1 + prefix[not fc]) & 0xFFFFFFFF
        return Segment(ts, *src, *dst, (ISN[fc] + 1 + off) & 0xFFFFFFFF, ack, flags, payload)

    out += pipe.feed(Segment(ts, *CLI, *SRV, ISN[True], 0, SYN, b""))
    out += pipe.feed(Segment(ts, *SRV, *CLI, ISN[False], ISN[True] + 1, SYN | ACK, b""))
    for fc, off, payload in sends:
        ts += 0.001
        out += pipe.feed(seg(fc, off, payload))
        if off <= prefix[fc]:
            prefix[fc] = max(prefix[fc], off + len(payload))
    for fc in (True, False):
        ts += 0.001
        out += pipe.feed(seg(fc, lengths[fc], b"", FIN | ACK))
    out += pipe.flush(ts + 1)
    return out


def _stored(out: list[StoreEvent]) -> tuple[object, ...]:
    """What the store keeps of the exchange, but for capture times."""
    chunks = [(e.kind, e.choice, e.chunk_index, e.text) for e in out if isinstance(e, ChunkEvent)]
    (c,) = [e for e in out if isinstance(e, StreamClosed)]
    (o,) = [e for e in out if isinstance(e, StreamOpened)]
    # flags found after the close are written over the row's (as the store does)
    flags = [e.flags for e in out if isinstance(e, StreamFlagged)] or [c.flags]
    return (o.request_body, chunks, c.state, c.reason, c.text_len, c.chunk_count, flags[-1])


def _in_order(request: bytes, response: bytes, cuts: list[int]) -> list[Send]:
    """Request then response, each cut into segments at ``cuts`` (offsets)."""
    sends: list[Send] = []
    for fc, data in ((True, request), (False, response)):
        points = sorted({0, len(data), *(c for c in cuts if 0 < c < len(data))})
        sends += [(fc, a, data[a:b]) for a, b in itertools.pairwise(points)]
    return sends


REQUEST, RESPONSE = _chat_exchange(["Hel", "lo", " wor", "ld"])
LENGTHS = {True: len(REQUEST), False: len(RESPONSE)}


def test_overlap_with_different_bytes_flags_the_stream_in_the_request_and_the_response() -> None:
    clean = _conversation(_in_order(REQUEST, RESPONSE, [60, 200]), LENGTHS)
    assert _stored(clean)[-1] == () and not [e for e in clean if isinstance(e, PipelineError)]
    for fc, data in ((True, REQUEST), (False, RESPONSE)):
        sends = _in_order(REQUEST, RESPONSE, [60, 200])
        # after the segment [60, 200) of that direction, its middle again, one byte changed
        at = next(i for i, s in enumerate(sends) if s[0] == fc and s[1] == 60) + 1
        bad = bytearray(data[100:140])
        bad[7] ^= 0x20
        sends.insert(at, (fc, 100, bytes(bad)))
        out = _conversation(sends, LENGTHS)
        got = _stored(out)
        assert got[-1] == (StreamFlag.OVERLAP_MISMATCH,)
        assert got[:-1] == _stored(clean)[:-1]  # the first copy is what is stored
        (err,) = [e for e in out if isinstance(e, PipelineError)]
        side = "client" if fc else "server"
        assert (err.stage, err.kind) == ("reassembly", "overlap-mismatch")
        assert err.message.startswith(f"{side} bytes 100..140 (40 bytes")


def test_overlap_with_the_same_bytes_is_a_plain_retransmission() -> None:
    sends = _in_order(REQUEST, RESPONSE, [60, 200])
    sends.insert(3, (False, 50, RESPONSE[50:250]))  # spans the end of one segment, the next's start
    sends.insert(3, (False, 0, RESPONSE[:60]))  # an exact duplicate
    pipe_out = _conversation(sends, LENGTHS)
    assert _stored(pipe_out) == _stored(_conversation(_in_order(REQUEST, RESPONSE, [60]), LENGTHS))
    assert not [e for e in pipe_out if isinstance(e, PipelineError)]


@st.composite
def _retransmitted(draw: st.DrawFn) -> tuple[list[Send], tuple[bool, int] | None]:
    """The exchange cut at random offsets, with random overlapping retransmissions
    of the same bytes (of bytes already sent, or ahead of them) in between; and
    a place where one copy of a just-sent segment may come back altered."""
    cuts = draw(st.lists(st.integers(1, len(RESPONSE) - 1), max_size=12))
    sends = _in_order(REQUEST, RESPONSE, cuts)
    out: list[Send] = []
    sent = {True: 0, False: 0}
    for fc, off, payload in sends:
        out.append((fc, off, payload))
        sent[fc] = off + len(payload)
        data = REQUEST if fc else RESPONSE
        for _ in range(draw(st.integers(0, 2))):
            a = draw(st.integers(0, len(data) - 1))
            b = draw(st.integers(a + 1, min(len(data), a + 300)))
            out.append((fc, a, data[a:b]))
    where = draw(st.none() | st.integers(0, len(sends) - 1))
    return out, (None if where is None else (sends[where][0], sends[where][1]))


@settings(max_examples=60, deadline=None)
@given(_retransmitted(), st.integers(0, 10_000))
def test_random_overlapping_retransmissions_store_the_same_stream(
    case: tuple[list[Send], tuple[bool, int] | None], pick: int
) -> None:
    """Split the flow anywhere and retransmit any ranges of the same bytes: the
    stored stream is the in-order one, without a flag. Send one segment again
    right after it with one of the bytes it brought first changed: the stream
    is flagged, and stored as the first copy. (A byte a segment did not bring
    first is compared only while still buffered or in the last chunk delivered:
    the reassembler's documented limit, so not altered here.)"""
    sends, where = case
    want = _stored(_conversation(_in_order(REQUEST, RESPONSE, []), LENGTHS))
    out = _conversation(sends, LENGTHS)
    assert _stored(out) == want
    assert not [e for e in out if isinstance(e, PipelineError)]
    if where is None:
        return
    at = next(i for i, s in enumerate(sends) if (s[0], s[1]) == where)
    fc, off, payload = sends[at]
    seen = {o for f, a, p in sends[:at] if f == fc for o in range(a, a + len(p))}
    new = [i for i in range(len(payload)) if off + i not in seen]
    if not new:
        return  # every byte of it came before: nothing of its own to alter
    i = new[pick % len(new)]
    altered = payload[:i] + bytes([payload[i] ^ 0x01]) + payload[i + 1 :]
    out = _conversation([*sends[: at + 1], (fc, off, altered), *sends[at + 1 :]], LENGTHS)
    assert _stored(out) == (*want[:-1], (StreamFlag.OVERLAP_MISMATCH,))
    errs = [e for e in out if isinstance(e, PipelineError)]
    assert [(e.stage, e.kind) for e in errs] == [("reassembly", "overlap-mismatch")]
