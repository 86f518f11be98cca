"""Benchmark of the token pass and verify (printed figures, not a test).

1. Tokenizer path: encode throughput (tokens/s) of the default DeepSeek-V4
   tokenizer on the texts of the capture.
2. Replay of the backbone capture (``bench/out/bench.pcap``; record it with
   ``python -m bench.capture``) with tokenization off, then the token pass on
   the same database (what ``replay`` without ``--no-tokens`` adds), then
   ``verify`` of the whole database. Target: the token pass adds at most 25 %
   to the replay time.

    python -m bench.bench_verify [--pcap bench/out/bench.pcap] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from sniffer.llm.tokens import TokenizerRegistry
from sniffer.record.tokenize_pass import tokenize_db
from sniffer.reports.verify import verify_db
from sniffer.runtime.replay import replay
from sniffer.store.models import chunks
from sniffer.store.writer import make_engine


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
    t0 = time.perf_counter()
    tok = registry.default()
    print(f"tokenizer load: {time.perf_counter() - t0:.2f} s ({tok})")

    replay_s: list[float] = []
    pass_s: list[float] = []
    verify_s: list[float] = []
    tokens = streams = nchunks = 0
    texts: list[str] = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            db = str(Path(tmp) / "b.db")
            r = replay(pcap, db)
            replay_s.append(r.seconds)
            engine = make_engine(db)
            t0 = time.perf_counter()
            res = tokenize_db(engine, registry, batch=args.batch)
            pass_s.append(time.perf_counter() - t0)
            tokens, streams, nchunks = res.tokens, res.streams, res.chunks
            t0 = time.perf_counter()
            report = verify_db(engine, registry, tokenize=False)
            verify_s.append(time.perf_counter() - t0)
            if not texts:
                with engine.connect() as conn:
                    parts: dict[tuple[int, int], list[str]] = {}
                    for sid, ch, text in conn.execute(
                        select(chunks.c.stream_id, chunks.c.choice, chunks.c.text)
                        .where(chunks.c.chunk_index > 0)
                        .order_by(chunks.c.stream_id, chunks.c.seq)
                    ):
                        parts.setdefault((sid, ch), []).append(text or "")
                texts = ["".join(p) for p in parts.values()]
                print(
                    f"capture: {r.packets} packets, {r.streams} streams, {r.chunk_events} "
                    f"chunk events; verify: {len(report.streams)} streams, "
                    f"{report.failed} failed, kinds {report.kind_counts()}"
                )
            engine.dispose()

    enc: list[float] = []
    n = 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        n = sum(len(ids) for ids in tok.encode_batch(texts))
        enc.append(time.perf_counter() - t0)
    e = statistics.median(enc)
    print(
        f"encode_batch of {len(texts)} texts: {n} tokens in {e * 1000:.1f} ms "
        f"= {n / e:,.0f} tokens/s"
    )
    rp, tp, vp = (statistics.median(x) for x in (replay_s, pass_s, verify_s))
    print(f"replay (tokens off): {rp:.2f} s   (runs: {', '.join(f'{x:.2f}' for x in replay_s)})")
    print(
        f"token pass: {tp:.2f} s for {streams} streams, {nchunks} chunks, {tokens} tokens "
        f"= {tokens / tp:,.0f} tokens/s, {nchunks / tp:,.0f} chunks/s"
    )
    print(f"replay + token pass: {rp + tp:.2f} s = +{tp / rp * 100:.1f} % (target <= 25 %)")
    print(f"verify (already tokenized): {vp:.2f} s")


if __name__ == "__main__":
    main()
