"""Benchmark of the token pass and verify (printed figures, not a test).

1. Tokenizer path: encode throughput (tokens/s) of the default DeepSeek-V4
   tokenizer on the texts of the capture.
2. Replay of the backbone capture (``bench/out/bench.pcap``; record it with
   ``python -m bench.capture``) in one process with tokenization off, then the
   token pass on the same database (``tokenize_db``: what ``sparseety
   tokenize`` does), then ``verify`` of the whole database. Target: the token
   pass adds at most 25 % to the replay.
3. Replay with tokens on (the default): what the recording chain's token
   collector costs on the capture path (``observe``, per chunk event) and what
   its token pass costs after the capture (``chain.tokenize``: the same
   analysis on the texts the collector kept, without reading them back).

Every figure is given as CPU time of this process (``time.process_time``,
all threads: the tokenizer's Rust batch encoder may use several) and as wall
time; on a shared machine the CPU figures are the ones to compare. The best
of ``--repeat`` runs is reported, the median in brackets.

    python -m bench.bench_verify [--pcap bench/out/bench.pcap] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import note
from sniffer.core.events import StoreEvent
from sniffer.llm.tokens import TokenizerRegistry
from sniffer.record.chain import RecordingChain, RecordingOptions
from sniffer.record.tokenize_pass import TokenizeResult, tokenize_db
from sniffer.reports.verify import verify_db
from sniffer.runtime.replay import replay
from sniffer.store.queries import list_streams, stream_text
from sniffer.store.writer import open_store

T = TypeVar("T")


class Clock:
    """CPU and wall seconds of each timed run."""

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def time(self, fn: Callable[[], T]) -> T:
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        self.cpu.append(time.process_time() - c0)
        self.wall.append(time.perf_counter() - w0)
        return out

    def best(self) -> float:
        return min(self.cpu)

    def __str__(self) -> str:
        return (
            f"{min(self.cpu):.3f} s CPU [{statistics.median(self.cpu):.3f}], "
            f"{min(self.wall):.3f} s wall [{statistics.median(self.wall):.3f}]"
        )


def timed_chain(registry: TokenizerRegistry, observe: Clock, tokenize: Clock) -> RecordingChain:
    """The default recording chain, with its collector's ``observe`` and its
    token pass timed."""
    chain = RecordingChain.from_config(RecordingOptions(), tokens=registry)
    collect = chain._collect
    spent = [0.0, 0.0]

    def timed_collect(events: list[StoreEvent]) -> None:
        c0, w0 = time.process_time(), time.perf_counter()
        collect(events)
        spent[0] += time.process_time() - c0
        spent[1] += time.perf_counter() - w0

    chain.observers = [timed_collect if o == collect else o for o in chain.observers]
    run_pass = chain.tokenize

    def timed_tokenize(**kw: Any) -> TokenizeResult:
        observe.cpu.append(spent[0])
        observe.wall.append(spent[1])
        return tokenize.time(functools.partial(run_pass, **kw))

    chain.tokenize = timed_tokenize  # type: ignore[method-assign]
    return chain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pcap", default="bench/out/bench.pcap")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=500)
    args = ap.parse_args()
    pcap = Path(args.pcap)
    if not pcap.exists():
        raise SystemExit(f"{pcap}: missing; record it with 'python -m bench.capture'")

    registry = TokenizerRegistry()
    c0, t0 = time.process_time(), time.perf_counter()
    tok = registry.default()
    print(
        f"tokenizer load: {time.process_time() - c0:.2f} s CPU, "
        f"{time.perf_counter() - t0:.2f} s wall ({tok}; once per process, not in the "
        "figures below)"
    )

    replay_t, pass_t, verify_t = Clock(), Clock(), Clock()
    on_t, observe_t, chain_pass_t = Clock(), Clock(), Clock()
    tokens = streams = nchunks = events = 0
    texts: list[str] = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            db = str(Path(tmp) / "b.db")
            r = replay_t.time(functools.partial(replay, pcap, db))
            events = r.chunk_events
            store = open_store(db)
            res = pass_t.time(functools.partial(tokenize_db, store, registry, batch=args.batch))
            tokens, streams, nchunks = res.tokens, res.streams, res.chunks
            report = verify_t.time(functools.partial(verify_db, store, registry, tokenize=False))
            if not texts:
                texts = [
                    text
                    for row in list_streams(store)
                    for text in stream_text(store, row["id"]).values()
                ]
                print(
                    f"capture: {r.packets} packets, {r.streams} streams, {r.chunk_events} "
                    f"chunk events; verify: {len(report.streams)} streams, "
                    f"{report.failed} failed, kinds {report.kind_counts()}"
                )
            store.close()
            db2 = str(Path(tmp) / "on.db")
            chain = timed_chain(registry, observe_t, chain_pass_t)
            on_t.time(functools.partial(replay, pcap, db2, chain=chain))

    enc = Clock()
    n = 0
    for _ in range(args.repeat):
        n = sum(len(ids) for ids in enc.time(functools.partial(tok.encode_batch, texts)))
    print(f"encode_batch of {len(texts)} texts, {n} tokens: {enc} = {n / enc.best():,.0f} tokens/s")
    rp, tp = replay_t.best(), pass_t.best()
    print(f"replay (tokens off, 1 process): {replay_t}")
    print(
        f"token pass (tokenize_db): {pass_t} for {streams} streams, {nchunks} chunks, "
        f"{tokens} tokens = {tp / events * 1e6:.2f} us CPU per chunk event"
    )
    print(f"replay + token pass: +{tp / rp * 100:.1f} % of the replay's CPU (target <= 25 %)")
    print(f"verify (already tokenized): {verify_t}")
    op, cp = observe_t.best(), chain_pass_t.best()
    print(f"replay with tokens on: {on_t}")
    print(
        f"  token collector on the capture path: {observe_t} = "
        f"{op / events * 1e6:.2f} us CPU per chunk event"
    )
    print(
        f"  its token pass (chain.tokenize): {chain_pass_t} = "
        f"{cp / events * 1e6:.2f} us CPU per chunk event"
    )
    print(
        f"  together: {(op + cp) / events * 1e6:.2f} us CPU per chunk event, "
        f"+{(op + cp) / rp * 100:.1f} % of the tokens-off replay's CPU"
    )
    note(
        "token pass added to a tokens-off replay (CPU)",
        "pure" if os.environ.get("SPARSEETY_PURE") else "native",
        (op + cp) / rp * 100,
        "%",
        "<= 25 %",
    )


if __name__ == "__main__":
    main()
