"""Sampling: deterministic per-stream decisions, proportions, boost by capture time."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import (
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary
from sniffer.record.sampling import Sampler, stream_fraction

T0 = 1_700_000_000.0
SERVER = ("127.0.0.1", 8000)


def opened(i: int, ts: float | None = None, stream: int | None = None) -> StreamOpened:
    return StreamOpened(
        stream=i if stream is None else stream,
        conn=1 + i // 3,
        exchange=i % 3,
        ts=T0 + i * 0.37 if ts is None else ts,
        client=("127.0.0.1", 30000 + i % 30000),
        server=SERVER,
        method="POST",
        path="/v1/chat/completions",
        request_headers=(),
        request_body=f'{{"model":"m","messages":[{{"role":"user","content":"q{i}"}}]}}',
        request=RequestSummary(model="m"),
        dialect="openai.chat",
    )


IDENTITIES = [opened(i) for i in range(10_000)]


def closed(stream: int, ts: float, body: str | None = None) -> StreamClosed:
    return StreamClosed(
        stream=stream,
        ts=ts,
        state=StreamState.COMPLETE,
        reason="complete",
        done_seen=True,
        gap=False,
        t_first_content=ts - 0.5,
        t_last_chunk=ts - 0.1,
        chunk_count=2,
        event_count=3,
        text_len=10,
        finish_reasons=((0, "stop"),),
        usage=None,
        response_body=body,
    )


def stream_events(o: StreamOpened, nchunks: int = 3, body: str | None = None) -> list[StoreEvent]:
    evs: list[StoreEvent] = [o, StreamResponse(o.stream, o.ts + 0.01, 200, (), "x", True)]
    evs += [
        ChunkEvent(o.stream, o.ts + 0.1 * (k + 1), k, 0, k + 1, "content", text=f"c{k}")
        for k in range(nchunks)
    ]
    evs.append(closed(o.stream, o.ts + 1, body))
    return evs


def test_fraction_is_deterministic_and_in_range() -> None:
    fr = [stream_fraction(o) for o in IDENTITIES[:500]]
    assert fr == [stream_fraction(o) for o in IDENTITIES[:500]]
    assert all(0.0 <= f < 1.0 for f in fr)
    assert len(set(fr)) == 500
    # The identity, not the stream id or body, decides.
    o = IDENTITIES[7]
    from dataclasses import replace

    assert stream_fraction(replace(o, stream=999_999, request_body="other")) == stream_fraction(o)
    assert stream_fraction(replace(o, ts=o.ts + 1e-6)) != stream_fraction(o)
    assert stream_fraction(replace(o, exchange=o.exchange + 1)) != stream_fraction(o)


def test_decisions_do_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from tests.test_sampling import IDENTITIES\n"
        "from sniffer.record.sampling import Sampler\n"
        "s = Sampler(0.5)\n"
        "print(''.join('1' if s.keep(o) else '0' for o in IDENTITIES[:300]))\n"
    )
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        outs.add(res.stdout.strip())
    here = "".join("1" if Sampler(0.5).keep(o) else "0" for o in IDENTITIES[:300])
    assert outs == {here}


@pytest.mark.parametrize(
    ("rate", "low", "high"),
    [(0.0, 0, 0), (1.0, 10_000, 10_000), (0.5, 4_700, 5_300), (0.1, 850, 1_150)],
)
def test_proportions_over_fixed_identities(rate: float, low: int, high: int) -> None:
    # Fixed identities and a fixed hash: the count is a constant; the bounds are
    # ±6 binomial standard deviations, so any reasonable hash passes.
    kept = sum(Sampler(rate).keep(o) for o in IDENTITIES)
    assert low <= kept <= high


def test_lower_rates_keep_a_subset() -> None:
    low = {o.stream for o in IDENTITIES if Sampler(0.1).keep(o)}
    high = {o.stream for o in IDENTITIES if Sampler(0.5).keep(o)}
    assert low < high


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_rejects_bad_rate(bad: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        Sampler(bad)


def test_filter_drops_chunks_and_body_of_unsampled_streams_only() -> None:
    s = Sampler(0.5)
    kept_o = next(o for o in IDENTITIES if s.keep(o))
    drop_o = next(o for o in IDENTITIES if not s.keep(o))
    evs: list[StoreEvent] = [ConnectionOpened(1, T0, ("127.0.0.1", 1), SERVER, True)]
    evs += stream_events(kept_o, body="kept body")
    evs += stream_events(drop_o, body="secret reply")
    evs.append(PipelineError(T0, "dialect", "invalid", "x", 1, drop_o.stream))
    evs.append(ConnectionClosed(1, T0 + 5, "fin"))
    out = s.filter(evs)
    chunks = [e for e in out if isinstance(e, ChunkEvent)]
    assert {c.stream for c in chunks} == {kept_o.stream}
    assert len(chunks) == 3
    # Everything that is not a chunk passes, in order; the request body is kept.
    assert [type(e) for e in out if not isinstance(e, ChunkEvent)] == [
        type(e) for e in evs if not isinstance(e, ChunkEvent)
    ]
    # The unsampled stream's opening is marked (stored as streams.text_kept),
    # the kept one passes unchanged.
    assert replace(drop_o, text_kept=False) in out and drop_o not in out
    assert kept_o in out
    closes = {e.stream: e for e in out if isinstance(e, StreamClosed)}
    assert closes[kept_o.stream].response_body == "kept body"
    assert closes[drop_o.stream].response_body is None
    assert closes[drop_o.stream].chunk_count == 2  # summary intact
    assert s.stats.streams_kept == 1 and s.stats.streams_dropped == 1
    assert s.stats.chunks_dropped == 3
    assert s.open_decisions == 0


def test_filter_across_batches_and_unknown_streams() -> None:
    s = Sampler(0.0)
    o = IDENTITIES[0]
    evs = stream_events(o)
    first = s.filter(evs[:3])  # opened, response, 1 chunk
    assert [type(e) for e in first] == [StreamOpened, StreamResponse]
    rest = s.filter(evs[3:])
    assert [type(e) for e in rest] == [StreamClosed]
    # A chunk of a stream opened before the sampler existed is kept (fail open).
    orphan = ChunkEvent(424242, T0, 0, 0, 1, "content", text="x")
    assert s.filter([orphan]) == [orphan]


def test_boost_rises_and_falls_back_by_capture_time() -> None:
    s = Sampler(0.0, boost_threshold=3, boost_window=60.0, boost_period=600.0)
    assert s.effective_rate(T0) == 0.0
    assert not s.note_anomaly("straddle", T0)
    assert not s.note_anomaly("straddle", T0 + 30)
    assert s.effective_rate(T0 + 31) == 0.0
    # Two of another kind do not add up with this one.
    assert not s.note_anomaly("gap", T0 + 31)
    assert not s.note_anomaly("gap", T0 + 32)
    assert s.note_anomaly("straddle", T0 + 50)  # 3 within 60 s
    assert s.effective_rate(T0 + 50) == 1.0
    assert s.effective_rate(T0 + 649) == 1.0
    assert s.effective_rate(T0 + 650) == 0.0
    # While boosted every stream is kept, after it none (rate 0).
    assert s.keep(opened(5, ts=T0 + 100))
    assert not s.keep(opened(5, ts=T0 + 700))
    assert s.stats.boosts == 1


def test_boost_needs_the_anomalies_within_the_window() -> None:
    s = Sampler(0.2, boost_threshold=3, boost_window=10.0, boost_period=100.0)
    for k in range(10):
        assert not s.note_anomaly("unk", T0 + 11 * k)  # never 3 within 10 s
    assert s.effective_rate(T0 + 200) == 0.2
    assert s.note_anomaly("unk", T0 + 300, count=3)  # a burst of 3 at once
    assert s.effective_rate(T0 + 399) == 1.0
    assert s.effective_rate(T0 + 400) == 0.2


def test_boost_is_extended_by_later_crossings() -> None:
    s = Sampler(0.0, boost_threshold=2, boost_window=5.0, boost_period=100.0)
    s.note_anomaly("gap", T0)
    s.note_anomaly("gap", T0 + 1)
    assert s.boosted_until == T0 + 101
    s.note_anomaly("gap", T0 + 90)
    assert s.boosted_until == T0 + 101  # 89 s apart: no new crossing
    s.note_anomaly("gap", T0 + 92)
    assert s.boosted_until == T0 + 192
    assert s.effective_rate(T0 + 150) == 1.0


def test_no_boost_without_threshold() -> None:
    s = Sampler(0.3)
    for k in range(100):
        assert not s.note_anomaly("gap", T0 + k * 0.01)
    assert s.effective_rate(T0 + 1) == 0.3


@settings(max_examples=100, deadline=None)
@given(
    rate=st.sampled_from([0.0, 0.3, 1.0]),
    n=st.integers(1, 12),
    cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_filter_is_independent_of_batch_boundaries(rate: float, n: int, cuts: list[int]) -> None:
    evs: list[StoreEvent] = []
    for i in range(n):
        evs += stream_events(opened(i * 97), nchunks=i % 4, body="b" if i % 2 else None)
    whole = Sampler(rate).filter(evs)
    s = Sampler(rate)
    pieces: list[StoreEvent] = []
    bounds = sorted({min(c, len(evs)) for c in cuts})
    start = 0
    for b in [*bounds, len(evs)]:
        pieces += s.filter(evs[start:b])
        start = b
    assert pieces == whole

    def unmarked(e: StoreEvent) -> StoreEvent:
        return replace(e, text_kept=True) if isinstance(e, StreamOpened) else e

    assert [unmarked(e) for e in whole if not isinstance(e, ChunkEvent | StreamClosed)] == [
        e for e in evs if not isinstance(e, ChunkEvent | StreamClosed)
    ]


def test_sampled_out_streams_are_stored_with_the_flag(tmp_path: Path) -> None:
    from sqlalchemy import select

    from sniffer.store.models import chunks, streams
    from sniffer.store.writer import StoreWriter

    s = Sampler(0.5)
    kept_o = next(o for o in IDENTITIES if s.keep(o))
    drop_o = next(o for o in IDENTITIES if not s.keep(o))
    w = StoreWriter(str(tmp_path / "s.db"))
    w.write_many(s.filter(stream_events(kept_o) + stream_events(drop_o)))
    w.close()
    w = StoreWriter(str(tmp_path / "s.db"))
    with w.engine.connect() as conn:
        rows = dict(conn.execute(select(streams.c.id, streams.c.text_kept)).tuples().all())
        stored = {r[0] for r in conn.execute(select(chunks.c.stream_id))}
    w.close()
    assert rows == {kept_o.stream: True, drop_o.stream: False}
    assert stored == {kept_o.stream}


def test_a_database_from_before_the_flag_still_opens(tmp_path: Path) -> None:
    """The migration chain adds streams.text_kept to a v0.1 table without it (NULL = kept)."""
    import sqlite3

    from sqlalchemy import inspect, select

    from sniffer.store.models import streams
    from sniffer.store.writer import make_engine

    path = tmp_path / "old.db"
    schema = (Path(__file__).parent / "data" / "v01_schema.sqlite.sql").read_text()
    raw = sqlite3.connect(path)
    raw.executescript(schema.replace("\ttext_kept BOOLEAN, \n", ""))  # as early v0.1 made it
    assert "text_kept" not in {r[1] for r in raw.execute("PRAGMA table_info(streams)")}
    raw.execute("INSERT INTO streams (id, label, state) VALUES (1, 'old', 'complete')")
    raw.commit()
    raw.close()
    engine = make_engine(str(path))
    assert "text_kept" in {c["name"] for c in inspect(engine).get_columns("streams")}
    with engine.connect() as conn:
        assert conn.execute(select(streams.c.id, streams.c.text_kept)).all() == [(1, None)]
    make_engine(str(path)).dispose()  # opening again: nothing to add, no error
    engine.dispose()
