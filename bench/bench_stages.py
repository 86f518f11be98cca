"""CPU per chunk event of each replay stage, in one process (no start-up, no tokens).

Reads the capture once, then, best of ``--runs`` by CPU time
(``time.process_time``):

- ``read``: pcap records → ``Segment`` (``read_capture``);
- ``reassembly``, ``http1``, ``streams``: each pipeline stage alone, fed the
  previous stage's output (their sum is less than ``pipeline``, which also
  pays the glue between them);
- ``pipeline``: ``Pipeline.feed`` over every segment (what replay runs);
- ``chain``: the recording chain (redaction, the writer's row building, and
  the writer's flushes at ``--batch`` rows) on the pipeline's output, in
  batches of 512 events as replay hands them over;
- ``flush``: the final flush and close.

With the native core (``sniffer._native``), the same for its stages beside
the pure ones: ``read native`` (``reader.segment_batches()``: pcap records →
batches of segments, in Rust), ``reassembly native`` (``feed_batch`` over
those batches, the Python flow events made) and ``pipeline native``
(``Pipeline.feed_batch``, what replay runs with the native core).
``SPARSEETY_PURE=1`` leaves them out.

Every figure is divided by the number of chunk events. On a shared machine
take the best of several runs; for exact comparisons count instructions
(``valgrind --tool=callgrind``) instead.

    python bench/bench_stages.py [--capture bench/out/bench.pcap] [--runs 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.batches import pipeline_batches  # noqa: E402
from sniffer.capture.pcap import read_capture  # noqa: E402
from sniffer.core.events import Segment, StoreEvent  # noqa: E402
from sniffer.core.native import NATIVE, NativeReassembler  # noqa: E402
from sniffer.core.pipeline import Pipeline, PipelineConfig  # noqa: E402
from sniffer.record.chain import RecordingChain, RecordingOptions  # noqa: E402
from sniffer.store.writer import StoreWriter  # noqa: E402


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.process_time()
    result = fn()
    return time.process_time() - t, result


def _native_stages(capture: Path) -> dict[str, float]:
    """read, reassembly and pipeline with the native core."""
    t_read, batches = _cpu(lambda: list(read_capture(capture).segment_batches()))
    last = next(b.last_ts for b in reversed(batches) if len(b))
    r = NativeReassembler()

    def reassembly() -> list[Any]:
        flows: list[Any] = []
        for b in batches:
            flows.extend(r.feed_batch(b)[0])
        flows.extend(r.flush(last))
        return flows

    t_reasm, _ = _cpu(reassembly)
    pipe = Pipeline(PipelineConfig(native=True))

    def pipeline() -> None:
        for b in batches:
            pipe.feed_batch(b)
        pipe.flush(last)

    t_pipe, _ = _cpu(pipeline)
    return {"read native": t_read, "reassembly native": t_reasm, "pipeline native": t_pipe}


def _stages(segs: list[Segment]) -> dict[str, float]:
    pipe = Pipeline(PipelineConfig(native=False))
    rfeed = pipe.reassembler.feed

    def reassembly() -> list[Any]:
        flows: list[Any] = []
        for s in segs:
            out = rfeed(s)
            if out:
                flows.extend(out)
        flows.extend(pipe.reassembler.flush(segs[-1].ts))
        return flows

    t_reasm, flows = _cpu(reassembly)
    hfeed = pipe.http.feed

    def http1() -> list[Any]:
        hevs: list[Any] = []
        for f in flows:
            hevs.extend(hfeed(f))
        return hevs

    t_http, hevs = _cpu(http1)
    sfeed = pipe.streams.feed_into

    def streams() -> list[StoreEvent]:
        out: list[StoreEvent] = []
        for h in hevs:
            sfeed(h, out)
        return out

    t_streams, _ = _cpu(streams)
    return {"reassembly": t_reasm, "http1": t_http, "streams": t_streams}


def _replay(segs: list[Segment], tmp: str, batch: int) -> tuple[dict[str, float], int]:
    w = StoreWriter(os.path.join(tmp, "bench.db"), batch_size=batch, node="bench")
    chain = RecordingChain.from_config(RecordingOptions(tokens=False))
    chain.attach(w)
    pipe = Pipeline(PipelineConfig(conn_ids=w.conn_ids, stream_ids=w.stream_ids, native=False))
    t_pipe, batches = _cpu(lambda: pipeline_batches(pipe, segs))

    def record() -> None:
        for b in batches:
            chain.write(b)
        chain.drain()

    t_chain, _ = _cpu(record)

    def close() -> None:
        chain.flush()
        w.close()

    t_flush, _ = _cpu(close)
    times = {"pipeline": t_pipe, "chain": t_chain, "flush": t_flush}
    return times, pipe.streams.stats.chunk_events


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=REPO / "bench" / "out" / "bench.pcap")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=20_000, help="writer batch size (replay's)")
    ns = ap.parse_args()
    gc.set_threshold(200_000, 50, 100)  # as replay sets it
    best: dict[str, float] = {}
    events = 0
    for _ in range(ns.runs):
        t_read, segs = _cpu(lambda: list(read_capture(ns.capture)))
        times = {"read": t_read, **_stages(segs)}
        with tempfile.TemporaryDirectory() as tmp:
            more, events = _replay(segs, tmp, ns.batch)
        times.update(more)
        if NATIVE is not None:
            times.update(_native_stages(ns.capture))
        for k, v in times.items():
            best[k] = min(best.get(k, v), v)
        del segs
    if not events:
        print("no chunk events in the capture")
        return 1
    print(f"{ns.capture}: {events:,} chunk events; best of {ns.runs} runs, CPU")
    for k, v in best.items():
        print(f"  {k:18s} {v:7.3f} s {1e6 * v / events:7.2f} µs/event")
    total = best["read"] + best["pipeline"] + best["chain"] + best["flush"]
    print(
        f"  {'total':18s} {total:7.3f} s {1e6 * total / events:7.2f} µs/event"
        " (read + pipeline + chain + flush)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
