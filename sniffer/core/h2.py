"""HTTP/2 over cleartext (h2c), passively (sans-IO).

DESIGN NOTE — why not ``h2``'s state machine. ``h2.connection.H2Connection``
is one *endpoint*: it validates what it receives against what it sent (its own
SETTINGS, its flow-control windows, the stream states it drove), it answers
(SETTINGS ACK, WINDOW_UPDATE, PING ACK, RST_STREAM on protocol errors) and it
refuses to start anywhere but at the preface. Mirroring it h11-style (a server
instance for client bytes, a client instance for server bytes, each event
replayed into the other with ``send_headers``/``send_data``) would need every
window update, settings change and push replayed in the right order, makes the
HPACK *encoder* of the mirror re-encode what the peer encoded (it would not
reproduce the peer's dynamic table), and cannot survive a capture that starts
mid-connection or loses a segment: the state machine raises and the connection
is gone. So this module is a passive decoder built on the same project's
primitives: ``hyperframe`` (h2's frame layer) parses frame headers and bodies
(padding, priority fields, CONTINUATION), and ``hpack.Decoder`` (h2's HPACK)
keeps one dynamic table per direction. Flow control is the endpoints'
business: an observer only needs the bytes that were sent, so WINDOW_UPDATE,
PING, PRIORITY and SETTINGS (but its header-table size) are read and ignored.

Each HTTP/2 stream becomes one exchange, emitted as the same ``HttpRequest`` /
``HttpResponse`` / ``HttpBody`` / ``HttpEnd`` / ``HttpError`` events as
HTTP/1.1 (``version="2"``), so every dialect works unchanged. The exchange
number is stream-scoped: client stream ``n`` is exchange ``base + n // 2``,
where ``base`` is the exchange of stream 1: the first exchange of the
connection for prior knowledge, and for ``Upgrade: h2c`` the HTTP/1.1 request
that carried the upgrade (RFC 7540 §3.2: that request is stream 1's, its
response comes on stream 1), numbered after the HTTP/1.1 exchanges before it on
a keep-alive connection. Trailers (a second HEADERS block) come out as
``HttpTrailers``.

After an upgrade the client must begin with the connection preface: other
bytes, or a client side that ends before it, are an ``HttpError(kind="h2c")``
(the frames are then looked for as after a loss).

Loss and late starts: after a gap, or when the capture began mid-connection,
a direction's frame boundaries are found again by looking for a chain of
plausible frame headers; the streams then open are marked as gapped (never
complete) but not ended, and its HPACK table is *unsynced*: header blocks keep
being decoded (literal fields and entries added since are right), and a block
that refers to an entry the observer never saw is recorded as an
``HttpError(kind="hpack")`` on that stream, whose exchange is then ended as an
error; the other streams go on.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from hyperframe.exceptions import HyperframeError
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
)

from sniffer.core.coding import BodyDecoder as _BodyDecoder
from sniffer.core.coding import decoder_for as _decoder_for
from sniffer.core.events import (
    EndReason,
    Headers,
    HttpBody,
    HttpEnd,
    HttpError,
    HttpRequest,
    HttpResponse,
    HttpTrailers,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MAX_FRAME = (1 << 24) - 1
_MAX_BLOCK = 1 << 20  # header block (HEADERS + CONTINUATIONs) cap
_HUNT_KEEP = 1 << 16  # bytes kept while looking for frame boundaries
_KNOWN_TYPES = 10  # DATA .. CONTINUATION
_SCAN_OFFSETS = 4096  # offsets tried when looking for a frame boundary (bounded work)

H2Output = HttpRequest | HttpResponse | HttpBody | HttpEnd | HttpError | HttpTrailers

_ERROR_CODES = {
    0: "NO_ERROR",
    1: "PROTOCOL_ERROR",
    2: "INTERNAL_ERROR",
    3: "FLOW_CONTROL_ERROR",
    4: "SETTINGS_TIMEOUT",
    5: "STREAM_CLOSED",
    6: "FRAME_SIZE_ERROR",
    7: "REFUSED_STREAM",
    8: "CANCEL",
    9: "COMPRESSION_ERROR",
    10: "CONNECT_ERROR",
    11: "ENHANCE_YOUR_CALM",
    12: "INADEQUATE_SECURITY",
    13: "HTTP_1_1_REQUIRED",
}


def looks_like_preface(data: bytes) -> bool:
    """The client's first bytes are (a prefix of, at least 4 bytes of) the preface."""
    n = min(len(data), len(PREFACE))
    return n >= 4 and data[:n] == PREFACE[:n]


@dataclass(slots=True)
class H2Stats:
    """Counters of the HTTP/2 stage (``replay --json``, the daemon's stats)."""

    frames: int = 0
    streams: int = 0
    hpack_errors: int = 0
    resyncs: int = 0
    errors: int = 0


class _Side:
    """One half (client or server) of one HTTP/2 stream."""

    __slots__ = ("decode_failed", "decoder", "ended", "heads", "length", "received")

    def __init__(self) -> None:
        self.heads = 0  # header blocks seen (final head, then trailers)
        self.ended = False
        self.decoder: _BodyDecoder | None = None
        self.decode_failed = False
        self.length: int | None = None  # the head's Content-Length
        self.received = 0  # DATA payload bytes so far

    @property
    def whole(self) -> bool:
        """All the body its Content-Length announced has arrived."""
        return self.length is not None and self.received == self.length


class _Stream:
    __slots__ = ("broken", "client", "exchange", "id", "server")

    def __init__(self, sid: int, exchange: int) -> None:
        self.id = sid
        self.exchange = exchange
        self.client = _Side()
        self.server = _Side()
        self.broken = False  # headers undecodable: the exchange was ended as an error


class _Dir:
    __slots__ = ("block", "block_end_stream", "block_sid", "buf", "hpack", "preface", "synced")

    def __init__(self, preface: bool, synced: bool) -> None:
        self.buf = bytearray()
        self.preface = preface  # still expecting the client preface
        self.synced = synced  # frame boundaries known
        # Imported here, at the first HTTP/2 direction, not with the module:
        # every replay and `run` imports this module (through http1), and
        # hpack's tables cost ~6 ms of their start-up (bench_startup.py).
        import hpack

        self.hpack = hpack.Decoder(max_header_list_size=_MAX_BLOCK)
        self.hpack.max_allowed_table_size = 1 << 24
        self.block: bytearray | None = None  # header block being gathered (CONTINUATION)
        self.block_sid = 0
        self.block_end_stream = False


def _plausible(buf: bytes | bytearray, at: int, max_len: int = 1 << 14) -> int | None:
    """Length of a plausible frame header at ``at`` (None if it is not one)."""
    if at + 9 > len(buf):
        return None
    length = (buf[at] << 16) | (buf[at + 1] << 8) | buf[at + 2]
    ftype = buf[at + 3]
    if length > max_len or ftype >= _KNOWN_TYPES or buf[at + 5] & 0x80:
        return None
    sid = int.from_bytes(buf[at + 5 : at + 9], "big")
    if ftype in (4, 6, 7) and sid != 0:  # SETTINGS, PING, GOAWAY on stream 0
        return None
    if ftype in (0, 1, 2, 3, 5, 9) and sid == 0:
        return None
    if ftype == 4 and length % 6:
        return None
    if ftype == 6 and length != 8:
        return None
    if ftype in (3, 8) and length != 4:
        return None
    return length


def find_frame_start(
    buf: bytes | bytearray, chain: int = 2, max_offset: int = _SCAN_OFFSETS
) -> int | None:
    """The first offset (at most ``max_offset``) where ``chain`` plausible frame
    headers follow each other, or plausible frames run exactly to the end of
    ``buf``; at offset 0 a first frame not complete yet also counts (captured
    segments usually begin at a frame)."""
    n = len(buf)
    for at in range(min(max(0, n - 8), max_offset + 1)):
        pos = at
        count = 0
        while True:
            length = _plausible(buf, pos)
            if length is None:
                break
            count += 1
            pos += 9 + length
            if count >= chain or pos == n:
                return at
            if pos > n:
                break
        if count and pos > n and at == 0:
            return 0
    return None


class H2Conn:
    """Passive HTTP/2 decoder for one connection (both directions)."""

    def __init__(
        self,
        conn: int,
        *,
        upgraded: bool = False,
        midstream: bool = False,
        stats: H2Stats | None = None,
        base: int = 0,
    ) -> None:
        self.conn = conn
        self.base = base  # the exchange of stream 1
        self.upgraded = upgraded
        self.stats = stats if stats is not None else H2Stats()
        # index by from_client
        self.dirs = (_Dir(False, not midstream), _Dir(not midstream, not midstream))
        if midstream:
            self._unsync(self.dirs[0])
            self._unsync(self.dirs[1])
        self.streams: dict[int, _Stream] = {}
        self.goaway_last: int | None = None
        # Mid-connection start: which side is the client is a guess until a header
        # block shows it (a request's :method, a response's :status).
        self.orient_pending = midstream
        self.flipped = False  # set when that guess was wrong; the caller reorients
        if upgraded:
            self.upgrade()

    def upgrade(self) -> None:
        """The HTTP/1.1 request (exchange ``base``) became stream 1, its request side done."""
        s = self.streams.get(1)
        if s is None:
            s = self._stream(1)
        s.client.heads = 1
        s.client.ended = True

    def exchange_of(self, stream_id: int) -> int:
        return self.base + stream_id // 2

    def no_preface(self) -> None:
        """The caller found (and recorded) that the client's bytes do not begin
        with the preface: look for frame boundaries in them instead."""
        d = self.dirs[True]
        if d.preface:
            d.preface = False
            self._unsync(d)

    # ----------------------------------------------------------------- input

    def data(self, from_client: bool, ts: float, data: bytes) -> list[H2Output]:
        out: list[H2Output] = []
        d = self.dirs[from_client]
        d.buf += data
        if d.preface:
            n = min(len(d.buf), len(PREFACE))
            if d.buf[:n] != PREFACE[:n]:
                if self.upgraded:
                    msg = "no HTTP/2 connection preface from the client after the h2c upgrade"
                    self._error(None, True, ts, "h2c", msg, out)
                else:
                    self._error(None, True, ts, "h2", "bad connection preface", out)
                d.preface = False
                self._unsync(d)
            elif len(d.buf) < len(PREFACE):
                return out
            else:
                del d.buf[: len(PREFACE)]
                d.preface = False
        if not d.synced:
            at = find_frame_start(d.buf)
            if at is None:
                if len(d.buf) > _HUNT_KEEP:
                    del d.buf[: len(d.buf) - _HUNT_KEEP]
                return out
            del d.buf[:at]
            d.synced = True
            self.stats.resyncs += 1
        self._frames(d, from_client, ts, out)
        return out

    def gap(self, from_client: bool, ts: float) -> list[H2Output]:
        """Bytes of this direction were lost: drop the partial frame and find frame
        boundaries again. Which streams lost frames is unknown, so none is ended
        here: the caller marks every open exchange of the connection as gapped
        (a ``FlowGap``), and they go on recording what still comes."""
        d = self.dirs[from_client]
        d.buf.clear()
        d.preface = False
        d.block = None
        self._unsync(d)
        return []

    def end(self, from_client: bool, ts: float, reason: str) -> list[H2Output]:
        """One direction ended: its open stream halves end (EOF or RST)."""
        out: list[H2Output] = []
        d = self.dirs[from_client]
        if from_client and d.preface:
            d.preface = False
            if self.upgraded:
                msg = "the client ended without its HTTP/2 connection preface after the h2c upgrade"
                self._error(None, True, ts, "h2c", msg, out)
            else:
                self._error(None, True, ts, "h2", "the client ended inside the preface", out)
        why = EndReason.RST if reason == "rst" else EndReason.EOF
        for s in list(self.streams.values()):
            side = s.client if from_client else s.server
            if not side.ended and not s.broken:
                self._end_side(s, from_client, ts, why, out)
        return out

    def close(self, ts: float, reason: str) -> list[H2Output]:
        out = self.end(True, ts, reason)
        out.extend(self.end(False, ts, reason))
        self.streams.clear()
        return out

    # ---------------------------------------------------------------- frames

    def _unsync(self, d: _Dir) -> None:
        d.synced = False
        self._lose_sync(d)

    def _lose_sync(self, d: _Dir) -> None:
        # The dynamic table may miss entries from now on; keep what it has.
        d.block = None

    def _frames(self, d: _Dir, from_client: bool, ts: float, out: list[H2Output]) -> None:
        buf = d.buf
        pos = 0
        n = len(buf)
        mv = memoryview(buf)
        try:
            while n - pos >= 9:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if n - pos < 9 + length:
                    break
                try:
                    frame, _ = Frame.parse_frame_header(mv[pos : pos + 9])
                    frame.parse_body(mv[pos + 9 : pos + 9 + length])
                except HyperframeError as exc:
                    self.stats.errors += 1
                    sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                    out.append(
                        HttpError(
                            self.conn,
                            self.exchange_of(sid) if sid else None,
                            ts,
                            from_client,
                            "h2",
                            f"bad frame: {exc}",
                        )
                    )
                    pos += 9 + length
                    continue
                pos += 9 + length
                self.stats.frames += 1
                self._frame(d, from_client, ts, frame, out)
                if self.flipped and self.dirs[not from_client] is d:
                    from_client = not from_client  # this direction is the other side
        finally:
            mv.release()
        if pos:
            del buf[:pos]

    # One frame's transitions in one place (DESIGN: Style), per frame: kept whole (C901).
    def _frame(  # noqa: C901
        self, d: _Dir, from_client: bool, ts: float, frame: Frame, out: list[H2Output]
    ) -> None:
        t = type(frame)
        if d.block is not None and t is not ContinuationFrame:
            self._error(None, from_client, ts, "h2", "header block interrupted", out)
            d.block = None
        if t is DataFrame:
            assert isinstance(frame, DataFrame)
            s = self.streams.get(frame.stream_id)
            if s is None or s.broken:
                return
            side = s.client if from_client else s.server
            if side.ended:
                return
            if frame.data:
                side.received += len(frame.data)
                self._body(s, side, from_client, ts, bytes(frame.data), out)
            if "END_STREAM" in frame.flags:
                self._end_side(s, from_client, ts, EndReason.COMPLETE, out)
        elif t is HeadersFrame or t is PushPromiseFrame:
            assert isinstance(frame, HeadersFrame | PushPromiseFrame)
            d.block = bytearray(frame.data)
            d.block_sid = frame.stream_id if t is HeadersFrame else -frame.stream_id
            d.block_end_stream = "END_STREAM" in frame.flags
            if "END_HEADERS" in frame.flags:
                self._block(d, from_client, ts, out)
        elif t is ContinuationFrame:
            assert isinstance(frame, ContinuationFrame)
            if d.block is None or abs(d.block_sid) != frame.stream_id:
                self._error(
                    self.exchange_of(frame.stream_id),
                    from_client,
                    ts,
                    "h2",
                    "stray CONTINUATION",
                    out,
                )
                d.block = None
                return
            d.block += frame.data
            if len(d.block) > _MAX_BLOCK:
                self._error(
                    self.exchange_of(frame.stream_id),
                    from_client,
                    ts,
                    "h2",
                    "header block too large",
                    out,
                )
                d.block = None
                return
            if "END_HEADERS" in frame.flags:
                self._block(d, from_client, ts, out)
        elif t is RstStreamFrame:
            assert isinstance(frame, RstStreamFrame)
            s = self.streams.get(frame.stream_id)
            if s is None:
                return
            code = frame.error_code
            # A response whose whole Content-Length has arrived is whole, whatever
            # the reset (curl resets an upgraded stream 1 with STREAM_CLOSED
            # once it has read its body).
            whole = s.server.whole and not s.server.ended
            if code not in (0, 8) and not (whole and code == 5):
                # (NO_ERROR, CANCEL: ordinary ends)
                self._error(
                    s.exchange,
                    from_client,
                    ts,
                    "h2-rst",
                    f"RST_STREAM {_ERROR_CODES.get(code, code)}",
                    out,
                )
            for fc in (True, False):
                side = s.client if fc else s.server
                if not side.ended and not s.broken:
                    why = EndReason.COMPLETE if whole and not fc else EndReason.RST
                    self._end_side(s, fc, ts, why, out)
            self.streams.pop(s.id, None)
        elif t is GoAwayFrame:
            assert isinstance(frame, GoAwayFrame)
            last = frame.last_stream_id
            self.goaway_last = last
            code = frame.error_code
            if code != 0:
                detail = bytes(frame.additional_data).decode("utf-8", "replace")
                msg = f"GOAWAY {_ERROR_CODES.get(code, code)}" + (f": {detail}" if detail else "")
                self._error(None, from_client, ts, "h2-goaway", msg, out)
            # Streams above the last one the sender processed were never handled.
            for s in list(self.streams.values()):
                if s.id > last and (s.id % 2 == 1) == (not from_client):
                    for fc in (True, False):
                        side = s.client if fc else s.server
                        if not side.ended and not s.broken:
                            self._end_side(s, fc, ts, EndReason.RST, out)
                    self.streams.pop(s.id, None)
        elif t is SettingsFrame:
            assert isinstance(frame, SettingsFrame)
            size = frame.settings.get(SettingsFrame.HEADER_TABLE_SIZE)
            if size is not None:
                # The peer's limit applies to the encoder of the *other* direction.
                self.dirs[not from_client].hpack.max_allowed_table_size = max(size, 1 << 12)

    # ----------------------------------------------------------------- heads

    # One header block's transitions in one place, per block: kept whole (C901).
    def _block(self, d: _Dir, from_client: bool, ts: float, out: list[H2Output]) -> None:  # noqa: C901
        block = bytes(d.block or b"")
        d.block = None
        sid = d.block_sid
        end_stream = d.block_end_stream
        import hpack  # loaded by the first _Dir (see there)

        try:
            fields = d.hpack.decode(block, raw=True)
        except (hpack.HPACKError, ValueError, IndexError) as exc:
            self.stats.hpack_errors += 1
            if sid > 0:
                s = self.streams.get(sid)
                if s is None:
                    s = self._stream(sid)
                self._broken(s, from_client, ts, f"undecodable header block ({exc})", out)
            return
        if sid < 0:
            return  # PUSH_PROMISE: decoded only to keep the table in step
        headers: list[tuple[str, str]] = []
        pseudo: dict[str, str] = {}
        for name_b, value_b in fields:
            name = bytes(name_b).decode("latin-1").lower()
            value = bytes(value_b).decode("latin-1")
            if name.startswith(":"):
                pseudo[name] = value
            else:
                headers.append((name, value))
        if self.orient_pending and (":method" in pseudo or ":status" in pseudo):
            self.orient_pending = False
            if (":method" in pseudo) != from_client:
                # The guess was the wrong way round: swap the directions' state.
                self.dirs = (self.dirs[1], self.dirs[0])
                self.flipped = True
                from_client = not from_client
        s = self.streams.get(sid)
        if s is None:
            if sid % 2 == 0:
                return  # server-pushed stream: not an exchange the client asked for
            s = self._stream(sid)
        if s.broken:
            return
        side = s.client if from_client else s.server
        hdrs: Headers = tuple(headers)
        if side.heads:
            # Trailers.
            side.heads += 1
            out.append(HttpTrailers(self.conn, s.exchange, ts, from_client, hdrs))
            if end_stream:
                self._end_side(s, from_client, ts, EndReason.COMPLETE, out)
            return
        if from_client:
            side.heads = 1
            method = pseudo.get(":method", "")
            target = pseudo.get(":path", "")
            if method == "CONNECT" and not target:
                target = pseudo.get(":authority", "")
            if ":authority" in pseudo and not any(n == "host" for n, _ in headers):
                hdrs = (("host", pseudo[":authority"]), *hdrs)
            out.append(HttpRequest(self.conn, s.exchange, ts, method, target, "2", hdrs))
        else:
            code = pseudo.get(":status", "")
            if len(code) != 3 or not code.isascii() or not code.isdigit():  # RFC 9113 §8.3.2
                self._broken(s, from_client, ts, "response without a valid :status", out)
                return
            status = int(code)
            info = 100 <= status < 200
            if not info:
                side.heads = 1
            out.append(HttpResponse(self.conn, s.exchange, ts, status, "", "2", hdrs, info))
            if info:
                return
        for name, value in hdrs:
            if name == "content-length" and value.isascii() and value.isdigit() and len(value) < 20:
                side.length = int(value)
        side.decoder, err = _decoder_for(hdrs)
        side.decode_failed = err is not None
        if err is not None:
            self._error(s.exchange, from_client, ts, "decode", err, out)
        if end_stream:
            self._end_side(s, from_client, ts, EndReason.COMPLETE, out)

    # ------------------------------------------------------------------ misc

    def _stream(self, sid: int) -> _Stream:
        s = _Stream(sid, self.exchange_of(sid))
        self.streams[sid] = s
        self.stats.streams += 1
        return s

    def _body(
        self,
        s: _Stream,
        side: _Side,
        from_client: bool,
        ts: float,
        data: bytes,
        out: list[H2Output],
    ) -> None:
        if side.decode_failed:
            return
        if side.decoder is not None:
            try:
                data = side.decoder.feed(data)
            except zlib.error as exc:
                side.decode_failed = True
                self._error(s.exchange, from_client, ts, "decode", str(exc), out)
                return
            if not data:
                return
        out.append(HttpBody(self.conn, s.exchange, ts, from_client, data))

    def _end_side(
        self, s: _Stream, from_client: bool, ts: float, reason: EndReason, out: list[H2Output]
    ) -> None:
        side = s.client if from_client else s.server
        if side.ended:
            return
        side.ended = True
        if side.decoder is not None and not side.decode_failed and reason is EndReason.COMPLETE:
            tail = side.decoder.flush()
            if tail:
                out.append(HttpBody(self.conn, s.exchange, ts, from_client, tail))
        if side.decode_failed and reason is EndReason.COMPLETE:
            reason = EndReason.ERROR
        out.append(HttpEnd(self.conn, s.exchange, ts, from_client, reason))
        if s.client.ended and s.server.ended:
            self.streams.pop(s.id, None)

    def _broken(
        self, s: _Stream, from_client: bool, ts: float, msg: str, out: list[H2Output]
    ) -> None:
        """The stream's headers cannot be decoded: record it and end it as an error.
        A request never seen still makes an exchange (a row with the error)."""
        if s.client.heads == 0 and not s.client.ended and s.id % 2 == 1:
            s.client.heads = 1
            out.append(HttpRequest(self.conn, s.exchange, ts, "", "", "2", ()))
        self._error(s.exchange, from_client, ts, "hpack", msg, out)
        for fc in (True, False):
            side = s.client if fc else s.server
            if not side.ended:
                side.ended = True
                out.append(HttpEnd(self.conn, s.exchange, ts, fc, EndReason.ERROR))
        s.broken = True

    def _error(
        self,
        exchange: int | None,
        from_client: bool,
        ts: float,
        kind: str,
        msg: str,
        out: list[H2Output],
    ) -> None:
        self.stats.errors += 1
        out.append(HttpError(self.conn, exchange, ts, from_client, kind, msg))
