"""Loss accounting for a capture whose consumer fell behind.

The capture thread never blocks: when the queue to the processing thread is
full, it drops the batch. What it drops must still surface as a gap on every
stream it touched, and no stream with a gap may be reported complete. A
:class:`LossAccount` keeps just enough of the dropped batches to say so, and
hands out the *marker* that goes through ahead of the next batch that fits:

* packet capture (segments): one ``CaptureGap(ts, dropped, "queue")`` — the
  pipeline marks every open connection as possibly gapped;
* eBPF capture (flow events, already per connection): the same
  ``CaptureGap``, then the dropped connection opens and ends (structure is
  kept), with the dropped data of each connection direction turned into one
  ``FlowGap(reason="overflow")`` carrying the exact byte count, placed before
  the end of its direction or connection.

Pure: no thread, queue or clock; the times are the capture times of the
dropped items.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sniffer.capture.source import CaptureItem
from sniffer.core.events import (
    CaptureGap,
    ConnectionClosed,
    ConnectionOpened,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
    Segment,
)
from sniffer.core.native import SEGMENT_BATCH

__all__ = ["LossAccount"]


class LossAccount:
    """What was dropped since the last batch that was delivered."""

    def __init__(self, ebpf: bool = False) -> None:
        self.ebpf = ebpf
        #: something was dropped and not yet reported
        self.pending = False
        #: packets (segments, kernel-reported drops, eBPF data records) dropped so far
        self.lost = 0
        self._ts = 0.0
        self._flows: dict[tuple[int, bool], FlowGap] = {}
        self._structure: list[FlowEvent] = []

    def drop(self, batch: Sequence[CaptureItem]) -> int:
        """Account for a dropped ``batch`` (the source's items, without the
        marker); returns the packets it lost."""
        lost = 0
        for item in batch:
            t = type(item)
            if t is Segment:
                assert isinstance(item, Segment)
                lost += 1
                self._ts = item.ts
            elif t is SEGMENT_BATCH:  # a native batch of segments
                segs: Any = item
                lost += len(segs)
                if len(segs):
                    self._ts = max(self._ts, segs.ts(-1))
            elif t is CaptureGap:
                assert isinstance(item, CaptureGap)
                if item.source == "queue":
                    continue  # our own marker from a previous loss, not yet delivered
                lost += item.dropped
                self._ts = max(self._ts, item.ts)
            elif self.ebpf:
                self._drop_flow(item)  # type: ignore[arg-type]
                if t is FlowData:
                    lost += 1
        self.lost += lost
        self.pending = True
        return lost

    def marker(self) -> list[CaptureItem]:
        """What stands for everything dropped since the last delivery."""
        gap = CaptureGap(self._ts, self.lost, "queue")
        if not self.ebpf:
            return [gap]
        return [gap, *self._structure, *self._flows.values()]

    def delivered(self) -> None:
        """The marker went through: start counting afresh."""
        self.pending = False
        self.lost = 0
        self._flows = {}
        self._structure = []

    def _drop_flow(self, ev: FlowEvent) -> None:
        self._ts = max(self._ts, ev.ts)
        if isinstance(ev, FlowData | FlowGap):
            key = (ev.conn, ev.from_client)
            prev = self._flows.get(key)
            n = len(ev.data) if isinstance(ev, FlowData) else ev.nbytes
            if prev is not None:
                n = None if n is None or prev.nbytes is None else prev.nbytes + n
            self._flows[key] = FlowGap(ev.conn, ev.ts, ev.from_client, n, "overflow")
        elif isinstance(ev, ConnectionOpened | FlowEnd | ConnectionClosed):
            if not isinstance(ev, ConnectionOpened):
                # a gap must come before the end of its direction/connection
                for key in [k for k in self._flows if k[0] == ev.conn]:
                    self._structure.append(self._flows.pop(key))
            self._structure.append(ev)
        # FlowAnomaly: dropped (counted nowhere; it carries no data)
