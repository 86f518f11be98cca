"""Benchmark: chunk rows/s into a real PostgreSQL, 1 and 4 concurrent sidecar writers.

Starts a throwaway PostgreSQL server (Debian's ``postgresql`` binaries, as the
``postgres`` user, Unix socket only, in a temporary directory: the way
``tests/conftest.py`` does; needs root), or uses ``SPARSEETY_BENCH_PG_URL``.
Each writer is its own process with its own ``StoreWriter`` (its own node and
id blocks), as a sidecar is, and writes the same synthetic capture: streams
of ``--chunks`` content chunks (~4 characters each, like real token deltas),
opened, chunked and closed, in batches of ``--batch`` rows. The writers start
together; the figure is all chunk rows written divided by the wall time from
start to the last writer's final commit. Each configuration runs on a fresh
database, with COPY (the default path) and with psycopg's pipelined
``executemany`` (``StoreWriter(copy=False)``) for comparison.

    python bench/bench_pg_writers.py [--streams 2000] [--chunks 100] [--batch 5000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sniffer.core.events import (  # noqa: E402
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary  # noqa: E402
from sniffer.store.writer import StoreWriter, make_engine  # noqa: E402
from tests.pg_server import throwaway_postgres, why_no_server  # noqa: E402

WORDS = [
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
]


@contextmanager
def server_url() -> Iterator[str]:
    """SPARSEETY_BENCH_PG_URL, or a throwaway local server (tests/pg_server.py)."""
    url = os.environ.get("SPARSEETY_BENCH_PG_URL")
    if url:
        yield url
        return
    why = why_no_server()
    if why is not None:
        raise SystemExit(f"skipped: {why} (or set SPARSEETY_BENCH_PG_URL)")
    with throwaway_postgres("sparseety-bench-pg-", "-c max_connections=50") as url:
        yield url


def fresh_database(server_url: str) -> str:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    base, _, query = server_url.partition("?")
    dsn = server_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


def capture(writer: StoreWriter, streams: int, chunks: int) -> Iterator[StoreEvent]:
    """A synthetic capture with ids from the writer's blocks, as the pipeline does."""
    t = 1.8e9
    cli, srv = ("127.0.0.1", 40000), ("127.0.0.1", 8000)
    body = '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}'
    for s in range(streams):
        conn = writer.conn_ids()
        sid = writer.stream_ids()
        yield ConnectionOpened(conn, t, cli, srv, True)
        yield StreamOpened(
            sid, conn, 0, t, cli, srv, "POST", "/v1/chat/completions", (), body,
            RequestSummary(model="tiny", stream=True), "openai.chat",
        )  # fmt: skip
        yield StreamResponse(sid, t, 200, (("content-type", "text/event-stream"),), "sse", True)
        text = 0
        for i in range(chunks):
            piece = WORDS[(s + i) % len(WORDS)] + " "
            text += len(piece)
            yield ChunkEvent(sid, t + i * 0.01, i, 0, i + 1, "content", text=piece)
        yield StreamClosed(
            sid, t + chunks * 0.01, StreamState.COMPLETE, "finished", True, False,
            t, t + chunks * 0.01, chunks, chunks, text, ((0, "stop"),), None, None,
        )  # fmt: skip
        yield ConnectionClosed(conn, t + chunks * 0.01, "fin")
        t += 0.001


def writer_proc(url: str, node: str, streams: int, chunks: int, batch: int, copy: bool,
                start: Any, out: Any) -> None:  # fmt: skip
    w = StoreWriter(url, batch_size=batch, node=node, copy=copy)
    events = list(capture(w, streams, chunks))  # built before the clock starts
    start.wait()
    t0 = time.perf_counter()
    w.write_many(events)
    w.close()
    out.put((node, time.perf_counter() - t0, w.stats["chunks"], w.stats["flushes"]))


def run(url: str, writers: int, streams: int, chunks: int, batch: int, copy: bool) -> None:
    make_engine(url).dispose()  # the schema, before the clock
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(writers + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=writer_proc, args=(url, f"w{k}", streams, chunks, batch, copy, start, out)
        )
        for k in range(writers)
    ]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    results: list[tuple[str, float, int, int]] = []
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:  # a writer failed (its traceback is above): do not wait for it
                for p in procs:
                    p.kill()
                raise SystemExit(f"a writer process exited with {dead[0]}") from None
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    rows = sum(r[2] for r in results)
    each = ", ".join(f"{r[2] / r[1]:,.0f}" for r in sorted(results))
    engine = make_engine(url)
    with engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT count(*) FROM chunks").scalar()
        ids = conn.exec_driver_sql("SELECT count(DISTINCT id) = count(*) FROM streams").scalar()
    engine.dispose()
    mode = "COPY        " if copy else "executemany "
    print(
        f"{mode} {writers} writer(s): {rows:>9,} chunk rows in {wall:6.2f} s = "
        f"{rows / wall:>9,.0f} rows/s (per writer: {each}); stored {stored:,}, "
        f"stream ids distinct: {bool(ids)}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=2000, help="streams per writer")
    ap.add_argument("--chunks", type=int, default=100, help="chunks per stream")
    ap.add_argument("--batch", type=int, default=5000, help="rows per batch (daemon default)")
    args = ap.parse_args()
    print(
        f"{args.streams} streams x {args.chunks} chunks per writer, batches of {args.batch} "
        f"rows, {os.cpu_count()} CPUs (writers and server share them)"
    )
    with server_url() as server:
        for copy in (True, False):
            for writers in (1, 4):
                run(fresh_database(server), writers, args.streams, args.chunks, args.batch, copy)


if __name__ == "__main__":
    main()
