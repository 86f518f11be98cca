"""Background work of the live daemon, off the capture path: the token pass and retention.

Each worker is a :class:`Periodic` thread calling one function every few
seconds, and once more when stopped (to drain what is left). A failure is
logged and counted, never fatal.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sniffer.record.chain import RecordingChain
from sniffer.runtime.config import Config
from sniffer.runtime.log import Log

if TYPE_CHECKING:
    from sniffer.store.db import Store

__all__ = ["Periodic", "limit_arenas", "retention_worker", "token_worker", "trim_heap"]

#: Closed streams per token pass call, and chunks per call past its first
#: stream: many short streams make one batch (each batch has fixed costs: a
#: transaction, encoder calls), a burst of long ones stays flat in memory.
TOKEN_BATCH = 500
TOKEN_CHUNKS = 2_000

_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = _load_libc(ctypes)
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
            _LIBC.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


def _load_libc(ctypes: Any) -> Any:
    """The C library: glibc's ``libc.so.6`` (what ``find_library("c")`` names
    there) without looking it up, as ``find_library`` runs ``ldconfig -p`` in a
    child process (~2 ms of the daemon's start-up); elsewhere, looked up."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        import ctypes.util

        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


#: glibc ``mallopt`` parameter: most malloc arenas.
_M_ARENA_MAX = -8


def limit_arenas(n: int = 2) -> None:
    """At most ``n`` glibc malloc arenas (default: 8 per core). The capture,
    processing and token threads each got their own arena, each keeping its
    freed memory mapped: with two, peak RSS at 1,000 streams is ~4 MB lower
    (``bench/bench_live.py --only memory``); the GIL serialises them anyway.
    Call before the threads start. A no-op without glibc."""
    libc = _libc()
    if libc:
        libc.mallopt(_M_ARENA_MAX, n)


def trim_heap() -> None:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``; a no-op
    elsewhere). The tokenizer's JSON parse and each token batch free tens of
    MB that glibc would otherwise keep mapped: this is what keeps the daemon's
    peak RSS down with 1,000 streams open (see ``bench/bench_live.py``)."""
    libc = _libc()
    if libc:
        libc.malloc_trim(0)


class Periodic:
    """A background thread that calls ``work()`` every ``interval`` seconds until
    stopped, and once more when stopped (to drain what is left). The first call
    comes after ``first`` seconds (default: ``interval``)."""

    def __init__(
        self,
        name: str,
        interval: float,
        work: Callable[[], None],
        log: Log,
        first: float | None = None,
    ) -> None:
        self._interval = interval
        self._first = interval if first is None else first
        self._work = work
        self._log = log
        self._stop = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self.thread.ident is not None:  # started
            self.thread.join(timeout)

    def _call(self) -> None:
        try:
            self._work()
        except Exception as exc:  # never fatal: log, count, go on
            self.errors += 1
            self._log("error", f"{self.thread.name}-failed", error=f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        wait = self._first
        while not self._stop.wait(wait):
            self._call()
            wait = self._interval
        self._call()


def token_worker(chain: RecordingChain, database: str, log: Log) -> Periodic:
    """Tokenize the streams ``chain`` saw close, in batches, into its own store
    (its own connection: the writer's flushes do not wait for it, nor it for them).

    The store and the default tokenizer are made at the first call, 0.5 s
    after start, in this thread (the tokenizer is not loaded before the
    capture opens, ~0.15 s in), whether or not a stream has
    closed yet: loaded at the first pass, once the capture's buffers had
    grown, the tokenizer's ~40 MB (and its parse's transient) landed above
    them and raised the peak RSS at 1,000 streams from 146 to 169 MB."""
    stores: list[Store] = []

    def work() -> None:
        if not stores:
            from sniffer.llm.registry import TokenizerLoadError
            from sniffer.store.opening import open_store

            stores.append(open_store(database))
            if chain.tokens is not None:
                with contextlib.suppress(TokenizerLoadError):  # the pass reports it
                    chain.tokens.default()
            trim_heap()  # the tokenizer's JSON parse leaves ~20 MB freed but mapped
        if not chain.tokens_ready:
            return
        store = stores[0]
        for _ in range(10_000):  # bounded: what closes meanwhile waits for the next call
            if not chain.tokens_ready:
                break
            chain.tokenize(limit=TOKEN_BATCH, max_chunks=TOKEN_CHUNKS, store=store)
        trim_heap()  # once per call: malloc_trim walks the whole heap (~2 ms)

    return Periodic("tokens", 2.0, work, log, first=0.5)


def retention_worker(cfg: Config, log: Log) -> Periodic:
    """Delete streams older than ``retention_days``, a few batches at a time."""
    from sniffer.store.opening import open_store
    from sniffer.store.retention import prune, vacuum

    store = open_store(cfg.database)
    age = cfg.retention_days * 86400.0

    def work() -> None:
        r = prune(
            store,
            age,
            now=time.time(),
            batch=cfg.retention_batch,
            max_batches=20,
            node=cfg.node,  # a fleet's sidecars each prune their own rows
        )
        if r.streams or r.connections:
            v = vacuum(store)
            log(
                "info",
                "pruned",
                streams=r.streams,
                chunks=r.chunks,
                connections=r.connections,
                freed_pages=v.freed_pages,
                done=r.done,
            )

    return Periodic("retention", cfg.retention_interval, work, log)
