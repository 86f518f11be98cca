"""CPU per chunk row of the SQLite writer under live-style load: many streams at once.

The benchmark capture (``bench_writer.py``) has its streams over by the time the
store holds a few thousand chunk rows; a live sidecar serves ``--streams``
streams at once for as long as they last, so every flush carries a few rows of
each, in the order they arrive: each chunk row's entry of
``ix_chunks_stream_seq (stream_id, seq)`` goes to another place in the index,
and the set of index pages a flush changes grows with the streams open (about
one leaf page per stream), not with the rows. This writes such a load through
``StoreWriter`` (no capture, no pipeline: the events are made here), flushing
every ``--batch`` rows as the daemon does at its batch size, and prints the CPU
(user and system, ``os.times``) per chunk row and the database's size.

Each of ``--generations`` generations opens ``--streams`` streams at once, then
sends ``--events`` content chunks to each in rounds (each round in a shuffled
order, the same every run; ``--order fixed``: in stream order), then closes
them. On a shared machine take the best of several runs; for exact
comparisons count instructions (``valgrind --tool=callgrind``, ``--runs 1``).

    python bench/bench_writer_live.py [--streams 1000] [--events 300] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sniffer.core.events import (  # noqa: E402
    ChunkEvent,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamState,
)
from sniffer.store.writer import StoreWriter  # noqa: E402


def events(
    streams: int, per_stream: int, generations: int, shuffled: bool = True
) -> list[StoreEvent]:
    """The events of the load, in arrival order (deterministic): each round of
    chunks in a new shuffled order, or (``shuffled`` False) in stream order, as
    a paced server (``bench_live.py``) or a server decoding its streams in one
    fixed batch sends them."""
    rng = random.Random(25)
    out: list[StoreEvent] = []
    ts = 1.7e9
    for gen in range(generations):
        ids = list(range(gen * streams + 1, (gen + 1) * streams + 1))
        for s in ids:
            ts += 1e-4
            out.append(
                StreamOpened(
                    stream=s,
                    conn=s,
                    exchange=0,
                    ts=ts,
                    client=("10.0.0.2", 40000 + s % 20000),
                    server=("10.0.0.1", 8000),
                    method="POST",
                    path="/v1/chat/completions",
                    request_headers=(("content-type", "application/json"),),
                    request_body='{"model":"m","stream":true}',
                    dialect="openai.chat",
                )
            )
        for seq in range(per_stream):
            if shuffled:
                rng.shuffle(ids)
            for s in ids:
                ts += 1e-4
                out.append(ChunkEvent(s, ts, seq, 0, seq + 1, "content", f"tok{seq % 97} "))
        for s in ids:
            ts += 1e-4
            out.append(
                StreamClosed(
                    stream=s,
                    ts=ts,
                    state=StreamState.COMPLETE,
                    reason="done",
                    done_seen=True,
                    gap=False,
                    t_first_content=ts,
                    t_last_chunk=ts,
                    chunk_count=per_stream,
                    event_count=per_stream,
                    text_len=5 * per_stream,
                    finish_reasons=((0, "stop"),),
                    usage=None,
                    response_body=None,
                )
            )
    return out


def run(evs: list[StoreEvent], db: str, batch: int, chunk: int) -> float:
    """CPU seconds (user + system) of writing ``evs`` ``chunk`` events at a time."""
    w = StoreWriter(db, batch_size=batch, node="bench")
    t0 = os.times()
    for i in range(0, len(evs), chunk):
        w.write_many(evs[i : i + chunk])
    w.close()
    t1 = os.times()
    return (t1.user - t0.user) + (t1.system - t0.system)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1000, help="streams open at once")
    ap.add_argument("--events", type=int, default=300, help="chunk events per stream")
    ap.add_argument("--generations", type=int, default=1)
    ap.add_argument("--batch", type=int, default=5000, help="writer batch size (the daemon's)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--order", choices=("shuffled", "fixed"), default="shuffled")
    ns = ap.parse_args()
    evs = events(ns.streams, ns.events, ns.generations, ns.order == "shuffled")
    chunks = sum(type(ev) is ChunkEvent for ev in evs)
    best = float("inf")
    size = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(ns.runs):
            db = os.path.join(tmp, f"{k}.db")
            best = min(best, run(evs, db, ns.batch, 256))
            size = os.path.getsize(db)
    print(
        f"{ns.streams} streams at once x {ns.events} chunk events x {ns.generations}: "
        f"{chunks:,} chunk rows ({ns.order}), batch {ns.batch}; best of {ns.runs} runs, "
        f"CPU (user+sys) {best:.3f} s, {1e6 * best / chunks:.2f} µs/row; "
        f"database {size / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
