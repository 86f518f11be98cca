"""The one per-stream tracker of the recording chain: a stream's life, once.

Every observer of the chain (:mod:`~sniffer.record.metrics`,
:mod:`~sniffer.record.otlp`, :mod:`~sniffer.record.token_collector`), and the
sampler among its transforms (:mod:`~sniffer.record.sampling`), follows
each stream from its ``StreamOpened`` through its ``ChunkEvent``\\ s to its
``StreamClosed``. What they all need to know of it lives here, in one
:class:`Tracked` entry per open stream: the open (capture time of the request
head, dialect, label, the request's typed summary, server), the response
(status, streaming), the capture times of its first and last output chunk
(content, reasoning or a tool call: ``OUTPUT_KINDS``; followed only when a
reader asks for them, ``outputs``: metrics and OTLP do) and its close. Each
observer keeps only what is its own, in its slot of the entry (``metrics``,
``otlp``, ``tokens``; the sampler's decision in ``sampled``), so that one
eviction forgets a stream for all of them.

The chain owns the tracker (``RecordingChain.tracker``) and drives it, once
per batch, before the observers read it (each observer is handed it with its
``track_with``)::

    tracker.observe(events)      # opens, responses, output times, closes
    for observe in observers:    # each reads tracker.get(stream) / .closing
        observe(events)
    events = sampler(events)     # its decision in the stream's entry
    ...                          # the redactor, the other transforms
    tracker.release()            # the streams closed in the batch are gone

A stream closed in a batch keeps its entry (``closed`` set) until
:meth:`StreamTracker.release`, so every observer finds it while it reads the
batch. An observer used on its own (a test, a bench) drives a tracker of its
own the same way.

The per-chunk entry point is :meth:`StreamTracker.chunk` (stream id, kind,
capture time): what a stage that emits chunk events natively would call.

Eviction (the one rule): at most ``max_open`` (:data:`MAX_OPEN_STREAMS`,
100,000) streams are tracked at once, of every kind (LLM streams or not). A
stream opened when that many are tracked makes the **oldest** open one (by
open order) forgotten for every observer. Its later events are those of a
stream never seen: metrics count them under label and model ``none``, OTLP
exports no span for it, the token pass gets none of its text (no token
rows), the sampler keeps its chunk text (failing open loses no data), the
redactor writes what it holds of it
(:meth:`StreamTracker.take_evicted`).
Each eviction is counted: :attr:`StreamTracker.evicted`
(``RecordingChain.evicted_streams``), exposed as
``sparseety_streams_evicted_total``. A stream evicted and then continued is
redacted from then on without the look-behind of its earlier chunks.

The oldest goes, not the newest, because a stream open the longest is the one
likeliest never to close (a connection lost without a FIN or a timeout the
pipeline did not reach): refusing new streams instead would blind every
observer to all new traffic once such streams filled the table. (Until this
tracker, metrics and OTLP evicted the oldest, OTLP counting LLM streams only,
the sampler the oldest past 200,000, and the token collector refused new
streams; none of them counted it.)

Cost: one pass over each batch (a type test per chunk event; with
``outputs``, a look-up and two stores per output chunk), which the observers
pay back (OTLP without chunk events no longer looks at chunks at all).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from sniffer.core.events import (
    ChunkEvent,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
)
from sniffer.llm.dialects.base import OUTPUT_KINDS
from sniffer.llm.values import RequestSummary

__all__ = ["MAX_OPEN_STREAMS", "StreamTracker", "Tracked"]

#: Streams tracked at once (a stream never closed must not leak memory).
MAX_OPEN_STREAMS = 100_000


#: ``(events, entries, handlers, closing)``: :meth:`StreamTracker.observe`'s
#: pass with output times, natively (``sniffer._native.TrackOutputs``): each
#: chunk event's output time in its entry, each response's status in its
#: entry (:meth:`StreamTracker.response`), each close in its entry and
#: ``closing`` (:meth:`StreamTracker.closed`), every other event to its
#: exact type's handler in ``handlers`` (none: skipped).
TrackPass = Callable[
    [
        list[StoreEvent],
        dict[int, "Tracked"],
        dict[type, Callable[[Any], object]],
        list["Tracked"],
    ],
    None,
]


@functools.cache
def _native_outputs() -> TrackPass | None:
    """The native core's :data:`TrackPass` (~0.55k instructions per chunk
    less than the Python pass, and a Python call less per response and
    close: ~2k each), or None (the pure core)."""
    from sniffer import native_core

    native = getattr(native_core()[0], "TrackOutputs", None)
    if native is None:  # the pure core (or a module built before it)
        return None
    track: TrackPass = native(ChunkEvent, Tracked, OUTPUT_KINDS, StreamResponse, StreamClosed)
    return track


class Tracked:
    """One open stream: what every observer reads, and each observer's own slot."""

    __slots__ = (
        "closed",
        "dialect",
        "label",
        "metrics",
        "otlp",
        "request",
        "sampled",
        "server",
        "status",
        "stream",
        "streaming",
        "t_first_output",
        "t_last_output",
        "t_request",
        "tokens",
    )

    def __init__(self, ev: StreamOpened) -> None:
        self.stream = ev.stream
        #: capture time of the request head
        self.t_request = ev.ts
        #: None: not an LLM stream
        self.dialect: str | None = ev.dialect
        self.label: str | None = ev.label
        self.request: RequestSummary = ev.request
        self.server = ev.server
        #: from the ``StreamResponse`` (status None: recovered mid-way)
        self.status: int | None = None
        self.streaming = False
        #: capture times of the first and last chunk carrying output
        self.t_first_output: float | None = None
        self.t_last_output: float | None = None
        #: the ``StreamClosed``, once seen (the entry goes at ``release()``)
        self.closed: StreamClosed | None = None
        #: the sampler's decision: its chunk text is stored
        self.sampled = True
        #: each observer's own state of this stream (None until it sets it)
        self.metrics: Any = None
        self.otlp: Any = None
        self.tokens: Any = None

    @property
    def model(self) -> str | None:
        """The model the request asked for."""
        return self.request.model


class StreamTracker:
    """Open streams by id, bounded (see the module doc for the eviction rule)."""

    def __init__(self, max_open: int | None = None, *, outputs: bool = False) -> None:
        self.max_open = MAX_OPEN_STREAMS if max_open is None else max_open
        #: follow the output times in :meth:`observe` (set by the readers that
        #: use them, metrics and OTLP: the token collector alone does not pay
        #: for them per chunk)
        self.outputs = outputs
        #: stream id → entry, in open order (the oldest first)
        self.open: dict[int, Tracked] = {}
        #: entries closed in the current batch (gone at ``release()``)
        self.closing: list[Tracked] = []
        #: streams forgotten to make room, since start
        self.evicted = 0
        #: their ids since the last ``take_evicted()``, when someone asks for
        #: them (``collect_evicted``: the chain's redactor writes what it holds
        #: of them)
        self.collect_evicted = False
        self.evicted_ids: list[int] = []
        #: what :meth:`observe` does with the events that are not chunk
        #: events, by exact type (any other is not the tracker's: a
        #: connection's open and close cost no call)
        self._handlers: dict[type, Callable[[Any], object]] = {
            StreamOpened: self.opened,
            StreamResponse: self.response,
            StreamClosed: self.closed,
        }
        #: those the native pass hands over (it does responses and closes itself)
        self._opens: dict[type, Callable[[Any], object]] = {StreamOpened: self.opened}

    def get(self, stream: int) -> Tracked | None:
        return self.open.get(stream)

    def __len__(self) -> int:
        """Streams tracked and not closed."""
        entries = self.open
        return len(entries) - sum(1 for e in self.closing if entries.get(e.stream) is e)

    # -- per event -----------------------------------------------------------

    def opened(self, ev: StreamOpened) -> Tracked:
        entries = self.open
        # The same id again (never from one pipeline): the last open counts; a
        # closed one stays in ``closing`` for the observers.
        entries.pop(ev.stream, None)
        if len(entries) >= self.max_open:
            self._evict()
        e = entries[ev.stream] = Tracked(ev)
        return e

    def _evict(self) -> None:
        entries = self.open
        for stream, e in entries.items():
            if e.closed is None:  # a stream closed in this batch is read still
                del entries[stream]
                self.evicted += 1
                if self.collect_evicted:
                    self.evicted_ids.append(stream)
                return

    def chunk(self, stream: int, kind: str, ts: float) -> None:
        """A chunk event: its output time, when it carries output."""
        if kind in OUTPUT_KINDS:
            e = self.open.get(stream)
            if e is not None:
                if e.t_first_output is None:
                    e.t_first_output = ts
                e.t_last_output = ts

    def response(self, ev: StreamResponse) -> None:
        e = self.open.get(ev.stream)
        if e is not None:
            e.status = ev.status
            e.streaming = ev.streaming

    def closed(self, ev: StreamClosed) -> Tracked | None:
        e = self.open.get(ev.stream)
        if e is not None and e.closed is None:
            e.closed = ev
            self.closing.append(e)
        return e

    # -- per batch -----------------------------------------------------------

    def observe(self, events: Iterable[StoreEvent]) -> None:
        """Follow one batch of store events (in pipeline order)."""
        entries = self.open
        handlers = self._handlers
        if self.outputs and type(events) is list:
            native = _native_outputs()
            if native is not None:  # all but the opens natively
                native(events, entries, self._opens, self.closing)
                return
        if not self.outputs:  # the chunk events are skipped: one test each
            for ev in events:
                if type(ev) is not ChunkEvent:
                    handle = handlers.get(type(ev))
                    if handle is not None:
                        handle(ev)
            return
        for ev in events:
            # (``type(ev) is``: mypy narrows on it, and no assert per chunk)
            if type(ev) is ChunkEvent:
                if ev.kind in OUTPUT_KINDS:  # self.chunk(), inlined
                    e = entries.get(ev.stream)
                    if e is not None:
                        if e.t_first_output is None:
                            e.t_first_output = ev.ts
                        e.t_last_output = ev.ts
            else:
                handle = handlers.get(type(ev))
                if handle is not None:
                    handle(ev)

    def release(self) -> None:
        """Forget the streams closed in this batch (every observer has read it)."""
        closing = self.closing
        if closing:
            entries = self.open
            for e in closing:
                if entries.get(e.stream) is e:
                    del entries[e.stream]
            closing.clear()

    def take_evicted(self) -> list[int]:
        """The ids of the streams evicted since the last call."""
        ids, self.evicted_ids = self.evicted_ids, []
        return ids
