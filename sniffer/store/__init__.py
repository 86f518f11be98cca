"""The store: the only stage that touches the database.

``models`` holds the schema (documented there), ``schema`` runs its versioned
migrations (``migrations/``, Alembic) under a lock, ``ids`` reserves the
collision-free connection and stream ids, ``writer`` is the batched writer,
``queries`` the read side used by the reports and the CLI.
"""

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
