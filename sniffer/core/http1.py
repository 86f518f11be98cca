"""HTTP/1.1 over reassembled TCP flows (sans-IO).

A sniffer sees both sides of a conversation and takes part in neither, so it
cannot drive an HTTP library's connection state machine; it parses each
captured direction on its own, with its own small pieces, as mitmproxy does:

* message heads (start line, field lines) are parsed here (``read_head``),
  with the grammar and the errors h11 applies to what it receives;
* the body of each message is delimited by a pure rule (``body_framing``,
  RFC 9112 §6.3): a response's framing depends on the request it answers
  (HEAD, 1xx, 204/304, CONNECT), which the request direction records;
* bodies are read by a Content-Length counter, the chunked decoder below, or
  until the sender closes; Content-Encoding (gzip, deflate) is undone.

Both directions are independent (pipelining, early responses, 100-continue),
and recovery is simple: after a gap, a mid-stream start or malformed framing
the direction *hunts* for the next request or status line and starts a fresh
message there. The message that was cut is ended with ``EndReason.GAP`` (or
``ERROR``) — never reported whole.

Responses are paired with requests in order. A response that arrives when no
request is pending is parsed as the answer to an unseen GET and reported with
an ``HttpError(kind="desync")``.

HTTP/2 takes the connection over (``core.h2``) on a client preface that opens
it (prior knowledge) or on the ``101`` answering a request that carried
``Upgrade: h2c``, at any position on a keep-alive connection (``Upgrade``
below holds the states of that offer, ``_upgrade`` its transitions): the
client's bytes after that request are held until the server's answer shows
which protocol they are (a preface may be pipelined before the 101), the
upgraded request is HTTP/2 stream 1's, and later streams are the exchanges
after it.

A ``FlowAnomaly`` of the reassembler (TCP bytes that arrived twice with
different content, a segment out of the window, …) becomes an ``HttpAnomaly``
naming the exchange whose bytes it touched, by one rule: on that direction,

1. the message being read (its head or body; a request head not yet complete:
   the exchange it will be), else
2. the last message that ended on that direction (between two messages the
   compared bytes are those just delivered: a retransmission of the message's
   last segment), else
3. the next one (the first request; the answer to the oldest pending request).

Bytes buffered beyond a hole may belong to a later message of a keep-alive
connection than the rule says (the rule does not map byte offsets to
messages). On an HTTP/2 connection, whose frames interleave its exchanges, no
exchange is named (``None``: every exchange open on the connection).
"""

from __future__ import annotations

import enum
import re
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from sniffer.core.coding import (
    MAX_DECODED_BYTES,
    MAX_EXPANSION_RATIO,
)
from sniffer.core.coding import BodyDecoder as _BodyDecoder
from sniffer.core.coding import decoder_for as _decoder_for
from sniffer.core.credentials import scrub_error_text
from sniffer.core.events import (
    ConnectionClosed,
    ConnectionOpened,
    EndReason,
    FlowAnomaly,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
    Headers,
    HttpAnomaly,
    HttpBody,
    HttpEnd,
    HttpError,
    HttpRequest,
    HttpResponse,
    HttpResync,
    HttpTrailers,
)
from sniffer.core.h2 import H2Conn, H2Stats, find_frame_start, looks_like_preface
from sniffer.core.resync import CHUNKED, FramingSync, SyncPoint

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
    | HttpResync
    | HttpTrailers
    | HttpAnomaly
)

# A request line or a status line at the start of a line. Used to find the next
# message after a gap, a mid-stream start or malformed input.
_REQUEST_START = re.compile(
    rb"(?:^|(?<=\n))[!#$%&'*+.^_`|~0-9A-Za-z-]{1,24} [^\s]{1,8192} HTTP/1\.[01]\r?\n"
)
_RESPONSE_START = re.compile(rb"(?:^|(?<=\n))HTTP/1\.[01] [0-9]{3}[ \r\n]")
# What is left of a request line the head parser rejected — HTTP/0.9 ("GET /path"), a broken
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

#: builds a NamedTuple event (FlowData, HttpBody) in one C call on the hot path
_new_tuple = tuple.__new__
_HUNT_KEEP = 8192  # bytes kept while hunting, so a start line split across segments is found
#: bytes held while an ``Upgrade: h2c`` offer waits for its answer (then taken as refused)
MAX_UPGRADE_HELD = 1 << 20
_DEAD_AFTER = 1 << 20  # hunted this many bytes without finding HTTP: stop looking


@dataclass
class HttpStats:
    """Counters of the HTTP/1.1 stage (``replay --json``, the daemon's stats)."""

    requests: int = 0
    responses: int = 0
    errors: int = 0
    gaps: int = 0
    hunted_bytes: int = 0
    desyncs: int = 0
    dead_connections: int = 0
    resyncs: int = 0  # response bodies picked up mid-way (core.resync)
    resync_skipped: int = 0  # bytes dropped before their sync points
    upgrades: int = 0  # connections switched to HTTP/2 by a 101 (Upgrade: h2c)


_CHUNK_HEADER = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\r\n]*)?[ \t]*\r\n")
_MAX_CHUNK_LINE = 4096


class _ChunkError(Exception):
    def __init__(self, message: str, rest: bytes) -> None:
        super().__init__(message)
        self.rest = rest  # the bytes from the malformed spot on


class _ChunkedBody:
    """Chunked transfer coding (RFC 9112 §7.1: ``hex[;ext]CRLF data CRLF …
    0CRLF [trailers] CRLF``; spaces or tabs before a chunk line's CRLF are
    tolerated): the hot path of every SSE stream.

    ``feed`` returns the data pieces and, once the last chunk and trailers are
    through, the bytes that follow the message (else ``None``).
    """

    __slots__ = ("buf", "remaining", "state")

    # The states (``feed`` compares ``state`` with them on every call).
    SIZE: ClassVar[int] = 0
    DATA: ClassVar[int] = 1
    CRLF: ClassVar[int] = 2
    TRAILER: ClassVar[int] = 3

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


# ---------------------------------------------------------------------------
# Message heads (RFC 9112 §2–§5) and body framing (RFC 9112 §6.3): pure.
#
# The grammar and the texts of the errors are those h11 (0.16) applies
# when it receives a message, so that this parser accepts and rejects exactly
# what the h11-based one did (tests/test_http1_heads.py checks it against h11's
# public API).
# ---------------------------------------------------------------------------

_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_FIELD_VCHAR = rb"[^\x00\s]"  # VCHAR or obs-text
_REQUEST_LINE = re.compile(
    rb"(?P<method>" + _TOKEN + rb") (?P<target>[\x21-\x7e]+) HTTP/(?P<version>[0-9]\.[0-9])"
)
_STATUS_LINE = re.compile(
    rb"HTTP/(?P<version>[0-9]\.[0-9]) (?P<status>[0-9]{3})"
    rb"(?: (?P<reason>(?:[ \t]|" + _FIELD_VCHAR + rb")*))?"
)
_FIELD_LINE = re.compile(
    rb"(?P<name>" + _TOKEN + rb"):[ \t]*"
    rb"(?P<value>(?:" + _FIELD_VCHAR + rb"+(?:[ \t]+" + _FIELD_VCHAR + rb"+)*)?)[ \t]*"
)
_OBS_FOLD = re.compile(rb"[ \t]+")
_DIGITS = re.compile(rb"[0-9]+")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_MAX_LENGTH_DIGITS = 20


class HeadError(ValueError):
    """A message head that is not HTTP/1.x (or framing that cannot be honoured).
    Distinct from "need more bytes", which is ``None``."""


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A parsed request head, as bytes off the wire."""

    method: bytes
    target: bytes
    version: bytes  # b"1.1"
    headers: Headers  # lower-case names; Content-Length and Transfer-Encoding normalised


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A parsed response head, as bytes off the wire."""

    version: bytes
    status: int
    reason: bytes
    headers: Headers

    @property
    def informational(self) -> bool:
        return self.status < 200


def take_head_lines(buf: bytearray) -> list[bytearray] | None:
    """Remove one head (start line and field lines, up to the empty line) from
    ``buf`` and return its lines without their line ends; ``None`` if the empty
    line has not arrived yet. Lines end in LF or CRLF."""
    if buf[:1] == b"\n":
        del buf[:1]
        return []
    if buf[:2] == b"\r\n":
        del buf[:2]
        return []
    m = _BLANK_LINE.search(buf)
    if m is None:
        return None
    head = buf[: m.end()]
    del buf[: m.end()]
    lines = head.split(b"\n")[:-2]
    for line in lines:
        if line.endswith(b"\r"):
            del line[-1]
    return lines


def _field_lines(lines: list[bytearray]) -> list[tuple[bytes, bytes]]:
    """Field lines → (name, value), obs-folded continuation lines joined with a space."""
    folded: list[bytearray] = []
    for line in lines:
        m = _OBS_FOLD.match(line)
        if m is None:
            folded.append(line)
        elif not folded:
            raise HeadError("continuation line at start of headers")
        else:
            folded[-1] = folded[-1] + b" " + line[m.end() :]
    fields = []
    for line in folded:
        f = _FIELD_LINE.fullmatch(line)
        if f is None:
            raise HeadError(f"illegal header line: {line!r}")
        fields.append((bytes(f["name"]), bytes(f["value"])))
    return fields


def _normalise(fields: list[tuple[bytes, bytes]]) -> Headers:
    """Lower-case names; one Content-Length value (digits, repeats dropped) and
    one Transfer-Encoding, ``chunked``, or the head is malformed framing
    (RFC 9112 §6.3 items 4 and 5: a recipient cannot frame such a message)."""
    out: list[tuple[str, str]] = []
    length: bytes | None = None
    chunked = False
    for raw_name, value in fields:
        name = raw_name.lower()
        if name == b"content-length":
            values = {v.strip() for v in value.split(b",")}
            if len(values) != 1:
                raise HeadError("conflicting Content-Length headers")
            value = values.pop()
            if _DIGITS.fullmatch(value) is None or len(value) > _MAX_LENGTH_DIGITS:
                raise HeadError("bad Content-Length")
            if length is not None:
                if value != length:
                    raise HeadError("conflicting Content-Length headers")
                continue
            length = value
        elif name == b"transfer-encoding":
            if chunked:
                raise HeadError("multiple Transfer-Encoding headers")
            value = value.lower()
            if value != b"chunked":
                raise HeadError("Only Transfer-Encoding: chunked is supported")
            chunked = True
        out.append((name.decode("latin-1"), value.decode("latin-1")))
    return tuple(out)


def parse_request_head(lines: list[bytearray]) -> RequestHead:
    """A request head from its lines (``take_head_lines``); ``HeadError`` if malformed."""
    if not lines:
        raise HeadError("no request line received")
    m = _REQUEST_LINE.fullmatch(lines[0])
    if m is None:
        raise HeadError(f"illegal request line: {lines[0]!r}")
    headers = _normalise(_field_lines(lines[1:]))
    version = bytes(m["version"])
    hosts = sum(1 for name, _ in headers if name == "host")
    if version == b"1.1" and hosts == 0:
        raise HeadError("Missing mandatory Host: header")
    if hosts > 1:
        raise HeadError("Found multiple Host: headers")
    return RequestHead(bytes(m["method"]), bytes(m["target"]), version, headers)


def parse_response_head(lines: list[bytearray], upgrade_proposed: bool = False) -> ResponseHead:
    """A response head (final or 1xx) from its lines; ``HeadError`` if malformed.

    101 Switching Protocols is refused unless the request proposed an upgrade
    this parser follows (``Upgrade: h2c``, ``upgrade_proposed``), as h11 does."""
    if not lines:
        raise HeadError("no response line received")
    m = _STATUS_LINE.fullmatch(lines[0])
    if m is None:
        raise HeadError(f"illegal status line: {lines[0]!r}")
    headers = _normalise(_field_lines(lines[1:]))
    status = int(m["status"])
    if status < 100:
        raise HeadError(
            f"InformationalResponse status_code should be in range [100, 200), not {status}"
        )
    if status == 101 and not upgrade_proposed:
        raise HeadError("Received server _SWITCH_UPGRADE event without a pending proposal")
    reason = bytes(m["reason"]) if m["reason"] is not None else b""
    return ResponseHead(bytes(m["version"]), status, reason, headers)


def read_head(
    buf: bytearray, from_client: bool, max_size: int, upgrade_proposed: bool = False
) -> RequestHead | ResponseHead | None:
    """Take the next head out of ``buf``: ``None`` until it is complete,
    ``HeadError`` when the bytes cannot be one (or ``max_size`` bytes still
    hold no complete head)."""
    lines = take_head_lines(buf)
    if lines is None:
        if buf and buf[0] < 0x21:  # a start line never begins with a space or control
            raise HeadError("illegal request line")
        if len(buf) > max_size:
            raise HeadError("Receive buffer too long")
        return None
    if from_client:
        return parse_request_head(lines)
    return parse_response_head(lines, upgrade_proposed)


class BodyKind(enum.Enum):
    LENGTH = "length"  # exactly ``Framing.length`` bytes (0: no body)
    CHUNKED = "chunked"  # chunked transfer coding
    CLOSE = "close"  # everything until the sender closes the connection
    TUNNEL = "tunnel"  # CONNECT accepted: what follows is not HTTP


@dataclass(frozen=True, slots=True)
class Framing:
    """How a message body is delimited: its kind and, for ``LENGTH``, its length."""

    kind: BodyKind
    length: int = 0


NO_BODY = Framing(BodyKind.LENGTH, 0)


def body_framing(head: RequestHead | ResponseHead, request_method: bytes = b"") -> Framing:
    """How the body of a message is delimited (RFC 9112 §6.3), from its head and,
    for a response, the method of the request it answers.

    Heads come here validated (``_normalise``): a Transfer-Encoding is exactly
    ``chunked``, a Content-Length is one decimal number; both at once is read
    as chunked (§6.3 item 3: Transfer-Encoding overrides).
    """
    if isinstance(head, ResponseHead):
        # 2. a 2xx to CONNECT turns the connection into a tunnel right after
        # its head (checked first: a 204 to CONNECT is a tunnel too)
        if request_method == b"CONNECT" and 200 <= head.status < 300:
            return Framing(BodyKind.TUNNEL)
        # 1. responses to HEAD, 1xx, 204 and 304 end with their head
        if request_method == b"HEAD" or head.status < 200 or head.status in (204, 304):
            return NO_BODY
    length: int | None = None
    for name, value in head.headers:
        if name == "transfer-encoding":  # 3. (validated: "chunked")
            return Framing(BodyKind.CHUNKED)
        if name == "content-length" and length is None:
            length = int(value)
    if length is not None:  # 5.
        return Framing(BodyKind.LENGTH, length)
    if isinstance(head, RequestHead):  # 6. a request without either has no body
        return NO_BODY
    return Framing(BodyKind.CLOSE)  # 7. a response without either: read until close


class _LengthBody:
    """A Content-Length body (``remaining`` bytes still to come) or, with
    ``remaining`` None, a body delimited by the connection's close."""

    __slots__ = ("remaining",)

    def __init__(self, remaining: int | None) -> None:
        self.remaining = remaining


class Upgrade(enum.Enum):
    """Where a connection's switch to HTTP/2 stands: an ``Upgrade: h2c`` offer
    (RFC 9110 §7.8, RFC 7540 §3.2) or a client preface sent after HTTP/1.1
    requests (prior knowledge). Transitions: ``HttpParser._upgrade``."""

    NONE = "none"  # no switch in flight
    OFFERED = "offered"  # the request carrying the offer is being sent; not answered yet
    AWAITING = "awaiting"  # that request is whole, its answer not seen: client bytes held
    EARLY = "early"  # 101 before the request was whole: server bytes held until it is
    PRIOR = "prior"  # a preface with HTTP/1.1 answers still due: client bytes held till then


class _Step(enum.Enum):
    """What moves an ``Upgrade`` on."""

    OFFER = "offer"  # a request head carrying Upgrade: h2c
    REQUEST_END = "request-end"  # that request ended
    SWITCH = "switch"  # the server answered it 101
    REFUSE = "refuse"  # the server answered it with a final response
    PREFACE = "preface"  # the client began a message with the HTTP/2 preface
    ANSWERED = "answered"  # the server ended an answer and none is due any more
    CLOSE = "close"  # the connection closed with a switch in flight
    OVERFLOW = "overflow"  # more than MAX_UPGRADE_HELD bytes held


class _Pending:
    """A request the response direction has still to answer."""

    __slots__ = ("exchange", "h2c", "method")

    def __init__(self, exchange: int, method: bytes, h2c: bool = False) -> None:
        self.exchange = exchange
        self.method = method
        self.h2c = h2c  # the request proposed ``Upgrade: h2c``


class _Direction:
    """Parsing state of one direction of one connection."""

    __slots__ = (
        "body",
        "chunked",
        "decode_failed",
        "decoder",
        "exchange",
        "from_client",
        "h2c",
        "head",
        "hunt",
        "hunt_sol",
        "hunted",
        "in_message",
        "last_exchange",
        "method",
        "raw",
        "requests",
        "resync",
        "resync_exchange",
        "resync_gaps",
        "resync_lost",
    )

    def __init__(self, from_client: bool) -> None:
        self.from_client = from_client
        self.head: bytearray | None = None  # not None: reading a head (None: hunting or waiting)
        self.method = b""  # response direction: the method of the request being answered
        self.h2c = False  # response direction: that request proposed Upgrade: h2c
        self.requests = from_client  # the head being read is a request (fixed when it began)
        self.hunt: bytearray | None = None  # not None: looking for a start line
        self.hunted = 0
        self.hunt_sol = True  # the hunt buffer begins at a line start
        self.raw: bytearray | None = None  # bytes of the current message until its head parsed
        self.body: _LengthBody | None = (
            None  # set while a Content-Length or until-close body is read
        )
        self.chunked: _ChunkedBody | None = None  # set while a chunked body is read
        self.exchange = -1  # exchange of the message being parsed
        self.last_exchange = -1  # exchange of the last message that ended here
        self.in_message = False  # head seen, end not yet
        self.decoder: _BodyDecoder | None = None
        self.decode_failed = False
        # response direction after a mid-stream start or a gap: looking for the
        # framing of a body already under way (alongside the hunt for a status line)
        self.resync: FramingSync | None = None
        self.resync_exchange = -1  # the cut message being resumed, or -1 (a new one)
        self.resync_lost: int | None = None  # bytes of the gap that cut it
        self.resync_gaps = 0  # gaps those bytes were lost in


class _Conn:
    __slots__ = (
        "closed",
        "dead",
        "dirs",
        "h2",
        "held",
        "held_bytes",
        "id",
        "midstart",
        "next_exchange",
        "opened",
        "pending",
        "roles_known",
        "swapped",
        "upgrade",
        "upgrade_exchange",
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
        self.h2: H2Conn | None = None  # set when the connection speaks HTTP/2
        self.midstart = not opened.syn_seen  # capture began inside the connection
        self.upgrade = Upgrade.NONE
        self.upgrade_exchange = -1  # the exchange of the request carrying the offer
        # flow events of the direction held while the offer waits (AWAITING: the
        # client's, EARLY: the server's), as received (not reoriented)
        self.held: list[FlowEvent] = []
        self.held_bytes = 0


def _resynced_into_body(d: _Direction) -> bool:
    """The hunt ended in a body. A function of its own: at the call site, type
    narrowing says ``hunt`` is a bytearray and no body is under way, which the
    call just changed (mypy would take the test inline for always false and the
    branch for unreachable, and not check it)."""
    return d.hunt is None and (d.chunked is not None or d.body is not None)


def _exchange_touched(c: _Conn, d: _Direction) -> int | None:
    """The exchange a TCP anomaly on direction ``d`` is attributed to (the
    module docstring's rule), or None when there is none."""
    if d.exchange >= 0:  # a message being read (a response: from its first byte)
        return d.exchange
    if d.from_client and d.head is not None:  # a request head not yet complete
        return c.next_exchange
    if d.last_exchange >= 0:
        return d.last_exchange
    if d.from_client:
        return c.next_exchange
    return c.pending[0].exchange if c.pending else None


def _h2_frames(data: bytes) -> bool:
    """Bytes of a connection caught mid-way that read as HTTP/2 frames (not HTTP/1)."""
    if _METHOD_PREFIX.match(data[:32]) or data.startswith(b"HTTP/1."):
        return False
    return find_frame_start(data[:65536], max_offset=0) == 0


def _held_start(held: list[FlowEvent]) -> bytes | None:
    """The first bytes held (up to 64) before any loss, or None if none."""
    start = b""
    for ev in held:
        if type(ev) is not FlowData:
            break
        assert isinstance(ev, FlowData)
        start += ev.data[: 64 - len(start)]
        if len(start) >= 64:
            break
    return start or None


def _upgrades_to_h2c(headers: Headers) -> bool:
    for name, value in headers:
        if name == "upgrade" and "h2c" in (v.strip().lower() for v in value.split(",")):
            return True
    return False


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
        self.h2_stats = H2Stats()

    # ------------------------------------------------------------------ public

    # The direction's state machine in one place (DESIGN: Style), per event: kept whole (C901).
    def feed(self, ev: FlowEvent) -> list[HttpOutput]:  # noqa: C901
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
                if c.h2 is not None:
                    self._h2_data(c, from_client, ev.ts, ev.data, out)
                elif c.upgrade is not Upgrade.NONE and self._hold(c, from_client, ev, out):
                    pass  # an Upgrade: h2c offer waits for its answer
                elif (
                    from_client
                    and not d.in_message
                    and d.body is None
                    and looks_like_preface(bytes(d.head) + ev.data if d.head else ev.data)
                ):
                    # The HTTP/2 connection preface, on any port (prior knowledge).
                    data = bytes(d.head) + ev.data if d.head else ev.data
                    d.head = None
                    d.raw = None
                    self._release_opened(c, out)
                    self._upgrade(c, _Step.PREFACE, ev.ts, out, rest=data)
                elif c.midstart and c.next_exchange == 0 and _h2_frames(ev.data):
                    # Capture began inside an HTTP/2 connection: frames, no preface.
                    # ConnectionOpened waits until a header block shows the roles.
                    c.h2 = H2Conn(c.id, midstream=True, stats=self.h2_stats)
                    self._h2_data(c, from_client, ev.ts, ev.data, out)
                elif d.chunked is not None:
                    # Hot path: a streamed body (inlined _data → _chunked_data).
                    rest = self._chunked_data(c, d, ev.ts, ev.data, out)
                    if rest:
                        self._data(c, d, ev.ts, rest, out)
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
                if c.h2 is not None:
                    fc = ev.from_client != c.swapped
                    if ev.nbytes is not None or ev.reason == "midstream":
                        # Known loss in this direction: find frame boundaries again.
                        out.extend(c.h2.gap(fc, ev.ts))
                    # Which streams' frames were lost is unknown: every open
                    # exchange of the connection is marked (streams), none ended.
                    out.append(FlowGap(ev.conn, ev.ts, fc, ev.nbytes, ev.reason))
                elif c.upgrade is not Upgrade.NONE and self._hold(
                    c, ev.from_client != c.swapped, ev, out
                ):
                    pass
                else:
                    self._gap(c, c.dirs[ev.from_client != c.swapped], ev, out)
        elif t is FlowEnd:
            assert isinstance(ev, FlowEnd)
            c = self._conns.get(ev.conn)
            if c is not None:
                self._release_opened(c, out)
                fc = ev.from_client != c.swapped
                if c.upgrade is not Upgrade.NONE and self._hold(c, fc, ev, out):
                    return out  # passed on when the held events are
                if c.h2 is not None:
                    out.extend(c.h2.end(fc, ev.ts, ev.reason))
                elif not c.dead:
                    self._end(c, c.dirs[fc], ev.ts, ev.reason, out)
                out.append(FlowEnd(ev.conn, ev.ts, fc, ev.reason) if c.swapped else ev)
        elif t is ConnectionClosed:
            assert isinstance(ev, ConnectionClosed)
            c = self._conns.get(ev.conn)
            if c is not None and c.upgrade is Upgrade.PRIOR and not c.dead:
                # The HTTP/1.1 answers still due end here, then the held HTTP/2.
                self._release_opened(c, out)
                for d in c.dirs:
                    self._end(c, d, ev.ts, ev.reason, out)
                for p in c.pending:
                    out.append(HttpEnd(c.id, p.exchange, ev.ts, False, EndReason.EOF))
                c.pending.clear()
            if c is not None and c.upgrade is not Upgrade.NONE:
                self._upgrade(c, _Step.CLOSE, ev.ts, out)
            c = self._conns.pop(ev.conn, None)
            if c is not None:
                self._release_opened(c, out)
                if c.h2 is not None:
                    out.extend(c.h2.close(ev.ts, ev.reason))
                elif not c.dead:
                    for d in c.dirs:
                        self._end(c, d, ev.ts, ev.reason, out)
                    for p in c.pending:  # requests never answered
                        out.append(HttpEnd(c.id, p.exchange, ev.ts, False, EndReason.EOF))
            out.append(ev)
        elif t is FlowAnomaly:
            assert isinstance(ev, FlowAnomaly)
            self._anomaly(ev, out)
        return out

    def _anomaly(self, ev: FlowAnomaly, out: list[HttpOutput]) -> None:
        """A TCP anomaly, handed on with the exchange it touched (the module
        docstring's rule); counted and recorded by the streams stage."""
        c = self._conns.get(ev.conn)
        fc = ev.from_client
        exchange: int | None = None
        if c is not None:
            fc = ev.from_client != c.swapped
            if c.h2 is None and not c.dead:
                exchange = _exchange_touched(c, c.dirs[fc])
        out.append(
            HttpAnomaly(ev.conn, exchange, ev.ts, fc, ev.kind, ev.detail, ev.offset, ev.length)
        )

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def connection_ids(self) -> list[int]:
        return list(self._conns)

    def checkpoint(self, conn: int) -> dict[str, Any] | None:
        """Where a connection stands, for a restarted instance to go on: only a
        connection whose server is sending a chunked (not content-encoded)
        response and whose client is between requests qualifies. ``clean``: the
        chunked decoder stands at a chunk-size line (nothing held)."""
        c = self._conns.get(conn)
        if c is None or c.dead or not c.roles_known or c.pending or c.upgrade is not Upgrade.NONE:
            return None
        srv, cli = c.dirs[0], c.dirs[1]
        if cli.in_message or cli.head or cli.hunt is not None:
            return None
        if not srv.in_message or srv.decoder is not None or srv.decode_failed:
            return None
        chunked = srv.chunked
        resuming = srv.resync is not None and srv.resync_exchange == srv.exchange
        if chunked is None and not resuming:
            return None
        return {
            "exchange": srv.exchange,
            "next_exchange": c.next_exchange,
            "method": srv.method.decode("latin-1"),
            "clean": chunked is not None and chunked.state == _ChunkedBody.SIZE and not chunked.buf,
            # a gap already being resynchronised: its bytes still count
            "gaps": srv.resync_gaps if resuming else 0,
            # (and so do the bytes held while looking for the next chunk boundary)
            "lost": (
                None
                if resuming and srv.resync_lost is None
                else (srv.resync_lost or 0) + srv.resync.held
                if resuming and srv.resync is not None
                else 0
            ),
        }

    def forget(self, conn: int) -> None:
        """Drop a connection without ending anything (it was checkpointed)."""
        self._conns.pop(conn, None)

    def adopt(
        self,
        opened: ConnectionOpened,
        exchange: int,
        next_exchange: int,
        method: str,
        clean: bool,
        lost: int | None = 0,
        gaps: int = 0,
    ) -> None:
        """Take over a connection another instance checkpointed inside a chunked
        response: from a chunk boundary (``clean``) the body goes on as is;
        otherwise from the next chunk-size line that can be proven."""
        c = _Conn(opened)
        c.opened = None  # its row exists: nothing to announce
        c.roles_known = True
        c.next_exchange = next_exchange
        d = c.dirs[0]
        d.in_message = True
        d.exchange = exchange
        d.method = method.encode("latin-1")
        d.raw = None
        if clean:
            d.chunked = _ChunkedBody()
        else:
            d.hunt = bytearray()
            d.resync = FramingSync(chunked_hint=True)
            d.resync_exchange = exchange
            d.resync_lost = lost
            d.resync_gaps = gaps
        self._conns[opened.conn] = c

    def abandon(self, conn: int) -> None:
        """Stop parsing a connection (after an internal error): its bytes are ignored
        from now on; its close still passes through."""
        c = self._conns.get(conn)
        if c is not None:
            c.dead = True

    # ------------------------------------------------------------------ http/2

    def _h2_data(
        self, c: _Conn, from_client: bool, ts: float, data: bytes, out: list[HttpOutput]
    ) -> None:
        h2 = c.h2
        assert h2 is not None
        evs = h2.data(from_client, ts, data)
        if h2.flipped:
            # A header block showed the roles the other way round (no handshake seen).
            h2.flipped = False
            c.swapped = not c.swapped
            c.dirs = (c.dirs[1], c.dirs[0])
            c.dirs[0].from_client = False
            c.dirs[1].from_client = True
        if evs or not h2.orient_pending:
            self._release_opened(c, out)
        out.extend(evs)

    # ------------------------------------------------------------ h2c upgrade

    def _hold(self, c: _Conn, from_client: bool, ev: FlowEvent, out: list[HttpOutput]) -> bool:
        """Keep ``ev`` back if its direction waits on a switch in flight (see
        ``Upgrade``: the server's in EARLY, the client's in AWAITING and PRIOR);
        False if it is to be parsed now."""
        state = c.upgrade
        if state is Upgrade.OFFERED or from_client != (state is not Upgrade.EARLY):
            return False
        c.held.append(ev)
        if type(ev) is FlowData:
            assert isinstance(ev, FlowData)
            c.held_bytes += len(ev.data)
            if c.held_bytes > MAX_UPGRADE_HELD:
                self._upgrade(c, _Step.OVERFLOW, ev.ts, out)
        return True

    def _upgrade(
        self,
        c: _Conn,
        step: _Step,
        ts: float,
        out: list[HttpOutput],
        exchange: int = -1,
        rest: bytes = b"",
    ) -> None:
        """Every transition of a switch to HTTP/2 (``Upgrade``). ``exchange``:
        the request carrying the offer (OFFER) or answered by the 101 (SWITCH);
        ``rest``: the server's bytes after its 101 (SWITCH), the client's from
        its preface on (PREFACE)."""
        state = c.upgrade
        if step is _Step.OFFER:
            c.upgrade = Upgrade.OFFERED
            c.upgrade_exchange = exchange
        elif step is _Step.REQUEST_END:
            if state is Upgrade.OFFERED:
                c.upgrade = Upgrade.AWAITING  # the client's next bytes wait for the answer
            elif state is Upgrade.EARLY:
                self._switch(c, ts, out)
        elif step is _Step.SWITCH:
            if state is Upgrade.OFFERED:
                # 101 before the request was whole: the request is read to its
                # end as HTTP/1.1, the server's frames wait until then.
                c.upgrade = Upgrade.EARLY
                if rest:
                    self._hold(c, False, FlowData(c.id, ts, c.swapped, rest), out)
            else:
                c.upgrade = Upgrade.AWAITING
                c.upgrade_exchange = exchange
                self._switch(c, ts, out)
                if rest:
                    self._h2_data(c, False, ts, rest, out)
        elif step is _Step.REFUSE:
            if state is not Upgrade.NONE:
                c.upgrade = Upgrade.NONE
                self._release_held(c, ts, out, "the server refused the upgrade")
        elif step is _Step.PREFACE:
            # HTTP/2 from the client on; the server goes on answering the
            # HTTP/1.1 requests before it first (stream 1 is the next exchange).
            c.upgrade = Upgrade.PRIOR
            c.upgrade_exchange = c.next_exchange
            self._hold(c, True, FlowData(c.id, ts, not c.swapped, rest), out)
            self._upgrade(c, _Step.ANSWERED, ts, out)
        elif step is _Step.ANSWERED:
            if state is Upgrade.PRIOR and not c.pending and not c.dirs[False].in_message:
                self._switch(c, ts, out)
        elif step is _Step.CLOSE:
            if state in (Upgrade.EARLY, Upgrade.PRIOR):
                self._switch(c, ts, out)
            elif state is not Upgrade.NONE:
                c.upgrade = Upgrade.NONE
                self._release_held(c, ts, out, None)
        elif state is Upgrade.AWAITING:  # OVERFLOW: no answer after all these bytes
            c.upgrade = Upgrade.NONE
            msg = (
                f"over {MAX_UPGRADE_HELD} bytes from the client before the answer to "
                "its Upgrade: h2c request: read as HTTP/1.1"
            )
            self._error_conn(c, ts, True, "h2c", msg, out)
            self._release_held(c, ts, out, None)
        elif state is not Upgrade.NONE:  # OVERFLOW, EARLY or PRIOR: HTTP/2 it is
            msg = (
                f"over {MAX_UPGRADE_HELD} bytes held while the "
                + ("upgraded request was not whole" if state is Upgrade.EARLY else "server")
                + " still answered HTTP/1.1 requests: switched to HTTP/2"
            )
            self._error_conn(c, ts, state is Upgrade.EARLY, "h2c", msg, out)
            self._switch(c, ts, out)

    def _switch(self, c: _Conn, ts: float, out: list[HttpOutput]) -> None:
        """The connection speaks HTTP/2 from here on: after a 101 (the upgraded
        request is stream 1's) or a client preface (stream 1 is the next
        exchange); the held bytes (the client's: its preface, sent before the
        101 or before the last HTTP/1.1 answer; or the server's frames) are
        HTTP/2."""
        state = c.upgrade
        upgraded = state is not Upgrade.PRIOR
        c.upgrade = Upgrade.NONE
        c.h2 = H2Conn(c.id, upgraded=upgraded, base=c.upgrade_exchange, stats=self.h2_stats)
        if upgraded:
            self.stats.upgrades += 1
        held, c.held, c.held_bytes = c.held, [], 0
        first = _held_start(held) if state is Upgrade.AWAITING else None
        if first is not None and not looks_like_preface(first) and _METHOD_PREFIX.match(first):
            msg = (
                "HTTP/1.1 request pipelined after an Upgrade: h2c request; the server "
                "switched to HTTP/2 and reads it as such"
            )
            self._error_conn(c, ts, True, "h2c", msg, out)
            c.h2.no_preface()
        for ev in held:
            out.extend(self.feed(ev))

    def _release_held(
        self, c: _Conn, ts: float, out: list[HttpOutput], refused: str | None
    ) -> None:
        """No switch: the held client bytes are parsed as they come (a request
        pipelined after the offer is recorded: had the server switched, it would
        have read it as HTTP/2)."""
        held, c.held, c.held_bytes = c.held, [], 0
        first = _held_start(held)
        if refused is not None and first:
            what = (
                "HTTP/2 connection preface"
                if looks_like_preface(first)
                else "HTTP/1.1 request pipelined"
                if _METHOD_PREFIX.match(first)
                else "bytes"
            )
            msg = f"{what} sent before the answer to an Upgrade: h2c request ({refused})"
            self._error_conn(c, ts, True, "h2c", msg, out)
        for ev in held:
            out.extend(self.feed(ev))

    def _error_conn(
        self, c: _Conn, ts: float, from_client: bool, kind: str, msg: str, out: list[HttpOutput]
    ) -> None:
        """An error of the connection, not of one exchange."""
        self.stats.errors += 1
        out.append(HttpError(c.id, None, ts, from_client, kind, msg))

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
        """Bytes of one direction, in order: bodies, heads, the next messages."""
        while data and not c.dead:
            if c.h2 is not None:  # a message just ended switched the connection
                self._h2_data(c, d.from_client, ts, data, out)
                return
            if c.upgrade is not Upgrade.NONE and self._hold(
                c, d.from_client, FlowData(c.id, ts, d.from_client != c.swapped, data), out
            ):
                return
            if d.chunked is not None:
                data = self._chunked_data(c, d, ts, data, out)
            elif d.body is not None:
                data = self._length_data(c, d, ts, data, out)
            else:
                if d.head is None:
                    if d.hunt is not None:
                        if d.resync is not None:
                            data = self._hunt_or_resync(c, d, ts, data, out)
                            if not data or c.dead:
                                return
                            if _resynced_into_body(d):
                                continue  # resynchronised: a body goes on
                        else:
                            data = self._hunt(c, d, ts, data, out)
                            if not data or c.dead:
                                return
                    self._start_message(c, d, ts, out)
                assert d.head is not None
                if d.raw is not None and len(d.raw) <= self._max_header:
                    d.raw += data
                d.head += data
                data = self._heads(c, d, ts, out)

    def _start_message(self, c: _Conn, d: _Direction, ts: float, out: list[HttpOutput]) -> None:
        """Begin reading the next message of this direction."""
        d.raw = bytearray()
        d.head = bytearray()
        d.requests = d.from_client
        if d.from_client:
            return
        if not c.pending:
            # Server bytes with no request to answer. On loopback the request is
            # always captured first; elsewhere this is a desync. Parse them as
            # the answer to an unseen GET.
            ex = c.next_exchange
            c.next_exchange += 1
            c.pending.append(_Pending(ex, b"GET"))
            self.stats.desyncs += 1
            self.stats.errors += 1
            self._release_opened(c, out)
            out.append(HttpError(c.id, ex, ts, False, "desync", "response without a request"))
        p = c.pending.popleft()
        d.method = p.method
        d.h2c = p.h2c
        d.exchange = p.exchange

    def _heads(self, c: _Conn, d: _Direction, ts: float, out: list[HttpOutput]) -> bytes:
        """Parse the heads in this direction's buffer (1xx heads, then the final
        one) and set up the body that follows; return the bytes after the head
        (the body's first bytes), or b"" when done with this data."""
        buf = d.head
        while buf is not None:
            try:
                head = read_head(buf, d.requests, self._max_header, d.h2c)
            except HeadError as exc:
                # Rejected head: start again from one byte after its first
                # byte, so the same bad start line is not taken again.
                rest = bytes(d.raw or b"") or bytes(buf)
                self._malformed(c, d, ts, str(exc), rest, out)
                d.hunt = bytearray()
                d.hunt_sol = False
                if len(rest) > 1 and not c.dead:
                    self._data(c, d, ts, rest[1:], out)
                return b""
            if head is None:
                return b""
            if isinstance(head, RequestHead):
                self._request(c, d, ts, head, out)
            else:
                self._response(c, d, ts, head, out)
                if head.status == 101:
                    # ``Upgrade: h2c`` accepted: HTTP/2 from the next byte on; the
                    # request continues as stream 1.
                    rest = bytes(buf)
                    ex = d.exchange
                    d.head = None
                    d.raw = None
                    d.exchange = -1
                    d.h2c = False
                    self._upgrade(c, _Step.SWITCH, ts, out, exchange=ex, rest=rest)
                    return b""
                if d.h2c and d.in_message:  # a final answer: the offer is refused
                    d.h2c = False
                    self._upgrade(c, _Step.REFUSE, ts, out)
            if d.head is not buf:
                return b""  # the head ended its message (framing error); the rest went on
            if not d.in_message:
                continue  # a 1xx head: the final one follows
            framing = body_framing(head, d.method)
            rest = bytes(buf)
            d.head = None
            if framing.kind is BodyKind.CHUNKED:
                d.chunked = _ChunkedBody()
            elif framing.kind is BodyKind.LENGTH:
                if framing.length == 0:
                    self._message_end(c, d, ts, EndReason.COMPLETE, out)
                else:
                    d.body = _LengthBody(framing.length)
            elif framing.kind is BodyKind.CLOSE:
                d.body = _LengthBody(None)
            else:  # TUNNEL: what follows is not HTTP. Stop parsing this connection.
                c.dead = True
                return b""
            return rest
        return b""

    def _length_data(
        self, c: _Conn, d: _Direction, ts: float, data: bytes, out: list[HttpOutput]
    ) -> bytes:
        """Bytes of a Content-Length or until-close body; returns what follows the message."""
        body = d.body
        assert body is not None
        if body.remaining is None:
            self._body(c, d, ts, data, out)
            return b""
        take = min(body.remaining, len(data))
        body.remaining -= take
        self._body(c, d, ts, data[:take] if take < len(data) else data, out)
        if body.remaining:
            return b""
        self._message_end(c, d, ts, EndReason.COMPLETE, out)
        return data[take:]

    def _chunked_data(
        self, c: _Conn, d: _Direction, ts: float, data: bytes, out: list[HttpOutput]
    ) -> bytes:
        """Bytes of a chunked body; returns what follows the message."""
        chunked = d.chunked
        assert chunked is not None
        try:
            pieces, after = chunked.feed(data)
        except _ChunkError as exc:
            self._overflow(c, d, ts, str(exc), exc.rest, out)
            return b""
        if d.decoder is None and not d.decode_failed:
            for piece in pieces:
                out.append(_new_tuple(HttpBody, (c.id, d.exchange, ts, d.from_client, piece)))
        else:
            for piece in pieces:
                self._body(c, d, ts, piece, out)
        if after is None:
            return b""
        self._message_end(c, d, ts, EndReason.COMPLETE, out)
        return after

    def _request(
        self, c: _Conn, d: _Direction, ts: float, ev: RequestHead, out: list[HttpOutput]
    ) -> None:
        self._release_opened(c, out)
        ex = c.next_exchange
        c.next_exchange += 1
        d.exchange = ex
        d.in_message = True
        d.raw = None
        headers = ev.headers
        h2c = _upgrades_to_h2c(headers)
        c.pending.append(_Pending(ex, ev.method, h2c))
        if h2c:
            self._upgrade(c, _Step.OFFER, ts, out, exchange=ex)
        self.stats.requests += 1
        out.append(
            HttpRequest(
                c.id,
                ex,
                ts,
                ev.method.decode("latin-1"),
                ev.target.decode("latin-1"),
                ev.version.decode("ascii"),
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
                    rest = bytes(d.head) if d.head is not None else b""
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
        ev: ResponseHead,
        out: list[HttpOutput],
    ) -> None:
        self._release_opened(c, out)
        headers = ev.headers
        info = ev.informational
        d.in_message = not info
        if not info:
            d.raw = None
        self.stats.responses += 1
        out.append(
            HttpResponse(
                c.id,
                d.exchange,
                ts,
                ev.status,
                ev.reason.decode("latin-1"),
                ev.version.decode("ascii"),
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
        out.append(_new_tuple(HttpBody, (c.id, d.exchange, ts, d.from_client, data)))

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
        ex = d.exchange
        d.last_exchange = d.exchange
        d.decoder = None
        d.decode_failed = False
        d.in_message = False
        d.head = None
        d.body = None
        d.chunked = None
        d.exchange = -1
        if c.upgrade is not Upgrade.NONE:
            if not d.from_client:
                self._upgrade(c, _Step.ANSWERED, ts, out)
            elif ex == c.upgrade_exchange:
                self._upgrade(c, _Step.REQUEST_END, ts, out)

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
            if c.upgrade is not Upgrade.NONE:
                self._upgrade(c, _Step.ANSWERED, ts, out)
        d.head = None

    def _malformed(
        self, c: _Conn, d: _Direction, ts: float, msg: str, rest: bytes, out: list[HttpOutput]
    ) -> None:
        """A head was rejected. A rejected request head still makes an exchange
        (the server will answer it, typically 400), recorded with its error."""
        if d.from_client and not d.in_message:
            m = _LOOSE_REQUEST_LINE.match(rest)
            if m is not None:
                raw_version = m[3]
                version = raw_version.decode("latin-1") if raw_version is not None else "0.9"
                self._release_opened(c, out)
                ex = c.next_exchange
                c.next_exchange += 1
                c.pending.append(_Pending(ex, m[1]))
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
        if ev.nbytes is None and ev.reason not in ("midstream", "restart"):
            # Capture lost packets somewhere (kernel or queue drops): every open
            # exchange is possibly gapped, but this connection's framing may be
            # intact. The streams stage marks them; parsing goes on.
            if c.swapped:
                ev = FlowGap(ev.conn, ev.ts, d.from_client, None, ev.reason)
            out.append(ev)
            return
        self.stats.gaps += 1
        if d.resync is not None and d.resync_exchange >= 0:
            # more bytes lost while looking for the cut message's framing
            if d.resync_lost is not None and ev.nbytes is not None:
                d.resync_lost += ev.nbytes
            else:
                d.resync_lost = None
            d.resync_gaps += 1
            d.resync = FramingSync(chunked_hint=True)
            d.hunt = bytearray()
            return
        if (
            not d.from_client
            and d.in_message
            and d.chunked is not None
            and d.decoder is None
            and not d.decode_failed
        ):
            # Bytes of a chunked response were lost: resume the same message at
            # the next chunk-size line that can be proven (or end it as gapped
            # if none is found, or the next message begins first).
            d.chunked = None
            d.hunt = bytearray()
            d.resync = FramingSync(chunked_hint=True)
            d.resync_exchange = d.exchange
            d.resync_lost = ev.nbytes
            d.resync_gaps = 1
            return
        # Whether a body whose head was not seen may follow: the capture began
        # mid-way, or bytes were lost where no known message was under way.
        unknown_body = not d.from_client
        if d.in_message:
            self._message_end(c, d, ev.ts, EndReason.GAP, out)
            unknown_body = False  # what follows is the tail of the message just cut
        elif not d.from_client:
            ex = d.exchange
            if ex < 0 and c.pending and ev.reason != "midstream":
                # The lost bytes begin at a message boundary, so they begin with
                # the answer to the oldest pending request.
                ex = c.pending.popleft().exchange
            if ex >= 0:
                out.append(HttpEnd(c.id, ex, ev.ts, False, EndReason.GAP))
                d.last_exchange = ex
                unknown_body = False
        d.exchange = -1 if not d.from_client else d.exchange
        d.head = None
        d.body = None
        d.decoder = None
        d.chunked = None
        d.hunt = bytearray()
        # A response body may be under way: look for its framing too.
        d.resync = FramingSync() if unknown_body else None
        d.resync_exchange = -1
        d.resync_lost = ev.nbytes
        d.resync_gaps = 1

    def _resume_failed(self, c: _Conn, d: _Direction, ts: float, out: list[HttpOutput]) -> None:
        """Stop resynchronising; a message being resumed ends as gapped."""
        d.resync = None
        if d.resync_exchange >= 0:
            d.resync_exchange = -1
            if d.in_message:
                self._message_end(c, d, ts, EndReason.GAP, out)

    def _hunt_or_resync(
        self, c: _Conn, d: _Direction, ts: float, data: bytes, out: list[HttpOutput]
    ) -> bytes:
        """Response direction after a mid-stream start or a gap: the next status
        line (a new message) or the proven framing of a body under way, whichever
        comes first. Returns the bytes to parse next (b"" when undecided)."""
        rs = d.resync
        assert rs is not None
        got = self._hunt(c, d, ts, data, out)
        if d.hunt is None:  # a status line: the body being looked for (if any) is over
            self._resume_failed(c, d, ts, out)
            return got
        if c.dead:
            d.resync = None
            return b""
        sp = rs.feed(data)
        if sp is None:
            return b""
        if sp.framing is None:  # nothing framable within the scan limit: keep hunting
            self.stats.resync_skipped += sp.skipped
            self._resume_failed(c, d, ts, out)
            return b""
        self._start_recovered(c, d, ts, sp, out)
        return sp.rest

    def _start_recovered(
        self, c: _Conn, d: _Direction, ts: float, sp: SyncPoint, out: list[HttpOutput]
    ) -> None:
        """The framing of a body under way was found: read it from ``sp.rest`` on,
        as a new exchange (its head was never seen) or the cut one resumed."""
        assert sp.framing is not None
        d.resync = None
        d.hunt = None
        d.hunted = 0
        self._release_opened(c, out)
        recovered = d.resync_exchange < 0
        if recovered:
            ex = c.next_exchange
            c.next_exchange += 1
            d.exchange = ex
            d.in_message = True
            d.method = b""
            d.raw = None
            d.head = None
            d.decoder = None
            d.decode_failed = False
        d.resync_exchange = -1
        self.stats.resyncs += 1
        self.stats.resync_skipped += sp.skipped
        out.append(
            HttpResync(
                c.id,
                d.exchange,
                ts,
                sp.framing,
                sp.skipped,
                recovered,
                d.resync_lost,
                max(1, d.resync_gaps),
            )
        )
        if sp.framing == CHUNKED:
            d.chunked = _ChunkedBody()
        else:
            d.body = _LengthBody(None)

    def _end(self, c: _Conn, d: _Direction, ts: float, reason: str, out: list[HttpOutput]) -> None:
        """One direction ended (FIN, RST, idle, end of capture)."""
        end = EndReason.RST if reason == "rst" else EndReason.EOF
        if d.resync is not None and d.hunt is not None and not c.dead:
            # The body being looked for ends here: decide with what came.
            sp = d.resync.finish()
            if sp.framing is not None:
                self._start_recovered(c, d, ts, sp, out)
                if sp.rest:
                    self._data(c, d, ts, sp.rest, out)
        if d.resync is not None:
            if d.resync_exchange >= 0:
                end = EndReason.GAP  # cut by a gap and never resumed
            d.resync = None
            d.resync_exchange = -1
        if d.in_message:
            body = d.body
            if reason == "fin" and body is not None and body.remaining is None:
                # A body delimited by connection close ends here.
                end = EndReason.COMPLETE
            self._message_end(c, d, ts, end, out)
        elif not d.from_client and d.exchange >= 0:
            # The server stopped before answering this exchange.
            out.append(HttpEnd(c.id, d.exchange, ts, False, end))
            d.last_exchange = d.exchange
            d.exchange = -1
        d.head = None
        d.body = None
        d.chunked = None
        d.hunt = None
