"""Retention: delete old streams in small batches, and give the space back.

``prune`` deletes every stream whose request was captured before ``now -
older_than``, together with its chunks and errors, then the connections left
without streams and the stream-less errors of the same age. Each batch of at
most ``batch`` stream ids is its own short transaction, so a writer waiting on
the database (the daemon's flush, SQLite's single writer lock) waits for one
batch at most, never for the whole prune. ``max_batches`` bounds one call: the
daemon's background job calls ``prune(…, max_batches=1)`` on a timer and stops
early when ``PruneResult.done`` is false, picking up on the next tick.

``vacuum`` runs ``PRAGMA incremental_vacuum`` on SQLite, which returns the
pages freed by the deletes to the file system without rewriting the file (no
long lock) — provided the database was created with ``auto_vacuum =
INCREMENTAL``; see :func:`ensure_incremental_vacuum`. On other databases it
does nothing (PostgreSQL's autovacuum does that job).

Transactions stay small on every database: a batch is at most ``batch``
streams AND at most ``max_rows`` chunk rows (from the streams'
``event_count``; a single bigger stream still goes alone), so on a shared
PostgreSQL database a prune never holds row locks on millions of chunks or
bloats one transaction. With ``node`` only that sidecar's rows (and rows
written before nodes existed, whose node is NULL) are deleted: the daemons
of a fleet each prune their own rows and never contend for the same ones;
``sparseety prune`` without ``--node`` prunes every node's.

Times are capture timestamps (``streams.t_request``, ``connections.opened_at``,
``errors.ts``), compared with the ``now`` the caller passes in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sniffer.store.db import Store, Transaction, in_list

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_AGE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", re.IGNORECASE)

#: SQLite ``auto_vacuum`` value for INCREMENTAL.
_AUTO_VACUUM_INCREMENTAL = 2


def parse_age(value: str) -> float:
    """Seconds in an age like ``"7d"``, ``"12h"``, ``"30m"``, ``"90s"`` or ``"2w"``.

    A decimal number (``"1.5h"``) is allowed; the unit is required.
    Raises ``ValueError`` naming the bad value and the accepted form.
    """
    m = _AGE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(
            f"invalid age {value!r}: expected a number followed by a unit "
            "s, m, h, d or w (for example 90s, 30m, 12h, 7d, 2w)"
        )
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass
class PruneResult:
    """Rows deleted by one ``prune`` call."""

    streams: int = 0
    chunks: int = 0
    errors: int = 0
    connections: int = 0
    batches: int = 0
    done: bool = True  # False when max_batches stopped the call with rows left

    @property
    def rows(self) -> int:
        return self.streams + self.chunks + self.errors + self.connections


#: The tables of a stream's rows, deleted before the stream (``stream_id``).
_STREAM_TABLES = ("chunks", "errors", "token_anomalies", "choice_tokens", "stream_tokens")


def _mine(table: str, node: str | None) -> tuple[str, list[str]]:
    """The condition (`` AND …``) and parameters of ``node``'s rows of ``table``
    (and those written before nodes existed, whose node is NULL)."""
    if node is None:
        return "", []
    return f" AND ({table}.node = ? OR {table}.node IS NULL)", [node]


def _delete_ids(tx: Transaction, table: str, column: str, ids: list[int]) -> int:
    return tx.run(f"DELETE FROM {table} WHERE {table}.{column} IN {in_list(ids)}", ids)


def prune(
    store: Store,
    older_than: float,
    *,
    now: float,
    batch: int = 500,
    max_batches: int | None = None,
    node: str | None = None,
    max_rows: int = 20_000,
    progress: Callable[[int, int], None] | None = None,
) -> PruneResult:
    """Delete streams with ``t_request < now - older_than`` (and what hangs off them).

    Order per batch (one transaction each): the chunks and errors of up to
    ``batch`` streams, then those streams. After the streams: connections
    opened before the cutoff that no stream refers to any more, and errors
    without a stream captured before the cutoff, also in batches.
    ``progress(streams deleted, streams to delete)`` is called after each batch
    of streams. Example: ``prune(open_store("capture.db"), parse_age("7d"), now=time.time())``.
    """
    if older_than < 0:
        raise ValueError(f"older_than must be >= 0 seconds, got {older_than}")
    batch = max(1, batch)
    result = PruneResult()
    cutoff = now - older_than
    total = 0
    if progress is not None:
        mine, mine_params = _mine("streams", node)
        total = int(
            store.scalar(
                f"SELECT count(*) FROM streams WHERE streams.t_request < ?{mine}",
                [cutoff, *mine_params],
            )
            or 0
        )

    def streams_step() -> bool:
        found = _prune_streams(store, cutoff, node, batch, max(1, max_rows), result)
        if found and progress is not None:
            progress(min(result.streams, total), total)
        return found >= batch

    steps = (
        streams_step,
        lambda: _prune_connections(store, cutoff, node, batch, result),
        lambda: _prune_errors(store, cutoff, node, batch, result),
    )
    for step in steps:
        while True:
            if max_batches is not None and result.batches >= max_batches:
                result.done = False
                return result
            if not step():
                break
    return result


def _prune_streams(
    store: Store,
    cutoff: float,
    node: str | None,
    batch: int,
    max_rows: int,
    result: PruneResult,
) -> int:
    """One batch of old streams with their chunks, errors and token rows; the
    number of old streams found for it (0: none was left)."""
    mine, mine_params = _mine("streams", node)
    with store.transaction() as tx:
        found = tx.execute(
            "SELECT streams.id, streams.event_count FROM streams "
            f"WHERE streams.t_request < ?{mine} ORDER BY streams.id LIMIT ?",
            [cutoff, *mine_params, batch],
        )
        if not found:
            return 0
        ids: list[int] = []
        rows = 0
        for sid, events in found:
            rows += (events or 0) + 1
            if ids and rows > max_rows:
                break
            ids.append(sid)
        deleted = {t: _delete_ids(tx, t, "stream_id", ids) for t in _STREAM_TABLES}
        result.chunks += deleted["chunks"]
        result.errors += deleted["errors"]
        result.streams += _delete_ids(tx, "streams", "id", ids)
    result.batches += 1
    return len(found)


def _prune_connections(
    store: Store, cutoff: float, node: str | None, batch: int, result: PruneResult
) -> bool:
    """One batch of connections without streams, opened before the cutoff."""
    # NOT IN over a subquery: SQLite builds the set of referenced connection ids
    # once per statement (streams.connection_id has no index; a correlated
    # NOT EXISTS would scan the streams table once per candidate).
    # On PostgreSQL NOT IN over a large subquery that does not fit work_mem is
    # rescanned per row: NOT EXISTS (an anti-join on ix_streams_connection) instead.
    if store.name == "postgresql":
        unused = "NOT (EXISTS (SELECT * FROM streams WHERE streams.connection_id = connections.id))"
    else:
        unused = (
            "(connections.id NOT IN (SELECT streams.connection_id FROM streams "
            "WHERE streams.connection_id IS NOT NULL))"
        )
    mine, mine_params = _mine("connections", node)
    with store.transaction() as tx:
        ids = [
            cid
            for (cid,) in tx.execute(
                f"SELECT connections.id FROM connections WHERE connections.opened_at < ? "
                f"AND {unused}{mine} ORDER BY connections.id LIMIT ?",
                [cutoff, *mine_params, batch],
            )
        ]
        if not ids:
            return False
        result.connections += _delete_ids(tx, "connections", "id", ids)
    result.batches += 1
    return len(ids) >= batch


def _prune_errors(
    store: Store, cutoff: float, node: str | None, batch: int, result: PruneResult
) -> bool:
    """One batch of errors recorded without a stream (capture, reassembly, http
    desync …) before the cutoff."""
    mine, mine_params = _mine("errors", node)
    with store.transaction() as tx:
        ids = [
            eid
            for (eid,) in tx.execute(
                "SELECT errors.id FROM errors WHERE errors.stream_id IS NULL "
                f"AND errors.ts < ?{mine} ORDER BY errors.id LIMIT ?",
                [cutoff, *mine_params, batch],
            )
        ]
        if not ids:
            return False
        result.errors += _delete_ids(tx, "errors", "id", ids)
    result.batches += 1
    return len(ids) >= batch


def _auto_vacuum(store: Store) -> int | None:
    value = store.scalar("PRAGMA auto_vacuum")
    return int(value) if value is not None else None


def ensure_incremental_vacuum(store: Store, *, convert: bool = False) -> bool:
    """Make a SQLite database use ``auto_vacuum = INCREMENTAL``; True if it does.

    On a database without tables (a new file) the pragma simply takes effect.
    On an existing database it only takes effect after a full ``VACUUM``, which
    rewrites the whole file under an exclusive lock: done only with
    ``convert=True`` (the ``prune --vacuum-full`` path, never the daemon).
    Always False for databases other than SQLite.

    For new databases the cheap, race-free place is where the file is opened
    (``PRAGMA auto_vacuum = INCREMENTAL`` before the tables are created).
    """
    if store.name != "sqlite":
        return False
    if _auto_vacuum(store) == _AUTO_VACUUM_INCREMENTAL:
        return True
    tables = store.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
    store.sqlite_script(
        "PRAGMA auto_vacuum = INCREMENTAL;" + (" VACUUM;" if tables and convert else "")
    )
    return _auto_vacuum(store) == _AUTO_VACUUM_INCREMENTAL


@dataclass
class VacuumResult:
    freed_pages: int  # pages returned to the file system
    page_size: int
    incremental: bool  # the database is in auto_vacuum=INCREMENTAL mode

    @property
    def freed_bytes(self) -> int:
        return self.freed_pages * self.page_size


#: Free pages returned per step of a vacuum that reports progress.
VACUUM_STEP = 4096


def vacuum(
    store: Store,
    *,
    pages: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> VacuumResult:
    """``PRAGMA incremental_vacuum`` on SQLite (all free pages, or at most ``pages``).

    Cheap: it truncates free pages off the end of the file; nothing is
    rewritten. Does nothing (and says so in ``incremental``) when the database
    is not in INCREMENTAL mode, or is not SQLite. With ``progress(pages freed,
    pages to free)`` it frees :data:`VACUUM_STEP` pages at a time, calling it
    after each step.
    """
    if store.name != "sqlite":
        return VacuumResult(0, 0, False)

    def pragma(name: str) -> int:
        return int(store.scalar(f"PRAGMA {name}") or 0)

    def run(n: int | None) -> None:
        # Python's sqlite3 ``execute`` steps a row-less pragma only once, which
        # frees ONE page; as a script it runs to completion.
        store.sqlite_script(f"PRAGMA incremental_vacuum{'' if n is None else f'({max(0, n)})'};")

    mode = _auto_vacuum(store)
    page_size = pragma("page_size")
    before = pragma("page_count")
    if mode == _AUTO_VACUUM_INCREMENTAL:
        if progress is None:
            run(None if pages is None else int(pages))
        else:
            free = pragma("freelist_count")
            todo = free if pages is None else min(free, max(0, int(pages)))
            done = 0
            progress(0, todo)
            while done < todo:
                run(min(VACUUM_STEP, todo - done))
                left = pragma("freelist_count")
                if free - left <= done:
                    break  # nothing more was freed
                done = free - left
                progress(min(done, todo), todo)
    after = pragma("page_count")
    return VacuumResult(before - after, page_size, mode == _AUTO_VACUUM_INCREMENTAL)


__all__ = [
    "PruneResult",
    "VacuumResult",
    "ensure_incremental_vacuum",
    "parse_age",
    "prune",
    "vacuum",
]
