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
from typing import Any

from sqlalchemy import Engine, and_, delete, exists, func, or_, select

from sniffer.store.db import Store, engine_of
from sniffer.store.models import chunks, connections, errors, streams
from sniffer.store.tokens_store import choice_tokens, stream_tokens, token_anomalies

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


# Left to the store restructure (issue #27), which rewrites this module (C901).
def prune(  # noqa: C901
    engine: Store | Engine,
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
    of streams. Example: ``prune(engine, parse_age("7d"), now=time.time())``.
    """
    engine = engine_of(engine)  # a store runs this on its engine
    if older_than < 0:
        raise ValueError(f"older_than must be >= 0 seconds, got {older_than}")
    batch = max(1, batch)
    max_rows = max(1, max_rows)
    cutoff = now - older_than
    result = PruneResult()
    s_mine = [] if node is None else [or_(streams.c.node == node, streams.c.node.is_(None))]
    c_mine = [] if node is None else [or_(connections.c.node == node, connections.c.node.is_(None))]
    e_mine = [] if node is None else [or_(errors.c.node == node, errors.c.node.is_(None))]

    def budget_left() -> bool:
        return max_batches is None or result.batches < max_batches

    total = 0
    if progress is not None:
        with engine.connect() as conn:
            total = int(
                conn.execute(
                    select(func.count())
                    .select_from(streams)
                    .where(streams.c.t_request < cutoff, *s_mine)
                ).scalar_one()
            )

    # 1. streams, with their chunks and errors
    while True:
        if not budget_left():
            result.done = False
            return result
        with engine.begin() as conn:
            found = conn.execute(
                select(streams.c.id, streams.c.event_count)
                .where(streams.c.t_request < cutoff, *s_mine)
                .order_by(streams.c.id)
                .limit(batch)
            ).all()
            if not found:
                break
            ids: list[int] = []
            rows = 0
            for sid, events in found:
                rows += (events or 0) + 1
                if ids and rows > max_rows:
                    break
                ids.append(sid)
            result.chunks += conn.execute(
                delete(chunks).where(chunks.c.stream_id.in_(ids))
            ).rowcount
            result.errors += conn.execute(
                delete(errors).where(errors.c.stream_id.in_(ids))
            ).rowcount
            for table in (token_anomalies, choice_tokens, stream_tokens):
                conn.execute(delete(table).where(table.c.stream_id.in_(ids)))
            result.streams += conn.execute(delete(streams).where(streams.c.id.in_(ids))).rowcount
        result.batches += 1
        if progress is not None:
            progress(min(result.streams, total), total)
        if len(found) < batch:
            break

    # 2. connections without streams, opened before the cutoff
    # NOT IN over a subquery: SQLite builds the set of referenced connection ids
    # once per statement (streams.connection_id has no index; a correlated
    # NOT EXISTS would scan the streams table once per candidate).
    # On PostgreSQL NOT IN over a large subquery that does not fit work_mem is
    # rescanned per row: NOT EXISTS (an anti-join on ix_streams_connection) instead.
    if engine.dialect.name == "postgresql":
        unused = ~exists().where(streams.c.connection_id == connections.c.id)
    else:
        unused = connections.c.id.not_in(
            select(streams.c.connection_id).where(streams.c.connection_id.is_not(None))
        )
    orphan = and_(connections.c.opened_at < cutoff, unused, *c_mine)
    while True:
        if not budget_left():
            result.done = False
            return result
        with engine.begin() as conn:
            ids = list(
                conn.execute(
                    select(connections.c.id).where(orphan).order_by(connections.c.id).limit(batch)
                ).scalars()
            )
            if not ids:
                break
            result.connections += conn.execute(
                delete(connections).where(connections.c.id.in_(ids))
            ).rowcount
        result.batches += 1
        if len(ids) < batch:
            break

    # 3. errors recorded without a stream (capture, reassembly, http desync …)
    while True:
        if not budget_left():
            result.done = False
            return result
        with engine.begin() as conn:
            ids = list(
                conn.execute(
                    select(errors.c.id)
                    .where(errors.c.stream_id.is_(None), errors.c.ts < cutoff, *e_mine)
                    .order_by(errors.c.id)
                    .limit(batch)
                ).scalars()
            )
            if not ids:
                break
            result.errors += conn.execute(delete(errors).where(errors.c.id.in_(ids))).rowcount
        result.batches += 1
        if len(ids) < batch:
            break
    return result


def _auto_vacuum(engine: Engine) -> int | None:
    if engine.dialect.name != "sqlite":
        return None
    with engine.connect() as conn:
        value = conn.exec_driver_sql("PRAGMA auto_vacuum").scalar()
    return int(value) if value is not None else None


def ensure_incremental_vacuum(engine: Store | Engine, *, convert: bool = False) -> bool:
    """Make a SQLite database use ``auto_vacuum = INCREMENTAL``; True if it does.

    On a database without tables (a new file) the pragma simply takes effect.
    On an existing database it only takes effect after a full ``VACUUM``, which
    rewrites the whole file under an exclusive lock: done only with
    ``convert=True`` (the ``prune --vacuum-full`` path, never the daemon).
    Always False for databases other than SQLite.

    For new databases the cheap, race-free place is the engine's connect hook
    (``PRAGMA auto_vacuum = INCREMENTAL`` before the tables are created).
    """
    engine = engine_of(engine)  # a store runs this on its engine
    if engine.dialect.name != "sqlite":
        return False
    if _auto_vacuum(engine) == _AUTO_VACUUM_INCREMENTAL:
        return True
    with engine.connect() as conn:
        tables = conn.exec_driver_sql(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
        ).scalar()
        conn.exec_driver_sql("PRAGMA auto_vacuum = INCREMENTAL")
        if tables and convert:
            conn.exec_driver_sql("VACUUM")
        conn.commit()
    return _auto_vacuum(engine) == _AUTO_VACUUM_INCREMENTAL


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
    engine: Store | Engine,
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
    engine = engine_of(engine)  # a store runs this on its engine
    if engine.dialect.name != "sqlite":
        return VacuumResult(0, 0, False)
    with engine.connect() as conn:
        mode = conn.exec_driver_sql("PRAGMA auto_vacuum").scalar()
        page_size = int(conn.exec_driver_sql("PRAGMA page_size").scalar() or 0)
        before = int(conn.exec_driver_sql("PRAGMA page_count").scalar() or 0)
        if mode == _AUTO_VACUUM_INCREMENTAL:
            conn.commit()
            raw: Any = conn.connection.dbapi_connection
            script = getattr(raw, "executescript", None)

            def run(n: int | None) -> None:
                arg = "" if n is None else f"({max(0, int(n))})"
                if script is not None:
                    # Python's sqlite3 ``execute`` steps a row-less pragma only once,
                    # which frees ONE page; ``executescript`` runs it to completion.
                    script(f"PRAGMA incremental_vacuum{arg};")
                else:
                    conn.exec_driver_sql(f"PRAGMA incremental_vacuum{arg}")
                    conn.commit()

            if progress is None:
                run(pages)
            else:
                free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
                todo = free if pages is None else min(free, max(0, int(pages)))
                done = 0
                progress(0, todo)
                while done < todo:
                    run(min(VACUUM_STEP, todo - done))
                    left = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
                    if free - left <= done:
                        break  # nothing more was freed
                    done = free - left
                    progress(min(done, todo), todo)
        after = int(conn.exec_driver_sql("PRAGMA page_count").scalar() or 0)
    return VacuumResult(before - after, page_size, mode == _AUTO_VACUUM_INCREMENTAL)


__all__ = [
    "PruneResult",
    "VacuumResult",
    "ensure_incremental_vacuum",
    "parse_age",
    "prune",
    "vacuum",
]
