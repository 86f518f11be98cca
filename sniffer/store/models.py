"""The database schema: SQLAlchemy Core tables on one ``MetaData``.

Core tables (not ORM classes) because the chunk insert is the hot path. Only
portable types are used, so the same schema runs on SQLite (the embedded
default, WAL mode) and on PostgreSQL (one central database for a fleet).
JSON values are stored as text. Times are capture timestamps: float seconds
since the Unix epoch (UTC).

The tables, their columns and their documentation are in the table
specification (``sniffer.store.spec``); this module builds the SQLAlchemy
``Table`` of each there, with the same names, types and indexes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

from sniffer.store import spec
from sniffer.store.lite import PLAIN_HTTP as _PLAIN_HTTP

SCHEMA_VERSION = spec.SCHEMA_VERSION

#: ``streams.dialect`` of an exchange that is not an LLM stream (plain HTTP):
#: the store's spelling of ``StreamOpened.dialect is None`` (defined in ``lite``,
#: which the writers import without SQLAlchemy).
PLAIN_HTTP = _PLAIN_HTTP

metadata = MetaData()

#: 64-bit ids on PostgreSQL; plain INTEGER on SQLite so that an integer primary
#: key stays the rowid alias (BIGINT would lose SQLite's autoincrement).
Id = BigInteger().with_variant(Integer(), "sqlite")

_TYPES: dict[str, Any] = {
    "id": Id,
    "int": Integer,
    "bigint": BigInteger,
    "float": Float,
    "bool": Boolean,
    "text": Text,
}


def _column(t: spec.TableSpec, c: spec.Col) -> Column[Any]:
    type_ = String(c.length) if c.type == "str" else _TYPES[c.type]
    if c.name in t.primary_key:
        if c.type == "str":  # a text key: SQLAlchemy's default
            return Column(c.name, type_, primary_key=True)
        return Column(c.name, type_, primary_key=True, autoincrement=t.autoincrement)
    return Column(c.name, type_, nullable=c.nullable)


def _table(name: str) -> Table:
    t = spec.TABLES[name]
    return Table(
        name,
        metadata,
        *(_column(t, c) for c in t.columns),
        *(Index(ix.name, *ix.columns) for ix in t.indexes),
    )


connections = _table("connections")
streams = _table("streams")
chunks = _table("chunks")
errors = _table("errors")
meta = _table("meta")
stream_tokens = _table("stream_tokens")
choice_tokens = _table("choice_tokens")
token_anomalies = _table("token_anomalies")
id_blocks = _table("id_blocks")
checkpoints = _table("checkpoints")

__all__ = [
    "SCHEMA_VERSION",
    "checkpoints",
    "choice_tokens",
    "chunks",
    "connections",
    "errors",
    "id_blocks",
    "meta",
    "metadata",
    "stream_tokens",
    "streams",
    "token_anomalies",
]
