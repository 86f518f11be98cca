"""Store: schema, batched writer, read-side queries."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from sniffer.core.events import (
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamFlagged,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary, Usage
from sniffer.store import queries
from sniffer.store.db import EngineStore
from sniffer.store.lite import executemany_flat_sqlite, executemany_sqlite
from sniffer.store.models import SCHEMA_VERSION, chunks, connections, errors, metadata, streams
from sniffer.store.writer import (
    OPTIONAL_CHUNK_FIELDS,
    StoreError,
    StoreWriter,
    _full_chunk_row,
    chunk_row,
    endpoint_text,
    finish_reasons_json,
    headers_json,
    is_credential_header,
    make_engine,
    open_store,
    usage_json,
)

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20+00:00

SECRETS = ("sk-SECRET-1", "sk-SECRET-2", "SECRET-3", "SECRET-4", "SECRET-5", "SECRET-6")

USAGE_1 = '{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}'


def realistic_events() -> list[StoreEvent]:
    """2 connections, 3 streams: n=2 streaming chat, a non-streaming completion
    (same connection, next exchange), and a gapped stream; two errors."""
    c1 = ("127.0.0.1", 50000)
    c2 = ("127.0.0.1", 50002)
    srv = ("127.0.0.1", 8000)
    req_headers = (
        ("host", "127.0.0.1:8000"),
        ("authorization", "Bearer sk-SECRET-1"),
        ("content-type", "application/json"),
        ("X-Api-Key", "sk-SECRET-2"),
        ("cookie", "session=SECRET-3"),
        ("x-custom-token", "SECRET-4"),
    )
    body1 = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            "stream": True,
            "n": 2,
            "temperature": 0.5,
            "max_completion_tokens": 16,
            "seed": 7,
        }
    )
    return [
        ConnectionOpened(1, T0, c1, srv, syn_seen=True),
        StreamOpened(
            stream=1,
            conn=1,
            exchange=0,
            ts=T0 + 0.125,
            client=c1,
            server=srv,
            method="POST",
            path="/v1/chat/completions",
            request_headers=req_headers,
            request_body=body1,
            request=RequestSummary(
                model="tiny",
                stream=True,
                n=2,
                temperature=0.5,
                max_tokens=16,
                seed=7,
                prompt_len=2,
            ),
            dialect="openai.chat",
            label="run1",
        ),
        StreamResponse(
            1,
            T0 + 0.25,
            200,
            (
                ("content-type", "text/event-stream"),
                ("Set-Cookie", "SECRET-5"),
                ("x-ratelimit-remaining-tokens", "SECRET-6"),
                ("server", "uvicorn"),
            ),
            "text/event-stream",
            True,
        ),
        ChunkEvent(1, T0 + 0.375, 0, 0, 0, "role"),
        ChunkEvent(1, T0 + 0.375, 1, 1, 0, "role"),
        ChunkEvent(1, T0 + 0.5, 2, 0, 1, "content", "Hel"),
        ChunkEvent(1, T0 + 0.5, 3, 1, 1, "content", "Bon"),
        ChunkEvent(1, T0 + 0.625, 4, 0, 2, "content", "lo"),
        ChunkEvent(1, T0 + 0.625, 5, 1, 2, "content", "jour", finish_reason="stop"),
        ChunkEvent(1, T0 + 0.75, 6, 0, 0, "finish", finish_reason="length"),
        ChunkEvent(1, T0 + 0.75, 7, -1, 0, "usage", usage=Usage.loads(USAGE_1)),
        ChunkEvent(1, T0 + 0.875, 8, -1, 0, "done", raw="[DONE]"),
        StreamClosed(
            stream=1,
            ts=T0 + 0.875,
            state=StreamState.COMPLETE,
            reason="finish and [DONE]",
            done_seen=True,
            gap=False,
            t_first_content=T0 + 0.5,
            t_last_chunk=T0 + 0.875,
            chunk_count=4,
            event_count=9,
            text_len=12,
            finish_reasons=((0, "length"), (1, "stop")),
            usage=Usage.loads(USAGE_1),
            response_body=None,
        ),
        StreamOpened(
            stream=2,
            conn=1,
            exchange=1,
            ts=T0 + 1.0,
            client=c1,
            server=srv,
            method="POST",
            path="/v1/completions",
            request_headers=(("content-type", "application/json"),),
            request_body='{"model":"tiny","prompt":"Once","max_tokens":5,"stream":false}',
            request=RequestSummary(model="tiny", prompt_len=1, max_tokens=5, stream=False),
            dialect="openai.completions",
            label="run1",
        ),
        StreamResponse(
            2, T0 + 1.25, 200, (("content-type", "application/json"),), "application/json", False
        ),
        ChunkEvent(2, T0 + 1.25, 0, 0, 1, "content", "upon a time", finish_reason="length"),
        ChunkEvent(
            2,
            T0 + 1.25,
            1,
            -1,
            0,
            "usage",
            usage=Usage.loads('{"prompt_tokens":1,"completion_tokens":3}'),
        ),
        StreamClosed(
            stream=2,
            ts=T0 + 1.25,
            state=StreamState.COMPLETE,
            reason="complete body",
            done_seen=False,
            gap=False,
            t_first_content=T0 + 1.25,
            t_last_chunk=T0 + 1.25,
            chunk_count=1,
            event_count=2,
            text_len=11,
            finish_reasons=((0, "length"),),
            usage=Usage.loads('{"prompt_tokens":1,"completion_tokens":3}'),
            response_body='{"choices":[{"index":0,"text":"upon a time","finish_reason":"length"}]}',
        ),
        ConnectionClosed(1, T0 + 1.5, "fin"),
        ConnectionOpened(2, T0 + 2.0, c2, srv, syn_seen=True),
        StreamOpened(
            stream=3,
            conn=2,
            exchange=0,
            ts=T0 + 2.125,
            client=c2,
            server=srv,
            method="POST",
            path="/v1/chat/completions",
            request_headers=(("content-type", "application/json"),),
            request_body='{"model":"tiny","messages":[{"role":"user","content":"x"}],"stream":true}',
            request=RequestSummary.parse(
                {"model": "tiny", "stream": True, "messages": [{}], "temperature": "hot"}
            ),
            dialect="openai.chat",
            label="run2",
        ),
        StreamResponse(
            3, T0 + 2.25, 200, (("content-type", "text/event-stream"),), "text/event-stream", True
        ),
        ChunkEvent(3, T0 + 2.25, 0, 0, 0, "role"),
        ChunkEvent(3, T0 + 2.5, 1, 0, 1, "content", "Ab"),
        PipelineError(T0 + 2.625, "reassembly", "gap", "12 bytes lost", conn=2, stream=3),
        ChunkEvent(3, T0 + 3.0, 2, 0, 2, "content", "cé"),
        StreamClosed(
            stream=3,
            ts=T0 + 3.5,
            state=StreamState.GAP,
            reason="bytes lost",
            done_seen=False,
            gap=True,
            t_first_content=T0 + 2.5,
            t_last_chunk=T0 + 3.0,
            chunk_count=2,
            event_count=3,
            text_len=4,
            finish_reasons=(),
            usage=None,
            response_body=None,
        ),
        PipelineError(T0 + 3.5, "http", "framing", "bad chunk size", conn=2),
        ConnectionClosed(2, T0 + 4.0, "rst"),
    ]


def memory_writer(batch_size: int = 5000) -> StoreWriter:
    return StoreWriter(":memory:", batch_size=batch_size)


def dump(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows (chunk/error ids left out), sorted: comparable across runs."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in (connections, streams, chunks, errors):
            cols = [c for c in table.columns if not (table in (chunks, errors) and c.name == "id")]
            rows = conn.execute(select(*cols)).all()
            out[table.name] = sorted((tuple(r) for r in rows), key=repr)
    return out


@pytest.fixture
def written() -> StoreWriter:
    w = memory_writer(batch_size=3)
    w.write_many(realistic_events())
    w.flush()
    return w


# ---------------------------------------------------------------------------
# writer
# ---------------------------------------------------------------------------


def test_small_batches_flush_several_times(written: StoreWriter) -> None:
    assert written.stats["flushes"] > 5
    assert written.pending == 0
    assert queries.count_rows(written.store) == {
        "connections": 2,
        "streams": 3,
        "chunks": 14,
        "errors": 2,
    }


def test_stream_rows(written: StoreWriter) -> None:
    s1, s2, s3 = queries.list_streams(written.store)
    assert s1["id"] == 1 and s1["connection_id"] == 1 and s1["exchange"] == 0
    assert s1["client"] == "127.0.0.1:50000" and s1["server"] == "127.0.0.1:8000"
    assert (s1["model"], s1["is_stream"], s1["n"], s1["temperature"]) == ("tiny", True, 2, 0.5)
    assert (s1["max_tokens"], s1["seed"], s1["prompt_len"]) == (16, 7, 2)
    assert s1["top_p"] is None
    assert (s1["status"], s1["streaming"], s1["content_type"]) == (200, True, "text/event-stream")
    assert s1["t_request"] == T0 + 0.125 and s1["t_response"] == T0 + 0.25
    assert s1["state"] == "complete" and s1["done_seen"] is True and s1["gap"] is False
    assert (s1["t_first_content"], s1["t_last_chunk"], s1["closed_at"]) == (
        T0 + 0.5,
        T0 + 0.875,
        T0 + 0.875,
    )
    assert (s1["chunk_count"], s1["event_count"], s1["text_len"]) == (4, 9, 12)
    assert json.loads(s1["finish_reasons"]) == {"0": "length", "1": "stop"}
    assert (s1["prompt_tokens"], s1["completion_tokens"]) == (9, 4)
    assert s1["usage"] == USAGE_1
    assert json.loads(s1["request_json"])["n"] == 2
    assert s1["label"] == "run1" and s1["dialect"] == "openai.chat"

    assert s2["is_stream"] is False and s2["streaming"] is False and s2["max_tokens"] == 5
    assert s2["response_body"].startswith('{"choices"')
    assert (s2["prompt_tokens"], s2["completion_tokens"]) == (1, 3)

    assert s3["state"] == "gap" and s3["gap"] is True and s3["reason"] == "bytes lost"
    assert s3["temperature"] is None  # "hot" is not a number
    assert s3["usage"] is None and s3["prompt_tokens"] is None
    assert json.loads(s3["finish_reasons"]) == {}


def test_connection_rows(written: StoreWriter) -> None:
    c1 = queries.get_connection(written.store, 1)
    c2 = queries.get_connection(written.store, 2)
    assert c1 is not None and c2 is not None
    assert (c1["client_ip"], c1["client_port"], c1["server_port"]) == ("127.0.0.1", 50000, 8000)
    assert (c1["opened_at"], c1["closed_at"], c1["close_reason"]) == (T0, T0 + 1.5, "fin")
    assert c1["syn_seen"] is True and c1["capture"] == "packet"
    assert (c2["closed_at"], c2["close_reason"]) == (T0 + 4.0, "rst")
    assert queries.get_connection(written.store, 99) is None


@pytest.mark.parametrize("batch_size", [1, 2, 7, 1000])
def test_same_rows_whatever_the_batch_size(batch_size: int) -> None:
    reference = memory_writer(batch_size=100_000)
    reference.write_many(realistic_events())
    reference.flush()
    w = memory_writer(batch_size=batch_size)
    w.write_many(realistic_events())
    w.flush()
    assert dump(w.engine) == dump(reference.engine)
    assert w.stats["unmatched_updates"] == 0


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(min_value=1, max_value=40), max_size=10))
def test_flush_points_do_not_change_rows(cuts: set[int]) -> None:
    """Flushing after any subset of events gives the same database."""
    events = realistic_events()
    reference = memory_writer()
    reference.write_many(events)
    reference.flush()
    w = memory_writer()
    for i, ev in enumerate(events):
        w.write(ev)
        if i in cuts:
            w.flush()
    w.flush()
    assert dump(w.engine) == dump(reference.engine)


def test_stream_closed_in_a_later_batch() -> None:
    events = realistic_events()
    w = memory_writer()
    opened = next(i for i, e in enumerate(events) if isinstance(e, StreamOpened) and e.stream == 3)
    w.write_many(events[: opened + 1])
    w.flush()
    row = queries.get_stream(w.store, 3)
    assert row is not None and row["state"] == "open" and row["closed_at"] is None
    assert row["status"] is None and row["chunk_count"] == 0
    w.write_many(events[opened + 1 :])
    w.flush()
    row = queries.get_stream(w.store, 3)
    assert row is not None
    assert (row["state"], row["status"], row["chunk_count"]) == ("gap", 200, 2)
    assert w.stats["updates"] == 3  # response, close, connection close of conn 2
    assert w.stats["unmatched_updates"] == 0


def test_a_flag_found_after_the_close_is_written_over_the_rows_flags() -> None:
    """``StreamFlagged`` (bytes of a response that came again, different, after
    its close) sets the row's flags, whether the close is still buffered, in the
    same batch's update, or already written; the other columns stay."""
    both = (StreamFlag.CLOCK_BACKWARDS, StreamFlag.OVERLAP_MISMATCH)
    events = realistic_events()
    close = next(i for i, e in enumerate(events) if isinstance(e, StreamClosed) and e.stream == 3)
    for flush_at in (close + 1, close, 0):  # already written, an update in this batch, one insert
        w = memory_writer()
        w.write_many(events[:flush_at])
        w.flush()
        w.write_many(events[flush_at : close + 1])
        w.write(StreamFlagged(3, T0 + 9, both))
        w.write_many(events[close + 1 :])
        w.flush()
        row = queries.get_stream(w.store, 3)
        assert row is not None and row["state"] == "gap", flush_at
        assert json.loads(row["flags"]) == ["clock-backwards", "overlap-mismatch"], flush_at
        assert w.stats["unmatched_updates"] == 0


def test_update_for_unknown_row_is_counted_not_raised() -> None:
    w = memory_writer()
    w.write(ConnectionClosed(42, T0, "fin"))
    w.flush()
    assert w.stats["unmatched_updates"] == 1
    assert queries.count_rows(w.store)["connections"] == 0


def test_close_writes_what_is_buffered(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    w = StoreWriter(str(db), batch_size=10_000)
    w.write_many(realistic_events())
    assert w.pending > 0
    w.close()
    assert w.pending == 0
    assert queries.count_rows(open_store(str(db)))["chunks"] == 14


def test_id_bases_after_a_first_write(tmp_path: Path) -> None:
    db = str(tmp_path / "ids.db")
    w = StoreWriter(db)
    assert w.id_bases() == (1, 1)
    w.write_many(realistic_events())
    assert w.id_bases() == (3, 4)  # pending rows count too
    w.close()
    again = StoreWriter(db)
    assert again.id_bases() == (3, 4)
    again.close()


def test_file_database_is_wal(tmp_path: Path) -> None:
    db = tmp_path / "wal.db"
    w = StoreWriter(str(db))
    with w.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 0
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 5000
        assert conn.execute(text("PRAGMA temp_store")).scalar() == 2  # MEMORY
    assert w._lite is not None
    with w._lite.begin() as tx:  # the writer's own connection (no SQLAlchemy)
        assert tx.execute("PRAGMA temp_store") == [(2,)]
    w.close()
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    raw.close()


def test_sqlite_url_and_engine_argument(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'u.db'}")
    w = StoreWriter("ignored", engine=engine)
    w.write_many(realistic_events())
    w.close()
    assert queries.count_rows(EngineStore(engine))["streams"] == 3
    engine.dispose()


# ---------------------------------------------------------------------------
# credentials
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "proxy-authorization",
        "Cookie",
        "SET-COOKIE",
        "api-key",
        "X-API-KEY",
        "x-goog-api-key",
        "x-auth-token",
        "X-Client-Secret",
        "anthropic-key",
    ],
)
def test_credential_header_names(name: str) -> None:
    assert is_credential_header(name)


@pytest.mark.parametrize(
    "name", ["content-type", "host", "accept-encoding", "connection", "server"]
)
def test_ordinary_header_names(name: str) -> None:
    assert not is_credential_header(name)


def test_credentials_are_never_stored(tmp_path: Path) -> None:
    db = tmp_path / "cred.db"
    w = StoreWriter(str(db), batch_size=4)
    w.write_many(realistic_events())
    w.close()
    engine = open_store(str(db))
    s1 = queries.get_stream(engine, 1)
    assert s1 is not None
    assert json.loads(s1["request_headers"]) == [
        ["host", "127.0.0.1:8000"],
        ["content-type", "application/json"],
    ]
    assert json.loads(s1["response_headers"]) == [
        ["content-type", "text/event-stream"],
        ["server", "uvicorn"],
    ]
    engine.close()
    blob = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"127.0.0.1:8000" in blob  # the scan does see header values
    for secret in SECRETS:
        assert secret.encode() not in blob


# ---------------------------------------------------------------------------
# bad input and database errors
# ---------------------------------------------------------------------------


def test_untrusted_request_fields_are_coerced() -> None:
    w = memory_writer()
    w.write(
        StreamOpened(
            stream=1,
            conn=1,
            exchange=0,
            ts=T0,
            client=("::1", 5000),
            server=("::1", 8000),
            method="POST",
            path="/v1/chat/completions",
            request_headers=(),
            request_body=None,
            request=RequestSummary.parse(
                {
                    "model": 5,
                    "stream": "yes",
                    "temperature": True,
                    "top_p": float("nan"),
                    "n": "2",
                    "seed": 2**70,
                    "max_output_tokens": 9,
                }
            ),
        )
    )
    w.flush()
    row = queries.get_stream(w.store, 1)
    assert row is not None
    assert row["model"] is None and row["is_stream"] is None
    assert row["temperature"] is None and row["top_p"] is None
    assert row["n"] is None and row["seed"] is None and row["max_tokens"] == 9
    assert row["client"] == "[::1]:5000" and row["server"] == "[::1]:8000"


def test_lone_surrogates_are_replaced_not_fatal() -> None:
    w = memory_writer()
    w.write(ChunkEvent(1, T0, 0, 0, 1, "content", "a\ud83d"))
    w.write(ChunkEvent(1, T0, 1, 0, 2, "content", "ok"))
    w.write(PipelineError(T0, "dialect", "invalid", "bad \udc80 item", stream=1))
    w.flush()
    assert w.stats["cleaned_batches"] == 1
    assert queries.stream_text(w.store, 1) == {0: "a\ufffdok"}
    assert queries.list_errors(w.store)[0]["message"] == "bad \ufffd item"


def _writer_on(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> StoreWriter:
    """A writer on a SQLite file (the standard library's driver), an in-memory
    SQLite database (SQLAlchemy) or a fresh PostgreSQL database (COPY)."""
    if where == "file":
        w = StoreWriter(str(tmp_path / "w.db"))
        assert w._lite is not None
        return w
    if where == "memory":
        return memory_writer()
    return StoreWriter(request.getfixturevalue("fresh_pg_url"))


def _bad_rows(stream: int) -> list[StoreEvent]:
    """Rows no database takes: a chunk whose choice is 2^63 (wider than any
    integer column: "Python int too large to convert to SQLite INTEGER",
    PostgreSQL "out of range"), a chunk holding a value no driver binds (a
    dict), a connection whose id is already stored, and a close whose typed
    usage holds a count of 2^64."""
    return [
        ChunkEvent(stream, T0 + 5, 99, 2**63, 1, "content", "never"),
        ChunkEvent(stream, T0 + 5, 98, 0, 0, "other", raw={"a": 1}),  # type: ignore[arg-type]
        ConnectionOpened(1, T0, ("127.0.0.1", 1), ("127.0.0.1", 2), True),  # duplicate id
        StreamClosed(
            stream=stream,
            ts=T0 + 6,
            state=StreamState.COMPLETE,
            reason="x",
            done_seen=True,
            gap=False,
            t_first_content=None,
            t_last_chunk=None,
            chunk_count=0,
            event_count=0,
            text_len=0,
            finish_reasons=(),
            usage=Usage({"prompt_tokens": 2**64}, prompt_tokens=2**64),
            response_body=None,
        ),
    ]


@pytest.mark.parametrize("where", ["file", "memory", "pg"])
def test_refused_rows_become_error_rows_and_the_rest_is_stored(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One row the database refuses costs that row only: the batch is written
    in parts, the refused rows become "store" error rows naming their stream,
    everything else lands (issue #24: one integer >= 2^63 stopped the writer)."""
    events = realistic_events()
    w = _writer_on(where, tmp_path, request)
    assert isinstance(events[1], StreamOpened) and events[1].stream == 1
    w.write_many(events[:2])  # connection 1 and stream 1, stored before the bad batch
    w.flush()
    rest = events[2:]
    bad = _bad_rows(stream=1)
    w.write_many([bad[3], *rest[:5], bad[0], *rest[5:9], bad[1], *rest[9:], bad[2]])
    w.flush()  # raises nothing
    assert w.pending == 0
    assert w.stats["rejected_rows"] == 4 and w.stats["isolated_batches"] == 1
    assert w.stats["lost_error_rows"] == 0
    reference = memory_writer()
    reference.write_many(events)
    reference.flush()
    got, want = dump(w.engine), dump(reference.engine)
    assert got["connections"] == want["connections"]
    assert got["streams"] == want["streams"]
    assert got["chunks"] == want["chunks"]
    refused = [e for e in got["errors"] if e[1] == "store"]
    assert got["errors"] == sorted(want["errors"] + refused, key=repr)
    assert len(refused) == 4
    assert {e[2] for e in refused} == {"row-rejected"}
    assert sum(e[3].startswith("chunks row refused") for e in refused) == 2
    by_part = {e[3].split(" row ")[0]: e for e in refused}
    assert set(by_part) == {"chunks", "connections", "update stream_close"}
    assert by_part["chunks"][5] == 1 and by_part["chunks"][0] == T0 + 5
    assert by_part["connections"][4] == 1
    assert by_part["update stream_close"][5] == 1
    w.close()


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_row_refused_inside_a_multi_row_insert_leaves_no_part_of_it(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SQLite's INSERTs of several rows are ``OR FAIL`` (no statement journal:
    ``lite.insert_or_fail_sql``): the rows a failing statement wrote before the row
    the database refused stay in the transaction until the flush rolls it
    back. Here the refused row (a connection id already stored) is the fifth
    of ten in one statement: the ten are stored once each, the refused one
    is the only error row, nothing is stored twice."""
    w = _writer_on(where, tmp_path, request)

    def opened(conn: int) -> ConnectionOpened:
        return ConnectionOpened(conn, T0 + conn, ("127.0.0.1", 1000 + conn), ("127.0.0.1", 2), True)

    w.write(opened(5))
    w.flush()
    w.write_many([opened(c) for c in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)])
    w.write_many([ChunkEvent(7, T0, seq, 0, seq, "content", f"t{seq}") for seq in range(40)])
    w.flush()  # raises nothing
    assert w.stats["rejected_rows"] == 1 and w.stats["isolated_batches"] == 1
    got = dump(w.engine)
    assert [r[0] for r in got["connections"]] == [1, 10, 2, 3, 4, 5, 6, 7, 8, 9]  # (repr order)
    assert queries.stream_text(w.store, 7) == {0: "".join(f"t{s}" for s in range(40))}
    refused = [e for e in got["errors"] if e[1] == "store"]
    assert len(refused) == 1 and refused[0][3].startswith("connections row refused")
    assert len(got["errors"]) == 1
    w.close()


def test_refused_rows_in_an_automatic_flush() -> None:
    """The flush ``write`` starts at ``batch_size`` rows does the same."""
    w = memory_writer(batch_size=4)
    w.write(ChunkEvent(7, T0, 0, 0, 1, "content", "a"))
    w.write(ChunkEvent(7, T0, 1, 2**63, 1, "content", "b"))
    w.write(ChunkEvent(7, T0, 2, 0, 2, "content", "c"))
    w.write(ChunkEvent(7, T0, 3, 0, 3, "content", "d"))  # flushes
    assert w.pending == 0
    assert queries.stream_text(w.store, 7) == {0: "acd"}
    assert [e["kind"] for e in queries.list_errors(w.store)] == ["row-rejected"]


@pytest.mark.parametrize("where", ["file", "memory"])
def test_database_failure_keeps_the_batch(where: str, tmp_path: Path) -> None:
    """A database that cannot take writes at all (here a table missing: an
    OperationalError, as for a locked or unreachable one) is not a bad row: the
    batch is rolled back and kept (``StoreError``); flush again or discard."""
    w = memory_writer() if where == "memory" else StoreWriter(str(tmp_path / "k.db"))
    w.write(ChunkEvent(9, T0, 0, 0, 1, "content", "x"))
    w.write(ConnectionOpened(1, T0, ("127.0.0.1", 1), ("127.0.0.1", 2), True))
    if w._lite is not None:
        with w._lite.begin() as tx:
            tx.exec_driver_sql("ALTER TABLE chunks RENAME TO chunks_away", ())
    else:
        with w.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE chunks RENAME TO chunks_away")
    with pytest.raises(StoreError, match=r"no such table.*kept"):
        w.flush()
    assert w.pending == 2  # rolled back, kept
    assert w.stats["rejected_rows"] == 0 and w.stats["failed_flushes"] == 1
    with pytest.raises(StoreError):
        w.write(ChunkEvent(9, T0, 1, 0, 2, "content", "y"))
        w.flush()
    assert w.discard() == 3
    assert w.stats["discarded_rows"] == 3


def test_database_failure_while_isolating_keeps_what_is_left(tmp_path: Path) -> None:
    """The database failing while a refused batch is written in parts: the
    parts written stay written, the rest (and the error rows of the rows
    refused so far) stay buffered for the next flush: nothing twice, nothing lost."""
    w = StoreWriter(str(tmp_path / "i.db"))
    assert w._lite is not None
    w.write(ChunkEvent(9, T0, 0, 2**63, 1, "content", "bad"))
    w.write(ChunkEvent(9, T0, 1, 0, 1, "content", "ok"))
    w.write(PipelineError(T0, "http", "x", "an error row", stream=9))
    real = w._write_part
    calls = {"errors": 0}

    def failing(conn: Any, part: str, items: list[Any], copy: bool = True) -> int:
        if part == "errors" and calls["errors"] == 0:
            calls["errors"] += 1
            raise sqlite3.OperationalError("database is locked")
        return real(conn, part, items, copy)

    w._write_part = failing  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="locked"):
        w.flush()
    assert w.pending == 2  # the error row, and the refused chunk's error row
    assert w.stats["rejected_rows"] == 1
    w.flush()
    engine = open_store(str(tmp_path / "i.db"))
    assert queries.stream_text(engine, 9) == {0: "ok"}
    kinds = sorted(e["kind"] for e in queries.list_errors(engine))
    assert kinds == ["row-rejected", "x"]
    w.close()


def _mixed_chunks(stream: int, seq0: int) -> list[ChunkEvent]:
    """Chunk events with every kind of NULL pattern, plain ones between them."""
    usage = Usage({"prompt_tokens": 3, "completion_tokens": 2}, prompt_tokens=3)
    return [
        ChunkEvent(stream, T0, seq0, 0, 0, "role"),
        ChunkEvent(stream, T0 + 1, seq0 + 1, 0, 1, "content", "a", logprobs='{"c":[]}'),
        ChunkEvent(stream, T0 + 2, seq0 + 2, 0, 2, "content", "b"),
        ChunkEvent(stream, T0 + 3, seq0 + 3, 0, 0, "tool_call", tool_calls="[{}]"),
        ChunkEvent(stream, T0 + 4, seq0 + 4, 0, 3, "content", "c"),
        ChunkEvent(stream, T0 + 5, seq0 + 5, 0, 0, "finish", finish_reason="stop"),
        ChunkEvent(stream, T0 + 6, seq0 + 6, -1, 0, "usage", usage=usage),
        ChunkEvent(stream, T0 + 7, seq0 + 7, -1, 0, "other", raw="x", server_tokens="[1]"),
        ChunkEvent(stream, T0 + 8, seq0 + 8, 0, 4, "content", "d"),
        ChunkEvent(stream, T0 + 9, seq0 + 9, 0, 5, None, "e"),  # type: ignore[arg-type]
    ]


def _chunk_values(ev: ChunkEvent) -> tuple[Any, ...]:
    """A chunk's column values in table order (but the id), usage as its JSON."""
    values = [getattr(ev, f.name) for f in dataclasses.fields(ChunkEvent)]
    values.insert(0, values.pop(0))  # stream first: the table's stream_id
    ts = values.pop(1)  # the event's ts is the table's seventh column
    values.insert(5, ts)
    return tuple(usage_json(v) if isinstance(v, Usage) else v for v in values)


def _chunk_oracle() -> sqlite3.Connection:
    """SQLite inserting chunk rows one by one: ids and the 14 values."""
    oracle = sqlite3.connect(":memory:")
    oracle.execute(
        "CREATE TABLE chunks (id INTEGER PRIMARY KEY, "
        + ", ".join(f"c{i}" for i in range(14))
        + ")"
    )
    return oracle


def _oracle_insert(oracle: sqlite3.Connection, events: list[ChunkEvent]) -> None:
    oracle.executemany(
        f"INSERT INTO chunks ({', '.join(f'c{i}' for i in range(14))}) "
        f"VALUES ({', '.join('?' * 14)})",
        [_chunk_values(ev) for ev in events],
    )


@pytest.mark.parametrize("where", ["file", "memory"])
def test_chunk_ids_are_the_ones_sqlite_gives(where: str, tmp_path: Path) -> None:
    """Chunk rows go in by runs of the same NULL columns (no parameter bound for
    those): the ids, and every value, are the ones SQLite gives the rows
    inserted one by one in order, here checked against SQLite doing so, across
    batches, after the largest ids were deleted (SQLite then hands them out
    again), and for rows of every NULL pattern in one batch."""
    w = StoreWriter(str(tmp_path / "w.db")) if where == "file" else memory_writer()
    oracle = _chunk_oracle()

    def both(events: list[ChunkEvent]) -> None:
        w.write_many(events)
        w.flush()
        _oracle_insert(oracle, events)

    def delete_last(n: int) -> None:
        top = oracle.execute("SELECT max(id) FROM chunks").fetchone()[0]
        oracle.execute("DELETE FROM chunks WHERE id > ?", (top - n,))
        with w._transaction() as conn:
            conn.exec_driver_sql(f"DELETE FROM chunks WHERE id > {top - n}")

    both(_mixed_chunks(1, 0))
    both(_mixed_chunks(2, 0) + _mixed_chunks(1, 10))
    delete_last(3)
    both(_mixed_chunks(3, 0))
    # runs of plain rows long enough for every statement size: 124 rows, 16, 1
    plain = [ChunkEvent(4, T0, i, 0, i, "content", f"{i}") for i in range(300)]
    both(plain[:7] + _mixed_chunks(4, 300) + plain[7:] + _mixed_chunks(4, 310))
    got = [tuple(r) for r in w.store.query("SELECT * FROM chunks ORDER BY id")]
    want = oracle.execute("SELECT * FROM chunks ORDER BY id").fetchall()
    assert got == want
    assert len(got) == 357 and got[-1][0] == 357
    w.close()


def test_runs_of_every_length_and_shape_keep_ids_and_values(tmp_path: Path) -> None:
    """Content rows (a plain ``content`` chunk without reasoning: kind and
    reasoning written as literals), plain rows of other kinds or with
    reasoning, and full rows, in runs of every length from 1 to 300 (each
    run in statements of 166 or 124 rows, then a power of two): every id and
    value is the one SQLite gives the rows inserted one by one in order."""
    w = StoreWriter(str(tmp_path / "r.db"))
    oracle = _chunk_oracle()
    events: list[ChunkEvent] = []
    seq = 0
    for n in [*range(1, 70), 123, 124, 125, 165, 166, 167, 300]:
        for _ in range(n):
            events.append(ChunkEvent(1, T0 + seq / 8, seq, 0, seq, "content", f"t{seq}"))
            seq += 1
        other = [
            ChunkEvent(1, T0, seq, 0, seq, "content", "u", "why"),  # reasoning: plain
            ChunkEvent(1, T0, seq + 1, 0, 0, "role"),  # plain
            ChunkEvent(1, T0, seq + 2, 0, 0, "finish", finish_reason="stop"),  # full
            ChunkEvent(1, T0, seq + 3, 0, 0, "reasoning", "", "r"),  # plain
        ][: 1 + n % 4]
        events += other
        seq += len(other)
    w.write_many(events)
    w.flush()
    _oracle_insert(oracle, events)
    got = [tuple(r) for r in w.store.query("SELECT * FROM chunks ORDER BY id")]
    want = oracle.execute("SELECT * FROM chunks ORDER BY id").fetchall()
    assert got == want
    assert len(got) == len(events) == seq
    kinds = w.store.query(
        "SELECT typeof(kind), typeof(reasoning), count(*) FROM chunks GROUP BY 1, 2"
    )
    assert [tuple(r) for r in kinds] == [("text", "text", len(events))]
    w.close()


def test_full_chunk_row_of_every_shape() -> None:
    """What other databases get (and a refused row's error names): any buffered
    chunk row as all its columns, the same as the full row of its event."""
    usage = Usage({"prompt_tokens": 1}, prompt_tokens=1)
    for ev in [
        ChunkEvent(3, T0, 0, 0, 1, "content", "a"),  # content row
        ChunkEvent(3, T0, 1, 0, 2, "content", "b", "think"),  # plain
        ChunkEvent(3, T0, 2, 1, 0, "role"),  # plain
        ChunkEvent(3, T0, 3, 0, 0, "usage", usage=usage),  # full
    ]:
        row = chunk_row(ev)
        assert _full_chunk_row(row) == _chunk_values(ev)
    assert len(chunk_row(ChunkEvent(3, T0, 0, 0, 1, "content", "a"))) == 6
    assert len(chunk_row(ChunkEvent(3, T0, 0, 0, 1, "content", "a", "x"))) == 8


def test_plain_chunk_rows_bind_no_null(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk whose optional fields are all None binds no parameter for their
    NULL columns: sqlite3's adapter for None (a lookup and a call per value)
    is not called once for a batch of plain chunks."""
    calls: list[None] = []
    monkeypatch.setitem(sqlite3.adapters, (type(None), sqlite3.PrepareProtocol), calls.append)
    w = memory_writer()
    w.write_many([ChunkEvent(1, T0, i, 0, i, "content", "x") for i in range(300)])
    w.flush()
    assert calls == []
    w.write(ChunkEvent(1, T0, 300, 0, 0, "finish", finish_reason="stop"))
    w.flush()
    assert calls == []  # its NULL columns are not bound either
    w.write(ChunkEvent(1, T0, 301, 0, 0, None, "y"))  # type: ignore[arg-type]
    w.flush()
    # a None where the event's type says there is none: bound (NULL all the same)
    assert calls == [None]
    assert queries.stream_text(w.store, 1) == {0: "x" * 300 + "y"}
    assert w.store.scalar("SELECT count(*) FROM chunks WHERE tool_calls IS NULL") == 302
    assert w.store.scalar("SELECT count(*) FROM chunks WHERE kind IS NULL") == 1


@pytest.mark.parametrize("where", ["file", "memory"])
def test_connection_and_stream_rows_bind_no_null_and_the_same_booleans(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connection and stream rows go in grouped by their NULL columns too (no
    None bound: a stream row has some 25), and their booleans are stored as
    the integers 1 and 0, as sqlite3 binds an ``int`` subclass."""
    calls: list[None] = []
    monkeypatch.setitem(sqlite3.adapters, (type(None), sqlite3.PrepareProtocol), calls.append)
    w = StoreWriter(str(tmp_path / "w.db")) if where == "file" else memory_writer()
    events = realistic_events()
    opened = [
        ev for ev in events if isinstance(ev, (ConnectionOpened, StreamOpened, StreamResponse))
    ]
    w.write_many(opened + [ev for ev in events if isinstance(ev, StreamClosed)])
    w.flush()
    assert calls == []
    assert w.stats["streams"] == 3 and w.stats["connections"] == 2
    got = w.store.query("SELECT typeof(is_stream), is_stream, done_seen, gap FROM streams")
    assert [tuple(r) for r in got] == [
        ("integer", 1, 1, 0),
        ("integer", 0, 0, 0),
        ("integer", 1, 0, 1),
    ]
    w.close()


def test_updates_bind_no_null_and_write_what_one_batch_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The UPDATEs of rows an earlier batch wrote (every stream's response and
    close, every connection's close) bind no None: each run of rows with the
    same None values is one statement writing them as NULL literals. Whatever
    the runs (the three closes have different None columns), the rows are
    those of one batch, where the updates merge into the inserts."""
    calls: list[None] = []
    monkeypatch.setitem(sqlite3.adapters, (type(None), sqlite3.PrepareProtocol), calls.append)
    events = realistic_events()
    heads = (ConnectionOpened, StreamOpened)
    early = [ev for ev in events if isinstance(ev, heads)]
    late = [ev for ev in events if not isinstance(ev, heads)]
    w = memory_writer()
    w.write_many(early)
    w.flush()
    calls.clear()  # (the inserts' None are not this test's)
    w.write_many(late)
    assert [len(w._parts()[k][1]) for k in (4, 5, 6)] == [2, 3, 3]  # closes, responses
    w.flush()
    assert calls == []
    assert w.stats["unmatched_updates"] == 0
    reference = memory_writer()
    reference.write_many(events)
    reference.flush()
    assert dump(w.engine) == dump(reference.engine)


def test_a_midway_close_sets_the_model_only_where_there_is_none() -> None:
    """A close names the model (a stream recovered mid-way) only for a row
    without one: the UPDATE's ``coalesce``, whether the model is given or not."""
    w = memory_writer()
    opened = [ev for ev in realistic_events() if isinstance(ev, (ConnectionOpened, StreamOpened))]
    w.write_many(opened)
    w.write(dataclasses.replace(opened[1], stream=9, request=RequestSummary()))
    w.write(dataclasses.replace(opened[1], stream=10, request=RequestSummary()))
    w.flush()
    close = StreamClosed(
        stream=1,
        ts=T0 + 1,
        state=StreamState.MIDWAY,
        reason="recovered",
        done_seen=False,
        gap=True,
        t_first_content=None,
        t_last_chunk=None,
        chunk_count=0,
        event_count=0,
        text_len=0,
        finish_reasons=(),
        usage=None,
        response_body=None,
        response_model="named-by-chunks",
    )
    w.write(close)  # stream 1 has a model: kept
    w.write(dataclasses.replace(close, stream=9))  # none: the close's
    w.write(dataclasses.replace(close, stream=10, response_model=None))  # none given: none
    w.write(dataclasses.replace(close, stream=77))  # no such row
    w.flush()
    models = dict(w.store.query("SELECT id, model FROM streams WHERE state = 'midway'"))
    assert models == {1: "tiny", 9: "named-by-chunks", 10: None}
    assert w.stats["unmatched_updates"] == 1


def test_finish_reasons_json_is_the_text_json_dumps_writes() -> None:
    cases: list[tuple[tuple[int, Any], ...]] = [
        (),
        ((0, "stop"),),
        ((1, "length"), (0, "stop"), (-1, 'é " \ud800')),
        ((0, "stop"), (0, "length")),  # the last one of a choice, as a dict keeps it
        ((0, None),),  # not a str: json.dumps itself
    ]
    for pairs in cases:
        assert finish_reasons_json(pairs) == json.dumps({str(c): r for c, r in pairs})


def test_optional_chunk_fields_are_the_last_chunk_columns() -> None:
    """The writer's plain chunk row is the table's leading columns: the optional
    ChunkEvent fields must be its last ones, in the same order."""
    names = [c.name for c in chunks.columns]
    assert OPTIONAL_CHUNK_FIELDS == (
        "tool_calls",
        "finish_reason",
        "logprobs",
        "usage",
        "raw",
        "server_tokens",
    )
    assert tuple(names[-len(OPTIONAL_CHUNK_FIELDS) :]) == OPTIONAL_CHUNK_FIELDS


def test_chunk_ids_near_the_largest_integer_are_left_to_sqlite(tmp_path: Path) -> None:
    """Past the largest id 2^63 - 1 SQLite picks free ids at random: nothing is
    refused, every row is stored."""
    w = StoreWriter(str(tmp_path / "big.db"))
    with w._transaction() as conn:
        conn.exec_driver_sql(f"INSERT INTO chunks (id, stream_id, seq) VALUES ({2**63 - 2}, 1, 0)")
    w.write_many(_mixed_chunks(1, 1))
    w.flush()
    assert w.stats["rejected_rows"] == 0
    assert w.store.scalar("SELECT count(*) FROM chunks") == 11
    assert w.store.scalar("SELECT max(id) FROM chunks") == 2**63 - 1
    w.close()


def test_headers_json_is_the_text_json_dumps_writes() -> None:
    cases: list[tuple[tuple[str, str], ...]] = [
        (),
        (("Host", "h:1"), ("Content-Type", "application/json")),
        (("X-Note", 'quote " back\\slash \t tab'), ("X-Uni", "é 😀 \ud800 \x00 \x7f")),
        (("Authorization", "Bearer s"), ("Cookie", "a=b"), ("Accept", "*/*")),
    ]
    for _ in range(2):  # the names' JSON starts made, then looked up
        for headers in cases:
            kept = [[n, v] for n, v in headers if not is_credential_header(n)]
            assert headers_json(headers) == json.dumps(kept)
    assert "Bearer" not in headers_json(cases[3]) and "a=b" not in headers_json(cases[3])


def test_endpoint_text() -> None:
    assert endpoint_text(("10.0.0.1", 80)) == "10.0.0.1:80"
    assert endpoint_text(("fe80::1", 443)) == "[fe80::1]:443"


# ---------------------------------------------------------------------------
# portability
# ---------------------------------------------------------------------------


def test_schema_compiles_for_postgresql() -> None:
    dialect = postgresql.dialect()
    for table in metadata.sorted_tables:
        ddl = str(CreateTable(table).compile(dialect=dialect))
        assert "JSON" not in ddl
        for index in table.indexes:
            str(CreateIndex(index).compile(dialect=dialect))
    ddl = str(CreateTable(chunks).compile(dialect=dialect))
    assert "id BIGSERIAL" in ddl
    assert "id BIGINT NOT NULL" in str(CreateTable(streams).compile(dialect=dialect))
    assert {ix.name for ix in streams.indexes} == {
        "ix_streams_label_model",
        "ix_streams_t_request",
        "ix_streams_state",
        "ix_streams_connection",
        "ix_streams_node",
    }


def test_postgresql_roundtrip(fresh_pg_url: str) -> None:
    PG_URL = fresh_pg_url
    w = StoreWriter(PG_URL, batch_size=3)
    w.write_many(realistic_events())
    w.write(ChunkEvent(3, T0, 9, 0, 0, "other", raw="nul\x00 and \ud83d"))
    w.flush()
    reference = memory_writer()
    reference.write_many(realistic_events())
    reference.flush()
    assert w.stats["cleaned_batches"] == 1
    assert queries.count_rows(w.store)["chunks"] == 15
    s1 = queries.get_stream(w.store, 1)
    assert s1 is not None and s1["is_stream"] is True and s1["prompt_tokens"] == 9
    assert queries.stream_text(w.store, 1) == {0: "Hello", 1: "Bonjour"}
    assert w.id_bases() == (3, 4)
    with w.engine.begin() as conn:
        conn.execute(chunks.delete().where(chunks.c.seq == 9))
    assert dump(w.engine) == dump(reference.engine)
    w.close()


def test_replay_into_postgresql_matches_sqlite(fresh_pg_url: str, tmp_path: Path) -> None:
    """The whole pipeline writes the same rows to PostgreSQL as to SQLite."""
    from sniffer.runtime.replay import replay

    pg_url = fresh_pg_url
    pcaps = Path(__file__).resolve().parent.parent / "pcaps"
    lite = str(tmp_path / "lite.db")
    for name in (
        "n2.pcap",
        "keepalive_3.pcap",
        "faults/fault_lost.pcap",
        "faults/sec_big_int.pcap",  # integers past the columns: recorded, not stored
    ):
        replay(pcaps / name, pg_url)
        replay(pcaps / name, lite)
    pg, sq = open_store(pg_url), open_store(lite)
    assert queries.count_rows(pg) == queries.count_rows(sq)
    for s in queries.list_streams(sq):
        assert queries.stream_text(pg, s["id"]) == queries.stream_text(sq, s["id"])
    pg_states = sorted(r["state"] for r in queries.list_streams(pg))
    assert pg_states == sorted(r["state"] for r in queries.list_streams(sq))
    pg.close()
    sq.close()


# ---------------------------------------------------------------------------
# queries
# ---------------------------------------------------------------------------


def test_get_stream_with_chunks_and_errors(written: StoreWriter) -> None:
    s3 = queries.get_stream(written.store, 3)
    assert s3 is not None
    assert [c["seq"] for c in s3["chunks"]] == [0, 1, 2]
    assert [c["text"] for c in s3["chunks"]] == ["", "Ab", "cé"]
    assert [(e["stage"], e["kind"], e["message"]) for e in s3["errors"]] == [
        ("reassembly", "gap", "12 bytes lost")
    ]
    s1 = queries.get_stream(written.store, 1)
    assert s1 is not None
    assert [c["kind"] for c in s1["chunks"]] == [
        "role",
        "role",
        "content",
        "content",
        "content",
        "content",
        "finish",
        "usage",
        "done",
    ]
    assert s1["chunks"][5]["finish_reason"] == "stop" and s1["errors"] == []
    assert queries.get_stream(written.store, 99) is None


def test_stream_text_per_choice(written: StoreWriter) -> None:
    assert queries.stream_text(written.store, 1) == {0: "Hello", 1: "Bonjour"}
    assert queries.stream_text(written.store, 2) == {0: "upon a time"}
    assert queries.stream_text(written.store, 3) == {0: "Abcé"}
    assert queries.stream_text(written.store, 99) == {}


def test_list_streams_filters(written: StoreWriter) -> None:
    e = written.store
    assert [s["id"] for s in queries.list_streams(e)] == [1, 2, 3]
    assert [s["id"] for s in queries.list_streams(e, label="run1")] == [1, 2]
    assert [s["id"] for s in queries.list_streams(e, state="gap")] == [3]
    assert [s["id"] for s in queries.list_streams(e, model="tiny", limit=2)] == [1, 2]
    assert queries.list_streams(e, model="other") == []
    assert [s["id"] for s in queries.list_streams(e, stream_ids=[3, 1])] == [1, 3]


def test_list_errors(written: StoreWriter) -> None:
    all_errors = queries.list_errors(written.store)
    assert [e["kind"] for e in all_errors] == ["gap", "framing"]
    assert all_errors[1]["connection_id"] == 2 and all_errors[1]["stream_id"] is None
    assert [e["kind"] for e in queries.list_errors(written.store, 1)] == ["framing"]
    assert [e["kind"] for e in queries.list_errors(written.store, stream_id=3)] == ["gap"]


def test_json_columns(written: StoreWriter) -> None:
    s1 = queries.json_columns(queries.list_streams(written.store, limit=1)[0])
    assert s1["finish_reasons"] == {"0": "length", "1": "stop"}
    assert s1["usage"]["total_tokens"] == 13


def count_errors(db: str) -> int:
    with sqlite3.connect(db) as c:
        n: int = c.execute("SELECT count(*) FROM errors").fetchone()[0]
    return n


def test_replay_goes_on_past_a_row_the_database_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay of the capture with 2^63 as a chat choice index and an Anthropic
    block index, with the dialects' index range widened (as a dialect that
    missed the check would): those chunk rows are refused and recorded, the
    rest of the capture, the canary stream included, is stored and replay
    succeeds (issue #24: it exited 1 with 0 streams stored)."""
    import sniffer.llm.dialects._json as dialect_json
    import sniffer.llm.dialects.openai as openai
    from sniffer.runtime.replay import replay

    monkeypatch.setattr(openai, "INDEX_MAX", 2**70)
    monkeypatch.setattr(dialect_json, "INDEX_MAX", 2**70)
    pcap = Path(__file__).resolve().parent.parent / "pcaps" / "faults" / "sec_big_int.pcap"
    expected = json.loads(pcap.with_suffix(".expected.json").read_text())
    db = str(tmp_path / "r.db")
    result = replay(pcap, db, tokens=None)
    assert result.streams == 5
    assert result.errors == count_errors(db)  # the summary counts the error rows
    engine = open_store(db)
    refused = [e for e in queries.list_errors(engine) if e["kind"] == "row-rejected"]
    # the chat chunk; the Anthropic delta and the finish the message_delta gives its block
    assert len(refused) == 3 and all(e["stage"] == "store" for e in refused)
    assert all("OverflowError" in e["message"] for e in refused)
    rows = queries.list_streams(engine)
    assert len(rows) == 5
    canary = next(w for w in expected["streams"] if w["client_port"] == 40106)
    (row,) = [r for r in rows if r["client"].endswith(":40106")]
    assert row["state"] == "complete"
    assert queries.stream_text(engine, row["id"]) == {0: canary["choices"]["0"]["text"]}


def test_executemany_flat_sqlite_runs_the_statements_of_executemany_sqlite() -> None:
    """Rows given one after another go in as the same statements, with the same
    parameters, as those rows given as tuples (and so the same ids)."""
    calls: dict[str, list[tuple[str, list[tuple[Any, ...]]]]] = {"rows": [], "flat": []}

    class Tx:
        def __init__(self, key: str) -> None:
            self.key = key

        def exec_driver_sql(self, sql: str, params: list[tuple[Any, ...]]) -> None:
            assert all(type(p) is tuple for p in params)  # what SQLAlchemy takes
            calls[self.key].append((sql, params))

    sql = "INSERT INTO t (a, b, c) VALUES (?, ?, ?)"
    for n in (0, 1, 2, 3, 5, 7, 32, 33, 35, 64 + 15, 333, 334, 1000):
        for max_rows in (999, 32, 4):
            rows = [(i, f"r{i}", None if i % 3 else i * 2) for i in range(n)]
            calls["rows"].clear()
            calls["flat"].clear()
            if rows:
                executemany_sqlite(Tx("rows"), sql, 3, rows, max_rows)  # type: ignore[arg-type]
            flat = [v for row in rows for v in row]
            executemany_flat_sqlite(Tx("flat"), sql, 3, flat, max_rows)  # type: ignore[arg-type]
            assert calls["flat"] == calls["rows"], (n, max_rows)


def test_executemany_sqlite_statement_sizes_keep_the_row_order() -> None:
    """A run of rows goes in as full statements (999 parameters, or
    ``max_rows``), then one per power of two down to 4, then the last three,
    two or one in one statement; the rows keep their order (the ids of one
    statement per row)."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b TEXT)")
    sizes: list[int] = []

    class Tx:
        def exec_driver_sql(self, sql: str, params: list[tuple[Any, ...]]) -> None:
            for p in params:
                sizes.append(len(p) // 2)
            conn.executemany(sql, params)

    sql = "INSERT INTO t (a, b) VALUES (?, ?)"
    want: list[tuple[int, str]] = []
    for n, expect in (
        (3, [3]),
        (7, [4, 3]),
        (2, [2]),
        (1, [1]),
        (15, [8, 4, 3]),
        (999 + 6, [499, 499, 4, 3]),
        (999 + 4, [499, 499, 4, 1]),
    ):
        rows = [(len(want) + i, f"r{len(want) + i}") for i in range(n)]
        sizes.clear()
        executemany_sqlite(Tx(), sql, 2, rows)  # type: ignore[arg-type]
        assert sizes == expect, n
        want += rows
    for n, expect in ((11, [4, 4, 3]), (8, [4, 4]), (6, [4, 2])):  # at most max_rows
        rows = [(len(want) + i, f"r{len(want) + i}") for i in range(n)]
        sizes.clear()
        executemany_sqlite(Tx(), sql, 2, rows, max_rows=4)  # type: ignore[arg-type]
        assert sizes == expect, n
        want += rows
    assert conn.execute("SELECT a, b FROM t ORDER BY id").fetchall() == want
    assert [r[0] for r in conn.execute("SELECT id FROM t ORDER BY id")] == list(
        range(1, len(want) + 1)
    )
