"""The store as one object: what the read side (``sniffer.store.queries``) runs on.

A :class:`Store` runs SQL text with ``?`` placeholders and positional parameters
and returns plain tuples; the queries are written once on it, in SQL that both
SQLite and PostgreSQL take. Two kinds:

- ``sniffer.store.lite.SqliteFile``: a SQLite file at the schema head through the
  standard library's driver (no SQLAlchemy import: the start-up goal);
- :class:`EngineStore`: any SQLAlchemy engine (PostgreSQL, in-memory SQLite, a
  URL with options), the ``?`` placeholders bound as named parameters of
  ``sqlalchemy.text``.

:func:`as_store` turns an engine given by a caller into a store. No SQLAlchemy
import at module load.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from sniffer.store.spec import BOOLEAN_COLUMNS, TABLE_COLUMNS

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import Connection

__all__ = ["EngineStore", "Store", "Transaction", "as_store", "engine_of", "in_list"]


class Transaction(Protocol):
    """What :meth:`Store.transaction` yields: statements run in one transaction."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement; its rows (``RETURNING``, ``SELECT``), else ``[]``."""
        ...


def in_list(values: Sequence[Any]) -> str:
    """``(?, ?, …)``: the placeholders of an ``IN`` list of ``values``."""
    return f"({', '.join('?' * len(values))})"


class Store:
    """A database the queries run on: :meth:`query` is what a kind provides."""

    #: the database's dialect ("sqlite", "postgresql")
    name: str = ""

    @property
    def url(self) -> str:
        raise NotImplementedError

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """All rows of a query as tuples (booleans as the driver gives them)."""
        raise NotImplementedError

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row of a query (None without a row)."""
        rows = self.query(sql, params)
        return rows[0][0] if rows else None

    def transaction(self) -> Any:
        """A context manager yielding a :class:`Transaction`: committed when the
        block ends, rolled back if it raises."""
        raise NotImplementedError

    def select(
        self,
        table: str,
        where: Sequence[tuple[str, Any]] = (),
        order_by: Sequence[str] = ("id",),
        limit: int | None = None,
        *,
        descending: bool = False,
    ) -> list[dict[str, Any]]:
        """Whole rows of ``table`` as dicts keyed by column, booleans as ``bool``:
        ``where`` pairs are ``column = value``, or ``column IN (values)`` for a list;
        ``descending`` orders by ``order_by`` from the last."""
        cols = TABLE_COLUMNS[table]
        clauses: list[str] = []
        params: list[Any] = []
        for col, value in where:
            if isinstance(value, list):
                if not value:
                    return []
                clauses.append(f"{table}.{col} IN {in_list(value)}")
                params.extend(value)
            else:
                clauses.append(f"{table}.{col} = ?")
                params.append(value)
        sql = f"SELECT {', '.join(f'{table}.{c}' for c in cols)} FROM {table}"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        order = " DESC" if descending else ""
        sql += " ORDER BY " + ", ".join(f"{table}.{c}{order}" for c in order_by)
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [
            as_bools(dict(zip(cols, row, strict=True)), table) for row in self.query(sql, params)
        ]

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine of the database, for what runs on one (the token
        pass, retention): made on first use where the store has none."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the connections this store opened."""


def as_bools(
    row: dict[str, Any], table: str, columns: Sequence[str] | None = None
) -> dict[str, Any]:
    """``row`` with the boolean columns of ``table`` (or only ``columns``) read back
    as ``bool``, NULL kept (what SQLAlchemy does)."""
    for col in BOOLEAN_COLUMNS[table] if columns is None else columns:
        value = row.get(col)
        if value is not None:
            row[col] = bool(value)
    return row


class EngineStore(Store):
    """A store on a SQLAlchemy engine (its connections pooled by the engine)."""

    def __init__(self, engine: Engine, *, owned: bool = False) -> None:
        self._engine = engine
        self.name = engine.dialect.name
        self._owned = owned

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def url(self) -> str:
        return str(self.engine.url)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self.engine.connect() as conn:
            return _execute(conn, sql, params)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self.engine.begin() as conn:
            yield _EngineTransaction(conn)

    def close(self) -> None:
        if self._owned:
            self.engine.dispose()


def as_store(db: Store | Engine) -> Store:
    """``db`` as a store: a store as it is, an engine wrapped (:class:`EngineStore`)."""
    return db if isinstance(db, Store) else EngineStore(db)


def _execute(conn: Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """``sql`` with its ``?`` placeholders bound as named parameters (``:p0``, …)
    of ``sqlalchemy.text``, whatever the driver's own style."""
    from sqlalchemy import text

    parts = sql.split("?")
    if len(parts) - 1 != len(params):
        raise ValueError(f"{len(params)} parameters for {len(parts) - 1} placeholders")
    named = parts[0] + "".join(f":p{i}{part}" for i, part in enumerate(parts[1:]))
    result = conn.execute(text(named), {f"p{i}": v for i, v in enumerate(params)})
    return [tuple(row) for row in result] if result.returns_rows else []


class _EngineTransaction:
    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return _execute(self._conn, sql, params)


def engine_of(db: Store | Engine) -> Engine:
    """The SQLAlchemy engine of a store (``Store.engine``), or ``db`` when it is one:
    for what runs on an engine (the token pass, retention)."""
    return db.engine if isinstance(db, Store) else db
