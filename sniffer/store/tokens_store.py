"""Token tables: what the token pass (``sniffer.record.tokenize_pass``) found per stream.

Specified with the capture tables (``sniffer.store.spec``, built on one
``MetaData`` in ``sniffer.store.models``); created, like them, by the migration
chain (``sniffer.store.migrations``), which :func:`create_token_tables` runs
(safe to call repeatedly).

``stream_tokens`` — one row per analysed stream (its presence means "done").

    stream_id       streams.id (primary key)
    tokenizer       the tokenizer used: the configured source, or
                    ``"default:deepseek-v4"`` when the model has none configured
    is_default      no tokenizer is configured for the stream's model
    prompt_count    prompt token count (chat template or fallback), NULL when
                    the request carried no prompt
    prompt_ids      JSON list of the prompt's token ids (-1: over redacted text)
    output_count    token count of all choices' full texts
    usage_diff      JSON object {field: server-reported minus counted}
    tokens_per_chunk JSON object {"<tokens>": <text chunks with that many>}
    anomaly_count   anomalies found (listed ones plus capped ones)
    error           the analysis of this stream failed (the message); other
                    columns are then empty. The row still marks it as done.

``choice_tokens`` — one row per (stream, choice) that carried text.

    stream_id, choice
    text_len        characters of the choice's full text (deltas joined by seq)
    text_hash       blake2b-128 hex of its UTF-8 bytes (``surrogatepass``): the
                    stored full text, compared by ``verify`` with the deltas
    token_count     len(output_ids)
    output_ids      JSON list: token ids of the full text; -1 where a token
                    overlaps text that redaction removed (``sniffer.record.redact``)
    chunk_seqs      JSON list: seq of each text chunk of the choice, in seq order
    chunk_counts    JSON list: tokens attributed to each of those chunks. The
                    per-chunk ids are slices of ``output_ids``: chunk k gets
                    ``output_ids[sum(chunk_counts[:k]) : sum(chunk_counts[:k+1])]``
                    (:func:`chunk_token_ids` does it). One row per choice instead
                    of one per chunk: a 72k-chunk replay writes ~1.2k rows here.
    straddles       number of tokens that straddle a chunk boundary
    straddle_seqs   JSON list: seq of the chunk each straddling token starts in
                    (repeated when one chunk starts several)
    tokens_per_chunk JSON object {"<tokens>": <chunks>} of this choice
    server_count    number of server-reported tokens (logprobs), NULL when none
    server_tokens   JSON list of the server-reported token texts
                    (``<REDACTED>`` over redacted text)
    server_ids      JSON list of our ids for them (null where unmapped, -1
                    over redacted text)
    server_mismatch index of the first server token that differs from ours
                    (NULL when they agree or there are none)

``token_anomalies`` — one row per listed anomaly (see ``sniffer.llm.tokens``).

    id, stream_id, choice (-1: the stream), kind, position, detail
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, Table, and_, delete, func, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from sniffer.store.db import EngineStore
from sniffer.store.models import (
    PLAIN_HTTP,
    choice_tokens,
    chunks,
    stream_tokens,
    streams,
    token_anomalies,
)
from sniffer.store.token_rows import (  # the row values live without SQLAlchemy
    ANOMALY_COLUMNS,
    CHOICE_COLUMNS,
    STREAM_COLUMNS,
    ChoiceTokenRow,
    StreamTokenRow,
    TokenAnomalyRow,
    anomaly_values,
    choice_values,
    read_token_rows,
    stream_values,
)

__all__ = [
    "ChoiceTokenRow",
    "StreamTokenRow",
    "TokenAnomalyRow",
    "choice_tokens",
    "chunk_token_ids",
    "create_token_tables",
    "delete_token_rows",
    "insert_token_rows",
    "pending_count",
    "read_pending",
    "read_stream_tokens",
    "stream_tokens",
    "token_anomalies",
    "write_token_rows",
]

_TABLES = (stream_tokens, choice_tokens, token_anomalies)


def create_token_tables(engine: Engine) -> None:
    """Make sure the token tables exist: they are part of the migration chain, so
    this brings the database to the current schema (``sniffer.store.schema``),
    under the migration lock; a no-op (one query) when it is there already."""
    from sniffer.store.schema import migrate

    migrate(engine)


#: The columns the token pass fills, in table order (``sniffer.store.spec``; the
#: anomaly ids are the database's), and the values of a row
#: (``sniffer.store.token_rows``: the SQLite file's own writer uses them too).
_STREAM_COLUMNS = STREAM_COLUMNS
_CHOICE_COLUMNS = CHOICE_COLUMNS
_ANOMALY_COLUMNS = ANOMALY_COLUMNS


#: (dialect name, table name) → (INSERT text, parameter order or None if named)
_INSERTS: dict[tuple[str, str], tuple[str, tuple[str, ...] | None]] = {}


def _insert_rows(
    conn: Connection, table: Table, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> None:
    """``executemany`` of positional rows straight through the driver: the
    INSERT is compiled once per dialect, and SQLAlchemy builds no parameter
    dict per row (the columns' types need no bind processing)."""
    dialect = conn.dialect
    key = (dialect.name, table.name)
    found = _INSERTS.get(key)
    if found is None:
        compiled = insert(table).compile(
            dialect=dialect, column_keys=list(columns), for_executemany=True
        )
        order = tuple(compiled.positiontup or ()) if compiled.positional else None
        found = _INSERTS[key] = (str(compiled), order)
    sql, order = found
    if order is None:  # named parameters (PostgreSQL drivers)
        conn.exec_driver_sql(sql, [dict(zip(columns, row, strict=True)) for row in rows])
    elif order == columns:
        conn.exec_driver_sql(sql, rows)
    else:
        idx = [columns.index(c) for c in order]
        conn.exec_driver_sql(sql, [tuple([row[i] for i in idx]) for row in rows])


def write_token_rows(conn: Connection, rows: Sequence[StreamTokenRow]) -> None:
    """Insert the rows of analysed streams on ``conn`` (the caller's transaction).

    Raises ``IntegrityError`` when a stream already has a row (another pass
    got there first); the caller rolls back and retries without it.
    """
    if not rows:
        return
    _insert_rows(conn, stream_tokens, _STREAM_COLUMNS, [stream_values(r) for r in rows])
    choice_rows = [choice_values(r.stream_id, c) for r in rows for c in r.choices]
    if choice_rows:
        _insert_rows(conn, choice_tokens, _CHOICE_COLUMNS, choice_rows)
    anomaly_rows = anomaly_values(rows)
    if anomaly_rows:
        _insert_rows(conn, token_anomalies, _ANOMALY_COLUMNS, anomaly_rows)


def delete_token_rows(conn: Connection, stream_ids: Iterable[int] | None = None) -> None:
    """Delete the token rows of these streams (all streams when None), so that
    the next pass analyses them again."""
    for table in _TABLES:
        stmt = delete(table)
        if stream_ids is not None:
            stmt = stmt.where(table.c.stream_id.in_(list(stream_ids)))
        conn.execute(stmt)


def read_stream_tokens(engine: Engine, stream_ids: Iterable[int]) -> dict[int, StreamTokenRow]:
    """The stored token rows of these streams (streams without a row are absent):
    the one reader (``sniffer.store.token_rows.read_token_rows``) on an engine."""
    return read_token_rows(EngineStore(engine), stream_ids)


# ---------------------------------------------------------------------------
# the token pass's queries (``sniffer.record.tokenize_pass``)
# ---------------------------------------------------------------------------


def _pending_filter() -> Any:
    return and_(
        streams.c.closed_at.is_not(None),
        streams.c.state != "open",
        streams.c.dialect.is_not(None),
        streams.c.dialect != PLAIN_HTTP,
        stream_tokens.c.stream_id.is_(None),
    )


def _pending_select(*cols: Any) -> Any:
    return (
        select(*cols)
        .select_from(streams.outerjoin(stream_tokens, stream_tokens.c.stream_id == streams.c.id))
        .where(_pending_filter())
    )


def pending_count(engine: Engine) -> int:
    """Closed LLM streams without a token row (what the token pass tokenizes)."""
    create_token_tables(engine)
    with engine.connect() as conn:
        return int(conn.execute(_pending_select(func.count())).scalar_one())


_CHUNK_COLUMNS = (
    chunks.c.stream_id,
    chunks.c.seq,
    func.coalesce(chunks.c.choice, -1),
    func.coalesce(chunks.c.text, ""),
    chunks.c.finish_reason,
    chunks.c.logprobs,
)


def _chunk_tuples(engine: Engine, conn: Connection, ids: list[int]) -> list[tuple[Any, ...]]:
    """(stream_id, seq, choice, text, finish_reason, logprobs) of the streams' chunks,
    ordered by stream and seq, as plain DB-API tuples (no Row objects: this is
    ~100k rows per batch). The ids are integers, rendered inline."""
    stmt = (
        select(*_CHUNK_COLUMNS)
        .where(chunks.c.stream_id.in_([int(i) for i in ids]))
        .order_by(chunks.c.stream_id, chunks.c.seq, chunks.c.id)
    )
    sql = str(stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    cur = conn.connection.cursor()
    try:
        cur.execute(sql)
        return list(cur.fetchall())
    finally:
        cur.close()


def read_pending(
    engine: Engine,
    size: int,
    *,
    after: int | None = None,
    stream_ids: Sequence[int] | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """One batch of the token pass: up to ``size`` pending streams (whole rows, in
    id order, ids above ``after``, only ``stream_ids`` when given) and their chunk
    tuples ``(stream_id, seq, choice, text, finish_reason, logprobs)`` by stream
    and seq (choice -1 and text "" for NULL); ``([], [])`` when none is left."""
    stmt = _pending_select(streams)
    if stream_ids is not None:
        stmt = stmt.where(streams.c.id.in_(list(stream_ids)))
    if after is not None:
        stmt = stmt.where(streams.c.id > after)
    stmt = stmt.order_by(streams.c.id).limit(size)
    with engine.connect() as conn:
        srows = [dict(m) for m in conn.execute(stmt).mappings()]
        if not srows:
            return [], []
        return srows, _chunk_tuples(engine, conn, [r["id"] for r in srows])


def insert_token_rows(
    engine: Engine, rows: list[StreamTokenRow]
) -> tuple[list[StreamTokenRow], int, str | None]:
    """Write a batch of token rows in one transaction; on a collision with another
    pass, once more without the streams it already wrote. Returns (the rows
    written, the rows skipped so, the database's error when it refused the batch:
    nothing written)."""
    try:
        with engine.begin() as conn:
            write_token_rows(conn, rows)
        return rows, 0, None
    except IntegrityError:
        pass
    except SQLAlchemyError as exc:
        return [], 0, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    ids = [r.stream_id for r in rows]
    try:
        with engine.begin() as conn:
            done = set(
                conn.execute(
                    select(stream_tokens.c.stream_id).where(stream_tokens.c.stream_id.in_(ids))
                ).scalars()
            )
            todo = [r for r in rows if r.stream_id not in done]
            write_token_rows(conn, todo)
    except SQLAlchemyError as exc:
        return [], 0, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return todo, len(rows) - len(todo), None


def chunk_token_ids(row: ChoiceTokenRow) -> list[tuple[int, tuple[int, ...]]]:
    """(seq, token ids) of every text chunk of a choice, sliced from ``output_ids``."""
    out: list[tuple[int, tuple[int, ...]]] = []
    pos = 0
    for seq, n in zip(row.chunk_seqs, row.chunk_counts, strict=False):
        out.append((seq, row.output_ids[pos : pos + n]))
        pos += n
    return out
