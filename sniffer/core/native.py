"""Which core runs the per-packet path: the native one (``sniffer._native``,
Rust) or the pure-Python stages, and the native reassembler's Python face.

The native core runs whenever the extension imports, unless the environment
variable ``SPARSEETY_PURE`` is set (to anything but an empty string), which
selects the pure-Python stages (they stay the readable reference). When the
extension cannot be imported, :data:`UNAVAILABLE` says why; the drivers
(replay, the daemon) log that once (``sniffer.runtime.log.warn_pure_fallback``).

:class:`NativeReassembler` has :class:`~sniffer.core.reassembly.Reassembler`'s
interface (``feed``, ``expire``, ``flush``, ``capture_gap``, ``checkpoint``,
``forget``, ``adopt``, ``stats``, ``open_connections``, ``idle_timeout``) plus
``feed_batch``, which takes a whole :class:`sniffer._native.SegmentBatch`:
one call per batch of frames, never one per packet. Both give the same flow
events (``tests/test_native_reassembly.py`` holds them to it).

The Rust ports of ``HttpParser`` (``core/http1.py``), ``SseDecoder`` and
``NdjsonDecoder`` (``core/sse.py``) take and return the same event values;
:func:`http_parser`, :func:`sse_decoder` and :func:`ndjson_decoder` make one
of each. A native ``Pipeline`` (the default whenever the native core runs)
runs all of them, the reassembler and the HTTP parser fused in one call per
batch (``sniffer._native.Core``: the reassembler's flow events go to the
HTTP parser inside Rust, no Python flow event made); :func:`native_pipeline`
builds one whatever the default.
HTTP/2 stays in Python: where the native parser reports that a connection
turns to HTTP/2 (preface, frames of a connection caught mid-way, ``101`` to
``Upgrade: h2c``), :func:`_h2_takeover` gives the connection to a Python
``HttpParser`` held by the native one, which feeds it from then on. The
gRPC splitter and the streams stage (dialects) are Python in both cores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sniffer import PURE_ENV, core_name, native_core
from sniffer.core.events import CaptureGap, ConnectionOpened, Endpoint, FlowEvent, Segment
from sniffer.core.h2 import H2Conn
from sniffer.core.http1 import HttpOutput, HttpParser, _Conn
from sniffer.core.reassembly import ReassemblyStats

if TYPE_CHECKING:
    from sniffer.core.pipeline import Pipeline, PipelineConfig

__all__ = [
    "NATIVE",
    "PURE_ENV",
    "SEGMENT_BATCH",
    "UNAVAILABLE",
    "BatchErrors",
    "NativeReassembler",
    "body_chunks",
    "core_name",
    "http_parser",
    "native_pipeline",
    "ndjson_decoder",
    "sse_decoder",
    "why_unavailable",
]

#: (position in the flow events, capture time, message) of each segment dropped
#: in a batch because no connection id could be had.
BatchErrors = list[tuple[int, float, str]]

#: The extension module when the native core runs, else None; UNAVAILABLE: why
#: it could not be imported (None when it runs or SPARSEETY_PURE is set).
NATIVE, UNAVAILABLE = native_core()

#: ``sniffer._native.SegmentBatch`` (the items of a native capture), or None
SEGMENT_BATCH: type | None = NATIVE.SegmentBatch if NATIVE is not None else None


class NativeReassembler:
    """The native TCP reassembler (see the module docstring)."""

    def __init__(
        self,
        *,
        conn_id_base: int = 1,
        conn_ids: Callable[[], int] | None = None,
        server_ports: frozenset[int] = frozenset(),
        only_ports: frozenset[int] = frozenset(),
        max_buffer: int = 4 << 20,
        idle_timeout: float = 300.0,
        hole_timeout: float = 1.0,
        max_connections: int = 100_000,
    ) -> None:
        if NATIVE is None:
            raise RuntimeError(f"the native core is not available ({UNAVAILABLE or PURE_ENV})")
        self._r: Any = NATIVE.Reassembler(
            conn_id_base=conn_id_base,
            conn_ids=conn_ids,
            server_ports=server_ports,
            only_ports=only_ports,
            max_buffer=max_buffer,
            idle_timeout=idle_timeout,
            hole_timeout=hole_timeout,
            max_connections=max_connections,
        )
        self.feed_batch: Callable[..., tuple[list[FlowEvent], int, int, BatchErrors]] = (
            self._r.feed_batch
        )

    @property
    def stats(self) -> ReassemblyStats:
        return ReassemblyStats(**dict(self._r.stats()))

    @property
    def open_connections(self) -> int:
        return int(self._r.open_connections)

    @property
    def idle_timeout(self) -> float:
        return float(self._r.idle_timeout)

    @idle_timeout.setter
    def idle_timeout(self, value: float) -> None:
        self._r.idle_timeout = value

    @property
    def hole_timeout(self) -> float:
        return float(self._r.hole_timeout)

    @property
    def max_buffer(self) -> int:
        return int(self._r.max_buffer)

    def set_only_ports(self, ports: frozenset[int]) -> None:
        self._r.set_only_ports(ports)

    def feed_segments(self, segs: Iterable[Segment]) -> tuple[list[FlowEvent], BatchErrors]:
        """``Segment`` values in one call (no port filter): (events, errors)."""
        events, errors = self._r.feed_segments(segs)
        return events, errors

    def feed(self, seg: Segment) -> list[FlowEvent]:
        """One segment, like ``Reassembler.feed`` (raises when no id could be had)."""
        events, errors = self._r.feed_segments((seg,))
        if errors:
            raise RuntimeError(errors[0][2])
        return list(events)

    def expire(self, now: float) -> list[FlowEvent]:
        return list(self._r.expire(now))

    def flush(self, ts: float) -> list[FlowEvent]:
        return list(self._r.flush(ts))

    def capture_gap(self, gap: CaptureGap) -> list[FlowEvent]:
        return list(self._r.capture_gap(gap))

    def checkpoint(self, conn_id: int, now: float | None = None) -> tuple[int, int] | None:
        seqs = self._r.checkpoint(conn_id, now)
        return None if seqs is None else (int(seqs[0]), int(seqs[1]))

    def forget(self, conn_id: int) -> None:
        self._r.forget(conn_id)

    def adopt(
        self, conn_id: int, ts: float, client: Endpoint, server: Endpoint, c2s: int, s2c: int
    ) -> None:
        # The Python masks sequence numbers to 32 bits (negative: never seen);
        # a port out of range is kept as one no segment has.
        self._r.adopt(
            conn_id,
            ts,
            (client[0], client[1] if 0 <= client[1] <= 0xFFFF else -1),
            (server[0], server[1] if 0 <= server[1] <= 0xFFFF else -1),
            c2s & 0xFFFFFFFF if c2s >= 0 else -1,
            s2c & 0xFFFFFFFF if s2c >= 0 else -1,
        )


def why_unavailable() -> str | None:
    """Why the native parsers cannot be used (``None``: they can)."""
    if NATIVE is not None:
        return None
    return UNAVAILABLE or f"{PURE_ENV} is set: the pure-Python stages run"


def _need() -> Any:

    if NATIVE is None:
        raise ImportError(UNAVAILABLE or f"{PURE_ENV} is set")
    return NATIVE


def http_parser(**kwargs: Any) -> Any:
    """A native ``HttpParser`` (same arguments and interface as the Python one)."""
    return _need().HttpParser(**kwargs)


def sse_decoder(max_line: int | None = None) -> Any:
    mod = _need()
    return mod.SseDecoder() if max_line is None else mod.SseDecoder(max_line)


def body_chunks() -> Any:
    """``sniffer._native.body_chunks``: the streams stage's SSE and NDJSON item
    loops (see ``StreamAssembler._response_body``)."""
    return _need().body_chunks


def ndjson_decoder(max_line: int | None = None) -> Any:
    mod = _need()
    return mod.NdjsonDecoder() if max_line is None else mod.NdjsonDecoder(max_line)


def native_pipeline(config: PipelineConfig | None = None) -> Pipeline:
    """A ``Pipeline`` of the native stages (``config`` with ``native=True``)."""
    from dataclasses import replace

    from sniffer.core.pipeline import Pipeline, PipelineConfig

    _need()
    return Pipeline(replace(config or PipelineConfig(), native=True))


def _h2_takeover(
    parser: HttpParser,
    opened: ConnectionOpened,
    opened_held: bool,
    mode: str,
    from_client: bool,
    ts: float,
    data: bytes,
    swapped: bool,
    roles_known: bool,
    base: int = 0,
) -> list[HttpOutput]:
    """Called by the native parser: the connection turns to HTTP/2 with ``data``.
    It becomes a connection of the Python ``parser``, in the state the
    reference would have it in at this point, and the first HTTP/2 bytes are
    parsed as the reference parses them. ``base``: the exchange of stream 1
    (the upgraded request's, or the next one after a preface)."""
    c = _Conn(opened)
    c.opened = opened if opened_held else None
    c.roles_known = roles_known
    if swapped:
        c.swapped = True
        c.dirs = (c.dirs[1], c.dirs[0])
        c.dirs[0].from_client = False
        c.dirs[1].from_client = True
    parser._conns[opened.conn] = c
    out: list[HttpOutput] = []
    if mode == "preface":
        c.h2 = H2Conn(c.id, base=base, stats=parser.h2_stats)
        if data:
            parser._h2_data(c, True, ts, data, out)
    elif mode == "midstream":
        c.h2 = H2Conn(c.id, midstream=True, stats=parser.h2_stats)
        parser._h2_data(c, from_client, ts, data, out)
    else:  # "upgrade": 101 to Upgrade: h2c; exchange 0 goes on as stream 1
        c.h2 = H2Conn(c.id, upgraded=True, base=base, stats=parser.h2_stats)
        if data:
            parser._h2_data(c, False, ts, data, out)
    return out
