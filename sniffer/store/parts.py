"""Part files: what a parallel replay worker writes instead of the shared SQLite file.

Several processes writing one SQLite file take turns on its single write lock:
each batch waits for the other's transaction (SQLite's busy handler sleeps in
steps of up to 100 ms), and on a loaded machine the holder is descheduled with
the lock held, so the other waits for a whole time slice. A parallel replay
into a SQLite file therefore gives every worker but the first a *part file*
of its own (a new SQLite file at the schema head, in a private directory next
to the database: :func:`part_dir`), writes nothing else to the database
during the replay but its id reservations, and the parent merges each part
into the database once it is written, in worker order, one transaction per
part (:class:`PartMerger`: ``INSERT … SELECT`` inside SQLite, no row through
Python). A part has no secondary index (:func:`create_part`): the
database's take its rows at the merge. The parent's token pass writes each
share's token rows to a part file of its own too (``sniffer.runtime.replay``).

Ids stay what they were: the worker's connection and stream ids come from
blocks reserved in the database itself (``sniffer.store.ids``; the writer's
``ids_from``), so a part's rows keep their ids when merged and never collide
with another writer's. The rows numbered by the database (chunks, errors,
token anomalies: ``autoincrement``) are numbered again by the database they
are merged into, in the part's order.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile

from sniffer.store import spec
from sniffer.store.files import db_path, ensure_db_file
from sniffer.store.lite import SCHEMA_DDL, SCHEMA_ROWS, begin_immediate, connect

#: The tables a part holds rows of, merged in this order (parents before the
#: rows that name them; ``sniffer.store.spec``).
MERGED = (
    "connections",
    "streams",
    "chunks",
    "errors",
    "stream_tokens",
    "choice_tokens",
    "token_anomalies",
)

#: The tables a part's rows never go to: the schema stamp, the id counters (the
#: part's ids come from the database's own), the daemon's checkpoints.
NOT_MERGED = ("meta", "id_blocks", "checkpoints")


def part_dir(db: str) -> str | None:
    """A new private directory (0700) for part files next to the SQLite file of
    ``db`` (a path or plain ``sqlite:///`` URL); None for any other database
    (PostgreSQL takes concurrent writers as they are), and when the directory
    cannot be made (the workers then write the database itself, taking turns
    on its lock). The caller removes it (:func:`remove_parts`). While it
    exists this process (and the workers it forks, which share the open
    file) holds a lock on a file in it: what :func:`remove_stale_parts`
    asks, here, of the directories left by replays that did not end."""
    if "://" in db and (not db.startswith("sqlite:///") or "?" in db or "mode=memory" in db):
        return None
    path = db_path(db)
    if path is None:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}.parts-"
    remove_stale_parts(parent, prefix)
    try:
        made = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    except OSError:  # a directory we may not create files in: write the database directly
        return None
    try:
        fd = os.open(os.path.join(made, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        remove_parts(made)
        return None
    _HELD[made] = fd
    return made


#: The lock file of a part directory, and the open lock of each directory this
#: process made (closed by :func:`remove_parts`).
_LOCK = ".lock"
_HELD: dict[str, int] = {}


def remove_stale_parts(parent: str, prefix: str) -> list[str]:
    """Remove the part directories (``prefix`` + a process id + a random part)
    in ``parent`` whose replay no longer runs: a replay killed with
    ``SIGKILL`` (or the machine's crash) cannot remove its own, and its parts
    were never merged (the rows it had merged are in the database). A replay
    runs as long as its directory's lock file is locked (the kernel drops the
    lock with the last process holding it, in whatever PID namespace); a
    directory without one (made before this lock, or not by a replay) is left
    alone. Returns the names of the directories removed."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        directory = os.path.join(parent, name)
        if not name.startswith(prefix) or directory in _HELD:
            continue
        try:
            fd = os.open(os.path.join(directory, _LOCK), os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # no lock file (or not ours to open): not known to be stale
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its replay runs
            continue
        else:
            remove_parts(directory)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def create_part(path: str) -> None:
    """Create the part file ``path`` (new, 0600) at the schema head without the
    secondary indexes: a part is written once, read once in rowid order by
    :meth:`PartMerger.merge` and removed, and its writer looks rows up by
    primary key only, so keeping those indexes up to date (the chunks' alone
    costs its writer some 40 ms of CPU on the benchmark capture's half) would
    be work done twice: the database's indexes take the rows at the merge."""
    ensure_db_file(path)
    conn = connect(path)
    try:
        begin_immediate(conn)
        for sql in (*SCHEMA_DDL, *SCHEMA_ROWS):
            if not sql.startswith("CREATE INDEX "):
                conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


def remove_parts(directory: str) -> None:
    """Remove a directory of part files (merged or given up on), and let go of
    its lock if this process holds it."""
    shutil.rmtree(directory, ignore_errors=True)
    fd = _HELD.pop(directory, None)
    if fd is not None:
        os.close(fd)


def _columns(table: str) -> str:
    t = spec.TABLES[table]
    names = [c for c in t.names if not (t.autoincrement and c == "id")]
    return ", ".join(spec.quote(c) for c in names)


class PartMerger:
    """Merges part files into the SQLite database ``db`` one after the other
    through one connection: SQLite copies the write-ahead log into the
    database (a checkpoint, and its ``fsync``) when the last connection
    closes, so once for them all rather than once per part. A context
    manager."""

    def __init__(self, db: str) -> None:
        path = db_path(db)
        if path is None:
            raise ValueError(f"{db}: not a SQLite file")
        self._conn = connect(path)

    def __enter__(self) -> PartMerger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def merge(self, part: str) -> dict[str, int]:
        """Copy every row of the part file ``part`` into the database (both at
        the schema head) in one transaction under the write lock; the rows the
        database numbers are numbered by it, in the part's order. Returns the
        rows copied per table. Raises ``sqlite3.Error`` (nothing is merged
        then)."""
        conn = self._conn
        conn.execute("ATTACH DATABASE ? AS part", (part,))
        try:
            begin_immediate(conn)
            counts: dict[str, int] = {}
            try:
                for table in MERGED:
                    cols = _columns(table)
                    cur = conn.execute(
                        f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM part.{table} "
                        "ORDER BY rowid"
                    )
                    counts[table] = cur.rowcount
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            return counts
        finally:
            conn.execute("DETACH DATABASE part")


__all__ = [
    "MERGED",
    "NOT_MERGED",
    "PartMerger",
    "create_part",
    "part_dir",
    "remove_parts",
    "remove_stale_parts",
]
