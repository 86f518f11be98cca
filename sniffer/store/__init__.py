"""The store: the only stage that touches the database.

``spec`` is the table specification (every table, column and index, documented
there, without SQLAlchemy): ``models`` builds the SQLAlchemy tables from it and
``lite`` the DDL of a new SQLite file. ``schema`` runs the versioned migrations
(``migrations/``, Alembic) under a lock. ``db`` is the :class:`Store` every reader
gets (``opening.open_store(url)``): a SQLite file through the standard library's
driver (``lite.SqliteFile``, so that commands start without importing SQLAlchemy)
or an engine; ``queries`` (the read side of the reports and the CLI), ``ids``
(the collision-free connection and stream ids) and ``checkpoints`` are written
once on it. ``opening`` opens a store (or an engine), ``writer`` is the batched
writer, ``tokens_store`` the token pass's tables and queries.

The names below are loaded on first use: importing a submodule (the writer)
does not import SQLAlchemy through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sniffer.store.models import (
        SCHEMA_VERSION,
        chunks,
        connections,
        errors,
        id_blocks,
        meta,
        metadata,
        streams,
    )
    from sniffer.store.opening import make_engine
    from sniffer.store.schema import SchemaTooNew, migrate
    from sniffer.store.writer import StoreError, StoreWriter

_WHERE = {
    "SCHEMA_VERSION": "models",
    "chunks": "models",
    "connections": "models",
    "errors": "models",
    "id_blocks": "models",
    "meta": "models",
    "metadata": "models",
    "streams": "models",
    "SchemaTooNew": "schema",
    "migrate": "schema",
    "StoreError": "writer",
    "StoreWriter": "writer",
    "make_engine": "opening",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "SCHEMA_VERSION",
    "SchemaTooNew",
    "StoreError",
    "StoreWriter",
    "chunks",
    "connections",
    "errors",
    "id_blocks",
    "make_engine",
    "meta",
    "metadata",
    "migrate",
    "streams",
]
