"""Opening a store: a SQLite path or database URL → :class:`~sniffer.store.db.Store`
(``open_store``, what every command reads through) or a SQLAlchemy engine at
the schema head (``make_engine``).

Apart from :mod:`sniffer.store.writer` (which uses them) so that the commands
that only read (``streams``, ``show``, ``stats``, ``verify``) open their store
without importing the writer and the pipeline's event classes it writes (~15 ms
of their start-up).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from sniffer.store.db import EngineStore, Store
from sniffer.store.files import cannot_write, db_path, ensure_db_file
from sniffer.store.lite import SqliteFile, check_writable, create_new_file, set_pragmas

if TYPE_CHECKING:
    from sqlalchemy import Engine

__all__ = ["create_schema", "make_engine", "open_store"]


def _is_sqlite_memory(url: str) -> bool:
    return url in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in url


def make_engine(url_or_path: str) -> Engine:
    """An engine for a database URL, or for a SQLite file when given a plain path.

    A SQLite file that does not exist yet is created 0600 first (its -wal/-shm
    then get the same mode); a symlink at the path is refused
    (``sniffer.store.files.ensure_db_file``).
    SQLite connections get the store's pragmas (``sniffer.store.lite.set_pragmas``:
    WAL for a file, ``synchronous=NORMAL``, foreign keys off, a 5 s busy
    timeout, temporary files in memory). The tables are created if missing: a
    new, empty SQLite file at head with the standard library's driver
    (``sniffer.store.lite.create_schema``), anything else by the migrations.
    Example: ``make_engine("capture.db")``, ``make_engine("postgresql+psycopg://…")``.
    """
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import StaticPool

    url = url_or_path if "://" in url_or_path else f"sqlite:///{url_or_path}"
    if url.startswith("sqlite"):
        memory = _is_sqlite_memory(url) or url_or_path == ":memory:"
        path = None if memory else db_path(url_or_path)
        if path is not None:
            ensure_db_file(path)  # created 0600 before SQLite opens it; no symlink
            if os.path.getsize(path) == 0:  # new: created at head without Alembic
                create_new_file(path)
        if memory:
            engine = create_engine(
                url,
                poolclass=StaticPool,
                connect_args={"check_same_thread": False},
            )
        else:
            engine = create_engine(url)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            set_pragmas(dbapi_conn, file=not memory)

    else:
        engine = create_engine(url, pool_pre_ping=True)
    create_schema(engine)
    return engine


def create_schema(engine: Engine) -> None:
    """Bring the database to this code's schema (``sniffer.store.schema.migrate``):
    versioned Alembic migrations under a lock; raises ``SchemaTooNew`` for a
    database a newer sparseety migrated."""
    from sniffer.store.schema import migrate

    migrate(engine)


def _sqlite_file(url_or_path: str) -> str | None:
    """The file of a SQLite path or plain ``sqlite:///`` URL the writer can open with
    the standard library's driver (``sniffer.store.lite``); None for anything else
    (PostgreSQL, in-memory, a URL with options)."""
    if "://" in url_or_path and (
        not url_or_path.startswith("sqlite:///")
        or "?" in url_or_path
        or "mode=memory" in url_or_path
    ):
        return None
    return db_path(url_or_path)


def open_store(url_or_path: str, *, reads_only: bool = False) -> Store:
    """The store of a SQLite path or database URL (``sniffer.store.db``): a SQLite
    file at the schema head through the standard library's driver
    (``sniffer.store.lite``: the queries run without SQLAlchemy); anything else on
    an engine (``make_engine``: migrated first, as every command does; released by
    ``close``).

    ``reads_only``: the caller never writes (the reading commands). A SQLite file
    this process may not write (``sniffer.store.files.cannot_write``: a reader
    group's store, a read-only mount) is then opened read-only, as it is: not
    created, not migrated (``lite.ReadOnlyStore`` when it is not at head). Without
    it such a file raises ``ReadOnlyStore`` at once. A file the process may write
    is opened as every writer opens it, whatever ``reads_only`` says."""
    path = _sqlite_file(url_or_path)
    if path is None:
        return EngineStore(make_engine(url_or_path), owned=True)
    store, engine = _open_sqlite(url_or_path, path, reads_only=reads_only)
    if engine is None:
        return store
    store.close()
    return EngineStore(engine, owned=True)


def _open_sqlite(
    url_or_path: str, path: str, *, reads_only: bool = False
) -> tuple[SqliteFile, Engine | None]:
    """Open a SQLite file for writing without SQLAlchemy when its schema is at head
    (one query) or the file is new (created at head, ``lite.create_schema``);
    otherwise migrate it first through ``make_engine`` (returned). A file this
    process may not write is opened read-only for a caller that ``reads_only``,
    else refused (``ReadOnlyStore``), before SQLite tries a write."""
    from sniffer.store.schema import REVISIONS

    ensure_db_file(path)  # created 0600 before SQLite opens it; no symlink
    read_only = reads_only and cannot_write(path)
    if not read_only:
        check_writable(path)
    store = SqliteFile(path, read_only=read_only)
    try:
        if store.revision() == REVISIONS[-1] or store.create_schema():
            return store, None
        return store, make_engine(url_or_path)  # migrates, or refuses a newer schema
    except BaseException:
        store.close()
        raise
