"""What every live capture source provides (AF_PACKET ring, eBPF).

The daemon's capture thread opens a source, polls it until told to stop, asks
it for what it still holds (``finish``), reads its counters (``stats``) and
closes it. A source is used from one thread at a time.

A :class:`SocketSource` (eBPF) follows sockets rather than packets, and so can
hand the connections under way to the next instance at a graceful restart:
the daemon asks for them (``checkpoint_positions``), lets them go
(``forget``), takes them up again (``adopt``), and empties the ring before the
checkpoint (``drain``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Union, runtime_checkable

from sniffer.core.events import CaptureGap, FlowEvent, Segment

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from sniffer._native import SegmentBatch

__all__ = ["CaptureItem", "SocketSource", "Source", "stats_dict"]

#: What a source hands out: TCP segments (one by one, or in native batches,
#: ``sniffer._native.SegmentBatch``) and kernel-drop markers (packet capture),
#: or ordered per-connection flow events (eBPF).
CaptureItem = Union[Segment, CaptureGap, FlowEvent, "SegmentBatch"]


class Source(Protocol):
    def open(self) -> None:
        """Start capturing (raises the source's error type with a one-line reason)."""

    def poll(self, timeout: float) -> Sequence[CaptureItem]:
        """What arrived, waiting at most ``timeout`` seconds; may be empty."""
        ...

    def finish(self) -> Sequence[CaptureItem]:
        """At the end, after the last poll: what the source still holds."""
        ...

    def stats(self) -> Mapping[str, Any] | DataclassInstance:
        """Cumulative counters (a mapping or a dataclass; see :func:`stats_dict`)."""
        ...

    def describe(self) -> str:
        """One line for logs and systemd's STATUS= (what is captured, how)."""
        ...

    def close(self) -> None:
        """Release sockets, maps and rings; safe to call twice."""


@runtime_checkable
class SocketSource(Source, Protocol):
    """A source that follows sockets (eBPF): it can hand them over at a restart."""

    def checkpoint_positions(self) -> dict[int, dict[str, Any]]:
        """Per open connection id, what a restarted instance needs to pick its
        socket up (JSON-ready)."""
        ...

    def forget(self, conns: Sequence[int]) -> None:
        """Drop these connections without ending them (they were checkpointed)."""

    def adopt(self, entries: Sequence[tuple[int, dict[str, Any]]]) -> int:
        """(connection id, ``checkpoint_positions`` entry) pairs from a previous
        instance, before ``open``; returns how many were taken."""
        ...

    def drain(self) -> Sequence[CaptureItem]:
        """Capture stopped: what the ring still holds, before the checkpoint
        (``finish``, after it, ends the connections not handed over)."""
        ...


def stats_dict(source: Source) -> dict[str, Any]:
    """``source.stats()`` as a plain dict."""
    import dataclasses

    raw = source.stats()
    if isinstance(raw, Mapping):
        return dict(raw)
    return dataclasses.asdict(raw)


if TYPE_CHECKING:  # every live source conforms (checked by mypy)
    from sniffer.capture.afpacket import AfPacketSource
    from sniffer.capture.ebpf.loader import EbpfSource

    def _packet(s: AfPacketSource) -> Source:
        return s

    def _ebpf(s: EbpfSource) -> SocketSource:
        return s
