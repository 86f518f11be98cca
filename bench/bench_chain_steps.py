"""CPU per chunk event of the recording chain's Python steps on replay's own batches.

Replays the capture once (``--jobs 1``, no tokens) and keeps every batch the
recording chain was handed (``RecordingChain.write``), then times, best of
``--runs`` by CPU (``time.process_time``, the cycle collector off), each
step alone over those batches:

- ``redact``: ``StreamRedactor.events`` (and ``take_redactions``, as the chain
  with a token collector runs it);
- ``chain``: ``RecordingChain.write`` with a writer that keeps nothing and the
  redactor on (the tracker, the redactor; no token collector);
- ``metrics``: ``Metrics.observe`` (its own tracker, output times on);
- ``daemon``: ``RecordingChain.write`` with metrics and the redactor (the
  daemon's chain without the token collector and the writer).

``--texts live`` rewrites every chunk text to ``w<stream>.<seq> `` (the live
benchmark's digit-bearing texts). Every figure is divided by the number of
chunk events. For exact comparisons count instructions (``valgrind
--tool=callgrind``, ``PYTHONHASHSEED=0``, against a run with ``--only none``).

    python bench/bench_chain_steps.py [--capture bench/out/bench.pcap] [--texts live]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sniffer.core.events import ChunkEvent, StoreEvent  # noqa: E402
from sniffer.record.chain import RecordingChain, RecordingOptions  # noqa: E402
from sniffer.record.metrics import Metrics  # noqa: E402
from sniffer.record.redact import Redactor, StreamRedactor  # noqa: E402
from sniffer.runtime.replay import replay  # noqa: E402

STEPS = ("redact", "chain", "metrics", "daemon")


class _NullWriter:
    def write_many(self, events: list[StoreEvent]) -> None:
        pass


def batches_of(capture: Path) -> list[list[StoreEvent]]:
    """The batches replay hands the recording chain, in order."""
    kept: list[list[StoreEvent]] = []
    original = RecordingChain.write

    def write(self: RecordingChain, events: list[StoreEvent]) -> None:
        kept.append(list(events))
        original(self, events)

    RecordingChain.write = write  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as d:
            chain = RecordingChain.from_config(RecordingOptions(tokens=False))
            replay(capture, str(Path(d) / "x.db"), chain=chain)
    finally:
        RecordingChain.write = original  # type: ignore[method-assign]
    return kept


def run(step: str, batches: list[list[StoreEvent]]) -> None:
    if step == "redact":
        sr = StreamRedactor(Redactor())
        sr.track_redactions = True
        for b in batches:
            sr.events(b)
            sr.take_redactions()
        sr.flush()
    elif step in ("chain", "daemon"):
        metrics = Metrics() if step == "daemon" else None
        ch = RecordingChain(_NullWriter(), redactor=Redactor(), metrics=metrics)  # type: ignore[arg-type]
        if step == "chain":
            assert ch.stream_redactor is not None
            ch.stream_redactor.track_redactions = True
        for b in batches:
            ch.write(b)
        ch.drain()
    elif step == "metrics":
        m = Metrics()
        for b in batches:
            m.observe(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", type=Path, default=REPO / "bench/out/bench.pcap")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--texts", choices=("capture", "live"), default="capture")
    ap.add_argument("--only", choices=(*STEPS, "none"), default=None)
    args = ap.parse_args()
    batches = batches_of(args.capture)
    if args.texts == "live":
        batches = [
            [
                replace(e, text=f"w{e.stream % 1000}.{e.seq} ")
                if type(e) is ChunkEvent and e.text
                else e
                for e in b
            ]
            for b in batches
        ]
    chunks = sum(1 for b in batches for e in b if type(e) is ChunkEvent)
    steps: tuple[Any, ...] = STEPS if args.only is None else (args.only,)
    gc.disable()
    for step in steps:
        if step == "none":
            continue
        best = min(_cpu(step, batches) for _ in range(args.runs))
        per = best / chunks * 1e6
        print(f"{step:8} {best * 1e3:8.1f} ms  {per:6.3f} us/chunk ({chunks} chunks)")


def _cpu(step: str, batches: list[list[StoreEvent]]) -> float:
    t = time.process_time()
    run(step, batches)
    return time.process_time() - t


if __name__ == "__main__":
    main()
