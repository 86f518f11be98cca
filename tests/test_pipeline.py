"""The composed pipeline: bad input never raises, and every stream is closed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import ACK, FIN, PSH, RST, SYN, Segment, StreamClosed, StreamOpened
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
