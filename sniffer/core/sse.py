"""Body decoders for streamed responses: WHATWG ``text/event-stream`` and NDJSON.

Both decoders are sans-IO: bytes in, decoded items out. They never raise on bad
input. Malformed bytes become U+FFFD, an over-long line is dropped and counted
(``overlong``, and in ``errors``/``last_error``) and decoding resynchronises at
the next line end.
"Need more data" is simply an empty list.

SSE follows the WHATWG HTML "event stream interpretation" rules:

* bytes are UTF-8, decoded incrementally (invalid sequences become U+FFFD); a
  BOM is stripped at the very start of the stream only;
* lines end with CR, LF or CRLF (a CR ending one feed and an LF starting the
  next are one line end);
* ``:`` starts a comment; ``field:value`` drops one space after the colon; a
  line without a colon is a field with an empty value;
* ``data`` lines accumulate (joined with ``\\n``), ``event`` sets the type,
  ``id`` (unless it contains NUL) sets the last event id, which persists, and
  ``retry`` counts only if it is all ASCII digits; other fields are ignored;
* a blank line dispatches the event, unless no ``data`` line was seen, in which
  case the event type is reset and nothing is dispatched;
* an event not terminated by a blank line when the body ends is not
  dispatched (``truncated_event`` records that it existed).

States are explicit: at a line start or inside a partial line (``_pieces``),
optionally after a CR (``_cr``), or discarding an over-long line (``_discard``).
The current event is held in ``_data``/``_type``/``_retry``; ``_pending`` says
a field line was seen since the last dispatch, ``_poisoned`` that one of its
lines was dropped (the whole event is then dropped at its blank line, so no
half event ever reaches a dialect).
"""

from __future__ import annotations

import codecs
from typing import NamedTuple, Protocol

__all__ = [
    "DEFAULT_MAX_LINE",
    "ItemDecoder",
    "NdjsonDecoder",
    "NdjsonItems",
    "SseDecoder",
    "SseEvent",
    "SseItems",
]

#: Longest line (in decoded characters, line end excluded) a decoder keeps.
DEFAULT_MAX_LINE = 8 * 1024 * 1024
#: A ``retry:`` value longer than this (a reconnection time past 31 years of
#: milliseconds) is ignored: Python refuses to convert a number of more than
#: 4300 digits, and nothing reads one that large.
MAX_RETRY_DIGITS = 12

_BOM = "\ufeff"


class SseEvent(NamedTuple):
    """One dispatched server-sent event.

    ``id`` is the last event id in effect when the event was dispatched (it
    persists across events); ``retry`` is the reconnection time given in this
    event's own field block, if any.

    A ``NamedTuple`` (immutable, compared by value) because one is made per
    streamed event: the decoder builds it in one C call (``tuple.__new__``),
    where a frozen dataclass sets each field through a Python-level call.
    """

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


_new_tuple = tuple.__new__


def _make_event(event: str, data: str, id: str | None, retry: int | None) -> SseEvent:
    return _new_tuple(SseEvent, (event, data, id, retry))


def _new_utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


class ItemDecoder(Protocol):
    """What the streams stage reads of an item decoder, the Python one here or
    the native core's (``sniffer._native``): a protocol, since the native
    classes are not subclasses of the Python ones."""

    errors: int
    overlong: int
    last_error: str | None

    @property
    def idle(self) -> bool: ...


class SseItems(ItemDecoder, Protocol):
    truncated_event: bool

    def feed(self, data: bytes) -> list[SseEvent]: ...
    def close(self) -> list[SseEvent]: ...


class NdjsonItems(ItemDecoder, Protocol):
    def feed(self, data: bytes) -> list[str]: ...
    def close(self) -> list[str]: ...


class _LineDecoder:
    """What both decoders share: incremental UTF-8, capped lines, error counters."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.errors = 0
        #: lines dropped for being longer than ``max_line`` (each also an error)
        self.overlong = 0
        self.last_error: str | None = None
        self.closed = False
        self._utf8 = _new_utf8_decoder()
        self._utf8_clean = True  # the incremental decoder holds no partial character
        self._started = False  # first character seen (BOM handled)
        self._discard = False  # inside an over-long line, dropping until a line end
        self._pieces: list[str] = []  # the current partial line
        self._plen = 0

    def _decode(self, data: bytes) -> str:
        # Whole, valid UTF-8 feeds (the usual case) decode in one C call; a feed
        # that ends inside a character or holds invalid bytes goes through the
        # incremental decoder, which keeps the partial character for next time.
        if self._utf8_clean:
            try:
                return data.decode()
            except UnicodeDecodeError:
                pass
        text: str = self._utf8.decode(data)
        self._utf8_clean = not self._utf8.getstate()[0]
        return text

    @property
    def idle(self) -> bool:
        """Nothing is held: the bytes fed so far end exactly at an item boundary
        (a restarted sidecar can go on from there with a fresh decoder)."""
        return not self._pieces and not self._discard and not self._utf8.getstate()[0]

    def _error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message

    def _overflow(self, length: int) -> None:
        self.overlong += 1
        self._error(f"line longer than {self.max_line} characters ({length}+) dropped")

    def _hold(self, text: str) -> None:
        """Keep the start of a line that has not ended yet (capped)."""
        self._pieces.append(text)
        self._plen += len(text)
        if self._plen > self.max_line:
            self._overflow(self._plen)
            self._pieces = []
            self._plen = 0
            self._discard = True

    def _joined(self, text: str) -> str:
        """The held start of the line followed by ``text``."""
        self._pieces.append(text)
        text = "".join(self._pieces)
        self._pieces = []
        self._plen = 0
        return text


class SseDecoder(_LineDecoder):
    """Incremental WHATWG event-stream decoder.

    >>> d = SseDecoder()
    >>> d.feed(b'data: {"a":1}\\n\\ndata: x')
    [SseEvent(event='message', data='{"a":1}', id=None, retry=None)]
    >>> d.close(), d.truncated_event
    ([], True)
    """

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        super().__init__(max_line)
        # counters, read by the pipeline
        self.events = 0
        self.comments = 0
        self.truncated_event = False
        #: last event id buffer (persists across events); None until an id line
        self.last_event_id: str | None = None
        #: reconnection time in effect (persists), from the last valid retry line
        self.retry: int | None = None
        self._cr = False  # the previous feed ended with CR
        # current event
        self._data: list[str] = []
        self._type = ""
        self._retry: int | None = None
        self._pending = False  # a field line was seen since the last dispatch
        self._poisoned = False  # a line of the current event was dropped

    # -- public -----------------------------------------------------------

    def feed(self, data: bytes) -> list[SseEvent]:
        """Decode more body bytes; return the events they complete."""
        if self.closed:
            self._error("data fed after close()")
            return []
        text = self._decode(data)
        if not text:
            return []
        return self._text(text)

    def close(self) -> list[SseEvent]:
        """End of body. A partial event is never dispatched: returns ``[]`` and
        sets ``truncated_event`` if one existed."""
        if self.closed:
            return []
        tail = self._utf8.decode(b"", final=True)
        if tail:
            self._text(tail)
        self.closed = True
        partial = "".join(self._pieces)
        partial_field = bool(partial) and partial[0] != ":"
        self.truncated_event = self._pending or partial_field or self._discard
        self._pieces = []
        self._plen = 0
        self._reset_event()
        return []

    @property
    def idle(self) -> bool:
        """At an event boundary: no partial line, no undispatched field, no CR
        waiting for its LF."""
        return super().idle and not self._pending and not self._cr

    # -- internals --------------------------------------------------------

    def _overflow(self, length: int) -> None:
        super()._overflow(length)
        self._pending = True  # the event the dropped line belonged to is dropped too
        self._poisoned = True

    # The parser's fast path and its states in one place, per body piece: kept whole (C901).
    def _text(self, text: str) -> list[SseEvent]:  # noqa: C901
        if (
            text[-2:] == "\n\n"
            and text[:5] == "data:"
            and self._started
            and not (self._cr or self._discard or self._pieces or self._pending)
            and "\r" not in text
            and len(text) <= self.max_line
        ):
            # Fastest path: exactly one event made of one data line (a server's
            # usual write), at an event boundary; what the fast path below does
            # for it, without splitting.
            value = text[5:-2]
            if "\n" not in value:
                if value[:1] == " ":
                    value = value[1:]
                self.events += 1
                return [_new_tuple(SseEvent, ("message", value, self.last_event_id, None))]
        if not self._started:
            self._started = True
            if text[0] == _BOM:
                text = text[1:]
                if not text:
                    return []
        # Normalise line ends to LF. A CR at the end of a feed is a line end
        # already; an LF opening the next feed then belongs to it.
        if self._cr:
            self._cr = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return []
        if "\r" in text:
            self._cr = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if self._discard:
            i = text.find("\n")
            if i < 0:
                return []
            self._discard = False
            text = text[i + 1 :]
            if not text:
                return []
        if "\n" not in text:
            # still inside one line
            self._hold(text)
            return []
        if self._pieces:
            text = self._joined(text)
        if len(text) > self.max_line:
            return self._checked_lines(text)

        # Fast path: ``text`` starts at a line start and no line is too long.
        # Split into blocks ended by a blank line; a block that is a lone
        # ``data`` line (the usual server event) is dispatched directly.
        out: list[SseEvent] = []
        blocks = text.split("\n\n")
        tail = blocks.pop()
        last_id = self.last_event_id
        fast = 0
        for block in blocks:
            if not self._pending and block[:5] == "data:" and "\n" not in block:
                value = block[5:]
                if value[:1] == " ":
                    value = value[1:]
                out.append(_new_tuple(SseEvent, ("message", value, last_id, None)))
                fast += 1
            else:
                for line in block.split("\n"):
                    self._line(line, out)
                self._dispatch(out)
                last_id = self.last_event_id
        self.events += fast
        if tail:
            lines = tail.split("\n")
            partial = lines.pop()
            for line in lines:
                self._line(line, out)
            if partial:
                self._pieces.append(partial)
                self._plen = len(partial)
        return out

    def _checked_lines(self, text: str) -> list[SseEvent]:
        """Slow path for text longer than the line cap: check every line."""
        out: list[SseEvent] = []
        lines = text.split("\n")
        partial = lines.pop()
        cap = self.max_line
        for line in lines:
            if len(line) > cap:
                self._overflow(len(line))
            else:
                self._line(line, out)
        if len(partial) > cap:
            self._overflow(len(partial))
            self._discard = True
        elif partial:
            self._pieces.append(partial)
            self._plen = len(partial)
        return out

    def _line(self, line: str, out: list[SseEvent]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line[0] == ":":
            self.comments += 1
            return
        self._pending = True
        colon = line.find(":")
        if colon < 0:
            name, value = line, ""
        else:
            name = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == " ":
                value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif (
            name == "retry"
            and len(value) <= MAX_RETRY_DIGITS
            and value.isascii()
            and value.isdigit()
        ):
            self._retry = self.retry = int(value)
        # other field names are ignored

    def _dispatch(self, out: list[SseEvent]) -> None:
        if self._poisoned or not self._data:
            self._reset_event()
            return
        data = "\n".join(self._data)
        out.append(_make_event(self._type or "message", data, self.last_event_id, self._retry))
        self.events += 1
        self._reset_event()

    def _reset_event(self) -> None:
        if self._data:
            self._data = []
        self._type = ""
        self._retry = None
        self._pending = False
        self._poisoned = False


class NdjsonDecoder(_LineDecoder):
    """Incremental line-delimited decoder (``application/x-ndjson``, JSON Lines).

    Returns complete lines as text (line end removed, CRLF tolerated); blank or
    whitespace-only lines are skipped. At ``close()`` a final line without a
    newline is returned too: NDJSON servers often omit it.
    """

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        super().__init__(max_line)
        self.lines = 0

    def feed(self, data: bytes) -> list[str]:
        """Decode more body bytes; return the complete lines they finish."""
        if self.closed:
            self._error("data fed after close()")
            return []
        text = self._decode(data)
        if not text:
            return []
        return self._text(text, final=False)

    def close(self) -> list[str]:
        """End of body: return the final line if it had no newline."""
        if self.closed:
            return []
        out = self._text(self._utf8.decode(b"", final=True), final=True)
        self.closed = True
        return out

    def _text(self, text: str, final: bool) -> list[str]:
        if text and not self._started:
            self._started = True
            if text[0] == _BOM:
                text = text[1:]
        if self._discard and text:
            i = text.find("\n")
            if i < 0:
                return []
            self._discard = False
            text = text[i + 1 :]
        if not final and "\n" not in text:
            self._hold(text)
            return []
        if self._pieces:
            text = self._joined(text)
        lines = text.split("\n")
        partial = "" if final else lines.pop()
        cap = self.max_line
        out: list[str] = []
        for line in lines:
            if len(line) > cap:
                self._overflow(len(line))
                continue
            if line[-1:] == "\r":
                line = line[:-1]
            if line and not line.isspace():
                out.append(line)
        if partial:
            if len(partial) > cap:
                self._overflow(len(partial))
                self._discard = True
            else:
                self._pieces.append(partial)
                self._plen = len(partial)
        self.lines += len(out)
        return out
