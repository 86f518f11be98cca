"""The recording chain's native passes over a batch (``sniffer._native``'s
``TrackOutputs``, ``MetricsChunks``, ``CollectChunks``, ``ChunkRows``,
``RedactChunks``) give
exactly what their Python passes (the reference, the pure core's) give,
whatever the batch split: on every bundled capture's events and on a batch
of odd events (a chunk of a stream never opened, a stream recovered mid-way,
a capture clock that goes backwards, several choices, reasoning and tool-call
chunks, chunks with finish reasons, logprobs, usage or raw items, a subclass
of ``ChunkEvent``, a stream over the collector's cap)."""

from __future__ import annotations

import glob
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import sniffer.record.tracker as tracker_mod
from sniffer import native_core
from sniffer.capture.pcap import read_capture
from sniffer.core.events import (
    ChunkEvent,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.core.pipeline import Pipeline, PipelineConfig
from sniffer.llm.values import RequestSummary, Usage
from sniffer.record.metrics import Metrics
from sniffer.record.redact import Redactor, StreamRedactor
from sniffer.record.token_collector import TokenCollector
from sniffer.record.tracker import StreamTracker
from sniffer.store.writer import StoreWriter, native_chunk_rows

NATIVE = native_core()[0]
pytestmark = pytest.mark.skipif(
    NATIVE is None, reason="the native core is not built (or SPARSEETY_PURE is set)"
)

PCAPS = sorted(
    glob.glob(
        os.path.join(os.path.dirname(__file__), "..", "pcaps", "**", "*.pcap"), recursive=True
    )
)
#: batch sizes: one event per batch, small, a live-sized run, each capture whole
SPLITS = (1, 7, 64, 10**9)
T0 = 1_700_000_000.0


def pipeline_events(path: str) -> list[StoreEvent]:
    reader = read_capture(path)
    pipe = Pipeline(PipelineConfig())
    out: list[StoreEvent] = []
    last = 0.0
    for seg in reader:
        out += pipe.feed(seg)
        last = seg.ts
    return out + pipe.flush(reader.stats.last_ts or last)


@dataclass(frozen=True, slots=True)
class OddChunk(ChunkEvent):
    """A subclass: the passes hand it to Python, which skips it (``type(ev) is``)."""


def opened(sid: int, ts: float, *, label: str = "a", model: str | None = "m") -> StreamOpened:
    return StreamOpened(
        stream=sid,
        conn=sid,
        exchange=0,
        ts=ts,
        client=("127.0.0.1", 40000 + sid),
        server=("127.0.0.1", 8000),
        method="POST",
        path="/v1/chat/completions",
        request_headers=(),
        request_body='{"model":"m","stream":true,"messages":[]}',
        request=RequestSummary(model=model, stream=True),
        dialect="openai.chat",
        label=label,
    )


def response(sid: int, ts: float, status: int | None = 200, streaming: bool = True) -> Any:
    return StreamResponse(sid, ts, status, (), "text/event-stream", streaming)


def closed(sid: int, ts: float) -> StreamClosed:
    return StreamClosed(
        stream=sid,
        ts=ts,
        state=StreamState.COMPLETE,
        reason="complete",
        done_seen=True,
        gap=False,
        t_first_content=None,
        t_last_chunk=None,
        chunk_count=0,
        event_count=0,
        text_len=0,
        finish_reasons=(),
        usage=None,
        response_body=None,
    )


def odd_events() -> list[StoreEvent]:
    """Streams 1-5 interleaved, with what the native passes hand to Python."""
    ev: list[StoreEvent] = [opened(1, T0), opened(2, T0, model="n"), opened(4, T0)]
    ev += [response(1, T0 + 0.1), response(2, T0 + 0.1), response(4, T0 + 0.1, streaming=False)]
    ev.append(opened(3, T0 + 0.2, label="b"))
    ev.append(response(3, T0 + 0.2, status=None))  # recovered mid-way
    seq = dict.fromkeys(range(1, 6), 0)

    def chunk(sid: int, dt: float, kind: str = "content", text: str = "x", **kw: Any) -> ChunkEvent:
        seq[sid] += 1
        cls = kw.pop("cls", ChunkEvent)
        return cls(sid, T0 + dt, seq[sid], kw.pop("choice", 0), 1, kind, text, **kw)

    ev.append(chunk(1, 0.2, "role", ""))
    for k in range(60):
        t = 0.3 + k * 0.01
        ev.append(chunk(1, t, choice=k % 2, text=f"t{k} "))
        ev.append(chunk(2, t + (0.05 if k == 30 else 0.0), "reasoning", "", reasoning="r"))
        ev.append(chunk(3, t - (0.5 if k == 20 else 0.0)))  # the clock goes back once
        ev.append(chunk(4, t))  # not streaming
        ev.append(chunk(5, t))  # never opened
        if k % 9 == 0:
            ev.append(chunk(2, t, "tool_call", "", tool_calls='[{"index":0}]'))
            ev.append(chunk(1, t, text="", finish_reason="stop", choice=1))
            ev.append(chunk(3, t, logprobs='{"content":[]}'))
            ev.append(chunk(1, t, text="odd", cls=OddChunk))
            ev.append(chunk(3, t, "usage", "", usage=Usage.parse({"prompt_tokens": 3})))
            ev.append(chunk(4, t, "other", "", raw='{"x":1}'))
        if k == 40:
            ev.append(PipelineError(T0 + t, "sse", "bad", "an item"))
            ev.append(closed(2, T0 + t))
    ev += [closed(1, T0 + 2), closed(3, T0 + 2), closed(4, T0 + 2), closed(5, T0 + 2)]
    return ev


CAPTURES = [pipeline_events(p) for p in PCAPS]
BATCHES = [*CAPTURES, odd_events()]


def batches(size: int) -> Iterator[list[StoreEvent]]:
    """Every event list in batches of ``size`` (each capture apart: its ids start at 1)."""
    for events in BATCHES:
        for j in range(0, len(events), size):
            yield events[j : j + size]


def masked(text: bytes) -> str:
    out = re.sub(r"^(\S+_created(?:\{.*\})?) \S+$", r"\1 T", text.decode(), flags=re.M)
    return re.sub(r"^(sparseety_last_flush_age_seconds) \S+$", r"\1 X", out, flags=re.M)


def test_the_events_take_every_branch() -> None:
    """(the odd batch and the captures have what the passes hand to Python)"""
    assert len(PCAPS) >= 20
    kinds = {ev.kind for events in BATCHES for ev in events if type(ev) is ChunkEvent}
    assert {"content", "role", "reasoning", "tool_call", "usage"} <= kinds
    assert any(type(ev) is OddChunk for ev in odd_events())
    assert sum(type(ev) is ChunkEvent for events in CAPTURES for ev in events) > 2000


def tracker_state(native: bool, size: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    with monkeypatch.context() as m:
        if not native:
            m.setattr(tracker_mod, "_native_outputs", lambda: None)
        seen: list[Any] = []
        for events in BATCHES:
            t = StreamTracker(outputs=True)
            for j in range(0, len(events), size):
                t.observe(events[j : j + size])
                seen += [
                    (e.stream, e.t_first_output, e.t_last_output, e.status, e.closed is not None)
                    for e in t.open.values()
                ]
                t.release()
        return seen


@pytest.mark.parametrize("size", SPLITS)
def test_tracker_output_times(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tracker_mod._native_outputs() is not None
    ref = tracker_state(False, size, monkeypatch)
    assert any(first is not None for _, first, *_ in ref)
    assert tracker_state(True, size, monkeypatch) == ref


def metrics_text(native: bool, size: int) -> str:
    m = Metrics()
    if not native:
        m._native = None
    else:
        assert m._native is not None
    for batch in batches(size):
        m.observe(batch)
    return masked(m.render())


@pytest.mark.parametrize("size", SPLITS)
def test_metrics_exposition(size: int) -> None:
    """Line for line, the cadence classes, gaps and TTFTs of every stream."""
    ref = metrics_text(False, size)
    assert 'sparseety_chunk_events_total{label="none",model="none"}' in ref
    assert re.search(r'sparseety_inter_chunk_seconds_count\{label="b",model="m"\} [1-9]', ref)
    assert metrics_text(True, size) == ref
    assert metrics_text(True, 64) == ref  # and across splits


def collected(native: bool, size: int) -> tuple[list[Any], list[list[StoreEvent]], int]:
    c = TokenCollector(max_chunks=40)  # stream 1 of the odd batch is capped
    if not native:
        c._native = None
    else:
        assert c._native is not None
    out: list[list[StoreEvent]] = []
    taken: list[Any] = []
    for batch in batches(size):
        batch = list(batch)
        c.observe(batch)
        out.append(batch)  # (a capped stream's close is flagged in it)
        taken += [replace(inp, redact=None) for inp in c.take()]
    return taken, out, c.capped_streams


@pytest.mark.parametrize("size", SPLITS)
def test_token_collector_inputs(size: int) -> None:
    ref = collected(False, size)
    assert ref[2] >= 1 and len(ref[0]) > 20
    assert any(len(inp.chunks) > 16 for inp in ref[0])  # full blocks packed
    assert any(c.finish_reason for inp in ref[0] for c in inp.chunks)
    assert collected(True, size) == ref


def dump(rows: Callable[[StoreWriter, list[StoreEvent]], None], size: int, tmp: Path) -> str:
    w = StoreWriter(str(tmp / "w.db"), batch_size=5)  # a flush inside the runs
    for n, batch in enumerate(batches(size)):
        rows(w, batch)
        if n % 3 == 0:
            assert w.pending < 5
    w.close()
    with sqlite3.connect(tmp / "w.db") as db:
        return "\n".join(db.iterdump())


@pytest.mark.parametrize("size", SPLITS)
def test_writer_chunk_rows(size: int, tmp_path: Path) -> None:
    assert native_chunk_rows() is not None
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ref = dump(StoreWriter._write_many, size, tmp_path / "a")
    assert ref.count('INSERT INTO "chunks"') > 2000
    assert dump(StoreWriter.write_many, size, tmp_path / "b") == ref


def test_writer_native_runs_stop_where_python_takes_over() -> None:
    """The run stops before an event ``write`` takes and after the row that
    fills the batch; the rows are the reference's tuples."""
    rows_of = native_chunk_rows()
    assert rows_of is not None
    events = odd_events()
    first = next(i for i, ev in enumerate(events) if type(ev) is ChunkEvent)
    rows: list[tuple[Any, ...]] = []
    assert rows_of(events, 0, rows, 0, 100) == (0, 0)  # a StreamOpened
    stop, pending = rows_of(events, first, rows, 3, 100)
    assert stop > first + 3 and pending == 3 + stop - first and len(rows) == stop - first
    stopped = events[stop]
    assert type(stopped) is ChunkEvent and stopped.tool_calls is not None  # write() takes it
    ref: list[tuple[Any, ...]] = []
    w = StoreWriter.__new__(StoreWriter)
    w._chunk_rows, w._pending, w.batch_size = ref, 0, 10**9
    w._write_many(events[first:stop])
    assert rows == ref
    assert all(a is b for r, q in zip(rows, ref, strict=True) for a, b in zip(r, q, strict=True))
    rows.clear()
    assert rows_of(events, first, rows, 98, 100) == (first + 2, 100)  # full: the writer flushes


def test_native_passes_call_python_only_for_what_they_do_not_do() -> None:
    """Per stream of plain chunks, the native passes call back into Python
    only for what they leave to it: the tracker's opens (not its responses
    and closes), the metrics' opens, responses, first output chunk and
    closes, the collector's opens and closes (not the chunk that fills a
    block: packed natively); none of them for a connection's open or close.
    What the calls leave is the Python pass's (the captures' tests above)."""
    from sniffer.core.events import ConnectionClosed, ConnectionOpened

    seen: list[str] = []

    def spy(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            seen.append(name)
            return fn(*args)

        return call

    tracker = StreamTracker(outputs=True)
    tracker._opens = {StreamOpened: spy("tracker.opened", tracker.opened)}
    metrics = Metrics()
    metrics.track_with(tracker)
    metrics._handlers = {t: spy(f"metrics.{t.__name__}", h) for t, h in metrics._handlers.items()}
    metrics_chunk = metrics._chunk
    metrics._chunk = spy("metrics.chunk", metrics_chunk)  # type: ignore[method-assign]
    collector = TokenCollector()
    collector.track_with(tracker)
    collector._chunk = spy("collector.chunk", collector._chunk)  # type: ignore[method-assign]
    handlers = collector._handlers
    collector._handlers = lambda events: {  # type: ignore[method-assign]
        t: spy(f"collector.{t.__name__}", h) for t, h in handlers(events).items()
    }
    client, server = ("127.0.0.1", 40001), ("127.0.0.1", 8000)
    events: list[StoreEvent] = [
        ConnectionOpened(1, T0, client, server, True),
        opened(1, T0),
        response(1, T0 + 0.1),
    ]
    n = 40  # two full blocks and a tail
    events += [
        ChunkEvent(1, T0 + 0.2 + k / 100, k + 1, 0, 1, "content", f"t{k} ") for k in range(n)
    ]
    events += [closed(1, T0 + 1), ConnectionClosed(1, T0 + 1, "fin")]
    tracker.observe(events)
    metrics.observe(events)
    collector.observe(events)
    tracker.release()
    assert seen == [
        "tracker.opened",
        "metrics.StreamOpened",
        "metrics.StreamResponse",
        "metrics.chunk",  # the first output chunk: its TTFT and its choice
        "metrics.StreamClosed",
        "collector.StreamOpened",
        "collector.StreamClosed",
    ]
    (inp,) = collector.take()
    assert [c.seq for c in inp.chunks] == list(range(1, n + 1))
    assert "".join(c.text for c in inp.chunks) == "".join(f"t{k} " for k in range(n))
    smp = masked(metrics.render())
    assert 'sparseety_chunk_events_total{label="a",model="m"} 40.0' in smp
    assert 'sparseety_streams_total{label="a",model="m",state="complete"} 1.0' in smp


def redacted(native: bool, size: int) -> list[Any]:
    """What the redaction step gives out, batch by batch, and what it counted
    and handed over (each capture apart)."""
    got: list[Any] = []
    for events in BATCHES:
        red = StreamRedactor(Redactor())
        red.track_redactions = True
        if not native:
            red._native_events = None
        else:
            assert red._native_events is not None
        for j in range(0, len(events), size):
            got.append(red.events(events[j : j + size]))
            got.append(red.take_redactions())
        got += [red.flush(), dict(red.counts), red.held]
    return got


@pytest.mark.parametrize("size", SPLITS)
def test_redactor_events(size: int) -> None:
    """The same events out (rewritten the same, in the same order), the same
    counts and handed-over redactions."""
    ref = redacted(False, size)
    assert sum(isinstance(e, StreamClosed) for b in ref if isinstance(b, list) for e in b) > 20
    assert redacted(True, size) == ref
