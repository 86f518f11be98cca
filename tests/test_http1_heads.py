"""http1 heads and framing: the pure pieces (head parser, RFC 9112 §6.3 rule),
checked by hand and against h11 through its public API.

The sniffer's own head parser must accept and reject what h11 does (it used to
be h11, driven with fake events and private attributes): for random heads,
h11's ``Connection`` — a SERVER reading a request, a CLIENT that really sent the
request a response answers — gives the same fields, the same error text and
the same body bytes as ``read_head`` + ``body_framing`` + the body readers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sniffer.core.events import (
    ConnectionOpened,
    EndReason,
    FlowData,
    FlowEnd,
    FlowEvent,
    HttpBody,
    HttpEnd,
    HttpError,
    HttpResponse,
)
from sniffer.core.http1 import (
    NO_BODY,
    BodyKind,
    Framing,
    HeadError,
    HttpOutput,
    HttpParser,
    RequestHead,
    ResponseHead,
    body_framing,
    parse_request_head,
    parse_response_head,
    read_head,
    take_head_lines,
)

SNIFFER = Path(__file__).resolve().parent.parent / "sniffer"


def opened() -> ConnectionOpened:
    return ConnectionOpened(1, 0.0, ("127.0.0.1", 40000), ("127.0.0.1", 8000), True)


def c2s(data: bytes) -> FlowData:
    return FlowData(1, 1.0, True, data)


def s2c(data: bytes) -> FlowData:
    return FlowData(1, 2.0, False, data)


def run(events: list[FlowEvent], parser: HttpParser | None = None) -> list[HttpOutput]:
    p = parser or HttpParser()
    out: list[HttpOutput] = []
    for ev in events:
        out.extend(p.feed(ev))
    return out


def test_no_module_imports_h11() -> None:
    """Capture does not depend on h11 at all (so not on its private modules)."""
    for path in SNIFFER.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.split(".")[0] == "h11"], (path, names)


# ------------------------------------------------------------------ heads


def lines(raw: bytes) -> list[bytearray]:
    buf = bytearray(raw)
    got = take_head_lines(buf)
    assert got is not None
    return got


def test_head_lines_end_in_lf_or_crlf_and_the_rest_stays() -> None:
    buf = bytearray(b"GET / HTTP/1.1\r\nHost: a\nX: 1\r\n\r\nBODY")
    assert take_head_lines(buf) == [b"GET / HTTP/1.1", b"Host: a", b"X: 1"]
    assert buf == b"BODY"
    incomplete = bytearray(b"GET / HTTP/1.1\r\nHost: a\r\n")
    assert take_head_lines(incomplete) is None and incomplete.startswith(b"GET")


def test_request_head_fields_are_normalised() -> None:
    head = parse_request_head(
        lines(
            b"POST /v1/x?y=1 HTTP/1.1\r\nHost: h\r\nX-Long: a\r\n  b\r\n"
            b"Content-Length: 5, 5\r\ncontent-length: 5\r\nTransfer-Encoding: Chunked\r\n\r\n"
        )
    )
    assert head == RequestHead(
        b"POST",
        b"/v1/x?y=1",
        b"1.1",
        (
            ("host", "h"),
            ("x-long", "a b"),
            ("content-length", "5"),
            ("transfer-encoding", "chunked"),
        ),
    )


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"\r\n", "no request line received"),
        (b"GET /\r\n\r\n", "illegal request line: bytearray(b'GET /')"),
        (b"GET / HTTP/1.1\r\n\r\n", "Missing mandatory Host: header"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "Found multiple Host: headers"),
        (b"GET / HTTP/1.1\r\n x\r\n\r\n", "continuation line at start of headers"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n", "illegal header line: "),
        (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 2\r\n\r\n", "conflicting Content-"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "confl"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"0" * 21 + b"\r\n\r\n", "bad Con"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "Only Tra"),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            "multiple Transfer-Encoding headers",
        ),
    ],
)
def test_malformed_request_heads(raw: bytes, error: str) -> None:
    with pytest.raises(HeadError) as exc:
        read_head(bytearray(raw), True, 1000)
    assert str(exc.value).startswith(error)


def test_http10_request_needs_no_host_and_response_reason_is_optional() -> None:
    assert parse_request_head(lines(b"GET / HTTP/1.0\r\n\r\n")).version == b"1.0"
    head = parse_response_head(lines(b"HTTP/1.1 200\r\n\r\n"))
    assert head == ResponseHead(b"1.1", 200, b"", ())
    assert parse_response_head(lines(b"HTTP/1.1 100 Continue\r\n\r\n")).informational


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"HTTP/1.1 42 X\r\n\r\n", "illegal status line"),
        (b"HTTP/1.1 042 X\r\n\r\n", "InformationalResponse status_code should be in range"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "Received server _SWITCH_UPGRADE"),
        (b"HTTP/2 200\r\n\r\n", "illegal status line"),
    ],
)
def test_malformed_response_heads(raw: bytes, error: str) -> None:
    with pytest.raises(HeadError, match=error):
        read_head(bytearray(raw), False, 1000)


def test_incomplete_head_waits_unless_it_cannot_be_one_or_is_too_long() -> None:
    assert read_head(bytearray(b"GET / HTTP/1.1\r\nHo"), True, 1000) is None
    with pytest.raises(HeadError, match=r"^illegal request line$"):
        read_head(bytearray(b" GET"), True, 1000)
    with pytest.raises(HeadError, match="Receive buffer too long"):
        read_head(bytearray(b"GET /" + b"a" * 2000), True, 1000)


# ---------------------------------------------------------------- framing

REQ = b"GET / HTTP/1.1\r\nHost: a\r\n"


def response(status: int, *fields: bytes) -> ResponseHead:
    return parse_response_head(lines(b"HTTP/1.1 %d X\r\n" % status + b"".join(fields) + b"\r\n"))


def request(*fields: bytes) -> RequestHead:
    return parse_request_head(lines(REQ + b"".join(fields) + b"\r\n"))


CL = b"Content-Length: 7\r\n"
TE = b"Transfer-Encoding: chunked\r\n"


@pytest.mark.parametrize(
    ("head", "method", "framing"),
    [
        # RFC 9112 §6.3, in order
        (response(200, CL), b"HEAD", NO_BODY),  # 1. HEAD
        (response(204, CL), b"GET", NO_BODY),  # 1. 204
        (response(304, TE), b"GET", NO_BODY),  # 1. 304
        (response(100), b"POST", NO_BODY),  # 1. 1xx
        (response(200, CL), b"CONNECT", Framing(BodyKind.TUNNEL)),  # 2. CONNECT 2xx
        (response(407, CL), b"CONNECT", Framing(BodyKind.LENGTH, 7)),  # refused CONNECT
        (response(200, CL, TE), b"GET", Framing(BodyKind.CHUNKED)),  # 3. TE overrides CL
        (response(200, CL), b"GET", Framing(BodyKind.LENGTH, 7)),  # 5.
        (response(200), b"GET", Framing(BodyKind.CLOSE)),  # 7. response: until close
        (request(TE, CL), b"", Framing(BodyKind.CHUNKED)),
        (request(CL), b"", Framing(BodyKind.LENGTH, 7)),
        (request(), b"", NO_BODY),  # 6. request without either
    ],
)
def test_body_framing(head: RequestHead | ResponseHead, method: bytes, framing: Framing) -> None:
    assert body_framing(head, method) == framing


def test_response_framing_follows_the_request_it_answers() -> None:
    """HEAD's answer has no body even with a Content-Length, so the next
    response's head right after it is read as a head."""
    out = run(
        [
            opened(),
            c2s(b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            ),
        ]
    )
    ends = [(e.exchange, e.reason) for e in out if isinstance(e, HttpEnd) and not e.from_client]
    assert ends == [(0, EndReason.COMPLETE), (1, EndReason.COMPLETE)]
    assert [e.data for e in out if isinstance(e, HttpBody)] == [b"ok"]


def test_connect_tunnel_stops_parsing_the_connection() -> None:
    out = run(
        [
            opened(),
            c2s(b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n"),
            s2c(b"HTTP/1.1 200 Connection established\r\n\r\n\x16\x03\x01 tls bytes"),
            c2s(b"\x16\x03\x01 more tls"),
        ]
    )
    assert [e.status for e in out if isinstance(e, HttpResponse)] == [200]
    assert not [e for e in out if isinstance(e, HttpError | HttpBody)]


def test_body_bytes_are_bytes() -> None:
    """Not bytearray (h11 handed those out): ``HttpBody.data`` is typed bytes."""
    out = run(
        [opened(), c2s(REQ + b"\r\n"), s2c(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")]
    )
    assert [type(e.data) for e in out if isinstance(e, HttpBody)] == [bytes]


# ------------------------------------------------- differential against h11

FIELD_LINES = [
    b"Host: a",
    b"Host: b",
    b"host:a",
    b"Content-Length: 3",
    b"Content-Length: 3, 3",
    b"Content-Length: 3,4",
    b"content-length: 0",
    b"Content-Length: 00000000000000000000003",
    b"Content-Length: x",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: CHUNKED ",
    b"Transfer-Encoding: gzip, chunked",
    b"X-A: 1",
    b"X-B:\t two  words\t",
    b"X-C:",
    b" folded",
    b"\tfolded",
    b"bad line",
    b"X-\x00: 1",
    b"X-D: \xff obs-text",
    b"Connection: close",
    b"Upgrade: websocket",
]
REQUEST_LINES = [
    b"GET / HTTP/1.1",
    b"POST /v1/chat HTTP/1.1",
    b"GET / HTTP/1.0",
    b"HEAD /x HTTP/1.1",
    b"GET /",
    b"GET  / HTTP/1.1",
    b"GET / HTTP/1.",
    b"G@T / HTTP/1.1",
    b"GET /\x7f HTTP/1.1",
    b"",
]
STATUS_LINES = [
    b"HTTP/1.1 200 OK",
    b"HTTP/1.1 200",
    b"HTTP/1.1 200 ",
    b"HTTP/1.0 404 Not Found",
    b"HTTP/1.1 204 No Content",
    b"HTTP/1.1 304 Not Modified",
    b"HTTP/1.1 100 Continue",
    b"HTTP/1.1 101 Switching Protocols",
    b"HTTP/1.1 099 Low",
    b"HTTP/1.1 20 OK",
    b"HTTP/2 200",
    b"HTTP/1.1 200 tab\there",
    b"",
]


@st.composite
def heads(draw: st.DrawFn, starts: list[bytes]) -> bytes:
    start = draw(st.sampled_from(starts))
    fields = draw(st.lists(st.sampled_from(FIELD_LINES), max_size=5))
    eol = draw(st.sampled_from([b"\r\n", b"\n"]))
    body = draw(st.sampled_from([b"", b"abc", b"3\r\nabc\r\n0\r\n\r\n", b"abcdef"]))
    return eol.join([start, *fields]) + eol + eol + body


EOF_ERRORS = (
    "peer closed connection without sending complete message body",
    "peer unexpectedly closed connection",
    "can't handle event type ConnectionClosed",
)


def h11_events(conn: h11.Connection, data: bytes, eof: bool) -> tuple[list[object], str | None]:
    """Everything h11 makes of ``data`` (then EOF): (events, error text)."""
    conn.receive_data(data)
    if eof:
        conn.receive_data(b"")
    got: list[object] = []
    try:
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA or ev is h11.PAUSED or isinstance(ev, h11.ConnectionClosed):
                got.append(ev)
                return got, None
            got.append(ev)
            if isinstance(ev, h11.EndOfMessage):
                return got, None
    except h11.RemoteProtocolError as exc:
        return got, str(exc)


def ours(
    data: bytes, from_client: bool, method: bytes, eof: bool
) -> tuple[list[object], str | None]:
    """The same through read_head + body_framing + the parser's body readers:
    heads as (version, status/target, headers), body bytes, then "end"/"tunnel"."""
    buf = bytearray(data)
    got: list[object] = []
    while True:
        try:
            head = read_head(buf, from_client, 64 * 1024)
        except HeadError as exc:
            return got, str(exc)
        if head is None:
            return got, None
        got.append(head)
        if isinstance(head, RequestHead) or not head.informational:
            break
    # the body through the real parser (framing + readers), fed head and body
    parser = HttpParser()
    feed: list[FlowEvent] = [opened()]
    if not from_client:
        feed.append(c2s(method + b" / HTTP/1.1\r\nHost: a\r\n\r\n"))
    feed.append(FlowData(1, 3.0, from_client, data))
    events = run(feed, parser)
    if eof:
        events += parser.feed(FlowEnd(1, 4.0, from_client, "fin"))
    body = b"".join(
        e.data for e in events if isinstance(e, HttpBody) and e.from_client == from_client
    )
    ends = [e.reason for e in events if isinstance(e, HttpEnd) and e.from_client == from_client]
    framing = body_framing(head, method)
    got.append(body)
    if framing.kind is BodyKind.TUNNEL:
        got.append("tunnel")
    elif ends and ends[0] is EndReason.COMPLETE:
        got.append("end")
    return got, None


def h11_view(events: list[object]) -> list[object]:
    out: list[object] = []
    body = b""
    for ev in events:
        if isinstance(ev, h11.Request):
            out.append(
                RequestHead(
                    ev.method,
                    ev.target,
                    ev.http_version,
                    tuple((n.decode("latin-1"), v.decode("latin-1")) for n, v in ev.headers),
                )
            )
        elif isinstance(ev, h11.Response | h11.InformationalResponse):
            out.append(
                ResponseHead(
                    ev.http_version,
                    ev.status_code,
                    ev.reason,
                    tuple((n.decode("latin-1"), v.decode("latin-1")) for n, v in ev.headers),
                )
            )
        elif isinstance(ev, h11.Data):
            body += bytes(ev.data)
    final = [e for e in out if isinstance(e, RequestHead) or not e.informational]
    if final:
        out.append(body)
        if h11.PAUSED in events:
            out.append("tunnel")
        elif any(isinstance(e, h11.EndOfMessage) for e in events):
            out.append("end")
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(heads(REQUEST_LINES), st.booleans())
def test_request_heads_agree_with_h11(data: bytes, eof: bool) -> None:
    events, error = h11_events(h11.Connection(h11.SERVER), data, eof)
    got, our_error = ours(data, True, b"", eof)
    if error is not None and (our_error is None) and eof:
        # h11 reports a message cut by EOF as an error; the parser ends it as EOF
        assert error.startswith(EOF_ERRORS), error
        assert "end" not in got
        return
    assert our_error == error
    if error is None:
        assert got == h11_view(events)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(heads(STATUS_LINES), st.sampled_from([b"GET", b"HEAD", b"CONNECT", b"POST"]), st.booleans())
def test_response_heads_and_framing_agree_with_h11(data: bytes, method: bytes, eof: bool) -> None:
    client = h11.Connection(h11.CLIENT)
    # a real request this client sent: the response's framing depends on it
    client.send(h11.Request(method=method, target="/", headers=[("Host", "a")]))
    client.send(h11.EndOfMessage())
    events, error = h11_events(client, data, eof)
    got, our_error = ours(data, False, method, eof)
    if error is not None and our_error is None and eof:
        # h11 reports a message cut by EOF as an error; the parser ends it as EOF
        assert error.startswith(EOF_ERRORS), error
        assert "end" not in got
        return
    assert our_error == error
    if error is None:
        assert got == h11_view(events)


def test_framing_error_then_chunked_message_in_one_segment_reads_the_body_once() -> None:
    """An out-of-range Content-Length ends its message as a framing error and the
    parser goes on with what follows; a chunked response right behind it in the
    same segment is read once (the h11-based parser handed its first chunk twice)."""
    out = run(
        [
            opened(),
            c2s(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\no"
            ),
            s2c(b"k\r\n0\r\n\r\n"),
        ]
    )
    errors = [(e.exchange, e.kind, e.message) for e in out if isinstance(e, HttpError)]
    assert errors == [(0, "framing", "Content-Length out of range")]
    assert b"".join(e.data for e in out if isinstance(e, HttpBody) and e.exchange == 1) == b"ok"
    ends = [(e.exchange, e.reason) for e in out if isinstance(e, HttpEnd) and not e.from_client]
    assert ends == [(0, EndReason.ERROR), (1, EndReason.COMPLETE)]
