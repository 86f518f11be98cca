"""Prometheus metrics: store events in, a /metrics exposition out.

One :class:`Metrics` owns its own ``CollectorRegistry`` (never the global one),
so a process — or a test — can hold several. The daemon calls
:meth:`Metrics.observe` with every batch of events the pipeline produced
(BEFORE sampling and redaction, so that every stream counts), the token layer
calls :meth:`Metrics.observe_tokens` per stream, and the daemon sets the
gauges and counters it owns (queue, drops, packets, flushes).

All durations come from capture timestamps carried on the events (a capture
clock that went backwards makes none: a negative TTFT or inter-chunk gap is
not observed, nor the duration of a stream flagged ``clock-backwards``); the only
clock reads here are the scrape-time age of the last flush and each label
set's creation time (its ``_created`` series).

Cost: ``observe`` handles every chunk event of the capture path and
``observe_tokens`` a value per chunk (or per distinct value) in the token
thread, both under ``Metrics``' own lock. So the counters and histograms
they feed are not prometheus_client ``Counter``/``Histogram`` objects (a
mutex per ``inc``, two and a bucket scan per ``observe``) but plain numbers
(``_Counter``, ``_Histogram``), exposed at scrape time by a collector in the
same registry with the exposition those objects would give. The daemon-owned figures,
updated from other threads, stay prometheus_client's.

Label sets are bounded: ``label`` is the server label (``None`` → ``"none"``),
``model`` the request's ``model`` (``None`` → ``"none"``); past ``max_models``
distinct models under one label, new ones are counted as ``"other"``, and past
``max_labels`` labels likewise.

Metrics (``{label, model}`` unless noted):

=============================================== =========== =====================================
name                                            type        meaning
=============================================== =========== =====================================
gen_ai_server_time_to_first_token_seconds       histogram   request head → first chunk carrying
                                                            content, reasoning or a tool call
                                                            (never the role prelude); streamed
                                                            responses only
gen_ai_server_time_per_output_token_seconds     histogram   (last − first output chunk) /
                                                            (output tokens − 1), per complete
                                                            stream; needs observe_tokens
sparseety_inter_chunk_seconds                   histogram   gap between consecutive output
                                                            chunks of one choice
gen_ai_server_request_duration_seconds          histogram   request head → end of the stream
gen_ai_client_token_usage                       histogram   tokens per stream,
                                                            ``gen_ai_token_type`` input|output
                                                            (our tokenizer; observe_tokens)
sparseety_output_characters                     histogram   characters of content per stream
sparseety_tokens_per_chunk                      histogram   tokens attributed to each chunk
sparseety_streams_total                         counter     closed streams by ``state``:
                                                            complete, client_abort, truncated,
                                                            gap, error
sparseety_chunk_events_total                    counter     chunk events (all kinds)
sparseety_output_tokens_total                   counter     output tokens (our tokenizer)
sparseety_prompt_tokens_total                   counter     prompt tokens (our tokenizer)
sparseety_server_usage_tokens_total             counter     tokens the server reported in
                                                            ``usage``, ``type`` prompt|completion
sparseety_server_spec_draft_tokens_total        counter     draft tokens the server reported
                                                            proposing (speculative decoding),
                                                            by ``source`` vllm|llama.cpp|sglang
sparseety_server_spec_accepted_tokens_total     counter     of them, accepted (acceptance rate:
                                                            the ratio of the two rates)
sparseety_server_spec_accept_length             histogram   mean tokens per verification step
                                                            the server reported, per stream
sparseety_output_cadence_total                  counter     streamed outputs (choices; the whole
                                                            message for Responses / Anthropic)
                                                            with text, at their stream's close,
                                                            by ``cadence`` steady|bursty|unknown
                                                            of their text chunks' capture times
                                                            (``sniffer.llm.cadence``: bursty is
                                                            the mark of speculative decoding a
                                                            server does not report)
sparseety_chunk_anomalies_total                 counter     token-layer anomalies by ``kind``
sparseety_parse_errors_total                    counter     recorded pipeline errors by
                                                            ``stage`` (no label/model)
sparseety_redactions_total                      counter     redacted items by ``kind``
sparseety_packets_captured_total                counter     packets the capture delivered
sparseety_kernel_drops_total                    counter     packets the kernel ring dropped
sparseety_queue_drops_total                     counter     packets/batches dropped on a full
                                                            queue
sparseety_reassembly_events_total               counter     TCP reassembly events by ``kind``
                                                            (``core.events.REASSEMBLY_KINDS``):
                                                            retransmission, overlap-mismatch
                                                            (bytes that arrived twice with
                                                            different content), out-of-order,
                                                            buffer-cap, out-of-window, after-fin,
                                                            gap, midstream, port-reuse
sparseety_reassembly_lost_bytes_total           counter     bytes the reassembler declared lost
sparseety_otlp_dropped_total                    counter     closed streams (or their token
                                                            figures) dropped on a full OTLP
                                                            export queue
sparseety_otlp_export_failures_total            counter     OTLP export batches that failed,
                                                            ``signal`` traces|metrics
sparseety_streams_evicted_total                 counter     open streams the recording chain's
                                                            tracker forgot to make room (past
                                                            ``tracker.MAX_OPEN_STREAMS`` open):
                                                            their later events count under
                                                            label and model ``none``
sparseety_open_connections                      gauge       connections being tracked
sparseety_open_streams                          gauge       streams not yet closed
sparseety_queue_depth                           gauge       items waiting in the pipeline queue
sparseety_last_flush_age_seconds                gauge       seconds since the last successful
                                                            database flush (since start before
                                                            the first one)
sparseety_sample_rate                           gauge       effective chunk sampling rate
=============================================== =========== =====================================
"""

from __future__ import annotations

import ipaddress
import struct
import threading
import time
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from sniffer.core.events import (
    REASSEMBLY_KINDS,
    ChunkEvent,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.cadence import MIN_GAPS, UNKNOWN, cadence_class
from sniffer.llm.dialects import WHOLE_MESSAGE_DIALECTS
from sniffer.llm.dialects.base import OUTPUT_KINDS
from sniffer.llm.values import ACCEPT_LENGTH_BUCKETS, SpecDecode, Usage
from sniffer.record.tracker import StreamTracker, Tracked

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464

# Buckets: the OpenTelemetry GenAI semantic conventions' advice where they give one.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
INTER_CHUNK_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
    40.96, 81.92, 163.84, 327.68,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
)  # fmt: skip
CHAR_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
TOKENS_PER_CHUNK_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32, 64)

STREAM_STATES = ("complete", "client_abort", "truncated", "gap", "error", "midway")
ERROR_STAGES = frozenset(
    {
        "capture",
        "reassembly",
        "http",
        "sse",
        "ndjson",
        "dialect",
        "streams",
        "store",
        "tokens",
        "pipeline",
    }
)

#: Text chunks per output whose capture times are kept for its cadence (the
#: first ones; 8 bytes each while the stream is open).
MAX_CADENCE_CHUNKS = 1024
#: One capture time as kept for the cadence (``_Choice.times``): a double,
#: native order, 8 bytes
_TIME = struct.Struct("d").pack
_MAX_CADENCE_BYTES = MAX_CADENCE_CHUNKS * struct.calcsize("d")
#: Fewer bytes of cadence times than this: fewer than ``MIN_GAPS`` gaps, a
#: class ``cadence_class`` gives without reading them (``unknown``)
_MIN_CADENCE_BYTES = (MIN_GAPS + 1) * struct.calcsize("d")
#: Closed streams whose labels are kept for their token figures (the oldest
#: is forgotten past it: its figures then count under the labels given).
MAX_RECENT_CLOSED = 10_000
MAX_KINDS = 64
INF = float("inf")
OTHER = "other"
NONE = "none"


#: the states whose ``state`` label is their value (the others depend on the close)
_STATE_LABELS: dict[StreamState, str] = {
    s: s.value for s in StreamState if s not in (StreamState.TRUNCATED, StreamState.OPEN)
}
_BACKWARDS = StreamFlag.CLOCK_BACKWARDS


def stream_state(ev: StreamClosed) -> str:
    """The ``state`` label of a closed stream; "client_abort" is a truncated
    stream whose reason says the client closed the connection."""
    state = ev.state
    label = _STATE_LABELS.get(state)
    if label is not None:
        return label
    if state is StreamState.TRUNCATED:
        return "client_abort" if ev.reason.startswith("client closed") else "truncated"
    if state is StreamState.OPEN:
        return "truncated"
    return state.value


class _Bounded:
    """Maps (label, model) to bounded label values."""

    def __init__(self, max_labels: int, max_models: int) -> None:
        self.max_labels = max_labels
        self.max_models = max_models
        self._models: dict[str, set[str]] = {}

    def __call__(self, label: str | None, model: str | None) -> tuple[str, str]:
        lab = NONE if label is None else str(label)
        mod = NONE if model is None else str(model)
        models = self._models.get(lab)
        if models is None:
            if len(self._models) >= self.max_labels:
                lab = OTHER
                models = self._models.get(lab)
            if models is None:
                models = self._models[lab] = set()
        if mod not in models:
            if len(models) >= self.max_models:
                return lab, OTHER
            models.add(mod)
        return lab, mod


#: A prometheus_client counter in no registry, read only by :func:`_use_created`.
_CREATED_PROBE = Counter("sparseety_created_probe", "", registry=None)


def _use_created() -> bool:
    """Whether prometheus_client emits ``_created`` series (it does unless
    ``PROMETHEUS_DISABLE_CREATED_SERIES`` is set or ``disable_created_metrics()``
    was called): ours follow the same switch as its own metrics. Asked of one
    of its counters through its public ``collect``, at each scrape."""
    return any(s.name.endswith("_created") for m in _CREATED_PROBE.collect() for s in m.samples)


class _CounterChild:
    """One label set of a :class:`_Counter`."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class _HistogramChild:
    """One label set of a :class:`_Histogram`: how many observations fell in
    each bucket (not cumulative; the last bucket is +Inf) and their sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # the first bucket whose upper bound is >= amount, as prometheus_client's
        # (the values observed here are never NaN)
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount

    def observe_all(self, amounts: Iterable[float]) -> None:
        """``observe(a)`` for each of ``amounts``, in order: the same buckets
        and the same sum (the same float additions in the same order)."""
        counts, bounds = self.counts, self.bounds
        total = self.sum
        for a in amounts:
            counts[bisect_left(bounds, a)] += 1
            total += a
        self.sum = total

    def observe_times(self, amount: int, times: int) -> None:
        """``observe(amount)`` ``times`` times: one bucket look-up for an entry
        of a distribution. The same sum for integers (every partial sum an
        integer a float holds exactly), which is all it is given."""
        self.counts[bisect_left(self.bounds, amount)] += times
        self.sum += amount * times


Child = TypeVar("Child", _CounterChild, _HistogramChild)


class _TokenChildren:
    """The children :meth:`Metrics.observe_tokens` feeds for one label set,
    each made at its first use (a child made is a series exposed): one
    look-up per stream instead of a ``Metrics._child`` call (a tuple key
    made and hashed) per figure and anomaly kind, some 8 per stream of the
    live traffic. An anomaly kind's child is that of its bounded name
    (``Metrics._kind``: the same name for a kind once it was asked)."""

    __slots__ = (
        "anomalies",
        "output",
        "per_chunk",
        "prompt",
        "tpot",
        "usage_input",
        "usage_output",
    )

    def __init__(self) -> None:
        self.output: Any = None
        self.usage_output: Any = None
        self.prompt: Any = None
        self.usage_input: Any = None
        self.per_chunk: Any = None
        self.tpot: Any = None
        self.anomalies: dict[str, Any] = {}


#: ``sniffer._native.hist_observe_all(bounds, counts, total, values)``:
#: :meth:`_HistogramChild.observe_all` of floats, counts updated in place,
#: the new sum returned (the same bisection and additions, in Rust).
_ObserveAll = Callable[[tuple[float, ...], list[int], float, list[float]], float]


class _Family(Generic[Child]):
    """A labelled counter or histogram fed under its owner's lock.

    prometheus_client's ``Counter`` and ``Histogram`` take a mutex on every
    ``inc``/``observe`` (a histogram observation: two) and scan the bucket
    bounds; :class:`Metrics` already holds its own lock whenever it observes,
    so the metrics it feeds are plain numbers in these children instead, read
    at scrape time by :meth:`collect` (a prometheus_client collector,
    registered in the owner's registry where the metric would have been). The
    exposition is the one prometheus_client's metric would give: same names,
    HELP and TYPE, label sets in creation order, values, and ``_created``.

    ``labels`` must be called, and the child it returns used, with ``lock``
    held; :meth:`collect` takes it to read the children.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        registry: CollectorRegistry,
        lock: threading.Lock,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lock = lock
        self._children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def labels(self, *values: str) -> Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._new_child()
        return child

    def describe(self) -> list[Metric]:
        return [self._family()]

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        raise NotImplementedError


class _Counter(_Family[_CounterChild]):
    """A labelled counter (see :class:`_Family`); the name without ``_total``."""

    def _new_child(self) -> _CounterChild:
        return _CounterChild()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [(values, c.value, c.created) for values, c in self._children.items()]
        created = _use_created()
        family = self._family()
        for values, value, t in rows:
            family.add_metric(values, value, created=t if created else None)
        yield family


class _Histogram(_Family[_HistogramChild]):
    """A labelled histogram (see :class:`_Family`); ``buckets`` as
    prometheus_client's (+Inf added when missing)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
        lock: threading.Lock,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds[-1] != INF:
            bounds.append(INF)
        self.bounds = tuple(bounds)
        self._le = [floatToGoString(b) for b in bounds]
        super().__init__(name, documentation, labelnames, registry=registry, lock=lock)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self.bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [
                (values, list(h.counts), h.sum, h.created) for values, h in self._children.items()
            ]
        created = _use_created()
        family = self._family()
        for values, counts, total, t in rows:
            buckets = []
            acc = 0.0
            for le, n in zip(self._le, counts, strict=True):
                acc += n  # cumulative, as floats: prometheus_client's values exactly
                buckets.append((le, acc))
            family.add_metric(values, buckets, total)
            if created:
                family.add_sample(
                    self.name + "_created", dict(zip(self.labelnames, values, strict=True)), t
                )
        yield family


class _Pending:
    """What the chunk events of a batch add to one label set's per-chunk
    figures, handed to its children once at the end of the batch
    (:meth:`Metrics.observe`): the chunk count (one ``inc(n)``: an integer
    sum, the same in any grouping) and the inter-chunk gaps in event order
    (``observe_all``: the same float additions in the same order). Per chunk
    an increment and a list append, not a call each (the capture path).
    Shared by every open stream of the label set (its ``_Open.pending``),
    made with the label set (``_LabelSet.pending``)."""

    __slots__ = ("chunks", "gaps", "inter_chunk", "n")

    def __init__(self, chunks: Any, inter_chunk: Any) -> None:
        self.chunks = chunks
        self.inter_chunk = inter_chunk
        self.n = 0
        self.gaps: list[float] = []

    def hand_over(self, native: _ObserveAll | None = None) -> None:
        """Give the children what the batch added (``Metrics``' lock held);
        ``native``: the native core's ``hist_observe_all``."""
        if self.n:
            self.chunks.inc(self.n)
            self.n = 0
        gaps = self.gaps
        if gaps:
            h = self.inter_chunk
            if type(h) is _HistogramChild:
                if native is not None:
                    h.sum = native(h.bounds, h.counts, h.sum, gaps)
                else:
                    h.observe_all(gaps)
            else:  # prometheus_client's own (the tests' reference): one by one
                for gap in gaps:
                    h.observe(gap)
            gaps.clear()


class _Choice:
    """One choice of an open stream: its last output chunk's capture time (the
    inter-chunk gap) and its text chunks' (the cadence), as the bytes of
    doubles (native order: ``_TIME``; an ``array('d')``'s ``append`` parses
    its argument through the format machinery, ~1k instructions a chunk with
    the native pass; appending 8 bytes to a ``bytearray`` costs a resize)."""

    __slots__ = ("last", "times")

    def __init__(self, ts: float) -> None:
        self.last = ts
        self.times = bytearray()

    def time_array(self) -> array[float]:
        """The cadence times as an ``array('d')``."""
        return array("d", self.times)


class _LabelSet:
    """The children of one label set (label, model) that every stream of it
    feeds, found once per label set instead of once per stream and metric
    (a look-up in :meth:`Metrics._child` builds and hashes a key each time:
    seven per stream), and its batch's per-chunk figures (``pending``). Each
    child is made by ``Metrics._child`` where it was before (at the label
    set's first open, or the first close that needs it), so the
    exposition's label sets come in the same order."""

    __slots__ = (
        "cadence",
        "chunks",
        "duration",
        "inter_chunk",
        "keys",
        "output_chars",
        "pending",
        "states",
        "ttft",
    )

    def __init__(self, keys: tuple[str, str], ttft: Any, inter_chunk: Any, chunks: Any) -> None:
        self.keys = keys
        self.ttft = ttft
        self.inter_chunk = inter_chunk
        self.chunks = chunks
        self.pending = _Pending(chunks, inter_chunk)
        self.duration: Any = None
        self.output_chars: Any = None
        #: stream state → its ``streams`` child; cadence class → its ``cadence`` child
        self.states: dict[str, Any] = {}
        self.cadence: dict[str, Any] = {}


class _Open:
    """What metrics remember of an open stream, beside what the tracker knows
    (its ``Tracked.metrics`` slot)."""

    __slots__ = (
        "choices",
        "keys",
        "labels",
        "pending",
        "t_request",
        "ttft_done",
        "whole_message",
    )

    def __init__(self, labels: _LabelSet, t_request: float, whole_message: bool) -> None:
        self.keys = labels.keys
        self.labels = labels
        #: None once recovered mid-way (no request head: no TTFT, no duration)
        self.t_request: float | None = t_request
        self.ttft_done = False
        #: per choice with an output chunk (one dict look-up per chunk)
        self.choices: dict[int, _Choice] = {}
        #: its label set's figures of the current batch
        self.pending = labels.pending
        #: its dialect streams one message (its outputs' cadence is the whole's)
        self.whole_message = whole_message


#: ``(events, entries, chunk, handlers)``: :meth:`Metrics._observe`'s pass
#: natively (``sniffer._native.MetricsChunks``): a chunk event of a stream
#: already counted whose figures are only its count, a gap and a cadence
#: time is counted there, any other goes to ``chunk(ev, entry)``, every
#: event that is not a chunk event to its exact type's handler in
#: ``handlers`` (none: skipped).
_ChunkPass = Callable[
    [
        list[StoreEvent],
        dict[int, Tracked],
        Callable[[ChunkEvent, Tracked | None], None],
        dict[type, Callable[[Any], None]],
    ],
    None,
]


@cache
def _native_pass() -> _ChunkPass | None:
    """The native core's :data:`_ChunkPass` (with the cadence times as bytes:
    ~1.8k instructions per chunk less than the Python pass on the live
    traffic), or None (the pure core)."""
    from sniffer import native_core

    native = getattr(native_core()[0], "MetricsChunks", None)
    if native is None:  # the pure core (or a module built before it)
        return None
    count: _ChunkPass = native(
        ChunkEvent, Tracked, _Open, _Pending, _Choice, OUTPUT_KINDS, _MAX_CADENCE_BYTES
    )
    return count


#: A closed stream kept for its token figures: ``(keys, complete,
#: t_first_output, t_last_output)`` (a tuple: made once per stream at its close)
_Closed = tuple[tuple[str, str], bool, float | None, float | None]


class MetricsServer:
    """A running /metrics HTTP server (prometheus_client's WSGI server thread)."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        address = httpd.server_address
        self.host: str = address[0]
        self.port: int = address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_bind_host(host: str, allow_public: bool = False) -> None:
    """Raise ``ValueError`` unless ``host`` is a loopback address (or allowed)."""
    if allow_public or host == "localhost":
        return
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ValueError(
            f"metrics host {host!r} is not an IP address: use 127.0.0.1 or ::1, "
            "or allow a public address explicitly (--metrics-public)"
        ) from None
    if not ip.is_loopback:
        what = "every interface" if ip.is_unspecified else "a non-loopback address"
        raise ValueError(
            f"refusing to serve /metrics on {host} ({what}): metrics name models and "
            "servers; use 127.0.0.1 or ::1, or pass --metrics-public to expose them"
        )


class Metrics:
    """Prometheus metrics of one sidecar. Example::

    metrics = Metrics()
    server = metrics.serve()            # http://127.0.0.1:9464/metrics
    for batch in batches:
        metrics.observe(batch)
    server.close()
    """

    def __init__(
        self,
        *,
        max_models: int = 20,
        max_labels: int = 50,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._bound = _Bounded(max_labels, max_models)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._token_children: dict[tuple[str, ...], _TokenChildren] = {}
        self._clock = clock
        self._started = clock()
        self._last_flush: float | None = None
        #: open streams: the tracker this observer reads (its own until the
        #: recording chain shares its tracker, see :meth:`track_with`)
        self.tracker = StreamTracker(outputs=True)
        self._drives = True
        self._evicted_seen = 0
        self._closed: OrderedDict[int, _Closed] = OrderedDict()
        #: per label set: the current batch's per-chunk figures, handed over
        #: at the batch's end (bounded as the label sets are)
        self._pending: dict[tuple[str, str], _Pending] = {}
        #: per label set: the children its streams feed (bounded as the label sets are)
        self._sets: dict[tuple[str, str], _LabelSet] = {}
        #: label → model, as a stream's open names them → its label set, for
        #: those not bounded to ``other`` (``_bound`` gives them the same
        #: label set for good): bounded as the label sets are, with None and
        #: "none" apart
        self._named: dict[str | None, dict[str | None, _LabelSet]] = {}
        from sniffer import native_core

        #: the gaps of a batch counted natively (None: the pure core)
        self._observe_all: _ObserveAll | None = getattr(native_core()[0], "hist_observe_all", None)
        #: the batch's chunks that only add counts, a gap and a cadence time,
        #: natively (None: the pure core; ``_chunk`` is the reference)
        self._native: _ChunkPass | None = _native_pass()
        self._kinds: set[str] = set()
        self._lock = threading.Lock()
        #: what :meth:`_observe` does with the events that are not chunk
        #: events, by exact type (any other is not counted: a connection's
        #: open and close cost no call)
        self._handlers: dict[type, Callable[[Any], None]] = {
            StreamOpened: self._opened,
            StreamResponse: self._response,
            StreamClosed: self._closed_stream,
            PipelineError: self._error,
        }
        r = self.registry
        lm = ("label", "model")

        self.ttft = _Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from the request head to the first chunk carrying content, reasoning "
            "or a tool call (streamed responses; capture time).",
            lm,
            buckets=TTFT_BUCKETS,
            registry=r,
            lock=self._lock,
        )
        self.tpot = _Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Per complete stream: (last - first output chunk time) / (output tokens - 1).",
            lm,
            buckets=TPOT_BUCKETS,
            registry=r,
            lock=self._lock,
        )
        self.inter_chunk = _Histogram(
            "sparseety_inter_chunk_seconds",
            "Time between consecutive output chunks of one choice (capture time).",
            lm,
            buckets=INTER_CHUNK_BUCKETS,
            registry=r,
            lock=self._lock,
        )
        self.duration = _Histogram(
            "gen_ai_server_request_duration_seconds",
            "Time from the request head to the end of the response stream (capture time).",
            lm,
            buckets=DURATION_BUCKETS,
            registry=r,
            lock=self._lock,
        )
        self.token_usage = _Histogram(
            "gen_ai_client_token_usage",
            "Tokens per stream by our tokenizer: gen_ai_token_type input (prompt) or output.",
            (*lm, "gen_ai_token_type"),
            buckets=TOKEN_BUCKETS,
            registry=r,
            lock=self._lock,
        )
        self.output_chars = _Histogram(
            "sparseety_output_characters",
            "Characters of content per stream (all choices).",
            lm,
            buckets=CHAR_BUCKETS,
            registry=r,
            lock=self._lock,
        )
        self.tokens_per_chunk = _Histogram(
            "sparseety_tokens_per_chunk",
            "Tokens attributed to each text-carrying chunk.",
            lm,
            buckets=TOKENS_PER_CHUNK_BUCKETS,
            registry=r,
            lock=self._lock,
        )
        self.streams = _Counter(
            "sparseety_streams",
            "Closed streams by state: complete, client_abort, truncated, gap, error, midway.",
            (*lm, "state"),
            registry=r,
            lock=self._lock,
        )
        self.chunk_events = _Counter(
            "sparseety_chunk_events", "Chunk events (all kinds).", lm, registry=r, lock=self._lock
        )
        self.output_tokens = _Counter(
            "sparseety_output_tokens",
            "Output tokens (our tokenizer).",
            lm,
            registry=r,
            lock=self._lock,
        )
        self.prompt_tokens = _Counter(
            "sparseety_prompt_tokens",
            "Prompt tokens (our tokenizer).",
            lm,
            registry=r,
            lock=self._lock,
        )
        self.server_usage = _Counter(
            "sparseety_server_usage_tokens",
            "Tokens the server reported in its usage object: type prompt or completion.",
            (*lm, "type"),
            registry=r,
            lock=self._lock,
        )
        self.spec_draft = _Counter(
            "sparseety_server_spec_draft_tokens",
            "Draft tokens the server reported proposing (speculative decoding), by source.",
            (*lm, "source"),
            registry=r,
            lock=self._lock,
        )
        self.spec_accepted = _Counter(
            "sparseety_server_spec_accepted_tokens",
            "Draft tokens the server reported accepting (speculative decoding), by source.",
            (*lm, "source"),
            registry=r,
            lock=self._lock,
        )
        self.spec_accept_length = _Histogram(
            "sparseety_server_spec_accept_length",
            "Mean tokens per verification step the server reported, per stream.",
            (*lm, "source"),
            registry=r,
            buckets=ACCEPT_LENGTH_BUCKETS,
            lock=self._lock,
        )
        self.cadence = _Counter(
            "sparseety_output_cadence",
            "Streamed outputs with text by the cadence of their text chunks: steady, "
            "bursty (runs of chunks close together, then a long gap: speculative "
            "decoding a server does not report), unknown (too few chunks).",
            (*lm, "cadence"),
            registry=r,
            lock=self._lock,
        )
        self.anomalies = _Counter(
            "sparseety_chunk_anomalies",
            "Token-layer anomalies by kind (straddle, replacement_char, usage_mismatch, ...).",
            (*lm, "kind"),
            registry=r,
            lock=self._lock,
        )
        self.parse_errors = _Counter(
            "sparseety_parse_errors",
            "Recorded pipeline errors by stage (capture, reassembly, http, sse, dialect, store).",
            ("stage",),
            registry=r,
            lock=self._lock,
        )
        self.redactions = Counter(
            "sparseety_redactions", "Redacted items by kind.", ("kind",), registry=r
        )
        self.packets = Counter(
            "sparseety_packets_captured", "Packets the capture delivered.", registry=r
        )
        self.kernel_drops = Counter(
            "sparseety_kernel_drops", "Packets the kernel capture ring dropped.", registry=r
        )
        self.queue_drops = Counter(
            "sparseety_queue_drops", "Items dropped because a queue was full.", registry=r
        )
        self.reassembly = Counter(
            "sparseety_reassembly_events",
            "TCP reassembly events by kind: retransmission, overlap-mismatch (bytes that "
            "arrived twice with different content), out-of-order, buffer-cap, out-of-window, "
            "after-fin, gap, midstream, port-reuse.",
            ("kind",),
            registry=r,
        )
        for kind in REASSEMBLY_KINDS:  # every kind from the start (0): rate() needs a baseline
            self.reassembly.labels(kind)
        self.reassembly_lost = Counter(
            "sparseety_reassembly_lost_bytes",
            "Bytes the TCP reassembler declared lost (holes in what was captured).",
            registry=r,
        )
        self.otlp_dropped = Counter(
            "sparseety_otlp_dropped",
            "Closed streams (or their token figures) dropped because the OTLP export "
            "queue was full.",
            registry=r,
        )
        self.otlp_failures = Counter(
            "sparseety_otlp_export_failures",
            "OTLP export batches that failed (collector unreachable or refusing): "
            "signal traces or metrics.",
            ("signal",),
            registry=r,
        )
        self.open_connections = Gauge(
            "sparseety_open_connections", "Connections being tracked.", registry=r
        )
        self.open_streams = Gauge("sparseety_open_streams", "Streams not yet closed.", registry=r)
        self.queue_depth = Gauge(
            "sparseety_queue_depth", "Items waiting in the pipeline queue.", registry=r
        )
        self.flush_age = Gauge(
            "sparseety_last_flush_age_seconds",
            "Seconds since the last successful database flush (since start before the first).",
            registry=r,
        )
        self.flush_age.set_function(self._flush_age)
        self.sample_rate = Gauge(
            "sparseety_sample_rate", "Effective chunk sampling rate (0 to 1).", registry=r
        )
        self.sample_rate.set(1.0)
        self.streams_evicted = Counter(
            "sparseety_streams_evicted",
            "Open streams forgotten to make room for new ones (more than the recording "
            "chain tracks at once): their later events count under label and model none.",
            registry=r,
        )

    # ------------------------------------------------------------- events

    def track_with(self, tracker: StreamTracker) -> None:
        """Read ``tracker`` (the recording chain's, which drives it) instead of
        a tracker of its own. Call before the first event."""
        self.tracker = tracker
        self._drives = False
        tracker.outputs = True  # this reader uses them
        self._evicted_seen = tracker.evicted

    def observe(self, events: Iterable[StoreEvent]) -> None:
        """Account for one batch of pipeline events (in pipeline order)."""
        tracker = self.tracker
        if self._drives:
            events = events if isinstance(events, list) else list(events)
            tracker.observe(events)
        entries = tracker.open
        with self._lock:
            try:
                self._observe(events, entries)
            finally:  # (also when an event raised: what was counted before it)
                native = self._observe_all
                for p in self._pending.values():
                    p.hand_over(native)
        if tracker.evicted > self._evicted_seen:  # (counted once, with the batch)
            self.streams_evicted.inc(tracker.evicted - self._evicted_seen)
            self._evicted_seen = tracker.evicted
        if self._drives:
            tracker.release()

    def _observe(self, events: Iterable[StoreEvent], entries: dict[int, Tracked]) -> None:
        """:meth:`observe`'s pass over the batch (the lock held): each chunk's
        count and gap go to its label set's ``_Pending``, handed over after it."""
        native = self._native
        handlers = self._handlers
        if native is not None and type(events) is list:
            # the chunks that only add counts, a gap and a cadence time natively
            native(events, entries, self._chunk, handlers)
            return
        chunk = self._chunk
        for ev in events:
            if type(ev) is ChunkEvent:
                chunk(ev, entries.get(ev.stream))
            else:
                handle = handlers.get(type(ev))
                if handle is not None:
                    handle(ev)

    def _chunk(self, ev: ChunkEvent, e: Tracked | None) -> None:
        """A chunk event's figures (``e``: its stream's entry, None when not tracked)."""
        if e is None or (s := e.metrics) is None:
            self._child(self.chunk_events, NONE, NONE).inc()
            return
        p = s.pending
        p.n += 1
        if not e.streaming or ev.kind not in OUTPUT_KINDS:
            return
        ts = ev.ts
        if not s.ttft_done:
            s.ttft_done = True
            ttft = ts - (s.t_request or ts)
            if ttft >= 0:  # (negative: the capture clock went backwards)
                s.labels.ttft.observe(ttft)
        c = s.choices.get(ev.choice)
        if c is None:
            c = s.choices[ev.choice] = _Choice(ts)
        else:
            if ts >= c.last:  # the gap since the choice's last output chunk
                p.gaps.append(ts - c.last)
            c.last = ts
        if ev.text:  # its cadence: the first text chunks' times
            times = c.times
            if len(times) < _MAX_CADENCE_BYTES:
                times += _TIME(ts)

    def _response(self, ev: StreamResponse) -> None:
        if ev.status is None:
            e = self.tracker.open.get(ev.stream)
            s = e.metrics if e is not None else None
            if s is not None:
                # recovered mid-way (no head seen): its request time
                # is unknown, so are TTFT and duration
                s.ttft_done = True
                s.t_request = None

    def _error(self, ev: PipelineError) -> None:
        stage = ev.stage if ev.stage in ERROR_STAGES else OTHER
        self.parse_errors.labels(stage).inc()

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, through one cache for every metric (a
        prometheus_client metric's ``labels()`` validates and locks on every
        call). The label values are bounded (``_Bounded``, states, kinds), so
        is the cache."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _opened(self, ev: StreamOpened) -> None:
        e = self.tracker.open.get(ev.stream)
        if e is None:  # (not tracked: opened and evicted in one batch)
            return
        label, model = ev.label, ev.request.model
        models = self._named.get(label)
        labels = models.get(model) if models is not None else None
        if labels is None:
            labels = self._label_set(label, model)
        e.metrics = _Open(labels, ev.ts, ev.dialect in WHOLE_MESSAGE_DIALECTS)

    def _label_set(self, label: str | None, model: str | None) -> _LabelSet:
        """The label set of the streams an open names so (bounded), made at
        its first stream with its per-chunk children."""
        keys = self._bound(label, model)
        labels = self._sets.get(keys)
        if labels is None:
            labels = self._sets[keys] = _LabelSet(
                keys,
                self._child(self.ttft, *keys),
                self._child(self.inter_chunk, *keys),
                self._child(self.chunk_events, *keys),
            )
            self._pending[keys] = labels.pending
        if OTHER not in keys:  # (an open naming it again gets it from here)
            self._named.setdefault(label, {})[model] = labels
        return labels

    def _closed_stream(self, ev: StreamClosed) -> None:
        e = self.tracker.open.get(ev.stream)
        s: _Open | None = e.metrics if e is not None else None
        if e is not None:
            e.metrics = None  # closed: counted once
        if s is None:
            keys = (NONE, NONE)
            t_request: float | None = None
        else:
            keys = s.keys
            t_request = s.t_request
            assert e is not None
            if (
                e.streaming
                and not s.ttft_done
                and ev.t_first_content is not None
                and t_request is not None
            ):
                # The chunks were not seen (observed after sampling): use the summary.
                s.ttft_done = True
                if ev.t_first_content >= t_request:
                    s.labels.ttft.observe(ev.t_first_content - t_request)
        state = stream_state(ev)
        if state == "midway" and ev.response_model and keys[1] == NONE:
            # a row recovered mid-way: its model is the one the chunks named
            # (the store writes it at close too)
            keys = self._bound(keys[0], ev.response_model)
        # (None: not opened here, or named another model: the look-ups)
        labels = s.labels if s is not None and keys is s.keys else None
        if labels is None:
            streams = self._child(self.streams, *keys, state)
        else:
            streams = labels.states.get(state)
            if streams is None:
                streams = labels.states[state] = self._child(self.streams, *keys, state)
        if type(streams) is _CounterChild:  # (``inc()``, without its call)
            streams.value += 1
        else:
            streams.inc()
        backwards = _BACKWARDS in ev.flags
        if t_request is not None and ev.ts >= t_request and not backwards:
            duration = labels.duration if labels is not None else None
            if duration is None:
                duration = self._child(self.duration, *keys)
                if labels is not None:
                    labels.duration = duration
            duration.observe(ev.ts - t_request)
        output_chars = labels.output_chars if labels is not None else None
        if output_chars is None:
            output_chars = self._child(self.output_chars, *keys)
            if labels is not None:
                labels.output_chars = output_chars
        output_chars.observe(ev.text_len)
        usage = ev.usage
        if usage is not None:
            self._usage(keys, usage)
        if s is not None and s.choices and not backwards:
            self._cadence(keys, s, labels)
        closed = self._closed
        if len(closed) >= MAX_RECENT_CLOSED:
            closed.popitem(last=False)
        if s is not None:
            assert e is not None
            closed[ev.stream] = (keys, state == "complete", e.t_first_output, e.t_last_output)
        else:
            closed[ev.stream] = (keys, state == "complete", ev.t_first_content, ev.t_last_chunk)

    def _usage(self, keys: tuple[str, str], usage: Usage) -> None:
        """The usage the server reported for one closed stream."""
        prompt = usage.prompt_tokens
        completion = usage.completion_tokens
        if prompt:
            self._child(self.server_usage, *keys, "prompt").inc(prompt)
        if completion:
            self._child(self.server_usage, *keys, "completion").inc(completion)
        spec = usage.speculative
        if spec is not None:
            self._spec(keys, spec)

    def _cadence(self, keys: tuple[str, str], s: _Open, labels: _LabelSet | None) -> None:
        """The cadence class of each output of one closed stream, as ``stats``
        reads it from the stored chunks: one output per choice, or the whole
        message (its blocks' chunks in index order). ``labels``: the children
        of ``keys``, if known."""
        choices = s.choices
        # (the choices with text chunks, in index order)
        if len(choices) == 1:
            (c,) = choices.values()
            if not c.times:
                return
            # (one output: too few times for a class need no array of them)
            few = len(c.times) < _MIN_CADENCE_BYTES
            classes = [UNKNOWN if few else cadence_class(c.time_array())]
        else:
            outputs = [choices[c].time_array() for c in sorted(choices) if choices[c].times]
            if s.whole_message and len(outputs) > 1:
                merged: array[float] = array("d")
                for times in outputs:
                    merged.extend(times)
                outputs = [merged[:MAX_CADENCE_CHUNKS]]
            classes = [cadence_class(times) for times in outputs]
        for cls in classes:
            child = labels.cadence.get(cls) if labels is not None else None
            if child is None:
                child = self._child(self.cadence, *keys, cls)
                if labels is not None:
                    labels.cadence[cls] = child
            child.inc()

    def _spec(self, keys: tuple[str, str], spec: SpecDecode) -> None:
        """The server-reported speculative decoding of one closed stream."""
        if spec.draft_tokens is not None:
            self._child(self.spec_draft, *keys, spec.source).inc(spec.draft_tokens)
        if spec.accepted_tokens is not None:
            self._child(self.spec_accepted, *keys, spec.source).inc(spec.accepted_tokens)
        if spec.accept_length is not None:
            self._child(self.spec_accept_length, *keys, spec.source).observe(spec.accept_length)

    # ------------------------------------------------------------- tokens

    def observe_tokens(
        self,
        stream: int,
        *,
        output_tokens: int | None = None,
        prompt_tokens: int | None = None,
        tokens_per_chunk: Iterable[int] = (),
        chunks_by_tokens: Mapping[int, int] | None = None,
        anomalies: Mapping[str, int] | None = None,
        label: str | None = None,
        model: str | None = None,
    ) -> None:
        """Token figures of one stream (from the token layer, after the stream closed).

        The stream's label and model are those seen at its open when it is one
        of the last ``MAX_RECENT_CLOSED`` closed (or still open) streams, else
        ``label`` / ``model``. ``anomalies`` maps kind → count. The tokens
        attributed to each text chunk come as ``tokens_per_chunk`` (a value
        per chunk) or as their distribution ``chunks_by_tokens`` (tokens →
        chunks with that many: the token pass's ``tokens_per_chunk`` row,
        a bucket look-up per distinct value instead of one per chunk: a
        tenth of the live traffic's token pass).
        """
        with self._lock:
            # popped: the token figures come once per stream, and a daemon closing
            # 30 streams/s must not hold 10,000 of these (RSS grew for 5 minutes)
            closed = self._closed.pop(stream, None)
            entry = self.tracker.get(stream)
            opened: _Open | None = entry.metrics if entry is not None else None
            if closed is not None:
                keys = closed[0]
            elif opened is not None:
                keys = opened.keys
            else:
                keys = self._bound(label, model)
            tc = self._token_children.get(keys)
            if tc is None:
                tc = self._token_children[keys] = _TokenChildren()
            if output_tokens is not None and output_tokens >= 0:
                if tc.output is None:
                    tc.output = self._child(self.output_tokens, *keys)
                    tc.usage_output = self._child(self.token_usage, *keys, "output")
                tc.output.inc(output_tokens)
                tc.usage_output.observe(output_tokens)
                if (
                    closed is not None
                    and closed[1]  # complete
                    and output_tokens > 1
                    and (t_first := closed[2]) is not None
                    and (t_last := closed[3]) is not None
                ):
                    span = t_last - t_first
                    if tc.tpot is None:
                        tc.tpot = self._child(self.tpot, *keys)
                    tc.tpot.observe(max(0.0, span) / (output_tokens - 1))
            if prompt_tokens is not None and prompt_tokens >= 0:
                if tc.prompt is None:
                    tc.prompt = self._child(self.prompt_tokens, *keys)
                    tc.usage_input = self._child(self.token_usage, *keys, "input")
                tc.prompt.inc(prompt_tokens)
                tc.usage_input.observe(prompt_tokens)
            if tokens_per_chunk or chunks_by_tokens:
                self._per_chunk(tc, keys, tokens_per_chunk, chunks_by_tokens)
            if anomalies:
                by_kind = tc.anomalies
                for kind, count in anomalies.items():
                    if count > 0:
                        child = by_kind.get(kind)
                        if child is None:
                            child = by_kind[kind] = self._child(
                                self.anomalies, *keys, self._kind(kind)
                            )
                        child.inc(count)

    def _per_chunk(
        self,
        tc: _TokenChildren,
        keys: tuple[str, ...],
        tokens_per_chunk: Iterable[int],
        chunks_by_tokens: Mapping[int, int] | None,
    ) -> None:
        """:meth:`observe_tokens`'s tokens per chunk, as values or their distribution."""
        child = tc.per_chunk
        if child is None:
            child = tc.per_chunk = self._child(self.tokens_per_chunk, *keys)
        for n in tokens_per_chunk:
            child.observe(n)
        if chunks_by_tokens:
            if type(child) is _HistogramChild:
                for n, chunks in chunks_by_tokens.items():
                    child.observe_times(n, chunks)
            else:  # prometheus_client's own (the tests' reference): one by one
                for n, chunks in chunks_by_tokens.items():
                    for _ in range(chunks):
                        child.observe(n)

    def _kind(self, kind: str) -> str:
        if kind in self._kinds:
            return kind
        if len(self._kinds) >= MAX_KINDS:
            return OTHER
        self._kinds.add(kind)
        return kind

    # ---------------------------------------------- daemon-owned figures

    def set_open(self, connections: int, streams: int) -> None:
        self.open_connections.set(connections)
        self.open_streams.set(streams)

    def set_queue_depth(self, n: int) -> None:
        self.queue_depth.set(n)

    def add_packets(self, n: int) -> None:
        if n > 0:
            self.packets.inc(n)

    def add_kernel_drops(self, n: int) -> None:
        if n > 0:
            self.kernel_drops.inc(n)

    def add_queue_drops(self, n: int) -> None:
        if n > 0:
            self.queue_drops.inc(n)

    def add_reassembly(self, counts: Mapping[str, int]) -> None:
        """Add TCP reassembly counts by kind (deltas of
        ``Pipeline.reassembly_counts``; ``lost-bytes``: lost bytes)."""
        for kind, n in counts.items():
            if n <= 0:
                continue
            if kind == "lost-bytes":
                self.reassembly_lost.inc(n)
            else:
                self.reassembly.labels(kind if kind in REASSEMBLY_KINDS else OTHER).inc(n)

    def add_otlp_drops(self, n: int) -> None:
        if n > 0:
            self.otlp_dropped.inc(n)

    def add_otlp_failure(self, signal: str) -> None:
        self.otlp_failures.labels(signal if signal in ("traces", "metrics") else OTHER).inc()

    def add_redactions(self, counts: Mapping[str, int]) -> None:
        """Add redaction counts by kind (e.g. the delta of ``Redactor.counts``)."""
        for kind, n in counts.items():
            if n > 0:
                self.redactions.labels(self._kind(kind)).inc(n)

    def set_sample_rate(self, rate: float) -> None:
        self.sample_rate.set(rate)

    def mark_flush(self, ts: float) -> None:
        """A database flush succeeded at wall-clock time ``ts`` (``time.time()``)."""
        self._last_flush = ts

    def _flush_age(self) -> float:
        since = self._last_flush if self._last_flush is not None else self._started
        return max(0.0, self._clock() - since)

    @property
    def tracked_streams(self) -> int:
        """Open streams remembered (for tests and the daemon's self-check)."""
        return len(self.tracker)

    # ------------------------------------------------------------ export

    def render(self) -> bytes:
        """The exposition text (what a scrape of /metrics returns)."""
        return generate_latest(self.registry)

    def serve(
        self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, allow_public: bool = False
    ) -> MetricsServer:
        """Serve /metrics over HTTP on ``host:port`` in a daemon thread.

        Only loopback addresses unless ``allow_public`` (``0.0.0.0`` and ``::``
        are refused with a ``ValueError`` saying how to allow them). ``port=0``
        picks a free port (``MetricsServer.port`` tells which).
        """
        check_bind_host(host, allow_public)
        httpd, thread = start_http_server(port, addr=host.strip("[]"), registry=self.registry)
        return MetricsServer(httpd, thread)


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "STREAM_STATES",
    "Metrics",
    "MetricsServer",
    "check_bind_host",
    "stream_state",
]
