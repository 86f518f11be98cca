"""The live sidecar: capture thread → bounded queue → pipeline → batched writer.

This is the only module with loops, threads, queues, signals and clocks.

Threads
    *capture* polls the source (AF_PACKET ring or eBPF) and puts each poll's
    batch on a bounded queue with ``put_nowait``. It never blocks: when the
    queue is full the batch is dropped, its packets are counted
    (``queue_dropped``) and a ``CaptureGap(ts, dropped, "queue")`` marker goes
    through ahead of the next batch that fits, so every stream open at that
    time is marked as possibly gapped (eBPF batches are flow events, not
    packets: their data become ``FlowGap(reason="overflow")`` on the
    connections they belonged to, and opens/closes are kept). Memory is held
    flat by ``queue_size`` × (one poll's batch).

    *main* (the processing thread) takes batches off the queue, runs the
    pipeline, passes each batch of store events to the sinks, through the
    optional transform, and to the writer, which is flushed every
    ``flush_interval`` seconds (or at ``batch_size`` rows). It also expires
    idle connections, sends ``WATCHDOG=1``/``STATUS=`` to systemd, and acts on
    the flags the signal handlers set.

Signals
    SIGTERM/SIGINT: stop capture, drain the queue, ``pipeline.flush`` (open
    streams close as truncated), flush and close the writer, exit 0.
    SIGHUP: re-read the config file (CLI overrides still win). Labels,
    flush interval, batch size, idle timeout and log level apply at once;
    interface, ports and ring settings restart the capture source (the new one
    is opened before the old one is closed: no gap, possibly duplicates, which
    reassembly drops as retransmissions); backend and database need a restart.

Logs are logfmt lines on stderr (``level=info event=capture-active iface=lo …``);
under systemd (``$JOURNAL_STREAM`` set) each line starts with a ``<N>`` syslog
priority and carries no timestamp (journald adds one).

Test-only: ``SPARSEETY_TEST_SLOW_PIPELINE_MS=N`` sleeps N ms per queued batch in
the processing thread, to make the pipeline fall behind on purpose. Never set
it in production.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol, TextIO

from .config import Config, ConfigError, load_config
from .events import (
    CaptureGap,
    ConnectionClosed,
    ConnectionOpened,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
    Segment,
    StoreEvent,
)
from .pipeline import Pipeline, PipelineConfig
from .store.writer import StoreError, StoreWriter

__all__ = [
    "Daemon",
    "DaemonStats",
    "Log",
    "Notifier",
    "Sink",
    "Transform",
    "sd_notify",
]

Sink = Callable[[list[StoreEvent]], None]
Transform = Callable[[list[StoreEvent]], list[StoreEvent]]
Item = Segment | CaptureGap | FlowEvent

#: How long one capture poll waits for packets (seconds).
POLL_TIMEOUT = 0.05
#: How long the processing thread waits on an empty queue (seconds).
QUEUE_WAIT = 0.1
#: Seconds between idle-connection sweeps.
EXPIRE_EVERY = 5.0
#: Seconds between STATUS= updates to systemd.
STATUS_EVERY = 5.0
#: Rows the writer may hold while the database refuses them before a batch is dropped.
MAX_PENDING_FACTOR = 20
SLOW_ENV = "SPARSEETY_TEST_SLOW_PIPELINE_MS"

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_SYSLOG = {"debug": 7, "info": 6, "warning": 4, "error": 3}


# ---------------------------------------------------------------------- sd_notify


def sd_notify(state: str, socket_path: str | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd's notify socket.

    ``socket_path`` defaults to ``$NOTIFY_SOCKET``; a leading ``@`` means the
    abstract namespace. Returns False (and does nothing) when there is no
    socket or sending fails: notification is best effort, never fatal.
    """
    path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET")
    if not path or not (path.startswith("/") or path.startswith("@")):
        return False
    addr = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode("utf-8", "replace"))
    except OSError:
        return False
    return True


class Notifier:
    """sd_notify for one daemon run: readiness, status and the watchdog.

    The watchdog interval comes from ``$WATCHDOG_USEC`` (honoured only when
    ``$WATCHDOG_PID`` is unset or this process); pings are sent at half of it.
    """

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.socket_path = env.get("NOTIFY_SOCKET") or None
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        wpid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not wpid or wpid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._next_ping = 0.0
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return self.socket_path is not None

    def notify(self, *states: str) -> bool:
        if self.socket_path is None:
            return False
        ok = sd_notify("\n".join(states), self.socket_path)
        self.sent += ok
        return ok

    def watchdog(self, now: float) -> None:
        """Ping the watchdog if it is due (``now`` is a monotonic time)."""
        if self.watchdog_interval is None or now < self._next_ping:
            return
        self._next_ping = now + self.watchdog_interval
        self.notify("WATCHDOG=1")


# ---------------------------------------------------------------------- logging


def _fmt_value(value: Any) -> str:
    s = value if isinstance(value, str) else str(value)
    if s and not any(c in s for c in ' ="\\') and s.isprintable():
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Log:
    """logfmt lines to a stream (stderr): ``level=… event=… key=value …``."""

    def __init__(self, level: str = "info", stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.journal = bool(os.environ.get("JOURNAL_STREAM"))
        self.level = level
        self._lock = threading.Lock()

    @property
    def level(self) -> str:
        return self._level

    @level.setter
    def level(self, value: str) -> None:
        self._level = value
        self._threshold = _LEVELS.get(value, 20)

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        if _LEVELS[level] < self._threshold:
            return
        parts = [] if self.journal else [f"ts={time.strftime('%Y-%m-%dT%H:%M:%S%z')}"]
        parts += [f"level={level}", f"event={event}"]
        parts += [f"{k}={_fmt_value(v)}" for k, v in fields.items() if v is not None]
        line = " ".join(parts)
        if self.journal:
            line = f"<{_SYSLOG[level]}>{line}"
        with self._lock, contextlib.suppress(Exception):
            self.stream.write(line + "\n")
            self.stream.flush()


# ---------------------------------------------------------------------- sources


class Source(Protocol):
    def open(self) -> None: ...

    def poll(self, timeout: float) -> Sequence[Any]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


SourceFactory = Callable[[Config, int], Source]


def default_source(cfg: Config, conn_id_base: int) -> Source:
    """The capture source the config asks for (not opened yet)."""
    if cfg.backend == "ebpf":
        from .capture.ebpf import EbpfSource

        return EbpfSource(
            ports=cfg.capture_ports,
            pids=cfg.pids,
            comms=cfg.comms,
            conn_id_base=conn_id_base,
        )
    from .capture.afpacket import AfPacketSource

    return AfPacketSource(
        cfg.interface,
        cfg.capture_ports,
        ring_blocks=cfg.ring_blocks,
        block_size=cfg.block_size,
    )


def _capture_key(cfg: Config) -> tuple[Any, ...]:
    return (
        cfg.backend,
        cfg.interface,
        cfg.capture_ports,
        cfg.pids,
        cfg.comms,
        cfg.ring_blocks,
        cfg.block_size,
    )


# ---------------------------------------------------------------------- stats


@dataclass
class DaemonStats:
    batches: int = 0  # batches taken off the queue
    items: int = 0  # segments / flow events processed
    store_events: int = 0
    queue_dropped: int = 0  # packets (or flow events) lost because the queue was full
    queue_drop_batches: int = 0
    queue_gaps: int = 0  # CaptureGap(source="queue") markers put through
    kernel_gaps: int = 0
    kernel_dropped: int = 0
    capture_errors: int = 0
    sink_errors: int = 0
    store_errors: int = 0
    store_discarded: int = 0
    reloads: int = 0
    capture_restarts: int = 0
    max_queue: int = 0


# ---------------------------------------------------------------------- capture


class _CaptureThread:
    """Polls one source and puts its batches on the queue; never blocks on the queue."""

    def __init__(
        self, source: Source, q: queue.Queue[list[Any]], stats: DaemonStats, log: Log, ebpf: bool
    ) -> None:
        self.source = source
        self.q = q
        self.stats = stats
        self.log = log
        self.ebpf = ebpf
        self.stop = threading.Event()
        self.error: str | None = None
        self.last_ts = 0.0
        # lost while the queue was full, not yet reported through it
        self.loss_pending = False
        self._lost = 0
        self._lost_ts = 0.0
        self._lost_flows: dict[tuple[int, bool], FlowGap] = {}
        self._lost_structure: list[FlowEvent] = []
        self.thread = threading.Thread(target=self._run, name="sparseety-capture", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.stop.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        poll = self.source.poll
        stop = self.stop
        while not stop.is_set():
            try:
                batch = poll(POLL_TIMEOUT)
            except Exception as exc:  # the source is broken: report and end this thread
                self.error = f"{type(exc).__name__}: {exc}"
                self.stats.capture_errors += 1
                self.log("error", "capture-failed", error=self.error)
                return
            if batch or self.loss_pending:
                self.offer(list(batch))

    def offer(self, batch: list[Any]) -> None:
        """Queue ``batch`` (with any pending loss marker first) or count it as lost."""
        if self.loss_pending:
            batch = self.loss_marker() + batch
        if not batch:
            return
        try:
            self.q.put_nowait(batch)
        except queue.Full:
            self._drop(batch)
            return
        self.loss_pending = False
        self._lost = 0
        self._lost_flows = {}
        self._lost_structure = []
        n = self.q.qsize()
        if n > self.stats.max_queue:
            self.stats.max_queue = n

    def loss_marker(self) -> list[Any]:
        """What stands for everything dropped since the last batch that fit."""
        if not self.ebpf:
            return [CaptureGap(self._lost_ts, self._lost, "queue")]
        out: list[Any] = [*self._lost_structure, *self._lost_flows.values()]
        return [CaptureGap(self._lost_ts, self._lost, "queue"), *out]

    def _drop(self, batch: list[Any]) -> None:
        """The queue is full: keep only what is needed to report the loss."""
        stats = self.stats
        stats.queue_drop_batches += 1
        lost = 0
        for item in batch:
            t = type(item)
            if t is Segment:
                lost += 1
                self._lost_ts = item.ts
            elif t is CaptureGap:
                if item.source == "queue":
                    # our own marker from a previous loss, not yet delivered
                    continue
                lost += item.dropped
                self._lost_ts = max(self._lost_ts, item.ts)
            elif self.ebpf:
                self._drop_flow(item)
                if t is FlowData:
                    lost += 1
        stats.queue_dropped += lost
        self._lost += lost
        self.loss_pending = True

    def _drop_flow(self, ev: Any) -> None:
        t = type(ev)
        self._lost_ts = max(self._lost_ts, ev.ts)
        if t is FlowData or t is FlowGap:
            key = (ev.conn, ev.from_client)
            prev = self._lost_flows.get(key)
            n = len(ev.data) if t is FlowData else ev.nbytes
            if prev is not None:
                n = None if n is None or prev.nbytes is None else prev.nbytes + n
            self._lost_flows[key] = FlowGap(ev.conn, ev.ts, ev.from_client, n, "overflow")
        elif t in (ConnectionOpened, FlowEnd, ConnectionClosed):
            if t is not ConnectionOpened:
                # a gap must come before the end of its direction/connection
                self._flush_lost_flows(ev.conn)
            self._lost_structure.append(ev)
        # FlowAnomaly: dropped (counted nowhere; it carries no data)

    def _flush_lost_flows(self, conn: int) -> None:
        for key in [k for k in self._lost_flows if k[0] == conn]:
            self._lost_structure.append(self._lost_flows.pop(key))


# ---------------------------------------------------------------------- daemon


class Daemon:
    """The live recorder. ``run()`` blocks until SIGTERM/SIGINT (or ``request_stop``).

    Example::

        d = Daemon(load_config("/etc/sparseety/sparseety.toml"))
        d.add_sink(lambda events: metrics.observe(events))
        sys.exit(d.run())
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
    ) -> None:
        self.config = config
        self.overrides = dict(overrides or {})
        self.log = log if log is not None else Log(config.log_level)
        self.source_factory = source_factory or default_source
        self.notifier = notifier if notifier is not None else Notifier()
        self.install_signals = install_signals
        self.sinks: list[Sink] = []
        #: optional step between the sinks and the writer (redaction, sampling)
        self.transform: Transform | None = None
        #: called about once a second from the processing thread (gauges, metrics)
        self.on_tick: list[Callable[[Daemon], None]] = []
        #: called after every writer flush
        self.on_flush: list[Callable[[], None]] = []
        #: called once at shutdown, after the pipeline flushed, before the writer closes
        self.on_stop: list[Callable[[], None]] = []
        self.stats = DaemonStats()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._slow = _slow_from_env()
        self._capture: _CaptureThread | None = None
        self._pipeline: Pipeline | None = None
        self._writer: StoreWriter | None = None
        self._queue: queue.Queue[list[Any]] = queue.Queue(maxsize=config.queue_size)
        self.last_ts = 0.0
        self.started = threading.Event()  # set once capture is active
        self._exit_code = 0
        self._conn_base = 1
        self._clean = False

    # -- hooks -------------------------------------------------------------

    def add_sink(self, sink: Sink) -> None:
        """``sink(events)`` is called with every batch of store events the pipeline
        makes (before the transform and the writer). A sink that raises is
        logged and counted; it never stops the daemon."""
        self.sinks.append(sink)

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()

    # -- signals -----------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reload.set()
        else:
            self._stop.set()

    def _install_signals(self) -> list[tuple[int, Any]]:
        old: list[tuple[int, Any]] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            old.append((sig, signal.signal(sig, self._on_signal)))
        return old

    # -- run ---------------------------------------------------------------

    def run(self) -> int:
        """Capture until asked to stop; returns the exit code (0 after a clean stop).

        Raises ``CaptureError``/``EbpfError`` (the capture could not start) and
        ``StoreError``/SQLAlchemy errors (the database could not be opened)
        before anything is captured.
        """
        cfg = self.config
        log = self.log
        old_handlers = self._install_signals() if self.install_signals else []
        thresholds = gc.get_threshold()
        try:
            writer = StoreWriter(cfg.database, batch_size=cfg.batch_size)
            self._writer = writer
            conn_base, stream_base = writer.id_bases()
            self._pipeline = Pipeline(
                PipelineConfig(
                    conn_id_base=conn_base,
                    stream_id_base=stream_base,
                    only_ports=frozenset(cfg.capture_ports)
                    if cfg.backend == "packet"
                    else frozenset(),
                    server_ports=frozenset(cfg.capture_ports),
                    labels=dict(cfg.labels),
                    idle_timeout=cfg.idle_timeout,
                    max_decoded_bytes=cfg.max_decoded_bytes,
                    max_expansion_ratio=cfg.max_expansion_ratio,
                )
            )
            # eBPF connection ids come from the source: give it its own range.
            self._conn_base = conn_base
            source = self.source_factory(cfg, conn_base)
            source.open()
            capture = _CaptureThread(source, self._queue, self.stats, log, cfg.backend == "ebpf")
            self._capture = capture
            capture.start()
            # Many short-lived objects per packet and no cycles worth chasing.
            gc.set_threshold(100_000, 50, 100)
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
            for sig, handler in old_handlers:
                with contextlib.suppress(Exception):
                    signal.signal(sig, handler)
            if self._capture is not None:
                self._capture.join(2.0)
                with contextlib.suppress(Exception):
                    self._capture.source.close()
            if self._writer is not None and not self._clean:
                with contextlib.suppress(Exception):
                    self._writer.engine.dispose()

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
        feed = pipe.feed
        flows: list[FlowEvent] = []
        for item in batch:
            t = type(item)
            if t is Segment:
                ev = feed(item)
                if ev:
                    out += ev
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
        if flows:
            out += pipe.feed_flows(flows)
            self.last_ts = max(self.last_ts, flows[-1].ts)
        if batch:
            last = batch[-1]
            ts = getattr(last, "ts", 0.0)
            if ts > self.last_ts:
                self.last_ts = ts
        if out:
            self._emit(out)

    def _emit(self, events: list[StoreEvent]) -> None:
        self.stats.store_events += len(events)
        for sink in self.sinks:
            try:
                sink(events)
            except Exception as exc:
                self.stats.sink_errors += 1
                if self.stats.sink_errors <= 10 or self.stats.sink_errors % 1000 == 0:
                    self.log(
                        "error",
                        "sink-failed",
                        sink=getattr(sink, "__name__", repr(sink)),
                        error=f"{type(exc).__name__}: {exc}",
                        count=self.stats.sink_errors,
                    )
        if self.transform is not None:
            try:
                events = self.transform(events)
            except Exception as exc:
                self.stats.sink_errors += 1
                self.log("error", "transform-failed", error=f"{type(exc).__name__}: {exc}")
                return  # never write what the transform was meant to change
        writer = self._writer
        assert writer is not None
        try:
            writer.write_many(events)
        except StoreError as exc:
            self._store_failed(exc)

    def _store_failed(self, exc: Exception) -> None:
        writer = self._writer
        assert writer is not None
        self.stats.store_errors += 1
        self.log("error", "store-failed", error=str(exc), pending=writer.pending)
        if writer.pending > writer.batch_size * MAX_PENDING_FACTOR:
            dropped = writer.discard()
            self.stats.store_discarded += dropped
            self.log("error", "store-discarded", rows=dropped)

    def _flush(self) -> None:
        writer = self._writer
        if writer is None:
            return
        try:
            writer.flush()
        except StoreError as exc:
            self._store_failed(exc)
            return
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
        ignored = [k for k in ("backend", "database") if getattr(new, k) != getattr(old, k)]
        if ignored:
            self.log("warning", "reload-needs-restart", keys=",".join(ignored))
            new = new.with_overrides({k: getattr(old, k) for k in ignored})
        if _capture_key(new) != _capture_key(old):
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
        self.log.level = new.log_level

    def _restart_capture(self, new: Config) -> bool:
        old = self._capture
        try:
            source = self.source_factory(new, self._conn_base)
            source.open()
        except Exception as exc:
            self.log("error", "capture-restart-failed", error=str(exc), kept="previous capture")
            return False
        capture = _CaptureThread(source, self._queue, self.stats, self.log, new.backend == "ebpf")
        capture.start()
        self._capture = capture
        if old is not None:
            old.join(2.0)
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

    def _shutdown(self) -> int:
        log = self.log
        self.notifier.notify("STOPPING=1", "STATUS=stopping: flushing")
        capture = self._capture
        final: list[Any] = []
        if capture is not None:
            capture.join(5.0)
            if capture.loss_pending:
                final = capture.loss_marker()
            finish = getattr(capture.source, "finish", None)
            if callable(finish):
                with contextlib.suppress(Exception):
                    final += list(finish())
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
        out = pipe.flush(self.last_ts or time.time())
        if out:
            self._emit(out)
        self._hooks(self.on_stop)
        code = self._exit_code
        writer = self._writer
        assert writer is not None
        self._clean = True
        try:
            writer.close()
        except StoreError as exc:
            self.stats.store_errors += 1
            log("error", "store-failed", error=str(exc), pending=writer.pending)
            code = code or 1
        s = self.stats
        cap_stats: dict[str, Any] = {}
        if capture is not None:
            with contextlib.suppress(Exception):
                raw = capture.source.stats()  # type: ignore[attr-defined]
                cap_stats = dict(raw) if isinstance(raw, dict) else dataclasses.asdict(raw)
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
            streams=writer.stats.get("streams"),
            chunks=writer.stats.get("chunks"),
            exit_code=code,
        )
        return code


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


class _Periodic:
    """A background thread that calls ``work()`` every ``interval`` seconds until
    stopped, and once more when stopped (to drain what is left)."""

    def __init__(self, name: str, interval: float, work: Callable[[], None], log: Log) -> None:
        self._interval = interval
        self._work = work
        self._log = log
        self._stop = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self.thread.join(timeout)

    def _call(self) -> None:
        try:
            self._work()
        except Exception as exc:  # never fatal: log, count, go on
            self.errors += 1
            self._log("error", f"{self.thread.name}-failed", error=f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._call()
        self._call()


@dataclass
class Features:
    """What ``attach_features`` wired into a daemon (for tests and the CLI)."""

    metrics: Any = None  # sniffer.metrics.Metrics
    metrics_server: Any = None
    sampler: Any = None
    redactor: Any = None
    collector: Any = None
    workers: list[_Periodic] = dataclasses.field(default_factory=list)


def attach_features(d: Daemon) -> Features:
    """Wire the production features the config asks for into ``d``:

    * database file permissions (0600 / 0640 with a group; refuse a
      world-readable file unless allowed) — before anything opens it;
    * Prometheus metrics, served on ``metrics_listen`` (loopback unless
      ``metrics_public``), fed by every batch of store events and by the
      daemon's counters once a second;
    * the token layer: a sink keeps the chunk text *as sent* for every open
      LLM stream; a worker thread tokenizes closed streams in batches (off the
      capture path) and writes their token rows, feeding metrics and sampling;
    * sampling (which streams keep their chunk text) and redaction, in that
      order, as the transform before the writer;
    * retention: a worker deleting old streams in small batches.

    Order per batch: pipeline → sinks (metrics, token collector: they see the
    original events) → sampler → redactor → writer.
    """
    from .metrics import Metrics
    from .redact import Redactor, StreamRedactor
    from .sampling import Sampler
    from .store.files import db_path, prepare_db_file

    cfg = d.config
    log = d.log
    f = Features()
    path = db_path(cfg.database)
    if path is not None:
        prepare_db_file(
            path, group=cfg.db_group or None, allow_world_readable=cfg.allow_world_readable
        )

    if cfg.metrics:
        host, _, port = cfg.metrics_listen.rpartition(":")
        host = host.strip("[]")
        metrics = Metrics(max_models=cfg.metrics_max_models)
        f.metrics = metrics
        f.metrics_server = metrics.serve(host, int(port), allow_public=cfg.metrics_public)
        log("info", "metrics-serving", url=f.metrics_server.url)
        d.add_sink(metrics.observe)
        d.on_flush.append(lambda: metrics.mark_flush(time.time()))
        last = {"items": 0, "kernel": 0, "queue": 0}

        def gauges(daemon: Daemon) -> None:
            s = daemon.stats
            metrics.add_packets(s.items - last["items"])
            metrics.add_kernel_drops(s.kernel_dropped - last["kernel"])
            metrics.add_queue_drops(s.queue_dropped - last["queue"])
            last.update(items=s.items, kernel=s.kernel_dropped, queue=s.queue_dropped)
            pipe = daemon._pipeline
            if pipe is not None:
                metrics.set_open(pipe.open_connections, pipe.open_streams)
            metrics.set_queue_depth(daemon._queue.qsize())

        d.on_tick.append(gauges)

    sampler = None
    if cfg.sample_rate < 1.0 or cfg.boost_threshold > 0:
        sampler = Sampler(
            cfg.sample_rate,
            boost_threshold=cfg.boost_threshold or None,
            boost_window=cfg.boost_window,
            boost_period=cfg.boost_period,
        )
        f.sampler = sampler
    redactor = Redactor(cfg.redact_patterns, enabled=cfg.redact)
    f.redactor = redactor
    chain = StreamRedactor(redactor)  # with a look-behind per choice
    if not cfg.redact:
        log("warning", "redaction-off", note="prompts and outputs are stored as captured")

    if cfg.tokens:
        f.workers.append(_token_worker(d, f, sampler))

    seen_redactions: dict[str, int] = {}

    def transform(events: list[StoreEvent]) -> list[StoreEvent]:
        if sampler is not None:
            events = sampler.filter(events)
            if f.metrics is not None:
                f.metrics.set_sample_rate(sampler.effective_rate(d.last_ts or time.time()))
        events = chain.events(events)
        if f.metrics is not None and redactor.counts:
            delta = {k: v - seen_redactions.get(k, 0) for k, v in redactor.counts.items()}
            seen_redactions.update(redactor.counts)
            f.metrics.add_redactions({k: v for k, v in delta.items() if v})
        return events

    d.transform = transform

    if cfg.retention_days > 0:
        f.workers.append(_retention_worker(d))

    for w in f.workers:
        w.start()

    def stop() -> None:
        for w in f.workers:
            w.stop()
        if f.metrics_server is not None:
            f.metrics_server.close()

    d.on_stop.append(stop)
    return f


_LIBC: Any = None


def trim_heap() -> None:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``; a no-op
    elsewhere). The tokenizer's JSON parse and each token batch free tens of
    MB that glibc would otherwise keep mapped: this is what keeps the daemon's
    peak RSS down with 1,000 streams open (see ``bench/bench_live.py``)."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes
            import ctypes.util

            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


def _token_worker(d: Daemon, f: Features, sampler: Any) -> _Periodic:
    from .store.writer import make_engine
    from .token_collector import TokenCollector
    from .tokenize_pass import tokenize_inputs
    from .tokens import TokenizerRegistry, TokenizerSpec

    cfg = d.config
    registry = TokenizerRegistry(
        [TokenizerSpec(p, src) for p, src in cfg.tokenizers],
        default=cfg.default_tokenizer or None,
    )
    registry.preload()  # a bad tokenizer config fails at start, with its message
    trim_heap()  # the tokenizer's JSON parse leaves ~20 MB freed but mapped
    collector = TokenCollector(redactor=f.redactor)
    f.collector = collector
    lock = threading.Lock()

    def collect(events: list[StoreEvent]) -> None:
        with lock:
            collector.observe(events)

    d.add_sink(collect)
    engine = make_engine(cfg.database)

    def work() -> None:
        while True:
            with lock:
                inputs = collector.take(50)  # small batches: a burst of closes stays flat
            if not inputs:
                return
            _, rows = tokenize_inputs(engine, registry, inputs)
            for r in rows:
                if r.error is not None:
                    continue
                kinds: dict[str, int] = {}
                for a in r.anomalies:
                    kinds[a.kind] = kinds.get(a.kind, 0) + 1
                if f.metrics is not None:
                    f.metrics.observe_tokens(
                        r.stream_id,
                        output_tokens=r.output_count,
                        prompt_tokens=len(r.prompt_ids or ()),
                        tokens_per_chunk=[n for c in r.choices for n in c.chunk_counts],
                        anomalies=kinds,
                    )
                if sampler is not None and kinds:
                    now = d.last_ts or time.time()
                    for kind, n in kinds.items():
                        sampler.note_anomaly(kind, now, n)
            del inputs, rows
            trim_heap()

    return _Periodic("tokens", 2.0, work, d.log)


def _retention_worker(d: Daemon) -> _Periodic:
    from .store.retention import prune, vacuum
    from .store.writer import make_engine

    cfg = d.config
    engine = make_engine(cfg.database)
    age = cfg.retention_days * 86400.0

    def work() -> None:
        r = prune(engine, age, now=time.time(), batch=cfg.retention_batch, max_batches=20)
        if r.streams or r.connections:
            v = vacuum(engine)
            d.log(
                "info",
                "pruned",
                streams=r.streams,
                chunks=r.chunks,
                connections=r.connections,
                freed_pages=v.freed_pages,
                done=r.done,
            )

    return _Periodic("retention", cfg.retention_interval, work, d.log)


def run_daemon(config: Config, overrides: dict[str, Any] | None = None) -> int:
    """Build a :class:`Daemon` for ``config`` with its features and run it."""
    d = Daemon(config, overrides=overrides)
    attach_features(d)
    return d.run()
