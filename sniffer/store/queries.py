"""Read side of the store: plain dicts out, no printing.

Rows come back as ``dict``s keyed by column name, with values as stored: JSON
columns (``request_headers``, ``response_headers``, ``finish_reasons``,
``usage``, …) stay JSON text; ``json_columns`` decodes them when wanted.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sniffer.store.lite import SqliteFile

if TYPE_CHECKING:
    from sqlalchemy import Engine

# SQLAlchemy loads inside the functions that query through it: ``list_streams``
# and ``get_stream`` on a SQLite file opened without it (``open_store``) never do.

#: Stream columns that hold JSON text.
STREAM_JSON_COLUMNS = ("request_headers", "response_headers", "finish_reasons", "usage")


def _rows(result: Iterable[Any]) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in result]


def json_columns(
    row: dict[str, Any], columns: Iterable[str] = STREAM_JSON_COLUMNS
) -> dict[str, Any]:
    """A copy of ``row`` with the named JSON text columns decoded (undecodable → kept)."""
    out = dict(row)
    for col in columns:
        value = out.get(col)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                out[col] = json.loads(value)
    return out


def list_streams(
    engine: Engine | SqliteFile,
    *,
    label: str | None = None,
    model: str | None = None,
    state: str | None = None,
    limit: int | None = None,
    stream_ids: Iterable[int] | None = None,
    node: str | None = None,
) -> list[dict[str, Any]]:
    """Stream rows in ``t_request`` order (then id), optionally filtered
    (``node``: only the streams that sidecar captured)."""
    if isinstance(engine, SqliteFile):
        where: list[tuple[str, Any]] = [
            (col, value)
            for col, value in (("node", node), ("label", label), ("model", model), ("state", state))
            if value is not None
        ]
        if stream_ids is not None:
            where.append(("id", list(stream_ids)))
        return engine.select("streams", where, ("t_request", "id"), limit)
    from sqlalchemy import select

    from sniffer.store.models import streams

    stmt = select(streams)
    if node is not None:
        stmt = stmt.where(streams.c.node == node)
    if label is not None:
        stmt = stmt.where(streams.c.label == label)
    if model is not None:
        stmt = stmt.where(streams.c.model == model)
    if state is not None:
        stmt = stmt.where(streams.c.state == state)
    if stream_ids is not None:
        stmt = stmt.where(streams.c.id.in_(list(stream_ids)))
    stmt = stmt.order_by(streams.c.t_request, streams.c.id)
    if limit is not None:
        stmt = stmt.limit(limit)
    with engine.connect() as conn:
        return _rows(conn.execute(stmt))


def stream_chunks(engine: Engine, stream_id: int) -> list[dict[str, Any]]:
    """Chunk rows of one stream in capture order (``seq``)."""
    from sqlalchemy import select

    from sniffer.store.models import chunks

    stmt = select(chunks).where(chunks.c.stream_id == stream_id).order_by(chunks.c.seq, chunks.c.id)
    with engine.connect() as conn:
        return _rows(conn.execute(stmt))


def get_stream(engine: Engine | SqliteFile, stream_id: int) -> dict[str, Any] | None:
    """The stream row plus ``"chunks"`` (ordered by seq) and ``"errors"`` of that
    stream; ``None`` if there is no such stream."""
    if isinstance(engine, SqliteFile):
        found = engine.select("streams", [("id", stream_id)])
        if not found:
            return None
        out = found[0]
        out["chunks"] = engine.select("chunks", [("stream_id", stream_id)], ("seq", "id"))
        out["errors"] = engine.select("errors", [("stream_id", stream_id)], ("ts", "id"))
        return out
    from sqlalchemy import select

    from sniffer.store.models import chunks, errors, streams

    with engine.connect() as conn:
        row = conn.execute(select(streams).where(streams.c.id == stream_id)).first()
        if row is None:
            return None
        out = dict(row._mapping)
        out["chunks"] = _rows(
            conn.execute(
                select(chunks)
                .where(chunks.c.stream_id == stream_id)
                .order_by(chunks.c.seq, chunks.c.id)
            )
        )
        out["errors"] = _rows(
            conn.execute(
                select(errors)
                .where(errors.c.stream_id == stream_id)
                .order_by(errors.c.ts, errors.c.id)
            )
        )
    return out


def stream_text(engine: Engine, stream_id: int) -> dict[int, str]:
    """The content text of a stream per choice: deltas joined in capture order.

    Only choices that carried text appear.
    """
    from sqlalchemy import select

    from sniffer.store.models import chunks

    stmt = (
        select(chunks.c.choice, chunks.c.text)
        .where(chunks.c.stream_id == stream_id)
        .where(chunks.c.text != "")
        .order_by(chunks.c.seq, chunks.c.id)
    )
    parts: dict[int, list[str]] = {}
    with engine.connect() as conn:
        for choice, text in conn.execute(stmt):
            parts.setdefault(choice, []).append(text)
    return {choice: "".join(texts) for choice, texts in sorted(parts.items())}


def list_nodes(engine: Engine) -> list[dict[str, Any]]:
    """Every node that wrote streams: ``{"node", "streams", "first", "last"}``
    (capture times of its first and last request), by name."""
    from sqlalchemy import func, select

    from sniffer.store.models import streams

    stmt = (
        select(
            streams.c.node,
            func.count().label("streams"),
            func.min(streams.c.t_request).label("first"),
            func.max(streams.c.t_request).label("last"),
        )
        .group_by(streams.c.node)
        .order_by(streams.c.node)
    )
    with engine.connect() as conn:
        return _rows(conn.execute(stmt))


def count_rows(engine: Engine) -> dict[str, int]:
    """Number of rows per table: connections, streams, chunks, errors."""
    from sqlalchemy import func, select

    from sniffer.store.models import chunks, connections, errors, streams

    out: dict[str, int] = {}
    with engine.connect() as conn:
        for table in (connections, streams, chunks, errors):
            out[table.name] = int(
                conn.execute(select(func.count()).select_from(table)).scalar_one()
            )
    return out


def list_errors(
    engine: Engine,
    limit: int | None = None,
    *,
    stream_id: int | None = None,
    stage: str | None = None,
    node: str | None = None,
) -> list[dict[str, Any]]:
    """Error rows in chronological order; with ``limit``, the most recent ones."""
    from sqlalchemy import select

    from sniffer.store.models import errors

    stmt = select(errors)
    if node is not None:
        stmt = stmt.where(errors.c.node == node)
    if stream_id is not None:
        stmt = stmt.where(errors.c.stream_id == stream_id)
    if stage is not None:
        stmt = stmt.where(errors.c.stage == stage)
    stmt = stmt.order_by(errors.c.ts.desc(), errors.c.id.desc())
    if limit is not None:
        stmt = stmt.limit(limit)
    with engine.connect() as conn:
        rows = _rows(conn.execute(stmt))
    rows.reverse()
    return rows


def get_connection(engine: Engine, connection_id: int) -> dict[str, Any] | None:
    """One connection row, or ``None``."""
    from sqlalchemy import select

    from sniffer.store.models import connections

    with engine.connect() as conn:
        row = conn.execute(select(connections).where(connections.c.id == connection_id)).first()
    return None if row is None else dict(row._mapping)
