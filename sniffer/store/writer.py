"""Batched writer: store events in, rows out.

``StoreWriter.write`` only buffers; ``flush`` writes the whole batch in ONE
transaction: first the inserts (connections, streams, chunks, errors — on SQLite
in their order, each run of rows with the same NULL columns in one
``executemany`` that binds only the other values; on PostgreSQL one ``COPY …
FROM STDIN`` per table through psycopg 3, else an ``executemany`` through a Core
``insert``), then the updates (connection closes,
stream responses, stream closes — on SQLite each run of rows with the same NULL
values in one ``executemany`` that writes them as literals, elsewhere an
``executemany`` of an ``update`` with ``bindparam``). An update for a row still
buffered in the same batch is merged into that row's insert instead, so it costs
nothing; an update for a row written by an earlier batch becomes an UPDATE that
runs after this batch's inserts. Connection and stream rows and updates are
buffered as dicts of their columns that are not NULL (booleans as 0 and 1, what
SQLite stores): their keys name the columns a SQLite statement binds
(``_insert_sparse``, ``_update_sparse``); other databases get every column
(``_dense``).

Failure policy: no row of one exchange stops the writer. If the database as a
whole cannot take writes (locked, unreachable, a table missing: an
``OperationalError``), the transaction is rolled back, the batch is KEPT in the
buffers and ``StoreError`` is raised; the caller (the daemon) calls ``flush``
again later or ``discard``s the batch. Any other failure is a row the database
refuses (an integer wider than its column, a duplicate id, a value the driver
cannot bind): text the driver cannot encode (lone UTF-16 surrogates from a JSON
``\\ud83d`` escape, NUL on PostgreSQL) is replaced by U+FFFD and the batch
retried once; then the batch is written in parts, halving a part that fails
until the refused rows are found, and each refused row becomes an error row
(stage "store", kind "row-rejected") and a count (``stats["rejected_rows"]``):
everything else is stored.

Credentials: header lists are filtered again here with the one rule of
``sniffer.core.credentials.is_credential_header``, even though the stages upstream
already remove them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import groupby
from typing import TYPE_CHECKING, Any

from sniffer.core.credentials import is_credential_header
from sniffer.core.events import (
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    Endpoint,
    Headers,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamFlagged,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import INT64_MAX, INT64_MIN, Usage
from sniffer.store.db import EngineStore, Store
from sniffer.store.ids import IdBlocks
from sniffer.store.lite import (
    BOOLEAN_COLUMNS,
    PLAIN_HTTP,
    TABLE_COLUMNS,
    SqliteFile,
    UpdateSpec,
    executemany_flat_sqlite,
    executemany_sqlite,
    insert_or_fail_sql,
    insert_sql,
    update_spec,
    update_sql,
)
from sniffer.store.opening import (
    _open_sqlite,
    _sqlite_file,
    create_schema,
    make_engine,
    open_store,
)
from sniffer.store.spec import columns_in

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import Connection

_UNENCODABLE = re.compile("[\ud800-\udfff\x00]")

#: A JSON string literal of a str, as ``json.dumps`` writes it (ASCII, escaped).
_json_str: Callable[[str], str] = json.encoder.encode_basestring_ascii


class StoreError(Exception):
    """The database rejected a batch; the batch is still buffered in the writer."""


#: A header name's start of its JSON pair (``'["name", '``), "" for a name
#: ``is_credential_header`` drops: the test and the name's encoding once per
#: distinct name (bounded, as ``credentials``' own cache).
_header_prefixes: dict[str, str] = {}


def _header_prefix(name: str) -> str:
    prefix = "" if is_credential_header(name) else f"[{_json_str(name)}, "
    if len(_header_prefixes) < 4096:
        _header_prefixes[name] = prefix
    return prefix


#: ``headers_json`` of header lists met before, by the list: a client sends
#: the same headers request after request, a server the same response head
#: (bounded: emptied when full; only texts up to ``_HEADERS_TEXT_MAX_LEN``
#: characters, so crafted heads of many large headers cannot make it hold
#: megabytes). A list with a header ``headers_json`` drops is not kept (no
#: credential held here longer than its event).
_headers_texts: dict[Headers, str] = {}
_HEADERS_TEXTS_MAX = 256
_HEADERS_TEXT_MAX_LEN = 4096


def headers_json(headers: Headers | Iterable[tuple[str, str]]) -> str:
    """Headers as a JSON list of ``[name, value]`` pairs, credentials dropped.

    The text ``json.dumps`` writes (a test compares them), put together from
    the C string encoder: two per stream (request and response), and
    ``json.dumps`` sets up an encoder per call (about 2.5 µs of 4 for seven
    headers). Each name's credential test and encoding are looked up
    (``_header_prefixes``), and the text of a list met before
    (``_headers_texts``: ~1k instructions against ~11k for three headers)."""
    if type(headers) is tuple:
        text = _headers_texts.get(headers)
        if text is not None:
            return text
    enc = _json_str
    known = _header_prefixes.get
    pairs = [p + enc(v) + "]" for n, v in headers if (p := known(n) or _header_prefix(n))]
    text = "[" + ", ".join(pairs) + "]"
    if type(headers) is tuple and len(pairs) == len(headers) and len(text) <= _HEADERS_TEXT_MAX_LEN:
        if len(_headers_texts) >= _HEADERS_TEXTS_MAX:
            _headers_texts.clear()
        _headers_texts[headers] = text
    return text


def endpoint_text(endpoint: Endpoint) -> str:
    """``"IP:PORT"``; IPv6 addresses in brackets (``"[::1]:8000"``)."""
    host, port = endpoint
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------------
# typed LLM values → JSON (only the store serialises them)
# ---------------------------------------------------------------------------

#: Compact JSON, non-ASCII kept as is: the text the dialects store for the
#: nested objects they pass through as text (tool calls, logprobs).
_dumps: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def usage_json(usage: Usage | None) -> str | None:
    """The usage object as stored (``streams.usage``, ``chunks.usage``)."""
    return None if usage is None else _dumps(usage.raw)


def _clean_text(value: str) -> str:
    return _UNENCODABLE.sub("\ufffd", value)


def _clean_value(value: Any) -> Any:
    if isinstance(value, str) and (not value.isascii() or "\x00" in value):
        return _clean_text(value)
    return value


def _clean_tuple(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_clean_value(v) for v in row)


def _clean_row(row: dict[str, Any]) -> None:
    for key, value in row.items():
        if isinstance(value, str) and (not value.isascii() or "\x00" in value):
            row[key] = _clean_text(value)


# ---------------------------------------------------------------------------
# event → row
# ---------------------------------------------------------------------------


#: A boolean as the integer SQLite stores (``_bit(v, v)``: None stays None).
#: sqlite3 binds a ``bool`` through its adapter registry (``lite``: a look-up
#: and a call, ~1,100 instructions a value; an ``int`` ~300), and a stream
#: row has five, its close two, a connection row one: the buffered rows hold
#: them as 0 and 1 (what the adapter binds), other databases get ``bool``
#: again (``_dense``).
_bit: Callable[[Any, Any], Any] = {True: 1, False: 0}.get


def _connection_row(ev: ConnectionOpened, label: str | None, node: str) -> dict[str, Any]:
    """A new connection's row: its columns that are not NULL (``_insert_sparse``;
    a None where the event's type says there is none is bound, NULL all the same)."""
    client, server = ev.client, ev.server
    row = {
        "id": ev.conn,
        "client_ip": client[0],
        "client_port": client[1],
        "server_ip": server[0],
        "server_port": server[1],
        "opened_at": ev.ts,
        "syn_seen": _bit(ev.syn_seen, ev.syn_seen),
        "capture": ev.capture,
        "node": node,
    }
    if ev.pid is not None:
        row["pid"] = ev.pid
    if ev.comm is not None:
        row["comm"] = ev.comm
    if label is not None:
        row["label"] = label
    return row


def _stream_row(ev: StreamOpened, node: str) -> dict[str, Any]:
    """A new stream's row: its non-NULL columns only (a None column is NULL:
    ``_insert_sparse`` binds none). The columns every stream has in one dict
    display (made at its size), then those a request may lack, one by one;
    the close's counts start at zero."""
    req = ev.request
    row = {
        "id": ev.stream,
        "connection_id": ev.conn,
        "exchange": ev.exchange,
        "capture": ev.capture,
        "client": endpoint_text(ev.client),
        "server": endpoint_text(ev.server),
        "dialect": ev.dialect if ev.dialect is not None else PLAIN_HTTP,
        "request_headers": headers_json(ev.request_headers),
        "t_request": ev.ts,
        "state": "open",
        "done_seen": 0,
        "gap": 0,
        "chunk_count": 0,
        "event_count": 0,
        "text_len": 0,
        "text_kept": _bit(ev.text_kept, ev.text_kept),
        "node": node,
    }
    # a body recovered mid-way has no request: "" → NULL
    if ev.method:
        row["method"] = ev.method
    if ev.path:
        row["path"] = ev.path
    if ev.label is not None:
        row["label"] = ev.label
    if ev.pid is not None:
        row["pid"] = ev.pid
    if ev.comm is not None:
        row["comm"] = ev.comm
    if ev.request_body is not None:
        row["request_json"] = ev.request_body
    if req.model is not None:
        row["model"] = req.model
    if req.stream is not None:
        row["is_stream"] = _bit(req.stream, req.stream)
    if req.temperature is not None:
        row["temperature"] = req.temperature
    if req.top_p is not None:
        row["top_p"] = req.top_p
    if req.max_tokens is not None:
        row["max_tokens"] = req.max_tokens
    if req.n is not None:
        row["n"] = req.n
    if req.seed is not None:
        row["seed"] = req.seed
    if req.prompt_len is not None:
        row["prompt_len"] = req.prompt_len
    return row


#: The stream columns each write fills (``sniffer.store.spec``, in table order):
#: the server-reported speculative decoding and timings (migration 0005, from the
#: stream's last usage), the response head, and the close (with the former).
SERVER_STATS_COLUMNS = columns_in("streams", "server")
_RESPONSE_COLUMNS = columns_in("streams", "response")
_CLOSE_COLUMNS = columns_in("streams", "close", "server")


def _response_values(ev: StreamResponse, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The columns the response head fills (those not NULL), set in ``values``
    (the stream's buffered row: no dict made and merged in) or in a new dict."""
    if values is None:
        values = {}
    elif "response_headers" in values:  # a second head: the first's columns go
        for c in _RESPONSE_COLUMNS:
            values.pop(c, None)
    if ev.status is not None:
        values["status"] = ev.status
    values["response_headers"] = headers_json(ev.headers)
    values["content_type"] = ev.content_type
    values["streaming"] = _bit(ev.streaming, ev.streaming)
    values["t_response"] = ev.ts
    return values


def server_stats_values(usage: Usage) -> dict[str, Any]:
    """The ``spec_*`` and ``server_*`` column values of a stream's usage that
    are not NULL."""
    sd, t = usage.speculative, usage.timings
    out: dict[str, Any] = {}
    if sd is not None:
        out["spec_source"] = sd.source
        out["spec_draft_tokens"] = sd.draft_tokens
        out["spec_accepted_tokens"] = sd.accepted_tokens
        out["spec_steps"] = sd.steps
        out["spec_accept_length"] = sd.accept_length
        out["spec_accept_rate"] = sd.acceptance_rate
        if sd.histogram:
            out["spec_histogram"] = json.dumps(list(sd.histogram))
    if t is not None:
        out["server_prompt_n"] = t.prompt_n
        out["server_prompt_ms"] = t.prompt_ms
        out["server_predicted_n"] = t.predicted_n
        out["server_predicted_ms"] = t.predicted_ms
    rejected = (sd.rejected if sd is not None else ()) + (t.rejected if t is not None else ())
    if rejected:
        out["server_rejected"] = json.dumps(list(rejected))
    return {k: v for k, v in out.items() if v is not None}


#: A stream state's column text (``StreamState.value``: an enum member's
#: ``value`` is a property, its look-up costs more than this dict's).
_STATE_TEXT: dict[Any, str] = {state: state.value for state in StreamState}


def finish_reasons_json(pairs: tuple[tuple[int, str], ...]) -> str:
    """``streams.finish_reasons``: the JSON object of choice → finish reason,
    the text ``json.dumps`` writes (a test compares them), put together from
    the C string encoder as ``headers_json`` does."""
    if not pairs:
        return "{}"
    reasons = {str(choice): reason for choice, reason in pairs}
    if all(type(r) is str for r in reasons.values()):
        enc = _json_str
        return "{" + ", ".join([f"{enc(c)}: {enc(r)}" for c, r in reasons.items()]) + "}"
    return json.dumps(reasons)


def _close_values(ev: StreamClosed, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The columns the close fills (those not NULL), set in ``values`` (the
    stream's buffered row: no dict made and merged in) or in a new dict (an
    update, which writes NULL in the others). ``model``: a row recovered
    mid-way has no request, its model is the one the recovered chunks name;
    None leaves the column as it is (in a buffered row, a model already there
    stays)."""
    usage = ev.usage
    state = ev.state
    if values is None:
        values = {}
    elif "closed_at" in values:  # a second close: the first's columns go
        for c in _CLOSE_COLUMNS:
            values.pop(c, None)
    if (
        state == StreamState.MIDWAY
        and ev.response_model is not None
        and values.get("model") is None
    ):
        values["model"] = ev.response_model
    values["state"] = _STATE_TEXT.get(state) or str(state)
    values["reason"] = ev.reason
    values["done_seen"] = _bit(ev.done_seen, ev.done_seen)
    values["gap"] = _bit(ev.gap, ev.gap)
    if ev.t_first_content is not None:
        values["t_first_content"] = ev.t_first_content
    if ev.t_last_chunk is not None:
        values["t_last_chunk"] = ev.t_last_chunk
    values["chunk_count"] = ev.chunk_count
    values["event_count"] = ev.event_count
    values["text_len"] = ev.text_len
    values["finish_reasons"] = finish_reasons_json(ev.finish_reasons)
    if usage is not None:
        values["usage"] = usage_json(usage)
        if usage.prompt_tokens is not None:
            values["prompt_tokens"] = usage.prompt_tokens
        if usage.completion_tokens is not None:
            values["completion_tokens"] = usage.completion_tokens
        if usage.speculative is not None or usage.timings is not None:
            values.update(server_stats_values(usage))
    if ev.response_body is not None:
        values["response_body"] = ev.response_body
    values["request_bytes"] = ev.request_bytes
    values["response_bytes"] = ev.response_bytes
    if ev.error is not None:
        values["error"] = ev.error
    values["closed_at"] = ev.ts
    if ev.flags:
        values["flags"] = json.dumps([str(f) for f in ev.flags])
    else:  # (flags a StreamFlagged set in the buffered row: the close's word is the last)
        values.pop("flags", None)
    return values


#: Columns a chunk row fills (the id is the database's), in table order.
_CHUNK_COLUMNS = tuple(c for c in TABLE_COLUMNS["chunks"] if c != "id")
_USAGE_AT = _CHUNK_COLUMNS.index("usage")
_CHUNK_TS_AT = _CHUNK_COLUMNS.index("ts")

#: The ChunkEvent fields that are None unless the chunk carries one (their
#: default): a content delta has no tool call, finish reason, logprobs, usage,
#: raw item or server tokens. Their columns are the table's last (a test checks).
OPTIONAL_CHUNK_FIELDS = tuple(f.name for f in dataclasses.fields(ChunkEvent) if f.default is None)

#: A buffered chunk row is one of two tuples: all of ``_CHUNK_COLUMNS``, or, for a
#: chunk whose optional fields are all None (nearly every chunk), only these
#: leading columns: the flush then binds no parameter for the six NULLs
#: (``_insert_by_nulls`` says what each costs).
_PLAIN_CHUNK_COLUMNS = _CHUNK_COLUMNS[: len(_CHUNK_COLUMNS) - len(OPTIONAL_CHUNK_FIELDS)]
_PLAIN_CHUNK_LEN = len(_PLAIN_CHUNK_COLUMNS)
_NO_OPTIONAL: tuple[None, ...] = (None,) * len(OPTIONAL_CHUNK_FIELDS)
#: the NULL columns of a plain chunk row
_PLAIN_CHUNK_NULLS = (False,) * _PLAIN_CHUNK_LEN + (True,) * len(OPTIONAL_CHUNK_FIELDS)
#: A plain chunk of kind ``content`` without reasoning (all but a few chunks of
#: a stream) is buffered as a third, shorter tuple: the plain row without its
#: ``kind`` and ``reasoning``, which its INSERT writes as the literals
#: ``'content'`` and ``''`` (binding a text costs sqlite3 a copy of it: about
#: 0.3 µs per row less, measured with runs of 166 rows).
_CONTENT_KIND = "content"
_CONTENT_CHUNK_COLUMNS = tuple(c for c in _PLAIN_CHUNK_COLUMNS if c not in ("kind", "reasoning"))
_CONTENT_CHUNK_LEN = len(_CONTENT_CHUNK_COLUMNS)
_CONTENT_KIND_AT = _PLAIN_CHUNK_COLUMNS.index("kind")
_CONTENT_REASONING_AT = _PLAIN_CHUNK_COLUMNS.index("reasoning")
_FULL_CHUNK_LEN = len(_CHUNK_COLUMNS)
_ERROR_COLUMNS = tuple(c for c in TABLE_COLUMNS["errors"] if c != "id")
_CONNECTION_COLUMNS = TABLE_COLUMNS["connections"]
_STREAM_COLUMNS = TABLE_COLUMNS["streams"]


#: The ChunkEvent fields of a row of ``_CHUNK_COLUMNS``, of a plain row
#: (``_PLAIN_CHUNK_COLUMNS``) and of a content row (``_CONTENT_CHUNK_COLUMNS``):
#: the fields carry the column names, but for ``stream`` → ``stream_id``.
_CHUNK_ROW_FIELDS = ("stream", *_CHUNK_COLUMNS[1:])
_PLAIN_ROW_FIELDS = ("stream", *_PLAIN_CHUNK_COLUMNS[1:])
_CONTENT_ROW_FIELDS = ("stream", *_CONTENT_CHUNK_COLUMNS[1:])
#: A chunk row in ``_CHUNK_COLUMNS`` order, built in C (this is the hot path).
_chunk_row: Callable[[ChunkEvent], tuple[Any, ...]] = operator.attrgetter(*_CHUNK_ROW_FIELDS)
#: The plain row of a chunk whose optional fields are all None.
_plain_chunk_row: Callable[[ChunkEvent], tuple[Any, ...]] = operator.attrgetter(*_PLAIN_ROW_FIELDS)
#: The content row of a plain ``content`` chunk without reasoning.
_content_chunk_row: Callable[[ChunkEvent], tuple[Any, ...]] = operator.attrgetter(
    *_CONTENT_ROW_FIELDS
)

#: ``(events, start, rows, pending, batch_size) -> (stop, pending)``: the
#: plain and content rows of a run of a batch's chunk events appended to
#: ``rows``, as :meth:`StoreWriter.write_many`'s loop (the reference) does;
#: the run stops before an event that loop hands to ``write`` and after the
#: row that makes ``pending`` reach ``batch_size``.
ChunkRunRows = Callable[[list[Any], int, list[tuple[Any, ...]], int, int], tuple[int, int]]


@functools.cache
def native_chunk_rows() -> ChunkRunRows | None:
    """The native core's :data:`ChunkRunRows` (``sniffer._native.ChunkRows``:
    ~1.6k instructions per chunk less than the Python loop, which reads ~15
    slots per chunk through ``getattr``), or None (the pure core)."""
    from sniffer import native_core

    native = getattr(native_core()[0], "ChunkRows", None)
    if native is None:  # the pure core (or a module built before it)
        return None
    rows: ChunkRunRows = native(
        ChunkEvent,
        _CONTENT_ROW_FIELDS,
        _PLAIN_ROW_FIELDS,
        OPTIONAL_CHUNK_FIELDS,
        _CONTENT_KIND,
    )
    return rows


def _full_chunk_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Any buffered chunk row (content, plain or full) as all of ``_CHUNK_COLUMNS``."""
    n = len(row)
    if n == _CONTENT_CHUNK_LEN:  # (the reasoning's place in the short row: one less)
        k, r = _CONTENT_KIND_AT, _CONTENT_REASONING_AT - 1
        return (*row[:k], _CONTENT_KIND, *row[k:r], "", *row[r:], *_NO_OPTIONAL)
    if n == _PLAIN_CHUNK_LEN:
        return row + _NO_OPTIONAL
    return row


def chunk_row(ev: ChunkEvent) -> tuple[Any, ...]:
    """The buffered row of a chunk: its content row (a plain ``content`` chunk
    without reasoning), its plain row when its optional fields are all None,
    else all its columns (the typed usage as its JSON).
    ``StoreWriter.write_many`` inlines the plain cases (the hot path)."""
    if ev.usage is None:
        if (
            ev.tool_calls is None
            and ev.finish_reason is None
            and ev.logprobs is None
            and ev.raw is None
            and ev.server_tokens is None
        ):
            if ev.kind == _CONTENT_KIND and ev.reasoning == "":
                return _content_chunk_row(ev)
            return _plain_chunk_row(ev)
        return _chunk_row(ev)
    row = _chunk_row(ev)  # rare: the typed usage becomes its JSON here
    return (*row[:_USAGE_AT], usage_json(ev.usage), *row[_USAGE_AT + 1 :])


@functools.cache
def _insert_sql_nulls(
    table: str, columns: tuple[str, ...], nulls: tuple[bool, ...]
) -> tuple[str, int]:
    """The SQLite INSERT of a row of ``columns`` whose values are NULL where
    ``nulls`` says so (written as NULL in the text: no parameter), and its
    number of parameters."""
    return insert_or_fail_sql(table, columns, tuple("NULL" if null else "?" for null in nulls))


#: The INSERTs (text, parameters) of a run of plain chunk rows, and of content
#: rows (their kind and reasoning literals).
_PLAIN_CHUNK_SQL = _insert_sql_nulls("chunks", _CHUNK_COLUMNS, _PLAIN_CHUNK_NULLS)
_CONTENT_CHUNK_SQL = insert_or_fail_sql(
    "chunks",
    _CHUNK_COLUMNS,
    tuple(
        {_CONTENT_KIND_AT: f"'{_CONTENT_KIND}'", _CONTENT_REASONING_AT: "''"}.get(i, "?")
        if i < _PLAIN_CHUNK_LEN
        else "NULL"
        for i in range(_FULL_CHUNK_LEN)
    ),
)


def _insert_by_nulls(
    conn: Connection, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> None:
    """Insert rows of ``columns`` on SQLite in their order, each run of rows with
    the same NULL columns in one ``executemany`` that binds only the other
    values: sqlite3 binds a None through its adapter (a look-up and a call:
    about 1,170 instructions each, six of a chunk row's fourteen values, some
    25 of a stream row's). In order, so that the ids the database gives (chunks,
    errors) are the ones one statement would give, and the b-tree is only
    appended to."""
    run: list[tuple[Any, ...]] = []
    run_nulls: tuple[bool, ...] = ()
    for row in rows:
        nulls = tuple([v is None for v in row])
        if nulls != run_nulls:
            if run:
                executemany_sqlite(conn, *_insert_sql_nulls(table, columns, run_nulls), run)
            run, run_nulls = [], nulls
        run.append(tuple([v for v in row if v is not None]))
    if run:
        executemany_sqlite(conn, *_insert_sql_nulls(table, columns, run_nulls), run)


@functools.cache
def _error_row(ev: PipelineError, node: str) -> tuple[Any, ...]:
    return (ev.ts, ev.stage, ev.kind, ev.message, ev.conn, ev.stream, node)


#: A buffered UPDATE: the row's id and the values of the columns it sets
#: (by column name, as the row dicts of ``_stream_rows`` hold them).
Update = tuple[int, dict[str, Any]]


def _bind(name: str, row_id: int, values: dict[str, Any]) -> dict[str, Any]:
    """The parameters by name (``b_<column>``, ``b_id``) of an UPDATE of
    ``_UPDATES[name]``: the named or compiled form SQLAlchemy runs on other
    databases than SQLite (every column of the update: None where ``values``
    has none)."""
    table, columns, _ = _UPDATES[name]
    out = {f"b_{c}": v for c, v in zip(columns, _dense(values, columns, table), strict=True)}
    out["b_id"] = row_id
    return out


#: The UPDATEs a flush runs for rows written by an earlier batch (by id).
_UPDATES: dict[str, UpdateSpec] = {
    "conn_close": update_spec("connections", ("closed_at", "close_reason")),
    "stream_response": update_spec("streams", _RESPONSE_COLUMNS),
    "stream_close": update_spec("streams", _CLOSE_COLUMNS, coalesce=("model",)),
    "stream_flags": update_spec("streams", ("flags",)),
}


@functools.cache
def _update_sql_keys(name: str, keys: tuple[str, ...]) -> str:
    """The SQLite UPDATE of ``_UPDATES[name]`` for rows whose values dict has
    ``keys`` (the columns that are not NULL, in its order): those are
    parameters, every other column of the update is set to the literal NULL
    (no parameter), and a ``coalesce`` column (set only where it is NULL) is
    left out when it has no value. Its parameters: the values in ``keys``
    order, then the id."""
    table, columns, coalesce = _UPDATES[name]
    unknown = set(keys) - set(columns)
    if unknown:
        raise ValueError(f"update {name} sets no column {sorted(unknown)}")
    sets = [f"{c}=coalesce({table}.{c}, ?)" if c in coalesce else f"{c}=?" for c in keys]
    sets += [f"{c}=NULL" for c in columns if c not in keys and c not in coalesce]
    return f"UPDATE {table} SET {', '.join(sets)} WHERE {table}.id = ?"


def _update_sparse(conn: Connection, name: str, items: list[Update]) -> int:
    """Run the SQLite UPDATE of ``_UPDATES[name]`` for every ``(id, values)``
    (``values``: the columns that are not NULL, ``_close_values``): each run
    of rows with the same columns in one ``executemany`` of a statement that
    writes the others as NULL literals (``_update_sql_keys``: a None bound
    costs sqlite3 an adapter look-up, ~1,400 instructions, some twenty of a
    stream close's 34 columns; the keys of a dict and its values come out as
    tuples in C, where a test per value cost ~15k instructions a close). In
    order, as one statement would run them. Returns how many rows they
    changed."""
    changed = 0
    run: list[tuple[Any, ...]] = []
    run_keys: tuple[str, ...] | None = None
    for row_id, values in items:
        keys = tuple(values)
        if keys != run_keys:
            if run_keys is not None:
                changed += conn.exec_driver_sql(_update_sql_keys(name, run_keys), run).rowcount
            run, run_keys = [], keys
        run.append((*values.values(), row_id))
    if run_keys is not None:
        changed += conn.exec_driver_sql(_update_sql_keys(name, run_keys), run).rowcount
    return changed


@functools.cache
def _insert_sql_keys(table: str, keys: tuple[str, ...]) -> tuple[str, int]:
    """The SQLite INSERT of a row of the columns ``keys`` (in that order: the
    row is the same whatever the order of its column list), and its number
    of parameters."""
    unknown = set(keys) - set(TABLE_COLUMNS[table])
    if unknown:
        raise ValueError(f"table {table} has no column {sorted(unknown)}")
    return insert_or_fail_sql(table, keys)


def _insert_sparse(conn: Connection, table: str, rows: Iterable[dict[str, Any]]) -> None:
    """Insert rows held as dicts of their columns that are not NULL
    (``_stream_row``, ``_connection_row``) on SQLite, in their order: each run
    of rows with the same columns (the same keys in the same order: nearly
    every row of a batch) in one ``executemany_flat_sqlite`` of an INSERT of
    those columns only, its parameters the dicts' ``values()`` one after
    another (no tuple per row). No None is bound (an adapter call each, some
    25 of a stream's 62 columns) and no value tested in Python: a stream row
    went in as a tuple of its 62 columns (``operator.itemgetter``) and two
    comprehensions over it, ~40k instructions of the ~125k of its INSERT
    (callgrind)."""
    run: list[Any] = []
    run_keys: tuple[str, ...] | None = None
    for row in rows:
        keys = tuple(row)
        if keys != run_keys:
            if run_keys is not None:
                executemany_flat_sqlite(conn, *_insert_sql_keys(table, run_keys), run)
            run, run_keys = [], keys
        run += row.values()
    if run_keys is not None:
        executemany_flat_sqlite(conn, *_insert_sql_keys(table, run_keys), run)


def _dense(row: dict[str, Any], columns: tuple[str, ...], table: str) -> tuple[Any, ...]:
    """A buffered row or update (its columns that are not NULL, booleans as 0
    and 1) as the values of ``columns``, None where it has none and booleans
    as ``bool``: what other databases than SQLite bind."""
    booleans = BOOLEAN_COLUMNS[table]
    return tuple(
        (bool(v) if v is not None and c in booleans else v) for c in columns for v in (row.get(c),)
    )


def _update_stmt(spec: UpdateSpec) -> Any:
    """The SQLAlchemy statement of an UPDATE spec (non-SQLite dialects compile it)."""
    from sqlalchemy import bindparam, func, update

    from sniffer.store import models

    name, columns, coalesce = spec
    table = getattr(models, name)
    return (
        update(table)
        .where(table.c.id == bindparam("b_id"))
        .values(
            {
                c: func.coalesce(table.c[c], bindparam(f"b_{c}"))
                if c in coalesce
                else bindparam(f"b_{c}")
                for c in columns
            }
        )
    )


class StoreWriter:
    """Buffers store events and writes them in batched transactions.

    Every connection, stream and error row carries ``node`` (default: the
    host name). ``conn_ids`` and ``stream_ids`` hand out ids reserved in
    blocks from the database (:mod:`sniffer.store.ids`): give them to the
    pipeline so that no other writer ever uses the same ids.

    Example::

        writer = StoreWriter("capture.db", node="gpu-07")
        pipe = Pipeline(PipelineConfig(conn_ids=writer.conn_ids, stream_ids=writer.stream_ids))
        for ev in events:
            writer.write(ev)
        writer.close()

    On PostgreSQL (psycopg 3) the inserts go through ``COPY … FROM STDIN``
    (``copy=False``: the driver's pipelined ``executemany``, as on SQLite).

    A SQLite file (a path or a plain ``sqlite:///`` URL, no ``engine`` given) is
    written through the standard library's driver (``sniffer.store.lite``):
    opening it costs one query and no SQLAlchemy import when its schema is at
    head. ``engine`` is then made on first use (the token pass, the reports).

    ``ids_from`` names another database to reserve the id blocks in: a parallel
    replay worker writes a part file (``sniffer.store.parts``) whose rows keep
    the ids the database they are merged into handed out.
    """

    def __init__(
        self,
        url_or_path: str,
        *,
        batch_size: int = 5000,
        engine: Engine | None = None,
        label: str | None = None,
        node: str | None = None,
        copy: bool = True,
        ids_from: str | None = None,
    ) -> None:
        self._url = url_or_path
        self._owns_engine = engine is None
        self._engine: Engine | None = engine
        #: the SQLite file written without SQLAlchemy (None: rows go through ``engine``)
        self._lite: SqliteFile | None = None
        path = _sqlite_file(url_or_path) if engine is None else None
        if path is not None:
            self._lite, self._engine = _open_sqlite(url_or_path, path)
        elif engine is None:
            self._engine = make_engine(url_or_path)
        else:
            create_schema(engine)
        self.batch_size = max(1, batch_size)
        #: label given to connection rows (streams carry their own label)
        self.label = label
        #: the sidecar's name, stored on every connection, stream and error row
        self.node: str = node or socket.gethostname()
        self._store: Store | None = self._lite
        #: the database the ids are reserved in when it is not this one (``ids_from``)
        self._id_store: Store | None = None if ids_from is None else open_store(ids_from)
        id_store = self.store if self._id_store is None else self._id_store
        self.conn_ids = IdBlocks(id_store, "connections")
        self.stream_ids = IdBlocks(id_store, "streams")
        #: errors of a batch the driver cannot encode (cleaned and retried
        #: once), and of a database that cannot take writes at all (the batch
        #: is kept: ``StoreError``); any other error is a refused row (``_isolate``)
        self._unencodable: tuple[type[BaseException], ...]
        self._db_down: tuple[type[BaseException], ...]
        if self._lite is not None:
            import sqlite3

            self.dialect_name = "sqlite"
            self.copy = False
            self._unencodable = (UnicodeEncodeError, ValueError, sqlite3.DataError)
            self._db_down = (sqlite3.OperationalError,)
        else:
            from sqlalchemy import exc as sa_exc

            dialect = self.engine.dialect
            #: the database's dialect ("sqlite", "postgresql")
            self.dialect_name = dialect.name
            #: COPY for inserts (PostgreSQL through psycopg 3 only)
            self.copy = copy and dialect.name == "postgresql" and dialect.driver == "psycopg"
            dbapi = getattr(dialect, "dbapi", None)
            self._unencodable = (
                UnicodeEncodeError,
                ValueError,
                sa_exc.DataError,
                getattr(dbapi, "DataError", sa_exc.DataError),
            )
            down: list[type[BaseException]] = [
                sa_exc.OperationalError,
                sa_exc.DisconnectionError,
                sa_exc.TimeoutError,
                getattr(dbapi, "OperationalError", sa_exc.OperationalError),
            ]
            if dialect.name != "sqlite":  # sqlite3's InterfaceError is a value it cannot bind
                down += [
                    sa_exc.InterfaceError,
                    getattr(dbapi, "InterfaceError", sa_exc.InterfaceError),
                ]
            self._db_down = tuple(down)
        self._conn_rows: dict[int, dict[str, Any]] = {}
        self._stream_rows: dict[int, dict[str, Any]] = {}
        self._chunk_rows: list[tuple[Any, ...]] = []
        self._error_rows: list[tuple[Any, ...]] = []
        self._sql: dict[str, tuple[str, tuple[str, ...] | None]] = {}
        self._conn_closes: list[Update] = []
        self._stream_responses: list[Update] = []
        self._stream_closes: list[Update] = []
        self._stream_flags: list[Update] = []  # flags found after a close
        self._pending = 0
        self._closed = False
        self._closing = False
        self.stats: dict[str, float] = {
            "connections": 0,
            "streams": 0,
            "chunks": 0,
            "errors": 0,
            "updates": 0,
            "unmatched_updates": 0,
            "flushes": 0,
            "flush_seconds": 0.0,
            "failed_flushes": 0,
            "cleaned_batches": 0,
            "discarded_rows": 0,
            "isolated_batches": 0,
            "rejected_rows": 0,
            "lost_error_rows": 0,
        }

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine of the database (made on first use for a SQLite file
        the writer opened without it)."""
        if self._engine is None:
            self._engine = make_engine(self._url)
        return self._engine

    @property
    def store(self) -> Store:
        """The database as a store (``sniffer.store.db``): the SQLite file the writer
        opened without SQLAlchemy, else its engine's."""
        if self._store is None:
            self._store = EngineStore(self.engine)
        return self._store

    # -- ids ---------------------------------------------------------------

    def id_bases(self) -> tuple[int, int]:
        """(next connection id, next stream id): one past every id in the database
        and in the unflushed batch. Informative only: ids to hand out come from
        ``conn_ids`` / ``stream_ids``, which stay unique with concurrent writers."""
        max_conn = self.store.scalar("SELECT max(connections.id) FROM connections")
        max_stream = self.store.scalar("SELECT max(streams.id) FROM streams")
        conn_ids = [max_conn or 0, *self._conn_rows]
        stream_ids = [max_stream or 0, *self._stream_rows]
        return max(conn_ids) + 1, max(stream_ids) + 1

    # -- buffering ---------------------------------------------------------

    @property
    def pending(self) -> int:
        """Rows and updates waiting for the next flush."""
        return self._pending

    def write(self, event: StoreEvent) -> None:
        """Buffer one event; flushes when ``batch_size`` rows are pending.

        Raises ``StoreError`` only from that automatic flush (the batch is kept).
        """
        if isinstance(event, ChunkEvent):
            self._chunk_rows.append(chunk_row(event))
        elif isinstance(event, StreamOpened):
            self._stream_rows[event.stream] = _stream_row(event, self.node)
        elif isinstance(event, StreamResponse):
            row = self._stream_rows.get(event.stream)
            if row is not None:
                _response_values(event, row)
                return
            self._stream_responses.append((event.stream, _response_values(event)))
        elif isinstance(event, StreamClosed):
            row = self._stream_rows.get(event.stream)
            if row is not None:
                _close_values(event, row)
                return
            self._stream_closes.append((event.stream, _close_values(event)))
        elif isinstance(event, ConnectionOpened):
            self._conn_rows[event.conn] = _connection_row(event, self.label, self.node)
        elif isinstance(event, ConnectionClosed):
            crow = self._conn_rows.get(event.conn)
            if crow is not None:  # (its buffered row: set there)
                crow["closed_at"] = event.ts
                crow["close_reason"] = event.reason
                return
            self._conn_closes.append(
                (event.conn, {"closed_at": event.ts, "close_reason": event.reason})
            )
        elif isinstance(event, PipelineError):
            self._error_rows.append(_error_row(event, self.node))
        elif isinstance(event, StreamFlagged):
            # (no flags: an empty dict, the UPDATE writes NULL)
            flags = {"flags": json.dumps([str(f) for f in event.flags])} if event.flags else {}
            row = self._stream_rows.get(event.stream)
            if row is not None:
                row.pop("flags", None)
                row.update(flags)
                return
            self._stream_flags.append((event.stream, flags))  # after the close's update
        else:
            return
        self._pending += 1
        if self._pending >= self.batch_size:
            self.flush()

    def write_many(self, events: Iterable[StoreEvent]) -> None:
        """Buffer the events in order, as :meth:`write` each; flushes whenever
        ``batch_size`` rows are pending (raises ``StoreError`` only from it)."""
        rows = native_chunk_rows()
        if rows is None or type(events) is not list:
            self._write_many(events)
            return
        # The runs of plain chunk rows natively, anything else through write().
        write = self.write
        batch_size = self.batch_size
        i, n = 0, len(events)
        while i < n:
            start = i
            i, self._pending = rows(events, i, self._chunk_rows, self._pending, batch_size)
            if i > start and self._pending >= batch_size:  # its last row filled the batch
                self.flush()
            elif i < n:
                write(events[i])
                i += 1

    def _write_many(self, events: Iterable[StoreEvent]) -> None:
        """:meth:`write_many` in Python (the reference of the native runs)."""
        # Chunk rows (nearly every event) inline, with the pending count and the
        # row list's append held in locals (re-read after anything that may
        # flush, which starts new buffers); the rest through write(). The
        # plain cases of ``chunk_row``: the optional fields read one by one
        # cost less than the six attribute reads the plain row saves.
        write = self.write
        batch_size = self.batch_size
        append = self._chunk_rows.append
        pending = self._pending
        content_row = _content_chunk_row
        plain_row = _plain_chunk_row
        for ev in events:
            if (
                type(ev) is ChunkEvent
                and ev.usage is None
                and ev.tool_calls is None
                and ev.finish_reason is None
                and ev.logprobs is None
                and ev.raw is None
                and ev.server_tokens is None
            ):
                if ev.kind == "content" and ev.reasoning == "":  # (_CONTENT_KIND)
                    append(content_row(ev))
                else:
                    append(plain_row(ev))
                pending += 1
                if pending >= batch_size:
                    self._pending = pending
                    self.flush()
                    pending = self._pending
                    append = self._chunk_rows.append
            else:
                self._pending = pending
                write(ev)
                pending = self._pending
                append = self._chunk_rows.append
        self._pending = pending

    # -- flushing ----------------------------------------------------------

    def _compiled(
        self, name: str, columns: tuple[str, ...] | None
    ) -> tuple[str, tuple[str, ...] | None]:
        """SQL text for the database's dialect, and the parameter order if positional,
        of ``insert:<table>`` (``columns``) or of an update of ``_UPDATES``.

        Made once per writer; executed with ``exec_driver_sql`` so that no
        per-row parameter processing happens in SQLAlchemy (72k chunk rows go
        straight to the driver's ``executemany``). On a SQLite file opened
        without SQLAlchemy, the text is the one SQLAlchemy compiles for SQLite.
        """
        found = self._sql.get(name)
        if found is None:
            kind, _, table = name.partition(":")
            stmt: Any
            if self._lite is not None:
                if kind == "insert":
                    assert columns is not None
                    found = (insert_sql(table, columns), columns)
                else:
                    found = update_sql(_UPDATES[name])
            else:
                if kind == "insert":
                    from sqlalchemy import insert

                    from sniffer.store import models

                    stmt = insert(getattr(models, table))
                else:
                    stmt = _update_stmt(_UPDATES[name])
                compiled = stmt.compile(
                    dialect=self.engine.dialect, column_keys=columns, for_executemany=True
                )
                order = tuple(compiled.positiontup) if compiled.positional else None
                found = (str(compiled), order)
            self._sql[name] = found
        return found

    def _insert_many(
        self,
        conn: Connection,
        table: str,
        columns: tuple[str, ...],
        rows: list[tuple[Any, ...]],
        copy: bool = True,
    ) -> None:
        """Insert rows of ``columns``: on SQLite through ``_insert_by_nulls``, on
        PostgreSQL by ``COPY`` (``copy``), else the driver's ``executemany``."""
        if self.dialect_name == "sqlite":
            _insert_by_nulls(conn, table, columns, rows)
            return
        if copy and self.copy:
            self._copy_rows(conn, table, columns, rows)
            return
        sql, order = self._compiled(f"insert:{table}", columns)
        if order is None:
            # Named parameters (PostgreSQL drivers): the driver's executemany.
            conn.exec_driver_sql(sql, [dict(zip(columns, row, strict=True)) for row in rows])
        elif order == columns:
            conn.exec_driver_sql(sql, rows)
        else:
            idx = [columns.index(c) for c in order]
            conn.exec_driver_sql(sql, [tuple(row[i] for i in idx) for row in rows])

    def _insert_chunks(
        self, conn: Connection, rows: list[tuple[Any, ...]], copy: bool = True
    ) -> None:
        """Insert chunk rows (content, plain or full: ``chunk_row``) in their
        order. On SQLite each run of content or plain rows goes in through
        ``executemany_sqlite`` with a statement that binds no NULL (nor, for
        content rows, the kind and reasoning), the others through
        ``_insert_by_nulls``; any other database gets full rows (``COPY``
        binds nothing per value)."""
        if self.dialect_name != "sqlite":
            full = [r if len(r) == _FULL_CHUNK_LEN else _full_chunk_row(r) for r in rows]
            self._insert_many(conn, "chunks", _CHUNK_COLUMNS, full, copy)
            return
        # each run of rows of one shape (its length: groupby runs in C) in its order
        for n, run in groupby(rows, len):
            if n == _CONTENT_CHUNK_LEN:
                executemany_sqlite(conn, *_CONTENT_CHUNK_SQL, list(run))
            elif n == _PLAIN_CHUNK_LEN:
                executemany_sqlite(conn, *_PLAIN_CHUNK_SQL, list(run))
            else:
                _insert_by_nulls(conn, "chunks", _CHUNK_COLUMNS, list(run))

    @staticmethod
    def _copy_rows(
        conn: Connection, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
    ) -> None:
        """``COPY table (columns) FROM STDIN`` on the transaction's own psycopg
        connection: the fastest way into PostgreSQL (one round trip per batch,
        no per-row statement)."""
        raw: Any = conn.connection.dbapi_connection
        with (
            raw.cursor() as cur,
            cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy,
        ):
            write_row = copy.write_row
            for row in rows:
                write_row(row)

    def _update_many(self, conn: Connection, name: str, items: list[Update]) -> int:
        """Run an UPDATE for every ``(id, values)``; returns how many rows matched
        nothing. On SQLite through ``_update_sparse``; elsewhere with the
        statement SQLAlchemy compiles (``_compiled``), parameters by name."""
        if self.dialect_name == "sqlite":
            matched: int | None = _update_sparse(conn, name, items)
        else:
            sql, order = self._compiled(name, None)
            rows = [_bind(name, row_id, values) for row_id, values in items]
            if order is None:
                result = conn.exec_driver_sql(sql, rows)
            else:
                result = conn.exec_driver_sql(sql, [tuple(r[k] for k in order) for r in rows])
            matched = result.rowcount
        n = len(items)
        return max(0, n - matched) if matched is not None and matched >= 0 else 0

    def _parts(self) -> list[tuple[str, list[Any]]]:
        """The batch as ``(part, items)`` in the order a flush writes them: the
        inserts (connections and streams as ``(id, row)`` pairs, chunk and error
        tuples), then the updates (``(id, values)`` pairs). ``_set_parts`` is the inverse."""
        return [
            ("connections", list(self._conn_rows.items())),
            ("streams", list(self._stream_rows.items())),
            ("chunks", self._chunk_rows),
            ("errors", self._error_rows),
            ("conn_close", self._conn_closes),
            ("stream_response", self._stream_responses),
            ("stream_close", self._stream_closes),
            ("stream_flags", self._stream_flags),
        ]

    def _set_parts(self, parts: Iterable[tuple[str, list[Any]]]) -> None:
        """Make the buffers hold exactly ``parts`` (what a partial flush left)."""
        got = dict(parts)
        self._conn_rows = dict(got.get("connections", ()))
        self._stream_rows = dict(got.get("streams", ()))
        self._chunk_rows = list(got.get("chunks", ()))
        self._error_rows = list(got.get("errors", ()))
        self._conn_closes = list(got.get("conn_close", ()))
        self._stream_responses = list(got.get("stream_response", ()))
        self._stream_closes = list(got.get("stream_close", ()))
        self._stream_flags = list(got.get("stream_flags", ()))
        self._pending = sum(len(items) for items in got.values())

    def _write_part(self, conn: Connection, part: str, items: list[Any], copy: bool = True) -> int:
        """Write one part of a batch; returns the updates that matched no row."""
        if part == "connections" or part == "streams":
            if self.dialect_name == "sqlite":
                _insert_sparse(conn, part, [r for _, r in items])
            else:
                cols = _CONNECTION_COLUMNS if part == "connections" else _STREAM_COLUMNS
                rows = [_dense(r, cols, part) for _, r in items]
                self._insert_many(conn, part, cols, rows, copy)
        elif part == "chunks":
            self._insert_chunks(conn, items, copy)
        elif part == "errors":
            self._insert_many(conn, part, _ERROR_COLUMNS, items, copy)
        else:
            return self._update_many(conn, part, items)
        return 0

    def _execute_batch(self, conn: Connection) -> int:
        """Run the batch on ``conn``; returns the number of updates that matched no row."""
        return sum(self._write_part(conn, part, items) for part, items in self._parts() if items)

    def _clean_batch(self) -> None:
        """Replace text the driver cannot encode, in every buffered row."""
        for drow in (*self._conn_rows.values(), *self._stream_rows.values()):
            _clean_row(drow)
        for _, values in (
            *self._conn_closes,
            *self._stream_responses,
            *self._stream_closes,
            *self._stream_flags,
        ):
            _clean_row(values)
        self._chunk_rows = [_clean_tuple(t) for t in self._chunk_rows]
        self._error_rows = [_clean_tuple(t) for t in self._error_rows]

    def _database_failed(self, exc: BaseException) -> bool:
        """``exc`` says the database as a whole cannot take writes now (locked,
        unreachable, a table missing), not that a row is bad."""
        orig = getattr(exc, "orig", None)
        return isinstance(exc, self._db_down) or isinstance(orig, self._db_down)

    def flush(self) -> None:
        """Write the buffered batch in one transaction (inserts, then updates).

        When the database as a whole fails (locked, unreachable: an
        ``OperationalError``), the transaction is rolled back, the batch stays
        buffered, and ``StoreError`` is raised. Any other failure is a row the
        database refuses (an integer wider than its column, a duplicate id, a
        value the driver cannot bind, …): text the driver cannot encode is
        replaced and the batch retried once; then the batch is written in parts
        (:meth:`_isolate`), every row the database still refuses becomes an
        error record (stage "store", kind "row-rejected") and is counted in
        ``stats["rejected_rows"]``, and everything else is stored.
        """
        if self._pending == 0:
            return
        start = time.perf_counter()
        rejected: dict[str, int] = {}
        try:
            unmatched = self._try_flush()
        except Exception as exc:
            if self._database_failed(exc):
                self._failed(exc)
            if isinstance(exc, self._unencodable):
                # Text the driver cannot take: replace it and retry once.
                self._clean_batch()
                self.stats["cleaned_batches"] += 1
                try:
                    unmatched = self._try_flush()
                except Exception as again:
                    if self._database_failed(again):
                        self._failed(again)
                    unmatched, rejected = self._isolate()
            else:
                unmatched, rejected = self._isolate()
        self.stats["connections"] += len(self._conn_rows) - rejected.get("connections", 0)
        self.stats["streams"] += len(self._stream_rows) - rejected.get("streams", 0)
        self.stats["chunks"] += len(self._chunk_rows) - rejected.get("chunks", 0)
        self.stats["errors"] += len(self._error_rows) - rejected.get("errors", 0)
        self.stats["updates"] += (
            len(self._conn_closes)
            + len(self._stream_responses)
            + len(self._stream_closes)
            + len(self._stream_flags)
        ) - sum(rejected.get(k, 0) for k in _UPDATES)
        self.stats["unmatched_updates"] += unmatched
        self.stats["flushes"] += 1
        self.stats["flush_seconds"] += time.perf_counter() - start
        self._clear()
        self.prefetch_ids()

    def _isolate(self) -> tuple[int, dict[str, int]]:
        """Write a batch the database refused as a whole in parts, each in its
        own transaction: a group of rows that fails is halved until the rows it
        refuses are found one by one (a few dozen transactions for one bad row
        in thousands). Each refused row becomes an error row (stage "store",
        kind "row-rejected", naming the table, the row's connection and stream
        and the database's message). Returns (updates that matched no row,
        refused rows per part).

        If the database as a whole fails meanwhile, what is not written yet
        (and the error rows of the rows refused so far) stays buffered and
        ``StoreError`` is raised, as for a whole batch."""
        self.stats["isolated_batches"] += 1
        parts = self._parts()
        unmatched = 0
        refused: list[tuple[str, Any, BaseException]] = []
        for k, (part, items) in enumerate(parts):
            todo: deque[list[Any]] = deque([items] if items else [])
            while todo:
                group = todo.popleft()
                try:
                    with self._transaction() as conn:
                        unmatched += self._write_part(conn, part, group, copy=False)
                except Exception as exc:
                    if self._database_failed(exc):
                        left = [x for g in (group, *todo) for x in g]
                        remaining = [(part, left), *parts[k + 1 :]]
                        self._set_parts(remaining)
                        self._error_rows += [self._refused_row(*r) for r in refused]
                        self._pending += len(refused)
                        self.stats["rejected_rows"] += len(refused)
                        self._failed(exc)
                    if len(group) == 1:
                        refused.append((part, group[0], exc))
                    else:
                        half = len(group) // 2
                        todo.extendleft((group[half:], group[:half]))
        counts: dict[str, int] = {}
        for part, _, _ in refused:
            counts[part] = counts.get(part, 0) + 1
        self.stats["rejected_rows"] += len(refused)
        if refused:
            self._write_refused([self._refused_row(*r) for r in refused])
        return unmatched, counts

    def _refused_row(self, part: str, item: Any, exc: BaseException) -> tuple[Any, ...]:
        """The error row that records a row the database refused."""
        ts: Any
        if part == "connections":
            conn, stream, ts = item[0], None, item[1].get("opened_at")
        elif part == "streams":
            conn, stream, ts = item[1].get("connection_id"), item[0], item[1].get("t_request")
        elif part == "chunks":
            conn, stream, ts = None, item[0], _full_chunk_row(item)[_CHUNK_TS_AT]
        elif part == "errors":
            conn, stream, ts = item[4], item[5], item[0]
        else:
            row_id, values = item
            conn = row_id if part == "conn_close" else None
            stream = None if part == "conn_close" else row_id
            ts = values.get("closed_at", values.get("t_response"))
        detail = str(getattr(exc, "orig", None) or exc).splitlines()
        where = part if part not in _UPDATES else f"update {part}"
        message = f"{where} row refused by the database ({type(exc).__name__}: "
        message += (detail[0] if detail else "") + ")"
        ids = tuple(
            x if type(x) is int and INT64_MIN <= x <= INT64_MAX else None for x in (conn, stream)
        )
        ts = ts if type(ts) is float else None
        return (ts, "store", "row-rejected", _clean_text(message[:1000]), *ids, self.node)

    def _write_refused(self, rows: list[tuple[Any, ...]]) -> None:
        """Store the error rows of refused rows (one by one if need be; one the
        database refuses too is counted in ``stats["lost_error_rows"]``)."""
        try:
            with self._transaction() as conn:
                self._write_part(conn, "errors", rows, copy=False)
            self.stats["errors"] += len(rows)
            return
        except Exception:
            if len(rows) == 1:
                self.stats["lost_error_rows"] += 1
                return
        for row in rows:
            try:
                with self._transaction() as conn:
                    self._write_part(conn, "errors", [row], copy=False)
                self.stats["errors"] += 1
            except Exception:
                self.stats["lost_error_rows"] += 1

    def prefetch_ids(self) -> None:
        """Reserve the next id blocks while the current ones are still half full
        (never raises; called after every flush, off the capture hot path)."""
        if self._closing:
            return
        self.conn_ids.prefetch()
        self.stream_ids.prefetch()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """One transaction on the database: committed at the end, rolled back if it raises."""
        if self._lite is not None:
            with self._lite.begin() as tx:
                yield tx  # type: ignore[misc]  # what a flush uses of a Connection: exec_driver_sql
            return
        with self.engine.begin() as conn:
            yield conn

    def _try_flush(self) -> int:
        with self._transaction() as conn:
            return self._execute_batch(conn)

    def _failed(self, exc: BaseException) -> None:
        self.stats["failed_flushes"] += 1
        detail = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise StoreError(
            f"database rejected a batch of {self._pending} rows ({type(exc).__name__}: "
            f"{detail}); the batch is kept: flush() again or discard() it"
        ) from exc

    def _clear(self) -> None:
        self._conn_rows = {}
        self._stream_rows = {}
        self._chunk_rows = []
        self._error_rows = []
        self._conn_closes = []
        self._stream_responses = []
        self._stream_closes = []
        self._stream_flags = []
        self._pending = 0

    def discard(self) -> int:
        """Drop the buffered batch (after a ``StoreError`` the caller gives up on);
        returns how many rows and updates were dropped."""
        dropped = self._pending
        self.stats["discarded_rows"] += dropped
        self._clear()
        return dropped

    def close(self) -> None:
        """Flush what is buffered, then release the engine if this writer made it.

        If the final flush fails, ``StoreError`` is raised and the rows stay
        buffered (``flush`` may be called again).
        """
        self._closing = True  # no id block reserved for a writer that stops
        self.flush()
        if not self._closed:
            self._closed = True
            self.dispose()

    def dispose(self) -> None:
        """Release the database connections this writer opened (nothing is flushed)."""
        if self._lite is not None:
            self._lite.close()
        if self._id_store is not None:
            self._id_store.close()
        if self._owns_engine and self._engine is not None:
            self._engine.dispose()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
