"""Schema creation and upgrades: Alembic migrations, run under a lock.

Every process that opens the store (``make_engine``) calls :func:`migrate`.
A SQLite file opened by the writer or ``open_store`` is first checked with
the standard library's driver (``sniffer.store.lite.revision``, one query, no
SQLAlchemy), and a new, empty one is created at head there
(``sniffer.store.lite.create_schema``); only a file that holds an older schema
comes here.

1. Without any lock, read the database's revision (``alembic_version``). At
   this code's head: done (the common case costs one query).
2. A revision this code does not know comes from a newer sparseety: refuse
   with :class:`SchemaTooNew`, a one-line message, before touching anything.
3. Otherwise take the migration lock, read the revision again (another
   process may have migrated meanwhile) and upgrade to head inside the
   same transaction:

   - PostgreSQL: ``pg_advisory_xact_lock`` (a transaction-scoped advisory
     lock, released by the commit). DDL is transactional there, so a
     sidecar that waits sees either nothing or the whole migrated schema;
     several sidecars starting together against one fresh database all
     start, one of them creates the schema (no ``UniqueViolation``).
   - SQLite: ``BEGIN IMMEDIATE`` (the database's write lock), retried while
     another process holds it (any other error is raised at once).

A v0.1 database has tables but no ``alembic_version``: it is upgraded from
the start of the chain, whose first step (``0001``) creates only what is
missing, so it is recognised and upgraded in place.

The migrations live in ``sniffer/store/migrations`` (package data) and run
programmatically; no ``alembic.ini`` is needed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory
    from sqlalchemy import Engine
    from sqlalchemy.engine import Connection

#: Key of the PostgreSQL advisory lock that serialises migrations ("sparseety").
ADVISORY_LOCK_KEY = 0x5350_4152_5345_4554 & 0x7FFF_FFFF_FFFF_FFFF

#: Seconds a SQLite migration waits for another process's write lock.
SQLITE_LOCK_WAIT = 120.0

SCRIPT_LOCATION = "sniffer.store:migrations"

#: The revisions of the packaged chain, oldest first. Known without importing
#: Alembic, so that opening a database at head costs one query and no import
#: (tests check this against the scripts in ``migrations/versions``).
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006")


class SchemaTooNew(Exception):
    """The database was migrated by a newer sparseety; this one refuses to touch it."""


def alembic_config(script_location: str = SCRIPT_LOCATION) -> AlembicConfig:
    """An Alembic configuration without any file, pointing at the packaged migrations."""
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", script_location)
    return cfg


@functools.lru_cache(maxsize=4)
def _script(script_location: str) -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(script_location))


def head_revision(script_location: str = SCRIPT_LOCATION) -> str:
    """The latest revision this code knows."""
    if script_location == SCRIPT_LOCATION:
        return REVISIONS[-1]
    head = _script(script_location).get_current_head()
    assert head is not None
    return head


def current_revision(conn: Connection) -> str | None:
    """The database's revision (``alembic_version``); ``None`` for a fresh or a
    v0.1 database."""
    from sqlalchemy import inspect

    if not inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    if len(rows) > 1:
        raise SchemaTooNew(f"the database has several schema heads ({', '.join(rows)})")
    return str(rows[0]) if rows else None


def _known(current: str, script_location: str) -> bool:
    if script_location == SCRIPT_LOCATION:
        return current in REVISIONS
    from alembic.util.exc import CommandError

    try:
        return _script(script_location).get_revision(current) is not None
    except CommandError:
        return False


def _check_known(current: str | None, script_location: str) -> None:
    if current is None:
        return
    if not _known(current, script_location):
        raise SchemaTooNew(
            f"the database schema is at revision {current}, newer than this sparseety knows "
            f"(latest {head_revision(script_location)}): upgrade sparseety to use this database"
        )


@contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction that holds the migration lock."""
    from sqlalchemy.exc import OperationalError

    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})")
        elif engine.dialect.name == "sqlite":
            from sniffer.store.lite import is_locked

            deadline = time.monotonic() + SQLITE_LOCK_WAIT
            while True:
                try:
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                    break
                except OperationalError as exc:
                    conn.rollback()
                    if not is_locked(exc.orig) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        yield conn
        conn.commit()


def migrate(engine: Engine, *, script_location: str = SCRIPT_LOCATION) -> str | None:
    """Bring the database to this code's head revision; returns the revision it
    was at before (``None``: fresh or v0.1), or the head when nothing was done.

    Raises :class:`SchemaTooNew` for a database migrated by a newer version.
    """
    head = head_revision(script_location)
    with engine.connect() as conn:
        current = current_revision(conn)
    if current == head:
        return head
    _check_known(current, script_location)
    with _locked(engine) as conn:
        current = current_revision(conn)
        if current == head:
            return head
        _check_known(current, script_location)
        from alembic import command

        cfg = alembic_config(script_location)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return current


__all__ = [
    "ADVISORY_LOCK_KEY",
    "REVISIONS",
    "SchemaTooNew",
    "alembic_config",
    "current_revision",
    "head_revision",
    "migrate",
]
