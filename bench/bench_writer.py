"""CPU per chunk event of the SQLite writer alone: its row building and its flushes.

Replays the capture once through the pipeline and the recording chain
(redaction on, no tokens), keeping the store events the writer would get, in
the batches the chain hands over. Then, best of ``--runs`` by CPU time
(``time.process_time``), into a new SQLite file each run:

- ``rows``: ``StoreWriter.write_many`` over every batch with a batch size no
  batch reaches (events → buffered rows only);
- ``flush``: the one flush of all those rows (``executemany`` and the
  transaction);
- ``replay``: both as replay runs them (flushes every ``--batch`` rows), then
  ``close``.

Every figure is divided by the number of chunk events. On a shared machine
take the best of several runs; for exact comparisons count instructions
(``valgrind --tool=callgrind``) instead.

    python bench/bench_writer.py [--capture bench/out/bench.pcap] [--runs 5]
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
from sniffer.store.writer import StoreWriter  # noqa: E402


class _Keep:
    """Stands in for the writer at the end of the chain: keeps what it is given."""

    def __init__(self, real: StoreWriter) -> None:
        self.batches: list[list[StoreEvent]] = []
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def write_many(self, events: list[StoreEvent]) -> None:
        self.batches.append(list(events))

    def write(self, event: StoreEvent) -> None:
        self.batches.append([event])

    def flush(self) -> None:
        pass


def _events(capture: Path, tmp: str) -> list[list[StoreEvent]]:
    w = StoreWriter(os.path.join(tmp, "ids.db"), node="bench")
    keep = _Keep(w)
    chain = RecordingChain.from_config(RecordingOptions(tokens=False))
    chain.attach(keep)  # type: ignore[arg-type]
    pipe = Pipeline(PipelineConfig(conn_ids=w.conn_ids, stream_ids=w.stream_ids))
    for batch in pipeline_batches(pipe, list(read_capture(capture))):
        chain.write(batch)
    chain.drain()
    chain.flush()
    w.close()
    return keep.batches


def _cpu_run(batches: list[list[StoreEvent]], tmp: str, run: int, batch: int) -> dict[str, float]:
    w = StoreWriter(os.path.join(tmp, f"a{run}.db"), batch_size=10**9, node="bench")
    t = time.process_time()
    for b in batches:
        w.write_many(b)
    rows = time.process_time() - t
    t = time.process_time()
    w.flush()
    flush = time.process_time() - t
    w.close()
    w = StoreWriter(os.path.join(tmp, f"b{run}.db"), batch_size=batch, node="bench")
    t = time.process_time()
    for b in batches:
        w.write_many(b)
    w.close()
    return {"rows": rows, "flush": flush, "replay": time.process_time() - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=REPO / "bench" / "out" / "bench.pcap")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=20_000, help="writer batch size (replay's)")
    ns = ap.parse_args()
    gc.set_threshold(200_000, 50, 100)  # as replay sets it
    with tempfile.TemporaryDirectory() as tmp:
        batches = _events(ns.capture, tmp)
        chunks = sum(type(ev) is ChunkEvent for b in batches for ev in b)
        best: dict[str, float] = {}
        for run in range(ns.runs):
            for k, v in _cpu_run(batches, tmp, run, ns.batch).items():
                best[k] = min(best.get(k, v), v)
    if not chunks:
        print("no chunk events in the capture")
        return 1
    print(f"{ns.capture}: {chunks:,} chunk events; best of {ns.runs} runs, CPU")
    for k, v in best.items():
        print(f"  {k:8s} {v:7.3f} s {1e6 * v / chunks:7.2f} µs/event")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
