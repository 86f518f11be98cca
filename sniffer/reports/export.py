"""Export recorded streams: JSON Lines (one record per event) or CSV (one row per stream).

JSONL records, compact JSON, one per line; the records of one stream in capture
order, streams in ``t_request`` order::

    {"event":"request_start","stream_id":S,"client":"IP:PORT","server":"IP:PORT",
     "method":"POST","path":"/v1/chat/completions","model":M,"prompt_len":P,
     "stream":true,"captured_at":ISO8601}
    {"event":"chunk","stream_id":S,"choice_index":0,"chunk_index":K,"delta_text":T,
     "delta_len":len(T),"accumulated_len":A,"finish_reason":null,"captured_at":ISO8601}
    {"event":"stream_done","stream_id":S,"chunk_count":N,"total_text_len":L,
     "elapsed_seconds":E,"request_elapsed_seconds":R,"complete":true,"gap":false,
     "captured_at":ISO8601}

(each record on one line). One ``chunk`` record per stored chunk with
``chunk_index > 0`` (chunks that carry text); ``accumulated_len`` is the running
length per (stream, choice); ``finish_reason`` is set only when that same chunk
carried it. ``stream_done`` counts the exported chunk records (N) and their
text (L); E is measured, as the seed defines it, from the first content chunk
(``t_first_content``, else the first exported chunk) to the end of the stream
(``t_last_chunk``, else ``closed_at``), null when no chunk carried content; R
is the same end minus ``t_request`` (request to end, TTFT included);
``complete`` is ``state == "complete"``; its ``captured_at`` is ``closed_at``.
A stream recovered mid-way (state ``midway``) has null ``method``, ``path``,
``model`` (unless its chunks named it), ``prompt_len`` and ``stream`` in its
``request_start``, ``complete: false`` and one more key, ``"midway": true``, in
its ``stream_done``.
A stream that never closed gets no ``stream_done``. Times are ISO 8601 in UTC
with microseconds (``2025-01-01T12:00:00.123456+00:00``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from sniffer.store.db import Store
from sniffer.store.queries import list_streams, stream_chunks

#: ``progress`` is called every this many streams (and after the last).
PROGRESS_EVERY = 50


def iso_utc(ts: float | None) -> str | None:
    """A capture timestamp as ISO 8601 UTC with microseconds, ``None`` for ``None``."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="microseconds")


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _elapsed(end: float | None, start: float | None) -> float | None:
    if end is None or start is None:
        return None
    return round(end - start, 6)


def stream_records(
    stream: dict[str, Any], chunk_rows: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The JSONL records of one stream (a ``streams`` row and its chunks by seq)."""
    sid = stream["id"]
    records: list[dict[str, Any]] = [
        {
            "event": "request_start",
            "stream_id": sid,
            "client": stream["client"],
            "server": stream["server"],
            "method": stream["method"],
            "path": stream["path"],
            "model": stream["model"],
            "prompt_len": stream["prompt_len"],
            "stream": stream["is_stream"],
            "captured_at": iso_utc(stream["t_request"]),
        }
    ]
    accumulated: dict[int, int] = {}
    count = 0
    total = 0
    first_ts: float | None = None
    for chunk in chunk_rows:
        if not chunk["chunk_index"] or chunk["chunk_index"] <= 0:
            continue
        text = chunk["text"] or ""
        choice = chunk["choice"]
        acc = accumulated.get(choice, 0) + len(text)
        accumulated[choice] = acc
        count += 1
        total += len(text)
        if first_ts is None:
            first_ts = chunk["ts"]
        records.append(
            {
                "event": "chunk",
                "stream_id": sid,
                "choice_index": choice,
                "chunk_index": chunk["chunk_index"],
                "delta_text": text,
                "delta_len": len(text),
                "accumulated_len": acc,
                "finish_reason": chunk["finish_reason"],
                "captured_at": iso_utc(chunk["ts"]),
            }
        )
    if stream["state"] != "open" and stream["closed_at"] is not None:
        end = stream["t_last_chunk"] if stream["t_last_chunk"] is not None else stream["closed_at"]
        first = stream["t_first_content"]
        if first is None:
            first = first_ts
        records.append(
            {
                "event": "stream_done",
                "stream_id": sid,
                "chunk_count": count,
                "total_text_len": total,
                "elapsed_seconds": _elapsed(end, first),
                "request_elapsed_seconds": _elapsed(end, stream["t_request"]),
                "complete": stream["state"] == "complete",
                "gap": bool(stream["gap"]),
                "captured_at": iso_utc(stream["closed_at"]),
            }
        )
        if stream["state"] == "midway":
            # recovered mid-way: a partial stream (its request_start fields unknown, null)
            records[-1]["midway"] = True
    return records


def export_jsonl(
    store: Store,
    out: TextIO,
    *,
    stream_ids: Iterable[int] | None = None,
    label: str | None = None,
    node: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write the JSONL export of the selected streams to ``out``; returns lines written.
    ``progress(streams done, streams)`` is called as it goes.

    Example: ``with open("run.jsonl", "w") as f: export_jsonl(store, f, label="run1")``.
    """
    lines = 0
    selected = list_streams(store, label=label, stream_ids=stream_ids, node=node)
    for i, stream in enumerate(selected, 1):
        for record in stream_records(stream, stream_chunks(store, stream["id"])):
            out.write(_dumps(record))
            out.write("\n")
            lines += 1
        if progress is not None and (i % PROGRESS_EVERY == 0 or i == len(selected)):
            progress(i, len(selected))
    return lines


#: Columns of the CSV export, in order.
CSV_COLUMNS = (
    "stream_id",
    "label",
    "client",
    "server",
    "method",
    "path",
    "dialect",
    "model",
    "stream",
    "status",
    "state",
    "reason",
    "done_seen",
    "gap",
    "requested_at",
    "ttft_seconds",
    "elapsed_seconds",
    "chunk_count",
    "event_count",
    "text_len",
    "finish_reasons",
    "prompt_tokens",
    "completion_tokens",
    "error",
    "flags",
)


def stream_summary(stream: dict[str, Any]) -> dict[str, Any]:
    """One CSV row (``CSV_COLUMNS``) for a ``streams`` row."""
    end = stream["t_last_chunk"] if stream["t_last_chunk"] is not None else stream["closed_at"]
    return {
        "stream_id": stream["id"],
        "label": stream["label"],
        "client": stream["client"],
        "server": stream["server"],
        "method": stream["method"],
        "path": stream["path"],
        "dialect": stream["dialect"],
        "model": stream["model"],
        "stream": stream["is_stream"],
        "status": stream["status"],
        "state": stream["state"],
        "reason": stream["reason"],
        "done_seen": stream["done_seen"],
        "gap": stream["gap"],
        "requested_at": iso_utc(stream["t_request"]),
        "ttft_seconds": _elapsed(stream["t_first_content"], stream["t_request"]),
        "elapsed_seconds": _elapsed(end, stream["t_request"]),
        "chunk_count": stream["chunk_count"],
        "event_count": stream["event_count"],
        "text_len": stream["text_len"],
        "finish_reasons": stream["finish_reasons"],
        "prompt_tokens": stream["prompt_tokens"],
        "completion_tokens": stream["completion_tokens"],
        "error": stream["error"],
        "flags": stream.get("flags"),
    }


def export_csv(
    store: Store,
    out: TextIO,
    *,
    stream_ids: Iterable[int] | None = None,
    label: str | None = None,
    node: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write one CSV row per stream (header first) to ``out``; returns data rows written.
    ``progress(streams done, streams)`` is called as it goes.

    Open ``out`` with ``newline=""``. Example: ``export_csv(store, sys.stdout)``.
    """
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    rows = 0
    selected = list_streams(store, label=label, stream_ids=stream_ids, node=node)
    for stream in selected:
        writer.writerow(stream_summary(stream))
        rows += 1
        if progress is not None and (rows % PROGRESS_EVERY == 0 or rows == len(selected)):
            progress(rows, len(selected))
    return rows
