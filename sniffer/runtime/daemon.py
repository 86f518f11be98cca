"""The live sidecar's main loop: capture thread → bounded queue → pipeline → recording chain.

The runtime lives in small modules next to this one: ``capture_thread`` (polls
the source, never blocks; loss accounting in :mod:`sniffer.capture.loss`),
``signals``, ``notify`` (systemd), ``log`` (logfmt), ``workers`` (token pass,
retention) and ``features`` (what ``sparseety run`` wires in, given to the
daemon at construction). What happens to the store events is the recording
chain's business (:mod:`sniffer.record.chain`), shared with the replay command.

Threads
    *capture* polls the source (AF_PACKET ring or eBPF) and puts each poll's
    batch on a bounded queue with ``put_nowait``. When the queue is full the
    batch is dropped, its packets are counted (``queue_dropped``) and a
    ``CaptureGap(ts, dropped, "queue")`` marker goes through ahead of the next
    batch that fits, so every stream open at that time is marked as possibly
    gapped (eBPF batches are flow events, not packets: their data become
    ``FlowGap(reason="overflow")`` on the connections they belonged to, and
    opens/closes are kept).

    *main* (the processing thread, :meth:`Daemon.run`) takes batches off the
    queue, runs the pipeline and passes each batch of store events to the
    recording chain (observers, transforms, writer), which is flushed every
    ``flush_interval`` seconds (or at ``batch_size`` rows). It also expires
    idle connections, sends ``WATCHDOG=1``/``STATUS=`` to systemd, and acts on
    the flags the signal handlers set.

Signals
    SIGTERM/SIGINT: stop capture, drain the queue, write the restart checkpoint
    (the streams a server is still sending go to ``DB.checkpoint.json`` next
    to a SQLite database, or to this node's row of the ``checkpoints`` table of
    a server database; their rows are left open for the next instance, which
    adopts them at start and goes on writing the same rows after one exact
    gap: TCP sequence numbers from the packets with packet capture, from the
    sockets themselves with eBPF), ``pipeline.flush`` (the other open streams
    close as truncated), flush and close the writer, exit 0.
    SIGHUP: re-read the config file (CLI overrides still win). Labels,
    flush interval, batch size, idle timeout and log level apply at once;
    interface, ports and ring settings restart the capture source (the new one
    is opened before the old one is closed: no gap, possibly duplicates, which
    reassembly drops as retransmissions); backend and database need a restart.

Test-only: ``SPARSEETY_TEST_SLOW_PIPELINE_MS=N`` sleeps N ms per queued batch in
the processing thread, to make the pipeline fall behind on purpose. Never set
it in production.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sniffer.capture.source import CaptureItem, SocketSource, Source, stats_dict
from sniffer.core.events import CaptureGap, FlowEvent, Segment, StoreEvent
from sniffer.core.native import SEGMENT_BATCH
from sniffer.core.pipeline import Pipeline, PipelineConfig
from sniffer.record.chain import Observer, RecordingChain
from sniffer.runtime import CAPTURE_GC_THRESHOLDS, signals
from sniffer.runtime.capture_thread import (
    BLOCK_TIMEOUT_MS,
    CaptureThread,
    SourceFactory,
    capture_key,
    default_source,
)
from sniffer.runtime.config import RESTART_KEYS, Config, ConfigError, load_config
from sniffer.runtime.log import Log, warn_pure_fallback
from sniffer.runtime.notify import Notifier
from sniffer.runtime.stats import DaemonStats
from sniffer.store.checkpoints import save_checkpoint, take_checkpoint
from sniffer.store.files import InsecureDatabaseFile, open_private
from sniffer.store.writer import StoreError, StoreWriter

if TYPE_CHECKING:
    from sniffer.runtime.features import Features

__all__ = ["SLOW_ENV", "Daemon"]

#: How long the processing thread waits on an empty queue (seconds).
QUEUE_WAIT = 0.1
#: Seconds between idle-connection sweeps.
EXPIRE_EVERY = 5.0
#: Seconds between STATUS= updates to systemd.
STATUS_EVERY = 5.0
#: Rows the writer may hold while the database refuses them before a batch is dropped.
MAX_PENDING_FACTOR = 20
SLOW_ENV = "SPARSEETY_TEST_SLOW_PIPELINE_MS"
#: Seconds past a ring block's timeout that a replaced capture source is read
#: for its last block (the kernel's block timer is not exact to the ms).
TAIL_MARGIN = 0.01
#: The graceful-restart checkpoint file, next to a SQLite database.
CHECKPOINT_SUFFIX = ".checkpoint.json"
#: Seconds a checkpoint stays adoptable (a restart by systemd or an upgrade
#: takes seconds; after this the streams it names are likely over).
CHECKPOINT_MAX_AGE = 120.0


class Daemon:
    """The live recorder. ``run()`` blocks until SIGTERM/SIGINT (or ``request_stop``).

    Example::

        d = Daemon(load_config("/etc/sparseety/sparseety.toml"))
        d.add_sink(lambda events: print(len(events)))
        sys.exit(d.run())

    ``chain`` is where store events go. Without ``features`` it is a bare one
    (no observer, no transform: everything is written as captured); with
    ``features`` (:func:`~sniffer.runtime.features.build_features`, what
    ``sparseety run`` wires in) it is theirs, and the daemon runs their hooks:
    the gauges once a second, the workers from start to stop.
    """

    def __init__(
        self,
        config: Config,
        *,
        overrides: dict[str, Any] | None = None,
        log: Log | None = None,
        source_factory: SourceFactory | None = None,
        notifier: Notifier | None = None,
        install_signals: bool = True,
        features: Features | None = None,
    ) -> None:
        self.config = config
        self.overrides = dict(overrides or {})
        self.log = log if log is not None else Log(config.log_level)
        self.source_factory = source_factory or default_source
        self.notifier = notifier if notifier is not None else Notifier()
        self.install_signals = install_signals
        self.features = features
        #: observers → transforms → writer (the writer is attached by ``run``)
        self.chain = features.chain if features is not None else RecordingChain()
        self.chain.on_error = self._chain_failed
        self.chain.clock = self.capture_time
        #: called about once a second from the processing thread (gauges, metrics)
        self.on_tick: list[Callable[[Daemon], None]] = []
        #: called after every writer flush
        self.on_flush: list[Callable[[], None]] = []
        #: called once capture is active, the database open at this code's schema:
        #: background work on the database starts here (the token and retention
        #: workers), so none of it runs against a database ``run`` refuses
        self.on_start: list[Callable[[], None]] = []
        #: called once at shutdown, after the pipeline flushed, before the writer closes
        self.on_stop: list[Callable[[], None]] = []
        if features is not None:
            self.on_tick.extend(features.ticks)
            self.on_start.append(features.start)
            self.on_stop.append(features.stop)
        self.stats = DaemonStats()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._slow = _slow_from_env()
        self._capture: CaptureThread | None = None
        self._pipeline: Pipeline | None = None
        self._writer: StoreWriter | None = None
        self._queue: queue.Queue[list[CaptureItem]] = queue.Queue(maxsize=config.queue_size)
        self.last_ts = 0.0
        self.started = threading.Event()  # set once capture is active
        self._exit_code = 0
        self._clean = False

    # -- hooks -------------------------------------------------------------

    def add_sink(self, sink: Observer) -> None:
        """Add an observer to the chain: ``sink(events)`` is called with every batch
        of store events the pipeline makes (before the transforms and the
        writer). A sink that raises is logged and counted; it never stops the
        daemon."""
        self.chain.observers.append(sink)

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()

    def capture_time(self) -> float:
        """The latest capture timestamp seen (the wall clock before any)."""
        return self.last_ts or time.time()

    @property
    def open_connections(self) -> int:
        return self._pipeline.open_connections if self._pipeline is not None else 0

    @property
    def open_streams(self) -> int:
        return self._pipeline.open_streams if self._pipeline is not None else 0

    def reassembly_counts(self) -> dict[str, int]:
        """The pipeline's TCP reassembly counters (``Pipeline.reassembly_counts``)."""
        return self._pipeline.reassembly_counts() if self._pipeline is not None else {}

    @property
    def queue_depth(self) -> int:
        """Batches waiting between the capture thread and the processing thread."""
        return self._queue.qsize()

    # -- run ---------------------------------------------------------------

    def run(self) -> int:
        """Capture until asked to stop; returns the exit code (0 after a clean stop).

        Raises ``CaptureError``/``EbpfError`` (the capture could not start) and
        ``StoreError``/SQLAlchemy errors (the database could not be opened)
        before anything is captured.
        """
        cfg = self.config
        log = self.log
        warn_pure_fallback(log)
        restore = (
            signals.install(self._stop.set, self._reload.set) if self.install_signals else None
        )
        thresholds = gc.get_threshold()
        try:
            writer = StoreWriter(cfg.database, batch_size=cfg.batch_size, node=cfg.node)
            self._writer = writer
            self.chain.attach(writer)
            writer.prefetch_ids()  # ids in hand before the first packet
            # Ids from blocks reserved in the database: unique across sidecars.
            self._pipeline = Pipeline(
                PipelineConfig(
                    conn_ids=writer.conn_ids,
                    stream_ids=writer.stream_ids,
                    only_ports=frozenset(cfg.capture_ports)
                    if cfg.backend == "packet"
                    else frozenset(),
                    server_ports=frozenset(cfg.capture_ports),
                    labels=dict(cfg.labels),
                    idle_timeout=cfg.idle_timeout,
                    max_decoded_bytes=cfg.max_decoded_bytes,
                    max_expansion_ratio=cfg.max_expansion_ratio,
                    grpc_text_outputs=cfg.grpc_text_outputs,
                    proto_descriptors=read_proto(cfg.grpc_proto),
                )
            )
            # eBPF connection ids come from the source: the same id blocks.
            handed = self._adopt_checkpoint()
            source = self.source_factory(cfg, writer.conn_ids)
            if handed and isinstance(source, SocketSource):
                # eBPF: the sockets must be known before the first record
                source.adopt([(int(e["conn"]), e["ebpf"]) for e in handed if "ebpf" in e])
            source.open()
            capture = CaptureThread(
                source, self._queue, self.stats, log, cfg.backend == "ebpf", cfg.handover
            )
            self._capture = capture
            capture.start()
            self._hooks(self.on_start)
            gc.set_threshold(*CAPTURE_GC_THRESHOLDS)
            log(
                "info",
                "capture-active",
                iface=cfg.interface if cfg.backend == "packet" else None,
                backend=cfg.backend,
                ports=",".join(map(str, cfg.capture_ports)),
                labels=",".join(f"{p}={n}" for p, n in sorted(cfg.labels.items())) or None,
                source=source.describe(),
                database=_safe_url(cfg.database),
                queue_size=cfg.queue_size,
                pid=os.getpid(),
            )
            self.started.set()
            self.notifier.notify("READY=1", f"STATUS=capturing ({source.describe()})")
            self._loop()
            return self._shutdown()
        finally:
            gc.set_threshold(*thresholds)
            if restore is not None:
                restore()
            if self._capture is not None:
                self._capture.join(2.0)
                with contextlib.suppress(Exception):
                    self._capture.source.close()
            if self._writer is not None and not self._clean:
                with contextlib.suppress(Exception):
                    self._writer.dispose()

    def _loop(self) -> None:
        q = self._queue
        stop = self._stop
        monotonic = time.monotonic
        cfg = self.config
        next_flush = monotonic() + cfg.flush_interval
        next_expire = monotonic() + EXPIRE_EVERY
        next_status = monotonic() + STATUS_EVERY
        next_tick = monotonic() + 1.0
        notifier = self.notifier
        while not stop.is_set():
            try:
                batch = q.get(timeout=QUEUE_WAIT)
            except queue.Empty:
                batch = None
            if batch is not None:
                self._process(batch)
            now = monotonic()
            if now >= next_flush:
                self._flush()
                next_flush = now + self.config.flush_interval
            if now >= next_expire:
                next_expire = now + EXPIRE_EVERY
                self._expire()
            capture = self._capture
            if capture is not None and capture.thread.is_alive():
                notifier.watchdog(now)
            elif capture is not None and capture.error is not None:
                # The source died: stop (systemd restarts us) rather than pretend.
                self.log("error", "capture-stopped", error=capture.error)
                notifier.notify(f"STATUS=capture failed: {capture.error}")
                self._stop.set()
                self._exit_code = 1
            if now >= next_status:
                next_status = now + STATUS_EVERY
                self._status()
            if now >= next_tick and self.on_tick:
                next_tick = now + 1.0
                self._hooks(self.on_tick, self)
            if self._reload.is_set():
                self._reload.clear()
                self._do_reload()

    def _process(self, batch: list[Any]) -> None:
        pipe = self._pipeline
        assert pipe is not None
        stats = self.stats
        stats.batches += 1
        stats.items += len(batch)
        if self._slow:
            time.sleep(self._slow)
        out: list[StoreEvent] = []
        flows: list[FlowEvent] = []
        segs: list[Segment] = []  # a run of segments, fed in one call
        for item in batch:
            t = type(item)
            if t is Segment:
                segs.append(item)
                continue
            if segs:
                out += pipe.feed_segments(segs)
                segs = []
            if t is SEGMENT_BATCH:  # a native batch of segments (a ring block)
                out += pipe.feed_batch(item)
                if len(item):
                    self.last_ts = max(self.last_ts, item.ts(-1))
            elif t is CaptureGap:
                if flows:
                    out += pipe.feed_flows(flows)
                    flows = []
                # pipeline.capture_gap records PipelineError(stage "capture",
                # kind "queue-drop" / "kernel-drop") and marks open connections.
                if item.source == "queue":
                    stats.queue_gaps += 1
                    out += pipe.capture_gap(item)
                else:
                    stats.kernel_gaps += 1
                    stats.kernel_dropped += item.dropped
                    out += pipe.capture_gap(item)
                self.last_ts = max(self.last_ts, item.ts)
            else:
                flows.append(item)
        if segs:
            out += pipe.feed_segments(segs)
        if flows:
            out += pipe.feed_flows(flows)
            self.last_ts = max(self.last_ts, flows[-1].ts)
        if batch:
            last = batch[-1]
            ts = getattr(last, "ts", 0.0) if type(last) is not SEGMENT_BATCH else 0.0
            if ts > self.last_ts:
                self.last_ts = ts
        if out:
            self._emit(out)

    def _emit(self, events: list[StoreEvent]) -> None:
        self.stats.store_events += len(events)
        try:
            self.chain.write(events)
        except Exception as exc:  # StoreError; anything else must not stop the capture
            self._store_failed(exc)

    def _chain_failed(self, role: str, name: str, exc: Exception) -> None:
        """An observer or transform of the chain raised: log and count, go on."""
        self.stats.sink_errors += 1
        error = f"{type(exc).__name__}: {exc}"
        if role == "transform":
            self.log("error", "transform-failed", transform=name, error=error)
        elif self.stats.sink_errors <= 10 or self.stats.sink_errors % 1000 == 0:
            self.log("error", "sink-failed", sink=name, error=error, count=self.stats.sink_errors)

    def _store_failed(self, exc: Exception) -> None:
        """The writer raised: ``StoreError`` (the database cannot take writes; the
        batch is kept) or, were the writer to fail in a way it does not expect,
        anything else: logged and counted, and capture goes on."""
        writer = self._writer
        assert writer is not None
        self.stats.store_errors += 1
        error = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
        self.log("error", "store-failed", error=error, pending=writer.pending)
        if writer.pending > writer.batch_size * MAX_PENDING_FACTOR:
            dropped = writer.discard()
            self.stats.store_discarded += dropped
            self.log("error", "store-discarded", rows=dropped)

    def _flush(self) -> None:
        writer = self._writer
        if writer is None:
            return
        try:
            self.chain.flush()
        except Exception as exc:  # StoreError; anything else must not stop the capture
            self._store_failed(exc)
            return
        refused = int(writer.stats["rejected_rows"])  # this flush's and earlier automatic ones'
        if refused > self.stats.store_rejected:
            self.log("error", "store-rejected", rows=refused - self.stats.store_rejected)
            self.stats.store_rejected = refused
        self._hooks(self.on_flush)

    def _hooks(self, hooks: Sequence[Callable[..., None]], *args: Any) -> None:
        for hook in hooks:
            try:
                hook(*args)
            except Exception as exc:
                self.stats.sink_errors += 1
                self.log(
                    "error",
                    "hook-failed",
                    hook=getattr(hook, "__name__", repr(hook)),
                    error=f"{type(exc).__name__}: {exc}",
                )

    def _expire(self) -> None:
        pipe = self._pipeline
        if pipe is None:
            return
        # Capture timestamps are wall-clock times; with no traffic they do not
        # advance, so idle connections are swept by the wall clock too (less a
        # margin for packets still queued).
        now = max(self.last_ts, time.time() - 2 * EXPIRE_EVERY)
        out = pipe.expire(now)
        if out:
            self._emit(out)

    def _status(self) -> None:
        pipe = self._pipeline
        s = self.stats
        text = (
            f"streams open {pipe.open_streams if pipe else 0}, "
            f"connections {pipe.open_connections if pipe else 0}, "
            f"events {s.store_events}, queue {self._queue.qsize()}/{self.config.queue_size}, "
            f"queue loss {s.queue_dropped}, kernel drops {s.kernel_dropped}"
        )
        self.notifier.notify(f"STATUS={text}")
        self.log(
            "debug",
            "status",
            open_streams=pipe.open_streams if pipe else 0,
            events=s.store_events,
            queue=self._queue.qsize(),
            queue_dropped=s.queue_dropped,
            kernel_dropped=s.kernel_dropped,
        )

    # -- reload ------------------------------------------------------------

    def _do_reload(self) -> None:
        old = self.config
        self.stats.reloads += 1
        self.notifier.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            new = load_config(old.source).with_overrides(self.overrides)
        except ConfigError as exc:
            self.log("error", "reload-failed", error=str(exc), kept="previous config")
            self.notifier.notify("READY=1")
            return
        ignored = [k for k in RESTART_KEYS if getattr(new, k) != getattr(old, k)]
        if ignored:
            self.log("warning", "reload-needs-restart", keys=",".join(ignored))
            new = new.with_overrides({k: getattr(old, k) for k in ignored})
        if capture_key(new) != capture_key(old):
            keep = {
                "interface": old.interface,
                "ports": old.ports,
                "labels": old.labels,
                "ring_blocks": old.ring_blocks,
                "block_size": old.block_size,
                "pids": old.pids,
                "comms": old.comms,
            }
            if new.backend == "ebpf":
                # eBPF connection state lives in the source: a new one would
                # reuse connection ids. Selection changes need a restart.
                self.log("warning", "reload-needs-restart", keys="capture selection (ebpf)")
                new = new.with_overrides(keep)
            elif not self._restart_capture(new):
                new = new.with_overrides(keep)
        if new.queue_size != old.queue_size:
            self.log("warning", "reload-needs-restart", keys="queue_size")
            new = new.with_overrides({"queue_size": old.queue_size})
        self._apply_live(new)
        self.config = new
        self.log("info", "reloaded", source=new.source)
        self.notifier.notify("READY=1", "STATUS=configuration reloaded")

    def _apply_live(self, new: Config) -> None:
        """Settings that take effect without restarting anything."""
        pipe = self._pipeline
        if pipe is not None:
            pipe.set_labels(new.labels)
            if new.backend == "packet":
                pipe.set_ports(frozenset(new.capture_ports))
            pipe.reassembler.idle_timeout = new.idle_timeout
        if self._writer is not None:
            self._writer.batch_size = new.batch_size
            self._writer.node = new.node  # rows buffered from now on
        self.log.level = new.log_level
        if self._capture is not None:
            self._capture.handover = new.handover

    def _restart_capture(self, new: Config) -> bool:
        old = self._capture
        try:
            assert self._writer is not None
            source = self.source_factory(new, self._writer.conn_ids)
            source.open()
        except Exception as exc:
            self.log("error", "capture-restart-failed", error=str(exc), kept="previous capture")
            return False
        capture = CaptureThread(
            source, self._queue, self.stats, self.log, new.backend == "ebpf", new.handover
        )
        capture.start()
        self._capture = capture
        if old is not None:
            old.join(2.0)
            if not old.thread.is_alive():
                tail, error = _tail(old.source)
                old.offer(tail)
                if error is not None:  # what the old ring still held past this is lost
                    self.log("warning", "capture-tail-failed", error=error)
            with contextlib.suppress(Exception):
                old.source.close()
        self.stats.capture_restarts += 1
        self.log(
            "info",
            "capture-active",
            iface=new.interface if new.backend == "packet" else None,
            backend=new.backend,
            ports=",".join(map(str, new.capture_ports)),
            source=source.describe(),
        )
        return True

    # -- shutdown ----------------------------------------------------------

    # -- graceful restart ----------------------------------------------------

    def _write_checkpoint(self, source: Source | None) -> list[int]:
        """Graceful stop: hand the streams under way to the next instance (TCP
        sequence numbers tell it exactly what it missed: the packets' with
        packet capture, the sockets' own with eBPF). SQLite: a private file
        next to the database; a server database: this node's row of the
        ``checkpoints`` table. Returns the connection ids handed over."""
        pipe = self._pipeline
        writer = self._writer
        if pipe is None or writer is None:
            return []
        positions = None
        if self.config.backend == "ebpf":
            if not isinstance(source, SocketSource):
                return []
            positions = source.checkpoint_positions()
        entries = pipe.checkpoint(positions, time.time())
        if not entries:
            return []
        doc = {
            "version": 1,
            "written_at": time.time(),
            "backend": self.config.backend,
            "entries": entries,
        }
        path = checkpoint_path(self.config.database)
        where = str(path) if path is not None else f"table checkpoints, node {writer.node}"
        failures: tuple[type[BaseException], ...] = (OSError, InsecureDatabaseFile)
        if path is None:  # a server database: its errors too
            failures = (*failures, *writer.store.errors)
        try:
            if path is None:
                save_checkpoint(writer.store, writer.node, doc)
            else:
                tmp = path.with_name(path.name + ".tmp")
                # private like the database: it names endpoints and request fields
                with os.fdopen(open_private(str(tmp)), "w", encoding="utf-8") as fh:
                    fh.write(json.dumps(doc))
                os.replace(tmp, path)
        except failures as exc:
            self.log("error", "checkpoint-failed", path=where, error=str(exc))
            # the pipeline dropped them: close their rows now rather than never
            out = pipe.close_checkpointed(entries, time.time())
            if out:
                self._emit(out)
            return []
        self.log("info", "checkpoint-written", path=where, streams=len(entries))
        return [int(e["conn"]) for e in entries]

    def _read_checkpoint(self) -> tuple[str, Any] | None:
        """(where, document) of the checkpoint left for this instance, removed
        as it is read; None when there is none."""
        writer = self._writer
        assert writer is not None
        path = checkpoint_path(self.config.database)
        if path is None:
            where = f"table checkpoints, node {writer.node}"
            unreadable: tuple[type[BaseException], ...] = (*writer.store.errors, ValueError)
            try:
                doc = take_checkpoint(writer.store, writer.node)
            except unreadable as exc:
                self.log("warning", "checkpoint-unreadable", path=where, error=str(exc))
                return None
            return None if doc is None else (where, doc)
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
            path.unlink()
        except (OSError, ValueError) as exc:
            self.log("warning", "checkpoint-unreadable", path=str(path), error=str(exc))
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return str(path), doc

    def _adopt_checkpoint(self) -> list[dict[str, Any]]:
        """Start: adopt what a gracefully stopped instance handed over; a stale
        checkpoint (or one this backend cannot follow) closes its streams as
        gapped. Returns the entries adopted."""
        pipe = self._pipeline
        if pipe is None:
            return []
        found = self._read_checkpoint()
        if found is None:
            return []
        where, doc = found
        entries = doc.get("entries") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            return []
        now = time.time()
        age = now - float(doc.get("written_at") or 0)
        backend = doc.get("backend", "packet")
        if backend != self.config.backend or not 0 <= age <= CHECKPOINT_MAX_AGE:
            out = pipe.close_checkpointed(entries, now)
            if out:
                self._emit(out)
            self.log("warning", "checkpoint-stale", path=where, streams=len(entries), age=age)
            return []
        n = pipe.adopt(entries, now)
        self.log("info", "checkpoint-adopted", path=where, streams=n, age=round(age, 3))
        return [e for e in entries if isinstance(e, dict)]

    def _shutdown(self) -> int:
        log = self.log
        self.notifier.notify("STOPPING=1", "STATUS=stopping: flushing")
        capture = self._capture
        final: list[CaptureItem] = []
        sockets = (
            capture.source
            if capture is not None and isinstance(capture.source, SocketSource)
            else None
        )
        if capture is not None:
            capture.join(5.0)
            if capture.loss.pending:
                final = capture.loss.marker()
            if sockets is None:
                # packets: what the ring still holds (the last packets before the
                # stop); not while a stuck capture thread may still poll it
                if not capture.thread.is_alive():
                    with contextlib.suppress(Exception):
                        final += list(capture.source.finish())
            else:
                # eBPF: the records still in the ring now; the sockets' ends
                # after the checkpoint (which keeps the streams under way open)
                with contextlib.suppress(Exception):
                    final += list(sockets.drain())
        # Drain what was queued before the stop (bounded by the queue size).
        for _ in range(self.config.queue_size + 1):
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                break
            self._process(batch)
        if final:
            self._process(final)
        pipe = self._pipeline
        assert pipe is not None
        handed = self._write_checkpoint(capture.source if capture is not None else None)
        if sockets is not None:
            sockets.forget(handed)
            ends: list[CaptureItem] = []
            with contextlib.suppress(Exception):
                ends = list(sockets.finish())
            if ends:
                self._process(ends)
        out = pipe.flush(self.last_ts or time.time())
        if out:
            self._emit(out)
        self._hooks(self.on_stop)
        code = self._exit_code
        writer = self._writer
        assert writer is not None
        self._clean = True
        try:
            self.chain.close()
        except Exception as exc:  # StoreError, or anything the writer did not expect
            self.stats.store_errors += 1
            error = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            log("error", "store-failed", error=error, pending=writer.pending)
            code = code or 1
        s = self.stats
        cap_stats: dict[str, Any] = {}
        if capture is not None:
            with contextlib.suppress(Exception):
                cap_stats = stats_dict(capture.source)
        log(
            "info",
            "stopped",
            batches=s.batches,
            items=s.items,
            store_events=s.store_events,
            queue_dropped=s.queue_dropped,
            queue_drop_batches=s.queue_drop_batches,
            kernel_dropped=s.kernel_dropped,
            kernel_drops=cap_stats.get("kernel_drops"),
            lost_records=cap_stats.get("lost_records"),
            max_queue=s.max_queue,
            sink_errors=s.sink_errors,
            store_errors=s.store_errors,
            store_rejected=int(writer.stats["rejected_rows"]),
            streams=writer.stats.get("streams"),
            chunks=writer.stats.get("chunks"),
            exit_code=code,
        )
        return code


def _tail(source: Source) -> tuple[list[CaptureItem], str | None]:
    """What a replaced capture source still holds once its thread has stopped:
    a ring block is handed over up to ``BLOCK_TIMEOUT_MS`` after its first
    packet, so the packets of the last moments before the thread's last poll
    may still be in the ring; polled for that long. The new source was opened
    first: what both captured reaches reassembly twice and the second copy is
    dropped as a retransmission. Returns what was read and, when a poll
    failed (the rest of the ring is then not read), its error."""
    out: list[CaptureItem] = []
    deadline = time.monotonic() + BLOCK_TIMEOUT_MS / 1000 + TAIL_MARGIN
    for _ in range(64):  # bounded; each poll waits at most what is left
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            out += source.poll(left)
        except Exception as exc:
            return out, f"{type(exc).__name__}: {exc}"
    return out, None


def checkpoint_path(database: str) -> Path | None:
    """Where the graceful-restart checkpoint of a database lives: a small JSON file
    next to a SQLite database (``DB.checkpoint.json``); None for a server
    database (the checkpoint is then the node's row of the ``checkpoints`` table)."""
    if "://" not in database:
        return Path(database + CHECKPOINT_SUFFIX)
    if database.startswith("sqlite:///") and len(database) > len("sqlite:///"):
        return Path(database[len("sqlite:///") :] + CHECKPOINT_SUFFIX)
    return None


def read_proto(path: str) -> bytes | None:
    """The descriptor set named by ``[grpc] proto`` ("" → None); ConfigError if unusable."""
    if not path:
        return None
    from sniffer.core.grpc import ProtoCatalog

    try:
        with open(path, "rb") as fh:
            data = fh.read()
        ProtoCatalog(data)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"grpc proto {path}: {exc}") from None
    return data


def _slow_from_env() -> float:
    raw = os.environ.get(SLOW_ENV, "")
    try:
        return max(0.0, float(raw) / 1000.0) if raw else 0.0
    except ValueError:
        return 0.0


def _safe_url(url: str) -> str:
    """A database URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
