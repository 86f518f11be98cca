"""Replay a capture file through the pipeline into the store.

This is the batch driver: it owns the loop (the sans-IO stages own none), the
store writer and the progress callback. The daemon is the live driver of the
same pipeline.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .capture.pcap import CaptureFileError, read_capture
from .events import ChunkEvent, PipelineError, StoreEvent, StreamClosed
from .pipeline import Pipeline, PipelineConfig
from .store.writer import StoreWriter

Progress = Callable[[int, int], None]  # (bytes done, bytes total)

#: Capture-time interval between idle-connection sweeps during a replay.
EXPIRE_EVERY = 10.0


@dataclass
class ReplayResult:
    path: str
    packets: int = 0
    segments: int = 0
    chunk_events: int = 0
    streams: int = 0
    errors: int = 0
    seconds: float = 0.0
    states: dict[str, int] = field(default_factory=dict)
    capture_error: str | None = None
    first_stream_id: int = 0

    @property
    def packets_per_second(self) -> float:
        return self.packets / self.seconds if self.seconds > 0 else 0.0

    @property
    def events_per_second(self) -> float:
        return self.chunk_events / self.seconds if self.seconds > 0 else 0.0


def replay(
    path: str | os.PathLike[str],
    db: str,
    *,
    ports: frozenset[int] = frozenset(),
    labels: Mapping[int, str] | None = None,
    progress: Progress | None = None,
    batch_size: int = 20_000,
    writer: StoreWriter | None = None,
) -> ReplayResult:
    """Replay one capture file into the database ``db`` (a path or SQLAlchemy URL).

    A truncated or corrupt file does not raise: everything before the bad
    offset is processed and stored, and ``capture_error`` says where it broke.
    A file that is not a capture at all raises ``CaptureFileError``.
    """
    started = time.perf_counter()
    reader = read_capture(path)
    # The pipeline makes many short-lived objects and no cycles worth chasing
    # per packet: collect the young generation far less often while replaying.
    thresholds = gc.get_threshold()
    gc.set_threshold(200_000, 50, 100)
    own_writer = writer is None
    w = writer if writer is not None else StoreWriter(db, batch_size=batch_size)
    result = ReplayResult(path=str(path))
    try:
        conn_base, stream_base = w.id_bases()
        result.first_stream_id = stream_base
        pipe = Pipeline(
            PipelineConfig(
                conn_id_base=conn_base,
                stream_id_base=stream_base,
                only_ports=ports,
                labels=labels,
            )
        )
        write_many = w.write_many
        feed = pipe.feed
        next_expire = 0.0
        ts = 0.0
        for count, seg in enumerate(reader, 1):
            out = feed(seg)
            if out:
                write_many(out)
                _tally(result, out)
            if count & 0x3FFF == 0:
                ts = seg.ts
                if ts >= next_expire:
                    if next_expire:
                        expired = pipe.expire(ts)
                        write_many(expired)
                        _tally(result, expired)
                    next_expire = ts + EXPIRE_EVERY
                if progress is not None:
                    progress(reader.offset, reader.size)
        last = reader.stats.last_ts or ts
        out = pipe.flush(last)
        if reader.error is not None:
            result.capture_error = str(reader.error)
            out.append(PipelineError(last, "capture", "file", str(reader.error)))
        write_many(out)
        _tally(result, out)
        if progress is not None:
            progress(reader.size, reader.size)
        w.flush()
    finally:
        gc.set_threshold(*thresholds)
        if own_writer:
            w.close()
    result.packets = reader.stats.packets
    result.segments = pipe.segments
    result.seconds = time.perf_counter() - started
    return result


def _tally(result: ReplayResult, events: list[StoreEvent]) -> None:
    for ev in events:
        t = type(ev)
        if t is ChunkEvent:
            result.chunk_events += 1
        elif t is StreamClosed:
            assert isinstance(ev, StreamClosed)
            result.streams += 1
            result.states[ev.state.value] = result.states.get(ev.state.value, 0) + 1
        elif t is PipelineError:
            result.errors += 1


__all__ = ["CaptureFileError", "ReplayResult", "replay"]
