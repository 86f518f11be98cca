"""What every live capture source provides (AF_PACKET ring, eBPF).

The daemon's capture thread opens a source, polls it until told to stop, asks
it for what it still holds (``finish``), reads its counters (``stats``) and
closes it. A source is used from one thread at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Union

from sniffer.core.events import CaptureGap, FlowEvent, Segment

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from sniffer._native import SegmentBatch

__all__ = ["CaptureItem", "Source", "stats_dict"]

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

    def _ebpf(s: EbpfSource) -> Source:
        return s
