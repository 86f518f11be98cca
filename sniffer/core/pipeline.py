"""The sans-IO pipeline: reassembly → http1 → streams, composed.

One ``Pipeline`` per capture run. It owns no thread, socket, file or clock:
the replay command and the daemon drive it with segments (packet capture) or
flow events (eBPF capture) and write what it returns to the store.

Two cores, chosen by ``PipelineConfig.native`` (default ``None``: the native
one whenever the extension is there and ``SPARSEETY_PURE`` is not set):

* native (``True``): TCP reassembly, HTTP/1.1 and the SSE/NDJSON item
  decoders are the Rust ones (``sniffer.core.native``). Reassembly and HTTP
  are fused (``sniffer._native.Core``): a batch of frames (``feed_batch``), a
  list of segments or of eBPF flow events goes in, the HTTP events come out
  in one call, no Python flow event made between the two stages. HTTP/2
  connections are handed to the Python HTTP/2 stage inside that call; the
  gRPC splitter and the streams stage (dialects, JSON) stay Python;
* pure (``False``): every stage is the Python reference.

Both write byte-identical stores (``tests/test_native_stores.py``). A bug in
any stage costs one connection (a ``PipelineError``), never the capture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sniffer.core.events import (
    REASSEMBLY_KINDS,
    CaptureGap,
    ConnectionClosed,
    ConnectionOpened,
    FlowEnd,
    FlowEvent,
    HttpAnomaly,
    HttpRequest,
    PipelineError,
    Segment,
    StoreEvent,
)
from sniffer.core.grpc import TEXT_OUTPUTS, GrpcSplitter, ProtoCatalog
from sniffer.core.http1 import MAX_DECODED_BYTES, MAX_EXPANSION_RATIO, HttpOutput, HttpParser
from sniffer.core.native import NATIVE, NativeReassembler, http_parser
from sniffer.core.reassembly import Reassembler
from sniffer.core.streams import StreamAssembler

if TYPE_CHECKING:
    from sniffer._native import SegmentBatch

#: the errors of a native core call: (position in its outputs, ts, message,
#: connection, or None for a segment dropped for want of a connection id)
NativeErrors = list[tuple[int, float, str, int | None]]

#: what a dead connection's parser still hands on (``HttpParser.abandon``)
_DEAD_KEPT = (ConnectionOpened, FlowEnd, ConnectionClosed)


def _dead_output(hev: HttpOutput) -> HttpOutput | None:
    """What an abandoned connection gives in place of ``hev`` (see ``_consume``)."""
    t = type(hev)
    if t in _DEAD_KEPT:
        return hev
    if t is HttpAnomaly:
        assert isinstance(hev, HttpAnomaly)
        return replace(hev, exchange=None)
    return None


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """What a :class:`Pipeline` is built with (ids, ports, caps, the core)."""

    conn_id_base: int = 1
    stream_id_base: int = 1
    #: id sources (``StoreWriter.conn_ids`` / ``stream_ids``: blocks reserved in the
    #: database, unique across writers); when given, the bases are unused
    conn_ids: Callable[[], int] | None = None
    stream_ids: Callable[[], int] | None = None
    server_ports: frozenset[int] = frozenset()  # helps orient mid-stream connections
    only_ports: frozenset[int] = frozenset()  # non-empty: ignore segments on other ports
    labels: Mapping[int, str] | None = None  # server port → label
    idle_timeout: float = 300.0
    hole_timeout: float = 1.0
    max_decoded_bytes: int = MAX_DECODED_BYTES  # Content-Encoding caps, per exchange
    max_expansion_ratio: float = MAX_EXPANSION_RATIO
    # KServe v2 gRPC: names of the BYTES output tensor that carries the text, tried in order.
    grpc_text_outputs: tuple[str, ...] = TEXT_OUTPUTS
    # gRPC: a serialized FileDescriptorSet; messages of the methods it describes are decoded.
    proto_descriptors: bytes | None = None
    #: every native stage (True: reassembly, HTTP/1.1, SSE/NDJSON), every Python
    #: one (False); None: native when the native core runs
    native: bool | None = None


class Pipeline:
    def __init__(self, config: PipelineConfig | None = None) -> None:
        cfg = config or PipelineConfig()
        self.config = cfg
        server_ports = cfg.server_ports | cfg.only_ports | frozenset((cfg.labels or {}).keys())
        #: the native core runs (``feed_batch`` works)
        self.native = NATIVE is not None if cfg.native is None else cfg.native
        self.reassembler: Reassembler | NativeReassembler
        self.http: Any
        #: the fused native reassembler and HTTP parser (None: pure)
        self._core: Any = None
        if self.native:
            self.reassembler = NativeReassembler(
                conn_id_base=cfg.conn_id_base,
                conn_ids=cfg.conn_ids,
                server_ports=server_ports,
                only_ports=cfg.only_ports,
                idle_timeout=cfg.idle_timeout,
                hole_timeout=cfg.hole_timeout,
            )
            self.http = http_parser(
                max_decoded_bytes=cfg.max_decoded_bytes,
                max_expansion_ratio=cfg.max_expansion_ratio,
            )
            assert NATIVE is not None
            self._core = NATIVE.Core(self.reassembler._r, self.http)
        else:
            self.reassembler = Reassembler(
                conn_id_base=cfg.conn_id_base,
                conn_ids=cfg.conn_ids,
                server_ports=server_ports,
                idle_timeout=cfg.idle_timeout,
                hole_timeout=cfg.hole_timeout,
            )
            self.http = HttpParser(
                max_decoded_bytes=cfg.max_decoded_bytes,
                max_expansion_ratio=cfg.max_expansion_ratio,
            )
        catalog = ProtoCatalog(cfg.proto_descriptors) if cfg.proto_descriptors else None
        self.grpc = GrpcSplitter(cfg.grpc_text_outputs, catalog)
        self.streams = StreamAssembler(
            stream_id_base=cfg.stream_id_base,
            stream_ids=cfg.stream_ids,
            labels=cfg.labels,
            native=self.native,
        )
        self._only = cfg.only_ports
        self.segments = 0
        self.skipped = 0
        self.internal_errors = 0

    def feed(self, seg: Segment) -> list[StoreEvent]:
        """One captured TCP segment in; whatever it completed out."""
        only = self._only
        if only and seg.sport not in only and seg.dport not in only:
            self.skipped += 1
            return []
        self.segments += 1
        if self._core is not None:
            return self._outputs(*self._core.feed_segments((seg,)))
        try:
            flows = self.reassembler.feed(seg)
        except Exception as exc:  # e.g. no connection id to be had: one segment lost
            self.internal_errors += 1
            return [self._dropped(seg.ts, f"{type(exc).__name__}: {exc}")]
        if not flows:
            return []
        return self._flows(flows)

    def feed_segments(self, segs: list[Segment]) -> list[StoreEvent]:
        """Several captured segments in (a live capture's poll): what ``feed``
        gives for each in turn; the native reassembler takes them in one call."""
        if not self.native:
            out: list[StoreEvent] = []
            for seg in segs:
                out += self.feed(seg)
            return out
        assert NATIVE is not None
        return self.feed_batch(NATIVE.segment_batch(segs))

    def feed_batch(
        self, batch: SegmentBatch, start: int = 0, stop: int | None = None, k: int = 0, n: int = 1
    ) -> list[StoreEvent]:
        """Segments ``start:stop`` of a native batch (``sniffer._native.SegmentBatch``)
        in one call: exactly what ``feed`` gives for each of them in turn. With
        ``n > 1``, only worker ``k``'s share of the connections (replay's split by
        port pair). Native pipelines only (``self.native``)."""
        assert self._core is not None, "feed_batch needs the native core"
        hevs, fed, skipped, errors = self._core.feed_batch(batch, start, stop, k, n)
        self.segments += fed
        self.skipped += skipped
        return self._outputs(hevs, errors)

    @staticmethod
    def _dropped(ts: float, message: str) -> PipelineError:
        """A segment lost because the reassembler failed on it (no connection id)."""
        return PipelineError(ts, "reassembly", "internal", f"{message} (segment dropped)")

    def feed_flows(self, flows: Iterable[FlowEvent]) -> list[StoreEvent]:
        """Ordered flow events in (the eBPF backend needs no reassembly)."""
        if self._core is not None:
            return self._outputs(*self._core.feed_flows(flows))
        return self._flows(flows)

    def capture_gap(self, gap: CaptureGap) -> list[StoreEvent]:
        out: list[StoreEvent] = [
            PipelineError(gap.ts, "capture", f"{gap.source}-drop", f"{gap.dropped} packets lost")
        ]
        if self._core is not None:
            out += self._outputs(*self._core.capture_gap(gap))
        else:
            out.extend(self._flows(self.reassembler.capture_gap(gap)))
        return out

    def expire(self, now: float) -> list[StoreEvent]:
        """Close idle connections (capture time)."""
        if self._core is not None:
            return self._outputs(*self._core.expire(now))
        return self._flows(self.reassembler.expire(now))

    def flush(self, ts: float) -> list[StoreEvent]:
        """End of capture: close everything that is still open."""
        if self._core is not None:
            return self._outputs(*self._core.flush(ts))
        return self._flows(self.reassembler.flush(ts))

    def _outputs(self, hevs: list[HttpOutput | None], errors: NativeErrors) -> list[StoreEvent]:
        """The native core's HTTP events on through gRPC and streams, its
        errors recorded where they happened (see ``sniffer._native.Core``)."""
        out: list[StoreEvent] = []
        if not errors:
            if hevs:
                self._consume(hevs, 0, len(hevs), out)
            return out
        at = 0
        for pos, ts, message, conn in errors:
            self._consume(hevs, at, pos, out)
            at = pos
            self.internal_errors += 1
            if conn is None:  # no connection id: the segment dropped
                out.append(self._dropped(ts, message))
            else:  # the HTTP stage raised on this connection's flow event
                out.append(
                    PipelineError(
                        ts, "pipeline", "internal", f"{message} (connection dropped)", conn
                    )
                )
        self._consume(hevs, at, len(hevs), out)
        return out

    def _consume(
        self, hevs: list[HttpOutput | None], start: int, stop: int, out: list[StoreEvent]
    ) -> None:
        """HTTP events ``start:stop`` of a native call through gRPC and streams.
        A ``None`` stands for a response body the core holds: each run of them
        goes to the streams stage in one call (``StreamAssembler.feed_held``),
        which gives what ``feed_into`` gives for each and leaves to this loop
        those it does not take. A bug costs the connection (as in ``_flows``):
        the rest of the outputs of the flow event on which it struck are left
        out, the connection abandoned, and its later outputs of the same call
        are what a dead connection gives (its opening, ends, closing and
        anomalies, no exchange)."""
        streams = self.streams
        feed = streams.feed_into
        feed_held = streams.feed_held
        core = self._core
        grpc = self.grpc
        calls = grpc.open_calls  # non-empty: gRPC calls in progress (grpc.active)
        dead: set[int] = set()
        i = start
        while i < stop:
            try:
                while i < stop:
                    hev = hevs[i]
                    if hev is None:  # a run of held response bodies
                        i, exc = feed_held(core, i, stop, out, dead, calls)
                        if i == stop:
                            return
                        hev = hevs[i]
                        if hev is None:  # a body left to this loop: as an HttpBody
                            hev = core.body(i)
                            if exc is not None:  # raised on it inside the stage
                                streams.contain(hev, exc, out)
                                i += 1
                                continue
                    if dead and hev.conn in dead:
                        kept = _dead_output(hev)
                        if kept is None:
                            i += 1
                            continue
                        hev = kept
                    if calls or type(hev) is HttpRequest:
                        for gev in grpc.feed(hev):
                            feed(gev, out)
                    else:
                        feed(hev, out)
                    i += 1
                return
            except Exception as exc:  # a bug must cost one connection, never the capture
                self.internal_errors += 1
                origin = core.origin(i)
                if origin is None:
                    failed = hevs[i]
                    conn = (failed if failed is not None else core.body(i)).conn
                    origin = (conn, 0.0, i + 1)
                conn, ts, end = origin
                self.http.abandon(conn)
                dead.add(conn)
                out.append(
                    PipelineError(
                        ts,
                        "pipeline",
                        "internal",
                        f"{type(exc).__name__}: {exc} (connection dropped)",
                        conn,
                    )
                )
                i = max(end, i + 1)

    def _flows(self, flows: Iterable[FlowEvent]) -> list[StoreEvent]:
        out: list[StoreEvent] = []
        http = self.http.feed
        streams = self.streams.feed_into
        grpc = self.grpc
        calls = grpc.open_calls  # non-empty: gRPC calls in progress (grpc.active)
        for fev in flows:
            try:
                for hev in http(fev):
                    if calls or type(hev) is HttpRequest:
                        for gev in grpc.feed(hev):
                            streams(gev, out)
                    else:
                        streams(hev, out)
            except Exception as exc:  # a bug must cost one connection, never the capture
                self.internal_errors += 1
                self.http.abandon(fev.conn)
                out.append(
                    PipelineError(
                        fev.ts,
                        "pipeline",
                        "internal",
                        f"{type(exc).__name__}: {exc} (connection dropped)",
                        fev.conn,
                    )
                )
        return out

    # ----------------------------------------------------------- checkpoints

    def checkpoint(
        self, flow_positions: Mapping[int, dict[str, Any]] | None = None, now: float | None = None
    ) -> list[dict[str, Any]]:
        """Graceful stop: the state of every connection whose server is streaming
        a chunked LLM response, JSON-ready, for the next instance to ``adopt``.
        Those connections are dropped from this pipeline WITHOUT closing their
        streams (a following ``flush`` closes only the others): their rows stay
        open until the next instance writes their summary at the real end.
        Packet capture: the reassembler's sequence numbers (``seq``); eBPF: the
        source's ``flow_positions`` (connection id → socket and TCP sequence
        numbers, kept as ``ebpf``). Other connections are left alone. ``now``
        (wall clock): a connection adopted moments ago and not heard from since
        is handed over again rather than ended."""
        entries: list[dict[str, Any]] = []
        for conn in self.http.connection_ids():
            seqs = self.reassembler.checkpoint(conn, now)
            pos = flow_positions.get(conn) if flow_positions is not None else None
            if seqs is None and pos is None:
                continue
            http = self.http.checkpoint(conn)
            if http is None:
                continue
            stream = self.streams.checkpoint(conn, int(http["exchange"]))
            if stream is None:
                continue
            where: dict[str, Any] = (
                {"seq": {"c2s": seqs[0], "s2c": seqs[1]}} if seqs is not None else {"ebpf": pos}
            )
            entries.append({"conn": conn, **where, "http": http, **stream})
        for e in entries:
            self.reassembler.forget(e["conn"])
            self.http.forget(e["conn"])
            self.streams.forget(e["conn"])
        return entries

    def adopt(self, entries: Iterable[dict[str, Any]], ts: float) -> int:
        """Take over the connections of a checkpoint (see :meth:`checkpoint`); the
        first segment of each shows exactly how many bytes were missed (eBPF
        entries: give their ``ebpf`` positions to the source's ``adopt``). Returns
        how many were adopted (malformed entries are skipped)."""
        n = 0
        for e in entries:
            try:
                conn = int(e["conn"])
                client = (str(e["client"][0]), int(e["client"][1]))
                server = (str(e["server"][0]), int(e["server"][1]))
                http = e["http"]
                exchange = int(http["exchange"])
                if "seq" in e:  # packet capture (eBPF: the source picks the socket up)
                    self.reassembler.adopt(
                        conn, ts, client, server, int(e["seq"]["c2s"]), int(e["seq"]["s2c"])
                    )
                self.http.adopt(
                    ConnectionOpened(conn, ts, client, server, False, str(e.get("capture"))),
                    exchange,
                    int(http["next_exchange"]),
                    str(http["method"]),
                    bool(http["clean"]),
                    None if http.get("lost", 0) is None else int(http.get("lost") or 0),
                    int(http.get("gaps") or 0),
                )
                self.streams.adopt(conn, exchange, ts, e)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            n += 1
        return n

    def close_checkpointed(self, entries: Iterable[dict[str, Any]], ts: float) -> list[StoreEvent]:
        """A checkpoint too old to adopt: close its streams as gapped (their rows
        were left open by the instance that wrote it)."""
        out: list[StoreEvent] = []
        for e in entries:
            try:
                conn = int(e["conn"])
                self.streams.adopt(conn, int(e["http"]["exchange"]), ts, e)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            out.extend(self.streams.close_adopted(conn, ts, "sidecar restarted; checkpoint stale"))
        return out

    def set_labels(self, labels: Mapping[int, str]) -> None:
        """Server port → label, for streams opened from now on (config reload)."""
        self.streams.set_labels(labels)

    def set_ports(self, only_ports: frozenset[int]) -> None:
        """Only segments on these ports from now on (empty: all); config reload."""
        self._only = only_ports
        if type(self.reassembler) is NativeReassembler:
            self.reassembler.set_only_ports(only_ports)

    @property
    def open_streams(self) -> int:
        return self.streams.open_streams

    def reassembly_counts(self) -> dict[str, int]:
        """The TCP reassembly counters so far, by ``REASSEMBLY_KINDS`` (in that
        order; monotonic for one pipeline), and ``lost-bytes``: bytes declared lost."""
        r = self.reassembler.stats
        seen = self.streams.stats.anomalies
        counts = {
            "retransmission": r.retransmissions,
            "overlap-mismatch": r.overlaps_inconsistent,
            "out-of-order": r.out_of_order,
            "buffer-cap": r.buffer_cap_hits,
            "out-of-window": seen.get("out-of-window", 0),
            "after-fin": seen.get("after-fin", 0),
            "gap": r.gaps,
            "midstream": r.midstream,
            "port-reuse": r.port_reuse,
        }
        assert tuple(counts) == REASSEMBLY_KINDS
        counts["lost-bytes"] = r.gap_bytes
        return counts

    @property
    def open_connections(self) -> int:
        return self.http.open_connections
