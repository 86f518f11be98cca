"""Read side of the store for ``sparseety top``: what a node is doing now.

Every query is bounded (by an index and a row cap), because ``top`` runs them
once a second against a database the daemon is writing: open streams by the
``state`` index, recent streams by the ``t_request`` index, chunks by stream
id, errors by the newest ids. SQLAlchemy Core, so the same code reads SQLite
and PostgreSQL. Rows come back as plain tuples and dicts; times are capture
timestamps (float seconds since the epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sniffer.llm.dialects.base import OUTPUT_KINDS
from sniffer.store.lite import PLAIN_HTTP

if TYPE_CHECKING:
    from sqlalchemy import Engine

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


def open_streams(
    engine: Engine, *, now: float, node: str | None = None, max_age: float = LONGEST_STREAM
) -> list[dict[str, Any]]:
    """LLM streams still open whose request is at most ``max_age`` seconds old
    (older ones are left by a daemon that stopped): id, label, model, node,
    path, t_request, t_response, status, newest first."""
    from sqlalchemy import select

    from sniffer.store.models import streams

    s = streams.c
    stmt = select(s.id, s.label, s.model, s.node, s.path, s.t_request, s.t_response, s.status)
    stmt = stmt.where(s.state == "open", s.t_request >= now - max_age)
    stmt = stmt.where(s.dialect.is_not(None), s.dialect != PLAIN_HTTP)
    if node is not None:
        stmt = stmt.where(s.node == node)
    stmt = stmt.order_by(s.t_request.desc(), s.id.desc()).limit(MAX_OPEN)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def chunk_figures(engine: Engine, stream_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per stream, from its chunk rows so far: ``chunks`` (events that carry
    output), ``events`` (all), ``first`` / ``last`` (capture time of the first
    and last output chunk), ``chars`` (characters of content)."""
    if not stream_ids:
        return {}
    from sqlalchemy import case, func, select

    from sniffer.store.models import chunks

    c = chunks.c
    is_output = c.kind.in_(_OUTPUT)
    stmt = (
        select(
            c.stream_id,
            func.count(case((is_output, 1))),
            func.count(),
            func.min(case((is_output, c.ts))),
            func.max(case((is_output, c.ts))),
            func.coalesce(func.sum(func.length(c.text)), 0),
        )
        .where(c.stream_id.in_(list(stream_ids)))
        .group_by(c.stream_id)
    )
    out: dict[int, dict[str, Any]] = {}
    with engine.connect() as conn:
        for sid, n_out, n_all, first, last, chars in conn.execute(stmt):
            out[int(sid)] = {
                "chunks": int(n_out),
                "events": int(n_all),
                "first": first,
                "last": last,
                "chars": int(chars or 0),
            }
    return out


def output_texts(engine: Engine, stream_ids: Sequence[int]) -> dict[int, str]:
    """The content stored so far of each stream (all choices, in capture order)."""
    if not stream_ids:
        return {}
    from sqlalchemy import select

    from sniffer.store.models import chunks

    c = chunks.c
    stmt = (
        select(c.stream_id, c.text)
        .where(c.stream_id.in_(list(stream_ids)), c.text.is_not(None), c.text != "")
        .order_by(c.stream_id, c.seq, c.id)
    )
    out: dict[int, list[str]] = {}
    with engine.connect() as conn:
        for sid, text in conn.execute(stmt):
            out.setdefault(int(sid), []).append(text)
    return {sid: "".join(parts) for sid, parts in out.items()}


def recent_streams(
    engine: Engine, *, since: float, node: str | None = None
) -> list[dict[str, Any]]:
    """LLM streams closed at or after ``since`` (at most :data:`MAX_RECENT`, the
    newest): id, label, model, state, t_request, t_first_content, t_last_chunk,
    closed_at, chunk_count, and ``output_tokens`` (the token pass's count, None
    until it ran)."""
    from sqlalchemy import select

    from sniffer.store.models import streams
    from sniffer.store.tokens_store import stream_tokens

    s = streams.c
    stmt = (
        select(
            s.id,
            s.label,
            s.model,
            s.state,
            s.t_request,
            s.t_first_content,
            s.t_last_chunk,
            s.closed_at,
            s.chunk_count,
            stream_tokens.c.output_count.label("output_tokens"),
        )
        .select_from(streams.outerjoin(stream_tokens, stream_tokens.c.stream_id == s.id))
        .where(s.t_request >= since - LONGEST_STREAM, s.closed_at >= since, s.state != "open")
        .where(s.dialect.is_not(None), s.dialect != PLAIN_HTTP)
    )
    if node is not None:
        stmt = stmt.where(s.node == node)
    stmt = stmt.order_by(s.closed_at.desc(), s.id.desc()).limit(MAX_RECENT)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def output_chunk_times(
    engine: Engine, stream_ids: Sequence[int]
) -> dict[tuple[int, int], list[float]]:
    """Capture times of the output chunks of each (stream, choice), in order."""
    if not stream_ids:
        return {}
    from sqlalchemy import select

    from sniffer.store.models import chunks

    c = chunks.c
    stmt = (
        select(c.stream_id, c.choice, c.ts)
        .where(c.stream_id.in_(list(stream_ids)), c.kind.in_(_OUTPUT), c.ts.is_not(None))
        .order_by(c.stream_id, c.seq, c.id)
    )
    out: dict[tuple[int, int], list[float]] = {}
    with engine.connect() as conn:
        for sid, choice, ts in conn.execute(stmt):
            out.setdefault((int(sid), int(choice or 0)), []).append(float(ts))
    return out


def recent_errors(
    engine: Engine, *, since: float, node: str | None = None
) -> list[tuple[str, str, float]]:
    """``(stage, kind, ts)`` of the recorded pipeline errors at or after
    ``since``, among the newest :data:`MAX_ERRORS` rows."""
    from sqlalchemy import select

    from sniffer.store.models import errors

    e = errors.c
    stmt = select(e.stage, e.kind, e.ts)
    if node is not None:
        stmt = stmt.where(e.node == node)
    stmt = stmt.order_by(e.id.desc()).limit(MAX_ERRORS)
    with engine.connect() as conn:
        return [
            (str(stage), str(kind), float(ts))
            for stage, kind, ts in conn.execute(stmt)
            if ts is not None and ts >= since
        ]
