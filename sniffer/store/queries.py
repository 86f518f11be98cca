"""Read side of the store: plain dicts out, no printing.

Rows come back as ``dict``s keyed by column name, with values as stored: JSON
columns (``request_headers``, ``response_headers``, ``finish_reasons``,
``usage``, …) stay JSON text; ``json_columns`` decodes them when wanted.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sniffer.store.lite import PLAIN_HTTP, SqliteFile
from sniffer.store.lite import in_list as _in

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from sniffer.store.token_rows import StreamTokenRow

# SQLAlchemy loads inside the functions that query through it: ``list_streams``,
# ``get_stream`` and the queries of ``verify`` and ``stats`` on a SQLite file
# opened without it (``open_store``) never do.

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

    stmt = _equal(select(streams), streams, node=node, label=label, model=model, state=state)
    if stream_ids is not None:
        stmt = stmt.where(streams.c.id.in_(list(stream_ids)))
    stmt = stmt.order_by(streams.c.t_request, streams.c.id)
    if limit is not None:
        stmt = stmt.limit(limit)
    with engine.connect() as conn:
        return _rows(conn.execute(stmt))


def _equal(stmt: Any, table: Any, **filters: Any) -> Any:
    """``stmt`` narrowed to the rows of ``table`` whose columns equal the given
    values (a ``None`` value filters nothing)."""
    for col, value in filters.items():
        if value is not None:
            stmt = stmt.where(table.c[col] == value)
    return stmt


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


# ---------------------------------------------------------------------------
# verify and stats: a SQLite file at head through the stdlib driver, or an engine
# ---------------------------------------------------------------------------


#: The stream columns ``verify`` reads, in this order (booleans as ``bool``).
VERIFY_STREAM_COLUMNS = (
    "id",
    "label",
    "model",
    "dialect",
    "state",
    "reason",
    "done_seen",
    "gap",
    "chunk_count",
    "text_len",
    "text_kept",
    "request_json",
    "flags",
)
_VERIFY_FLAGS = ("done_seen", "gap", "text_kept")


def _flags(row: dict[str, Any], columns: Iterable[str]) -> dict[str, Any]:
    """Boolean columns read back as ``bool`` (as SQLAlchemy does), NULL kept."""
    for col in columns:
        if row[col] is not None:
            row[col] = bool(row[col])
    return row


def verify_streams(
    engine: Engine | SqliteFile,
    *,
    stream_ids: Sequence[int] | None,
    label: str | None,
    model: str | None,
    state: str | None,
    include_http: bool,
    node: str | None = None,
) -> list[dict[str, Any]]:
    """The streams ``verify`` checks (:data:`VERIFY_STREAM_COLUMNS`), in ``t_request``
    order: ``stream_ids``, else every LLM stream (every stream with ``include_http``),
    narrowed by the other filters."""
    if isinstance(engine, SqliteFile):
        where: list[str] = []
        params: list[Any] = []
        if stream_ids is not None:
            if not stream_ids:
                return []
            where.append(f"id IN {_in(stream_ids)}")
            params.extend(stream_ids)
        elif not include_http:
            where.append("dialect IS NOT NULL AND dialect != ?")
            params.append(PLAIN_HTTP)
        for col, value in (("label", label), ("node", node), ("model", model), ("state", state)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        sql = f"SELECT {', '.join(VERIFY_STREAM_COLUMNS)} FROM streams"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [
            _flags(dict(zip(VERIFY_STREAM_COLUMNS, row, strict=True)), _VERIFY_FLAGS)
            for row in engine.query(sql + " ORDER BY t_request, id", params)
        ]
    from sqlalchemy import select

    from sniffer.store.models import streams

    stmt = select(*(streams.c[c] for c in VERIFY_STREAM_COLUMNS))
    if stream_ids is not None:
        stmt = stmt.where(streams.c.id.in_(list(stream_ids)))
    elif not include_http:
        stmt = stmt.where(streams.c.dialect.is_not(None), streams.c.dialect != PLAIN_HTTP)
    stmt = _equal(stmt, streams, label=label, node=node, model=model, state=state)
    stmt = stmt.order_by(streams.c.t_request, streams.c.id)
    with engine.connect() as conn:
        return [dict(m) for m in conn.execute(stmt).mappings()]


def untokenized_count(store: SqliteFile, stream_ids: Sequence[int]) -> int:
    """How many of these streams the token pass would tokenize: closed LLM streams
    without a token row (``sniffer.record.tokenize_pass``'s pending filter; a test
    compares the two)."""
    count = 0
    for start in range(0, len(stream_ids), 500):
        part = stream_ids[start : start + 500]
        count += store.scalar(
            "SELECT count(*) FROM streams LEFT OUTER JOIN stream_tokens "
            "ON stream_tokens.stream_id = streams.id "
            "WHERE streams.closed_at IS NOT NULL AND streams.state != 'open' "
            "AND streams.dialect IS NOT NULL AND streams.dialect != ? "
            f"AND stream_tokens.stream_id IS NULL AND streams.id IN {_in(part)}",
            [PLAIN_HTTP, *part],
        )
    return count


def chunk_texts(engine: Engine | SqliteFile, stream_ids: Sequence[int]) -> list[Any]:
    """``(stream_id, seq, choice, chunk_index, text)`` of every chunk of these
    streams, by stream in capture order."""
    if isinstance(engine, SqliteFile):
        if not stream_ids:
            return []
        return engine.query(
            "SELECT stream_id, seq, choice, chunk_index, text FROM chunks "
            f"WHERE stream_id IN {_in(stream_ids)} ORDER BY stream_id, seq, id",
            stream_ids,
        )
    from sqlalchemy import select

    from sniffer.store.models import chunks

    stmt = (
        select(
            chunks.c.stream_id, chunks.c.seq, chunks.c.choice, chunks.c.chunk_index, chunks.c.text
        )
        .where(chunks.c.stream_id.in_(list(stream_ids)))
        .order_by(chunks.c.stream_id, chunks.c.seq, chunks.c.id)
    )
    with engine.connect() as conn:
        return list(conn.execute(stmt).tuples().all())


def token_rows(engine: Engine | SqliteFile, stream_ids: Iterable[int]) -> dict[int, StreamTokenRow]:
    """The token pass's rows of these streams (``sniffer.store.token_rows``)."""
    if isinstance(engine, SqliteFile):
        from sniffer.store.token_rows import read_token_rows

        return read_token_rows(engine, stream_ids)
    from sniffer.store.tokens_store import read_stream_tokens

    return read_stream_tokens(engine, stream_ids)


#: The stream columns ``stats`` builds its outputs from, in this order.
OUTPUT_STREAM_COLUMNS = (
    "id",
    "label",
    "model",
    "request_json",
    "temperature",
    "top_p",
    "seed",
    "n",
    "max_tokens",
    "t_request",
    "t_first_content",
    "finish_reasons",
    "state",
    "dialect",
    "text_kept",
    "flags",
    "spec_source",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_steps",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_histogram",
)


def output_rows(
    engine: Engine | SqliteFile,
    *,
    labels: Sequence[str] | None,
    model: str | None,
    include_incomplete: bool,
    node: str | None,
) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """What ``stats`` and ``diff`` build outputs from: the LLM streams
    (:data:`OUTPUT_STREAM_COLUMNS`, in ``t_request`` order; only ``complete`` ones,
    else all but ``midway``), their chunk tuples ``(stream_id, choice, text, ts,
    finish_reason, logprobs)`` that carry something, by stream in capture order,
    and ``(stream_id, choice, server_tokens, server_ids)`` of their choices the
    token pass found server tokens for."""
    if isinstance(engine, SqliteFile):
        return _output_rows_sqlite(engine, labels, model, include_incomplete, node)
    from sqlalchemy import select

    from sniffer.store.models import chunks, streams
    from sniffer.store.tokens_store import choice_tokens

    cond = [streams.c.dialect.is_not(None), streams.c.dialect != PLAIN_HTTP]
    if node is not None:
        cond.append(streams.c.node == node)
    if labels is not None:
        cond.append(streams.c.label.in_(list(labels)))
    if model is not None:
        cond.append(streams.c.model == model)
    if not include_incomplete:
        cond.append(streams.c.state == "complete")
    else:
        cond.append(streams.c.state.is_distinct_from("midway"))
    cols = [streams.c[c] for c in OUTPUT_STREAM_COLUMNS]
    s_stmt = select(*cols).where(*cond).order_by(streams.c.t_request, streams.c.id)
    c_stmt = (
        select(
            chunks.c.stream_id,
            chunks.c.choice,
            chunks.c.text,
            chunks.c.ts,
            chunks.c.finish_reason,
            chunks.c.logprobs,
        )
        .join(streams, streams.c.id == chunks.c.stream_id)
        .where(*cond)
        .where(
            (chunks.c.text != "")
            | chunks.c.finish_reason.is_not(None)
            | chunks.c.logprobs.is_not(None)
        )
        .order_by(chunks.c.stream_id, chunks.c.seq, chunks.c.id)
    )
    t_stmt = (
        select(
            choice_tokens.c.stream_id,
            choice_tokens.c.choice,
            choice_tokens.c.server_tokens,
            choice_tokens.c.server_ids,
        )
        .join(streams, streams.c.id == choice_tokens.c.stream_id)
        .where(*cond)
        .where(choice_tokens.c.server_count.is_not(None))
    )
    with engine.connect() as conn:
        rows = _rows(conn.execute(s_stmt))
        chunk_rows = list(conn.execute(c_stmt).tuples().all())
        server_rows = list(conn.execute(t_stmt).tuples().all())
    return rows, chunk_rows, server_rows


def _output_rows_sqlite(
    store: SqliteFile,
    labels: Sequence[str] | None,
    model: str | None,
    include_incomplete: bool,
    node: str | None,
) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    if labels is not None and not labels:
        return [], [], []
    where = ["streams.dialect IS NOT NULL", "streams.dialect != ?"]
    params: list[Any] = [PLAIN_HTTP]
    if node is not None:
        where.append("streams.node = ?")
        params.append(node)
    if labels is not None:
        where.append(f"streams.label IN {_in(labels)}")
        params.extend(labels)
    if model is not None:
        where.append("streams.model = ?")
        params.append(model)
    if not include_incomplete:
        where.append("streams.state = 'complete'")
    else:
        where.append("streams.state IS NOT 'midway'")  # NULL included: IS DISTINCT FROM
    cond = " AND ".join(where)
    rows = [
        _flags(dict(zip(OUTPUT_STREAM_COLUMNS, values, strict=True)), ("text_kept",))
        for values in store.query(
            f"SELECT {', '.join(OUTPUT_STREAM_COLUMNS)} FROM streams WHERE {cond} "
            "ORDER BY streams.t_request, streams.id",
            params,
        )
    ]
    chunk_rows = store.query(
        "SELECT chunks.stream_id, chunks.choice, chunks.text, chunks.ts, "
        "chunks.finish_reason, chunks.logprobs FROM chunks "
        f"JOIN streams ON streams.id = chunks.stream_id WHERE {cond} AND "
        "(chunks.text != '' OR chunks.finish_reason IS NOT NULL OR chunks.logprobs IS NOT NULL) "
        "ORDER BY chunks.stream_id, chunks.seq, chunks.id",
        params,
    )
    server_rows = store.query(
        "SELECT choice_tokens.stream_id, choice_tokens.choice, choice_tokens.server_tokens, "
        "choice_tokens.server_ids FROM choice_tokens "
        f"JOIN streams ON streams.id = choice_tokens.stream_id WHERE {cond} "
        "AND choice_tokens.server_count IS NOT NULL",
        params,
    )
    return rows, chunk_rows, server_rows


def count_midway(
    engine: Engine | SqliteFile,
    *,
    labels: Sequence[str] | None = None,
    model: str | None = None,
) -> int:
    """LLM streams recovered mid-way (state ``midway``), optionally only those with
    one of ``labels`` / of ``model``."""
    if isinstance(engine, SqliteFile):
        if labels is not None and not labels:
            return 0
        where = ["state = 'midway'", "dialect IS NOT NULL", "dialect != ?"]
        params: list[Any] = [PLAIN_HTTP]
        if labels is not None:
            where.append(f"label IN {_in(labels)}")
            params.extend(labels)
        if model is not None:
            where.append("model = ?")
            params.append(model)
        return int(
            engine.scalar(f"SELECT count(*) FROM streams WHERE {' AND '.join(where)}", params)
        )
    from sqlalchemy import func, select

    from sniffer.store.models import streams

    cond = [streams.c.state == "midway", streams.c.dialect.is_not(None)]
    cond.append(streams.c.dialect != PLAIN_HTTP)
    if labels is not None:
        cond.append(streams.c.label.in_(list(labels)))
    if model is not None:
        cond.append(streams.c.model == model)
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).select_from(streams).where(*cond)).scalar_one()
        )
