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
from sniffer.store import lite, models, views
from sniffer.store.db import EngineStore
from sniffer.store.ids import reserve
from sniffer.store.schema import REVISIONS, SchemaTooNew
from sniffer.store.writer import _UPDATES, SERVER_STATS_COLUMNS, StoreWriter, _update_stmt

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
        StoreWriter(str(path)).close()  # fresh file: created at head
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
        b = reserve(EngineStore(engine), "streams", 64)
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
        every = list_streams(EngineStore(engine))
        assert every and list_streams(store) == every
        assert any(isinstance(r["gap"], bool) for r in every)
        for kw in ({"state": "complete"}, {"limit": 2}, {"stream_ids": [2, 3]}, {"node": "x"}):
            assert list_streams(store, **kw) == list_streams(EngineStore(engine), **kw), kw
        none = list_streams(EngineStore(engine), stream_ids=[])
        assert list_streams(store, stream_ids=[]) == none == []
        for r in every:
            assert get_stream(store, r["id"]) == get_stream(EngineStore(engine), r["id"])
        assert get_stream(store, 10**9) is None
    finally:
        store.close()
        engine.dispose()


def _schema(path: Path) -> dict[str, object]:
    """What a new file holds: every sqlite_master entry with its SQL (by name: the
    migrations create the indexes in an order that varies), the rows of the tables
    the chain fills, and the pragmas a file keeps."""
    conn = sqlite3.connect(path)
    try:
        return {
            "master": sorted(
                conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
            ),
            "rows": {
                t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall())
                for t in ("alembic_version", "meta", "id_blocks", "checkpoints")
            },
            "pragmas": [
                conn.execute(f"PRAGMA {p}").fetchone()[0]
                for p in ("auto_vacuum", "journal_mode", "user_version")
            ],
        }
    finally:
        conn.close()


def test_new_file_schema_is_what_alembic_creates(tmp_path: Path) -> None:
    """A new SQLite file is created at head with the stdlib driver
    (``lite.create_schema``): the very tables, indexes, SQL text, rows and pragmas
    the migration chain leaves, so the two cannot drift."""
    from sniffer.store.files import ensure_db_file
    from sniffer.store.schema import migrate
    from sniffer.store.writer import make_engine

    alembic = tmp_path / "alembic.db"
    ensure_db_file(str(alembic))
    conn = lite.connect(str(alembic))  # the same pragmas, then the migration chain
    conn.close()
    engine = create_engine(f"sqlite:///{alembic}")
    try:
        assert migrate(engine) is None  # it did create the schema from scratch
    finally:
        engine.dispose()

    by_writer = tmp_path / "writer.db"
    StoreWriter(str(by_writer)).close()
    by_engine = tmp_path / "engine.db"
    make_engine(str(by_engine)).dispose()
    expected = _schema(alembic)
    assert expected["rows"]["alembic_version"] == [(REVISIONS[-1],)]  # type: ignore[index]
    assert expected["pragmas"] == [2, "wal", 0]
    assert _schema(by_writer) == expected
    assert _schema(by_engine) == expected
    assert (by_writer.stat().st_mode & 0o777) == 0o600


def test_new_file_created_without_alembic(tmp_path: Path) -> None:
    """Opening a new file for writing imports neither SQLAlchemy nor Alembic."""
    path = tmp_path / "new.db"
    code = (
        "import sys; from sniffer.store.writer import StoreWriter; "
        f"w = StoreWriter({str(path)!r}); w.conn_ids(); w.close(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "[]"
    store = lite.SqliteFile(str(path))
    try:
        assert store.revision() == REVISIONS[-1]
    finally:
        store.close()


def test_create_schema_leaves_other_files_to_the_migrations(tmp_path: Path) -> None:
    """A file that holds anything (here an older revision) is not touched: create_schema
    says False, and the writer migrates it through Alembic."""
    path = tmp_path / "old.db"
    StoreWriter(str(path)).close()
    conn = sqlite3.connect(path)
    for view in reversed(views.NAMES):  # 0006
        conn.execute(f"DROP VIEW {view}")
    conn.execute("DROP TABLE checkpoints")
    conn.execute("ALTER TABLE streams DROP COLUMN flags")
    for column in reversed(SERVER_STATS_COLUMNS):  # 0005
        conn.execute(f"ALTER TABLE streams DROP COLUMN {column}")
    conn.execute("UPDATE alembic_version SET version_num = '0002'")
    conn.commit()
    conn.close()
    conn = lite.connect(str(path))
    try:
        assert lite.create_schema(conn) is False
        assert lite.revision(conn) == "0002"
    finally:
        conn.close()
    StoreWriter(str(path)).close()  # migrated to head
    fresh = tmp_path / "fresh.db"
    StoreWriter(str(fresh)).close()
    assert _schema(path)["master"] == _schema(fresh)["master"]


CREATE_RACE = r"""
import os, sys, time
from sniffer.store.writer import StoreWriter
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
w = StoreWriter(sys.argv[1])
print(w.conn_ids())
w.close()
"""


def test_processes_creating_one_new_file_at_once(tmp_path: Path) -> None:
    """Several processes open the same new file at the same moment: one creates the
    schema under the write lock, the others find it at head; every writer gets its
    own id blocks and the file is the schema Alembic would create. Released
    together once every one has imported (a start time fixed in advance let a
    loaded machine start them one after the other: no race left to test)."""
    path = tmp_path / "race.db"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CREATE_RACE, str(path), str(go)],
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line != "ready\n":
                raise AssertionError(f"{line!r}: {p.communicate(timeout=60)[1]}")
        go.touch()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outs.append(out.strip())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert len(set(outs)) == 4  # distinct id blocks
    reference = tmp_path / "ref.db"
    StoreWriter(str(reference)).close()
    got, want = _schema(path), _schema(reference)
    assert (got["master"], got["pragmas"]) == (want["master"], want["pragmas"])
    assert got["rows"]["id_blocks"] == [("connections", 1 + 4 * 64), ("streams", 1)]  # type: ignore[index]


def test_wal_switch_waits_for_a_writer_sqlite_gives_up_on(tmp_path: Path) -> None:
    """A file in rollback mode whose write lock another connection holds (as while
    one of several processes makes a new file's first write): SQLite refuses the
    switch to WAL at once with "database is locked", busy timeout or not. ``connect``
    waits for the lock instead (the race test above failed on this in CI) and the
    file is in WAL once the writer is done."""
    import threading

    path = tmp_path / "held.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE t (a)")
    writer.execute("BEGIN IMMEDIATE")
    plain = sqlite3.connect(path, timeout=0.1)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        plain.execute("PRAGMA journal_mode=WAL")  # SQLite's own answer: the reason to wait
    plain.close()
    release = threading.Timer(0.3, writer.rollback)
    release.start()
    try:
        conn = lite.connect(str(path))
    finally:
        release.join()
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (5000,)
    conn.close()
    writer.close()


def test_only_a_held_lock_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write lock is waited for while another connection holds it ("database
    is locked" is ``is_locked``); any other error is raised at once, not after
    ``SQLITE_LOCK_WAIT`` seconds of retries (here: BEGIN IMMEDIATE inside a
    transaction, which SQLite refuses for good)."""
    path = str(tmp_path / "err.db")
    StoreWriter(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as held:
        other.execute("BEGIN IMMEDIATE")
    assert lite.is_locked(held.value)
    other.close()
    holder.rollback()
    holder.close()
    slept: list[float] = []
    monkeypatch.setattr(lite, "SQLITE_LOCK_WAIT", 1.0)
    monkeypatch.setattr(lite.time, "sleep", slept.append)
    conn = lite.connect(path)
    try:
        conn.execute("BEGIN")
        with pytest.raises(sqlite3.OperationalError, match="within a transaction") as refused:
            lite.begin_immediate(conn)
        assert not lite.is_locked(refused.value)
        assert slept == []  # not retried
    finally:
        conn.close()


def test_store_rows_are_what_sqlalchemy_core_reads(tmp_path: Path) -> None:
    """The queries written once on a ``Store`` (``sniffer.store.db``) read, on either
    kind of store, the rows SQLAlchemy Core reads from the models' tables (the
    oracle: column order, values, booleans as ``bool``, NULLs)."""
    from sqlalchemy import func, select

    from sniffer.store.db import EngineStore
    from sniffer.store.queries import list_errors, list_nodes
    from sniffer.store.writer import open_store

    path = tmp_path / "s.db"
    for capture in (
        "concurrent_4.pcap",
        "faults/fault_overlap_mismatch.pcap",
        "faults/cap_sse_line.pcap",
    ):
        replay(REPO / "pcaps" / capture, str(path))
    store = open_store(str(path))
    engine = create_engine(f"sqlite:///{path}")
    try:
        for db in (store, EngineStore(engine)):
            with engine.connect() as conn:
                for name in ("connections", "streams", "chunks", "errors"):
                    table = getattr(models, name)
                    key = table.c[table.primary_key.columns.keys()[0]]
                    want = [dict(r._mapping) for r in conn.execute(select(table).order_by(key))]
                    assert want and db.select(name, order_by=(key.name,)) == want, name
                errors = models.errors
                newest = conn.execute(
                    select(errors).order_by(errors.c.ts.desc(), errors.c.id.desc()).limit(3)
                )
                assert list_errors(db, 3) == [dict(r._mapping) for r in newest][::-1]
                nodes = conn.execute(
                    select(
                        models.streams.c.node, func.count(), func.min(models.streams.c.t_request)
                    ).group_by(models.streams.c.node)
                ).all()
            assert [(n["node"], n["streams"], n["first"]) for n in list_nodes(db)] == [
                tuple(r) for r in nodes
            ]
    finally:
        store.close()
        engine.dispose()


def test_checkpoints_and_id_blocks_on_either_store(tmp_path: Path) -> None:
    """Checkpoints and id blocks are written once, on a ``Store``: a SQLite file
    through the stdlib driver and an engine share one ``id_blocks`` row and one
    ``checkpoints`` table."""
    from sniffer.store.checkpoints import save_checkpoint, take_checkpoint
    from sniffer.store.ids import peek

    path = tmp_path / "s.db"
    StoreWriter(str(path)).close()
    store = lite.SqliteFile(str(path))
    engine = create_engine(f"sqlite:///{path}")
    try:
        before = peek(store, "connections")
        assert peek(EngineStore(engine), "connections") == before
        assert reserve(EngineStore(engine), "connections", 5) == range(before, before + 5)
        assert peek(store, "connections") == before + 5
        save_checkpoint(store, "n1", {"entries": [1], "written_at": 7.0})
        # another kind of store replaces it
        save_checkpoint(EngineStore(engine), "n1", {"entries": [2], "written_at": 8.0})
        assert take_checkpoint(store, "n1") == {"entries": [2], "written_at": 8.0}
        assert take_checkpoint(EngineStore(engine), "n1") is None  # taken once
        save_checkpoint(EngineStore(engine), "n2", {"entries": []})
        assert take_checkpoint(store, "n2") == {"entries": []}
    finally:
        store.close()
        engine.dispose()


def test_none_binds_null_through_the_registered_adapter(tmp_path: Path) -> None:
    """``store.lite`` registers sqlite3's adapter for None (the driver's
    fallback search per None value is most of an insert's cost): the stored
    value is NULL, as without it, and ints, floats, strings and bytes keep
    their own types."""
    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] is lite._null
    with sqlite3.connect(tmp_path / "n.db") as conn:
        conn.execute("CREATE TABLE t (a, b, c, d, e)")
        conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", [(None, 1, 2.5, "x", b"y")] * 3)
        got = conn.execute("SELECT typeof(a), typeof(b), typeof(c), typeof(d), typeof(e) FROM t")
        assert got.fetchall() == [("null", "integer", "real", "text", "blob")] * 3


def test_a_transaction_runs_its_statements_on_one_cursor(tmp_path: Path) -> None:
    """A flush's transaction reuses one cursor (no cursor per statement); what
    each statement gives is still its own (rows, rowcount), read at once."""
    path = str(tmp_path / "tx.db")
    lite.create_new_file(path)
    store = lite.SqliteFile(path)
    with store.begin() as tx:
        sql = "INSERT INTO errors (ts, stage, kind, message, node) VALUES (?, ?, ?, ?, ?)"
        first = tx.exec_driver_sql(sql, [(1.0, "s", "k", "a", "n"), (2.0, "s", "k", "b", "n")])
        assert first.rowcount == 2
        second = tx.exec_driver_sql(sql, [(3.0, "s", "k", "c", "n")])
        assert second is first and second.rowcount == 1
        assert tx.execute("SELECT message FROM errors ORDER BY id") == [("a",), ("b",), ("c",)]
        assert tx.run("UPDATE errors SET kind = 'x' WHERE ts > 1.5") == 2
        tx.executemany(sql, [(4.0, "s", "k", "d", "n")])
        assert tx.execute("SELECT count(*) FROM errors WHERE kind = 'x'") == [(2,)]
    assert store.scalar("SELECT count(*) FROM errors") == 4
    store.close()
