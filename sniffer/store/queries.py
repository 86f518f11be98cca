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

from sniffer.store.db import Store
from sniffer.store.db import in_list as _in
from sniffer.store.lite import PLAIN_HTTP

if TYPE_CHECKING:
    from sniffer.store.tokens_store import StreamTokenRow

# Every query is written once, as SQL text both SQLite and PostgreSQL take, on a
# ``sniffer.store.db.Store``: a SQLite file at head through the standard library's
# driver (no SQLAlchemy import), or an engine (``EngineStore``).

#: Stream columns that hold JSON text.
STREAM_JSON_COLUMNS = ("request_headers", "response_headers", "finish_reasons", "usage")


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
    store: Store,
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
    where: list[tuple[str, Any]] = [
        (col, value)
        for col, value in (("node", node), ("label", label), ("model", model), ("state", state))
        if value is not None
    ]
    if stream_ids is not None:
        where.append(("id", list(stream_ids)))
    return store.select("streams", where, ("t_request", "id"), limit)


def stream_chunks(store: Store, stream_id: int) -> list[dict[str, Any]]:
    """Chunk rows of one stream in capture order (``seq``)."""
    return store.select("chunks", [("stream_id", stream_id)], ("seq", "id"))


def get_stream(store: Store, stream_id: int) -> dict[str, Any] | None:
    """The stream row plus ``"chunks"`` (ordered by seq) and ``"errors"`` of that
    stream; ``None`` if there is no such stream."""
    found = store.select("streams", [("id", stream_id)])
    if not found:
        return None
    out = found[0]
    out["chunks"] = store.select("chunks", [("stream_id", stream_id)], ("seq", "id"))
    out["errors"] = store.select("errors", [("stream_id", stream_id)], ("ts", "id"))
    return out


def stream_text(store: Store, stream_id: int) -> dict[int, str]:
    """The content text of a stream per choice: deltas joined in capture order.

    Only choices that carried text appear.
    """
    parts: dict[int, list[str]] = {}
    for choice, text in store.query(
        "SELECT chunks.choice, chunks.text FROM chunks WHERE chunks.stream_id = ? "
        "AND chunks.text != '' ORDER BY chunks.seq, chunks.id",
        [stream_id],
    ):
        parts.setdefault(choice, []).append(text)
    return {choice: "".join(texts) for choice, texts in sorted(parts.items())}


def list_nodes(store: Store) -> list[dict[str, Any]]:
    """Every node that wrote streams: ``{"node", "streams", "first", "last"}``
    (capture times of its first and last request), by name."""
    return [
        {"node": node, "streams": count, "first": first, "last": last}
        for node, count, first, last in store.query(
            "SELECT streams.node, count(*), min(streams.t_request), max(streams.t_request) "
            "FROM streams GROUP BY streams.node ORDER BY streams.node"
        )
    ]


def count_rows(store: Store) -> dict[str, int]:
    """Number of rows per table: connections, streams, chunks, errors."""
    return {
        table: int(store.scalar(f"SELECT count(*) FROM {table}"))
        for table in ("connections", "streams", "chunks", "errors")
    }


def list_errors(
    store: Store,
    limit: int | None = None,
    *,
    stream_id: int | None = None,
    stage: str | None = None,
    node: str | None = None,
) -> list[dict[str, Any]]:
    """Error rows in chronological order; with ``limit``, the most recent ones."""
    where = [
        (col, value)
        for col, value in (("node", node), ("stream_id", stream_id), ("stage", stage))
        if value is not None
    ]
    rows = store.select("errors", where, ("ts", "id"), limit, descending=True)
    rows.reverse()
    return rows


def get_connection(store: Store, connection_id: int) -> dict[str, Any] | None:
    """One connection row, or ``None``."""
    found = store.select("connections", [("id", connection_id)])
    return found[0] if found else None


# ---------------------------------------------------------------------------
# verify and stats
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
    store: Store,
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
        for row in store.query(sql + " ORDER BY t_request, id", params)
    ]


def untokenized_count(store: Store, stream_ids: Sequence[int]) -> int:
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


def chunk_texts(store: Store, stream_ids: Sequence[int]) -> list[Any]:
    """``(stream_id, seq, choice, chunk_index, text)`` of every chunk of these
    streams, by stream in capture order."""
    if not stream_ids:
        return []
    return store.query(
        "SELECT stream_id, seq, choice, chunk_index, text FROM chunks "
        f"WHERE stream_id IN {_in(stream_ids)} ORDER BY stream_id, seq, id",
        stream_ids,
    )


def token_rows(store: Store, stream_ids: Iterable[int]) -> dict[int, StreamTokenRow]:
    """The token pass's rows of these streams (``sniffer.store.tokens_store``)."""
    from sniffer.store.tokens_store import read_token_rows

    return read_token_rows(store, stream_ids)


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
    "server_predicted_n",
)


def output_rows(
    store: Store,
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
        where.append("(streams.state IS NULL OR streams.state != 'midway')")
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
    store: Store,
    *,
    labels: Sequence[str] | None = None,
    model: str | None = None,
) -> int:
    """LLM streams recovered mid-way (state ``midway``), optionally only those with
    one of ``labels`` / of ``model``."""
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
    return int(store.scalar(f"SELECT count(*) FROM streams WHERE {' AND '.join(where)}", params))
