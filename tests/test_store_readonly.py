"""A store its user may read but not write: the reading commands open it
read-only, the writing ones refuse it with one line.

The daemon's store is 0640 with a reader group (``[files] group``), or 0644, on
a read-only mount, or a copy made read-only: an operator reads it with
``streams``, ``export``, ``verify``… without write access. SQLite refuses a
read-write connection's first write there ("attempt to write a readonly
database"), and every connection used to start with two writing pragmas.

The commands run as uid 65534 in a subprocess (``setpriv``), on stores made
by root in a directory the reader may not write: root ignores file modes, so
the tests need root and skip otherwise. Where the interpreter lives under a
home only root may enter (pyenv in /root), the reader also gets
CAP_DAC_READ_SEARCH to load Python: it may then read every file, not write
one, which is what these tests are about.
"""

from __future__ import annotations

import functools
import grp
import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sniffer.cli.main import main
from sniffer.store.lite import ReadOnlyStore, SqliteFile, connect, read_only_uri, set_pragmas
from sniffer.store.schema import REVISIONS
from sniffer.store.writer import open_store

REPO = Path(__file__).resolve().parent.parent
CAPTURE = REPO / "pcaps" / "chat_english.pcap"
READER = 65534  # nobody

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root (and setpriv) to run a command as another user",
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Every file of ``directory``: (owner, mode, size)."""
    out = {}
    for p in directory.iterdir():
        st = p.stat()
        out[p.name] = (st.st_uid, st.st_mode, st.st_size)
    return out


@functools.cache
def _reader_prefix() -> tuple[str, ...]:
    """``setpriv`` as uid 65534; with CAP_DAC_READ_SEARCH when the interpreter
    cannot be loaded by that user otherwise (see the module docstring)."""
    base = ("setpriv", f"--reuid={READER}", f"--regid={READER}")
    probe = [*base, "--clear-groups", sys.executable, "-c", "import click, sniffer.cli.main"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": "/tmp"}
    if subprocess.run(probe, env=env, capture_output=True, cwd="/").returncode == 0:
        return base
    return (*base, "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")


def as_reader(*args: str, cwd: Path, group: int | None = None) -> subprocess.CompletedProcess[str]:
    """``sparseety ARGS`` as uid 65534 (in the supplementary ``group`` when given)."""
    groups = f"--groups={group}" if group is not None else "--clear-groups"
    cmd = [*_reader_prefix(), groups, sys.executable, "-m", "sniffer.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": "/tmp", "SPARSEETY_PURE": ""}
    env.pop("SPARSEETY_DB", None)
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def reader_group() -> int:
    """A group other than root's and nobody's: the store's reader group."""
    for g in grp.getgrall():
        if g.gr_gid not in (0, READER, os.getgid()):
            return g.gr_gid
    pytest.skip("no spare group on this system")


@pytest.fixture(scope="module")
def made_store() -> Iterator[Path]:
    """A store of one bundled capture (tokens on), made once by root."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "made.db"
        res = CliRunner().invoke(main, ["replay", str(CAPTURE), "--db", str(db), "--quiet"])
        assert res.exit_code == 0, res.output
        assert not Path(f"{db}-wal").exists()
        yield db


@pytest.fixture
def store_dir() -> Iterator[Path]:
    """A directory root owns and the reader may enter but not write (0755), outside
    pytest's own 0700 temporary tree."""
    d = Path(tempfile.mkdtemp(prefix="sparseety-ro-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def place(made: Path, directory: Path, mode: int, gid: int | None = None) -> Path:
    db = directory / "store.db"
    shutil.copyfile(made, db)
    if gid is not None:
        os.chown(db, 0, gid)
    db.chmod(mode)
    return db


#: every command that only reads, and a piece of what it prints on the bundled capture
READING = {
    "streams": (["streams"], "complete"),
    "show": (["show", "1"], "finish"),
    "export": (["export"], '"stream_done"'),
    "export-csv": (["export", "--format", "csv"], "complete"),
    "errors": (["errors"], "no errors"),
    "nodes": (["nodes"], "streams"),
    "stats": (["stats"], "groups"),
    "diff": (["diff", "--baseline", "a", "--candidate", "b"], "ratios"),
    "verify": (["verify"], "1 streams: 1 verified"),
    "top": (["top", "--once"], "per label"),
}


def check_reads(db: Path, names: list[str], group: int | None = None) -> None:
    before, files = sha256(db), listing(db.parent)
    for name in names:
        args, expected = READING[name]
        res = as_reader(*args, "--db", db.name, cwd=db.parent, group=group)
        assert expected in res.stdout + res.stderr, (name, res.stdout, res.stderr)
        assert "readonly" not in res.stderr and "Traceback" not in res.stderr, (name, res.stderr)
        assert res.returncode == 0, (name, res.stdout, res.stderr)
        # nothing written, nothing left: the file and the directory as they were
        assert sha256(db) == before, name
        assert listing(db.parent) == files, name


@needs_root
def test_reading_commands_on_a_group_store(made_store: Path, store_dir: Path) -> None:
    gid = reader_group()
    db = place(made_store, store_dir, 0o640, gid)
    check_reads(db, list(READING), group=gid)


@needs_root
def test_reading_commands_on_a_world_readable_store(made_store: Path, store_dir: Path) -> None:
    db = place(made_store, store_dir, 0o644)
    check_reads(db, ["streams", "export", "verify"])


@needs_root
def test_verify_does_not_tokenize_a_store_it_cannot_write(store_dir: Path) -> None:
    """``verify`` tokenizes streams without token rows first, a write: read-only,
    it warns ``not_tokenized`` instead (and the owner's ``verify`` still tokenizes)."""
    db = store_dir / "store.db"
    made = CliRunner().invoke(main, ["replay", str(CAPTURE), "--db", str(db), "--no-tokens", "-q"])
    assert made.exit_code == 0, made.output
    db.chmod(0o644)
    before, files = sha256(db), listing(store_dir)
    res = as_reader("verify", "--db", db.name, cwd=store_dir)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "not_tokenized 1" in res.stdout, res.stdout
    assert sha256(db) == before and listing(store_dir) == files
    owner = CliRunner().invoke(main, ["verify", "--db", str(db), "-q"])
    assert "not_tokenized" not in owner.output and "1 verified" in owner.output, owner.output


@needs_root
def test_reading_commands_still_work_for_the_owner(made_store: Path, store_dir: Path) -> None:
    db = place(made_store, store_dir, 0o640, reader_group())
    for name, (args, expected) in READING.items():
        res = CliRunner().invoke(main, [*args, "--db", str(db)])
        assert expected in res.output, (name, res.output)
    store = open_store(str(db), reads_only=True)
    try:
        assert not store.read_only  # the owner opens it as every writer does
    finally:
        store.close()


@needs_root
def test_reading_while_the_writer_runs(made_store: Path, store_dir: Path) -> None:
    """A writer holds the store open with a transaction only its WAL holds: the
    reader shares the WAL index (read-only -wal/-shm) and sees it."""
    db = place(made_store, store_dir, 0o644)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from sniffer.store.writer import StoreWriter\n"
            "w = StoreWriter(sys.argv[1])\n"
            "with w.store.transaction() as tx:\n"
            "    tx.run(\"UPDATE streams SET label='live' WHERE id=1\")\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n"
            "w.close()\n",
            str(db),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        wal = Path(f"{db}-wal")
        assert wal.stat().st_size > 0 and Path(f"{db}-shm").exists()
        files = listing(store_dir)
        res = as_reader("streams", "--label", "live", "--db", db.name, cwd=store_dir)
        assert res.returncode == 0 and " live " in res.stdout, (res.stdout, res.stderr)
        check_reads(db, ["export", "verify", "top"])
        # the sidecars are still root's: the reader wrote none of them
        assert {n: v[0] for n, v in listing(store_dir).items()} == {n: 0 for n in files}
    finally:
        writer.communicate("", timeout=30)
    assert writer.returncode == 0
    assert not Path(f"{db}-wal").exists()  # the writer's last close checkpointed
    res = as_reader("streams", "--label", "live", "--db", db.name, cwd=store_dir)
    assert res.returncode == 0 and " live " in res.stdout, (res.stdout, res.stderr)


@needs_root
def test_reading_after_the_writer_was_killed(made_store: Path, store_dir: Path) -> None:
    """A writer killed with its transaction in the WAL leaves -wal/-shm the reader
    may not write: read-only, SQLite reads the WAL all the same."""
    db = place(made_store, store_dir, 0o644)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1])\n"
            "c.execute(\"UPDATE streams SET label='killed' WHERE id=1\")\n"
            "c.commit()\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert Path(f"{db}-wal").stat().st_size > 0
    res = as_reader("streams", "--label", "killed", "--db", db.name, cwd=store_dir)
    assert res.returncode == 0 and " killed " in res.stdout, (res.stdout, res.stderr)
    check_reads(db, ["export", "nodes"])


@needs_root
@pytest.mark.parametrize(
    "args",
    [
        ["prune", "--older-than", "1d"],
        ["tokenize", "--redo"],
        ["replay", str(CAPTURE), "--quiet"],
        ["run", "--no-metrics"],
    ],
    ids=["prune", "tokenize", "replay", "run"],
)
def test_writing_commands_refuse_a_store_they_cannot_write(
    made_store: Path, store_dir: Path, args: list[str]
) -> None:
    db = place(made_store, store_dir, 0o644 if args[0] != "run" else 0o640)
    before, files = sha256(db), listing(store_dir)
    res = as_reader(*args, "--db", db.name, cwd=store_dir)
    assert res.returncode in (1, 2)
    assert res.stderr == (
        f"sparseety: database {db.name} is read-only for this user (uid {READER}) and this "
        "command writes to it: run it as a user who may write the file (its owner)\n"
    )
    assert sha256(db) == before and listing(store_dir) == files


@needs_root
def test_a_reader_does_not_migrate(made_store: Path, store_dir: Path) -> None:
    db = place(made_store, store_dir, 0o644)
    with sqlite3.connect(db) as c:
        c.execute("UPDATE alembic_version SET version_num = ?", (REVISIONS[-2],))
    c.close()
    before = sha256(db)
    res = as_reader("streams", "--db", db.name, cwd=store_dir)
    assert res.returncode == 1
    assert res.stderr.startswith(
        f"sparseety: database {db.name} is read-only for this user and its schema is at "
        f"revision {REVISIONS[-2]}, not {REVISIONS[-1]}"
    )
    assert "open it once with write access" in res.stderr
    assert sha256(db) == before and listing(store_dir) == {db.name: listing(store_dir)[db.name]}


RACE = """
import sys
import sniffer.store.lite as lite

real, looks = lite.no_writer, []


def seen_before_the_writer_closed(path):
    looks.append(path)
    return False if len(looks) == 1 else real(path)


lite.no_writer = seen_before_the_writer_closed
store = lite.SqliteFile(sys.argv[1], read_only=True)
with store._lock:
    n = store._connection().execute("SELECT count(*) FROM streams").fetchone()[0]
print(store._immutable, n)
"""


@needs_root
def test_a_writer_closing_while_a_reader_opens(made_store: Path, store_dir: Path) -> None:
    """The reader saw the writer's ``-wal`` (the first look), which the writer
    then took away as it closed: the ``mode=ro`` open fails (the reader may not
    create them), and the file is opened as immutable instead (it failed
    before)."""
    db = place(made_store, store_dir, 0o644)
    cmd = [*_reader_prefix(), "--clear-groups", sys.executable, "-c", RACE, str(db)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": "/tmp"}
    res = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "1"]
    assert listing(store_dir) == {db.name: listing(store_dir)[db.name]}


# --- without root: the read-only connection itself ------------------------------------


def test_read_only_uri(tmp_path: Path) -> None:
    db = tmp_path / "odd ?#%.db"
    db.touch()
    uri = read_only_uri(str(db))
    assert uri.endswith("?mode=ro&immutable=1")  # no -wal/-shm: no writer has it open
    assert "odd%20%3F%23%25.db" in uri
    Path(f"{db}-wal").touch()
    Path(f"{db}-shm").touch()
    assert read_only_uri(str(db)).endswith("?mode=ro")  # a writer's WAL: shared, locked


def test_read_only_connection_writes_nothing(made_store: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    shutil.copyfile(made_store, db)
    before = sha256(db)
    conn = connect(str(db), read_only=True)
    try:
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (5000,)
        assert conn.execute("SELECT count(*) FROM streams").fetchone() == (1,)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM streams")
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            set_pragmas(conn)  # the writer's pragmas write: the reason for read_only
    finally:
        conn.close()
    assert sha256(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def test_read_only_store_refuses_to_migrate(made_store: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    shutil.copyfile(made_store, db)
    store = SqliteFile(str(db), read_only=True)
    try:
        store.migrate()  # at head: nothing to do
        assert store.create_schema()
        with store.engine.connect() as conn:  # read-only too, made by ``creator``
            assert conn.exec_driver_sql("SELECT count(*) FROM streams").scalar() == 1
            with pytest.raises(Exception, match="readonly"):
                conn.exec_driver_sql("DELETE FROM streams")
    finally:
        store.close()
    with sqlite3.connect(db) as c:
        c.execute("UPDATE alembic_version SET version_num = ?", (REVISIONS[-2],))
    c.close()
    before = sha256(db)
    store = SqliteFile(str(db), read_only=True)
    try:
        with pytest.raises(ReadOnlyStore, match="does not migrate it"):
            store.migrate()
        with pytest.raises(ReadOnlyStore, match="does not migrate it"):
            store.create_schema()
    finally:
        store.close()
    assert sha256(db) == before


def test_an_immutable_reader_reopens_once_a_writer_has_the_file(
    made_store: Path, tmp_path: Path
) -> None:
    """Read with no writer (no -wal/-shm: immutable), then a writer opens the file
    (``top`` started before the daemon): the next query is on a connection that
    shares the writer's WAL, and sees what the WAL alone holds."""
    db = tmp_path / "s.db"
    shutil.copyfile(made_store, db)
    store = SqliteFile(str(db), read_only=True)
    writer = sqlite3.connect(db)
    try:
        assert store.query("SELECT label FROM streams") == [(None,)]
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("UPDATE streams SET label = 'new'")
        writer.commit()
        assert Path(f"{db}-wal").stat().st_size > 0  # not checkpointed: the WAL holds it
        assert store.query("SELECT label FROM streams") == [("new",)]
    finally:
        store.close()
        writer.close()
