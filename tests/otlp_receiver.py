"""A small real OTLP/HTTP receiver for the tests: what a collector would see.

A ``ThreadingHTTPServer`` on 127.0.0.1 that accepts ``POST /v1/traces`` and
``POST /v1/metrics`` (protobuf, gzip or not), decodes them with
``opentelemetry-proto`` and keeps the spans and metric data points.
``hold()`` makes every request wait (until ``release()``, bounded) to play a
stalled collector; ``status`` makes it refuse batches.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

HOLD_LIMIT = 60.0  # seconds a held request waits at most


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attrs(v.kvlist_value.values)
    return getattr(v, kind)


def attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        assert isinstance(kv, KeyValue)
        out[kv.key] = value(kv.value)
    return out


@dataclass
class Span:
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    events: list[tuple[str, int, dict[str, Any]]]
    resource: dict[str, Any]
    scope: str
    schema_url: str


@dataclass
class Point:
    """One histogram data point (cumulative)."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    count: int
    sum: float
    bounds: list[float]
    bucket_counts: list[int]
    time_ns: int
    schema_url: str


@dataclass
class Receiver:
    server: ThreadingHTTPServer
    spans: list[Span] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=lambda: {"traces": 0, "metrics": 0})
    headers: list[dict[str, str]] = field(default_factory=list)
    status: int = 200
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Event = field(default_factory=threading.Event)
    _go: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._go.set()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def hold(self) -> None:
        self._go.clear()

    def release(self) -> None:
        self._go.set()

    def latest(self, metric: str) -> list[Point]:
        """The last reported point of ``metric`` for each attribute set (cumulative)."""
        with self.lock:
            best: dict[tuple[Any, ...], Point] = {}
            for p in self.points:
                if p.metric != metric:
                    continue
                key = tuple(sorted((k, str(v)) for k, v in p.attributes.items()))
                if key not in best or p.time_ns >= best[key].time_ns:
                    best[key] = p
            return list(best.values())

    def wait(self, predicate: Any, steps: int = 400, step: float = 0.05) -> bool:
        for _ in range(steps):
            with self.lock:
                if predicate(self):
                    return True
            time.sleep(step)
        return False

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def _decode(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    return body


def _handler(rx: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = _decode(self.rfile.read(length), self.headers.get("Content-Encoding", ""))
            signal = self.path.rsplit("/", 1)[-1]
            rx.arrived.set()
            rx._go.wait(HOLD_LIMIT)
            with rx.lock:
                rx.requests[signal] = rx.requests.get(signal, 0) + 1
                rx.headers.append({k.lower(): v for k, v in self.headers.items()})
                status = rx.status
                if status == 200:
                    if self.path == "/v1/traces":
                        _traces(rx, body)
                    elif self.path == "/v1/metrics":
                        _metrics(rx, body)
                    else:
                        status = 404
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


def _traces(rx: Receiver, body: bytes) -> None:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    for rs in req.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                rx.spans.append(
                    Span(
                        name=s.name,
                        kind=s.kind,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=attrs(s.attributes),
                        status_code=s.status.code,
                        events=[(e.name, e.time_unix_nano, attrs(e.attributes)) for e in s.events],
                        resource=resource,
                        scope=ss.scope.name,
                        schema_url=ss.schema_url,
                    )
                )


def _metrics(rx: Receiver, body: bytes) -> None:
    req = ExportMetricsServiceRequest()
    req.ParseFromString(body)
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.WhichOneof("data") != "histogram":
                    continue
                for dp in m.histogram.data_points:
                    rx.points.append(
                        Point(
                            metric=m.name,
                            unit=m.unit,
                            attributes=attrs(dp.attributes),
                            count=dp.count,
                            sum=dp.sum,
                            bounds=list(dp.explicit_bounds),
                            bucket_counts=list(dp.bucket_counts),
                            time_ns=dp.time_unix_nano,
                            schema_url=sm.schema_url,
                        )
                    )


def start_receiver() -> Receiver:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.daemon_threads = True
    rx = Receiver(server)
    server.RequestHandlerClass = _handler(rx)
    threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True).start()
    return rx


def receiver() -> Iterator[Receiver]:
    rx = start_receiver()
    try:
        yield rx
    finally:
        rx.close()
