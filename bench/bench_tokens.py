"""Benchmark of the token layer.

Prints the tokenizer's encode throughput (tokens/s) and the time to analyse
1,200 streams x 60 chunks (~4 characters each, English/CJK/emoji mix) with
``analyze_streams``, next to a single ``encode_batch`` of the same 1,200 full
texts: the difference is what per-chunk attribution, anomaly checks and the
round-trip decode cost.

    python bench/bench_tokens.py [--streams 1200] [--chunks 60] [--repeat 5]

``--live`` instead times the token pass on what ``bench_live.py`` streams:
1,000 streams x 100 events of ``w{n}.{k} `` (ASCII, ~4 tokens per event),
analysed in batches of 100 streams, in CPU microseconds per event (all
threads: the tokenizers library encodes on a thread pool).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from collections.abc import Callable

from sniffer.llm.tokens import (
    ChunkColumns,
    ChunkInput,
    StreamInput,
    TokenizerRegistry,
    analyze_streams,
)
from sniffer.llm.values import Usage

ENGLISH = [
    "the",
    "model",
    "streams",
    "tokens",
    "back",
    "to",
    "the",
    "client",
    "while",
    "the",
    "sidecar",
    "records",
    "every",
    "chunk",
    "and",
    "counts",
    "what",
    "it",
    "saw;",
    "latency",
    "matters,",
    "throughput",
    "matters,",
    "and",
    "so",
    "does",
    "getting",
    "the",
    "numbers",
    "right",
    "when",
    "text",
    "is",
    "cut",
    "in",
    "odd",
    "places",
]
CJK = [
    "我们",
    "今天",
    "模型",
    "输出",
    "正在",
    "测试",
    "的",
    "数据",
    "，",
    "。",
    "東京",
    "タワー",
    "ありがとう",
]
OTHER = ["🎉", "👍🏽", "👨‍👩‍👧", "2024", "3.14", "(x)", "\n", "  "]


def make_text(rng: random.Random, target_chars: int) -> str:
    parts: list[str] = []
    n = 0
    while n < target_chars:
        r = rng.random()
        if r < 0.6:
            piece = " " + rng.choice(ENGLISH)
        elif r < 0.93:
            piece = rng.choice(CJK)
        else:
            piece = rng.choice(OTHER)
        parts.append(piece)
        n += len(piece)
    return "".join(parts)[:target_chars]


def make_streams(n_streams: int, n_chunks: int, seed: int = 7) -> list[StreamInput]:
    rng = random.Random(seed)
    streams = []
    for sid in range(n_streams):
        sizes = [rng.randint(2, 6) for _ in range(n_chunks)]
        text = make_text(rng, sum(sizes))
        chunks = [ChunkInput(0, 0, "", None, None)]
        pos = 0
        for i, size in enumerate(sizes):
            chunks.append(ChunkInput(i + 1, 0, text[pos : pos + size], None, None))
            pos += size
        chunks.append(ChunkInput(n_chunks + 1, 0, "", "stop", None))
        request = {
            "model": "deepseek-v4",
            "messages": [{"role": "user", "content": make_text(rng, 200)}],
            "stream_options": {"include_usage": True},
        }
        streams.append(
            StreamInput(
                stream_id=sid,
                model="deepseek-v4",
                request=request,
                chunks=chunks,
                usage=Usage.parse({"prompt_tokens": 60, "completion_tokens": 60}),
                gap=False,
                done_seen=True,
                include_usage_requested=True,
            )
        )
    return streams


def make_live_streams(n_streams: int = 1000, n_events: int = 100) -> list[StreamInput]:
    """The live benchmark's streams (``bench_live.py``'s server): event k of
    stream n carries ``w{n}.{k} ``."""
    streams = []
    for n in range(n_streams):
        chunks = [ChunkInput(0, 0, "", None, None)]
        chunks += [ChunkInput(k + 1, 0, f"w{n}.{k} ", None, None) for k in range(n_events)]
        chunks.append(ChunkInput(n_events + 1, 0, "", "stop", None))
        messages = [{"role": "user", "content": "hi"}]
        request = {"model": "bench", "stream": True, "messages": messages}
        streams.append(
            StreamInput(
                stream_id=n,
                model="bench",
                request=request,
                chunks=ChunkColumns.of(chunks),
                usage=None,
                gap=False,
                done_seen=True,
                include_usage_requested=False,
            )
        )
    return streams


def live(repeat: int) -> None:
    """``--live``: CPU per event of the token pass on the live benchmark's streams."""
    registry = TokenizerRegistry()
    registry.default()
    streams = make_live_streams()
    events = sum(len(s.chunks) - 2 for s in streams)

    def run() -> None:
        for i in range(0, len(streams), 100):
            analyze_streams(registry, streams[i : i + 100])

    best(run, repeat)
    print(
        f"live-style streams: {len(streams)} x {events // len(streams)} events: "
        f"token pass CPU {min(CPU) / events * 1e6:.2f} us per event (best of {repeat}), "
        f"median {statistics.median(CPU) / events * 1e6:.2f}"
    )


CPU: list[float] = []  # CPU seconds (all threads) of the last best() call, per run


def best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best and median wall time; CPU times (all threads) of each run go to CPU."""
    times = []
    CPU.clear()
    for _ in range(repeat):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        CPU.append(time.process_time() - c0)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1200)
    ap.add_argument("--chunks", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--live", action="store_true", help="the live benchmark's streams")
    args = ap.parse_args()
    if args.live:
        live(args.repeat)
        return

    t0 = time.perf_counter()
    registry = TokenizerRegistry()
    _, tok = registry.resolve(None)
    load = time.perf_counter() - t0

    streams = make_streams(args.streams, args.chunks)
    texts = ["".join(c.text for c in s.chunks) for s in streams]
    n_chunks = sum(1 for s in streams for c in s.chunks if c.text)
    n_chars = sum(len(t) for t in texts)
    n_tokens = sum(len(ids) for ids in tok.encode_batch(texts))

    analyze_streams(registry, streams)  # warm-up (thread pool, caches)
    tok.encode_batch(texts)
    enc_min, enc_med = best(lambda: tok.encode_batch(texts), args.repeat)
    enc_cpu = min(CPU)
    off_min, _ = best(lambda: tok.encode_with_offsets(texts), args.repeat)
    dec_min, _ = best(lambda: tok.decode_batch(tok.encode_batch(texts)), args.repeat)
    bare = [dataclasses.replace(s, request={"model": s.model}) for s in streams]
    out_min, out_med = best(lambda: analyze_streams(registry, bare), args.repeat)
    out_cpu = min(CPU)
    ana_min, ana_med = best(lambda: analyze_streams(registry, streams), args.repeat)
    ana_cpu = min(CPU)
    # what the token collector hands over: the chunks in columns
    cols = [dataclasses.replace(s, chunks=ChunkColumns.of(s.chunks)) for s in streams]
    col_min, col_med = best(lambda: analyze_streams(registry, cols), args.repeat)
    col_cpu = min(CPU)

    res = analyze_streams(registry, streams)
    dist: dict[int, int] = {}
    straddles = 0
    for r in res:
        straddles += sum(c.straddles for c in r.chunks)
        for k, v in r.tokens_per_chunk.items():
            dist[k] = dist.get(k, 0) + v

    print(f"tokenizer load (default, deepseek-v4): {load * 1e3:.0f} ms")
    print(
        f"corpus: {args.streams} streams, {n_chunks} text chunks, {n_chars} chars, "
        f"{n_tokens} output tokens ({n_chars / n_chunks:.1f} chars/chunk)"
    )
    print(
        f"encode_batch of {len(texts)} full texts: {enc_min * 1e3:.1f} ms best, "
        f"{enc_med * 1e3:.1f} ms median -> {n_tokens / enc_min:,.0f} tokens/s "
        f"({enc_cpu * 1e3:.0f} ms CPU)"
    )
    print(f"encode_with_offsets of the same: {off_min * 1e3:.1f} ms best")
    print(f"encode_batch + decode_batch (round-trip check): {dec_min * 1e3:.1f} ms best")
    print(
        f"analyze_streams, output side only (no prompts): {out_min * 1e3:.1f} ms best, "
        f"{out_med * 1e3:.1f} ms median -> {n_chunks / out_min:,.0f} chunks/s; "
        f"{(out_min - enc_min) * 1e3:.1f} ms over one encode_batch; "
        f"CPU {out_cpu * 1e3:.0f} ms vs {enc_cpu * 1e3:.0f} ms"
    )
    print(
        f"analyze_streams, full (+ {args.streams} chat prompts of ~200 chars): "
        f"{ana_min * 1e3:.1f} ms best, {ana_med * 1e3:.1f} ms median "
        f"-> {n_chunks / ana_min:,.0f} chunks/s"
    )
    print(
        f"  CPU {ana_cpu * 1e3:.0f} ms = {ana_cpu / n_chunks * 1e6:.2f} us per chunk; "
        f"on ChunkColumns (the collector's form): {col_min * 1e3:.1f} ms best, "
        f"{col_med * 1e3:.1f} ms median, CPU {col_cpu * 1e3:.0f} ms "
        f"= {col_cpu / n_chunks * 1e6:.2f} us per chunk"
    )
    print(f"tokens per chunk: {dict(sorted(dist.items()))}; straddling tokens: {straddles}")


if __name__ == "__main__":
    main()
