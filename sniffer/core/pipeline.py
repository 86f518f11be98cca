"""The sans-IO pipeline: reassembly → http1 → streams, composed.

One ``Pipeline`` per capture run. It owns no thread, socket, file or clock:
the replay command and the daemon drive it with segments (packet capture) or
flow events (eBPF capture) and write what it returns to the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sniffer.core.events import (
    CaptureGap,
    FlowEvent,
    HttpRequest,
    PipelineError,
    Segment,
    StoreEvent,
)
from sniffer.core.grpc import TEXT_OUTPUTS, GrpcSplitter, ProtoCatalog
from sniffer.core.http1 import HttpParser
from sniffer.core.reassembly import Reassembler
from sniffer.core.streams import StreamAssembler


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    conn_id_base: int = 1
    stream_id_base: int = 1
    id_step: int = 1  # parallel replay: worker k of n uses bases + k and step n
    server_ports: frozenset[int] = frozenset()  # helps orient mid-stream connections
    only_ports: frozenset[int] = frozenset()  # non-empty: ignore segments on other ports
    labels: Mapping[int, str] | None = None  # server port → label
    idle_timeout: float = 300.0
    hole_timeout: float = 1.0
    # KServe v2 gRPC: names of the BYTES output tensor that carries the text, tried in order.
    grpc_text_outputs: tuple[str, ...] = TEXT_OUTPUTS
    # gRPC: a serialized FileDescriptorSet; messages of the methods it describes are decoded.
    proto_descriptors: bytes | None = None


class Pipeline:
    def __init__(self, config: PipelineConfig | None = None) -> None:
        cfg = config or PipelineConfig()
        self.config = cfg
        self.reassembler = Reassembler(
            conn_id_base=cfg.conn_id_base,
            id_step=cfg.id_step,
            server_ports=cfg.server_ports | cfg.only_ports | frozenset((cfg.labels or {}).keys()),
            idle_timeout=cfg.idle_timeout,
            hole_timeout=cfg.hole_timeout,
        )
        self.http = HttpParser()
        catalog = ProtoCatalog(cfg.proto_descriptors) if cfg.proto_descriptors else None
        self.grpc = GrpcSplitter(cfg.grpc_text_outputs, catalog)
        self.streams = StreamAssembler(
            stream_id_base=cfg.stream_id_base, id_step=cfg.id_step, labels=cfg.labels
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
        flows = self.reassembler.feed(seg)
        if not flows:
            return []
        return self._flows(flows)

    def feed_flows(self, flows: Iterable[FlowEvent]) -> list[StoreEvent]:
        """Ordered flow events in (the eBPF backend needs no reassembly)."""
        return self._flows(flows)

    def capture_gap(self, gap: CaptureGap) -> list[StoreEvent]:
        out: list[StoreEvent] = [
            PipelineError(gap.ts, "capture", f"{gap.source}-drop", f"{gap.dropped} packets lost")
        ]
        out.extend(self._flows(self.reassembler.capture_gap(gap)))
        return out

    def expire(self, now: float) -> list[StoreEvent]:
        """Close idle connections (capture time)."""
        return self._flows(self.reassembler.expire(now))

    def flush(self, ts: float) -> list[StoreEvent]:
        """End of capture: close everything that is still open."""
        return self._flows(self.reassembler.flush(ts))

    def _flows(self, flows: Iterable[FlowEvent]) -> list[StoreEvent]:
        out: list[StoreEvent] = []
        http = self.http.feed
        streams = self.streams.feed
        grpc = self.grpc
        for fev in flows:
            try:
                for hev in http(fev):
                    if grpc.active or type(hev) is HttpRequest:
                        for gev in grpc.feed(hev):
                            out.extend(streams(gev))
                    else:
                        out.extend(streams(hev))
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

    def set_labels(self, labels: Mapping[int, str]) -> None:
        """Server port → label, for streams opened from now on (config reload)."""
        self.streams.set_labels(labels)

    def set_ports(self, only_ports: frozenset[int]) -> None:
        """Only segments on these ports from now on (empty: all); config reload."""
        self._only = only_ports

    @property
    def open_streams(self) -> int:
        return self.streams.open_streams

    @property
    def open_connections(self) -> int:
        return self.http.open_connections
