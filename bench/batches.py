"""Replay's own batches, for the benchmarks that time one step after the pipeline.

``bench_stages.py``, ``bench_metrics.py`` and ``bench_writer.py`` feed a
capture's segments through a pipeline and time what comes after it on the
batches the recording chain gets in a replay: events grouped as
``sniffer.runtime.replay`` groups them (``WRITE_EVERY``), then the pipeline's
flush at the last segment's time.
"""

from __future__ import annotations

from collections.abc import Sequence

from sniffer.core.events import Segment, StoreEvent
from sniffer.core.pipeline import Pipeline
from sniffer.runtime.replay import WRITE_EVERY


def pipeline_batches(pipe: Pipeline, segs: Sequence[Segment]) -> list[list[StoreEvent]]:
    """What ``pipe`` makes of ``segs`` (one ``feed`` per segment), in replay's
    batches, the last one ending with ``pipe.flush``."""
    feed = pipe.feed
    batches: list[list[StoreEvent]] = []
    pending: list[StoreEvent] = []
    for seg in segs:
        out = feed(seg)
        if out:
            pending += out
            if len(pending) >= WRITE_EVERY:
                batches.append(pending)
                pending = []
    pending += pipe.flush(segs[-1].ts)
    batches.append(pending)
    return batches
