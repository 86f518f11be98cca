"""A SQLite file store through the standard library's driver, without SQLAlchemy.

Importing SQLAlchemy costs more CPU than a command's whole start-up should
(issue #16: <= 0.15 s to the first useful work). The writers already send
their rows straight to the driver (``executemany`` with tuples), so on a
SQLite file they need SQLAlchemy for nothing but its statement text, the
schema check and the id blocks. This module does those three with
``sqlite3``:

- :func:`connect` opens the file with :func:`set_pragmas`, the pragmas
  ``make_engine``'s connections get too (a database file is the same whichever
  opened it first);
- :func:`create_schema` creates the schema at head in a new, empty file: the
  statements of :data:`SCHEMA_DDL` are the text the migration chain leaves in
  ``sqlite_master`` (a test compares the two), and the ``alembic_version`` row
  is stamped, so Alembic sees a file it created itself;
- :func:`revision` reads the schema revision with one query (the Alembic
  ``alembic_version`` table): a store at head needs nothing else; anything
  else goes through ``sniffer.store.schema.migrate`` (SQLAlchemy + Alembic);
- :class:`SqliteFile` runs a writer's transactions and reserves id blocks;
- :data:`TABLE_COLUMNS` and :func:`insert_sql` / :func:`update_sql` give the
  statement text SQLAlchemy compiles for SQLite (a test compares them);
- :func:`executemany_sqlite` inserts rows several per statement (the
  writer's, and the token pass's through ``Transaction.insert_many``).

PostgreSQL, in-memory SQLite and the migration of older files keep SQLAlchemy.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol

from sniffer.store import spec
from sniffer.store.db import Store
from sniffer.store.files import WAL_SUFFIXES
from sniffer.store.schema import REVISIONS, SQLITE_LOCK_WAIT
from sniffer.store.views import VIEWS

if TYPE_CHECKING:
    from sqlalchemy import Engine

#: ``streams.dialect`` of an exchange that is not an LLM stream (plain HTTP):
#: the store's spelling of ``StreamOpened.dialect is None`` (``models.PLAIN_HTTP``).
PLAIN_HTTP = "http"

#: Columns of every table in table order, and the boolean ones (stored 0/1;
#: SQLAlchemy reads them back as ``bool``, and so does :meth:`SqliteFile.select`):
#: from the table specification (``sniffer.store.spec``).
TABLE_COLUMNS = spec.TABLE_COLUMNS
BOOLEAN_COLUMNS = spec.BOOLEAN_COLUMNS


def _null(value: None) -> None:
    """sqlite3's adapter for ``None`` (registered below): NULL, as without one.

    Without an adapter, the driver binds a None only after a fallback search
    per value (the adapter registry, then ``PrepareProtocol.__adapt__``, whose
    miss makes and drops an AttributeError with a formatted message, then
    ``__conform__``): 60 % of ``executemany`` on chunk rows, six of whose 14
    values are None (callgrind). Found in the registry it is one call:
    1.1 µs less per chunk row. ``None`` is no base type, so the driver's
    fast path for ints, floats and strings stays on."""
    return value


sqlite3.register_adapter(type(None), _null)
#: ``bool`` is no base type either (an ``int`` subclass): without an adapter each
#: True or False (five of a stream row's values) takes the same fallback search,
#: two failed attribute look-ups, before the driver binds it as the integer it
#: is. ``int`` binds it as the same 1 or 0, found in one look-up.
sqlite3.register_adapter(bool, int)

#: ``(table, set columns in table order, coalesced columns)`` of an UPDATE by id:
#: its positional parameters are ``b_<column>`` for each set column, then ``b_id``.
UpdateSpec = tuple[str, tuple[str, ...], tuple[str, ...]]


def insert_sql(table: str, columns: Sequence[str]) -> str:
    """``INSERT INTO table (a, b) VALUES (?, ?)``: positional, in ``columns`` order."""
    names = ", ".join(spec.quote(c) for c in columns)
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"


def update_spec(table: str, columns: Sequence[str], coalesce: Sequence[str] = ()) -> UpdateSpec:
    """The columns an UPDATE by id sets, in table order (as SQLAlchemy renders them).
    A ``coalesce`` column keeps a value already there (``coalesce(col, ?)``)."""
    wanted = {*columns, *coalesce}
    ordered = tuple(c for c in TABLE_COLUMNS[table] if c in wanted)
    return table, ordered, tuple(coalesce)


def update_sql(spec: UpdateSpec) -> tuple[str, tuple[str, ...]]:
    """The UPDATE text of ``spec`` and its parameter order (``b_<column>``…, ``b_id``)."""
    table, ordered, coalesce = spec
    sets = ", ".join(
        f"{c}=coalesce({table}.{c}, ?)" if c in coalesce else f"{c}=?" for c in ordered
    )
    order = (*(f"b_{c}" for c in ordered), "b_id")
    return f"UPDATE {table} SET {sets} WHERE {table}.id = ?", order


def insert_or_fail_sql(
    table: str, columns: Sequence[str], marks: Sequence[str] | None = None
) -> tuple[str, int]:
    """The SQLite ``INSERT OR FAIL`` of ``columns`` whose values are ``marks``
    (``?`` a parameter, else a literal; all ``?`` by default), and its number
    of parameters: the single-row statement :func:`executemany_sqlite` sends
    several rows of.

    ``OR FAIL``: a statement of several rows that may abort half way (a
    constraint, ``OR ABORT`` by default) runs in a statement transaction,
    whose journal keeps a copy of every page the statement changes first:
    with rows of many streams at once (a live capture: each chunk row's index
    entry on another page) about one 4 KB page copied per row, then the
    journal truncated at each statement's end, ~2,900 instructions per chunk
    row (``bench/bench_writer_live.py`` under callgrind: 4.57 → 4.28 G for
    100,000 rows). ``OR FAIL`` keeps what the statement wrote before the
    failing row instead of undoing it, so SQLite needs no such journal, and
    a failing row leaves what one statement per row would (the rows before
    it); nothing changes for a writer's flush or the token pass, since every
    error inside their transaction rolls the whole transaction back
    (``SqliteFile.begin``, ``engine.begin``), as before."""
    if marks is None:
        marks = ("?",) * len(columns)
    names = ", ".join(spec.quote(c) for c in columns)
    return (
        f"INSERT OR FAIL INTO {table} ({names}) VALUES ({', '.join(marks)})",
        list(marks).count("?"),
    )


@functools.cache
def multi_row_sql(sql: str, rows: int) -> str:
    """The single-row INSERT ``sql`` with ``rows`` rows of parameters in one
    statement (``VALUES (…), (…), …``). Cached: a handful of sizes per
    statement, and the same text object each time is found in sqlite3's
    statement cache without hashing its few kilobytes again."""
    head, sep, group = sql.partition(" VALUES ")
    return head + sep + ",".join([group] * rows)


#: Rows per statement of ``Transaction.insert_many`` (the token pass's rows):
#: sqlite3 prepares a statement text once per connection (its cache), and a
#: statement of 999 parameters costs more to prepare than its rows save when
#: the connection runs it only a few times (a replay's token pass: a new
#: connection, three batches of 500 streams; callgrind: 4-5 M instructions
#: more per pass of the benchmark capture than 16 or 32 rows). At 32 rows a
#: statement run's own cost (~1.3 µs) is a few percent of its rows'.
INSERT_MANY_ROWS = 32


class DriverConnection(Protocol):
    """What :func:`executemany_sqlite` runs statements on: a SQLAlchemy
    ``Connection`` or a :class:`SqliteFile` transaction (a list of rows is an
    ``executemany``)."""

    def exec_driver_sql(self, sql: str, params: Any = ()) -> Any: ...


def executemany_sqlite(
    conn: DriverConnection, sql: str, params: int, rows: list[Any], max_rows: int = 999
) -> None:
    """``executemany`` of a single-row SQLite INSERT (of ``params`` parameters;
    :func:`insert_or_fail_sql`) with several rows per statement: as many as
    999 parameters allow (the limit of old SQLite builds; about 40 % faster
    than one row per statement), then the rest in one statement per power of
    two (64, 32, …, 4), and the last three, two or one row in one: each
    statement run costs sqlite3 about 1.3 µs whatever its rows (its cursors,
    its end), and a run of rows of one shape between rows of others (some 50
    rows of content chunks in a busy capture; the three content rows of a
    short stream between its role and finish rows) is then a handful of
    statements, not a statement per row past the last multiple of 16. Three
    rows is the one size besides the powers of two: one statement text more
    per shape in sqlite3's statement cache (128 entries), one statement less
    for a run that ends in three rows. The rows keep their order (the ids
    SQLite gives are those of one statement per row). At most ``max_rows``
    rows per statement when given (:data:`INSERT_MANY_ROWS`). The writer's
    chunk, stream and error rows and the token pass's rows
    (``sniffer.store.tokens_store``) go in through it."""
    most = max(1, min(max_rows, 999 // params))
    if most == 1:
        conn.exec_driver_sql(sql, rows)
        return
    for start, per, count in _statement_runs(len(rows), most):
        if per == 1:
            conn.exec_driver_sql(sql, rows[start:])
        else:
            conn.exec_driver_sql(
                multi_row_sql(sql, per),
                [
                    tuple(chain.from_iterable(rows[i : i + per]))
                    for i in range(start, start + per * count, per)
                ],
            )


def executemany_flat_sqlite(
    conn: DriverConnection, sql: str, params: int, values: list[Any], max_rows: int = 999
) -> None:
    """:func:`executemany_sqlite` of rows given one after another in ``values``
    (``params`` values per row): the same statements, their parameters
    slices of ``values`` (a tuple per statement, as SQLAlchemy wants them,
    none per row: the token pass's ~35 anomaly rows per stream of the live
    traffic, made by :func:`sniffer.store.tokens_store.write_token_rows` from
    their columns with a slice assignment per column)."""
    most = max(1, min(max_rows, 999 // params))
    for start, per, count in _statement_runs(len(values) // params, most):
        step = per * params
        first = start * params
        conn.exec_driver_sql(
            sql if per == 1 else multi_row_sql(sql, per),
            [tuple(values[i : i + step]) for i in range(first, first + step * count, step)],
        )


def _statement_runs(n: int, most: int) -> list[tuple[int, int, int]]:
    """The statements :func:`executemany_sqlite` runs ``n`` rows in, at most
    ``most`` per statement, as ``(first row, rows per statement, statements)``:
    full statements, then one per power of two, three rows in one, and a
    last row alone."""
    out = []
    done = n // most * most
    if done:
        out.append((0, most, done // most))
    left = n - done
    while left > 1:
        per = 3 if left == 3 else 1 << (left.bit_length() - 1)
        out.append((done, per, 1))
        done += per
        left -= per
    if left:
        out.append((done, 1, 1))
    return out


#: Where SQLite keeps its temporary files, statement journals among them:
#: in memory. A statement that may abort half way (an UPDATE of many rows, a
#: multi-row INSERT without ``OR FAIL``: the writer's and the token pass's
#: are ``OR FAIL``, see :func:`insert_or_fail_sql`) runs in a statement
#: transaction whose journal of the pages it changes is written to a file in
#: /var/tmp once past 64 KB: on the benchmark capture, before the inserts
#: were ``OR FAIL``, some 33,000 ``pwrite`` calls (about 130 MB) for a 7 MB
#: database, none in memory. The database file is not affected.
TEMP_STORE = "MEMORY"


def connect(
    path: str, *, read_only: bool = False, immutable: bool | None = None
) -> sqlite3.Connection:
    """Open the SQLite file ``path`` with :func:`set_pragmas` (as ``make_engine``'s
    connections are). The caller has created the file (``ensure_db_file``).
    ``read_only``: through :func:`read_only_uri` (``immutable`` as it says, or as
    :func:`open_read_only` finds), for a reader that may not write the file
    (``sniffer.store.files.cannot_write``)."""
    if read_only:
        if immutable is None:
            return open_read_only(path)[0]
        uri = read_only_uri(path, immutable=immutable)
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    else:
        conn = sqlite3.connect(path, check_same_thread=False)
    try:
        set_pragmas(conn, read_only=read_only)
    except BaseException:
        conn.close()
        raise
    return conn


def open_read_only(path: str) -> tuple[sqlite3.Connection, bool]:
    """A read-only connection to ``path`` and whether it reads the file as
    immutable (:func:`read_only_uri`). A writer that closes the file between the
    look for its ``-wal`` and the open takes them away, and the ``mode=ro`` open
    then fails ("attempt to write a readonly database": it may not create
    them): with no writer left, the file is opened again as immutable."""
    immutable = no_writer(path)
    try:
        return connect(path, read_only=True, immutable=immutable), immutable
    except sqlite3.OperationalError:
        if immutable or not no_writer(path):
            raise
    return connect(path, read_only=True, immutable=True), True


def read_only_uri(path: str, *, immutable: bool | None = None) -> str:
    """The URI that opens ``path`` for reading only: ``mode=ro``, and ``immutable=1``
    when the file has neither ``-wal`` nor ``-shm`` (:func:`no_writer`; the
    caller may have looked already: ``immutable``).

    SQLite (3.22 and later) opens a WAL-mode file read-only when its ``-wal``
    and ``-shm`` exist (a running writer keeps them; a killed one leaves them):
    the reader then shares the writer's WAL index, locks included, and sees
    every committed transaction. Without them, a reader that cannot create
    them (a directory it may not write) gets "attempt to write a readonly
    database" (``SQLITE_READONLY_DIRECTORY``), and one that can would leave
    them behind, owned by the reader (its last close cannot checkpoint), where
    the writer must write them. No ``-wal`` means no writer has the file open
    and every transaction is in the file itself: ``immutable`` reads it as it
    is, without locks and without creating a file. A writer that starts during
    such a read is not seen (nor waited for) by it: :class:`SqliteFile` opens
    the file again before its next query."""
    if immutable is None:
        immutable = no_writer(path)
    opts = "mode=ro&immutable=1" if immutable else "mode=ro"
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?{opts}"


def no_writer(path: str) -> bool:
    """Whether the WAL-mode file ``path`` has neither ``-wal`` nor ``-shm``: no
    connection has it open, and every committed transaction is in the file
    (:func:`read_only_uri` then reads it as immutable)."""
    return not any(os.path.lexists(path + suffix) for suffix in WAL_SUFFIXES)


def set_pragmas(conn: sqlite3.Connection, *, file: bool = True, read_only: bool = False) -> None:
    """The pragmas of every connection to a store, in this order: for a file,
    ``auto_vacuum`` (it takes effect on a new file, so that retention's
    incremental vacuum can return freed pages) and WAL; then
    ``synchronous=NORMAL``, foreign keys off, a 5 s busy timeout and temporary
    files in memory (:data:`TEMP_STORE`). A ``read_only`` connection (a reader
    that may not write the file: :func:`read_only_uri`) skips the first two, the
    ones that write the file; the others are the connection's own.

    The switch to WAL is retried while another process holds the lock, as
    :func:`begin_immediate` is: of several processes opening one new file at
    once, one may find the file's first write under way and get "database is
    locked" at once, without the busy timeout (SQLite gives up at once rather
    than wait while it holds a read lock the writer waits for)."""
    if file and not read_only:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        _retried_while_locked(conn, "PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute(f"PRAGMA temp_store={TEMP_STORE}")


def revision(conn: sqlite3.Connection) -> str | None:
    """The schema revision (``alembic_version``); None when it is missing, empty or
    ambiguous (``migrate`` then decides what to do)."""
    try:
        rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.OperationalError:  # no such table: fresh or v0.1 database
        return None
    return str(rows[0][0]) if len(rows) == 1 else None


#: The schema at the head revision, as the migration chain (``sniffer.store.migrations``)
#: leaves it in ``sqlite_master``, statement for statement: Alembic's own
#: ``alembic_version``, then the text derived from the table specification
#: (``sniffer.store.spec.sqlite_ddl``: columns added by a later migration are
#: appended to the stored text, as ``ALTER TABLE … ADD COLUMN`` leaves it), then
#: 0006's views for reading by hand (``sniffer.store.views``, whose text both use). A test
#: checks the text against what Alembic creates, so the two cannot drift: a new
#: migration must come with its change to the specification.
SCHEMA_DDL: tuple[str, ...] = (
    "CREATE TABLE alembic_version (\n\tversion_num VARCHAR(32) NOT NULL, "
    "\n\tCONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)\n)",
    *spec.sqlite_ddl(REVISIONS),
    *VIEWS["sqlite"],
)

#: The rows the migration chain writes into a new database: the informative
#: ``meta.schema_version`` (``models.SCHEMA_VERSION``), the id counters (one past
#: the largest id: 1 in an empty file) and the Alembic revision stamp.
SCHEMA_ROWS: tuple[str, ...] = (
    f"INSERT INTO meta (\"key\", value) VALUES ('schema_version', '{spec.SCHEMA_VERSION}')",
    "INSERT INTO id_blocks (name, next_id) VALUES ('connections', 1), ('streams', 1)",
    f"INSERT INTO alembic_version (version_num) VALUES ('{REVISIONS[-1]}')",
)


def begin_immediate(conn: sqlite3.Connection) -> None:
    """Take the database's write lock (``BEGIN IMMEDIATE``), retried while another
    process holds it, for up to ``SQLITE_LOCK_WAIT`` seconds (as a migration does)."""
    _retried_while_locked(conn, "BEGIN IMMEDIATE")


def is_locked(exc: BaseException | None) -> bool:
    """SQLite's "database is locked" or "table is locked" (``SQLITE_BUSY``,
    ``SQLITE_LOCKED`` and their extended codes): another connection holds what
    this one needs; worth waiting for, unlike any other error."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _retried_while_locked(conn: sqlite3.Connection, sql: str) -> None:
    """Run ``sql``, again every 50 ms while SQLite says the database is locked,
    for up to ``SQLITE_LOCK_WAIT`` seconds; then the error is raised. Any other
    error (a read-only or full disk, a statement SQLite refuses) is raised at
    once, not after the wait."""
    deadline = time.monotonic() + SQLITE_LOCK_WAIT
    while True:
        try:
            conn.execute(sql)
            return
        except sqlite3.OperationalError as exc:
            if not is_locked(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def create_schema(conn: sqlite3.Connection) -> bool:
    """Create the schema at head in a new file, without SQLAlchemy or Alembic.

    Runs under the write lock and looks again inside it: of several processes
    creating one new file at once, one creates it and the others find it at
    head. Returns True when the file is at head (created here or found so);
    False when it already holds something else (an older schema, or a v0.1 file:
    ``sniffer.store.schema.migrate`` upgrades it), in which case nothing is done.
    ``conn`` comes from :func:`connect` (``auto_vacuum`` set before any table).
    """
    begin_immediate(conn)
    try:
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            at_head = revision(conn) == REVISIONS[-1]
            conn.rollback()
            return at_head
        for sql in (*SCHEMA_DDL, *SCHEMA_ROWS):
            conn.execute(sql)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return True


def create_new_file(path: str) -> None:
    """Create the schema at head in the new, empty SQLite file ``path`` (see
    :func:`create_schema`; a file that holds anything is left as it is)."""
    conn = connect(path)
    try:
        create_schema(conn)
    finally:
        conn.close()


class _Transaction:
    """What a writer's flush needs of a connection: ``exec_driver_sql`` (executemany).

    Every statement runs on one cursor made with the transaction: the
    connection's ``execute``/``executemany`` make a cursor per call (about
    0.6 µs of a one-row INSERT's 3.8; a flush runs several statements per
    stream). The cursor a call returns is read at once (``rowcount``,
    ``fetchall``): the next statement reuses it."""

    __slots__ = ("_cur",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._cur = conn.cursor()

    def exec_driver_sql(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if isinstance(params, list):
            return self._cur.executemany(sql, params)
        return self._cur.execute(sql, params)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """One statement (``sniffer.store.db.Transaction``): its rows, else ``[]``."""
        return self._cur.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One UPDATE or DELETE: the rows it changed."""
        return int(self._cur.execute(sql, params).rowcount)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement once per row of positional parameters."""
        if rows:
            self._cur.executemany(sql, rows)

    def insert_many(self, table: str, columns: tuple[str, ...], rows: list[Any]) -> None:
        """Rows of ``columns`` into ``table`` in their order, several per
        statement (:func:`executemany_sqlite`)."""
        if rows:
            executemany_sqlite(self, *_insert_all(table, columns), rows, INSERT_MANY_ROWS)

    def insert_flat(self, table: str, columns: tuple[str, ...], values: list[Any]) -> None:
        """:meth:`insert_many` of rows given one after another in ``values``
        (:func:`executemany_flat_sqlite`)."""
        if values:
            executemany_flat_sqlite(self, *_insert_all(table, columns), values, INSERT_MANY_ROWS)


@functools.cache
def _insert_all(table: str, columns: tuple[str, ...]) -> tuple[str, int]:
    """:func:`insert_or_fail_sql` of every column a parameter (made once per table)."""
    return insert_or_fail_sql(table, columns)


class ReadOnlyStore(Exception):
    """A store this process may only read, asked for a write: a writing command on
    a file it cannot write, or a reading one on a file not at the schema head
    (which only a writer may migrate). The message is the CLI's one line."""


def check_writable(path: str) -> None:
    """Raise :class:`ReadOnlyStore` when this process may not write the SQLite file
    ``path`` (``sniffer.store.files.cannot_write``): what every writer (the
    daemon, ``replay``, ``prune``, ``tokenize``) checks before SQLite's first
    write would fail with "attempt to write a readonly database"."""
    from sniffer.store.files import cannot_write

    if cannot_write(path):
        raise ReadOnlyStore(
            f"database {path} is read-only for this user (uid {os.geteuid()}) and this "
            "command writes to it: run it as a user who may write the file (its owner)"
        )


class SqliteFile(Store):
    """One SQLite file opened with the standard library's driver (thread-safe: one
    connection, one transaction at a time): the store of a SQLite file at the
    schema head (``sniffer.store.db.Store``). ``name`` is the dialect's."""

    name = "sqlite"
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    integrity_errors: tuple[type[BaseException], ...] = (sqlite3.IntegrityError,)

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        self.path = path
        #: opened for reading only (:func:`read_only_uri`): never written, never migrated
        self.read_only = read_only
        #: read as immutable (no writer had it open): opened again once one has
        self._immutable = False
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._engine: Engine | None = None
        self._connection()  # opened now: an unreadable file fails here

    @property
    def engine(self) -> Engine:
        """A SQLAlchemy engine on this file, made on first use (``make_engine``) and
        released by :meth:`close`: this file needs none for what it runs itself.
        Read-only, its connections are this file's (:func:`connect`), and nothing
        is created nor migrated."""
        if self._engine is None:
            if self.read_only:
                from sqlalchemy import create_engine

                path = self.path
                self._engine = create_engine(
                    self.url, creator=lambda: connect(path, read_only=True)
                )
            else:
                from sniffer.store.opening import make_engine

                self._engine = make_engine(self.path)
        return self._engine

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._immutable and not no_writer(self.path):
            # A writer opened the file since: an immutable connection would not
            # see its transactions, and could read a page its checkpoint is
            # rewriting (``top`` started before the daemon). Reopened read-only,
            # it shares the writer's WAL index and locks.
            self._conn.close()
            self._conn = None
        if self._conn is None:
            if self.read_only:
                self._conn, self._immutable = open_read_only(self.path)
            else:
                self._conn = connect(self.path)
        return self._conn

    def revision(self) -> str | None:
        with self._lock:
            return revision(self._connection())

    def create_schema(self) -> bool:
        """:func:`create_schema` on this file: True when it is (now) at head.
        Read-only: :meth:`migrate`'s check, nothing created."""
        if self.read_only:
            self.migrate()
            return True
        with self._lock:
            return create_schema(self._connection())

    def migrate(self) -> None:
        """One query at head (where ``open_store`` leaves a file); else the
        migrations, on an engine made for them. Read-only, a file not at head
        raises :class:`ReadOnlyStore` (its writer migrates it)."""
        current = self.revision()
        if current == REVISIONS[-1]:
            return
        if self.read_only:
            from sniffer.store.schema import SCRIPT_LOCATION, _check_known

            _check_known(current, SCRIPT_LOCATION)  # newer: SchemaTooNew, as a writer says
            raise ReadOnlyStore(
                f"database {self.path} is read-only for this user and its schema is at "
                f"revision {current or 'none'}, not {REVISIONS[-1]} (this sparseety's): "
                "a reading command does not migrate it; open it once with write access "
                "(its writer, 'sparseety run' or 'replay', or any command as its owner)"
            )
        from sniffer.store.schema import migrate

        migrate(self.engine)

    def sqlite_script(self, sql: str) -> None:
        with self._lock:
            conn = self._connection()
            conn.commit()
            conn.executescript(sql)

    def transaction(self) -> Any:
        """:meth:`begin` (``sniffer.store.db.Store.transaction``)."""
        return self.begin()

    @contextmanager
    def begin(self) -> Iterator[_Transaction]:
        """A transaction: committed when the block ends, rolled back if it raises."""
        with self._lock:
            conn = self._connection()
            try:
                yield _Transaction(conn)
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    @property
    def url(self) -> str:
        """The file's SQLAlchemy URL (what ``str(make_engine(path).url)`` says)."""
        return f"sqlite:///{self.path}"

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """All rows of a query, as the driver returns them (tuples; booleans as 0/1)."""
        with self._lock:
            return self._connection().execute(sql, params).fetchall()

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row of a query (None without a row)."""
        with self._lock:
            row = self._connection().execute(sql, params).fetchone()
        return None if row is None else row[0]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None


__all__ = [
    "BOOLEAN_COLUMNS",
    "INSERT_MANY_ROWS",
    "PLAIN_HTTP",
    "SCHEMA_DDL",
    "SCHEMA_ROWS",
    "TABLE_COLUMNS",
    "ReadOnlyStore",
    "SqliteFile",
    "begin_immediate",
    "check_writable",
    "connect",
    "create_new_file",
    "create_schema",
    "executemany_sqlite",
    "insert_or_fail_sql",
    "insert_sql",
    "is_locked",
    "multi_row_sql",
    "no_writer",
    "read_only_uri",
    "revision",
    "update_spec",
    "update_sql",
]
