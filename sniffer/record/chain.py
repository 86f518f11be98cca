"""The recording chain: what happens to the pipeline's store events before they are stored.

Both drivers (``sparseety replay`` and ``sparseety run``) build it once from
their configuration and hand it every batch of store events::

    pipeline ─► observers ─► transforms ─► writer
                (metrics,     (sampler,
                 token         redactor)
                 collector,
                 OTLP export)

* The **tracker** (:class:`~sniffer.record.tracker.StreamTracker`, the
  chain's) follows each stream's life first, once per batch: its open,
  response, first and last output times and close, bounded by one eviction
  rule (see :mod:`sniffer.record.tracker`). The observers below read it and
  keep only what is their own, and so does the sampler (its decision); a
  stream it evicts is forgotten by all of them at once, and by the redactor,
  which writes what it held of it.
* **Observers** see every event as captured: metrics count unsampled streams
  too, and the token collector keeps the text the server sent (token counts
  are computed on it, before redaction rewrites what is stored).
* The **OTLP exporter** (:mod:`sniffer.record.otlp`, when given) queues each
  closed LLM stream for export as a span and GenAI metrics (never blocking);
  the token pass hands it each stream's token figures.
* **Transforms** decide what is written, in order: the sampler drops the
  chunk text of streams it does not keep, then the redactor rewrites what is
  left.
* The **writer** (:class:`~sniffer.store.writer.StoreWriter`) batches the rows.

``tokenize()`` runs the token pass on the streams the collector saw close and
feeds its results back (token metrics; anomalies to the sampler's boost).

A failing observer or transform never stops a capture when the driver passes
``on_error`` (the daemon logs and counts it): an observer's failure costs that
observer the batch; a transform's failure costs the batch (it is not written
unchanged, since the transform was meant to change it). Without ``on_error``
(replay) the exception propagates. Writer errors (``StoreError``) always
propagate: the driver decides what to do with the rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sniffer.core.events import StoreEvent
from sniffer.record.redact import Redactor, StreamRedactor
from sniffer.record.sampling import Sampler
from sniffer.record.token_collector import TokenCollector
from sniffer.record.tracker import StreamTracker
from sniffer.store.writer import StoreWriter

if TYPE_CHECKING:
    from sniffer.llm.tokens import StreamInput, TokenizerRegistry
    from sniffer.record.metrics import Metrics
    from sniffer.record.otlp import OtlpExporter
    from sniffer.record.tokenize_pass import TokenizeResult
    from sniffer.store.db import Store

__all__ = [
    "ErrorHook",
    "Observer",
    "RecordingChain",
    "RecordingConfig",
    "RecordingOptions",
    "Transform",
]

#: Sees every batch of store events as captured.
Observer = Callable[[list[StoreEvent]], None]
#: Returns the batch to write instead (fewer events, rewritten events).
Transform = Callable[[list[StoreEvent]], list[StoreEvent]]
#: ``on_error(role, name, exc)``: role is "observer" or "transform".
ErrorHook = Callable[[str, str, Exception], None]


class RecordingConfig(Protocol):
    """What the chain reads from a configuration. The daemon's
    :class:`~sniffer.runtime.config.Config` provides it; replay builds a
    :class:`RecordingOptions` from its flags."""

    @property
    def sample_rate(self) -> float: ...
    @property
    def boost_threshold(self) -> int: ...
    @property
    def boost_window(self) -> float: ...
    @property
    def boost_period(self) -> float: ...
    @property
    def redact(self) -> bool: ...
    @property
    def redact_patterns(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def tokens(self) -> bool: ...
    @property
    def tokenizers(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def default_tokenizer(self) -> str: ...


@dataclass(frozen=True)
class RecordingOptions:
    """A :class:`RecordingConfig` on its own (the defaults record everything,
    redacted, with token rows)."""

    sample_rate: float = 1.0
    boost_threshold: int = 0
    boost_window: float = 60.0
    boost_period: float = 600.0
    redact: bool = True
    redact_patterns: tuple[tuple[str, str], ...] = ()
    tokens: bool = True
    tokenizers: tuple[tuple[str, str], ...] = ()
    default_tokenizer: str = ""


def _name(fn: object) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


class RecordingChain:
    """Observers, then transforms, then the writer; see the module doc.

    ``writer`` may be given later with :meth:`attach` (the daemon opens the
    database when it starts; each parallel replay worker has its own writer).
    ``clock`` gives the capture time used by the sampler's boost (the daemon
    passes its last capture timestamp).
    """

    def __init__(
        self,
        writer: StoreWriter | None = None,
        *,
        sampler: Sampler | None = None,
        redactor: Redactor | None = None,
        tokens: TokenizerRegistry | None = None,
        metrics: Metrics | None = None,
        otlp: OtlpExporter | None = None,
        observers: Iterable[Observer] = (),
        transforms: Iterable[Transform] = (),
        on_error: ErrorHook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writer = writer
        self.sampler = sampler
        self.redactor = redactor
        self.tokens = tokens
        self.metrics = metrics
        self.otlp = otlp
        self.on_error = on_error
        self.clock = clock
        #: every stream's life, read by the observers (one eviction rule)
        self.tracker = StreamTracker()
        #: keeps the text as sent for the token pass (only with ``tokens``)
        # token ids are masked where redaction removed text (the redactor hands
        # its spans over; with a sampler before it the token pass replays them)
        self.collector = TokenCollector(redactor=redactor) if tokens is not None else None
        #: redaction with a bounded look-behind per (stream, choice)
        self.stream_redactor = StreamRedactor(redactor) if redactor is not None else None
        self._collector_lock = threading.Lock()  # observe (capture path) vs take (token pass)
        self._seen_redactions: dict[str, int] = {}
        self.observers: list[Observer] = []
        if metrics is not None:
            metrics.track_with(self.tracker)
            self.observers.append(metrics.observe)
        if self.collector is not None:
            self.collector.track_with(self.tracker)
            self.observers.append(self._collect)
        if otlp is not None:
            otlp.track_with(self.tracker)
            self.observers.append(otlp.observe)
        self.observers.extend(observers)
        self.transforms: list[Transform] = []
        if sampler is not None:
            sampler.track_with(self.tracker)
            self.transforms.append(self._sample)
        if redactor is not None:
            self.transforms.append(self._redact)
        self.transforms.extend(transforms)
        #: the tracker is driven when something reads it: metrics, OTLP, the
        #: token collector, the sampler, or the redactor (its evictions)
        readers = (metrics, otlp, self.collector, sampler, self.stream_redactor)
        self._tracked = any(r is not None for r in readers)
        if self.stream_redactor is not None and self._tracked:
            self.tracker.collect_evicted = True  # the redactor writes what it held of them
        if self.collector is not None and self.stream_redactor is not None and sampler is None:
            # The redactor sees every chunk text as sent (no sampler blanks any
            # before it): it hands the collector what it redacted in each closed
            # stream, so the token pass does not replay its look-behind.
            self.stream_redactor.track_redactions = True

    @classmethod
    def from_config(
        cls,
        cfg: RecordingConfig,
        writer: StoreWriter | None = None,
        *,
        metrics: Metrics | None = None,
        otlp: OtlpExporter | None = None,
        tokens: TokenizerRegistry | None = None,
        on_error: ErrorHook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> RecordingChain:
        """The chain ``cfg`` asks for: sampling when ``sample_rate < 1`` or a
        boost is set, redaction (off when ``redact`` is false), the token
        collector when ``tokens`` is on (``tokens`` overrides the registry built
        from ``tokenizers``/``default_tokenizer``; nothing is loaded yet: the
        driver calls ``chain.tokens.preload()`` when a bad tokenizer should
        fail). ``metrics``, when given, is the first observer; ``otlp`` (an
        :class:`~sniffer.record.otlp.OtlpExporter`) observes after the collector."""
        sampler = None
        if cfg.sample_rate < 1.0 or cfg.boost_threshold > 0:
            sampler = Sampler(
                cfg.sample_rate,
                boost_threshold=cfg.boost_threshold or None,
                boost_window=cfg.boost_window,
                boost_period=cfg.boost_period,
            )
        # The configuration holds (name, regex) as the user wrote NAME=REGEX;
        # Redactor takes (regex, name).
        redactor = Redactor(
            [(regex, name) for name, regex in cfg.redact_patterns], enabled=cfg.redact
        )
        registry = None
        if cfg.tokens:
            if tokens is not None:
                registry = tokens
            else:
                from sniffer.llm.registry import TokenizerRegistry, TokenizerSpec

                registry = TokenizerRegistry(
                    [TokenizerSpec(p, src) for p, src in cfg.tokenizers],
                    default=cfg.default_tokenizer or None,
                )
        return cls(
            writer,
            sampler=sampler,
            redactor=redactor,
            tokens=registry,
            metrics=metrics,
            otlp=otlp,
            on_error=on_error,
            clock=clock,
        )

    # -- wiring ------------------------------------------------------------

    def attach(self, writer: StoreWriter) -> None:
        """Write to ``writer`` from now on."""
        self.writer = writer

    def _writer(self) -> StoreWriter:
        if self.writer is None:
            raise RuntimeError("recording chain has no writer (attach one first)")
        return self.writer

    # -- the chain's own steps ---------------------------------------------

    def _collect(self, events: list[StoreEvent]) -> None:
        assert self.collector is not None
        with self._collector_lock:
            self.collector.observe(events)

    def _sample(self, events: list[StoreEvent]) -> list[StoreEvent]:
        assert self.sampler is not None
        events = self.sampler.filter(events)
        if self.metrics is not None:
            self.metrics.set_sample_rate(self.sampler.effective_rate(self.clock()))
        return events

    def _redact(self, events: list[StoreEvent]) -> list[StoreEvent]:
        redactor = self.redactor
        assert redactor is not None and self.stream_redactor is not None
        evicted = self.tracker.take_evicted()
        if evicted:  # their close may never come: write what is held of them
            events = self.stream_redactor.forget(evicted) + self.stream_redactor.events(events)
        else:
            events = self.stream_redactor.events(events)
        if self.stream_redactor.track_redactions and self.collector is not None:
            clean, redacted = self.stream_redactor.take_redactions()
            if clean or redacted:
                with self._collector_lock:
                    self.collector.hand_redactions(clean, redacted)
        if self.metrics is not None and redactor.counts:
            seen = self._seen_redactions
            delta = {k: v - seen.get(k, 0) for k, v in redactor.counts.items()}
            seen.update(redactor.counts)
            self.metrics.add_redactions({k: v for k, v in delta.items() if v})
        return events

    # -- use -----------------------------------------------------------------

    def write(self, events: list[StoreEvent]) -> None:
        """Record one batch: every observer, then the transforms, then the writer.
        Raises ``StoreError`` when the writer does."""
        writer = self._writer()
        on_error = self.on_error
        tracker = self.tracker
        tracked = self._tracked
        if tracked:
            tracker.observe(events)
        try:
            for observe in self.observers:
                if on_error is None:
                    observe(events)
                    continue
                try:
                    observe(events)
                except Exception as exc:
                    on_error("observer", _name(observe), exc)
            for transform in self.transforms:
                if on_error is None:
                    events = transform(events)
                    continue
                try:
                    events = transform(events)
                except Exception as exc:
                    on_error("transform", _name(transform), exc)
                    return  # never write what the transform was meant to change
        finally:
            if tracked:
                tracker.release()  # every observer and transform has read the batch
        writer.write_many(events)

    def flush(self) -> None:
        """Write the rows held by the writer (raises ``StoreError``)."""
        self._writer().flush()
        if self.metrics is not None:
            self.metrics.mark_flush(time.time())

    def drain(self) -> None:
        """Write what the redaction look-behind still holds (end of a capture)."""
        if self.stream_redactor is not None:
            held = self.stream_redactor.flush()
            if held:
                self._writer().write_many(held)

    def close(self) -> None:
        """Drain, flush and close the writer (raises ``StoreError``)."""
        self.drain()
        self._writer().close()

    @property
    def tokens_ready(self) -> int:
        """Closed streams waiting for the token pass."""
        if self.collector is None:
            return 0
        with self._collector_lock:
            return self.collector.ready

    def tokenize(
        self,
        *,
        limit: int | None = None,
        max_chunks: int | None = None,
        store: Store | None = None,
    ) -> TokenizeResult:
        """Tokenize (at most ``limit`` streams, ``max_chunks`` chunks past the
        first stream) closed streams the collector holds and write their token
        rows (into ``store``, default the writer's); feed token metrics and
        the sampler's anomaly boost."""
        return self.tokenize_inputs(self.take_token_inputs(limit, max_chunks), store=store)

    def take_token_inputs(
        self, limit: int | None = None, max_chunks: int | None = None
    ) -> list[StreamInput]:
        """Take (at most ``limit`` streams, ``max_chunks`` chunks past the first
        stream) closed streams from the collector, for :meth:`tokenize_inputs`
        here or in another process (a parallel replay's workers hand them to
        a token process as plain tuples: ``sniffer.runtime.replay._to_wire``)."""
        if self.collector is None:
            return []
        with self._collector_lock:
            return self.collector.take(limit, max_chunks)

    def tokenize_inputs(
        self, inputs: list[StreamInput], *, store: Store | None = None
    ) -> TokenizeResult:
        """The token pass on ``inputs`` (:meth:`take_token_inputs`): write their
        token rows (into ``store``, default the writer's); feed token metrics
        and the sampler's anomaly boost."""
        # The token pass loads at the first pass, not before the first packet.
        from sniffer.llm.tokens import kind_counts
        from sniffer.record.tokenize_pass import TokenizeResult, tokenize_inputs

        if self.collector is None or self.tokens is None or not inputs:
            return TokenizeResult()
        result, rows = tokenize_inputs(store or self._writer().store, self.tokens, inputs)
        metrics, sampler, otlp = self.metrics, self.sampler, self.otlp
        if metrics is None and sampler is None and otlp is None:
            return result
        for r in rows:
            if r.error is not None:
                if otlp is not None:  # the span waits for this: send it without figures
                    otlp.observe_tokens(r.stream_id, output_tokens=None, prompt_tokens=None)
                continue
            if otlp is not None:
                # (one choice, the usual case: its own tuple, not a copy)
                choices = r.choices
                per_chunk = (
                    choices[0].chunk_counts
                    if len(choices) == 1
                    else [n for c in choices for n in c.chunk_counts]
                )
                otlp.observe_tokens(
                    r.stream_id,
                    output_tokens=r.output_count,
                    prompt_tokens=len(r.prompt_ids) if r.prompt_ids is not None else None,
                    tokens_per_chunk=per_chunk,
                )
            kinds = kind_counts(r.anomalies)
            if metrics is not None:
                metrics.observe_tokens(
                    r.stream_id,
                    output_tokens=r.output_count,
                    prompt_tokens=len(r.prompt_ids or ()),
                    # their distribution: a bucket look-up per distinct count
                    chunks_by_tokens=r.tokens_per_chunk,
                    anomalies=kinds,
                )
            if sampler is not None and kinds:
                now = self.clock()
                for kind, n in kinds.items():
                    sampler.note_anomaly(kind, now, n)
        return result

    @property
    def evicted_streams(self) -> int:
        """Open streams the tracker forgot to make room (see :mod:`sniffer.record.tracker`)."""
        return self.tracker.evicted

    @property
    def redactions(self) -> int:
        """Matches the redactor replaced so far."""
        return sum(self.redactor.counts.values()) if self.redactor is not None else 0
