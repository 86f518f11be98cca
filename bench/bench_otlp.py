"""Benchmark of the OTLP export (sniffer.record.otlp).

What the capture path pays: the exporter's ``observe`` over store events
(streams x chunks, as the pipeline emits them), next to the Prometheus
``Metrics.observe`` for scale; with a real local OTLP/HTTP receiver (the
test suite's, decoding the protobuf), chunk span events off and on, and with
an unreachable collector (the export thread stuck in retries, the queue
full). Then the export side: spans/s delivered to the receiver.

    python bench/bench_otlp.py [--streams 2000] [--chunks 60]
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sniffer.core.events import (
    ChunkEvent,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary, Usage
from sniffer.record.metrics import Metrics
from sniffer.record.otlp import OtlpExporter, OtlpOptions


def events(streams: int, chunks: int) -> list[list[StoreEvent]]:
    """Batches of ~500 events: streams interleaved 8 at a time, as on a busy node."""
    out: list[StoreEvent] = []
    for g in range(0, streams, 8):
        group = range(g, min(g + 8, streams))
        t0 = 1000.0 + g
        for s in group:
            out.append(
                StreamOpened(
                    stream=s,
                    conn=s,
                    exchange=0,
                    ts=t0,
                    client=("127.0.0.1", 40000 + s % 20000),
                    server=("127.0.0.1", 8000),
                    method="POST",
                    path="/v1/chat/completions",
                    request_headers=(),
                    request_body='{"model":"m","stream":true}',
                    request=RequestSummary(model="llama-70b", stream=True),
                    dialect="openai.chat",
                    label="baseline",
                )
            )
            out.append(StreamResponse(s, t0 + 0.01, 200, (), "text/event-stream", True))
        for i in range(chunks):
            for s in group:
                out.append(ChunkEvent(s, t0 + 0.1 + 0.01 * i, i, 0, i + 1, "content", "tok "))
        for s in group:
            out.append(
                StreamClosed(
                    stream=s,
                    ts=t0 + 0.2 + 0.01 * chunks,
                    state=StreamState.COMPLETE,
                    reason="finished",
                    done_seen=True,
                    gap=False,
                    t_first_content=t0 + 0.1,
                    t_last_chunk=t0 + 0.1 + 0.01 * (chunks - 1),
                    chunk_count=chunks,
                    event_count=chunks,
                    text_len=4 * chunks,
                    finish_reasons=((0, "stop"),),
                    usage=Usage.parse({"prompt_tokens": 12, "completion_tokens": chunks}),
                    response_body=None,
                )
            )
    return [out[i : i + 500] for i in range(0, len(out), 500)]


def timed_observe(observe: Any, batches: list[list[StoreEvent]]) -> float:
    t = time.perf_counter()
    for b in batches:
        observe(b)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--chunks", type=int, default=60)
    args = ap.parse_args()
    from tests.otlp_receiver import start_receiver

    batches = events(args.streams, args.chunks)
    n = sum(len(b) for b in batches)
    print(f"{args.streams} streams x {args.chunks} chunks = {n:,} store events")

    m = Metrics()
    dt = timed_observe(m.observe, batches)
    print(f"Metrics.observe (Prometheus, for scale): {dt * 1e6 / n:.2f} µs/event")

    for chunk_events in (False, True):
        rx = start_receiver()
        ex = OtlpExporter(
            OtlpOptions(endpoint=rx.url, node="bench", chunk_events=chunk_events, queue_size=4096)
        )
        dt = timed_observe(ex.observe, batches)
        t = time.perf_counter()
        ex.close()
        drain = time.perf_counter() - t
        got = len(rx.spans)
        rx.close()
        what = "on " if chunk_events else "off"
        print(
            f"OtlpExporter.observe, chunk events {what}: {dt * 1e6 / n:.2f} µs/event "
            f"({n / dt:,.0f} events/s); {got}/{args.streams} spans at the receiver, "
            f"{ex.dropped} dropped; {ex.exported_spans / (dt + drain):,.0f} spans/s end to end"
        )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    ex = OtlpExporter(
        OtlpOptions(endpoint=f"http://127.0.0.1:{dead}", queue_size=256, timeout=2.0),
        metrics=Metrics(),
    )
    dt = timed_observe(ex.observe, batches)
    ex.close()
    print(
        f"OtlpExporter.observe, collector unreachable: {dt * 1e6 / n:.2f} µs/event; "
        f"{ex.dropped} of {args.streams} streams dropped (queue 256), "
        f"{ex.failures['traces']} failed span batches"
    )


if __name__ == "__main__":
    main()
