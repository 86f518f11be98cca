"""HTTP/1.1 over reassembled TCP flows, parsed with h11 (sans-IO).

h11 parses one side of a conversation it takes part in; a sniffer sees both
sides and takes part in neither. So each captured direction gets its own h11
``Connection`` in the role that *receives* those bytes: a SERVER-role
connection parses client→server bytes, a CLIENT-role connection parses
server→client bytes. The other half of each h11 state machine is driven with
``send()`` of a synthetic event whose bytes are discarded:

* the response parser is told, before it reads a response, the request it
  answers (method, version, ``Connection``) — HEAD, 1xx, 204/304 framing and
  keep-alive depend on it;
* the request parser is answered with an empty response once it has read a
  whole request, so it can go on to the next (pipelined) request without
  waiting for the server.

Each h11 connection parses exactly one message (plus 1xx heads) and is then
replaced by a fresh one fed with its unconsumed bytes (``trailing_data``).
That keeps both directions independent (pipelining, early responses,
100-continue) and makes recovery simple: after a gap, a mid-stream start or
malformed framing the direction *hunts* for the next request or status line
and starts a fresh parser there. The message that was cut is ended with
``EndReason.GAP`` (or ``ERROR``) — never reported whole.

Responses are paired with requests in order. A response that arrives when no
request is pending is parsed as the answer to an unseen GET and reported with
an ``HttpError(kind="desync")``.
"""

from __future__ import annotations

import re
import zlib
from collections import deque
from dataclasses import dataclass

import h11
from h11._readers import ChunkedReader as _H11_CHUNKED

from .credentials import scrub_error_text
from .events import (
    ConnectionClosed,
    ConnectionOpened,
    EndReason,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
    Headers,
    HttpBody,
    HttpEnd,
    HttpError,
    HttpRequest,
    HttpResponse,
)

HttpOutput = (
    ConnectionOpened
    | ConnectionClosed
    | FlowEnd
    | FlowGap
    | HttpRequest
    | HttpResponse
    | HttpBody
    | HttpEnd
    | HttpError
)

# A request line or a status line at the start of a line. Used to find the next
# message after a gap, a mid-stream start or malformed input.
_REQUEST_START = re.compile(
    rb"(?:^|(?<=\n))[!#$%&'*+.^_`|~0-9A-Za-z-]{1,24} [^\s]{1,8192} HTTP/1\.[01]\r?\n"
)
_RESPONSE_START = re.compile(rb"(?:^|(?<=\n))HTTP/1\.[01] [0-9]{3}[ \r\n]")
# What is left of a request line h11 rejected — HTTP/0.9 ("GET /path"), a broken
# version ("HTTP/1."), a method alone: recorded as an exchange with a framing
# error, so that the server's answer (often a 400) still pairs with it.
_LOOSE_REQUEST_LINE = re.compile(
    rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,24})(?:[ \t]+([^\s]{1,8192}))?"
    rb"(?:[ \t]+HTTP/([0-9.]{0,8}))?[ \t]*\r?\n"
)
_METHOD_PREFIX = re.compile(rb"^[A-Z][A-Z_-]{1,23} ")

#: A Content-Length or chunk size above this is malformed framing (request
#: smuggling tries 2^64-1 and 2^64), not a body we wait for.
MAX_BODY_LENGTH = (1 << 62) - 1

_HUNT_KEEP = 8192  # bytes kept while hunting, so a start line split across segments is found
_DEAD_AFTER = 1 << 20  # hunted this many bytes without finding HTTP: stop looking


@dataclass
class HttpStats:
    requests: int = 0
    responses: int = 0
    errors: int = 0
    gaps: int = 0
    hunted_bytes: int = 0
    desyncs: int = 0
    dead_connections: int = 0


#: Decompression caps per exchange (``HttpParser`` arguments): decoded bytes at
#: most, and decoded/encoded ratio at most once past ``RATIO_FLOOR`` decoded bytes.
MAX_DECODED_BYTES = 32 << 20
MAX_EXPANSION_RATIO = 100
RATIO_FLOOR = 1 << 20


class DecodeLimit(zlib.error):
    """A body expanded past a decompression cap (recorded as a ``decode`` error)."""


class _BodyDecoder:
    """Incremental Content-Encoding decoder (gzip, x-gzip, deflate with or without
    zlib header), capped: it never produces more than ``max_bytes`` in all, nor
    more than ``max_ratio`` times the encoded bytes seen (after the first
    ``RATIO_FLOOR`` bytes), so a bomb costs at most that much work; past a cap
    ``feed`` raises :class:`DecodeLimit` and decoding of the message stops."""

    __slots__ = (
        "_d",
        "_raw_fallback",
        "_started",
        "coding",
        "max_bytes",
        "max_ratio",
        "n_in",
        "n_out",
    )

    def __init__(
        self,
        coding: str,
        max_bytes: int = MAX_DECODED_BYTES,
        max_ratio: float = MAX_EXPANSION_RATIO,
    ) -> None:
        self.coding = coding
        self.max_bytes = max_bytes
        self.max_ratio = max_ratio
        self.n_in = 0
        self.n_out = 0
        self._started = False
        self._raw_fallback = coding == "deflate"
        if coding in ("gzip", "x-gzip"):
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            self._d = zlib.decompressobj(zlib.MAX_WBITS)

    def _allowed(self) -> int:
        by_ratio = max(RATIO_FLOOR, int(self.n_in * self.max_ratio))
        return min(self.max_bytes, by_ratio) - self.n_out

    def _run(self, data: bytes) -> bytes:
        allowed = self._allowed()
        if allowed <= 0:
            raise self._limit()
        out = self._d.decompress(data, allowed)
        self.n_out += len(out)
        if self._d.unconsumed_tail:
            raise self._limit()
        return out

    def _limit(self) -> DecodeLimit:
        if self.n_out >= self.max_bytes:
            return DecodeLimit(f"decoded body over the cap of {self.max_bytes} bytes")
        return DecodeLimit(
            f"body expands more than {self.max_ratio:g}:1 "
            f"({self.n_in} encoded bytes gave {self.n_out}); decoding stopped"
        )

    def feed(self, data: bytes) -> bytes:
        self.n_in += len(data)
        if not self._started and self._raw_fallback:
            self._started = True
            try:
                return self._run(data)
            except DecodeLimit:
                raise
            except zlib.error:
                # Raw deflate without the zlib header: common in the wild.
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                self.n_out = 0
                return self._run(data)
        self._started = True
        return self._run(data)

    def flush(self) -> bytes:
        try:
            allowed = self._allowed()
            return self._d.flush(allowed) if allowed > 0 else b""
        except zlib.error:
            return b""


def _decoder_for(
    headers: Headers, max_bytes: int = MAX_DECODED_BYTES, max_ratio: float = MAX_EXPANSION_RATIO
) -> tuple[_BodyDecoder | None, str | None]:
    """The body decoder for a message's Content-Encoding, or an error text."""
    codings: list[str] = []
    for name, value in headers:
        if name == "content-encoding":
            codings.extend(c.strip().lower() for c in value.split(",") if c.strip())
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None, None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return _BodyDecoder(codings[0], max_bytes, max_ratio), None
    return None, f"unsupported content-encoding {', '.join(codings)!r}"


def _headers(raw: list[tuple[bytes, bytes]] | h11._headers.Headers) -> Headers:
    return tuple((n.decode("latin-1"), v.decode("latin-1")) for n, v in raw)


_EOM = h11.EndOfMessage()


_CHUNK_HEADER = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\r\n]*)?[ \t]*\r\n")
_MAX_CHUNK_LINE = 4096


class _ChunkError(Exception):
    def __init__(self, message: str, rest: bytes) -> None:
        super().__init__(message)
        self.rest = rest  # the bytes from the malformed spot on


class _ChunkedBody:
    """Chunked transfer coding, decoded like h11's ChunkedReader (same grammar:
    ``hex[;ext]CRLF data CRLF … 0CRLF [trailers] CRLF``) but without h11's
    per-event machinery: this is the hot path of every SSE stream.

    ``feed`` returns the data pieces and, once the last chunk and trailers are
    through, the bytes that follow the message (else ``None``).
    """

    __slots__ = ("buf", "remaining", "state")

    SIZE, DATA, CRLF, TRAILER = range(4)

    def __init__(self) -> None:
        self.buf = b""
        self.remaining = 0
        self.state = self.SIZE

    def feed(self, data: bytes) -> tuple[list[bytes], bytes | None]:
        if self.state == 0 and not self.buf:
            # Fast path: exactly one whole chunk (one SSE event per write).
            m = _CHUNK_HEADER.match(data)
            if m is not None:
                start = m.end()
                stop = start + int(m[1], 16)
                if start < stop == len(data) - 2 and data.endswith(b"\r\n"):
                    return [bytes(data[start:stop])], None
        buf = self.buf + data if self.buf else bytes(data)
        self.buf = b""
        pieces: list[bytes] = []
        pos = 0
        end = len(buf)
        while pos < end:
            state = self.state
            if state == self.DATA:
                take = min(self.remaining, end - pos)
                pieces.append(buf[pos : pos + take])
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.state = self.CRLF
            elif state == self.SIZE:
                m = _CHUNK_HEADER.match(buf, pos)
                if m is None:
                    nl = buf.find(b"\n", pos)
                    if nl < 0 and end - pos < _MAX_CHUNK_LINE:
                        break  # need more bytes
                    raise _ChunkError(f"illegal chunk header: {buf[pos : pos + 40]!r}", buf[pos:])
                size = int(m[1], 16)
                if size > MAX_BODY_LENGTH:
                    raise _ChunkError("chunk size out of range", buf[m.end() :])
                pos = m.end()
                if size == 0:
                    self.state = self.TRAILER
                else:
                    self.remaining = size
                    self.state = self.DATA
            elif state == self.CRLF:
                if end - pos < 2:
                    if buf[pos:] != b"\r"[: end - pos]:
                        raise _ChunkError("malformed chunk footer", buf[pos:])
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise _ChunkError(f"malformed chunk footer: {buf[pos : pos + 2]!r}", buf[pos:])
                pos += 2
                self.state = self.SIZE
            else:  # TRAILER: header lines until an empty line
                if buf.startswith(b"\r\n", pos):
                    return pieces, buf[pos + 2 :]
                stop = buf.find(b"\r\n\r\n", pos)
                if stop >= 0:
                    return pieces, buf[stop + 4 :]
                if end - pos > _MAX_CHUNK_LINE * 16:
                    raise _ChunkError("trailer section too long", buf[pos:])
                break
        self.buf = buf[pos:]
        return pieces, None


class _Pending:
    """A request the response direction has still to answer."""

    __slots__ = ("close", "exchange", "method")

    def __init__(self, exchange: int, method: bytes, close: bool) -> None:
        self.exchange = exchange
        self.method = method
        self.close = close


class _Direction:
    """Parsing state of one direction of one connection."""

    __slots__ = (
        "chunked",
        "decode_failed",
        "decoder",
        "exchange",
        "from_client",
        "hunt",
        "hunt_sol",
        "hunted",
        "in_message",
        "parser",
        "raw",
    )

    def __init__(self, from_client: bool) -> None:
        self.from_client = from_client
        self.parser: h11.Connection | None = None  # None: hunting or waiting
        self.hunt: bytearray | None = None  # not None: looking for a start line
        self.hunted = 0
        self.hunt_sol = True  # the hunt buffer begins at a line start
        self.raw: bytearray | None = None  # bytes of the current message until its head parsed
        self.chunked: _ChunkedBody | None = None  # set while a chunked body is read without h11
        self.exchange = -1  # exchange of the message being parsed
        self.in_message = False  # head seen, end not yet
        self.decoder: _BodyDecoder | None = None
        self.decode_failed = False


class _Conn:
    __slots__ = (
        "closed",
        "dead",
        "dirs",
        "id",
        "next_exchange",
        "opened",
        "pending",
        "roles_known",
        "swapped",
    )

    def __init__(self, opened: ConnectionOpened) -> None:
        self.id = opened.conn
        self.opened: ConnectionOpened | None = opened
        self.roles_known = opened.syn_seen
        self.swapped = False
        self.dirs = (_Direction(False), _Direction(True))  # index by from_client
        self.next_exchange = 0
        self.pending: deque[_Pending] = deque()
        self.dead = False
        self.closed = False


class HttpParser:
    """Turns reassembled flows (``FlowEvent``) into HTTP messages (``HttpEvent``).

    ``feed()`` also passes ``ConnectionOpened``, ``FlowEnd``, ``ConnectionClosed``
    and unattributable ``FlowGap``s (kernel drops) through, with client and
    server swapped when the bytes prove the reassembler's guess wrong (no
    handshake captured).
    """

    def __init__(
        self,
        *,
        max_header_bytes: int = 64 * 1024,
        max_decoded_bytes: int = MAX_DECODED_BYTES,
        max_expansion_ratio: float = MAX_EXPANSION_RATIO,
    ) -> None:
        self._conns: dict[int, _Conn] = {}
        self._max_header = max_header_bytes
        self._max_decoded = max_decoded_bytes
        self._max_ratio = max_expansion_ratio
        self.stats = HttpStats()

    # ------------------------------------------------------------------ public

    def feed(self, ev: FlowEvent) -> list[HttpOutput]:
        out: list[HttpOutput] = []
        t = type(ev)
        if t is FlowData:
            assert isinstance(ev, FlowData)
            c = self._conns.get(ev.conn)
            # No bytes: nothing to parse (and h11 would take b"" for end of file).
            if c is not None and not c.dead and ev.data:
                from_client = ev.from_client != c.swapped
                if not c.roles_known:
                    from_client = self._settle_roles(c, from_client, ev.data, out)
                d = c.dirs[from_client]
                if d.chunked is not None:
                    # Hot path: a streamed body (inlined _data → _chunked_data).
                    self._chunked_data(c, d, ev.ts, ev.data, out)
                else:
                    self._data(c, d, ev.ts, ev.data, out)
        elif t is ConnectionOpened:
            assert isinstance(ev, ConnectionOpened)
            c = _Conn(ev)
            self._conns[ev.conn] = c
            if c.roles_known:
                self._release_opened(c, out)
        elif t is FlowGap:
            assert isinstance(ev, FlowGap)
            c = self._conns.get(ev.conn)
            if c is not None and not c.dead:
                self._gap(c, c.dirs[ev.from_client != c.swapped], ev, out)
        elif t is FlowEnd:
            assert isinstance(ev, FlowEnd)
            c = self._conns.get(ev.conn)
            if c is not None:
                self._release_opened(c, out)
                fc = ev.from_client != c.swapped
                if not c.dead:
                    self._end(c, c.dirs[fc], ev.ts, ev.reason, out)
                out.append(FlowEnd(ev.conn, ev.ts, fc, ev.reason) if c.swapped else ev)
        elif t is ConnectionClosed:
            assert isinstance(ev, ConnectionClosed)
            c = self._conns.pop(ev.conn, None)
            if c is not None:
                self._release_opened(c, out)
                if not c.dead:
                    for d in c.dirs:
                        self._end(c, d, ev.ts, ev.reason, out)
                    for p in c.pending:  # requests never answered
                        out.append(HttpEnd(c.id, p.exchange, ev.ts, False, EndReason.EOF))
            out.append(ev)
        return out

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def abandon(self, conn: int) -> None:
        """Stop parsing a connection (after an internal error): its bytes are ignored
        from now on; its close still passes through."""
        c = self._conns.get(conn)
        if c is not None:
            c.dead = True

    # ----------------------------------------------------------------- roles

    def _release_opened(self, c: _Conn, out: list[HttpOutput]) -> None:
        """Emit the held ConnectionOpened, oriented as the bytes showed."""
        o = c.opened
        if o is not None:
            if c.swapped:
                o = ConnectionOpened(
                    o.conn, o.ts, o.server, o.client, o.syn_seen, o.capture, o.pid, o.comm
                )
            out.append(o)
            c.opened = None
        c.roles_known = True

    def _settle_roles(
        self, c: _Conn, from_client: bool, data: bytes, out: list[HttpOutput]
    ) -> bool:
        """No handshake was seen: check the reassembler's role guess against the bytes."""
        head = data[:32]
        looks_response = head.startswith(b"HTTP/1.")
        looks_request = _METHOD_PREFIX.match(head) is not None
        if (from_client and looks_response) or (not from_client and looks_request):
            c.swapped = not c.swapped
            c.dirs = (c.dirs[1], c.dirs[0])
            c.dirs[0].from_client = False
            c.dirs[1].from_client = True
            from_client = not from_client
        if looks_request or looks_response:
            self._release_opened(c, out)
        return from_client

    # ------------------------------------------------------------------ data

    def _data(self, c: _Conn, d: _Direction, ts: float, data: bytes, out: list[HttpOutput]) -> None:
        if d.chunked is not None:
            self._chunked_data(c, d, ts, data, out)
            return
        if d.parser is None:
            if d.hunt is not None:
                data = self._hunt(c, d, ts, data, out)
                if not data or c.dead:
                    return
            self._start_message(c, d, ts, out)
        parser = d.parser
        assert parser is not None
        if d.raw is not None and len(d.raw) <= self._max_header:
            d.raw += data
        parser.receive_data(data)
        self._pump(c, d, ts, out)

    def _start_message(self, c: _Conn, d: _Direction, ts: float, out: list[HttpOutput]) -> None:
        """A fresh h11 connection for the next message of this direction."""
        d.raw = bytearray()
        if d.from_client:
            d.parser = h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_header)
            return
        if not c.pending:
            # Server bytes with no request to answer. On loopback the request is
            # always captured first; elsewhere this is a desync. Parse them as
            # the answer to an unseen GET.
            ex = c.next_exchange
            c.next_exchange += 1
            c.pending.append(_Pending(ex, b"GET", False))
            self.stats.desyncs += 1
            self.stats.errors += 1
            self._release_opened(c, out)
            out.append(HttpError(c.id, ex, ts, False, "desync", "response without a request"))
        p = c.pending.popleft()
        parser = h11.Connection(h11.CLIENT, max_incomplete_event_size=self._max_header)
        headers = [(b"host", b"sniffed"), (b"content-length", b"0")]
        if p.close:
            headers.append((b"connection", b"close"))
        # h11 only writes HTTP/1.1; an HTTP/1.0 request's "no keep-alive" is
        # carried by Connection: close (p.close is set for it).
        parser.send(h11.Request(method=p.method, target=b"/", headers=headers))
        parser.send(_EOM)
        d.parser = parser
        d.exchange = p.exchange

    def _pump(
        self, c: _Conn, d: _Direction, ts: float, out: list[HttpOutput], at_eof: bool = False
    ) -> None:
        """Take every event h11 can give from this direction's buffered bytes."""
        while True:
            parser = d.parser
            if parser is None:
                return
            try:
                ev = parser.next_event()
            except h11.RemoteProtocolError as exc:
                if at_eof:  # closed mid-message: the caller ends it as EOF
                    return
                if d.in_message:
                    rest = parser.trailing_data[0]
                else:
                    # Rejected head: start again from one byte after its first
                    # byte, so the same bad start line is not taken again.
                    rest = bytes(d.raw or b"") or parser.trailing_data[0]
                    self._malformed(c, d, ts, str(exc), rest, out)
                    rest = rest[1:]
                if d.in_message:
                    self._malformed(c, d, ts, str(exc), rest, out)
                d.hunt = bytearray()
                d.hunt_sol = d.in_message
                if rest and not c.dead:
                    self._data(c, d, ts, rest, out)
                return
            t = type(ev)
            if t is h11.Data:
                data = ev.data  # type: ignore[union-attr]
                if ev.chunk_start and (  # type: ignore[union-attr]
                    getattr(parser._reader, "_bytes_in_chunk", 0) > MAX_BODY_LENGTH
                ):
                    self._overflow(c, d, ts, "chunk size out of range", bytes(data), out)
                    return
                self._body(c, d, ts, data, out)
            elif t is h11.NEED_DATA:
                return
            elif t is h11.Request or t is h11.Response or t is h11.InformationalResponse:
                if t is h11.Request:
                    self._request(c, d, ts, ev, out)  # type: ignore[arg-type]
                else:
                    self._response(c, d, ts, ev, out)  # type: ignore[arg-type]
                if (
                    d.in_message
                    and d.parser is parser
                    and type(getattr(parser, "_reader", None)) is _H11_CHUNKED
                    and not at_eof
                ):
                    # h11 framed the body as chunked: read it ourselves from here.
                    d.chunked = _ChunkedBody()
                    rest = parser.trailing_data[0]
                    if rest:
                        self._chunked_data(c, d, ts, rest, out)
                    return
            elif t is h11.EndOfMessage:
                self._message_end(c, d, ts, EndReason.COMPLETE, out)
                rest = parser.trailing_data[0]
                if not rest or at_eof:
                    return
                self._start_message(c, d, ts, out)
                assert d.parser is not None and d.raw is not None
                d.raw += rest
                d.parser.receive_data(rest)
            elif t is h11.PAUSED:
                # CONNECT / Upgrade: what follows is not HTTP. Stop parsing this connection.
                c.dead = True
                return
            else:  # h11.ConnectionClosed
                return

    def _chunked_data(
        self, c: _Conn, d: _Direction, ts: float, data: bytes, out: list[HttpOutput]
    ) -> None:
        chunked = d.chunked
        assert chunked is not None
        try:
            pieces, after = chunked.feed(data)
        except _ChunkError as exc:
            self._overflow(c, d, ts, str(exc), exc.rest, out)
            return
        if d.decoder is None and not d.decode_failed:
            for piece in pieces:
                out.append(HttpBody(c.id, d.exchange, ts, d.from_client, piece))
        else:
            for piece in pieces:
                self._body(c, d, ts, piece, out)
        if after is not None:
            self._message_end(c, d, ts, EndReason.COMPLETE, out)
            if after:
                self._data(c, d, ts, after, out)

    def _request(
        self, c: _Conn, d: _Direction, ts: float, ev: h11.Request, out: list[HttpOutput]
    ) -> None:
        self._release_opened(c, out)
        ex = c.next_exchange
        c.next_exchange += 1
        d.exchange = ex
        d.in_message = True
        d.raw = None
        headers = _headers(ev.headers)
        close = ev.http_version < b"1.1" or any(
            n == "connection" and "close" in v.lower() for n, v in headers
        )
        c.pending.append(_Pending(ex, ev.method, close))
        self.stats.requests += 1
        out.append(
            HttpRequest(
                c.id,
                ex,
                ts,
                ev.method.decode("latin-1"),
                ev.target.decode("latin-1"),
                ev.http_version.decode("ascii"),
                headers,
            )
        )
        self._set_decoder(c, d, ts, headers, out)
        self._check_length(c, d, ts, headers, out)

    def _check_length(
        self, c: _Conn, d: _Direction, ts: float, headers: Headers, out: list[HttpOutput]
    ) -> None:
        for name, value in headers:
            if name == "content-length" and value.strip().isdigit():
                if int(value) > MAX_BODY_LENGTH:
                    parser = d.parser
                    rest = parser.trailing_data[0] if parser is not None else b""
                    self._overflow(c, d, ts, "Content-Length out of range", rest, out, True)
                return

    def _overflow(
        self,
        c: _Conn,
        d: _Direction,
        ts: float,
        msg: str,
        rest: bytes,
        out: list[HttpOutput],
        at_line_start: bool = False,
    ) -> None:
        """Framing that cannot be honoured: end the message as an error and look
        for the next message in what follows."""
        self._error(c, d, ts, "framing", msg, out)
        d.hunt = bytearray()
        d.hunt_sol = at_line_start
        if rest:
            self._data(c, d, ts, rest, out)

    def _response(
        self,
        c: _Conn,
        d: _Direction,
        ts: float,
        ev: h11.Response | h11.InformationalResponse,
        out: list[HttpOutput],
    ) -> None:
        self._release_opened(c, out)
        headers = _headers(ev.headers)
        info = type(ev) is h11.InformationalResponse
        d.in_message = not info
        if not info:
            d.raw = None
        self.stats.responses += 1
        out.append(
            HttpResponse(
                c.id,
                d.exchange,
                ts,
                ev.status_code,
                ev.reason.decode("latin-1"),
                ev.http_version.decode("ascii"),
                headers,
                info,
            )
        )
        if not info:
            self._set_decoder(c, d, ts, headers, out)
            self._check_length(c, d, ts, headers, out)

    def _set_decoder(
        self, c: _Conn, d: _Direction, ts: float, headers: Headers, out: list[HttpOutput]
    ) -> None:
        d.decoder, err = _decoder_for(headers, self._max_decoded, self._max_ratio)
        d.decode_failed = err is not None
        if err is not None:
            self.stats.errors += 1
            out.append(HttpError(c.id, d.exchange, ts, d.from_client, "decode", err))

    def _body(self, c: _Conn, d: _Direction, ts: float, data: bytes, out: list[HttpOutput]) -> None:
        if d.decode_failed:
            return
        if d.decoder is not None:
            try:
                data = d.decoder.feed(data)
            except zlib.error as exc:
                d.decode_failed = True
                self.stats.errors += 1
                out.append(
                    HttpError(
                        c.id, d.exchange, ts, d.from_client, "decode", f"{d.decoder.coding}: {exc}"
                    )
                )
                return
            if not data:
                return
        out.append(HttpBody(c.id, d.exchange, ts, d.from_client, data))

    def _message_end(
        self, c: _Conn, d: _Direction, ts: float, reason: EndReason, out: list[HttpOutput]
    ) -> None:
        if d.decoder is not None and not d.decode_failed and reason is EndReason.COMPLETE:
            tail = d.decoder.flush()
            if tail:
                out.append(HttpBody(c.id, d.exchange, ts, d.from_client, tail))
        if d.decode_failed and reason is EndReason.COMPLETE:
            reason = EndReason.ERROR
        out.append(HttpEnd(c.id, d.exchange, ts, d.from_client, reason))
        d.decoder = None
        d.decode_failed = False
        d.in_message = False
        d.parser = None
        d.chunked = None
        d.exchange = -1

    # ------------------------------------------------------------- recovery

    def _error(
        self, c: _Conn, d: _Direction, ts: float, kind: str, msg: str, out: list[HttpOutput]
    ) -> None:
        self._release_opened(c, out)
        self.stats.errors += 1
        ex = d.exchange if d.exchange >= 0 else None
        # Parsers quote the bytes they reject (a header line with its value):
        # never copy them into an error text.
        out.append(HttpError(c.id, ex, ts, d.from_client, kind, scrub_error_text(msg)))
        if d.in_message:
            self._message_end(c, d, ts, EndReason.ERROR, out)
        elif not d.from_client and d.exchange >= 0:
            # The response to this exchange could not be parsed.
            out.append(HttpEnd(c.id, d.exchange, ts, False, EndReason.ERROR))
            d.exchange = -1
        d.parser = None

    def _malformed(
        self, c: _Conn, d: _Direction, ts: float, msg: str, rest: bytes, out: list[HttpOutput]
    ) -> None:
        """h11 rejected the bytes. A rejected request head still makes an exchange
        (the server will answer it, typically 400), recorded with its error."""
        if d.from_client and not d.in_message:
            m = _LOOSE_REQUEST_LINE.match(rest)
            if m is not None:
                raw_version = m[3]
                version = raw_version.decode("latin-1") if raw_version is not None else "0.9"
                # For pairing, anything but a clean 1.1 closes like HTTP/1.0.
                close = raw_version != b"1.1"
                self._release_opened(c, out)
                ex = c.next_exchange
                c.next_exchange += 1
                c.pending.append(_Pending(ex, m[1], close))
                self.stats.requests += 1
                d.exchange = ex
                d.in_message = True
                out.append(
                    HttpRequest(
                        c.id,
                        ex,
                        ts,
                        m[1].decode("latin-1"),
                        (m[2] or b"").decode("latin-1"),
                        version,
                        (),
                    )
                )
                self._error(c, d, ts, "framing", f"bad request line ({msg})", out)
                return
        pattern = _REQUEST_START if d.from_client else _RESPONSE_START
        looks_http = d.in_message or pattern.match(rest) is not None
        self._error(c, d, ts, "framing" if looks_http else "not-http", msg, out)

    def _hunt(
        self, c: _Conn, d: _Direction, ts: float, data: bytes, out: list[HttpOutput]
    ) -> bytes:
        """Look for the next start line; return the bytes from it on (b"" if not found yet)."""
        buf = d.hunt
        assert buf is not None
        pattern = _REQUEST_START if d.from_client else _RESPONSE_START
        if (buf or d.hunt_sol) and pattern.match(data) is not None:
            # Messages usually begin a segment, even when the bytes before
            # them (a lost body's tail) do not end a line.
            self.stats.hunted_bytes += len(buf)
            d.hunt = None
            d.hunted = 0
            d.hunt_sol = True
            return bytes(data)
        buf += data
        m = pattern.search(buf)
        if m is not None and m.start() == 0 and not d.hunt_sol:
            m = pattern.search(buf, 1)
        if m is None:
            self.stats.hunted_bytes += len(data)
            d.hunted += len(data)
            if len(buf) > _HUNT_KEEP:
                del buf[: len(buf) - _HUNT_KEEP]
                d.hunt_sol = False
            if d.hunted > _DEAD_AFTER and c.next_exchange == 0:
                c.dead = True
                self.stats.dead_connections += 1
                self._error(c, d, ts, "not-http", f"no HTTP found in {d.hunted} bytes", out)
            return b""
        self.stats.hunted_bytes += m.start()
        rest = bytes(buf[m.start() :])
        d.hunt = None
        d.hunted = 0
        d.hunt_sol = True
        return rest

    def _gap(self, c: _Conn, d: _Direction, ev: FlowGap, out: list[HttpOutput]) -> None:
        if ev.nbytes is None and ev.reason != "midstream":
            # Capture lost packets somewhere (kernel or queue drops): every open
            # exchange is possibly gapped, but this connection's framing may be
            # intact. The streams stage marks them; parsing goes on.
            if c.swapped:
                ev = FlowGap(ev.conn, ev.ts, d.from_client, None, ev.reason)
            out.append(ev)
            return
        self.stats.gaps += 1
        if d.in_message:
            self._message_end(c, d, ev.ts, EndReason.GAP, out)
        elif not d.from_client:
            ex = d.exchange
            if ex < 0 and c.pending and ev.reason != "midstream":
                # The lost bytes begin at a message boundary, so they begin with
                # the answer to the oldest pending request.
                ex = c.pending.popleft().exchange
            if ex >= 0:
                out.append(HttpEnd(c.id, ex, ev.ts, False, EndReason.GAP))
        d.exchange = -1 if not d.from_client else d.exchange
        d.parser = None
        d.decoder = None
        d.chunked = None
        d.hunt = bytearray()

    def _end(self, c: _Conn, d: _Direction, ts: float, reason: str, out: list[HttpOutput]) -> None:
        """One direction ended (FIN, RST, idle, end of capture)."""
        parser = d.parser
        end = EndReason.RST if reason == "rst" else EndReason.EOF
        if parser is not None and d.in_message:
            if reason == "fin" and d.chunked is None:
                # A body delimited by connection close ends here.
                parser.receive_data(b"")
                self._pump(c, d, ts, out, at_eof=True)
            if d.in_message:
                self._message_end(c, d, ts, end, out)
        elif not d.from_client and d.exchange >= 0:
            # The server stopped before answering this exchange.
            out.append(HttpEnd(c.id, d.exchange, ts, False, end))
            d.exchange = -1
        d.parser = None
        d.chunked = None
        d.hunt = None
