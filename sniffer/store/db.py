"""The store as one object: what every query of ``sniffer.store`` runs on.

A :class:`Store` runs SQL text with ``?`` placeholders and positional parameters
and returns plain tuples; the queries are written once on it, in SQL that both
SQLite and PostgreSQL take: the read side (``queries``, ``live``), the token
pass's (``tokens_store``), retention, checkpoints and id blocks. Writes run in
:meth:`Store.transaction` (``execute``, ``run`` for a row count, ``executemany``).
Two kinds:

- ``sniffer.store.lite.SqliteFile``: a SQLite file at the schema head through the
  standard library's driver (no SQLAlchemy import: the start-up goal);
- :class:`EngineStore`: any SQLAlchemy engine (PostgreSQL, in-memory SQLite, a
  URL with options), the ``?`` placeholders bound as named parameters of
  ``sqlalchemy.text``.

Callers get a store (``sniffer.store.opening.open_store``), never an engine. No
SQLAlchemy import at module load.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from sniffer.store.spec import BOOLEAN_COLUMNS, TABLE_COLUMNS

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import Connection

__all__ = ["EngineStore", "Store", "Transaction", "in_list"]


class Transaction(Protocol):
    """What :meth:`Store.transaction` yields: statements run in one transaction."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement; its rows (``RETURNING``, ``SELECT``), else ``[]``."""
        ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one ``UPDATE`` or ``DELETE``; the number of rows it changed."""
        ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement (an ``INSERT``) once per row of positional parameters,
        straight through the driver (no parameter dict per row where its
        placeholders are ``?``)."""
        ...

    def insert_many(self, table: str, columns: tuple[str, ...], rows: list[Any]) -> None:
        """Insert rows of positional values of ``columns`` into ``table``, in
        their order: the ids the database gives are those of one statement per
        row, and a row that fails leaves the rows before it written. On SQLite
        several rows per statement (``sniffer.store.lite.executemany_sqlite``:
        each statement run costs the driver about as much as a short row)."""
        ...

    def insert_flat(self, table: str, columns: tuple[str, ...], values: list[Any]) -> None:
        """:meth:`insert_many` of rows given one after another in ``values``
        (``len(columns)`` values per row): no tuple per row to make where the
        rows come as columns (``sniffer.store.lite.executemany_flat_sqlite``)."""
        ...


def in_list(values: Sequence[Any]) -> str:
    """``(?, ?, …)``: the placeholders of an ``IN`` list of ``values``."""
    return f"({', '.join('?' * len(values))})"


class Store:
    """A database the queries run on: :meth:`query` is what a kind provides."""

    #: the database's dialect ("sqlite", "postgresql")
    name: str = ""
    #: what the driver raises for any failed statement, and for a row that breaks a
    #: constraint (a duplicate key): ``except store.errors`` needs no driver import
    errors: tuple[type[BaseException], ...] = ()
    integrity_errors: tuple[type[BaseException], ...] = ()
    #: opened for reading only (a SQLite file this process may not write:
    #: ``sniffer.store.lite.read_only_uri``): its users skip their writes
    read_only: bool = False

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

    def migrate(self) -> None:
        """Bring the database to this code's schema (``sniffer.store.schema.migrate``,
        under its lock); one query when it is there already."""
        raise NotImplementedError

    def sqlite_script(self, sql: str) -> None:
        """Run ``sql`` as a script on a SQLite database (``sqlite3``'s
        ``executescript``: a row-less pragma such as ``incremental_vacuum`` runs
        to completion, where ``execute`` steps it once). SQLite only."""
        raise NotImplementedError

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine of the database, for the migrations: made on first
        use where the store has none."""
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
        from sqlalchemy.exc import IntegrityError, SQLAlchemyError

        self._engine = engine
        self.name = engine.dialect.name
        self._owned = owned
        self.errors = (SQLAlchemyError,)
        self.integrity_errors = (IntegrityError,)

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

    def migrate(self) -> None:
        from sniffer.store.schema import migrate

        migrate(self.engine)

    def sqlite_script(self, sql: str) -> None:
        if self.name != "sqlite":
            raise ValueError(f"a SQLite script on a {self.name} database")
        with self.engine.connect() as conn:
            conn.commit()
            raw: Any = conn.connection.dbapi_connection
            raw.executescript(sql)

    def close(self) -> None:
        if self._owned:
            self.engine.dispose()


def _named(sql: str, count: int) -> str:
    """``sql`` with its ``?`` placeholders as the named parameters ``:p0``, ``:p1``, …
    of ``sqlalchemy.text``, whatever the driver's own style."""
    parts = sql.split("?")
    if len(parts) - 1 != count:
        raise ValueError(f"{count} parameters for {len(parts) - 1} placeholders")
    return parts[0] + "".join(f":p{i}{part}" for i, part in enumerate(parts[1:]))


def _bound(sql: str, params: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
    from sqlalchemy import text

    return text(_named(sql, len(params))), {f"p{i}": v for i, v in enumerate(params)}


def _execute(conn: Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    result = conn.execute(*_bound(sql, params))
    return [tuple(row) for row in result] if result.returns_rows else []


class _EngineTransaction:
    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return _execute(self._conn, sql, params)

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self._conn.execute(*_bound(sql, params)).rowcount)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        if self._conn.dialect.paramstyle == "qmark":  # the driver takes the text as it is
            self._conn.exec_driver_sql(sql, [tuple(row) for row in rows])
            return
        from sqlalchemy import text

        stmt = text(_named(sql, len(rows[0])))
        self._conn.execute(stmt, [{f"p{i}": v for i, v in enumerate(row)} for row in rows])

    def insert_many(self, table: str, columns: tuple[str, ...], rows: list[Any]) -> None:
        if not rows:
            return
        from sniffer.store import lite  # (imports this module)

        if self._conn.dialect.name == "sqlite":
            lite.executemany_sqlite(
                self._conn, *lite.insert_or_fail_sql(table, columns), rows, lite.INSERT_MANY_ROWS
            )
        else:
            self.executemany(lite.insert_sql(table, columns), rows)

    def insert_flat(self, table: str, columns: tuple[str, ...], values: list[Any]) -> None:
        if not values:
            return
        from sniffer.store import lite  # (imports this module)

        if self._conn.dialect.name == "sqlite":
            lite.executemany_flat_sqlite(
                self._conn, *lite.insert_or_fail_sql(table, columns), values, lite.INSERT_MANY_ROWS
            )
        else:
            k = len(columns)
            self.executemany(
                lite.insert_sql(table, columns),
                [values[i : i + k] for i in range(0, len(values), k)],
            )
