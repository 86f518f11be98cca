"""Collect what the token layer needs from the store events, before redaction.

Token counts and ids must be computed on the text the server sent, while
what is written may be redacted (or, for unsampled streams, not written at
all). So the drivers (replay, daemon) feed every batch of store events to a
``TokenCollector`` *before* the transform; it keeps each open stream's chunk
texts (capped) and, when the stream closes, turns them into a
``tokens.StreamInput`` ready for ``tokenize_pass.tokenize_inputs``.

With a ``redactor`` it also gives the token pass what the recording chain's
``redact.StreamRedactor`` stores for each choice: the stored text (for
``text_hash``/``text_len``) and the redacted spans of the original text,
whose token ids the token pass masks (see ``tokenize_pass.to_rows``). When
the chain's redactor saw every chunk text as sent (no sampler before it), it
hands those spans over (:meth:`TokenCollector.hand_redactions`); otherwise,
or when the stream was capped, the token pass replays the same bounded
look-behind over the same chunk texts, which gives exactly the same result.

Pure: no I/O, no clock, no tokenizer call (that happens off the capture path).
"""

from __future__ import annotations

import struct
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import cache, partial
from typing import TYPE_CHECKING, Any

from sniffer.core.events import ChunkEvent, StoreEvent, StreamClosed, StreamFlag, StreamOpened
from sniffer.llm.values import Usage, include_usage, json_or_none
from sniffer.record.redact import ChoiceRedactions, Redactor, apply_spans, redact_choice_texts
from sniffer.record.tracker import StreamTracker, Tracked

if TYPE_CHECKING:
    from sniffer.llm.tokens import ChunkColumns, ChunkInput, StreamInput

# The token analysis's module (sniffer.llm.tokens) is imported when closed
# streams are taken for the token pass, not with this module: the recording
# chain is built before the capture opens (issue #25: start-up).

#: Chunk texts of an open stream are joined into one string every this many
#: chunks: a long-lived small string per chunk would pin the allocator's pools
#: (1,000 open streams made the daemon's RSS grow ~300 bytes per event). 16,
#: not 64: up to 64 strings of ~60 bytes held per open stream cost ~2 MB more
#: at 1,000 streams than the extra joins save.
_JOIN_EVERY = 16
_JOIN_AT = _JOIN_EVERY - 1  # chunks in a tail that the next one fills
#: Chunk events of one stream the collector keeps (their texts are held in
#: memory until the stream closes). Past it the stream's tokens are computed
#: for the first ``MAX_CHUNKS`` only and its close is flagged ``tokens-capped``
#: (the tool's own cap: every chunk is still stored).
MAX_CHUNKS = 200_000


#: A block's seqs, choices and lengths as the bytes of their arrays (``array``
#: ``q`` and ``l``: C long long and long). ``array.append`` parses each int
#: through the format machinery (~500 instructions); ``struct`` packs a
#: block's ints in one call.
_PACK_SEQS = struct.Struct(f"@{_JOIN_EVERY}q").pack
_PACK_LONGS = struct.Struct(f"@{_JOIN_EVERY}l").pack
#: bytes per seq in ``_Open.seqs``
_SEQ_BYTES = struct.calcsize("@q")

#: One block of an open stream's chunks, ``(seq, choice, text)`` each, as
#: ``(seqs, choices, lengths, text)``: the bytes of their ``array('q')``,
#: ``array('l')`` and ``array('l')`` and their texts joined.
PackBlock = Callable[[list[tuple[int, int, str]]], tuple[bytes, bytes, bytes, str]]


def _pack_block(tail: list[tuple[int, int, str]]) -> tuple[bytes, bytes, bytes, str]:
    """:data:`PackBlock` of a full block (``_JOIN_EVERY`` chunks): the
    reference of the native core's ``pack_chunk_block`` (any length, one
    call: ~0.14 µs per chunk less on the live traffic's capture path)."""
    seqs, choices, texts = zip(*tail, strict=True)
    return _PACK_SEQS(*seqs), _PACK_LONGS(*choices), _PACK_LONGS(*map(len, texts)), "".join(texts)


#: ``(events, entries, chunk, handlers)``: :meth:`TokenCollector.observe`'s
#: pass natively (``sniffer._native.CollectChunks``): a chunk that only adds
#: ``(seq, choice, text)`` to its stream's ``tail``, or fills its block
#: (``_Open.join_tail``), is kept there, any other chunk of a collected
#: stream goes to ``chunk(ev, state)``, every event that is not a chunk event
#: to its exact type's handler in ``handlers`` (none: skipped).
CollectPass = Callable[
    [
        list[StoreEvent],
        dict[int, Tracked],
        Callable[[ChunkEvent, "_Open"], None],
        dict[type, Callable[[Any], None]],
    ],
    None,
]


@cache
def _native_pass() -> CollectPass | None:
    """The native core's :data:`CollectPass` (~0.8k instructions per chunk
    less than the Python pass on the live traffic, and ~14k per block of
    ``_JOIN_EVERY`` chunks packed without a Python call), or None (the pure
    core)."""
    from sniffer import native_core

    native = getattr(native_core()[0], "CollectChunks", None)
    if native is None:  # the pure core (or a module built before it)
        return None
    collect: CollectPass = native(ChunkEvent, Tracked, _Open, _JOIN_AT)
    return collect


#: ``_Open``'s columns before its first block: empty, immutable (shared)
_NO_BYTES = b""


class _Open:
    """An open stream's chunks (its ``Tracked.tokens`` slot), kept compact
    (1,000 open streams of hundreds of chunks each must not cost objects per
    chunk): seq, choice and text length in columns, the bytes of an
    ``array('q')``, ``array('l')`` and ``array('l')`` (bytearrays: the
    native pass adds a block's to them without a Python call), the texts
    joined in blocks, finish reasons and logprobs only where present. The
    last chunks, up to a block (``_JOIN_EVERY``), wait in ``tail`` as (seq,
    choice, text): one tuple per chunk on the capture path, the columns
    filled a block at a time. ``chunks()`` hands them over as
    ``ChunkColumns``."""

    __slots__ = (
        "blocks",
        "body",
        "choices",
        "extra",
        "handed",
        "lens",
        "model",
        "redactions",
        "room",
        "seqs",
        "tail",
        "truncated",
    )

    def __init__(self, model: str | None, body: str | None, max_chunks: int = MAX_CHUNKS) -> None:
        self.model = model
        #: the request body as sent: parsed (and checked for redaction) by the
        #: token pass, off the capture path
        self.body = body
        # (the shared empty bytes until the first full block: most streams of
        # a few chunks never need their own columns)
        self.seqs: bytes | bytearray = _NO_BYTES
        self.choices: bytes | bytearray = _NO_BYTES
        self.lens: bytes | bytearray = _NO_BYTES
        self.blocks: list[str] = []
        self.tail: list[tuple[int, int, str]] = []
        #: chunks the tail may still take under the collector's cap
        #: (``max_chunks`` less those in the columns): one test per chunk
        self.room = max_chunks
        self.extra: dict[int, tuple[str | None, str | None]] = {}
        self.truncated = False
        #: the recording chain's redaction handed over what it redacted in
        #: this stream's text (``redactions``, None for nothing): the token
        #: pass need not replay it (see ``TokenCollector.hand_redactions``)
        self.handed = False
        self.redactions: dict[int, ChoiceRedactions] | None = None

    def __len__(self) -> int:
        return len(self.seqs) // _SEQ_BYTES + len(self.tail)

    def join_tail(self, pack: PackBlock = _pack_block) -> None:
        """Move a full ``tail`` (``_JOIN_EVERY`` chunks) into the columns and
        blocks (what the native pass does itself, ``CollectChunks``)."""
        seqs, choices, lens, text = pack(self.tail)
        if type(self.seqs) is bytes:  # the first block: columns of its own
            self.seqs = bytearray(seqs)
            self.choices = bytearray(choices)
            self.lens = bytearray(lens)
        else:
            self.seqs += seqs
            self.choices += choices
            self.lens += lens
        self.blocks.append(text)
        self.tail.clear()

    def chunks(self) -> ChunkColumns:
        """The chunks as columns (the analysis builds no object per chunk), as
        lists: the analysis makes several passes over them, and a list's items
        are objects already (an array's are made at each read)."""
        from sniffer.llm.tokens import ChunkColumns

        seqs = array("q", self.seqs).tolist()
        choices = array("l", self.choices).tolist()
        lens = array("l", self.lens).tolist()
        texts = [*self.blocks]
        if self.tail:
            tail_seqs, tail_choices, tail_texts = zip(*self.tail, strict=True)
            seqs += tail_seqs
            choices += tail_choices
            lens += map(len, tail_texts)
            texts += tail_texts
        return ChunkColumns(seqs, choices, lens, "".join(texts), self.extra)


class TokenCollector:
    """Open LLM streams' chunk texts; closed streams' ``StreamInput``s, in order."""

    def __init__(
        self,
        *,
        max_chunks: int = MAX_CHUNKS,
        redactor: Redactor | None = None,
    ) -> None:
        # Own copies: counts stay the recording chain's, and the token worker
        # thread's ``redact`` calls share no state with the capture thread.
        self._windows = redactor.clone() if redactor is not None else None
        self._spans = redactor.clone() if redactor is not None else None
        #: open streams: the tracker this observer reads (its own until the
        #: recording chain shares its tracker, see :meth:`track_with`); it
        #: bounds how many are kept at once
        self.tracker = StreamTracker()
        self._drives = True
        self._ready: deque[tuple[int, _Open, Usage | None, bool, bool]] = deque()
        self._ready_by_id: dict[int, _Open] = {}  # the same streams, to mark clean
        self._max_chunks = max_chunks
        from sniffer import native_core

        #: a block of chunks packed natively (the pure core: ``_pack_block``)
        self._pack: PackBlock = getattr(native_core()[0], "pack_chunk_block", _pack_block)
        #: the batch's chunks that only add to their stream's tail, natively
        #: (None: the pure core; ``_chunk`` is the reference)
        self._native: CollectPass | None = _native_pass()
        self.capped_streams = 0  # more chunks than max_chunks: the rest not tokenized

    def track_with(self, tracker: StreamTracker) -> None:
        """Read ``tracker`` (the recording chain's, which drives it) instead of
        a tracker of its own. Call before the first event."""
        self.tracker = tracker
        self._drives = False

    def observe(self, events: Iterable[StoreEvent]) -> None:
        """Keep what the token pass needs of a batch. The close of a stream that
        had more than ``max_chunks`` chunk events is flagged ``tokens-capped``:
        in ``events`` (a list: the batch the store writes next), the
        ``StreamClosed`` is replaced by one carrying the flag."""
        # The capture path: per chunk, one tuple kept (a block's go to the columns at once).
        tracker = self.tracker
        if self._drives:
            events = events if isinstance(events, list) else list(events)
            tracker.observe(events)
        entries = tracker.open
        native = self._native
        if native is not None and type(events) is list:
            # the chunks that only add to their tail natively, the rest here
            native(events, entries, self._chunk, self._handlers(events))
        else:
            chunk, handlers = self._chunk, self._handlers(events)
            for ev in events:
                if type(ev) is ChunkEvent:
                    e = entries.get(ev.stream)
                    if e is not None and (s := e.tokens) is not None:
                        chunk(ev, s)
                else:
                    handle = handlers.get(type(ev))
                    if handle is not None:
                        handle(ev)
        if self._drives:
            tracker.release()

    def _chunk(self, ev: ChunkEvent, s: _Open) -> None:
        """A chunk event of an open LLM stream (``s``, its state)."""
        tail = s.tail
        k = len(tail)
        if k >= s.room:  # max_chunks kept already
            if not s.truncated:
                s.truncated = True
                self.capped_streams += 1
            return
        if ev.finish_reason is not None or ev.logprobs is not None:
            s.extra[len(s.seqs) // _SEQ_BYTES + k] = (ev.finish_reason, ev.logprobs)
        tail.append((ev.seq, ev.choice, ev.text))
        if k >= _JOIN_AT:  # a full block now
            s.join_tail(self._pack)
            s.room -= _JOIN_EVERY

    def _handlers(self, events: Iterable[StoreEvent]) -> dict[type, Callable[[Any], None]]:
        """The handlers of the batch ``events``' events that are not chunk
        events, by exact type (the others are not read here)."""
        return {StreamOpened: self._opened, StreamClosed: partial(self._closed, events)}

    def _opened(self, ev: StreamOpened) -> None:
        if ev.dialect is None:  # not an LLM stream
            return
        e = self.tracker.open.get(ev.stream)
        if e is not None:  # (None: opened and evicted in one batch)
            e.tokens = _Open(ev.request.model, ev.request_body, self._max_chunks)

    def _closed(self, events: Iterable[StoreEvent], ev: StreamClosed) -> None:
        """A stream's close, in the batch ``events``."""
        e = self.tracker.open.get(ev.stream)
        s = e.tokens if e is not None else None
        if s is not None:
            assert e is not None
            e.tokens = None
            if s.truncated and isinstance(events, list):
                flagged = replace(ev, flags=(*ev.flags, StreamFlag.TOKENS_CAPPED))
                events[events.index(ev)] = flagged  # rare: a linear search is fine
            # Kept compact until taken: at a burst of closes (1,000 streams
            # ending together) the texts are joined for one batch at a time.
            self._ready.append((ev.stream, s, ev.usage, ev.gap, ev.done_seen))
            self._ready_by_id[ev.stream] = s

    def _build(self, item: tuple[int, _Open, Usage | None, bool, bool]) -> StreamInput:
        from sniffer.llm.tokens import StreamInput

        stream_id, s, usage, gap, done_seen = item
        body = s.body
        parsed = json_or_none(body)
        request: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        mask_prompt = bool(self._windows is not None and body and self._windows.edits(body)[1])
        chunks = s.chunks()
        if not s.handed or s.truncated:
            stored, masks = self._redacted(chunks)
        elif s.redactions is None:
            stored, masks = None, None  # what the replay would find: nothing
        else:
            stored, masks = _handed(chunks, s.redactions)
        return StreamInput(
            stream_id=stream_id,
            model=s.model,
            request=request,
            chunks=chunks,
            usage=usage,
            gap=gap,
            done_seen=done_seen,
            include_usage_requested=include_usage(request),
            stored_texts=stored,
            masks=masks,
            redact=self._redact_spans if self._spans is not None else None,
            mask_prompt=mask_prompt,
            capped=s.truncated,
        )

    def _redacted(
        self, chunks: Sequence[ChunkInput]
    ) -> tuple[dict[int, str] | None, dict[int, list[tuple[int, int]]] | None]:
        """Per choice that had something redacted: the stored text and the spans."""
        red = self._windows
        if red is None:
            return None, None
        by_choice: dict[int, list[str]] = {}
        for c in chunks:
            if c.choice >= 0:
                by_choice.setdefault(c.choice, []).append(c.text)
        stored: dict[int, str] = {}
        masks: dict[int, list[tuple[int, int]]] = {}
        for ch, texts in by_choice.items():
            out, spans = redact_choice_texts(red, texts)
            if spans:
                stored[ch] = "".join(out)
                masks[ch] = spans
        return (stored or None), (masks or None)

    def _redact_spans(self, text: str) -> list[tuple[int, int]]:
        assert self._spans is not None
        return [(s, e) for s, e, _ in self._spans.edits(text)[1]]

    def take(self, limit: int | None = None, max_chunks: int | None = None) -> list[StreamInput]:
        """Closed streams not yet taken, oldest first: at most ``limit`` streams
        and, past the first, at most ``max_chunks`` chunks in all (many short
        streams make one batch; a burst of long ones stays flat in memory)."""
        from sniffer.llm.tokens import gc_paused

        out: list[StreamInput] = []
        ready = self._ready
        chunks = 0
        with gc_paused():  # the inputs' column lists: no collection walks them
            while ready and (limit is None or len(out) < limit):
                if max_chunks is not None and out and chunks + len(ready[0][1]) > max_chunks:
                    break
                chunks += len(ready[0][1])
                item = ready.popleft()
                self._ready_by_id.pop(item[0], None)
                out.append(self._build(item))
        return out

    def bind(self, inputs: Iterable[StreamInput]) -> list[StreamInput]:
        """Inputs another collector of the same redactor took, sent without their
        ``redact`` function (bound to that collector's whole state: a parallel
        replay's worker sends them as plain tuples, ``sniffer.runtime.replay``),
        with this one's, as if it had taken them."""
        if self._spans is None:
            return list(inputs)
        redact = self._redact_spans
        return [replace(inp, redact=redact) for inp in inputs]

    def hand_redactions(
        self, clean: Iterable[int], redacted: Mapping[int, dict[int, ChoiceRedactions]]
    ) -> None:
        """What the recording chain's
        :class:`~sniffer.record.redact.StreamRedactor` redacted in these closed
        streams' chunk texts (``StreamRedactor.take_redactions``): nothing in
        ``clean``; per choice, the spans of its original text and their
        replacements in ``redacted``. The token pass then takes the masks and
        the stored texts from them instead of replaying the look-behind. Only
        valid when every chunk text reached the redactor unchanged (no sampler
        before it); streams already taken are ignored."""
        by_id = self._ready_by_id
        for stream in clean:
            s = by_id.get(stream)
            if s is not None:
                s.handed = True
        for stream, choices in redacted.items():
            s = by_id.get(stream)
            if s is not None:
                s.handed = True
                s.redactions = choices

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def open_streams(self) -> int:
        """Open LLM streams whose chunk texts are kept."""
        return sum(1 for e in self.tracker.open.values() if e.tokens is not None)


def _handed(
    chunks: Sequence[ChunkInput], redactions: Mapping[int, ChoiceRedactions]
) -> tuple[dict[int, str] | None, dict[int, list[tuple[int, int]]] | None]:
    """Per choice that had something redacted: the stored text and the spans,
    from what the recording chain's redactor handed over."""
    by_choice: dict[int, list[str]] = {ch: [] for ch in redactions}
    for c in chunks:
        texts = by_choice.get(c.choice)
        if texts is not None:
            texts.append(c.text)
    stored = {
        ch: apply_spans("".join(by_choice[ch]), spans, repls)
        for ch, (spans, repls) in redactions.items()
    }
    masks = {ch: list(spans) for ch, (spans, _) in redactions.items()}
    return (stored or None), (masks or None)
