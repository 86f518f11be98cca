"""Retention: age parsing, batched prune, incremental vacuum."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event

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
from sniffer.store.db import EngineStore, Store
from sniffer.store.retention import (
    ensure_incremental_vacuum,
    parse_age,
    prune,
    vacuum,
)
from sniffer.store.writer import StoreWriter, open_store

DAY = 86400.0
NOW = 1_700_000_000.0
CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 8000)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 7 * DAY),
        ("12h", 12 * 3600.0),
        ("30m", 1800.0),
        ("90s", 90.0),
        ("2w", 14 * DAY),
        ("1.5h", 5400.0),
        (" 7D ", 7 * DAY),
        ("0s", 0.0),
    ],
)
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("bad", ["", "7", "d", "7 days", "-1d", "7y", "1e3s", "7d12h", "1..5h"])
def test_parse_age_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid age") as info:
        parse_age(bad)
    assert repr(bad) in str(info.value)


def _stream(sid: int, conn: int, t: float, nchunks: int, nerrors: int) -> list[StoreEvent]:
    out: list[StoreEvent] = [
        StreamOpened(
            stream=sid,
            conn=conn,
            exchange=sid,
            ts=t,
            client=CLIENT,
            server=SERVER,
            method="POST",
            path="/v1/chat/completions",
            request_headers=(),
            request_body='{"model":"m"}',
            request=RequestSummary(model="m"),
            dialect="openai.chat",
        ),
        StreamResponse(sid, t + 0.01, 200, (), "text/event-stream", True),
    ]
    for i in range(nchunks):
        out.append(ChunkEvent(sid, t + 0.02 + i * 0.01, i, 0, i + 1, "content", text=f"t{i}"))
    for i in range(nerrors):
        out.append(PipelineError(t + 0.5, "dialect", "invalid", f"bad {i}", conn, sid))
    out.append(
        StreamClosed(
            stream=sid,
            ts=t + 1,
            state=StreamState.COMPLETE,
            reason="complete",
            done_seen=True,
            gap=False,
            t_first_content=t + 0.02,
            t_last_chunk=t + 0.5,
            chunk_count=nchunks,
            event_count=nchunks,
            text_len=2 * nchunks,
            finish_reasons=((0, "stop"),),
            usage=None,
            response_body=None,
        )
    )
    return out


def populate(writer: StoreWriter) -> dict[str, int]:
    """Old data (10 days ago): connections 1–3 with streams 1–7, connection 4
    with no streams, and 2 stream-less errors. New data (1 hour ago):
    connection 5 (opened 10 days ago, long-lived keep-alive) with an old
    stream 8 and a new stream 9, connection 6 with streams 10–11, one new
    stream-less error. Returns the rows expected to survive a 7d prune."""
    old = NOW - 10 * DAY
    new = NOW - 3600
    evs: list[StoreEvent] = []
    for c in (1, 2, 3, 4):
        evs.append(ConnectionOpened(c, old, CLIENT, SERVER, syn_seen=True))
        evs.append(ConnectionClosed(c, old + 100, "fin"))
    sid = 1
    for c, n in ((1, 3), (2, 2), (3, 2)):
        for _ in range(n):
            evs += _stream(sid, c, old + sid, nchunks=5, nerrors=1)
            sid += 1
    evs.append(PipelineError(old, "http", "desync", "x", 4, None))
    evs.append(PipelineError(old, "capture", "kernel-drop", "3 packets lost"))
    evs.append(ConnectionOpened(5, old, CLIENT, SERVER, syn_seen=True))
    evs += _stream(8, 5, old + 50, nchunks=4, nerrors=0)
    evs += _stream(9, 5, new, nchunks=7, nerrors=2)
    evs.append(ConnectionOpened(6, new, CLIENT, SERVER, syn_seen=True))
    evs += _stream(10, 6, new + 1, nchunks=3, nerrors=0)
    evs += _stream(11, 6, new + 2, nchunks=6, nerrors=1)
    evs.append(PipelineError(new, "capture", "kernel-drop", "1 packet lost"))
    writer.write_many(evs)
    writer.flush()
    return {"streams": 3, "chunks": 7 + 3 + 6, "errors": 2 + 1 + 1, "connections": 2}


def counts(store: Store) -> dict[str, int]:
    return {
        t: int(store.scalar(f"SELECT count(*) FROM {t}") or 0)
        for t in ("streams", "chunks", "errors", "connections")
    }


def ids(store: Store, sql: str) -> list[int]:
    return sorted(row[0] for row in store.query(sql))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Store]:
    store = open_store(str(tmp_path / "r.db"))
    yield store
    store.close()


def test_prune_deletes_old_rows_and_keeps_new_ones_exactly(db: Store) -> None:
    with StoreWriter("", engine=db.engine) as w:
        expected = populate(w)
    before = counts(db)
    assert before == {"streams": 11, "chunks": 55, "errors": 13, "connections": 6}
    result = prune(db, parse_age("7d"), now=NOW)
    assert counts(db) == expected
    assert result.streams == 8
    assert result.chunks == 55 - expected["chunks"]
    assert result.errors == 13 - expected["errors"]
    assert result.connections == 4
    assert result.done
    assert ids(db, "SELECT id FROM streams") == [9, 10, 11]
    assert ids(db, "SELECT id FROM connections") == [5, 6]
    assert set(ids(db, "SELECT stream_id FROM chunks")) == {9, 10, 11}
    left = db.query("SELECT stream_id, ts FROM errors")
    assert all(sid in (9, 11, None) for sid, _ in left)
    assert all(ts >= NOW - 7 * DAY for _, ts in left)
    # Idempotent: nothing more to delete.
    again = prune(db, parse_age("7d"), now=NOW)
    assert again.rows == 0 and again.done
    assert counts(db) == expected


def test_prune_tiny_batches_same_result_and_bounded_calls(db: Store) -> None:
    with StoreWriter("", engine=db.engine) as w:
        expected = populate(w)
    # Count the transactions: each batch must be its own.
    commits = 0
    transaction = db.transaction

    def counted() -> Any:
        nonlocal commits
        commits += 1
        return transaction()

    db.transaction = counted  # type: ignore[method-assign]
    total_batches = 0
    total_streams = 0
    calls = 0
    while True:
        r = prune(db, 7 * DAY, now=NOW, batch=2, max_batches=1)
        calls += 1
        assert r.batches <= 1
        assert r.streams <= 2
        total_batches += r.batches
        total_streams += r.streams
        if r.done:
            break
        assert calls < 50
    db.transaction = transaction  # type: ignore[method-assign]
    assert counts(db) == expected
    assert total_streams == 8
    # 8 old streams in batches of 2 → 4 full batches + an empty probe; 4 orphan
    # connections → 2 batches + probe; 2 stream-less errors → 1 batch + probe.
    assert total_batches == 4 + 2 + 1
    assert commits >= total_batches


def test_prune_zero_age_deletes_everything_before_now(db: Store) -> None:
    with StoreWriter("", engine=db.engine) as w:
        populate(w)
    prune(db, 0, now=NOW + 10)
    assert counts(db) == {"streams": 0, "chunks": 0, "errors": 0, "connections": 0}


def test_prune_rejects_negative_age(db: Store) -> None:
    with pytest.raises(ValueError):
        prune(db, -1, now=NOW)


def _sqlite_engine_with_incremental_hook(path: Path) -> Engine:
    """The change suggested for make_engine: auto_vacuum before anything else."""
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: object, _record: object) -> None:
        cur = dbapi_conn.cursor()  # type: ignore[attr-defined]
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    return engine


def test_connect_hook_makes_new_database_incremental(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    engine = _sqlite_engine_with_incremental_hook(path)
    with StoreWriter("", engine=engine) as w:
        populate(w)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_vacuum_returns_space_after_prune(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    pre = EngineStore(create_engine(f"sqlite:///{path}"), owned=True)
    assert ensure_incremental_vacuum(pre)  # empty file: takes effect at once
    pre.close()
    store = open_store(str(path))
    big = "x" * 2000
    evs: list[StoreEvent] = []
    for sid in range(1, 201):
        evs += _stream(sid, sid, NOW - 30 * DAY + sid, nchunks=0, nerrors=0)
        evs += [
            ChunkEvent(sid, NOW - 30 * DAY + sid, i, 0, i + 1, "content", text=big)
            for i in range(5)
        ]
    with StoreWriter("", engine=store.engine) as w:
        w.write_many(evs)
    store.query("PRAGMA wal_checkpoint(TRUNCATE)")
    size_full = os.path.getsize(path)
    r = prune(store, 7 * DAY, now=NOW, batch=64)
    assert r.streams == 200 and r.chunks == 1000
    v = vacuum(store)
    assert v.incremental
    assert v.freed_pages > 0
    assert v.freed_bytes >= 1000 * 2000 * 0.9
    store.query("PRAGMA wal_checkpoint(TRUNCATE)")
    assert os.path.getsize(path) < size_full - 1_500_000
    # A second vacuum finds nothing to free.
    assert vacuum(store).freed_pages == 0
    store.close()


def test_new_databases_are_incremental(db: Store) -> None:
    # A new file is opened with auto_vacuum=INCREMENTAL before WAL.
    with StoreWriter("", engine=db.engine) as w:
        populate(w)
    prune(db, 0, now=NOW + 10)
    assert vacuum(db).incremental


def test_vacuum_on_non_incremental_database_is_a_noop(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").close()  # made before this version
    db = open_store(str(path))
    with StoreWriter("", engine=db.engine) as w:
        populate(w)
    prune(db, 0, now=NOW + 10)
    v = vacuum(db)
    assert not v.incremental and v.freed_pages == 0
    # Existing database: only converted with convert=True (full VACUUM).
    assert ensure_incremental_vacuum(db) is False
    assert ensure_incremental_vacuum(db, convert=True) is True
    assert vacuum(db).incremental
    db.close()
