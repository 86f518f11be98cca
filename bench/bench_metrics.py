"""CPU per chunk event of the Prometheus metrics: ``Metrics.observe`` and
``Metrics.observe_tokens``, on the real events of a capture.

Runs the pipeline over the capture once (batches of 512 events, as replay
hands them over) and the recording chain with its token pass once, keeping
the events and the token figures the chain hands to ``observe_tokens`` (real
``tokens_per_chunk``). Then, best of ``--runs`` by CPU time
(``time.process_time``), feeds them to a fresh :class:`Metrics`:

- ``observe``: every batch, in order (the capture path);
- ``observe_tokens``: every stream's token figures (the token thread);
- ``render``: one scrape of the result (not per event: for scale).

Figures are divided by the number of chunk events. On a shared machine take
the best of several runs and interleave A/B runs of the trees compared.

    python bench/bench_metrics.py [--capture bench/out/bench.pcap] [--runs 7]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.batches import pipeline_batches  # noqa: E402
from sniffer.capture.pcap import read_capture  # noqa: E402
from sniffer.core.events import ChunkEvent, StoreEvent  # noqa: E402
from sniffer.core.pipeline import Pipeline, PipelineConfig  # noqa: E402
from sniffer.record.chain import RecordingChain, RecordingOptions  # noqa: E402
from sniffer.record.metrics import Metrics  # noqa: E402
from sniffer.runtime.replay import WRITE_EVERY  # noqa: E402
from sniffer.store.writer import StoreWriter  # noqa: E402

TokenCall = tuple[int, dict[str, Any]]


class _Recording(Metrics):
    """Metrics that keep the token figures they are given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[TokenCall] = []

    def observe_tokens(self, stream: int, **kw: Any) -> None:
        self.calls.append((stream, kw))
        super().observe_tokens(stream, **kw)


def _batches(capture: Path) -> list[list[StoreEvent]]:
    return pipeline_batches(Pipeline(PipelineConfig()), list(read_capture(capture)))


def _token_calls(batches: list[list[StoreEvent]], tmp: str) -> list[TokenCall]:
    rec = _Recording()
    chain = RecordingChain.from_config(RecordingOptions(redact=False), metrics=rec)
    chain.attach(StoreWriter(os.path.join(tmp, "bench.db"), batch_size=20_000, node="bench"))
    for b in batches:
        chain.write(b)
    chain.flush()
    for _ in range(len(batches) * WRITE_EVERY):  # bounded: at least one stream per pass
        if not chain.tokens_ready:
            break
        chain.tokenize(limit=256)
    chain.close()
    return rec.calls


def _run(batches: list[list[StoreEvent]], calls: list[TokenCall]) -> dict[str, float]:
    m = Metrics()
    observe, observe_tokens = m.observe, m.observe_tokens
    t0 = time.process_time()
    for b in batches:
        observe(b)
    t1 = time.process_time()
    for stream, kw in calls:
        observe_tokens(stream, **kw)
    t2 = time.process_time()
    m.render()
    t3 = time.process_time()
    return {"observe": t1 - t0, "observe_tokens": t2 - t1, "render": t3 - t2}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=REPO / "bench" / "out" / "bench.pcap")
    ap.add_argument("--runs", type=int, default=7)
    ns = ap.parse_args()
    batches = _batches(ns.capture)
    events = sum(1 for b in batches for e in b if type(e) is ChunkEvent)
    if not events:
        print("no chunk events in the capture")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        calls = _token_calls(batches, tmp)
    per_chunk = sum(len(kw.get("tokens_per_chunk", ())) for _, kw in calls)
    gc.collect()
    gc.set_threshold(200_000, 50, 100)  # as replay sets it
    best: dict[str, float] = {}
    for _ in range(ns.runs):
        for k, v in _run(batches, calls).items():
            best[k] = min(best.get(k, v), v)
    print(
        f"{ns.capture}: {events:,} chunk events, {len(calls):,} token figures "
        f"({per_chunk:,} tokens_per_chunk values); best of {ns.runs} runs, CPU"
    )
    for k in ("observe", "observe_tokens"):
        print(f"  {k:15s} {best[k]:7.3f} s {1e6 * best[k] / events:7.3f} µs/event")
    both = best["observe"] + best["observe_tokens"]
    print(f"  {'total':15s} {both:7.3f} s {1e6 * both / events:7.3f} µs/event")
    print(f"  {'render':15s} {best['render'] * 1e3:7.2f} ms (one scrape)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
