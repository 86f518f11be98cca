"""Many sidecars, one database: nodes, collision-free ids, versioned migrations.

Runs on SQLite and on a real PostgreSQL server started by the ``pg_url``
fixture (``fresh_pg_url`` gives each test its own empty database). Processes
are real: ``sparseety replay`` / replay processes started together against one
fresh database, and (``test_fleet_live.py``) live daemons capturing on ``lo``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, select, text

from sniffer.store import queries
from sniffer.store.db import EngineStore
from sniffer.store.ids import IdBlocks, peek, reserve
from sniffer.store.models import SCHEMA_VERSION, chunks, connections, id_blocks, metadata, streams
from sniffer.store.retention import prune
from sniffer.store.schema import SchemaTooNew, head_revision, migrate
from sniffer.store.writer import StoreWriter, make_engine

ROOT = Path(__file__).resolve().parent.parent
PCAPS = ROOT / "pcaps"
DATA = Path(__file__).resolve().parent / "data"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database URL: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fleet.db'}"
    else:
        yield request.getfixturevalue("fresh_pg_url")


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "sniffer.cli", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def texts_by_node(engine: Engine, node: str) -> list[str]:
    """Choice-0 text of every stream of ``node``, in capture order."""
    store = EngineStore(engine)
    return [
        queries.stream_text(store, s["id"]).get(0, "")
        for s in queries.list_streams(store, node=node)
    ]


# ---------------------------------------------------------------- migrations


def test_migrated_schema_is_the_models(db_url: str) -> None:
    """The migration chain builds exactly the tables the code declares."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": False})
        assert compare_metadata(ctx, metadata) == []
        assert ctx.get_current_revision() == head_revision()
        version = conn.execute(text("SELECT value FROM meta WHERE key='schema_version'")).scalar()
        assert version == str(SCHEMA_VERSION)
        rows = dict(conn.execute(select(id_blocks.c.name, id_blocks.c.next_id)).all())
    assert rows == {"connections": 1, "streams": 1}
    assert migrate(engine) == head_revision()  # at head: nothing to do
    engine.dispose()


def test_revisions_constant_is_the_packaged_chain() -> None:
    """``schema.REVISIONS`` (the fast path's list) is the chain in the package."""
    from alembic.script import ScriptDirectory

    from sniffer.store.schema import REVISIONS, alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    chain = [r.revision for r in script.walk_revisions()][::-1]
    assert tuple(chain) == REVISIONS
    assert script.get_current_head() == head_revision() == REVISIONS[-1]


def _v01_database(url: str, *, text_kept: bool = True) -> Engine:
    """A database as sparseety 0.1 made it (its DDL, frozen in tests/data)."""
    engine = create_engine(url)
    sql = (DATA / f"v01_schema.{engine.dialect.name}.sql").read_text()
    if not text_kept:  # a v0.1 file from before v0.1 added the column on open
        sql = sql.replace("\ttext_kept BOOLEAN, \n", "")
    with engine.begin() as conn:
        for stmt in sql.split(";\n"):
            body = "\n".join(ln for ln in stmt.splitlines() if not ln.startswith("--"))
            if body.strip():
                conn.exec_driver_sql(body)
    return engine


def _copy_rows(src: Engine, dst: Engine) -> None:
    """Rows a v0.1 replay would have written: the v0.1 columns of a replay's rows."""
    with src.connect() as s, dst.begin() as d:
        for table in ("connections", "streams", "chunks", "errors"):
            model = metadata.tables[table]  # typed columns: booleans come back as bool
            cols = [c for c in _v01_columns(d, table) if c in model.c]
            if table in ("chunks", "errors"):  # v0.1 let the database number these
                cols.remove("id")
            rows = s.execute(select(*(model.c[c] for c in cols))).mappings().all()
            if rows:
                placeholders = ", ".join(f":{c}" for c in cols)
                d.execute(
                    text(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({placeholders})"),
                    [dict(r) for r in rows],
                )


def _v01_columns(conn: Any, table: str) -> list[str]:
    from sqlalchemy import inspect

    return [c["name"] for c in inspect(conn).get_columns(table)]


@pytest.mark.parametrize("text_kept", [True, False])
def test_v01_database_is_upgraded_in_place(db_url: str, tmp_path: Path, text_kept: bool) -> None:
    from sniffer.runtime.replay import replay

    if not text_kept and not db_url.startswith("sqlite"):
        pytest.skip("v0.1 files without text_kept were SQLite files")
    ref = str(tmp_path / "reference.db")
    replay(PCAPS / "keepalive_3.pcap", ref, node="old")
    ref_engine = make_engine(ref)
    old = _v01_database(db_url, text_kept=text_kept)
    _copy_rows(ref_engine, old)
    with old.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() is None
        old_ids = [r for (r,) in conn.execute(text("SELECT id FROM streams ORDER BY id"))]
    old.dispose()
    assert old_ids

    assert migrate(make_engine_raw(db_url)) is None  # was v0.1: no revision
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
        ctx = MigrationContext.configure(conn, opts={"compare_type": False})
        assert compare_metadata(ctx, metadata) == []
        assert (
            conn.execute(select(id_blocks.c.next_id).where(id_blocks.c.name == "streams")).scalar()
            == max(old_ids) + 1
        )
    # the v0.1 rows are all there, readable, with no node
    for s in queries.list_streams(EngineStore(ref_engine)):
        assert queries.stream_text(EngineStore(engine), s["id"]) == queries.stream_text(
            EngineStore(ref_engine), s["id"]
        )
    assert {s["node"] for s in queries.list_streams(EngineStore(engine))} == {None}
    # and a new capture goes on after them without reusing an id
    replay(PCAPS / "keepalive_3.pcap", db_url, node="new")
    new = queries.list_streams(EngineStore(engine), node="new")
    assert len(new) == len(old_ids)
    assert min(s["id"] for s in new) > max(old_ids)
    assert texts_by_node(engine, "new") == [
        queries.stream_text(EngineStore(ref_engine), i).get(0, "") for i in old_ids
    ]
    engine.dispose()
    ref_engine.dispose()


def make_engine_raw(url: str) -> Engine:
    """An engine that does not migrate on its own (to call ``migrate`` by hand)."""
    return create_engine(url)


NEWER_REVISION = '''
"""A column a newer sparseety added.

Revision ID: 9001
Revises: {head}
"""

import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("streams", sa.Column("from_the_future", sa.Text()))


def downgrade() -> None:
    op.drop_column("streams", "from_the_future")
'''


def newer_migrations(tmp_path: Path) -> str:
    """The packaged migrations plus one more revision: a newer sparseety's."""
    src = ROOT / "sniffer" / "store" / "migrations"
    dst = tmp_path / "newer_migrations"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "versions" / "9001_future.py").write_text(
        textwrap.dedent(NEWER_REVISION.format(head=head_revision()))
    )
    return str(dst)


def test_older_code_refuses_a_newer_schema(db_url: str, tmp_path: Path) -> None:
    engine = make_engine(db_url)  # this version's schema
    StoreWriter(db_url, engine=engine, node="a").close()
    # a newer sparseety migrates the database in place …
    assert migrate(engine, script_location=newer_migrations(tmp_path)) == head_revision()
    engine.dispose()
    # … and this (older) one refuses it, in one line, writer and readers alike
    with pytest.raises(SchemaTooNew, match="revision 9001, newer than this sparseety"):
        make_engine(db_url)
    for args in (("streams",), ("run", "--no-metrics", "--port", "9", "--allow-world-readable")):
        proc = cli(*args, "--db", db_url, check=False)
        assert proc.returncode != 0
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "newer than this sparseety" in lines[0] and "upgrade sparseety" in lines[0]


def test_no_background_worker_runs_against_a_refused_schema(tmp_path: Path) -> None:
    """The one-line refusal of a newer schema was followed, in 5 of 6 runs under
    load, by a ``tokens-failed`` line: the features started the token
    worker before the daemon opened (and refused) the database, and its first
    pass, 0.5 s later, opened it too. The workers start once the daemon has
    opened the database and the capture is active: a refused database starts
    none, whatever the timing."""
    import io

    from sniffer.runtime.config import Config
    from sniffer.runtime.daemon import Daemon
    from sniffer.runtime.features import build_features
    from sniffer.runtime.log import Log
    from sniffer.runtime.notify import Notifier

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    engine = make_engine(url)
    migrate(engine, script_location=newer_migrations(tmp_path))
    engine.dispose()
    with pytest.raises(SchemaTooNew):
        make_engine(url)
    opened: list[int] = []

    class Source:
        def open(self) -> None:
            opened.append(1)

    log = io.StringIO()
    cfg = Config(database=url, ports=(9,), metrics=False)
    logger = Log("debug", log)
    feats = build_features(cfg, logger)
    d = Daemon(
        cfg,
        log=logger,
        source_factory=lambda _cfg, _ids: Source(),
        notifier=Notifier({}),
        install_signals=False,
        features=feats,
    )
    assert [w.thread.name for w in feats.workers] == ["tokens"]
    with pytest.raises(SchemaTooNew):
        d.run()
    assert not opened
    assert all(w.thread.ident is None for w in feats.workers)  # never started
    assert "failed" not in log.getvalue()
    for hook in d.on_stop:  # stopping workers that never started is a no-op
        hook()


def test_an_upgraded_sidecar_migrates_in_place(db_url: str, tmp_path: Path) -> None:
    """Rows written at this revision survive the next one's migration."""
    from sniffer.runtime.replay import replay

    replay(PCAPS / "keepalive_3.pcap", db_url, node="a")
    engine = make_engine(db_url)
    before = texts_by_node(engine, "a")
    newer = newer_migrations(tmp_path)
    assert migrate(engine, script_location=newer) == head_revision()
    assert migrate(engine, script_location=newer) == "9001"  # at head now: nothing to do
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(from_the_future) FROM streams")).scalar() == 0
    assert texts_by_node(engine, "a") == before
    engine.dispose()


# ---------------------------------------------------------------- concurrency

START_TOGETHER = """
import os, sys, time
from sniffer.runtime.replay import replay
go, pcap, url, node = sys.argv[1:5]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
r = replay(pcap, url, node=node, jobs=int(sys.argv[5]))
print(r.streams)
"""


def start_together(url: str, tmp_path: Path, nodes: list[str], pcap: Path, jobs: int = 1) -> None:
    """Replay processes, one per node, released at once against ``url``."""
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", START_TOGETHER, str(go), str(pcap), url, node, str(jobs)],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in nodes
    ]
    try:
        for p in procs:  # every interpreter imported and waiting, whatever the load
            assert p.stdout is not None
            line = p.stdout.readline()
            if line != "ready\n":
                raise AssertionError(f"{line!r}: {p.communicate(timeout=60)[1]}")
        go.touch()
        for p in procs:
            _out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err
            assert "UniqueViolation" not in err and "Traceback" not in err, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_fresh_database_many_writers_start_together(db_url: str, tmp_path: Path) -> None:
    """Six sidecars against one fresh database: all start (one creates the
    schema under the lock), every stream is exact, ids never collide."""
    from sniffer.runtime.replay import replay

    pcap = PCAPS / "concurrent_4.pcap"
    ref = str(tmp_path / "ref.db")
    replay(pcap, ref)
    ref_engine = make_engine(ref)
    expected = texts_by_node(ref_engine, StoreWriter(ref, engine=ref_engine).node)
    nodes = [f"node-{k}" for k in range(6)]
    start_together(db_url, tmp_path, nodes, pcap)
    engine = make_engine(db_url)
    every = queries.list_streams(EngineStore(engine))
    assert len(every) == len(expected) * len(nodes)
    assert len({s["id"] for s in every}) == len(every)
    with engine.connect() as conn:
        conn_nodes = dict(conn.execute(select(connections.c.id, connections.c.node)).all())
        assert len(conn_nodes) == conn.execute(text("SELECT count(*) FROM connections")).scalar()
        orphan = conn.execute(
            select(chunks.c.id).where(chunks.c.stream_id.not_in(select(streams.c.id)))
        ).first()
    assert orphan is None
    for node in nodes:
        mine = queries.list_streams(EngineStore(engine), node=node)
        assert texts_by_node(engine, node) == expected
        assert all(s["state"] == "complete" for s in mine)
        # a stream's connection is its own node's connection
        assert {conn_nodes[s["connection_id"]] for s in mine} == {node}
    engine.dispose()
    ref_engine.dispose()


ALLOCATE = """
import sys
from sniffer.store.ids import IdBlocks
from sniffer.store.writer import open_store
ids = IdBlocks(open_store(sys.argv[1]), "streams", first=1, max_block=8)
print(" ".join(str(ids()) for _ in range(int(sys.argv[2]))))
"""


def test_id_blocks_never_collide_across_processes(db_url: str) -> None:
    make_engine(db_url).dispose()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ALLOCATE, db_url, "400"],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    got: list[int] = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        got += [int(x) for x in out.split()]
    assert len(got) == 1600 and len(set(got)) == 1600
    engine = make_engine(db_url)
    assert peek(EngineStore(engine), "streams") > max(got)
    engine.dispose()


def test_id_blocks_grow_and_prefetch(db_url: str) -> None:
    engine = make_engine(db_url)
    assert reserve(EngineStore(engine), "connections", 10) == range(1, 11)
    ids = IdBlocks(EngineStore(engine), "connections", first=4, max_block=16)
    assert [ids() for _ in range(4)] == [11, 12, 13, 14]  # first block: 4 ids
    assert ids.prefetch() is True  # all used: the next block is reserved now …
    assert ids.prefetch() is False  # … once
    assert ids.blocks == 2 and ids.remaining == 8
    other = reserve(EngineStore(engine), "connections", 3)  # another writer meanwhile
    assert [ids() for _ in range(8)] == list(range(15, 23))  # the prefetched block
    assert other == range(23, 26)
    assert ids() == 26  # a new block, after the other writer's
    engine.dispose()


def test_id_blocks_hand_each_id_once_to_threads(db_url: str) -> None:
    """The usual call takes no lock (the block's range iterator); threads
    drawing at once, across block ends and prefetches, never get an id twice."""
    import threading

    engine = make_engine(db_url)
    ids = IdBlocks(EngineStore(engine), "streams", first=1, max_block=8)
    got: list[list[int]] = [[] for _ in range(4)]

    def draw(mine: list[int]) -> None:
        for k in range(300):
            mine.append(ids())
            if k % 7 == 0:
                ids.prefetch()

    threads = [threading.Thread(target=draw, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    every = [i for g in got for i in g]
    assert len(every) == 1200 and len(set(every)) == 1200
    assert all(g == sorted(g) for g in got)  # each thread's ids in hand-out order
    assert ids.remaining >= 0 and peek(EngineStore(engine), "streams") > max(every)
    engine.dispose()


# ---------------------------------------------------------------- readers


def test_readers_filter_by_node(db_url: str, tmp_path: Path) -> None:
    """replay --node on two nodes into one database; every reader takes --node,
    and a baseline on one node against a candidate on another is a normal diff."""
    pcap = str(PCAPS / "keepalive_3.pcap")
    cli("replay", pcap, "--db", db_url, "--node", "gpu-a", "-q", "--no-tokens")
    cli("replay", pcap, "--db", db_url, "--node", "gpu-b", "-q", "--no-tokens")
    engine = make_engine(db_url)
    a = queries.list_streams(EngineStore(engine), node="gpu-a")
    b = queries.list_streams(EngineStore(engine), node="gpu-b")
    assert len(a) == len(b) == 3 and not {s["id"] for s in a} & {s["id"] for s in b}
    engine.dispose()

    listed = [
        json.loads(ln)
        for ln in cli("streams", "--db", db_url, "--node", "gpu-b", "--json").stdout.splitlines()
    ]
    assert [r["id"] for r in listed] == [s["id"] for s in b]
    assert {r["node"] for r in listed} == {"gpu-b"}
    assert len(cli("streams", "--db", db_url, "--json").stdout.splitlines()) == 6

    shown = cli("show", str(a[0]["id"]), "--db", db_url, "--node", "gpu-a").stdout
    assert "node=gpu-a" in shown
    wrong = cli("show", str(a[0]["id"]), "--db", db_url, "--node", "gpu-b", check=False)
    assert wrong.returncode == 1 and "captured by node 'gpu-a'" in wrong.stderr

    exported = cli("export", "--db", db_url, "--node", "gpu-a", "--format", "csv").stdout
    assert len(exported.splitlines()) == 1 + 3
    assert {
        json.loads(ln)["stream_id"]
        for ln in cli("export", "--db", db_url, "--node", "gpu-a").stdout.splitlines()
    } == {s["id"] for s in a}

    verified = json.loads(cli("verify", "--db", db_url, "--node", "gpu-b", "--json").stdout)
    assert sorted(v["stream_id"] for v in verified["results"]) == sorted(s["id"] for s in b)

    st = json.loads(cli("stats", "--db", db_url, "--node", "gpu-a", "--json").stdout)
    assert st["summary"]["outputs"] + st["summary"]["single_output_fingerprints"] == 3

    report = json.loads(
        cli(
            "diff",
            "--db",
            db_url,
            "--baseline-node",
            "gpu-a",
            "--candidate-node",
            "gpu-b",
            "--json",
            "--fail-if",
            "identical_ratio < 1",
        ).stdout
    )
    assert report["summary"]["pairs"] == 3
    assert report["summary"]["identical_ratio"] == 1.0
    assert (report["baseline"], report["candidate"]) == ("gpu-a", "gpu-b")
    nodes = [json.loads(ln) for ln in cli("nodes", "--db", db_url, "--json").stdout.splitlines()]
    assert [(n["node"], n["streams"]) for n in nodes] == [("gpu-a", 3), ("gpu-b", 3)]


def test_retention_prunes_only_its_node(db_url: str) -> None:
    from sniffer.runtime.replay import replay

    pcap = PCAPS / "keepalive_3.pcap"
    replay(pcap, db_url, node="a")
    replay(pcap, db_url, node="b")
    engine = make_engine(db_url)
    r = prune(EngineStore(engine), 0, now=4e9, node="a", batch=1, max_rows=1)
    assert r.streams == 3 and r.batches >= 3
    assert queries.list_streams(EngineStore(engine), node="a") == []
    assert len(queries.list_streams(EngineStore(engine), node="b")) == 3
    with engine.connect() as conn:
        left = set(conn.execute(select(connections.c.node)).scalars())
    assert left == {"b"}
    engine.dispose()


def test_postgresql_inserts_use_copy(fresh_pg_url: str) -> None:
    w = StoreWriter(fresh_pg_url, node="n")
    assert w.copy is True
    w.close()
    lite = StoreWriter("sqlite://", node="n")
    assert lite.copy is False
    lite.close()


def test_no_id_to_be_had_costs_a_segment_not_the_capture(tmp_path: Path) -> None:
    """Database gone and ids used up: the allocator refuses to guess, the
    pipeline records the loss and keeps going; numbering resumes afterwards."""
    from sniffer.core.events import ACK, SYN, ConnectionOpened, PipelineError, Segment
    from sniffer.core.pipeline import Pipeline, PipelineConfig
    from sniffer.store.ids import IdsUnavailable

    url = f"sqlite:///{tmp_path / 'ids.db'}"
    engine = make_engine(url)
    ids = IdBlocks(EngineStore(engine), "connections", first=1, max_block=1)
    assert ids() == 1
    with engine.begin() as conn:  # the database "goes away" for this table
        conn.exec_driver_sql("ALTER TABLE id_blocks RENAME TO id_blocks_away")
    with pytest.raises(IdsUnavailable, match="no connections id left"):
        ids()
    pipe = Pipeline(PipelineConfig(conn_ids=ids))

    def syn(port: int) -> Segment:
        return Segment(1.0, "127.0.0.1", port, "127.0.0.1", 8000, 100, 0, SYN, b"")

    out = pipe.feed(syn(40001))
    assert [type(e) for e in out] == [PipelineError] and "segment dropped" in out[0].message
    assert pipe.internal_errors == 1 and ids.failures == 2
    with engine.begin() as conn:  # back
        conn.exec_driver_sql("ALTER TABLE id_blocks_away RENAME TO id_blocks")
    data = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    out = pipe.feed(syn(40002))
    out += pipe.feed(Segment(1.1, "127.0.0.1", 40002, "127.0.0.1", 8000, 101, 1, ACK, data))
    out += pipe.flush(2.0)
    opened = [e for e in out if isinstance(e, ConnectionOpened)]
    assert [e.conn for e in opened] == [2]
    engine.dispose()
