"""The SQLite file store without SQLAlchemy (``sniffer.store.lite``) says and does
exactly what the SQLAlchemy path does: same columns, same statement text, same
rows, same id blocks, same schema checks."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert

from sniffer.runtime.replay import replay
from sniffer.store import lite, models
from sniffer.store.ids import reserve
from sniffer.store.schema import REVISIONS, SchemaTooNew
from sniffer.store.writer import _UPDATES, StoreWriter, _update_stmt

REPO = Path(__file__).resolve().parent.parent


def test_table_columns_match_the_models() -> None:
    for name, cols in lite.TABLE_COLUMNS.items():
        assert cols == tuple(c.name for c in getattr(models, name).columns), name
    assert lite.PLAIN_HTTP == models.PLAIN_HTTP


def test_statement_text_is_what_sqlalchemy_compiles_for_sqlite() -> None:
    dialect = create_engine("sqlite://").dialect
    for name, cols in lite.TABLE_COLUMNS.items():
        columns = cols[1:] if name in ("chunks", "errors") else cols
        compiled = insert(getattr(models, name)).compile(
            dialect=dialect, column_keys=columns, for_executemany=True
        )
        assert lite.insert_sql(name, columns) == str(compiled)
        assert tuple(compiled.positiontup) == columns
    for spec in _UPDATES.values():
        compiled = _update_stmt(spec).compile(dialect=dialect, for_executemany=True)
        sql, order = lite.update_sql(spec)
        assert sql == str(compiled)
        assert order == tuple(compiled.positiontup)


def _dump(path: Path) -> list[str]:
    """The database as SQL, sorted: the migrations create the indexes in an order
    that varies from one run to the next (their content does not)."""
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("capture", ["concurrent_4.pcap", "keepalive_3.pcap", "n2.pcap"])
def test_writer_through_the_stdlib_driver_leaves_the_same_database(
    capture: str, tmp_path: Path
) -> None:
    """A SQLite file at head is written through the stdlib driver; a writer given an
    engine (the SQLAlchemy path) leaves the very same database behind. Tiny
    batches: closes and responses become UPDATEs of rows of earlier batches."""
    paths = [tmp_path / "lite.db", tmp_path / "sa.db"]
    for i, path in enumerate(paths):
        StoreWriter(str(path)).close()  # fresh file: migrated (SQLAlchemy + Alembic)
        engine = create_engine(f"sqlite:///{path}") if i else None
        w = StoreWriter(str(path), engine=engine, node="n", batch_size=3)
        assert (w._lite is not None) == (i == 0)
        assert w.id_bases() == (1, 1)
        replay(REPO / "pcaps" / capture, str(path), writer=w)
        w.close()
        if engine is not None:
            engine.dispose()
        assert w.stats["updates"] > 0
    assert _dump(paths[0]) == _dump(paths[1])


def test_reserve_through_the_stdlib_driver_matches_sqlalchemy(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    StoreWriter(str(path)).close()
    store = lite.SqliteFile(str(path))
    engine = create_engine(f"sqlite:///{path}")
    try:
        a = reserve(store, "streams", 64)
        b = reserve(engine, "streams", 64)
        c = reserve(store, "streams", 8)
        assert (a.stop, b.start, b.stop, c.start) == (a.start + 64, a.stop, a.stop + 64, b.stop)
        with pytest.raises(ValueError):
            reserve(store, "bogus", 1)
    finally:
        store.close()
        engine.dispose()


def test_schema_checks_still_apply(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    StoreWriter(str(path)).close()
    store = lite.SqliteFile(str(path))
    assert store.revision() == REVISIONS[-1]
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNew):
        StoreWriter(str(path))


def test_writer_start_imports_no_sqlalchemy(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    StoreWriter(str(path)).close()
    code = (
        "import sys; from sniffer.store.writer import StoreWriter; "
        f"w = StoreWriter({str(path)!r}); w.conn_ids(); w.close(); "
        "print(any(m.startswith('sqlalchemy') for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "False"


def test_queries_read_the_same_rows_without_sqlalchemy(tmp_path: Path) -> None:
    """``list_streams`` / ``get_stream`` on a SQLite file opened with the stdlib driver
    give exactly what they give through an engine (booleans as ``bool``, same order)."""
    from sniffer.store.queries import get_stream, list_streams
    from sniffer.store.writer import open_store

    path = tmp_path / "s.db"
    for capture in ("concurrent_4.pcap", "n2.pcap", "error_midstream.pcap"):
        replay(REPO / "pcaps" / capture, str(path))
    store = open_store(str(path))
    assert isinstance(store, lite.SqliteFile)
    engine = create_engine(f"sqlite:///{path}")
    try:
        every = list_streams(engine)
        assert every and list_streams(store) == every
        assert any(isinstance(r["gap"], bool) for r in every)
        for kw in ({"state": "complete"}, {"limit": 2}, {"stream_ids": [2, 3]}, {"node": "x"}):
            assert list_streams(store, **kw) == list_streams(engine, **kw), kw  # type: ignore[arg-type]
        assert list_streams(store, stream_ids=[]) == list_streams(engine, stream_ids=[]) == []
        for r in every:
            assert get_stream(store, r["id"]) == get_stream(engine, r["id"])
        assert get_stream(store, 10**9) is None
    finally:
        store.close()
        engine.dispose()
