"""The store: the only stage that touches the database.

``models`` holds the schema (documented there), ``writer`` the batched writer,
``queries`` the read side used by the reports and the CLI.
"""

from sniffer.store.models import (
    SCHEMA_VERSION,
    chunks,
    connections,
    errors,
    meta,
    metadata,
    streams,
)
from sniffer.store.writer import StoreError, StoreWriter, make_engine

__all__ = [
    "SCHEMA_VERSION",
    "StoreError",
    "StoreWriter",
    "chunks",
    "connections",
    "errors",
    "make_engine",
    "meta",
    "metadata",
    "streams",
]
