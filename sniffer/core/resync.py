"""Mid-body resynchronisation: where can a body captured from an unknown offset
be decoded again? (sans-IO)

A capture that starts in the middle of a connection (the sidecar started late,
or was restarted), or resumes after lost bytes, sees a response body from an
arbitrary byte on: inside a chunk-size line, inside a chunk, inside a UTF-8
sequence, between two SSE events. Nothing before the first point where the
framing can be *proven* is ever decoded: text is never invented.

Two levels, each a small incremental scanner fed with bytes:

* :class:`FramingSync` works on the raw bytes of the direction and finds the
  transfer framing:

  - **chunked**: a candidate is a chunk-size line (``HEX[;ext]CRLF``) at the
    start of the buffer or right after a line feed; it is *proven* when its chunk
    data is followed by CRLF and the next chunk-size line parses too (the
    chunk ends exactly where the next size line starts). The earliest
    candidate that could still be proven is waited for (bounded);
  - **identity**: no chunk link could be proven but the bytes carry SSE field
    lines or NDJSON objects: the body is decoded as is, from an item boundary.

* :class:`ItemSync` works on the decoded body and finds the first whole item:
  an SSE event boundary (a blank line) or an NDJSON line boundary. When the
  decoded data begins exactly at a proven chunk boundary and looks like the
  start of an SSE field line (``data:``, ``event:``, ``id:``, ``retry:``, a
  ``:`` comment) or of a JSON object, it is taken from there: servers write
  events whole per chunk. If that guess was wrong, the item cannot parse and
  is dropped as invalid by the dialect, never turned into text.

The items themselves then name the LLM API, since the request that would name
it was not seen: each dialect's probe (``sniffer.llm.dialects.guess_dialect``).

Every byte skipped before a sync point is counted (``skipped``) so the stream
can say how much it lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CHUNKED",
    "IDENTITY",
    "FramingSync",
    "ItemSync",
    "SyncPoint",
    "sniff_item_format",
]

CHUNKED = "chunked"
IDENTITY = "identity"

#: A chunk-size line: hex size, optional extensions, CRLF (as in http1).
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]{0,1024})?[ \t]*\r\n")
#: The longest size line we wait for before rejecting a candidate.
_MAX_SIZE_LINE = 1100
#: SSE field names a line may start with (WHATWG), and the comment marker.
_SSE_LINE = re.compile(rb"(?:data|event|id|retry)(?::|\r|\n)|:")
#: An SSE event boundary: two line ends in a row (CR, LF or CRLF each).
_SSE_BOUNDARY = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")

DEFAULT_MAX_SCAN = 256 * 1024
DEFAULT_MAX_CHUNK = 1 << 20
#: Bytes without any chunk-size line before an unchunked body is believed.
IDENTITY_EVIDENCE = 8192


@dataclass(frozen=True, slots=True)
class SyncPoint:
    """Where trusted framing starts.

    ``framing`` is :data:`CHUNKED` (``rest`` begins with a proven chunk-size
    line), :data:`IDENTITY` (``rest`` is body bytes, to be item-synced), or
    ``None`` when the scanner gave up (nothing can be framed; ``rest`` empty).
    ``skipped`` counts the bytes dropped before ``rest``.
    """

    framing: str | None
    skipped: int
    rest: bytes


_NEED = -1  # a candidate that more bytes may still prove
_BAD = -2  # a candidate that can never be proven


def _link(buf: bytes, pos: int, max_chunk: int) -> int:
    """Prove the chunk-size line at ``pos``: the position of the next size line,
    ``_NEED`` or ``_BAD``."""
    m = _SIZE_LINE.match(buf, pos)
    if m is None:
        nl = buf.find(b"\n", pos, pos + _MAX_SIZE_LINE)
        if nl < 0 and len(buf) - pos < _MAX_SIZE_LINE and _could_be_size(buf, pos):
            return _NEED
        return _BAD
    size = int(m[1], 16)
    if size > max_chunk:
        return _BAD
    end = m.end() + size
    if size == 0:
        return _BAD  # the last chunk proves nothing on its own (and ends the body)
    if len(buf) < end + 2:
        return _NEED
    if buf[end : end + 2] != b"\r\n":
        return _BAD
    nxt = end + 2
    m2 = _SIZE_LINE.match(buf, nxt)
    if m2 is not None:
        return nxt
    if len(buf) - nxt < _MAX_SIZE_LINE and b"\n" not in buf[nxt : nxt + _MAX_SIZE_LINE]:
        return _NEED if _could_be_size(buf, nxt) else _BAD
    return _BAD


def _could_be_size(buf: bytes, pos: int) -> bool:
    """The bytes from ``pos`` to the end could still become a size line."""
    tail = buf[pos:]
    if not tail:
        return True
    return re.fullmatch(rb"[0-9A-Fa-f]{1,16}(?:;[^\r\n]*)?[ \t]*\r?", tail) is not None


def _candidates(buf: bytes, start: int) -> list[int]:
    """Offsets a chunk-size line may start at: the buffer start and every
    position after a line feed (a size line follows the CRLF that ends the
    previous chunk; its CR may be the byte before the capture began)."""
    out = [0] if start == 0 else []
    i = buf.find(b"\n", max(0, start - 1))
    while i >= 0:
        if i + 1 >= start and i + 1 > 0:
            out.append(i + 1)
        i = buf.find(b"\n", i + 1)
    return out


class FramingSync:
    """Incremental search for the transfer framing of a body seen mid-way.

    ``feed(data)`` returns ``None`` while undecided (it keeps at most
    ``max_scan`` bytes), then a :class:`SyncPoint`. ``finish()`` decides with
    what it has (end of flow, gap). ``chunked_hint`` (the response head said
    chunked, e.g. after a gap in a known message) rules identity out;
    ``identity_ok=False`` does the same when nothing says the body is SSE or
    NDJSON."""

    __slots__ = ("_buf", "_checked", "_hint", "_max_chunk", "_max_scan", "_skipped")

    def __init__(
        self,
        *,
        chunked_hint: bool | None = None,
        max_scan: int = DEFAULT_MAX_SCAN,
        max_chunk: int = DEFAULT_MAX_CHUNK,
    ) -> None:
        self._buf = b""
        self._checked = 0  # candidates before this offset were rejected
        self._hint = chunked_hint
        self._max_scan = max_scan
        self._max_chunk = max_chunk
        self._skipped = 0

    @property
    def held(self) -> int:
        """Bytes fed and not yet handed on: held for a decision, or skipped."""
        return len(self._buf) + self._skipped

    def feed(self, data: bytes) -> SyncPoint | None:
        self._buf += bytes(data)
        return self._decide(final=False)

    def finish(self) -> SyncPoint:
        got = self._decide(final=True)
        assert got is not None
        return got

    def _decide(self, *, final: bool) -> SyncPoint | None:
        buf = self._buf
        full = final or len(buf) >= self._max_scan
        if self._hint is not False:
            for pos in _candidates(buf, self._checked):
                r = _link(buf, pos, self._max_chunk)
                if r >= 0:
                    return self._done(CHUNKED, pos)
                if r == _NEED:
                    if not full:
                        return None  # the earliest candidate may still be proven
                    continue  # cannot be proven in time: try later candidates
                self._checked = pos + 1
        if self._hint is not True and self._identity_evident(buf, final=full):
            return self._done(IDENTITY, 0)
        if full:
            self._skipped += len(buf)
            self._buf = b""
            return SyncPoint(None, self._skipped, b"")
        return None

    def _identity_evident(self, buf: bytes, *, final: bool) -> bool:
        """Unchunked SSE/NDJSON: item lines present and no chunk-size line
        anywhere in :data:`IDENTITY_EVIDENCE` bytes (or in all there is, at the
        end), so a size line still on its way is never decoded as body text."""
        if sniff_item_format(buf, at_start=False) is None or self._looks_chunked(buf):
            return False
        return final or len(buf) >= IDENTITY_EVIDENCE

    @staticmethod
    def _looks_chunked(buf: bytes) -> bool:
        """Some CRLF-preceded size line exists: wait for chunk proof rather than
        decoding chunk-size lines as body text."""
        return re.search(rb"\r\n[0-9A-Fa-f]{1,16}(?:;[^\r\n]*)?\r\n", buf) is not None

    def _done(self, framing: str, pos: int) -> SyncPoint:
        rest = self._buf[pos:]
        skipped = self._skipped + pos
        self._buf = b""
        return SyncPoint(framing, skipped, rest)


def sniff_item_format(data: bytes, *, at_start: bool = True) -> str | None:
    """``"sse"`` when the bytes hold an SSE field line (``data:``, ``event:``)
    after a line end, ``"ndjson"`` when they hold a line that starts a JSON
    object after a line end (and no SSE field line before it), else ``None``.

    ``at_start`` says the bytes begin at a line start (a proven chunk boundary):
    a field line there counts too. A ``{`` there does not decide on its own: a
    server may split an SSE event across chunks, so a chunk can begin with the
    JSON of a ``data:`` line; NDJSON needs a second line to show it."""
    if at_start and re.match(rb"(?:data|event):", data):
        return "sse"
    m = re.search(rb"\n(data:|event:|\{)", data)
    if m is None:
        return None
    return "ndjson" if m[1] == b"{" else "sse"


class ItemSync:
    """Drops decoded body bytes up to the first whole SSE event or NDJSON line.

    ``feed(data)`` returns the bytes to hand to the item decoder (empty until
    the sync point is found; then everything). ``at_boundary`` says the data
    starts at a proven chunk boundary, where a field line or ``{`` is trusted
    as an item start."""

    __slots__ = ("_at_boundary", "_buf", "_fmt", "_max_scan", "skipped", "synced")

    def __init__(self, fmt: str, *, at_boundary: bool, max_scan: int = DEFAULT_MAX_SCAN) -> None:
        if fmt not in ("sse", "ndjson"):
            raise ValueError(f"fmt must be 'sse' or 'ndjson', not {fmt!r}")
        self._fmt = fmt
        self._at_boundary = at_boundary
        self._buf = b""
        self._max_scan = max_scan
        self.skipped = 0
        self.synced = False

    def feed(self, data: bytes) -> bytes:
        if self.synced:
            return bytes(data)
        buf = self._buf + bytes(data)
        if self._at_boundary and buf:
            self._at_boundary = False
            if (self._fmt == "sse" and _SSE_LINE.match(buf)) or (
                self._fmt == "ndjson" and buf[:1] == b"{"
            ):
                self.synced = True
                self._buf = b""
                return buf
        if self._fmt == "sse":
            m = _SSE_BOUNDARY.search(buf)
            # a CR at the very end may be the first half of a CRLF: wait
            if m is not None and not (m.end() == len(buf) and buf.endswith(b"\r")):
                return self._take(buf, m.end())
        else:
            nl = buf.find(b"\n")
            if nl >= 0:
                return self._take(buf, nl + 1)
        keep = buf[-4:] if len(buf) > self._max_scan else buf
        self.skipped += len(buf) - len(keep)
        self._buf = keep
        return b""

    def _take(self, buf: bytes, pos: int) -> bytes:
        self.skipped += pos
        self.synced = True
        self._buf = b""
        return buf[pos:]

    def pending(self) -> int:
        """Bytes held while looking for the sync point (lost if the body ends)."""
        return len(self._buf)
