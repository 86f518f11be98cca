"""The writer's buffered connection and stream rows: only their columns that are
not NULL, booleans as 0 and 1; whatever the flushes a stream's events fall in,
its rows are the same."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sniffer.core.events import (
    ConnectionClosed,
    ConnectionOpened,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamFlagged,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary, ServerTimings, SpecDecode, Usage
from sniffer.store import writer as writer_mod
from sniffer.store.lite import TABLE_COLUMNS
from sniffer.store.writer import (
    StoreWriter,
    _bind,
    _connection_row,
    _dense,
    _stream_row,
    headers_json,
)
from tests.test_store import T0, dump, memory_writer, realistic_events

SRV = ("127.0.0.1", 8000)


def _opened(stream: int, conn: int, **kw: Any) -> StreamOpened:
    fields: dict[str, Any] = {
        "stream": stream,
        "conn": conn,
        "exchange": 0,
        "ts": T0 + stream,
        "client": ("10.0.0.2", 40000 + conn),
        "server": SRV,
        "method": "POST",
        "path": "/v1/chat/completions",
        "request_headers": (("host", "x"), ("content-type", "application/json")),
        "request_body": '{"model":"m","stream":true}',
        "request": RequestSummary(model="m", stream=True, temperature=0.0, seed=3),
        "dialect": "openai.chat",
    }
    return StreamOpened(**(fields | kw))


def _closed(stream: int, **kw: Any) -> StreamClosed:
    fields: dict[str, Any] = {
        "stream": stream,
        "ts": T0 + stream + 0.5,
        "state": StreamState.COMPLETE,
        "reason": "complete",
        "done_seen": True,
        "gap": False,
        "t_first_content": T0 + stream + 0.1,
        "t_last_chunk": T0 + stream + 0.4,
        "chunk_count": 3,
        "event_count": 4,
        "text_len": 12,
        "finish_reasons": ((0, "stop"),),
        "usage": None,
        "response_body": None,
    }
    return StreamClosed(**(fields | kw))


def _response(stream: int, **kw: Any) -> StreamResponse:
    fields: dict[str, Any] = {
        "stream": stream,
        "ts": T0 + stream + 0.05,
        "status": 200,
        "headers": (("content-type", "text/event-stream"),),
        "content_type": "text/event-stream",
        "streaming": True,
    }
    return StreamResponse(**(fields | kw))


SPEC = SpecDecode("vllm", draft_tokens=40, accepted_tokens=22, steps=10, histogram=(1, 2))
TIMINGS = ServerTimings(prompt_n=9, prompt_ms=12.5, predicted_n=None, rejected=("predicted_n",))


def odd_events() -> list[StoreEvent]:
    """What ``realistic_events`` lacks: a close with server statistics, a
    mid-way close naming the model of a request without one, flags before and
    after a close, a head of no status, and a stream given two heads and two
    closes (the second's word is the last; its None columns are NULL)."""
    usage = Usage({"prompt_tokens": 5}, prompt_tokens=5, speculative=SPEC, timings=TIMINGS)
    return [
        ConnectionOpened(7, T0, ("10.0.0.2", 40007), SRV, True, pid=12, comm="py"),
        _opened(70, 7),
        _response(70),
        StreamFlagged(70, T0 + 70.2, (StreamFlag.CLOCK_BACKWARDS,)),
        _closed(70, usage=usage, error="boom", flags=(StreamFlag.CLOCK_BACKWARDS,)),
        _opened(71, 7, request=RequestSummary(), method="", path="", request_body=None),
        _response(71, status=None, streaming=False),
        _closed(71, state=StreamState.MIDWAY, response_model="recovered", t_first_content=None),
        StreamFlagged(71, T0 + 72, (StreamFlag.CLOCK_BACKWARDS,)),
        StreamFlagged(71, T0 + 73, ()),
        _opened(72, 7, label="lab", pid=5, comm="c", text_kept=False),
        _response(72),
        _response(72, status=None, headers=(), streaming=False),
        _closed(72, usage=usage, flags=(StreamFlag.CLOCK_BACKWARDS,)),
        _closed(72, done_seen=False, gap=True, t_last_chunk=None, finish_reasons=()),
        ConnectionClosed(7, T0 + 80, "fin"),
    ]


def _dump(path: Path) -> list[str]:
    """The store as SQL, but for the id blocks (a flush reserves the next)."""
    db = sqlite3.connect(path)
    try:
        return [line for line in db.iterdump() if not line.startswith('INSERT INTO "id_blocks"')]
    finally:
        db.close()


@pytest.mark.parametrize("events", [realistic_events(), odd_events()], ids=["realistic", "odd"])
def test_the_rows_are_the_same_whatever_the_flushes(
    events: list[StoreEvent], tmp_path: Path
) -> None:
    """A stream opened and closed within one flush is written once (its
    response and close merged into its INSERT); split over two flushes at
    any point, its later events are UPDATEs: the store is the same, as SQL."""
    whole = StoreWriter(str(tmp_path / "whole.db"), node="n")
    whole.write_many(events)
    whole.close()
    expected = _dump(tmp_path / "whole.db")
    assert whole.stats["updates"] == 0  # every update merged into its row
    for k in range(1, len(events)):
        path = tmp_path / f"split{k}.db"
        w = StoreWriter(str(path), node="n")
        w.write_many(events[:k])
        w.flush()
        w.write_many(events[k:])
        w.close()
        assert w.stats["unmatched_updates"] == 0
        assert _dump(path) == expected, f"split before event {k}: {events[k]}"


def test_the_odd_rows_as_stored() -> None:
    """What the odd events leave: server statistics of the close's usage, the
    model a mid-way close names, the last flags, the second head and close."""
    w = memory_writer()
    w.write_many(odd_events())
    w.flush()
    cols = (
        "id, model, is_stream, method, status, streaming, state, done_seen, gap, error, "
        "flags, spec_source, spec_draft_tokens, spec_steps, spec_histogram, server_prompt_n, "
        "server_predicted_n, server_rejected, t_first_content, t_last_chunk, text_kept, "
        "finish_reasons, prompt_tokens, usage"
    )
    rows = w.store.query(f"SELECT {cols} FROM streams ORDER BY id")
    r70, r71, r72 = (tuple(r) for r in rows)
    assert r70 == (
        *(70, "m", 1, "POST", 200, 1, "complete", 1, 0, "boom", '["clock-backwards"]'),
        *("vllm", 40, 10, "[1, 2]", 9, None, '["predicted_n"]'),
        *(T0 + 70.1, T0 + 70.4, 1, '{"0": "stop"}', 5, '{"prompt_tokens":5}'),
    )
    assert r71[:11] == (71, "recovered", None, None, None, 0, "midway", 1, 0, None, None)
    assert r71[18] is None  # no first content
    assert r72[:11] == (72, "m", 1, "POST", None, 0, "complete", 0, 1, None, None)
    assert r72[11:] == (None,) * 7 + (T0 + 72.1, None, 0, "{}", None, None)
    conn = w.store.query("SELECT closed_at, close_reason, syn_seen, pid FROM connections")
    assert [tuple(r) for r in conn] == [(T0 + 80, "fin", 1, 12)]
    w.close()


def test_buffered_rows_hold_no_null_and_no_bool() -> None:
    """The rows and updates a batch buffers hold what is not NULL, booleans
    as the integers SQLite stores: the keys name what a statement binds."""
    early = [ev for ev in odd_events() if isinstance(ev, (ConnectionOpened, StreamOpened))]
    w = memory_writer()
    w.write_many(early)
    rows = [*w._conn_rows.values(), *w._stream_rows.values()]
    w.flush()
    w.write_many([ev for ev in odd_events() if ev not in early])
    rows += [values for _, values in w._conn_closes + w._stream_closes + w._stream_responses]
    assert len(rows) == 1 + 3 + 1 + 4 + 4
    for row in rows:
        assert None not in row.values()
        assert not any(type(v) is bool for v in row.values())
    flags = {"flags": '["clock-backwards"]'}
    assert w._stream_flags == [(70, flags), (71, flags), (71, {})]  # (no flags: {})
    w.close()


def test_other_databases_get_every_column_and_booleans() -> None:
    """A buffered row as other databases bind it: every column in table
    order, None where the row has none, booleans as ``bool``."""
    ev = _opened(70, 7, text_kept=False)
    values = _dense(_stream_row(ev, "n"), TABLE_COLUMNS["streams"], "streams")
    got = dict(zip(TABLE_COLUMNS["streams"], values, strict=True))
    assert got["is_stream"] is True and got["text_kept"] is False and got["gap"] is False
    assert got["status"] is None and got["label"] is None and got["model"] == "m"
    assert got["state"] == "open" and got["chunk_count"] == 0
    conn = ConnectionOpened(7, T0, ("10.0.0.2", 40007), SRV, False)
    row = _dense(_connection_row(conn, None, "n"), TABLE_COLUMNS["connections"], "connections")
    assert row[TABLE_COLUMNS["connections"].index("syn_seen")] is False
    params = _bind("stream_close", 70, {"state": "complete", "done_seen": 1})
    assert params["b_done_seen"] is True and params["b_id"] == 70
    assert params["b_state"] == "complete" and params["b_gap"] is None
    assert params["b_model"] is None  # the coalesce keeps the row's


def test_an_update_of_a_column_it_does_not_set_is_refused() -> None:
    with pytest.raises(ValueError, match="sets no column"):
        writer_mod._update_sql_keys("conn_close", ("closed_at", "label"))
    with pytest.raises(ValueError, match="has no column"):
        writer_mod._insert_sql_keys("connections", ("id", "nope"))


def test_headers_json_of_a_list_met_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text of a header list met before is the one kept, the same as the
    first; a list with a credential is not kept; the texts kept are bounded,
    in number and in size."""
    monkeypatch.setattr(writer_mod, "_headers_texts", {})
    monkeypatch.setattr(writer_mod, "_HEADERS_TEXTS_MAX", 4)
    kept = writer_mod._headers_texts
    plain = (("host", "h"), ("accept", "*/*"))
    first = headers_json(plain)
    assert kept == {plain: first} and headers_json(plain) is first
    assert headers_json(tuple((n, v) for n, v in plain)) is first  # an equal list
    secret = (("authorization", "Bearer sk-1"), ("host", "h"))
    assert headers_json(secret) == '[["host", "h"]]' and secret not in kept
    assert headers_json([("host", "h")]) == '[["host", "h"]]'  # a list: not kept
    for i in range(10):
        headers_json((("x-n", str(i)),))
        assert len(kept) <= 4
    assert kept[(("x-n", "9"),)] == '[["x-n", "9"]]'
    big = (("x-big", "v" * writer_mod._HEADERS_TEXT_MAX_LEN),)
    assert headers_json(big) == '[["x-big", "' + "v" * writer_mod._HEADERS_TEXT_MAX_LEN + '"]]'
    assert big not in kept  # a large head's text is made each time, not held


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "executemany"])
def test_postgresql_gets_the_rows_sqlite_gets(fresh_pg_url: str, copy: bool) -> None:
    """Other databases bind every column (``_dense``: None, ``bool``): the odd
    events, in one batch or with their later events as UPDATEs, leave on
    PostgreSQL the rows they leave on SQLite."""
    events = [*realistic_events(), *odd_events()]
    reference = memory_writer()
    reference.write_many(events)
    reference.flush()
    k = next(i for i, ev in enumerate(events) if isinstance(ev, StreamResponse))
    w = StoreWriter(fresh_pg_url, copy=copy)
    w.write_many(events[:k])  # the first stream's response and close: UPDATEs
    w.flush()
    w.write_many(events[k:])
    w.flush()
    assert w.stats["updates"] > 0 and w.stats["unmatched_updates"] == 0
    assert dump(w.engine) == dump(reference.engine)
    w.close()
