"""The views for reading the database by hand (``sniffer/store/views.py``,
migration 0006): on SQLite and PostgreSQL, every stream and chunk row appears
with the figures its raw columns give, and a clock-backwards stream has no
timings."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from sniffer.runtime.replay import replay
from sniffer.store.writer import make_engine

ROOT = Path(__file__).resolve().parent.parent
PCAPS = ROOT / "pcaps"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'views.db'}"
    else:
        yield request.getfixturevalue("fresh_pg_url")


def _rows(url: str, sql: str) -> list[dict[str, Any]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(sql)).mappings()]
    finally:
        engine.dispose()


def _instant(value: Any) -> float:
    """Seconds since the epoch of a view's time: ISO text (SQLite) or a timestamp."""
    if isinstance(value, str):
        assert value.endswith("Z"), value
        value = dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=dt.UTC)
    assert isinstance(value, dt.datetime) and value.utcoffset() == dt.timedelta(0)
    return value.timestamp()


def test_views_give_every_row_with_readable_figures(db_url: str) -> None:
    for name in ("n2.pcap", "keepalive_3.pcap", "faults/fault_clock_backwards.pcap"):
        replay(PCAPS / name, db_url)
    engine = make_engine(db_url)
    with engine.begin() as conn:  # a label of its own per stream: the join must find it
        conn.execute(text("UPDATE streams SET label = 'L' || CAST(id AS VARCHAR(20))"))
    engine.dispose()
    streams = {r["id"]: r for r in _rows(db_url, "SELECT * FROM streams")}
    readable = {r["id"]: r for r in _rows(db_url, "SELECT * FROM streams_readable")}
    assert readable.keys() == streams.keys() and len(streams) >= 5
    clock = 0
    for sid, s in streams.items():
        v = readable[sid]
        for col in ("label", "model", "node", "state", "path", "chunk_count", "flags"):
            assert v[col] == s[col], (sid, col)
        assert abs(_instant(v["requested_at"]) - s["t_request"]) < 0.0011
        if s["flags"] and "clock-backwards" in s["flags"]:
            clock += 1
            assert v["ttft_ms"] is None and v["duration_ms"] is None
            continue
        if s["t_first_content"] is not None:
            ttft = (s["t_first_content"] - s["t_request"]) * 1000
            assert v["ttft_ms"] == pytest.approx(ttft, abs=0.0006)
            assert abs(_instant(v["first_content_at"]) - s["t_first_content"]) < 0.0011
        else:
            assert v["ttft_ms"] is None and v["first_content_at"] is None
        if s["t_last_chunk"] is not None:
            dur = (s["t_last_chunk"] - s["t_request"]) * 1000
            assert v["duration_ms"] == pytest.approx(dur, abs=0.0006)
    assert clock == 1

    chunks = _rows(db_url, "SELECT id, stream_id, ts, text FROM chunks ORDER BY id")
    joined = _rows(db_url, "SELECT * FROM chunks_readable ORDER BY id")
    assert [(c["id"], c["text"]) for c in chunks] == [(c["id"], c["text"]) for c in joined]
    for c, v in zip(chunks, joined, strict=True):
        s = streams[c["stream_id"]]
        assert (v["label"], v["model"], v["node"]) == (s["label"], s["model"], s["node"])
        assert abs(_instant(v["captured_at"]) - c["ts"]) < 0.0011
        if v["ms_after_request"] is not None:
            after = (c["ts"] - s["t_request"]) * 1000
            assert v["ms_after_request"] == pytest.approx(after, abs=6e-4)
    assert {v["label"] for v in joined} == {streams[c["stream_id"]]["label"] for c in chunks}
    assert all(v["label"] for v in joined)


def test_views_go_with_a_downgrade(tmp_path: Path) -> None:
    """0006's downgrade drops the views and leaves the tables at 0005."""
    from alembic import command

    from sniffer.store.schema import alembic_config

    url = f"sqlite:///{tmp_path / 'down.db'}"
    replay(PCAPS / "n2.pcap", url)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0005")
            names = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'view'")
            assert names.fetchall() == []
            assert conn.exec_driver_sql("SELECT value FROM meta").scalar() == "5"
            command.upgrade(cfg, "head")
            assert conn.exec_driver_sql("SELECT count(*) FROM streams_readable").scalar() == 1
    finally:
        engine.dispose()
