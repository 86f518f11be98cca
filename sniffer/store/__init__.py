"""The store: the only stage that touches the database.

``models`` holds the schema (documented there), ``schema`` runs its versioned
migrations (``migrations/``, Alembic) under a lock, ``ids`` reserves the
collision-free connection and stream ids, ``writer`` is the batched writer,
``queries`` the read side used by the reports and the CLI. ``lite`` opens a
SQLite file with the standard library's driver, so that the writers start
without importing SQLAlchemy.

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
    from sniffer.store.schema import SchemaTooNew, migrate
    from sniffer.store.writer import StoreError, StoreWriter, make_engine

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
    "make_engine": "writer",
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
