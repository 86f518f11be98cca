"""Export: exact JSONL records and the CSV summary."""

from __future__ import annotations

import csv
import io
import json

import pytest
from test_store import T0, realistic_events

from sniffer.core.events import ChunkEvent, StreamClosed, StreamOpened, StreamState
from sniffer.reports.export import CSV_COLUMNS, export_csv, export_jsonl, iso_utc
from sniffer.store.writer import StoreWriter

EXPECTED_JSONL = """\
{"event":"request_start","stream_id":1,"client":"127.0.0.1:50000","server":"127.0.0.1:8000","method":"POST","path":"/v1/chat/completions","model":"tiny","prompt_len":2,"stream":true,"captured_at":"2023-11-14T22:13:20.125000+00:00"}
{"event":"chunk","stream_id":1,"choice_index":0,"chunk_index":1,"delta_text":"Hel","delta_len":3,"accumulated_len":3,"finish_reason":null,"captured_at":"2023-11-14T22:13:20.500000+00:00"}
{"event":"chunk","stream_id":1,"choice_index":1,"chunk_index":1,"delta_text":"Bon","delta_len":3,"accumulated_len":3,"finish_reason":null,"captured_at":"2023-11-14T22:13:20.500000+00:00"}
{"event":"chunk","stream_id":1,"choice_index":0,"chunk_index":2,"delta_text":"lo","delta_len":2,"accumulated_len":5,"finish_reason":null,"captured_at":"2023-11-14T22:13:20.625000+00:00"}
{"event":"chunk","stream_id":1,"choice_index":1,"chunk_index":2,"delta_text":"jour","delta_len":4,"accumulated_len":7,"finish_reason":"stop","captured_at":"2023-11-14T22:13:20.625000+00:00"}
{"event":"stream_done","stream_id":1,"chunk_count":4,"total_text_len":12,"elapsed_seconds":0.375,"request_elapsed_seconds":0.75,"complete":true,"gap":false,"captured_at":"2023-11-14T22:13:20.875000+00:00"}
{"event":"request_start","stream_id":2,"client":"127.0.0.1:50000","server":"127.0.0.1:8000","method":"POST","path":"/v1/completions","model":"tiny","prompt_len":1,"stream":false,"captured_at":"2023-11-14T22:13:21.000000+00:00"}
{"event":"chunk","stream_id":2,"choice_index":0,"chunk_index":1,"delta_text":"upon a time","delta_len":11,"accumulated_len":11,"finish_reason":"length","captured_at":"2023-11-14T22:13:21.250000+00:00"}
{"event":"stream_done","stream_id":2,"chunk_count":1,"total_text_len":11,"elapsed_seconds":0.0,"request_elapsed_seconds":0.25,"complete":true,"gap":false,"captured_at":"2023-11-14T22:13:21.250000+00:00"}
{"event":"request_start","stream_id":3,"client":"127.0.0.1:50002","server":"127.0.0.1:8000","method":"POST","path":"/v1/chat/completions","model":"tiny","prompt_len":1,"stream":true,"captured_at":"2023-11-14T22:13:22.125000+00:00"}
{"event":"chunk","stream_id":3,"choice_index":0,"chunk_index":1,"delta_text":"Ab","delta_len":2,"accumulated_len":2,"finish_reason":null,"captured_at":"2023-11-14T22:13:22.500000+00:00"}
{"event":"chunk","stream_id":3,"choice_index":0,"chunk_index":2,"delta_text":"cé","delta_len":2,"accumulated_len":4,"finish_reason":null,"captured_at":"2023-11-14T22:13:23.000000+00:00"}
{"event":"stream_done","stream_id":3,"chunk_count":2,"total_text_len":4,"elapsed_seconds":0.5,"request_elapsed_seconds":0.875,"complete":false,"gap":true,"captured_at":"2023-11-14T22:13:23.500000+00:00"}
"""  # noqa: E501


@pytest.fixture
def writer() -> StoreWriter:
    w = StoreWriter(":memory:", batch_size=5)
    w.write_many(realistic_events())
    w.flush()
    return w


def test_jsonl_exact(writer: StoreWriter) -> None:
    out = io.StringIO()
    lines = export_jsonl(writer.store, out)
    assert out.getvalue() == EXPECTED_JSONL
    assert lines == 13


def test_jsonl_records_parse_and_are_consistent(writer: StoreWriter) -> None:
    out = io.StringIO()
    export_jsonl(writer.store, out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    for done in (r for r in records if r["event"] == "stream_done"):
        mine = [r for r in records if r["event"] == "chunk" and r["stream_id"] == done["stream_id"]]
        assert done["chunk_count"] == len(mine)
        assert done["total_text_len"] == sum(r["delta_len"] for r in mine)


def test_jsonl_filters(writer: StoreWriter) -> None:
    out = io.StringIO()
    assert export_jsonl(writer.store, out, stream_ids=[2]) == 3
    assert out.getvalue() == "".join(EXPECTED_JSONL.splitlines(keepends=True)[6:9])
    out = io.StringIO()
    assert export_jsonl(writer.store, out, label="run2") == 4
    assert [json.loads(x)["stream_id"] for x in out.getvalue().splitlines()] == [3, 3, 3, 3]
    out = io.StringIO()
    assert export_jsonl(writer.store, out, label="nope") == 0
    assert out.getvalue() == ""


def test_open_stream_has_no_stream_done() -> None:
    w = StoreWriter(":memory:")
    events = [e for e in realistic_events() if not (isinstance(e, StreamClosed) and e.stream == 3)]
    w.write_many(events)
    w.flush()
    out = io.StringIO()
    export_jsonl(w.store, out, stream_ids=[3])
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == [
        "request_start",
        "chunk",
        "chunk",
    ]


def test_streams_in_request_order_not_id_order() -> None:
    w = StoreWriter(":memory:")
    for sid, ts in ((7, T0 + 5), (5, T0 + 9), (6, T0 + 1)):
        w.write(
            StreamOpened(sid, 1, 0, ts, ("127.0.0.1", 1), ("127.0.0.1", 2), "GET", "/", (), None)
        )
        w.write(ChunkEvent(sid, ts, 0, 0, 1, "content", "x"))
        w.write(
            StreamClosed(
                sid,
                ts,
                StreamState.TRUNCATED,
                "eof",
                False,
                False,
                ts,
                None,
                1,
                1,
                1,
                (),
                None,
                None,
            )
        )
    w.flush()
    out = io.StringIO()
    export_jsonl(w.store, out)
    records = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["stream_id"] for r in records] == [6, 6, 6, 7, 7, 7, 5, 5, 5]
    first = records[0]
    assert (first["model"], first["prompt_len"], first["stream"]) == (None, None, None)
    done = records[2]
    assert done["complete"] is False and done["elapsed_seconds"] == 0.0  # closed_at - first content


def test_csv_summary(writer: StoreWriter) -> None:
    out = io.StringIO(newline="")
    assert export_csv(writer.store, out) == 3
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["stream_id"] for r in rows] == ["1", "2", "3"]
    r1 = rows[0]
    assert r1["state"] == "complete" and r1["done_seen"] == "True" and r1["gap"] == "False"
    assert r1["ttft_seconds"] == "0.375" and r1["elapsed_seconds"] == "0.75"
    assert r1["requested_at"] == "2023-11-14T22:13:20.125000+00:00"
    assert (r1["prompt_tokens"], r1["completion_tokens"]) == ("9", "4")
    assert json.loads(r1["finish_reasons"]) == {"0": "length", "1": "stop"}
    assert rows[2]["state"] == "gap" and rows[2]["prompt_tokens"] == ""
    out = io.StringIO(newline="")
    assert export_csv(writer.store, out, label="run2") == 1


def test_iso_utc() -> None:
    assert iso_utc(T0) == "2023-11-14T22:13:20.000000+00:00"
    assert iso_utc(0.000001) == "1970-01-01T00:00:00.000001+00:00"
    assert iso_utc(None) is None
