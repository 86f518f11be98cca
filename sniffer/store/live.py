"""Read side of the store for ``sparseety top``: what a node is doing now.

Every query is bounded (by an index and a row cap), because ``top`` runs them
once a second against a database the daemon is writing: open streams by the
``state`` index, recent streams by the ``t_request`` index, chunks by stream
id, errors by the newest ids. Written once on a ``sniffer.store.db.Store``, so
the same text reads SQLite and PostgreSQL. Rows come back as plain tuples and
dicts; times are capture timestamps (float seconds since the epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sniffer.llm.dialects.base import OUTPUT_KINDS
from sniffer.store.db import Store, in_list
from sniffer.store.lite import PLAIN_HTTP

__all__ = [
    "MAX_OPEN",
    "MAX_RECENT",
    "chunk_figures",
    "open_streams",
    "output_chunk_times",
    "output_texts",
    "recent_errors",
    "recent_streams",
]

#: At most this many open streams are read (the newest).
MAX_OPEN = 500
#: At most this many recently closed streams are read (the newest).
MAX_RECENT = 5000
#: At most this many of the newest error rows are looked at.
MAX_ERRORS = 1000
#: A stream closed in the window may have started this long before it.
LONGEST_STREAM = 3600.0
_OUTPUT = sorted(OUTPUT_KINDS)
#: ``streams`` rows of an LLM stream (not plain HTTP).
_LLM = f"streams.dialect IS NOT NULL AND streams.dialect != '{PLAIN_HTTP}'"
#: ``chunks`` rows that carry output.
_IS_OUTPUT = f"chunks.kind IN ({', '.join(repr(k) for k in _OUTPUT)})"


def _node(table: str, node: str | None) -> tuple[str, list[Any]]:
    return ("", []) if node is None else (f" AND {table}.node = ?", [node])


def _dicts(columns: Sequence[str], rows: list[Any]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


_OPEN_COLUMNS = ("id", "label", "model", "node", "path", "t_request", "t_response", "status")


def open_streams(
    store: Store, *, now: float, node: str | None = None, max_age: float = LONGEST_STREAM
) -> list[dict[str, Any]]:
    """LLM streams still open whose request is at most ``max_age`` seconds old
    (older ones are left by a daemon that stopped): id, label, model, node,
    path, t_request, t_response, status, newest first."""
    mine, params = _node("streams", node)
    rows = store.query(
        f"SELECT {', '.join(f'streams.{c}' for c in _OPEN_COLUMNS)} FROM streams "
        f"WHERE streams.state = 'open' AND streams.t_request >= ? AND {_LLM}{mine} "
        "ORDER BY streams.t_request DESC, streams.id DESC LIMIT ?",
        [now - max_age, *params, MAX_OPEN],
    )
    return _dicts(_OPEN_COLUMNS, rows)


def chunk_figures(store: Store, stream_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per stream, from its chunk rows so far: ``chunks`` (events that carry
    output), ``events`` (all), ``first`` / ``last`` (capture time of the first
    and last output chunk), ``chars`` (characters of content)."""
    if not stream_ids:
        return {}
    ids = list(stream_ids)
    out: dict[int, dict[str, Any]] = {}
    for sid, n_out, n_all, first, last, chars in store.query(
        f"SELECT chunks.stream_id, count(CASE WHEN {_IS_OUTPUT} THEN 1 END), count(*), "
        f"min(CASE WHEN {_IS_OUTPUT} THEN chunks.ts END), "
        f"max(CASE WHEN {_IS_OUTPUT} THEN chunks.ts END), "
        "coalesce(sum(length(chunks.text)), 0) FROM chunks "
        f"WHERE chunks.stream_id IN {in_list(ids)} GROUP BY chunks.stream_id",
        ids,
    ):
        out[int(sid)] = {
            "chunks": int(n_out),
            "events": int(n_all),
            "first": first,
            "last": last,
            "chars": int(chars or 0),
        }
    return out


def output_texts(store: Store, stream_ids: Sequence[int]) -> dict[int, str]:
    """The content stored so far of each stream (all choices, in capture order)."""
    if not stream_ids:
        return {}
    ids = list(stream_ids)
    out: dict[int, list[str]] = {}
    for sid, text in store.query(
        "SELECT chunks.stream_id, chunks.text FROM chunks "
        f"WHERE chunks.stream_id IN {in_list(ids)} AND chunks.text IS NOT NULL "
        "AND chunks.text != '' ORDER BY chunks.stream_id, chunks.seq, chunks.id",
        ids,
    ):
        out.setdefault(int(sid), []).append(text)
    return {sid: "".join(parts) for sid, parts in out.items()}


_RECENT_COLUMNS = (
    "id",
    "label",
    "model",
    "state",
    "t_request",
    "t_first_content",
    "t_last_chunk",
    "closed_at",
    "chunk_count",
)


def recent_streams(store: Store, *, since: float, node: str | None = None) -> list[dict[str, Any]]:
    """LLM streams closed at or after ``since`` (at most :data:`MAX_RECENT`, the
    newest): id, label, model, state, t_request, t_first_content, t_last_chunk,
    closed_at, chunk_count, and ``output_tokens`` (the token pass's count, None
    until it ran)."""
    mine, params = _node("streams", node)
    rows = store.query(
        f"SELECT {', '.join(f'streams.{c}' for c in _RECENT_COLUMNS)}, "
        "stream_tokens.output_count FROM streams LEFT OUTER JOIN stream_tokens "
        "ON stream_tokens.stream_id = streams.id WHERE streams.t_request >= ? "
        f"AND streams.closed_at >= ? AND streams.state != 'open' AND {_LLM}{mine} "
        "ORDER BY streams.closed_at DESC, streams.id DESC LIMIT ?",
        [since - LONGEST_STREAM, since, *params, MAX_RECENT],
    )
    return _dicts((*_RECENT_COLUMNS, "output_tokens"), rows)


def output_chunk_times(
    store: Store, stream_ids: Sequence[int]
) -> dict[tuple[int, int], list[float]]:
    """Capture times of the output chunks of each (stream, choice), in order."""
    if not stream_ids:
        return {}
    ids = list(stream_ids)
    out: dict[tuple[int, int], list[float]] = {}
    for sid, choice, ts in store.query(
        "SELECT chunks.stream_id, chunks.choice, chunks.ts FROM chunks "
        f"WHERE chunks.stream_id IN {in_list(ids)} AND {_IS_OUTPUT} AND chunks.ts IS NOT NULL "
        "ORDER BY chunks.stream_id, chunks.seq, chunks.id",
        ids,
    ):
        out.setdefault((int(sid), int(choice or 0)), []).append(float(ts))
    return out


def recent_errors(
    store: Store, *, since: float, node: str | None = None
) -> list[tuple[str, str, float]]:
    """``(stage, kind, ts)`` of the recorded pipeline errors at or after
    ``since``, among the newest :data:`MAX_ERRORS` rows."""
    where = "" if node is None else " WHERE errors.node = ?"
    rows = store.query(
        f"SELECT errors.stage, errors.kind, errors.ts FROM errors{where} "
        "ORDER BY errors.id DESC LIMIT ?",
        [*([] if node is None else [node]), MAX_ERRORS],
    )
    return [
        (str(stage), str(kind), float(ts))
        for stage, kind, ts in rows
        if ts is not None and ts >= since
    ]
