"""CPU per chunk event of the recording chain's observers, on a capture's batches
as the live daemon hands them to the chain.

Feeds the capture through a pipeline in batches of ``--packets`` packets (the
native core's ``segment_batches``, what a ring block holds live: 1,250 at the
live benchmark's rate) and keeps each batch's store events; then, best of
``--runs`` by CPU (``time.process_time``, the cycle collector off), drives a
fresh tracker, metrics and token collector over them as the chain does
(``tracker.observe``, each observer, ``tracker.release``) and times each
apart: ``tracker`` (its pass and its release), ``metrics``
(``Metrics.observe``), ``collector`` (``TokenCollector.observe``). Every
figure is divided by the number of chunk events. ``--only`` runs the tracker
and one observer (``none``: neither), for instruction counts (``valgrind
--tool=callgrind``, ``PYTHONHASHSEED=0``, ``--runs 1``, less a run with
``--only none``).

The live benchmark's traffic (1,000 streams x 100 SSE events, one event per
packet) is what these observers were measured on: record it with
``bench/bench_live.py`` or any capture of it, server port 18492.

    python bench/bench_observers.py [CAPTURE] [--port 18492] [--packets 1250]

Without a capture it takes the benchmark capture (``bench/out/bench.pcap``,
made by ``bench_replay.py`` earlier in ``make bench``), its server side told
by the handshakes (no ``--port``).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sniffer.capture.pcap import read_capture  # noqa: E402
from sniffer.core.events import ChunkEvent, StoreEvent  # noqa: E402
from sniffer.core.pipeline import Pipeline, PipelineConfig  # noqa: E402
from sniffer.record.metrics import Metrics  # noqa: E402
from sniffer.record.token_collector import TokenCollector  # noqa: E402
from sniffer.record.tracker import StreamTracker  # noqa: E402

PARTS = ("tracker", "metrics", "collector")


def batches_of(capture: Path, ports: frozenset[int], packets: int) -> list[list[StoreEvent]]:
    """The store events of each batch of ``packets`` packets, then the flush's."""
    pipe = Pipeline(PipelineConfig(only_ports=frozenset(), server_ports=ports))
    out: list[list[StoreEvent]] = []
    last = 0.0
    for b in read_capture(str(capture)).segment_batches(max_packets=packets):
        if len(b):
            last = max(last, b.ts(-1))
        if events := pipe.feed_batch(b):
            out.append(events)
    if events := pipe.flush(last + 3600):
        out.append(events)
    return out


def run(batches: list[list[StoreEvent]], only: str | None) -> dict[str, float]:
    """One pass of the tracker and the observers over ``batches``: CPU of each."""
    pt = time.process_time
    tracker = StreamTracker()
    metrics = Metrics()
    metrics.track_with(tracker)
    collector = TokenCollector()
    collector.track_with(tracker)
    spent = dict.fromkeys(PARTS, 0.0)
    for batch in batches:
        b = list(batch)  # (the collector may replace a close in it)
        t0 = pt()
        tracker.observe(b)
        t1 = pt()
        if only in (None, "metrics"):
            metrics.observe(b)
        t2 = pt()
        if only in (None, "collector"):
            collector.observe(b)
        t3 = pt()
        tracker.release()
        t4 = pt()
        spent["tracker"] += (t1 - t0) + (t4 - t3)
        spent["metrics"] += t2 - t1
        spent["collector"] += t3 - t2
    collector.take()
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "capture", type=Path, nargs="?", default=Path(__file__).parent / "out" / "bench.pcap"
    )
    ap.add_argument("--port", type=int, action="append", help="server port (repeatable)")
    ap.add_argument("--packets", type=int, default=1250)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--only", choices=("tracker", "metrics", "collector", "none"))
    args = ap.parse_args()
    if not args.capture.exists():
        sys.exit(f"no capture {args.capture} (make it with bench/bench_replay.py)")
    ports = frozenset(args.port or [])
    batches = batches_of(args.capture, ports, args.packets)
    chunks = sum(1 for b in batches for e in b if type(e) is ChunkEvent)
    if not chunks:
        sys.exit(f"no chunk events in {args.capture} (server ports {sorted(ports)})")
    if args.only == "none":
        return
    gc.disable()
    best = dict.fromkeys(PARTS, float("inf"))
    for _ in range(args.runs):
        for k, v in run(batches, args.only).items():
            best[k] = min(best[k], v)
    for k in PARTS if args.only is None else ("tracker", args.only):
        if k != "tracker" or args.only in (None, "tracker"):
            print(f"{k:10} {best[k] * 1e3:7.1f} ms {best[k] / chunks * 1e6:6.3f} us/chunk")
    print(f"({chunks} chunk events in {len(batches)} batches)")


if __name__ == "__main__":
    main()
