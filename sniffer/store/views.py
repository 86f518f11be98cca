"""SQL views for people who query the database by hand (``docs/schema.md``).

- ``streams_readable``: one row per stream with readable times (ISO 8601 UTC
  text on SQLite, ``timestamp with time zone`` on PostgreSQL), ``ttft_ms``
  (request head → first chunk with content, reasoning or a tool call) and
  ``duration_ms`` (request head → last chunk), both NULL when the stream is
  flagged ``clock-backwards`` (a difference of its times is no duration, as
  ``sparseety streams`` shows ``(clock)``), and its label, model and summary.
- ``chunks_readable``: one row per chunk with its stream's node, label and
  model, its capture time readable (``captured_at``) and ``ms_after_request``
  (NULL for a clock-backwards stream).

Plain text, no SQLAlchemy, so that ``sniffer.store.lite`` (which creates a new
SQLite file at head without SQLAlchemy) and migration ``0006`` read the same
statements; a test holds what the migration chain leaves in ``sqlite_master``
against ``lite.SCHEMA_DDL``. Changing a view is a new migration that drops and
re-creates it. Other database dialects get no views.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``streams.flags`` holds a JSON list of flag names; this one makes timings void.
_CLOCK = """s.flags LIKE '%"clock-backwards"%'"""


def _sqlite_time(column: str) -> str:
    return f"strftime('%Y-%m-%dT%H:%M:%fZ', {column}, 'unixepoch')"


def _sqlite_ms(later: str, earlier: str) -> str:
    return f"CASE WHEN {_CLOCK} THEN NULL ELSE round(({later} - {earlier}) * 1000, 3) END"


def _pg_ms(later: str, earlier: str) -> str:
    return (
        f"CASE WHEN {_CLOCK} THEN NULL "
        f"ELSE CAST(round(CAST(({later} - {earlier}) * 1000 AS numeric), 3) "
        "AS double precision) END"
    )


def _pg_time(column: str) -> str:
    return f"to_timestamp({column})"


Render = Callable[[str], str]
Diff = Callable[[str, str], str]


def _streams(time: Render, ms: Diff) -> str:
    """One column list for both dialects; ``time`` and ``ms`` render the dialect's part."""
    return (
        "CREATE VIEW streams_readable AS SELECT\n"
        "\ts.id, s.node, s.label, s.model, s.dialect, s.method, s.path, s.status, s.state,\n"
        "\ts.reason, s.is_stream,\n"
        f"\t{time('s.t_request')} AS requested_at,\n"
        f"\t{time('s.t_first_content')} AS first_content_at,\n"
        f"\t{time('s.t_last_chunk')} AS last_chunk_at,\n"
        f"\t{ms('s.t_first_content', 's.t_request')} AS ttft_ms,\n"
        f"\t{ms('s.t_last_chunk', 's.t_request')} AS duration_ms,\n"
        "\ts.chunk_count, s.text_len, s.prompt_tokens, s.completion_tokens,\n"
        "\ts.finish_reasons, s.flags, s.connection_id, s.client, s.server\n"
        "FROM streams AS s"
    )


def _chunks(time: Render, ms: Diff) -> str:
    return (
        "CREATE VIEW chunks_readable AS SELECT\n"
        "\tc.id, c.stream_id, s.node, s.label, s.model, c.seq, c.choice, c.chunk_index,\n"
        f"\tc.kind, {time('c.ts')} AS captured_at,\n"
        f"\t{ms('c.ts', 's.t_request')} AS ms_after_request,\n"
        "\tc.text, c.reasoning, c.tool_calls, c.finish_reason\n"
        "FROM chunks AS c JOIN streams AS s ON s.id = c.stream_id"
    )


#: The views' names, in creation order.
NAMES: tuple[str, ...] = ("streams_readable", "chunks_readable")

#: ``CREATE VIEW`` statements per dialect name (SQLAlchemy's ``dialect.name``).
VIEWS: dict[str, tuple[str, ...]] = {
    "sqlite": (_streams(_sqlite_time, _sqlite_ms), _chunks(_sqlite_time, _sqlite_ms)),
    "postgresql": (_streams(_pg_time, _pg_ms), _chunks(_pg_time, _pg_ms)),
}

__all__ = ["NAMES", "VIEWS"]
