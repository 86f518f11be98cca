"""CPU per chunk event of the HTTP/1.1 and SSE stages, Python reference vs the
native core (``sniffer._native``, issue #25), interleaved runs.

Reads the capture once and reassembles it (Python), then, best of ``--runs``
by CPU time (``time.process_time``), alternating the two cores:

- ``http1``: ``HttpParser.feed`` over every flow event;
- ``sse``: ``SseDecoder.feed`` over every response body piece (one decoder
  per exchange, as the streams stage makes them), then ``close``;
- ``pipeline``: ``Pipeline.feed_flows`` (http1, gRPC glue, streams) with
  every stage pure (``native=False``) or native (the native HTTP parser and
  SSE/NDJSON decoders).

Every figure is divided by the chunk events of the capture (the streams
stage's count). Build the extension first: ``scripts/build_native_dev.sh``.

    python bench/bench_native_http.py [--capture bench/out/bench.pcap] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sniffer.capture.pcap import read_capture  # noqa: E402
from sniffer.core import native  # noqa: E402
from sniffer.core.events import FlowEvent, HttpBody  # noqa: E402
from sniffer.core.http1 import HttpParser  # noqa: E402
from sniffer.core.pipeline import Pipeline, PipelineConfig  # noqa: E402
from sniffer.core.sse import SseDecoder  # noqa: E402


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.process_time()
    result = fn()
    return time.process_time() - t, result


def _http(make: Callable[[], Any], flows: list[FlowEvent]) -> Callable[[], int]:
    def run() -> int:
        feed = make().feed
        n = 0
        for f in flows:
            n += len(feed(f))
        return n

    return run


def _sse(make: Callable[[], Any], bodies: list[list[bytes]]) -> Callable[[], int]:
    def run() -> int:
        n = 0
        for pieces in bodies:
            d = make()
            feed = d.feed
            for p in pieces:
                n += len(feed(p))
            d.close()
        return n

    return run


def _pipe(make: Callable[[], Pipeline], flows: list[FlowEvent]) -> Callable[[], int]:
    def run() -> int:
        pipe = make()
        out = pipe.feed_flows(flows)
        out += pipe.flush(1e12)
        return len(out)

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=REPO / "bench" / "out" / "bench.pcap")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", help="run only this case once (for callgrind), e.g. 'sse native'")
    ns = ap.parse_args()
    why = native.why_unavailable()
    if why is not None:
        print(why)
        return 1
    gc.set_threshold(200_000, 50, 100)  # as replay sets it
    pipe = Pipeline(PipelineConfig(native=False))
    flows: list[FlowEvent] = []
    last = 0.0
    for seg in read_capture(ns.capture):
        last = seg.ts
        flows.extend(pipe.reassembler.feed(seg))
    flows.extend(pipe.reassembler.flush(last))
    by_ex: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    for h in (h for f in flows for h in pipe.http.feed(f)):
        if type(h) is HttpBody and not h.from_client:
            by_ex[(h.conn, h.exchange)].append(h.data)
        pipe.streams.feed_into(h, [])
    events = pipe.streams.stats.chunk_events
    bodies = list(by_ex.values())
    cases: dict[str, Callable[[], int]] = {
        "http1 python": _http(HttpParser, flows),
        "http1 native": _http(native.http_parser, flows),
        "sse python": _sse(SseDecoder, bodies),
        "sse native": _sse(native.sse_decoder, bodies),
        "pipeline python http1": _pipe(lambda: Pipeline(PipelineConfig(native=False)), flows),
        "pipeline native http1": _pipe(native.native_pipeline, flows),
    }
    if ns.only == "none":  # the baseline: reading and reassembling only
        return 0
    if ns.only:
        print(ns.only, cases[ns.only](), "outputs", events, "chunk events")
        return 0
    best: dict[str, float] = {}
    counts: dict[str, int] = {}
    for _ in range(ns.runs):
        for name, fn in cases.items():  # interleaved: one of each per round
            t, n = _cpu(fn)
            best[name] = min(best.get(name, t), t)
            counts[name] = n
    print(
        f"{ns.capture}: {len(flows):,} flow events, {events:,} chunk events; "
        f"best of {ns.runs} interleaved runs, CPU"
    )
    for name, t in best.items():
        us = 1e6 * t / events
        print(f"  {name:24s} {t:7.3f} s {us:7.2f} µs/chunk event  ({counts[name]:,} out)")
    for stage in ("http1", "sse", "pipeline"):
        py = best[f"{stage} python" if stage != "pipeline" else "pipeline python http1"]
        nat = best[f"{stage} native" if stage != "pipeline" else "pipeline native http1"]
        print(f"  {stage}: native {py / nat:.1f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
