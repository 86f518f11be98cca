"""The capture thread: polls one source and hands its batches to the processing thread.

It never blocks on the queue: when the queue is full the batch is dropped, its
packets are counted (``queue_dropped``) and a
:class:`~sniffer.capture.loss.LossAccount` keeps what is needed to report the
loss ahead of the next batch that fits. What its polls return is gathered for
``handover`` seconds (``[capture] handover``) or ``HANDOVER_POLLS`` polls with
packets, whichever comes first, and queued as one batch. Memory is held flat
by ``queue_size`` × (one batch: at most ``HANDOVER_POLLS`` polls).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from sniffer.capture.loss import LossAccount
from sniffer.capture.source import CaptureItem, Source
from sniffer.core.native import NATIVE
from sniffer.runtime.config import Config
from sniffer.runtime.log import Log
from sniffer.runtime.stats import DaemonStats

__all__ = [
    "HANDOVER_POLLS",
    "POLL_TIMEOUT",
    "CaptureThread",
    "SourceFactory",
    "capture_key",
    "default_source",
]

#: How long one capture poll waits for packets (seconds): it bounds only how
#: soon the thread sees a stop or retries a loss marker, since a poll returns
#: as soon as a ring block is handed over. Each wake-up costs ~40-90 µs of CPU
#: here (a timed poll and the GIL). A little over one block timeout
#: (BLOCK_TIMEOUT_MS): once per block under a steady load (a shorter wait
#: woke the thread once more per block), about three times a second idle.
POLL_TIMEOUT = 0.3

#: How long the kernel fills a ring block before handing it over part-full
#: (TPACKET_V3 ``tp_retire_blk_tov``, ms). A block is also handed over when
#: full, so this bounds the batches of a slow capture only. Each hand-over
#: wakes the processing thread, which then touches the state of every stream
#: the block holds packets of: after a pause that state, and the interpreter's
#: own, has gone cold (measured offline: the live benchmark's traffic in
#: batches of 500 packets with 0.1 s pauses cost 1.03-1.10 s of CPU per
#: 100,000 events, in batches of 1,250 with 0.25 s pauses 0.94-0.96 s), and a
#: stream with a packet in the block has its exchange's state read and
#: written once per block, whatever the events it holds. At 5,000 packets/s
#: 20 ms made blocks of ~100 packets, 100 ms ~500, 250 ms ~1,250 (the live
#: benchmark: 14.1-15.8 µs of CPU per chunk event with 100 ms, 13.0-13.6
#: with 250 ms, three alternated runs each). Capture times come from the
#: kernel, so nothing stored changes; rows reach the writer at most this much
#: later (it flushes every ``flush_interval``, 1 s by default, anyway), and a
#: stop waits one block timeout for the ring's last packets
#: (``AfPacketSource.finish``).
BLOCK_TIMEOUT_MS = 250

#: A batch is handed over once this many polls returned packets, whatever its
#: age: a busy capture (blocks full before their timeout) is then handed over
#: every few blocks, so the hand-over adds little latency and the batches
#: little memory there; the gathering time (``[capture] handover``) only sets
#: the batches of a slow one.
HANDOVER_POLLS = 8

#: Makes the (unopened) source for a configuration; the second argument hands
#: out the connection ids the source may assign (eBPF numbers connections
#: itself): the store's id blocks.
SourceFactory = Callable[[Config, Callable[[], int]], Source]


def default_source(cfg: Config, conn_ids: Callable[[], int]) -> Source:
    """The capture source the config asks for (not opened yet)."""
    if cfg.backend == "ebpf":
        from sniffer.capture.ebpf import EbpfSource

        return EbpfSource(
            ports=cfg.capture_ports,
            pids=cfg.pids,
            comms=cfg.comms,
            conn_ids=conn_ids,
            idle_timeout=cfg.idle_timeout,
        )
    from sniffer.capture.afpacket import AfPacketSource

    return AfPacketSource(
        cfg.interface,
        cfg.capture_ports,
        ring_blocks=cfg.ring_blocks,
        block_size=cfg.block_size,
        block_timeout_ms=BLOCK_TIMEOUT_MS,
        batches=NATIVE is not None,  # the pipeline's reassembler is native then too
    )


def capture_key(cfg: Config) -> tuple[Any, ...]:
    """The settings whose change needs a new capture source."""
    return (
        cfg.backend,
        cfg.interface,
        cfg.capture_ports,
        cfg.pids,
        cfg.comms,
        cfg.ring_blocks,
        cfg.block_size,
    )


class CaptureThread:
    """Polls one source and puts its batches on the queue; never blocks on the queue."""

    def __init__(
        self,
        source: Source,
        q: queue.Queue[list[CaptureItem]],
        stats: DaemonStats,
        log: Log,
        ebpf: bool,
        handover: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        #: seconds a batch gathers polls before it is queued (0: every poll's
        #: packets at once); read at each poll, so a reload may change it
        self.handover = handover
        self.clock = clock
        self.q = q
        self.stats = stats
        self.log = log
        #: lost while the queue was full, not yet reported through it
        self.loss = LossAccount(ebpf)
        self.stop = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="sparseety-capture", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.stop.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        """Poll until stopped; what the polls return is gathered (see the
        module's docstring) and queued. What is gathered when the thread ends
        (a stop, a broken source) is queued then, ahead of anything the stop
        reads from the source after (``Daemon._shutdown``, ``_tail``)."""
        poll = self.source.poll
        stop = self.stop
        loss = self.loss
        monotonic = self.clock
        gathered: list[CaptureItem] = []
        polls = 0
        due = 0.0  # when what is gathered is handed over
        try:
            while not stop.is_set():
                wait = POLL_TIMEOUT if not polls else min(POLL_TIMEOUT, due - monotonic())
                try:
                    batch = poll(max(0.0, wait))
                except Exception as exc:  # the source is broken: report and end this thread
                    self.error = f"{type(exc).__name__}: {exc}"
                    self.stats.capture_errors += 1
                    self.log("error", "capture-failed", error=self.error)
                    return
                if batch:
                    if not polls:
                        due = monotonic() + self.handover
                    gathered += batch
                    polls += 1
                if (polls and (polls >= HANDOVER_POLLS or monotonic() >= due)) or (
                    loss.pending and not polls
                ):
                    # (a loss marker waiting for room goes with the next batch,
                    # or alone when nothing is gathered: as soon as there is room)
                    self.offer(gathered)
                    gathered, polls = [], 0
        finally:
            if gathered:
                self.offer(gathered)

    def offer(self, batch: list[CaptureItem]) -> None:
        """Queue ``batch`` (with any pending loss marker first) or count it as lost."""
        loss = self.loss
        out = loss.marker() + batch if loss.pending else batch
        if not out:
            return
        try:
            self.q.put_nowait(out)
        except queue.Full:
            # only the new items: the marker already stands for the earlier loss
            self.stats.queue_drop_batches += 1
            self.stats.queue_dropped += loss.drop(batch)
            return
        loss.delivered()
        n = self.q.qsize()
        if n > self.stats.max_queue:
            self.stats.max_queue = n
