"""The live daemon's counters (logged at stop, fed to metrics once a second)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DaemonStats"]


@dataclass
class DaemonStats:
    """The live daemon's counters (logged, exported as metrics)."""

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
    store_rejected: int = 0  # rows the database refused (each stored as an error row)
    reloads: int = 0
    capture_restarts: int = 0
    max_queue: int = 0
