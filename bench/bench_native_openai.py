"""CPU per streamed item of the OpenAI dialects' chunk extraction, Python
reference vs the native core (``sniffer._native.openai_chunk``, issue #25),
interleaved runs.

Replays the capture once and keeps every item the streams stage hands to an
OpenAI dialect, per exchange, in order. Then, best of ``--runs`` by CPU time
(``time.process_time``), alternating:

- ``dialect python``: ``OpenAIChat/OpenAICompletions.event`` over every item,
  one dialect per exchange, the native extraction off (the pure core's path);
- ``dialect native``: the same with the native extraction on (the native
  core's path: the native call, and the Python for what it declines);
- ``openai_chunk``: the bare native call over every item (no dialect).

Also prints the share of items the native extraction takes. Build the
extension first: ``scripts/build_native_dev.sh``.

    python bench/bench_native_openai.py [--capture bench/out/bench.pcap] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sniffer.capture.pcap import read_capture  # noqa: E402
from sniffer.core.pipeline import Pipeline, PipelineConfig  # noqa: E402
from sniffer.llm.dialects import openai  # noqa: E402
from sniffer.llm.dialects.base import Delta  # noqa: E402

Exchanges = list[tuple[bool, list[tuple[str, str]]]]


def _items(capture: Path) -> Exchanges:
    """(chat, items) of each OpenAI exchange of the capture, as replayed."""
    # keyed by the dialect itself (held, so that no other one reuses its id)
    by_dialect: dict[int, tuple[openai._OpenAIBase, list[tuple[str, str]]]] = {}
    event = openai._OpenAIBase.event

    def record(self: openai._OpenAIBase, data: str, event_type: str) -> list[Delta]:
        by_dialect.setdefault(id(self), (self, []))[1].append((data, event_type))
        return event(self, data, event_type)

    # the pure pipeline: the native one hands the items to the native item
    # loop, and only what it declines ([DONE], odd items) reaches a dialect
    with mock.patch.object(openai._OpenAIBase, "event", record):
        pipe = Pipeline(PipelineConfig(native=False))
        last = 0.0
        for seg in read_capture(capture):
            last = seg.ts
            pipe.feed(seg)
        pipe.flush(last + 1e6)
    return [(d._chat, items) for d, items in by_dialect.values()]


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.process_time()
    result = fn()
    return time.process_time() - t, result


def _dialects(exchanges: Exchanges, native: bool) -> Callable[[], int]:
    def run() -> int:
        n = 0
        for chat, items in exchanges:
            event = (openai.OpenAIChat() if chat else openai.OpenAICompletions()).event
            for data, event_type in items:
                n += len(event(data, event_type))
        return n

    def run_python() -> int:
        with mock.patch.object(openai, "_NATIVE_CHUNK", None):
            return run()

    return run if native else run_python


def _bare(exchanges: Exchanges) -> Callable[[], int]:
    chunk = openai._NATIVE_CHUNK
    assert chunk is not None

    def run() -> int:
        n = 0
        for chat, items in exchanges:
            for data, _ in items:
                n += chunk(data, chat, False) is not None
        return n

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=REPO / "bench" / "out" / "bench.pcap")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", help="run only this case once (for callgrind), e.g. 'dialect native'")
    ns = ap.parse_args()
    chunk = openai._NATIVE_CHUNK
    if chunk is None:
        print("the native core does not run (SPARSEETY_PURE, or no sniffer._native)")
        return 1
    gc.set_threshold(200_000, 50, 100)  # as replay sets it
    exchanges = _items(ns.capture)
    items = sum(len(x) for _, x in exchanges)
    json_items = [(c, d) for c, x in exchanges for d, _ in x if d and d != "[DONE]"]
    taken = sum(chunk(d, c, False) is not None for c, d in json_items)
    cases: dict[str, Callable[[], int]] = {
        "dialect python": _dialects(exchanges, False),
        "dialect native": _dialects(exchanges, True),
        "openai_chunk": _bare(exchanges),
    }
    if ns.only == "none":  # the baseline: replaying and collecting only
        return 0
    if ns.only:
        print(ns.only, cases[ns.only](), "outputs", items, "items")
        return 0
    best: dict[str, float] = {}
    counts: dict[str, int] = {}
    for _ in range(ns.runs):
        for name, fn in cases.items():  # interleaved: one of each per round
            t, n = _cpu(fn)
            best[name] = min(best.get(name, t), t)
            counts[name] = n
    print(
        f"{ns.capture}: {len(exchanges):,} OpenAI exchanges, {items:,} items "
        f"({len(json_items):,} JSON, {taken:,} = {100 * taken / max(1, len(json_items)):.2f}% "
        f"taken natively); best of {ns.runs} interleaved runs, CPU"
    )
    for name, t in best.items():
        us = 1e6 * t / max(1, items)
        print(f"  {name:16s} {t:7.3f} s {us:7.2f} µs/item  ({counts[name]:,} out)")
    py, nat = best["dialect python"], best["dialect native"]
    print(f"  dialect: native {py / nat:.1f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
