"""Per-stream sampling of chunk text, with a temporary boost while anomalies pile up.

Sans-IO: no clock (time is the capture time passed in), no randomness source
other than a hash of the stream's identity, so a replay of the same capture
takes the same decisions.

What sampling drops, for a stream that is not kept:

* its ``ChunkEvent``s (the per-chunk text, reasoning, tool calls, logprobs);
* ``StreamClosed.response_body`` (the text of a non-streaming reply).

A stream that is not kept is marked: its ``StreamOpened`` goes on with
``text_kept=False`` (stored as ``streams.text_kept``), so that reports leave it
out of text comparisons instead of reading it as an empty output.

What it keeps, always: ``StreamOpened`` *with* its request body (the prompt is
needed to group streams and to tokenize the prompt), ``StreamResponse``,
``StreamClosed`` with all its summary figures (chunk and event counts, text
length, TTFT, usage, state), connections and errors. Metrics should be fed
with the events BEFORE ``filter`` (the daemon does), so that unsampled streams
count in every histogram.

The decision: ``blake2b(client, server, conn, exchange, ts)`` read as a number
in [0, 1) is compared with the effective rate at the stream's request time.
Boost: when at least ``boost_threshold`` anomalies of ONE kind were noted
within ``boost_window`` seconds, the effective rate is 1.0 until
``boost_period`` seconds after the anomaly that crossed the threshold (later
crossings extend it), then falls back to ``rate``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

from sniffer.core.events import ChunkEvent, StoreEvent, StreamClosed, StreamOpened
from sniffer.record.tracker import StreamTracker

#: Cap on distinct anomaly kinds tracked for the boost.
MAX_KINDS = 64


def stream_fraction(stream: StreamOpened) -> float:
    """A number in [0, 1) fixed by the stream's identity (not Python's salted hash)."""
    import hashlib  # here: OpenSSL's start is ~2.5 ms of run's start-up, for sampled runs only

    (client_host, client_port) = stream.client
    (server_host, server_port) = stream.server
    key = (
        f"{client_host}|{client_port}|{server_host}|{server_port}|"
        f"{stream.conn}|{stream.exchange}|{stream.ts!r}"
    ).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return float(struct.unpack(">Q", digest)[0] >> 11) / float(1 << 53)


@dataclass
class SamplerStats:
    """Counters of the :class:`Sampler`'s decisions."""

    streams_kept: int = 0
    streams_dropped: int = 0
    chunks_dropped: int = 0
    boosts: int = 0  # times the boost was (re)armed


class Sampler:
    """Decides per stream whether chunk text is stored.

    ``rate`` is the base fraction of streams kept (0 to 1). With
    ``boost_threshold`` set, ``note_anomaly`` can raise it to 1.0 for
    ``boost_period`` seconds. Example::

        sampler = Sampler(0.1, boost_threshold=5, boost_window=60, boost_period=600)
        stored = sampler.filter(events)
    """

    def __init__(
        self,
        rate: float,
        *,
        boost_threshold: int | None = None,
        boost_window: float = 60.0,
        boost_period: float = 600.0,
    ) -> None:
        if not 0.0 <= rate <= 1.0 or rate != rate:
            raise ValueError(f"sample rate must be between 0 and 1, got {rate}")
        if boost_threshold is not None and boost_threshold < 1:
            raise ValueError(f"boost threshold must be at least 1, got {boost_threshold}")
        if boost_window <= 0 or boost_period <= 0:
            raise ValueError("boost window and period must be positive")
        self.rate = rate
        self.boost_threshold = boost_threshold
        self.boost_window = boost_window
        self.boost_period = boost_period
        self.boosted_until = float("-inf")
        self._recent: dict[str, deque[float]] = {}
        #: open streams, each with its decision (``Tracked.sampled``): the
        #: tracker's eviction bounds them (an evicted stream's chunks are kept:
        #: failing open loses no data). Its own until the recording chain
        #: shares its tracker (:meth:`track_with`).
        self.tracker = StreamTracker()
        self._drives = True
        self.stats = SamplerStats()

    # ------------------------------------------------------------------ rate

    def effective_rate(self, ts: float) -> float:
        """The rate in force at capture time ``ts`` (1.0 while boosted)."""
        return 1.0 if ts < self.boosted_until else self.rate

    def boosted(self, ts: float) -> bool:
        return ts < self.boosted_until

    def note_anomaly(self, kind: str, ts: float, count: int = 1) -> bool:
        """Record ``count`` anomalies of ``kind`` at capture time ``ts``.

        Returns True when this note (re)armed the boost. Notes arriving out of
        time order are counted at their own time.
        """
        threshold = self.boost_threshold
        if threshold is None or count <= 0:
            return False
        recent = self._recent.get(kind)
        if recent is None:
            if len(self._recent) >= MAX_KINDS:
                kind = "other"
                recent = self._recent.get(kind)
            if recent is None:
                recent = self._recent[kind] = deque(maxlen=threshold)
        for _ in range(min(count, threshold)):
            recent.append(ts)
        if len(recent) == threshold and max(recent) - min(recent) <= self.boost_window:
            until = max(recent) + self.boost_period
            if until > self.boosted_until:
                self.boosted_until = until
                self.stats.boosts += 1
                return True
        return False

    # ------------------------------------------------------------- decisions

    def keep(self, stream: StreamOpened) -> bool:
        """Whether this stream's chunk text is stored (pure, given the boost state)."""
        rate = self.effective_rate(stream.ts)
        if rate >= 1.0:
            return True
        if rate <= 0.0:
            return False
        return stream_fraction(stream) < rate

    def track_with(self, tracker: StreamTracker) -> None:
        """Read ``tracker`` (the recording chain's, which drives it) instead of
        a tracker of its own. Call before the first event."""
        self.tracker = tracker
        self._drives = False

    def filter(self, events: Iterable[StoreEvent]) -> list[StoreEvent]:
        """The events to store: chunks of unsampled streams removed, their
        ``response_body`` blanked; everything else passes unchanged."""
        tracker = self.tracker
        if self._drives:
            events = events if isinstance(events, list) else list(events)
            tracker.observe(events)
        entries = tracker.open
        out: list[StoreEvent] = []
        stats = self.stats
        for ev in events:
            if type(ev) is ChunkEvent:
                e = entries.get(ev.stream)
                if e is None or e.sampled:
                    out.append(ev)
                else:
                    stats.chunks_dropped += 1
                continue
            if type(ev) is StreamOpened:
                kept = self.keep(ev)
                if kept:
                    stats.streams_kept += 1
                else:
                    stats.streams_dropped += 1
                e = entries.get(ev.stream)
                if e is not None:  # (None: opened and evicted in one batch)
                    e.sampled = kept
                if not kept:
                    ev = replace(ev, text_kept=False)
            elif type(ev) is StreamClosed:
                e = entries.get(ev.stream)
                if e is not None and not e.sampled and ev.response_body is not None:
                    ev = replace(ev, response_body=None)
            out.append(ev)
        if self._drives:
            tracker.release()
        return out

    @property
    def open_decisions(self) -> int:
        """Open streams whose decision is kept."""
        return len(self.tracker)


__all__ = ["MAX_KINDS", "Sampler", "SamplerStats", "stream_fraction"]
