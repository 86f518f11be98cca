"""http1: per-direction parsing of captured flows (heads, framing, bodies), resync."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core import native
from sniffer.core.events import (
    ConnectionClosed,
    ConnectionOpened,
    EndReason,
    FlowAnomaly,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
    HttpAnomaly,
    HttpBody,
    HttpEnd,
    HttpError,
    HttpRequest,
    HttpResponse,
)
from sniffer.core.http1 import HttpOutput, HttpParser
from tests.cores import both_cores

#: every test here runs against the Python parser and the native one
core = both_cores(globals(), HttpParser=lambda: native.NATIVE.HttpParser)

CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 8000)


def opened(conn: int = 1, syn: bool = True) -> ConnectionOpened:
    return ConnectionOpened(conn, 0.0, CLIENT, SERVER, syn)


def run(events: Sequence[FlowEvent], parser: HttpParser | None = None) -> list[HttpOutput]:
    p = parser or HttpParser()
    out: list[HttpOutput] = []
    for ev in events:
        out.extend(p.feed(ev))
    return out


def c2s(data: bytes, ts: float = 1.0, conn: int = 1) -> FlowData:
    return FlowData(conn, ts, True, data)


def s2c(data: bytes, ts: float = 2.0, conn: int = 1) -> FlowData:
    return FlowData(conn, ts, False, data)


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def summary(out: Sequence[HttpOutput]) -> list[tuple[object, ...]]:
    """Non-body events in order, with body bytes joined per (exchange, direction)."""
    rows: list[tuple[object, ...]] = []
    bodies: dict[tuple[int, bool], bytearray] = {}
    for e in out:
        if isinstance(e, HttpBody):
            bodies.setdefault((e.exchange, e.from_client), bytearray()).extend(e.data)
        elif isinstance(e, HttpRequest):
            rows.append(("req", e.exchange, e.method, e.target))
        elif isinstance(e, HttpResponse):
            rows.append(("resp", e.exchange, e.status, e.informational))
        elif isinstance(e, HttpEnd):
            body = bytes(bodies.pop((e.exchange, e.from_client), b""))
            rows.append(("end", e.exchange, e.from_client, e.reason.value, body))
        elif isinstance(e, HttpError):
            rows.append(("error", e.exchange, e.from_client, e.kind))
    return rows


REQ = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def test_keep_alive_exchanges_pair_in_order() -> None:
    out = run(
        [
            opened(),
            c2s(REQ),
            s2c(SSE_HEAD + chunked(b"data: 1\n\n", b"data: 2\n\n")),
            c2s(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            ConnectionClosed(1, 9.0, "fin"),
        ]
    )
    assert summary(out) == [
        ("req", 0, "POST", "/v1/chat/completions"),
        ("end", 0, True, "complete", b"{}"),
        ("resp", 0, 200, False),
        ("end", 0, False, "complete", b"data: 1\n\ndata: 2\n\n"),
        ("req", 1, "GET", "/health"),
        ("end", 1, True, "complete", b""),
        ("resp", 1, 200, False),
        ("end", 1, False, "complete", b"ok"),
    ]
    assert isinstance(out[0], ConnectionOpened)
    assert isinstance(out[-1], ConnectionClosed)


def test_pipelined_requests_and_head_204_304_framing() -> None:
    reqs = (
        b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /d HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    resps = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"  # HEAD: no body despite the length
        b"HTTP/1.1 204 No Content\r\n\r\n"
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    )
    out = run([opened(), c2s(reqs), s2c(resps)])
    resp_rows = [r for r in summary(out) if r[0] in ("resp", "end") and r[2] is not True]
    assert resp_rows == [
        ("resp", 0, 200, False),
        ("end", 0, False, "complete", b""),
        ("resp", 1, 204, False),
        ("end", 1, False, "complete", b""),
        ("resp", 2, 304, False),
        ("end", 2, False, "complete", b""),
        ("resp", 3, 200, False),
        ("end", 3, False, "complete", b"abc"),
    ]


def test_100_continue_and_early_response() -> None:
    out = run(
        [
            opened(),
            c2s(
                b"POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 6\r\n\r\n"
            ),
            s2c(b"HTTP/1.1 100 Continue\r\n\r\n"),
            c2s(b"abc"),
            s2c(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n"),  # before the body ended
            c2s(b"def"),
        ]
    )
    assert summary(out) == [
        ("req", 0, "POST", "/up"),
        ("resp", 0, 100, True),
        ("resp", 0, 413, False),
        ("end", 0, False, "complete", b""),
        ("end", 0, True, "complete", b"abcdef"),
    ]


def test_gzip_and_raw_deflate_bodies_are_decoded_incrementally() -> None:
    text = b"data: hello\n\n" * 50
    gz = gzip.compress(text)
    raw = zlib.compressobj(wbits=-15)
    deflated = raw.compress(text) + raw.flush()
    out = run(
        [
            opened(),
            c2s(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"),
            *[
                s2c(b"%x\r\n%s\r\n" % (len(gz[i : i + 7]), gz[i : i + 7]))
                for i in range(0, len(gz), 7)
            ],
            s2c(b"0\r\n\r\n"),
            s2c(
                b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s"
                % (len(deflated), deflated)
            ),
        ]
    )
    ends = [r for r in summary(out) if r[0] == "end" and r[2] is False]
    assert ends == [("end", 0, False, "complete", text), ("end", 1, False, "complete", text)]


def test_corrupt_gzip_is_a_decode_error_not_a_crash() -> None:
    out = run(
        [
            opened(),
            c2s(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nnotgz"),
        ]
    )
    rows = summary(out)
    assert ("error", 0, False, "decode") in rows
    assert ("end", 0, False, "error", b"") in rows


def test_body_delimited_by_close_ends_at_fin_and_cut_body_is_eof() -> None:
    out = run(
        [
            opened(),
            c2s(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: x\n\n"),
            FlowEnd(1, 3.0, False, "fin"),
        ]
    )
    assert ("end", 0, False, "complete", b"data: x\n\n") in summary(out)

    out = run(
        [
            opened(),
            c2s(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"),
            FlowEnd(1, 3.0, False, "fin"),
        ]
    )
    assert ("end", 0, False, "eof", b"partial") in summary(out)


def test_gap_inside_a_response_ends_it_and_the_next_response_pairs_with_its_request() -> None:
    out = run(
        [
            opened(),
            c2s(REQ),
            s2c(SSE_HEAD + b"9\r\ndata: 1\n\n\r\n"),
            FlowGap(1, 3.0, False, 120, "lost"),
            s2c(b"ta: 9\n\n\r\n0\r\n\r\n"),  # the tail of the cut response
            c2s(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        ]
    )
    rows = summary(out)
    assert ("end", 0, False, "gap", b"data: 1\n\n") in rows
    assert ("resp", 1, 200, False) in rows
    assert ("end", 1, False, "complete", b"ok") in rows
    assert not [r for r in rows if r[0] == "error"]


def test_a_whole_lost_response_does_not_shift_the_pairing() -> None:
    # Request 0's answer is lost entirely; the client's next request shows it (ACK),
    # so the gap comes at a message boundary of the response direction.
    out = run(
        [
            opened(),
            c2s(b"GET /0 HTTP/1.1\r\nHost: x\r\n\r\n"),
            FlowGap(1, 2.0, False, 40, "lost"),
            c2s(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\n1"),
        ]
    )
    rows = summary(out)
    assert ("end", 0, False, "gap", b"") in rows
    assert ("resp", 1, 201, False) in rows
    assert ("end", 1, False, "complete", b"1") in rows


def test_midstream_start_hunts_for_the_next_message() -> None:
    out = run(
        [
            opened(syn=False),
            FlowGap(1, 1.0, True, None, "midstream"),
            FlowGap(1, 1.0, False, None, "midstream"),
            s2c(b"ody of an exchange we never saw\r\n0\r\n\r\n"),
            c2s(b"GET /seen HTTP/1.1\r\nHost: x\r\n\r\n"),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nseen"),
        ]
    )
    rows = summary(out)
    assert rows == [
        ("req", 0, "GET", "/seen"),
        ("end", 0, True, "complete", b""),
        ("resp", 0, 200, False),
        ("end", 0, False, "complete", b"seen"),
    ]


def test_roles_are_swapped_when_the_guess_was_wrong() -> None:
    wrong = ConnectionOpened(1, 0.0, SERVER, CLIENT, False)  # guessed the other way round
    out = run(
        [
            wrong,
            FlowData(1, 1.0, False, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"),
            FlowData(1, 2.0, True, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        ]
    )
    assert isinstance(out[0], ConnectionOpened)
    assert out[0].client == CLIENT and out[0].server == SERVER
    assert summary(out)[:3] == [
        ("req", 0, "GET", "/x"),
        ("end", 0, True, "complete", b""),
        ("resp", 0, 200, False),
    ]


def test_non_http_bytes_are_an_error_and_other_connections_go_on() -> None:
    p = HttpParser()
    out = run(
        [
            opened(1),
            opened(2),
            c2s(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(200)), conn=1),
            c2s(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", conn=2),
            s2c(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", conn=2),
        ],
        p,
    )
    errors = [e for e in out if isinstance(e, HttpError)]
    assert [(e.conn, e.kind) for e in errors] == [(1, "not-http")]
    assert any(isinstance(e, HttpEnd) and e.conn == 2 and not e.from_client for e in out)
    assert p.stats.errors == 1


def test_malformed_framing_is_an_error_on_that_exchange_then_resync() -> None:
    out = run(
        [
            opened(),
            c2s(
                b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
                b"0\r\n\r\nGET /after HTTP/1.1\r\nHost: t\r\n\r\n"
            ),
        ]
    )
    rows = summary(out)
    assert rows[:3] == [
        ("req", 0, "POST", "/"),
        ("error", 0, True, "framing"),
        ("end", 0, True, "error", b""),
    ]
    assert ("req", 1, "GET", "/after") in rows


def test_content_length_beyond_range_is_framing_error() -> None:
    out = run(
        [
            opened(),
            c2s(
                b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 18446744073709551615\r\n\r\n"
                b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
            ),
        ]
    )
    rows = summary(out)
    assert ("error", 0, True, "framing") in rows
    assert ("req", 1, "GET", "/smuggled") in rows


def test_kernel_drop_passes_through_without_breaking_framing() -> None:
    out = run(
        [
            opened(),
            c2s(REQ),
            s2c(SSE_HEAD + chunked(b"data: 1\n\n")[:-5]),
            FlowGap(1, 3.0, False, None, "kernel-drop"),
            s2c(b"0\r\n\r\n"),
        ]
    )
    assert any(isinstance(e, FlowGap) for e in out)
    assert ("end", 0, False, "complete", b"data: 1\n\n") in summary(out)


def test_unanswered_requests_end_at_close() -> None:
    out = run([opened(), c2s(REQ), ConnectionClosed(1, 5.0, "rst")])
    rows = summary(out)
    assert rows[-1] == ("end", 0, False, "rst", b"") or rows[-1] == ("end", 0, False, "eof", b"")


CONVERSATION: list[tuple[bool, bytes]] = [
    (True, REQ),
    (False, SSE_HEAD + chunked(*[b'data: {"i": %d}\n\n' % i for i in range(20)])),
    (True, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"),
    (False, b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"data":[]}'),
    (True, b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n"),
    (False, b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"),
]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_segmentation_gives_the_same_messages(data: st.DataObject) -> None:
    """The same bytes, cut at random offsets (direction order kept), parse the same."""
    whole = summary(run([opened()] + [FlowData(1, 1.0, d, b) for d, b in CONVERSATION]))
    events: list[FlowEvent] = [opened()]
    for from_client, payload in CONVERSATION:
        cuts = sorted(
            data.draw(st.lists(st.integers(1, len(payload) - 1), max_size=8, unique=True))
        )
        for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True):
            events.append(FlowData(1, 1.0, from_client, payload[a:b]))
    assert summary(run(events)) == whole
    assert [r[3] for r in whole if r[0] == "end"] == [EndReason.COMPLETE.value] * 6


# ------------------------------------------------------------ TCP anomalies


def _touched(p: HttpParser, from_client: bool, conn: int = 1) -> int | None:
    """The exchange an overlap mismatch on this direction is attributed to now."""
    (a,) = p.feed(FlowAnomaly(conn, 9.0, from_client, "overlap-mismatch", "d", 10, 4))
    assert isinstance(a, HttpAnomaly)
    assert (a.conn, a.ts, a.from_client, a.kind, a.detail, a.offset, a.length) == (
        conn,
        9.0,
        from_client,
        "overlap-mismatch",
        "d",
        10,
        4,
    )
    return a.exchange


def test_a_tcp_anomaly_names_the_exchange_whose_bytes_it_touched() -> None:
    """The rule: the message being read on that direction (a request head not
    yet complete: the exchange it will be), else the last one that ended there,
    else the next one."""
    p = HttpParser()
    run([opened()], p)
    assert _touched(p, True) == 0 and _touched(p, False) is None  # nothing read, nothing asked
    run([c2s(REQ[:20])], p)
    assert _touched(p, True) == 0  # a head being read: the exchange it will be
    run([c2s(REQ[20:])], p)
    assert _touched(p, True) == 0  # between messages: the last one
    assert _touched(p, False) == 0  # the answer to the oldest pending request
    run([s2c(SSE_HEAD + b"5\r\nhello\r\n")], p)
    assert _touched(p, False) == 0  # a response being read
    run([c2s(REQ), s2c(b"0\r\n\r\n")], p)
    assert _touched(p, True) == 1 and _touched(p, False) == 0  # last ended on each side
    run([s2c(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")], p)
    assert _touched(p, False) == 1
    run([c2s(b"GET /x HTTP/1.1\r\n")], p)
    assert _touched(p, True) == 2 and _touched(p, False) == 1


def test_a_tcp_anomaly_is_oriented_as_the_roles_settled_and_h2_names_no_exchange() -> None:
    p = HttpParser()
    # no handshake: the reassembler guessed the roles the wrong way round
    run([opened(syn=False), s2c(REQ)], p)
    (a,) = p.feed(FlowAnomaly(1, 9.0, False, "overlap-mismatch"))
    assert isinstance(a, HttpAnomaly) and a.from_client and a.exchange == 0
    h2 = HttpParser()
    run([opened(2), c2s(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", conn=2)], h2)
    assert _touched(h2, True, conn=2) is None  # frames interleave the exchanges
    assert _touched(HttpParser(), True, conn=7) is None  # a connection never seen


# Chunk extensions (RFC 9112 §7.1.1: ``chunk-size *( ";" ext-name [ "=" ext-val ] )``,
# ext-val a token or a quoted string, which may hold ";"), on data chunks and on
# the last chunk, with trailers after it. A decoder without the extension rule
# turns every such body into an error.
EXT_BODY = [b'data: {"a": 1}\n\n', b'data: {"b": 22}\n\n', b"data: [DONE]\n\n"]
EXT_CHUNKED = (
    b"%x;foo=bar\r\n%s\r\n" % (len(EXT_BODY[0]), EXT_BODY[0])
    + b'%x;foo="q;x";n=1 \r\n%s\r\n' % (len(EXT_BODY[1]), EXT_BODY[1])
    + b"%x\r\n%s\r\n" % (len(EXT_BODY[2]), EXT_BODY[2])
    + b'0;final="yes;really"\r\nx-checksum: abc\r\nx-other: 1\r\n\r\n'
)
EXT_CONVERSATION: list[tuple[bool, bytes]] = [
    (True, REQ),
    (False, SSE_HEAD + EXT_CHUNKED),
    # the next exchange on the keep-alive connection: the decoder ended where the body did
    (True, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"),
    (False, SSE_HEAD + b"1a;foo=bar\r\n" + b"data: after extensions!!\n\n\r\n" + b"0\r\n\r\n"),
]
EXT_EXPECTED = [
    ("req", 0, "POST", "/v1/chat/completions"),
    ("end", 0, True, "complete", b"{}"),
    ("resp", 0, 200, False),
    ("end", 0, False, "complete", b"".join(EXT_BODY)),
    ("req", 1, "GET", "/v1/models"),
    ("end", 1, True, "complete", b""),
    ("resp", 1, 200, False),
    ("end", 1, False, "complete", b"data: after extensions!!\n\n"),
]


def test_chunk_extensions_and_trailers_are_skipped() -> None:
    assert len(b"data: after extensions!!\n\n") == 0x1A
    whole = run([opened()] + [FlowData(1, 1.0, d, b) for d, b in EXT_CONVERSATION])
    assert summary(whole) == EXT_EXPECTED
    assert not [e for e in whole if isinstance(e, HttpError)]
    # one chunk per read (the decoder's fast path), extension included
    per_chunk = [opened(), c2s(REQ), s2c(SSE_HEAD)]
    rest = EXT_CHUNKED
    while rest:
        cut = rest.find(b"\r\n", rest.find(b"\r\n") + 2) + 2 if not rest.startswith(b"0") else 0
        piece, rest = (rest[:cut], rest[cut:]) if cut else (rest, b"")
        per_chunk.append(s2c(piece))
    assert summary(run(per_chunk)) == EXT_EXPECTED[:4]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_chunk_extensions_at_any_segmentation(data: st.DataObject) -> None:
    events: list[FlowEvent] = [opened()]
    for from_client, payload in EXT_CONVERSATION:
        cuts = sorted(
            data.draw(st.lists(st.integers(1, len(payload) - 1), max_size=8, unique=True))
        )
        for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True):
            events.append(FlowData(1, 1.0, from_client, payload[a:b]))
    assert summary(run(events)) == EXT_EXPECTED
