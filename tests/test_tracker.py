"""The recording chain's one per-stream tracker (sniffer.record.tracker): a
stream's life once, one eviction rule, counted, for every observer at once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import sniffer.record.tracker as tracker_mod
from sniffer.core.events import (
    ChunkEvent,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary
from sniffer.record.chain import RecordingChain, RecordingOptions
from sniffer.record.metrics import Metrics
from sniffer.record.token_collector import TokenCollector
from sniffer.record.tracker import StreamTracker
from sniffer.store.writer import StoreWriter

ROOT = Path(__file__).resolve().parent.parent
CONCURRENT = ROOT / "pcaps" / "concurrent_4.pcap"  # 4 streams open at once
T0 = 1000.0


def opened(sid: int, ts: float = T0, dialect: str | None = "openai.chat") -> StreamOpened:
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
        request_body='{"model":"m","stream":true}',
        request=RequestSummary(model="m", stream=True),
        dialect=dialect,
        label="a",
    )


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


def test_a_streams_life_once() -> None:
    t = StreamTracker(outputs=True)  # (as metrics and OTLP ask)
    t.observe(
        [
            opened(1),
            StreamResponse(1, T0 + 0.1, 200, (), "text/event-stream", True),
            ChunkEvent(1, T0 + 0.2, 0, 0, 0, "role"),  # no output: not a first output
            ChunkEvent(1, T0 + 0.3, 1, 0, 1, "content", text="a"),
            ChunkEvent(1, T0 + 0.4, 2, 0, 2, "reasoning", reasoning="b"),
            ChunkEvent(1, T0 + 0.5, 3, 0, 0, "usage"),
        ]
    )
    e = t.get(1)
    assert e is not None and e.closed is None
    assert (e.t_request, e.label, e.model, e.dialect) == (T0, "a", "m", "openai.chat")
    assert (e.status, e.streaming) == (200, True)
    assert (e.t_first_output, e.t_last_output) == (T0 + 0.3, T0 + 0.4)
    t.chunk(1, "tool_call", T0 + 0.6)  # the per-chunk entry point
    t.chunk(1, "finish", T0 + 0.7)
    assert e.t_last_output == T0 + 0.6
    t.release()
    assert t.get(1) is e and len(t) == 1
    # closed: still there for the observers reading the batch, gone at release
    t.observe([closed(1, T0 + 1)])
    assert t.get(1) is e and e.closed is not None and t.closing == [e] and len(t) == 0
    t.release()
    assert t.get(1) is None and not t.closing and not t.open
    assert t.evicted == 0
    # without a reader of the output times, observe() does not follow them
    t2 = StreamTracker()
    t2.observe([opened(1), ChunkEvent(1, T0 + 0.3, 1, 0, 1, "content", text="a")])
    e2 = t2.get(1)
    assert e2 is not None and e2.t_first_output is None


def test_the_oldest_open_stream_is_evicted_and_counted() -> None:
    t = StreamTracker(max_open=3)
    t.collect_evicted = True
    t.observe([opened(1), opened(2), opened(3), closed(1, T0 + 1), opened(4), opened(5)])
    # 1 closed in this batch is kept for the observers: 2 and 3 made room
    assert sorted(t.open) == [1, 4, 5]
    assert t.evicted == 2 and t.take_evicted() == [2, 3] and t.take_evicted() == []
    t.release()
    assert sorted(t.open) == [4, 5]
    t.observe([ChunkEvent(2, T0 + 2, 0, 0, 1, "content", text="x"), closed(2, T0 + 3)])
    assert t.get(2) is None and not t.closing  # an evicted stream is a stranger
    t.observe([opened(6), opened(7)])
    assert sorted(t.open) == [5, 6, 7] and t.evicted == 3
    # without someone collecting them, the ids are not kept
    t2 = StreamTracker(max_open=1)
    t2.observe([opened(i) for i in range(10)])
    assert t2.evicted == 9 and t2.take_evicted() == []


def test_an_observer_on_its_own_drives_a_tracker_of_its_own() -> None:
    old = tracker_mod.MAX_OPEN_STREAMS
    tracker_mod.MAX_OPEN_STREAMS = 2
    try:
        col = TokenCollector()
    finally:
        tracker_mod.MAX_OPEN_STREAMS = old
    chunks: list[StoreEvent] = [
        ChunkEvent(s, T0 + 1, 0, 0, 1, "content", text=f"t{s}") for s in (1, 2, 3)
    ]
    col.observe([opened(1), opened(2), opened(3), opened(9, dialect=None), *chunks])
    # 3 and the non-LLM 9 made room: 1 and 2 went (the old rule refused 3)
    assert col.tracker.evicted == 2 and col.open_streams == 1
    col.observe([closed(s, T0 + 2) for s in (1, 2, 3, 9)])
    assert [s.stream_id for s in col.take()] == [3]
    assert col.open_streams == 0 and not col.tracker.open


def _events() -> list[StoreEvent]:
    from sniffer.capture.pcap import read_capture
    from sniffer.core.pipeline import Pipeline

    pipe = Pipeline()
    out: list[StoreEvent] = []
    reader = read_capture(CONCURRENT)
    for seg in reader:
        out += pipe.feed(seg)
    out += pipe.flush(reader.stats.last_ts or 0.0)
    return out


def _record(db: Path, cap: int | None, monkeypatch: pytest.MonkeyPatch) -> RecordingChain:
    with monkeypatch.context() as mp:
        if cap is not None:
            mp.setattr(tracker_mod, "MAX_OPEN_STREAMS", cap)
        m = Metrics()
        chain = RecordingChain.from_config(RecordingOptions(), metrics=m)
    chain.attach(StoreWriter(str(db)))
    events = _events()
    for i in range(0, len(events), 5):  # small batches: the redactor holds chunks between them
        chain.write(events[i : i + 5])
    chain.flush()
    while chain.tokens_ready:
        chain.tokenize(limit=1)
    return chain


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_an_eviction_forgets_the_stream_for_every_observer_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four streams open at once, two tracked: the two oldest are evicted, for
    metrics, the token collector and the redactor together, and counted; what
    the redactor held of them is still written."""
    full = _record(tmp_path / "full.db", None, monkeypatch)
    capped = _record(tmp_path / "capped.db", 2, monkeypatch)
    assert full.evicted_streams == 0 and capped.evicted_streams == 2
    for chain in (full, capped):
        assert chain.metrics is not None and chain.collector is not None
        assert len(chain.tracker) == 0 and not chain.tracker.open
        assert chain.metrics.tracked_streams == 0 and chain.collector.open_streams == 0
        sr = chain.stream_redactor
        assert sr is not None and sr.held == 0 and not sr._streams and not sr._removed
    m_full, m_capped = full.metrics, capped.metrics
    assert m_full is not None and m_capped is not None
    from prometheus_client.parser import text_string_to_metric_families

    def value(m: Metrics, name: str, **labels: str) -> float:
        return sum(
            s.value
            for f in text_string_to_metric_families(m.render().decode())
            for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    assert value(m_full, "sparseety_streams_evicted_total") == 0
    assert value(m_capped, "sparseety_streams_evicted_total") == 2
    assert value(m_full, "sparseety_streams_total", model="none") == 0
    assert value(m_capped, "sparseety_streams_total", model="none") == 2
    assert value(m_capped, "sparseety_streams_total") == value(m_full, "sparseety_streams_total")
    full.close()
    capped.close()
    # every chunk stored as without the cap; token rows for the two tracked only
    chunks = "select stream_id, seq, choice, text from chunks order by 1, 2"
    assert _rows(tmp_path / "capped.db", chunks) == _rows(tmp_path / "full.db", chunks)
    assert len(_rows(tmp_path / "full.db", chunks)) > 20
    toks = "select stream_id from stream_tokens order by 1"
    streams = [s for (s,) in _rows(tmp_path / "full.db", toks)]
    assert len(streams) == 4
    assert [s for (s,) in _rows(tmp_path / "capped.db", toks)] == streams[2:]


def test_the_sampler_keeps_its_decision_in_the_entry_and_fails_open_on_eviction() -> None:
    from sniffer.record.sampling import Sampler

    s = Sampler(0.0)  # keeps no chunk text
    s.tracker = StreamTracker(max_open=1)
    out = s.filter(
        [
            opened(1),
            opened(2),  # 1 evicted: its decision with it
            ChunkEvent(1, T0 + 1, 0, 0, 1, "content", text="one"),
            ChunkEvent(2, T0 + 1, 0, 0, 1, "content", text="two"),
        ]
    )
    texts = [e.text for e in out if isinstance(e, ChunkEvent)]
    assert texts == ["one"] and s.stats.chunks_dropped == 1
    assert s.tracker.evicted == 1 and s.open_decisions == 1
    s.filter([closed(1, T0 + 2), closed(2, T0 + 2)])
    assert s.open_decisions == 0


class _Kept:
    """A writer that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[StoreEvent] = []

    def write_many(self, events: list[StoreEvent]) -> None:
        self.events += events


def test_the_redactor_writes_what_it_held_of_an_evicted_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream that never closes must not stay in the redactor's look-behind:
    when the tracker evicts it, its held chunks are written (redacted)."""
    monkeypatch.setattr(tracker_mod, "MAX_OPEN_STREAMS", 1)
    chain = RecordingChain.from_config(RecordingOptions(tokens=False))
    kept = _Kept()
    chain.attach(kept)  # type: ignore[arg-type]
    chain.write([opened(1), ChunkEvent(1, T0 + 1, 0, 0, 1, "content", text="mail a@b.example")])
    assert chain.stream_redactor is not None and chain.stream_redactor.held == 1
    assert not [e for e in kept.events if isinstance(e, ChunkEvent)]
    chain.write([opened(2)])  # 1 evicted: never closed, its chunk written now
    assert chain.evicted_streams == 1 and chain.stream_redactor.held == 0
    texts = [e.text for e in kept.events if isinstance(e, ChunkEvent)]
    assert texts == ["mail <EMAIL>"]
