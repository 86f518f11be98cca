"""Replay a capture file through the pipeline into the store.

This is the batch driver: it owns the loop (the sans-IO stages own none) and
the progress callback; what the pipeline makes goes through the same
:class:`~sniffer.record.chain.RecordingChain` as in the daemon (the live
driver): observers, transforms, then the store writer. Sampling in a replay
is decided per stream exactly as live; the anomaly boost cannot act (the
token pass runs after the capture has been read, or in another process).

With ``jobs > 1`` the connections of the file are split between worker
processes by port pair (both directions of a connection always go to the same
worker; :class:`Shares`: a new port pair goes to the worker with the fewest
segments so far), each running the whole pipeline on its share and handing
its closed streams' token inputs to a token process: the parent, which loads
the tokenizer meanwhile, or a second one it forks once loaded
(``_run_workers``). Every writer (each worker, and every other replay or
daemon on the same database) takes its connection and stream ids from
blocks reserved in the database (``sniffer.store.ids``), so they never
collide. Into a SQLite file, the
workers but the first, and the token processes, write part files
(``sniffer.store.parts``) that the parent merges as soon as their turn comes:
nobody waits for SQLite's one write lock during the replay. Other databases
take every process's rows directly.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from sniffer.capture.pcap import CaptureFileError, CaptureReader, read_capture
from sniffer.core.events import PipelineError, Segment, StoreEvent
from sniffer.core.pipeline import Pipeline, PipelineConfig
from sniffer.record.chain import RecordingChain
from sniffer.record.redact import Redactor
from sniffer.runtime.log import warn_pure_fallback
from sniffer.store.writer import StoreWriter

if TYPE_CHECKING:
    import multiprocessing.connection
    import multiprocessing.context
    import multiprocessing.queues

    from sniffer.llm.tokens import StreamInput, TokenizerRegistry

Progress = Callable[[int, int], None]  # (bytes done, bytes total)

#: Capture-time interval between idle-connection sweeps during a replay.
EXPIRE_EVERY = 10.0

#: Store events handed to the recording chain at once (see ``_replay_part``).
WRITE_EVERY = 512

#: Below this file size a replay runs in one process whatever ``jobs`` says.
PARALLEL_MIN_BYTES = 8 << 20


@dataclass
class ReplayResult:
    """What one capture file's replay did (counts, time, errors)."""

    path: str
    packets: int = 0
    segments: int = 0
    chunk_events: int = 0
    streams: int = 0
    errors: int = 0
    seconds: float = 0.0
    states: dict[str, int] = field(default_factory=dict)
    capture_error: str | None = None
    jobs: int = 1
    tokenized_streams: int = 0
    tokens: int = 0
    token_anomalies: int = 0
    token_seconds: float = 0.0
    redactions: int = 0
    #: TCP reassembly counters (``Pipeline.reassembly_counts``: kind → count)
    reassembly: dict[str, int] = field(default_factory=dict)

    @property
    def packets_per_second(self) -> float:
        return self.packets / self.seconds if self.seconds > 0 else 0.0

    @property
    def events_per_second(self) -> float:
        return self.chunk_events / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, object]:
        """The figures ``sparseety replay --json`` prints, in its order."""
        return {
            "file": self.path,
            "packets": self.packets,
            "tcp_segments": self.segments,
            "streams": self.streams,
            "chunk_events": self.chunk_events,
            "errors": self.errors,
            "states": self.states,
            "seconds": round(self.seconds, 3),
            "jobs": self.jobs,
            "packets_per_second": round(self.packets_per_second),
            "chunk_events_per_second": round(self.events_per_second),
            "capture_error": self.capture_error,
            "tokenized_streams": self.tokenized_streams,
            "tokens": self.tokens,
            "token_anomalies": self.token_anomalies,
            "redactions": self.redactions,
            "reassembly": self.reassembly,
        }

    def merge(self, other: ReplayResult) -> None:
        self.segments += other.segments
        self.chunk_events += other.chunk_events
        self.streams += other.streams
        self.errors += other.errors
        for k, v in other.states.items():
            self.states[k] = self.states.get(k, 0) + v
        self.tokenized_streams += other.tokenized_streams
        self.tokens += other.tokens
        self.token_anomalies += other.token_anomalies
        self.token_seconds = max(self.token_seconds, other.token_seconds)
        self.redactions += other.redactions
        for k, v in other.reassembly.items():
            self.reassembly[k] = self.reassembly.get(k, 0) + v


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class MissingCapture(FileNotFoundError):
    """A capture file named to :func:`replay_files` does not exist."""


#: ``(path, bytes done, bytes total)`` of the file being replayed
FilesProgress = Callable[[str, int, int], None]


def replay_files(
    paths: Iterable[str],
    db: str,
    *,
    chain: RecordingChain,
    ports: frozenset[int] = frozenset(),
    labels: Mapping[int, str] | None = None,
    jobs: int | None = None,
    node: str | None = None,
    proto: bytes | None = None,
    progress: FilesProgress | None = None,
) -> Iterator[ReplayResult]:
    """Replay capture files one after the other through one recording
    ``chain`` into ``db``, yielding each file's result as it is done (the
    command line prints it then). ``jobs`` defaults to :func:`default_jobs`;
    a chain with an OTLP exporter replays in this process (its thread does not
    follow forked workers).

    Raises :class:`MissingCapture` when it comes to a file that does not
    exist, and ``CaptureFileError`` (its message naming the file) for one that
    is not a capture at all; the files before it are stored.
    """
    if chain.otlp is not None:
        jobs = 1
    for path in paths:
        if not os.path.exists(path):
            raise MissingCapture(f"{path}: no such file")
        try:
            yield replay(
                path,
                db,
                ports=ports,
                labels=labels,
                progress=_for_file(progress, path),
                jobs=jobs or default_jobs(),
                chain=chain,
                node=node,
                proto=proto,
            )
        except CaptureFileError as exc:
            if path in str(exc):
                raise
            raise CaptureFileError(f"{path}: {exc}", exc.offset) from exc


def _for_file(progress: FilesProgress | None, path: str) -> Progress | None:
    if progress is None:
        return None
    return lambda done, total: progress(path, done, total)


def replay(
    path: str | os.PathLike[str],
    db: str,
    *,
    ports: frozenset[int] = frozenset(),
    labels: Mapping[int, str] | None = None,
    progress: Progress | None = None,
    batch_size: int = 20_000,
    writer: StoreWriter | None = None,
    jobs: int = 1,
    tokens: TokenizerRegistry | None = None,
    redactor: Redactor | None = None,
    chain: RecordingChain | None = None,
    node: str | None = None,
    proto: bytes | None = None,
) -> ReplayResult:
    """Replay one capture file into the database ``db`` (a path or SQLAlchemy URL).

    ``chain`` is the recording chain (``RecordingChain.from_config``): its
    observers, transforms and token pass; the writer is attached here. Without
    it, a chain of ``tokens`` and ``redactor`` alone: with ``tokens`` every LLM
    stream is tokenized (on the text as sent, before ``redactor`` rewrites what
    is stored) and its token rows written. ``node`` is stored on every row
    (default: the host name).

    A truncated or corrupt file does not raise: everything before the bad
    offset is processed and stored, and ``capture_error`` says where it broke.
    A file that is not a capture at all raises ``CaptureFileError``.
    ``proto`` is a serialized protobuf descriptor set: messages of the gRPC
    methods it describes are decoded (``sniffer.core.grpc``).
    """
    started = time.perf_counter()
    warn_pure_fallback()
    read_capture(path).close()  # not a capture at all: raise before any work
    if chain is None:
        # Credentials are removed even without a redactor (one that only does that).
        chain = RecordingChain(
            tokens=tokens, redactor=redactor if redactor is not None else Redactor(enabled=False)
        )
    elif tokens is not None or redactor is not None:
        raise ValueError("replay: give tokens and redactor through the chain")
    parallel = jobs > 1 and writer is None and os.path.getsize(path) >= PARALLEL_MIN_BYTES
    if chain.tokens is not None:
        # A bad configured tokenizer fails now; the built-in default loads at
        # first use (the token pass), not before the first packet (a parallel
        # replay's parent loads it while its workers read).
        chain.tokens.preload_configured()
    if parallel:
        result = _replay_parallel(
            path, db, ports, labels, progress, batch_size, jobs, chain, node, proto
        )
    else:
        own = writer is None
        w = writer if writer is not None else StoreWriter(db, batch_size=batch_size, node=node)
        try:
            result = _replay_part(path, w, ports, labels, progress, 0, 1, chain, proto)
        finally:
            if own:
                w.close()
    result.seconds = time.perf_counter() - started
    return result


def _replay_parallel(
    path: str | os.PathLike[str],
    db: str,
    ports: frozenset[int],
    labels: Mapping[int, str] | None,
    progress: Progress | None,
    batch_size: int,
    jobs: int,
    chain: RecordingChain,
    node: str | None,
    proto: bytes | None = None,
) -> ReplayResult:
    # the file is created (or migrated) once, before forking
    StoreWriter(db, batch_size=batch_size).close()
    import multiprocessing  # only here: one process needs none of it

    from sniffer.store.parts import part_dir, remove_parts

    ctx = multiprocessing.get_context("fork")
    # Into a SQLite file, the workers write part files merged at the end (one
    # write lock: see sniffer.store.parts); other databases take them directly.
    parts = part_dir(db)
    try:
        with _terminate_raises() as interrupt, _died_raises_runtime_error():
            result = _run_workers(
                ctx,
                parts,
                path,
                db,
                ports,
                labels,
                progress,
                batch_size,
                jobs,
                chain,
                node,
                proto,
                _Watchdog(interrupt),
            )
    finally:
        if parts is not None:
            remove_parts(parts)
    result.jobs = jobs
    return result


class _ChildDied(BaseException):
    """A parallel replay's process died (:class:`_Watchdog`): a ``BaseException``,
    as ``SystemExit`` is, so that no ``except Exception`` of the stage the
    main thread is in (the token pass records a stream's error and goes on)
    takes it for that stage's failure; ``_replay_parallel`` raises it as the
    ``RuntimeError`` a failed worker gives."""


class _Interrupt:
    """How a parallel replay's parent stops waiting when one of its processes
    dies: SIGTERM raises in the main thread while :func:`_terminate_raises`
    runs (``armed``), ``SystemExit`` (code 143) for a SIGTERM from outside,
    or the ``failure`` :class:`_Watchdog` recorded before it sent one."""

    def __init__(self) -> None:
        self.armed = False
        self.failure: str | None = None


@contextlib.contextmanager
def _terminate_raises() -> Iterator[_Interrupt]:
    """SIGTERM raises ``SystemExit`` (code 143) in this process while the block
    runs, where nothing else handles it: its default would end this process on
    the spot, leaving its workers to run on (or to wait forever on a queue
    nobody reads) and its part files behind; raised, it goes through the
    cleanup that ends them and removes those. A failure the watchdog recorded
    is raised instead (``RuntimeError``)."""
    import signal
    import threading

    interrupt = _Interrupt()
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield interrupt
        return

    def terminated(signum: int, _frame: object) -> None:
        if interrupt.failure is not None:
            raise _ChildDied(interrupt.failure)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    interrupt.armed = True
    try:
        yield interrupt
    finally:
        interrupt.armed = False
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Watchdog:
    """A thread of the parent that waits on its children's exits: when one
    ends with a non-zero code (killed: by the OOM killer, ``kill -9``), it
    records the failure and sends SIGTERM to the main thread, whose handler
    raises it (:func:`_terminate_raises`). The main thread may be blocked
    reading a message the dead process had half written, on a queue whose
    lock it still holds: no timeout of its own would end that wait. Only
    while the handler is ``armed`` (the main thread of a process that left
    SIGTERM alone); otherwise the parent's own checks between messages are
    all there is."""

    def __init__(self, interrupt: _Interrupt) -> None:
        import threading

        self._interrupt = interrupt
        self._procs: list[tuple[Any, str]] = []
        self._lock = threading.Lock()
        self._stopped = False
        self._armed = False
        self._main = threading.main_thread().ident
        self._thread: threading.Thread | None = None  # until the first add
        self._running: threading.Thread | None = None
        #: a pipe whose byte wakes the thread at :meth:`stop` (else it would
        #: sleep out its wait's timeout: ~0.1 s at the end of every replay)
        self._wake: tuple[int, int] | None = None
        if interrupt.armed:
            self._thread = threading.Thread(target=self._run, name="replay-watchdog", daemon=True)
            self._wake = os.pipe()

    def add(self, proc: Any, what: str) -> None:
        """Watch ``proc`` (started) too; ``what`` names it in the failure."""
        with self._lock:
            self._procs.append((proc, what))
            start, self._thread = self._thread, None
        if start is not None:
            start.start()
            self._running = start

    def _run(self) -> None:
        import signal
        from multiprocessing.connection import wait

        assert self._wake is not None  # (made with the thread, closed after it ends)
        woken = self._wake[0]
        seen: set[int] = set()
        while True:
            with self._lock:
                if self._stopped:
                    return
                watched = {
                    p.sentinel: (p, what) for p, what in self._procs if p.sentinel not in seen
                }
            ready = wait([*watched, woken], timeout=0.2)
            if woken in ready:
                return  # stopped
            for sentinel, (proc, what) in watched.items():
                code = proc.exitcode if sentinel in ready else None
                if code is None:  # (its pipe closes a moment before it can be reaped)
                    continue
                seen.add(sentinel)
                if code == 0:
                    continue
                with self._lock:
                    if self._stopped or self._main is None:
                        return
                    self._interrupt.failure = f"{what} failed: exit code {code}"
                    if self._armed:
                        signal.pthread_kill(self._main, signal.SIGTERM)
                return

    def arm(self) -> None:
        """From now on a failure interrupts the main thread (called by it once
        it only waits on its children: before, a signal could land in the
        middle of a fork); one seen already is raised here."""
        with self._lock:
            self._armed = True
            failure = self._interrupt.failure
        if failure is not None:
            raise _ChildDied(failure)

    def stop(self) -> None:
        """No signal after this returns."""
        with self._lock:
            self._stopped = True
        wake, self._wake = self._wake, None
        if wake is None:
            return
        try:
            os.write(wake[1], b"x")
            if self._running is not None:
                self._running.join()
        finally:
            os.close(wake[0])
            os.close(wake[1])


@contextlib.contextmanager
def _died_raises_runtime_error() -> Iterator[None]:
    try:
        yield
    except _ChildDied as exc:
        raise RuntimeError(str(exc)) from None


def _part_file(parts: str, k: int) -> str:
    return os.path.join(parts, f"part-{k}.db")


def _tokens_file(parts: str, k: int) -> str:
    return os.path.join(parts, f"tokens-{k}.db")


#: Closed streams a worker gathers before it sends their token inputs to the parent.
SEND_EVERY = 64


@functools.cache
def _wire_fields() -> tuple[Callable[[StreamInput], tuple[Any, ...]], int]:
    """What :func:`_to_wire` reads of a ``StreamInput`` (every field but
    ``redact``, in field order) and where ``redact`` goes back in."""
    from sniffer.llm.tokens import StreamInput

    names = [f.name for f in fields(StreamInput)]
    at = names.index("redact")
    return operator.attrgetter(*names[:at], *names[at + 1 :]), at


def _to_wire(inputs: list[StreamInput]) -> list[tuple[Any, ...]]:
    """Token inputs as a worker sends them to a token process: a plain tuple
    each, without ``redact`` (a function bound to this process's collector,
    that is to its whole state; the receiving collector binds its own:
    ``TokenCollector.bind``). Plain tuples pickle at about half the cost of
    the frozen dataclasses (no ``replace``, no per-object state functions)."""
    get = _wire_fields()[0]
    return [get(inp) for inp in inputs]


def _from_wire(rows: list[tuple[Any, ...]]) -> list[StreamInput]:
    """The inputs :func:`_to_wire` sent, without ``redact`` yet."""
    from sniffer.llm.tokens import StreamInput

    at = _wire_fields()[1]
    return [StreamInput(*(*row[:at], None, *row[at:])) for row in rows]


#: Seconds the parent waits for a worker's message before it checks the workers are alive.
_POLL = 1.0


def _run_workers(
    ctx: multiprocessing.context.ForkContext,
    parts: str | None,
    path: str | os.PathLike[str],
    db: str,
    ports: frozenset[int],
    labels: Mapping[int, str] | None,
    progress: Progress | None,
    batch_size: int,
    jobs: int,
    chain: RecordingChain,
    node: str | None,
    proto: bytes | None,
    watchdog: _Watchdog,
) -> ReplayResult:
    """Fork workers 0..jobs-1 (one share each), run the token pass on what they
    send while they read, and gather their results.

    The workers start before the tokenizer is loaded (0.25 s of one core that
    holds the GIL): they read and write while this process loads it, then
    hand it each batch of closed streams' token inputs as they go, so the
    token pass overlaps the capture path instead of following it in each
    worker. Once loaded, a second token process is forked (it shares the
    tokenizer's pages): this one takes the even shares' inputs, that one the
    odd shares' (:func:`_token_helper`), so that the pass is not one
    process's alone. Worker 0 writes the database itself, the others part
    files; the token rows of share k go to a file of their own
    (``tokens-k.db``), and :class:`_Merges` merges every file into the
    database as soon as its turn has come, while the pass goes on: the rows
    of every table end up in share order, as one process replaying share
    after share would have written them."""
    helper = chain.tokens is not None and jobs > 1
    queues = [ctx.Queue() for _ in range(2 if helper else 1)]
    merges = None if parts is None else _Merges(ctx, db, parts, jobs)
    workers = []
    # What the parent holds now (modules, the chain) outlives the workers:
    # frozen while they fork, their collections never visit it, so they leave
    # its pages shared instead of copying them on write.
    gc.freeze()
    try:
        for k in range(jobs):
            proc = ctx.Process(
                target=_worker,
                args=(
                    queues[0],
                    queues[k % len(queues)],
                    path,
                    db,
                    None if parts is None or k == 0 else _part_file(parts, k),
                    ports,
                    labels,
                    batch_size,
                    k,
                    jobs,
                    chain,
                    node,
                    proto,
                    progress is not None and k == 0,
                    None if merges is None else merges.signals,
                ),
                daemon=True,
            )
            proc.start()
            workers.append(proc)
            watchdog.add(proc, f"replay worker {proc.name}")
    finally:
        gc.unfreeze()
    if chain.tokens is not None:
        # (from here, not sniffer.runtime.features: that imports the daemon's modules)
        from sniffer.llm.registry import TOKENIZERS_PARALLELISM

        # Before the merge thread starts (the environment is not thread-safe).
        # The workers keep the cores busy: the tokenizers library's thread
        # pool would split each batch over every core and wait for its
        # slowest part (a core the workers hold), its threads spinning in
        # between. Set by the user, it is kept.
        os.environ.setdefault(TOKENIZERS_PARALLELISM, "false")
    tokens = _TokenPass(chain, db, parts, batch_size, node, str(path))
    signals = None if merges is None else merges.signals
    results: dict[int, ReplayResult] = {}
    helper_proc = None
    ok = False
    try:
        tokens.load()
        if helper:
            recv, send = ctx.Pipe(duplex=False)
            gc.freeze()  # as for the workers
            try:
                helper_proc = ctx.Process(
                    target=_token_helper,
                    args=(send, queues[1], range(1, jobs, 2), tokens, signals),
                    daemon=True,
                )
                helper_proc.start()
                watchdog.add(helper_proc, "replay token pass")
            finally:
                gc.unfreeze()
            send.close()
        if merges is not None:
            merges.start()  # after forking: no child holds a copy of a running thread

        def alive() -> None:
            # Killed after its result came, a worker may not have sent the end
            # of its token inputs (another queue, another feeder thread): a
            # worker that ends normally exits 0, once both are sent.
            for k, proc in enumerate(workers):
                if proc.exitcode is not None and (k not in results or proc.exitcode != 0):
                    raise RuntimeError(
                        f"replay worker {proc.name} failed: exit code {proc.exitcode}"
                    )
            if helper_proc is not None and helper_proc.exitcode not in (None, 0):
                raise RuntimeError(f"replay token pass failed: exit code {helper_proc.exitcode}")

        mine = range(0, jobs, len(queues))
        watchdog.arm()
        _gather(queues[0], range(jobs), mine, tokens, signals, progress, alive, results)
        if helper_proc is not None:
            while not recv.poll(_POLL):
                alive()
            try:
                kind, theirs, theirs_tokens = recv.recv()
            except EOFError:
                kind, theirs, theirs_tokens = "error", "ended without a word", None
            if kind != "done":
                raise RuntimeError(f"replay token pass failed: {theirs}")
            tokens.result.merge(ReplayResult(**theirs_tokens))
        if merges is not None:
            merges.wait()
        ok = True
    finally:
        try:
            # The failure it saw may be raised here: its signal ends this join.
            watchdog.stop()
        finally:
            try:
                tokens.close()  # (may raise: a token file it cannot write)
                if merges is not None:
                    merges.stop()
            finally:
                # After a failure, even with every result in, a worker may wait
                # forever to flush inputs nobody reads any more (a token process
                # that failed): only a replay that went through waits for its
                # processes' exit.
                for proc in [*workers, *([helper_proc] if helper_proc is not None else [])]:
                    proc.join(None if ok else 0)
                    if proc.is_alive():
                        proc.kill()
                        proc.join()
    result = results[0]
    for k in range(1, jobs):
        result.merge(results[k])
    result.merge(tokens.result)
    return result


def _gather(
    queue: multiprocessing.queues.Queue[tuple[str, int, Any]],
    workers: range,
    shares: range,
    tokens: _TokenPass,
    signals: multiprocessing.queues.SimpleQueue[tuple[str, int]] | None,
    progress: Progress | None,
    alive: Callable[[], None],
    results: dict[int, ReplayResult],
) -> None:
    """Take messages from ``queue`` until every worker of ``workers`` has sent
    its result (into ``results``) and every one of ``shares`` the end of its
    token inputs: run the token pass on those, and tell the merges
    (``signals``) when a share's token rows are all written. ``alive`` is
    called when no message came for a while (it raises for a dead worker)."""
    from queue import Empty  # (multiprocessing's import has made it already)

    ended: set[int] = set()
    while not (all(k in results for k in workers) and ended.issuperset(shares)):
        try:
            kind, k, payload = queue.get(timeout=_POLL)
        except Empty:
            alive()
            continue
        if kind == "inputs":
            tokens.run(k, payload)
        elif kind == "end":  # its inputs came before: its token rows are written
            ended.add(k)
            wrote = tokens.done(k)
            if signals is not None:
                signals.put(("tokens" if wrote else "no tokens", k))
        elif kind == "done":
            results[k] = ReplayResult(**payload)
        elif kind == "progress":
            if progress is not None:
                progress(*payload)
        else:
            raise RuntimeError(f"replay worker {k} failed: {payload}")


def _token_helper(
    send: multiprocessing.connection.Connection,
    queue: multiprocessing.queues.Queue[tuple[str, int, Any]],
    shares: range,
    tokens: _TokenPass,
    signals: multiprocessing.queues.SimpleQueue[tuple[str, int]] | None,
) -> None:
    """The second token process of a parallel replay (forked once the
    tokenizer is loaded): the token pass on the inputs of ``shares``; sends
    what it did. The workers send their results to the parent, which finds a
    worker dead without a word (this process cannot wait for its siblings)
    and then ends this one."""
    try:
        _gather(queue, range(0), shares, tokens, signals, None, lambda: None, {})
        send.send(("done", None, asdict(tokens.result)))
    except BaseException as exc:  # report, never hang the parent
        send.send(("error", f"{type(exc).__name__}: {exc}", None))
    finally:
        tokens.close()
        send.close()


class _TokenPass:
    """The parallel replay's token pass, in the parent, on the token inputs
    the workers send: share k's rows go to a file of their own (``tokens-k.db``
    beside the part files, merged by :class:`_Merges`), or into the database
    itself when there are no part files."""

    def __init__(
        self,
        chain: RecordingChain,
        db: str,
        parts: str | None,
        batch_size: int,
        node: str | None,
        path: str,
    ) -> None:
        self._chain, self._db, self._parts = chain, db, parts
        self._batch_size, self._node = batch_size, node
        self._writers: dict[int, StoreWriter] = {}
        #: what the pass did (its token fields; the rest stays zero)
        self.result = ReplayResult(path=path)

    def load(self) -> None:
        """Load the default tokenizer while the workers read (DeepSeek's is read
        natively, ~0.1 s with the GIL released; the tokenizers library's load,
        0.25 s holding it, is left to first need: ``LoadedTokenizer._tok``)."""
        if self._chain.tokens is None:
            return
        from sniffer.llm.registry import TokenizerLoadError

        # A missing default is kept: the pass writes an error row per stream, as in one process.
        with contextlib.suppress(TokenizerLoadError):
            self._chain.tokens.preload()
        # The pass's modules too, imported at its first batch otherwise: here,
        # once, rather than again in the second token process forked next.
        import sniffer.record.tokenize_pass  # noqa: F401

    def run(self, k: int, inputs: list[tuple[Any, ...]]) -> None:
        """Tokenize inputs of share k (as :func:`_to_wire` sent them) and write their rows."""
        chain = self._chain
        assert chain.collector is not None
        started = time.perf_counter()
        w = self._writers.get(k)
        if w is None:
            if self._parts is None:
                target = self._db
            else:
                from sniffer.store.parts import create_part

                target = _tokens_file(self._parts, k)
                create_part(target)
            w = self._writers[k] = StoreWriter(target, batch_size=self._batch_size, node=self._node)
        tok = chain.tokenize_inputs(chain.collector.bind(_from_wire(inputs)), store=w.store)
        r = self.result
        r.token_seconds += time.perf_counter() - started
        r.tokenized_streams += tok.streams
        r.tokens += tok.tokens
        r.token_anomalies += tok.anomalies

    def done(self, k: int) -> bool:
        """Share k has no more inputs: close its writer. Returns whether it wrote rows."""
        w = self._writers.pop(k, None)
        if w is None:
            return False
        w.close()
        return True

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()


class _Merges:
    """Merges a parallel replay's files into the SQLite database from a thread
    of the parent (SQLite's ``INSERT … SELECT`` runs without the GIL, beside
    the token pass), each as soon as its turn has come: the part file of
    worker k once workers 0..k have written theirs (worker 0 writes the
    database), the token rows of share k once the pass has written them all
    and those of share k-1 are merged. Every table's rows thus come in share
    order, whatever order the workers end in.

    The workers say they have written on a queue of their own
    (:attr:`signals`, read by the thread alone): the parent's main thread,
    busy with the token pass, would see their messages late."""

    def __init__(
        self, ctx: multiprocessing.context.ForkContext, db: str, parts: str, jobs: int
    ) -> None:
        import threading

        self._db, self._parts, self._jobs = db, parts, jobs
        #: ``("written", k)`` from worker k; ``("tokens", k)`` (or
        #: ``"no tokens"``: share k had none) from the token pass; ``("stop", -1)``
        self.signals: multiprocessing.queues.SimpleQueue[tuple[str, int]] = ctx.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="replay-merge", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self) -> None:
        """Until every file is merged; raises what a merge raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """No further merge (after an error elsewhere); waits for the one under way."""
        if self._thread.is_alive():
            self.signals.put(("stop", -1))
            self._thread.join()

    def _run(self) -> None:
        from sniffer.store.parts import PartMerger

        jobs = self._jobs
        written: set[int] = set()
        tokens: dict[int, bool] = {}
        part, tok = 1, 0  # the next of each kind to merge
        try:
            with PartMerger(self._db) as merger:  # one connection: one checkpoint, at the end
                while part < jobs or tok < jobs:
                    if part < jobs and written.issuperset(range(part + 1)):
                        merger.merge(_part_file(self._parts, part))
                        part += 1
                    elif tok < jobs and tok in tokens:
                        if tokens[tok]:
                            merger.merge(_tokens_file(self._parts, tok))
                        tok += 1
                    else:
                        kind, k = self.signals.get()
                        if kind == "stop":
                            return
                        if kind == "written":
                            written.add(k)
                        else:
                            tokens[k] = kind == "tokens"
        except BaseException as exc:
            self._error = exc


def _worker(
    queue: multiprocessing.queues.Queue[tuple[str, int, object]],
    token_queue: multiprocessing.queues.Queue[tuple[str, int, object]],
    path: str | os.PathLike[str],
    db: str,
    part: str | None,
    ports: frozenset[int],
    labels: Mapping[int, str] | None,
    batch_size: int,
    k: int,
    n: int,
    chain: RecordingChain,
    node: str | None,
    proto: bytes | None = None,
    report: bool = False,
    written: multiprocessing.queues.SimpleQueue[tuple[str, int]] | None = None,
) -> None:
    """Replay share ``k`` of ``n`` into ``db``, or into the part file ``part``
    with ids reserved in ``db`` (``sniffer.store.parts``); put on
    ``token_queue`` the token inputs of the closed streams as they come, then
    their end (a token process runs the pass); on ``queue`` (the parent's)
    the progress when ``report``, and then the result; on ``written``
    (:class:`_Merges`), that its rows are written."""
    try:
        if part is None:
            w = StoreWriter(db, batch_size=batch_size, node=node)
        else:
            from sniffer.store.parts import create_part

            create_part(part)
            w = StoreWriter(part, batch_size=batch_size, node=node, ids_from=db)

        def send(inputs: list[StreamInput]) -> None:
            token_queue.put(("inputs", k, _to_wire(inputs)))

        def progress(done: int, total: int) -> None:
            queue.put(("progress", k, (done, total)))

        try:
            result = _replay_part(
                path, w, ports, labels, progress if report else None, k, n, chain, proto, send
            )
        finally:
            w.close()
        if written is not None:
            written.put(("written", k))
        token_queue.put(("end", k, None))
        queue.put(("done", k, asdict(result)))
    except BaseException as exc:  # report, never hang the parent
        queue.put(("error", k, f"{type(exc).__name__}: {exc}"))
    finally:
        for q in {id(queue): queue, id(token_queue): token_queue}.values():
            q.close()
            q.join_thread()


def _replay_part(
    path: str | os.PathLike[str],
    w: StoreWriter,
    ports: frozenset[int],
    labels: Mapping[int, str] | None,
    progress: Progress | None,
    k: int,
    n: int,
    chain: RecordingChain,
    proto: bytes | None = None,
    send: Callable[[list[StreamInput]], None] | None = None,
) -> ReplayResult:
    """Replay worker k's share of the connections (all of them when n == 1):
    :class:`Shares`, by port pair, so both directions land together. With
    ``send``, the token inputs of closed streams go there in batches as they
    come (a parallel replay's parent runs the token pass) instead of to a
    token pass here at the end."""
    reader = read_capture(path)
    result = ReplayResult(path=str(path))
    pipe = Pipeline(
        PipelineConfig(
            conn_ids=w.conn_ids,
            stream_ids=w.stream_ids,
            only_ports=ports,
            labels=labels,
            proto_descriptors=proto,
        )
    )
    # The pipeline makes many short-lived objects and no cycles worth chasing
    # per packet: collect the young generation far less often while replaying.
    thresholds = gc.get_threshold()
    gc.set_threshold(200_000, 50, 100)
    chain.attach(w)  # this process's writer (a forked worker has its own copy of the chain)
    write_many: Callable[[list[StoreEvent]], None] = chain.write
    if send is not None and chain.tokens is not None:
        write_many = _sending(chain, send)

    try:
        feed = pipe.feed
        next_expire = 0.0
        ts = 0.0
        # What the pipeline makes goes to the chain in batches of a few hundred
        # events, not one call per packet: every step of the chain handles a
        # batch exactly as the same events one call at a time, in order.
        batch: list[StoreEvent] = []
        segments: Iterable[Segment] = reader
        if pipe.native:
            ts, batch = _replay_native(reader, pipe, write_many, progress, k, n)
            segments = ()
        shares = Shares(n)
        for count, seg in enumerate(segments, 1):
            if n == 1 or shares.take(seg.sport, seg.dport) == k:
                out = feed(seg)
                if out:
                    batch += out
                    if len(batch) >= WRITE_EVERY:
                        write_many(batch)
                        batch = []
            if count & 0x3FFF == 0:
                ts = seg.ts
                if ts >= next_expire:
                    if next_expire:
                        if batch:
                            write_many(batch)
                            batch = []
                        write_many(pipe.expire(ts))
                    next_expire = ts + EXPIRE_EVERY
                if progress is not None:
                    progress(reader.offset, reader.size)
        if batch:
            write_many(batch)
        last = reader.stats.last_ts or ts
        out = pipe.flush(last)
        if reader.error is not None and k == 0:
            result.capture_error = str(reader.error)
            out.append(PipelineError(last, "capture", "file", str(reader.error)))
        write_many(out)
        chain.drain()  # what the redaction look-behind still holds
        if progress is not None:
            progress(reader.size, reader.size)
        chain.flush()
    finally:
        gc.set_threshold(*thresholds)
    if send is not None:
        if chain.tokens is not None:
            inputs = chain.take_token_inputs()
            if inputs:
                send(inputs)
    elif chain.tokens is not None:
        started = time.perf_counter()
        tok = chain.tokenize()
        result.token_seconds = time.perf_counter() - started
        result.tokenized_streams = tok.streams
        result.tokens = tok.tokens
        result.token_anomalies = tok.anomalies
    result.redactions = chain.redactions
    st = pipe.streams.stats
    result.packets = reader.stats.packets
    result.segments = pipe.segments
    result.chunk_events = st.chunk_events
    result.streams = st.streams_closed
    result.states = dict(st.states)
    result.reassembly = pipe.reassembly_counts()
    result.errors = (
        sum(st.errors.values())
        + pipe.internal_errors
        + (result.capture_error is not None)
        + int(w.stats["rejected_rows"])  # rows the database refused: error rows too
    )
    return result


def _sending(
    chain: RecordingChain, send: Callable[[list[StreamInput]], None]
) -> Callable[[list[StoreEvent]], None]:
    """``chain.write`` that then sends the token inputs of the closed streams
    once :data:`SEND_EVERY` of them are ready."""
    write = chain.write
    take = chain.take_token_inputs

    def write_and_send(events: list[StoreEvent]) -> None:
        write(events)
        if chain.tokens_ready >= SEND_EVERY:
            send(take())

    return write_and_send


def _replay_native(
    reader: CaptureReader,
    pipe: Pipeline,
    write_many: Callable[[list[StoreEvent]], None],
    progress: Progress | None,
    k: int,
    n: int,
) -> tuple[float, list[StoreEvent]]:
    """The loop of ``_replay_part`` over native batches (one call per few
    thousand packets), with the same idle sweeps at the same segments (every
    0x4000th segment of the file) and the same writes: the store comes out
    byte-identical. Returns the last sweep's time and the events not written."""
    next_expire = 0.0
    ts = 0.0
    count = 0
    out: list[StoreEvent] = []
    for seg_batch in reader.segment_batches():
        i = 0
        size = len(seg_batch)
        while i < size:
            j = min(size, i + 0x4000 - (count & 0x3FFF))
            events = pipe.feed_batch(seg_batch, i, j, k, n)
            if events:
                out += events
                if len(out) >= WRITE_EVERY:
                    write_many(out)
                    out = []
            count += j - i
            i = j
            if count & 0x3FFF == 0:
                ts = seg_batch.ts(j - 1)
                if ts >= next_expire:
                    if next_expire:
                        if out:
                            write_many(out)
                            out = []
                        write_many(pipe.expire(ts))
                    next_expire = ts + EXPIRE_EVERY
                if progress is not None:
                    progress(reader.offset, reader.size)
    return ts, out


class Shares:
    """Which of ``n`` workers replays each segment of a file (the native core's
    ``Shares`` does the same). Every worker reads every segment of the file in
    the same order and runs the same rule, so all of them agree without
    talking: a port pair (keyed by ``sport ^ dport``, the same for both
    directions of a connection) is given, when first seen, to the worker with
    the fewest segments so far (then the fewest port pairs, then the lowest
    number), and keeps it. A hash of the port pair balanced connections, not
    work: a capture of a few dozen keep-alive connections (what the openai SDK
    makes) split 59/41."""

    __slots__ = ("_keys", "_of", "_segments", "n")

    def __init__(self, n: int) -> None:
        self.n = max(1, n)
        self._of: dict[int, int] = {}
        self._segments = [0] * self.n
        self._keys = [0] * self.n

    def take(self, sport: int, dport: int) -> int:
        """The share of one segment (counted)."""
        key = sport ^ dport
        s = self._of.get(key)
        if s is None:
            segs, keys = self._segments, self._keys
            s = min(range(self.n), key=lambda i: (segs[i], keys[i], i))
            self._of[key] = s
            keys[s] += 1
        self._segments[s] += 1
        return s


__all__ = [
    "CaptureFileError",
    "FilesProgress",
    "MissingCapture",
    "ReplayResult",
    "default_jobs",
    "replay",
    "replay_files",
]
