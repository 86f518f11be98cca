"""OpenTelemetry export: one span per closed LLM stream and the GenAI metrics, over OTLP/HTTP.

An observer in the recording chain (:mod:`sniffer.record.chain`)::

    observe(events)   capture path: O(1) per event, never blocks
        │  closed stream → a small record
        ▼
    bounded queue ──► export thread ──► OpenTelemetry SDK ──► OTLP/HTTP exporter
    (full: dropped,     (spans, GenAI     (TracerProvider,       (/v1/traces,
     counted)            histograms)       MeterProvider)         /v1/metrics)

Names follow the OpenTelemetry semantic conventions **v1.44.0** (the GenAI
registry, status *Development*; :data:`SCHEMA_URL` is set on the tracer and
the meter). Span ``{gen_ai.operation.name} {gen_ai.request.model}``, kind
CLIENT (what the conventions advise for inference spans), from the request
head's capture time to the stream's end; per-chunk span events only when
``chunk_events`` is on.

When the chain tokenizes (``tokens`` on), a closed stream's span waits for
its token figures (:meth:`OtlpExporter.observe_tokens`, called by the token
pass) for at most ``token_wait`` seconds, then goes without them.

Export never slows capture: the capture side only appends to a bounded queue
(``queue_size`` items; a full queue drops the item and counts it in
``sparseety_otlp_dropped_total``); the export itself (HTTP, retries) runs on
the export thread. A failed export is counted in
``sparseety_otlp_export_failures_total{signal}`` and logged at most once per
``log_interval`` seconds (the SDK's own log lines are silenced).

The SDK is an optional dependency (``pip install 'sparseety[otlp]'``): this
module imports it only when an exporter is built, and raises
:class:`OtlpUnavailable` (saying what to install) when it is missing.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sniffer.core.events import ChunkEvent, StoreEvent, StreamClosed, StreamState
from sniffer.llm.dialects.base import OUTPUT_KINDS
from sniffer.llm.values import ACCEPT_LENGTH_BUCKETS, ACCEPTANCE_RATE_BUCKETS, SpecDecode
from sniffer.record.otlp_setup import (
    INSTALL_HINT,
    OtlpUnavailable,
    parse_headers,
    resolve_endpoint,
    resolve_headers,
)
from sniffer.record.tracker import StreamTracker, Tracked

if TYPE_CHECKING:
    from sniffer.record.metrics import Metrics

__all__ = [
    "DURATION_BUCKETS",
    "SCHEMA_URL",
    "SEMCONV_VERSION",
    "TOKEN_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "OtlpExporter",
    "OtlpOptions",
    "OtlpUnavailable",
    "StreamRecord",
    "operation_and_provider",
    "parse_headers",
    "resolve_endpoint",
    "resolve_headers",
]

SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# Explicit bucket boundaries the GenAI conventions advise for each metric.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

#: dialect → (gen_ai.operation.name, gen_ai.provider.name or None when unknown)
DIALECTS: dict[str, tuple[str, str | None]] = {
    "openai.chat": ("chat", None),
    "openai.completions": ("text_completion", None),
    "openai.responses": ("chat", None),
    "anthropic.messages": ("chat", "anthropic"),
    "ollama.chat": ("chat", None),
    "ollama.generate": ("text_completion", None),
    "tgi.generate": ("text_completion", None),
}
#: Cap on per-stream chunk events kept for span events, and on the
#: tokens-per-chunk list attribute.
MAX_CHUNK_EVENTS = 1000
MAX_TOKENS_PER_CHUNK = 4096

LogFn = Callable[..., None]


def operation_and_provider(dialect: str) -> tuple[str, str | None]:
    """``gen_ai.operation.name`` and ``gen_ai.provider.name`` (None: not known from
    the wire) of a dialect. An OpenAI-compatible API says nothing of who runs it,
    so only Anthropic's own API names its provider."""
    return DIALECTS.get(dialect, ("chat", None))


def _signal_url(base: str, signal: str) -> str:
    base = base.rstrip("/")
    for sig in ("/v1/traces", "/v1/metrics"):
        if base.endswith(sig):  # a signal URL given: keep its base
            base = base[: -len(sig)]
    return f"{base}/v1/{signal}"


@dataclass(frozen=True)
class OtlpOptions:
    """What the exporter needs (the daemon builds it from its ``[otlp]`` table)."""

    endpoint: str  # base URL, e.g. http://collector:4318 (/v1/traces, /v1/metrics appended)
    headers: Mapping[str, str] = field(default_factory=dict)
    node: str = ""
    chunk_events: bool = False
    queue_size: int = 4096  # closed streams (and token figures) waiting for export
    timeout: float = 10.0  # seconds per export request, retries included
    metrics_interval: float = 10.0  # seconds between metric exports
    log_interval: float = 60.0  # an export failure is logged at most once per interval
    token_wait: float = 30.0  # seconds a span waits for its token figures
    service_name: str = "sparseety"
    #: replay: wait (up to ``timeout``) for room in the queue instead of dropping,
    #: while the collector answers (a failing collector turns it back to dropping)
    block: bool = False


# ---------------------------------------------------------------- records


@dataclass
class _Chunk:
    ts: float
    choice: int
    index: int
    kind: str
    chars: int
    finish_reason: str | None


@dataclass
class StreamRecord:
    """What one closed LLM stream exports (built on the capture path, pure data)."""

    stream: int
    t_request: float
    t_end: float
    dialect: str
    model: str | None
    label: str | None
    server: tuple[str, int]
    request_stream: bool | None
    streaming: bool = False
    status: int | None = None
    state: str = "open"
    reason: str = ""
    gap: bool = False
    chunk_count: int = 0
    event_count: int = 0
    t_first_content: float | None = None
    t_first_output: float | None = None
    t_last_output: float | None = None
    finish_reasons: tuple[str, ...] = ()
    usage_input: int | None = None
    usage_output: int | None = None
    #: the server-reported speculative decoding (vLLM, llama.cpp, SGLang)
    speculative: SpecDecode | None = None
    response_id: str | None = None
    response_model: str | None = None
    error: str | None = None
    chunks: list[_Chunk] = field(default_factory=list)
    # from the token pass
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    tokens_per_chunk: tuple[int, ...] = ()
    waits_tokens: bool = False

    @property
    def error_type(self) -> str | None:
        """``error.type``: the HTTP status for an error reply, else the state
        of a stream that did not complete (``truncated``, ``client_abort``,
        ``gap``, ``error``); None when complete."""
        if self.state == "complete":
            return None
        if self.status is not None and self.status >= 400:
            return str(self.status)
        return self.state


@dataclass(frozen=True)
class _Tokens:
    stream: int
    output_tokens: int | None
    prompt_tokens: int | None
    tokens_per_chunk: tuple[int, ...]


class _Records:
    """Closed LLM streams → :class:`StreamRecord` (pure). What a stream's record
    needs of its life comes from the recording chain's
    :class:`~sniffer.record.tracker.StreamTracker` at its close; the exporter
    keeps nothing per open stream of its own but, with ``chunk_events``, its
    chunks (the ``Tracked.otlp`` slot)."""

    def __init__(self, *, chunk_events: bool, wait_tokens: bool) -> None:
        self.chunk_events = chunk_events
        self.wait_tokens = wait_tokens

    def observe(self, events: Iterable[StoreEvent], tracker: StreamTracker) -> list[StreamRecord]:
        if self.chunk_events:
            entries = tracker.open
            for ev in events:
                if type(ev) is ChunkEvent:
                    e = entries.get(ev.stream)
                    if (
                        e is not None
                        and e.dialect is not None
                        and (ev.kind in OUTPUT_KINDS or ev.finish_reason)
                    ):
                        self._chunk(e, ev)
        out: list[StreamRecord] = []
        for e in tracker.closing:
            if e.dialect is None:  # not an LLM stream
                continue
            assert e.closed is not None
            r = _record(e, self.wait_tokens)
            _close(r, e.closed)
            out.append(r)
        return out

    @staticmethod
    def _chunk(e: Tracked, ev: ChunkEvent) -> None:
        chunks: list[_Chunk] | None = e.otlp
        if chunks is None:
            chunks = e.otlp = []
        if len(chunks) < MAX_CHUNK_EVENTS:
            chunks.append(
                _Chunk(
                    ev.ts,
                    ev.choice,
                    ev.chunk_index,
                    ev.kind,
                    len(ev.text) + len(ev.reasoning),
                    ev.finish_reason,
                )
            )


def _record(e: Tracked, wait_tokens: bool) -> StreamRecord:
    assert e.dialect is not None
    return StreamRecord(
        stream=e.stream,
        t_request=e.t_request,
        t_end=e.t_request,
        dialect=e.dialect,
        model=e.request.model,
        label=e.label,
        server=e.server,
        request_stream=e.request.stream,
        streaming=e.streaming,
        status=e.status,
        t_first_output=e.t_first_output,
        t_last_output=e.t_last_output,
        chunks=e.otlp if e.otlp is not None else [],
        waits_tokens=wait_tokens,
    )


def _close(r: StreamRecord, ev: StreamClosed) -> None:
    from sniffer.record.metrics import stream_state  # prometheus_client: not at start-up

    r.t_end = ev.ts
    r.state = stream_state(ev)
    if ev.state is StreamState.OPEN:
        r.state = "truncated"
    r.reason = ev.reason
    r.gap = ev.gap
    r.chunk_count = ev.chunk_count
    r.event_count = ev.event_count
    r.t_first_content = ev.t_first_content
    r.finish_reasons = tuple(f for _, f in sorted(ev.finish_reasons))
    if ev.usage is not None:
        r.usage_input, r.usage_output = ev.usage.prompt_tokens, ev.usage.completion_tokens
        r.speculative = ev.usage.speculative
    else:
        r.usage_input = r.usage_output = None
        r.speculative = None
    r.error = ev.error
    r.response_id = ev.response_id
    r.response_model = ev.response_model


def span_name(r: StreamRecord) -> str:
    op, _ = operation_and_provider(r.dialect)
    return f"{op} {r.model}" if r.model else op


def span_attributes(r: StreamRecord, node: str) -> dict[str, Any]:
    """The span's attributes (GenAI conventions, then ours under ``sparseety.*``)."""
    op, provider = operation_and_provider(r.dialect)
    a: dict[str, Any] = {"gen_ai.operation.name": op}
    if provider is not None:
        a["gen_ai.provider.name"] = provider
    if r.model is not None:
        a["gen_ai.request.model"] = r.model
    if r.response_model is not None:
        a["gen_ai.response.model"] = r.response_model
    streamed = r.request_stream if r.request_stream is not None else r.streaming
    a["gen_ai.request.stream"] = bool(streamed)
    if r.response_id is not None:
        a["gen_ai.response.id"] = r.response_id
    if r.finish_reasons:
        a["gen_ai.response.finish_reasons"] = list(r.finish_reasons)
    inp = r.usage_input if r.usage_input is not None else r.prompt_tokens
    outp = r.usage_output if r.usage_output is not None else r.output_tokens
    if inp is not None:
        a["gen_ai.usage.input_tokens"] = inp
    if outp is not None:
        a["gen_ai.usage.output_tokens"] = outp
    if r.streaming and r.t_first_content is not None:
        a["gen_ai.response.time_to_first_chunk"] = max(0.0, r.t_first_content - r.t_request)
    host, port = r.server
    a["server.address"] = host
    a["server.port"] = port
    err = r.error_type
    if err is not None:
        a["error.type"] = err
    if r.label is not None:
        a["sparseety.label"] = r.label
    if node:
        a["sparseety.node"] = node
    a["sparseety.stream_id"] = r.stream
    a["sparseety.dialect"] = r.dialect
    a["sparseety.state"] = r.state
    if r.reason:
        a["sparseety.reason"] = r.reason[:256]
    a["sparseety.gap"] = r.gap
    a["sparseety.chunk_count"] = r.chunk_count
    a["sparseety.event_count"] = r.event_count
    if r.output_tokens is not None:
        a["sparseety.output_tokens"] = r.output_tokens
    if r.prompt_tokens is not None:
        a["sparseety.prompt_tokens"] = r.prompt_tokens
    if r.tokens_per_chunk:
        a["sparseety.tokens_per_chunk"] = list(r.tokens_per_chunk[:MAX_TOKENS_PER_CHUNK])
        a["sparseety.tokens_per_chunk.mean"] = sum(r.tokens_per_chunk) / len(r.tokens_per_chunk)
    if r.status is not None:
        a["http.response.status_code"] = r.status
    a.update(spec_attributes(r.speculative))
    return a


def spec_attributes(spec: SpecDecode | None) -> dict[str, Any]:
    """The server-reported speculative decoding as span attributes
    (``sparseety.spec.*``); none when the server reported nothing."""
    if spec is None:
        return {}
    a: dict[str, Any] = {"sparseety.spec.source": spec.source}
    for name, value in (
        ("draft_tokens", spec.draft_tokens),
        ("accepted_tokens", spec.accepted_tokens),
        ("steps", spec.steps),
        ("accept_length", spec.accept_length),
        ("acceptance_rate", spec.acceptance_rate),
    ):
        if value is not None:
            a[f"sparseety.spec.{name}"] = value
    return a


def metric_attributes(r: StreamRecord) -> dict[str, Any]:
    op, provider = operation_and_provider(r.dialect)
    a: dict[str, Any] = {"gen_ai.operation.name": op}
    if provider is not None:
        a["gen_ai.provider.name"] = provider
    if r.model is not None:
        a["gen_ai.request.model"] = r.model
    if r.response_model is not None:
        a["gen_ai.response.model"] = r.response_model
    a["server.address"], a["server.port"] = r.server
    if r.label is not None:
        a["sparseety.label"] = r.label
    return a


def _ns(ts: float) -> int:
    return int(ts * 1e9)


# ---------------------------------------------------------------- exporter


class OtlpExporter:
    """Spans and GenAI metrics of closed LLM streams to an OTLP/HTTP collector.

    ``observe`` is the chain observer; ``observe_tokens`` is fed by the token
    pass; ``close`` exports what is left (bounded by ``timeout``) and shuts the
    SDK down. ``log(level, event, **fields)`` is the daemon's logger;
    ``metrics`` (Prometheus) counts drops and export failures.
    """

    def __init__(
        self,
        options: OtlpOptions,
        *,
        log: LogFn | None = None,
        metrics: Metrics | None = None,
        wait_tokens: bool = False,
    ) -> None:
        self.options = options
        self._log = log
        self._prom = metrics
        self._records = _Records(chunk_events=options.chunk_events, wait_tokens=wait_tokens)
        #: open streams: the tracker this observer reads (its own until the
        #: recording chain shares its tracker, see :meth:`track_with`)
        self.tracker = StreamTracker(outputs=True)
        self._drives = True
        self._queue: queue.Queue[StreamRecord | _Tokens] = queue.Queue(max(1, options.queue_size))
        self._lock = threading.Lock()  # the tracker (capture path)
        self._count_lock = threading.Lock()  # counters (capture, token, export, reader threads)
        self.dropped = 0
        self.exported_spans = 0
        self.failures: dict[str, int] = {"traces": 0, "metrics": 0}
        self._unlogged: dict[str, int] = {"traces": 0, "metrics": 0}
        self._last_log: dict[str, float] = {}
        self._pending: dict[int, tuple[float, StreamRecord]] = {}
        self._early_tokens: dict[int, _Tokens] = {}
        self._stop = threading.Event()
        self._closed = False
        self._healthy = True
        self._sdk = _Sdk(self, options)  # raises OtlpUnavailable without the SDK
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    # -- capture side (never blocks) --------------------------------------

    def track_with(self, tracker: StreamTracker) -> None:
        """Read ``tracker`` (the recording chain's, which drives it) instead of
        a tracker of its own. Call before the first event."""
        self.tracker = tracker
        self._drives = False
        tracker.outputs = True  # this reader uses them

    def observe(self, events: list[StoreEvent]) -> None:
        """Chain observer: queue each closed LLM stream for export."""
        tracker = self.tracker
        with self._lock:
            if self._drives:
                tracker.observe(events)
            records = self._records.observe(events, tracker)
            if self._drives:
                tracker.release()
        for r in records:
            self._put(r)

    def observe_tokens(
        self,
        stream: int,
        *,
        output_tokens: int | None,
        prompt_tokens: int | None,
        tokens_per_chunk: Sequence[int] = (),
    ) -> None:
        """Token figures of a closed stream (from the token pass)."""
        self._put(_Tokens(stream, output_tokens, prompt_tokens, tuple(tokens_per_chunk)))

    def _put(self, item: StreamRecord | _Tokens) -> None:
        try:
            if self.options.block and self._healthy:
                self._queue.put(item, timeout=self.options.timeout)
            else:
                self._queue.put_nowait(item)
        except queue.Full:
            with self._count_lock:
                self.dropped += 1
            if self._prom is not None:
                self._prom.add_otlp_drops(1)

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    # -- export thread ------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                self._expire(time.monotonic())
                continue
            batch = [item]
            while len(batch) < 512:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._handle(batch)
            self._expire(time.monotonic())
        self._drain()

    def _drain(self) -> None:
        batch: list[StreamRecord | _Tokens] = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._handle(batch)
        self._expire(float("inf"))

    def _handle(self, batch: list[StreamRecord | _Tokens]) -> None:
        ready: list[StreamRecord] = []
        now = time.monotonic()
        for item in batch:
            if isinstance(item, _Tokens):
                pending = self._pending.pop(item.stream, None)
                if pending is None:
                    if len(self._early_tokens) < 10_000:
                        self._early_tokens[item.stream] = item
                    continue
                ready.append(_with_tokens(pending[1], item))
            elif item.waits_tokens:
                early = self._early_tokens.pop(item.stream, None)
                if early is not None:
                    ready.append(_with_tokens(item, early))
                else:
                    self._pending[item.stream] = (now, item)
            else:
                ready.append(item)
        if ready:
            self._emit(ready)

    def _expire(self, now: float) -> None:
        wait = self.options.token_wait
        late = [s for s, (t0, _) in self._pending.items() if now - t0 >= wait]
        if late:
            self._emit([self._pending.pop(s)[1] for s in late])

    def _emit(self, records: list[StreamRecord]) -> None:
        try:
            self._sdk.emit(records)
        except Exception as exc:  # never kill the export thread
            self._note_failure("traces", f"{type(exc).__name__}: {exc}")

    # -- failures -----------------------------------------------------------

    def _note_failure(self, signal: str, detail: str = "") -> None:
        if signal == "traces":
            self._healthy = False
        if self._prom is not None:
            self._prom.add_otlp_failure(signal)
        with self._count_lock:
            self.failures[signal] = self.failures.get(signal, 0) + 1
            self._unlogged[signal] = self._unlogged.get(signal, 0) + 1
            now = time.monotonic()
            last = self._last_log.get(signal)
            if last is not None and now - last < self.options.log_interval:
                return
            self._last_log[signal] = now
            failures, self._unlogged[signal] = self._unlogged[signal], 0
        if self._log is not None:
            self._log(
                "warning",
                "otlp-export-failed",
                signal=signal,
                endpoint=self.options.endpoint,
                failures=failures,
                detail=detail or "collector unreachable or refused the batch",
                next_log_in=f"{self.options.log_interval:g}s",
            )

    # -- stop ---------------------------------------------------------------

    def close(self) -> None:
        """Export what is queued or pending, then shut the SDK down (bounded)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(self.options.timeout + 5.0)
        self._sdk.shutdown()
        if self._log is not None:
            self._log(
                "info",
                "otlp-stopped",
                spans=self.exported_spans,
                dropped=self.dropped,
                failed_span_batches=self.failures.get("traces", 0),
                failed_metric_batches=self.failures.get("metrics", 0),
            )


def _with_tokens(r: StreamRecord, t: _Tokens) -> StreamRecord:
    r.output_tokens = t.output_tokens
    r.prompt_tokens = t.prompt_tokens
    r.tokens_per_chunk = t.tokens_per_chunk
    return r


class _Sdk:
    """The OpenTelemetry SDK side: providers, instruments, guarded exporters."""

    def __init__(self, owner: OtlpExporter, options: OtlpOptions) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import SpanLimits, TracerProvider
            from opentelemetry.trace import SpanKind, Status, StatusCode
        except ImportError as exc:
            raise OtlpUnavailable(f"{INSTALL_HINT} ({exc})") from None

        import logging  # with the SDK only (not at the daemon's start-up)

        # We log failures ourselves, once per interval; the SDK would log every retry.
        for name in ("opentelemetry.exporter", "opentelemetry.sdk", "opentelemetry.exporter.otlp"):
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)

        self._kind = SpanKind.CLIENT
        self._status_error = Status(StatusCode.ERROR)
        self._options = options
        attrs: dict[str, Any] = {"service.name": options.service_name}
        if options.node:
            attrs["service.instance.id"] = options.node
            attrs["host.name"] = options.node
        resource = Resource.create(attrs)
        headers = dict(options.headers)
        self.span_exporter = OTLPSpanExporter(
            endpoint=_signal_url(options.endpoint, "traces"),
            headers=headers,
            timeout=options.timeout,
        )
        self._spans = _span_sink()
        self.tracer_provider = TracerProvider(
            resource=resource,
            span_limits=SpanLimits(max_events=MAX_CHUNK_EVENTS + 8, max_attributes=256),
        )
        self.tracer_provider.add_span_processor(self._spans)
        self.tracer = self.tracer_provider.get_tracer(
            "sparseety", _version(), schema_url=SCHEMA_URL
        )
        metric_exporter = _guarded_metric_exporter(
            OTLPMetricExporter(
                endpoint=_signal_url(options.endpoint, "metrics"),
                headers=headers,
                timeout=options.timeout,
            ),
            owner,
        )
        self.reader = PeriodicExportingMetricReader(
            metric_exporter,
            export_interval_millis=options.metrics_interval * 1000.0,
            export_timeout_millis=(options.timeout + 1.0) * 1000.0,
        )
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self.reader])
        meter = self.meter_provider.get_meter("sparseety", _version(), schema_url=SCHEMA_URL)
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="Time to generate first token for successful responses.",
            explicit_bucket_boundaries_advisory=list(TTFT_BUCKETS),
        )
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token generated after the first token for "
            "successful responses.",
            explicit_bucket_boundaries_advisory=list(TPOT_BUCKETS),
        )
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="Generative AI server request duration such as time-to-last byte "
            "or last output token.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
        )
        self.spec_accept_length = meter.create_histogram(
            "sparseety.server.spec.accept_length",
            unit="{token}",
            description="Mean tokens per speculative-decoding verification step, as the "
            "server reported it, per request.",
            explicit_bucket_boundaries_advisory=list(ACCEPT_LENGTH_BUCKETS),
        )
        self.spec_acceptance = meter.create_histogram(
            "sparseety.server.spec.acceptance_rate",
            unit="1",
            description="Drafted tokens the server accepted, as a fraction of those it "
            "drafted, per request.",
            explicit_bucket_boundaries_advisory=list(ACCEPTANCE_RATE_BUCKETS),
        )
        self._owner = owner

    def emit(self, records: list[StreamRecord]) -> None:
        node = self._options.node
        for r in records:
            self._span(r, node)
            self._metrics(r)
        spans = self._spans.take()
        if not spans:
            return
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.span_exporter.export(spans)
        if result is SpanExportResult.SUCCESS:
            self._owner.exported_spans += len(spans)
            self._owner._healthy = True
        else:
            self._owner._note_failure("traces")

    def _span(self, r: StreamRecord, node: str) -> None:
        span = self.tracer.start_span(
            span_name(r),
            kind=self._kind,
            start_time=_ns(r.t_request),
            attributes=span_attributes(r, node),
        )
        for c in r.chunks:
            ev: dict[str, Any] = {
                "sparseety.chunk.choice": c.choice,
                "sparseety.chunk.index": c.index,
                "sparseety.chunk.kind": c.kind,
                "sparseety.chunk.chars": c.chars,
            }
            if c.finish_reason:
                ev["sparseety.chunk.finish_reason"] = c.finish_reason
            span.add_event("sparseety.chunk", ev, timestamp=_ns(c.ts))
        if r.error_type is not None:
            span.set_status(self._status_error)
        span.end(end_time=_ns(max(r.t_end, r.t_request)))

    def _metrics(self, r: StreamRecord) -> None:
        a = metric_attributes(r)
        err = r.error_type
        dur_attrs = {**a, "error.type": err} if err is not None else a
        self.duration.record(max(0.0, r.t_end - r.t_request), dur_attrs)
        ok = err is None
        if ok and r.streaming and r.t_first_content is not None:
            self.ttft.record(max(0.0, r.t_first_content - r.t_request), a)
        outp = r.usage_output if r.usage_output is not None else r.output_tokens
        inp = r.usage_input if r.usage_input is not None else r.prompt_tokens
        if (
            ok
            and outp is not None
            and outp > 1
            and r.t_first_output is not None
            and r.t_last_output is not None
        ):
            self.tpot.record(max(0.0, r.t_last_output - r.t_first_output) / (outp - 1), a)
        if inp is not None:
            self.usage.record(inp, {**a, "gen_ai.token.type": "input"})
        if outp is not None:
            self.usage.record(outp, {**a, "gen_ai.token.type": "output"})
        spec = r.speculative
        if spec is not None:
            sa = {**a, "sparseety.spec.source": spec.source}
            if spec.accept_length is not None:
                self.spec_accept_length.record(spec.accept_length, sa)
            if spec.acceptance_rate is not None:
                self.spec_acceptance.record(spec.acceptance_rate, sa)

    def shutdown(self) -> None:
        timeout_ms = int((self._options.timeout + 1.0) * 1000)
        try:
            self.meter_provider.shutdown(timeout_millis=timeout_ms)
        except Exception as exc:
            self._owner._note_failure("metrics", f"{type(exc).__name__}: {exc}")
        try:
            self.tracer_provider.shutdown()
            self.span_exporter.shutdown()
        except Exception as exc:
            self._owner._note_failure("traces", f"{type(exc).__name__}: {exc}")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sparseety")
    except Exception:
        return "0"


def _span_sink() -> Any:
    """A span processor that keeps ended spans for the export thread to send
    itself (one queue, ours: no second, hidden one in a batch processor).
    ``take()`` returns the spans ended since the last call."""
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    class SpanSink(SpanProcessor):
        def __init__(self) -> None:
            self._spans: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            self._spans.append(span)

        def take(self) -> list[ReadableSpan]:
            spans, self._spans = self._spans, []
            return spans

    return SpanSink()


def _guarded_metric_exporter(inner: Any, owner: OtlpExporter) -> Any:
    """The OTLP metric exporter, wrapped: a failed export is counted and logged
    through ``owner`` (once per interval) instead of the SDK's log."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class Guarded(MetricExporter):
        def __init__(self) -> None:
            super().__init__(
                preferred_temporality=inner._preferred_temporality,
                preferred_aggregation=inner._preferred_aggregation,
            )

        def export(
            self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any
        ) -> MetricExportResult:
            try:
                result = inner.export(metrics_data, timeout_millis=timeout_millis, **kw)
            except Exception as exc:
                owner._note_failure("metrics", f"{type(exc).__name__}: {exc}")
                return MetricExportResult.FAILURE
            if result is not MetricExportResult.SUCCESS:
                owner._note_failure("metrics")
            return MetricExportResult(result)

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(inner.force_flush(timeout_millis=timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
            inner.shutdown(timeout_millis=timeout_millis, **kw)

    return Guarded()
