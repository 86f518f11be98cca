"""Stub of ``sniffer._native``, the native core (Rust, ``native/py``).

Frames in, flow events out, one call per batch: ``read_pcap`` and
``parse_frames`` make a :class:`SegmentBatch` of the TCP segments of many
frames; :meth:`Reassembler.feed_batch` turns it into the flow events of
``sniffer.core.events``, :meth:`Core.feed_batch` straight into the HTTP events
(reassembly and HTTP/1.1 fused). Use it through ``sniffer.core.native`` and
``sniffer.core.pipeline``.
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sniffer.core.events import CaptureGap, FlowEvent, HttpBody, Segment
from sniffer.llm.dialects.base import Delta

__version__: str

class SegmentBatch:
    """The TCP segments of a batch of frames (payloads copied)."""

    @property
    def frames(self) -> int: ...
    @property
    def last_ts(self) -> float | None: ...
    def __len__(self) -> int: ...
    def ts(self, i: int) -> float: ...
    def segments(self) -> list[Segment]: ...

def parse_frames(
    linktype: int, data: bytes | memoryview, ts: list[float], bounds: list[int]
) -> SegmentBatch: ...
def read_pcap(
    linktype: int,
    data: object,
    off: int,
    big_endian: bool,
    scale: int,
    limit: int,
    max_packets: int,
) -> tuple[
    SegmentBatch,
    int,
    int,
    int,
    float | None,
    float | None,
    tuple[str, int, int] | None,
]: ...
def read_pcapng(
    data: object,
    off: int,
    big_endian: bool,
    interfaces: list[tuple[int, int, int, int]],
    ts: float,
    max_packets: int,
) -> tuple[SegmentBatch, int, int, int, float | None, float, bool]: ...
def segment_batch(segments: Iterable[Segment]) -> SegmentBatch: ...
def parse_block(
    linktype: int, ring: object, base: int, block_size: int, skip_outgoing: bool
) -> tuple[SegmentBatch, int, int, int, int, float | None]: ...

class Reassembler:
    idle_timeout: float
    def __init__(
        self,
        *,
        conn_id_base: int = 1,
        conn_ids: Callable[[], int] | None = None,
        server_ports: Iterable[int] | None = None,
        max_buffer: int = ...,
        idle_timeout: float = 300.0,
        hole_timeout: float = 1.0,
        max_connections: int = 100000,
        only_ports: Iterable[int] | None = None,
    ) -> None: ...
    @property
    def hole_timeout(self) -> float: ...
    @property
    def max_buffer(self) -> int: ...
    @property
    def open_connections(self) -> int: ...
    def set_only_ports(self, only_ports: Iterable[int]) -> None: ...
    def stats(self) -> list[tuple[str, int]]: ...
    def feed_batch(
        self,
        batch: SegmentBatch,
        start: int = 0,
        stop: int | None = None,
        share_k: int = 0,
        share_n: int = 1,
    ) -> tuple[list[FlowEvent], int, int, list[tuple[int, float, str]]]: ...
    def feed_segments(
        self, segments: Iterable[Segment]
    ) -> tuple[list[FlowEvent], list[tuple[int, float, str]]]: ...
    def expire(self, now: float) -> list[FlowEvent]: ...
    def flush(self, ts: float) -> list[FlowEvent]: ...
    def capture_gap(self, gap: CaptureGap) -> list[FlowEvent]: ...
    def checkpoint(self, conn_id: int, now: float | None = None) -> tuple[int, int] | None: ...
    def forget(self, conn_id: int) -> None: ...
    def adopt(
        self,
        conn_id: int,
        ts: float,
        client: tuple[str, int],
        server: tuple[str, int],
        c2s: int,
        s2c: int,
    ) -> None: ...

#: (position in the outputs, ts, message, connection or None) of ``Core`` calls
CoreErrors = list[tuple[int, float, str, int | None]]

class Core:
    """Reassembly and HTTP/1.1 fused (``sniffer.core.pipeline``): segments or
    flow events in, the HTTP events of ``sniffer.core.events`` out (what
    ``sniffer.core.http1.HttpParser`` gives), no Python flow event in between.
    Errors: segments dropped for want of a connection id (``conn`` None) and
    flow events whose HTTP stage raised (the connection abandoned). An
    HTTP/1.1 response body is no ``HttpBody`` in the outputs but ``None``, its
    bytes held by the core until its next call (:meth:`feed_bodies`, :meth:`body`)."""

    def __init__(self, reassembler: Reassembler, http: object) -> None: ...
    def feed_batch(
        self,
        batch: SegmentBatch,
        start: int = 0,
        stop: int | None = None,
        share_k: int = 0,
        share_n: int = 1,
    ) -> tuple[list[object], int, int, CoreErrors]: ...
    def feed_segments(self, segments: Iterable[Segment]) -> tuple[list[object], CoreErrors]: ...
    def feed_flows(self, flows: Iterable[FlowEvent]) -> tuple[list[object], CoreErrors]: ...
    def expire(self, now: float) -> tuple[list[object], CoreErrors]: ...
    def flush(self, ts: float) -> tuple[list[object], CoreErrors]: ...
    def capture_gap(self, gap: CaptureGap) -> tuple[list[object], CoreErrors]: ...
    def origin(self, i: int) -> tuple[int, float, int] | None:
        """(conn, ts, end) of the flow event that made output ``i`` of the last call."""
    def body(self, i: int) -> HttpBody | None:
        """The ``HttpBody`` of output ``i`` of the last call when the core holds
        it (``None`` there), else None."""
    def feed_bodies(
        self,
        ex: dict[tuple[int, int], Any],
        start: int,
        stop: int,
        out: list[Any],
        max_quiet: int,
        dead: set[int],
        calls: dict[tuple[int, int], Any],
    ) -> tuple[int, int, int, BaseException | None]:
        """The held bodies at outputs ``start``, ``start + 1``, … (before
        ``stop``) through the streams stage's native item loop, ``ex`` its
        exchanges (``StreamAssembler.feed_held``): (where it stopped, chunk
        events appended, dialect errors counted, exception raised on the body
        where it stopped or None)."""

# --- the streams stage's item loops (native/py/src/chunks.rs) ---

def body_chunks(
    x: Any, ts: float, data: bytes, out: list[Any], max_quiet: int
) -> tuple[int, int, BaseException | None]:
    """``StreamAssembler._response_body``'s SSE and NDJSON branches with
    ``_deltas`` for the exchange ``x`` (its ``decoder`` an :class:`SseDecoder`,
    or else its ``ndjson`` an :class:`NdjsonDecoder`): chunk events and
    dialect errors appended to ``out``; returns (chunk events appended,
    dialect errors counted, the dialect's exception or None)."""

# --- OpenAI chat/completions streamed chunks (native/py/src/openai.rs) ---

def openai_chunk(
    data: str, chat: bool, want_name: bool
) -> tuple[list[Delta], str | None, str | None, tuple[Any, Any, Any, Any] | None] | None:
    """One streamed item's deltas (``OpenAIChat``/``OpenAICompletions.event``)
    without usage, the reply's model and id when ``want_name``, and the
    chunk's ``usage``, ``timings``, ``metrics`` and ``meta_info`` values (None
    when all are null or absent); None when the Python dialect must handle
    the item."""

# --- the live metrics' cadence class (native/py/src/cadence.rs) ---

def cadence_split(times: Sequence[float], floor: float) -> tuple[int, float, float] | None:
    """``(k, short_p50, long_p50)`` of the gaps between consecutive ``times``
    (``sniffer.llm.cadence._classes``' split and medians, float for float);
    None with fewer than two gaps or a gap that is not finite."""

# --- values made without their Python __init__ (native/py/src/slots.rs) ---

class SlotFiller:
    """A frozen, slotted dataclass ``cls`` (no ``__new__`` or ``__post_init__``
    of its own) whose fields are set through the slot descriptors' C setter
    (``slot_init``'s ``__init__`` while the native core runs)."""

    def __init__(self, cls: type) -> None: ...
    def fill(self, obj: Any, *values: Any) -> None:
        """Set every field of ``obj`` (an instance of ``cls``), in field order."""
    def make(self, *values: Any) -> Any:
        """A new instance: these values, then the fields' defaults."""
    def __len__(self) -> int: ...
