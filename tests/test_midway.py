"""A capture that begins at ANY byte of a streamed response (reassembly → http1 →
streams, the whole sans-IO pipeline): exactly the events of the chunks that
start at or after that byte are recorded, as a ``midway`` row, and the next
exchange on the same keep-alive connection is parsed normally."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import (
    ACK,
    PSH,
    ChunkEvent,
    Segment,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.core.pipeline import Pipeline
from sniffer.llm.values import RequestSummary

CLIENT = ("127.0.0.1", 45000)
SERVER = ("127.0.0.1", 8000)
PIECES = ["Hello", " 世界", "，这是", " a test 😀", " été", " 🇯🇵", " and", " more", "."]


def _events(model: str) -> list[bytes]:
    out = []
    for i, p in enumerate(PIECES):
        obj = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": p},
                    "finish_reason": "stop" if i == len(PIECES) - 1 else None,
                }
            ],
        }
        out.append(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _response(events: list[bytes]) -> tuple[bytes, list[int]]:
    """The server's bytes and the offset of each event's chunk-size line."""
    data, starts = HEAD, []
    for e in events:
        starts.append(len(data))
        data += f"{len(e):x}\r\n".encode() + e + b"\r\n"
    return data + b"0\r\n\r\n", starts


def _request(model: str) -> bytes:
    body = json.dumps({"model": model, "stream": True, "messages": []}).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def _texts(events: list[bytes]) -> list[str]:
    out = []
    for e in events:
        data = e[6:-2].decode()
        if data != "[DONE]":
            out.append(json.loads(data)["choices"][0]["delta"]["content"])
    return out


def _run(cut: int, split: int) -> tuple[list[object], list[bytes], list[int]]:
    first = _events("m1")
    resp1, starts = _response(first)
    resp2, _ = _response(_events("m2"))
    pipe = Pipeline()
    out: list[object] = []
    s_isn, c_isn = 5000, 9000
    t = 1.0

    def server(data: bytes, seq: int) -> None:
        nonlocal t
        t += 0.01
        out.extend(pipe.feed(Segment(t, *SERVER, *CLIENT, seq, c_isn, ACK | PSH, data)))

    def client(data: bytes, seq: int) -> None:
        nonlocal t
        t += 0.01
        out.extend(pipe.feed(Segment(t, *CLIENT, *SERVER, seq, s_isn, ACK | PSH, data)))

    # the capture begins at server byte ``cut`` of the first response, which the
    # server wrote in two segments split at ``split`` bytes after the cut
    tail = resp1[cut:]
    server(tail[:split], s_isn + cut)
    if tail[split:]:
        server(tail[split:], s_isn + cut + split)
    req2 = _request("m2")
    client(req2, c_isn)
    server(resp2, s_isn + len(resp1))
    out.extend(pipe.flush(t + 1))
    return out, first, starts


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_capture_beginning_at_any_byte_recovers_exactly_the_later_events(
    data: st.DataObject,
) -> None:
    first = _events("m1")
    resp1, starts = _response(first)
    cut = data.draw(st.integers(1, len(resp1) - 1), label="cut")
    split = data.draw(st.integers(1, len(resp1) - cut), label="split")
    out, events, starts = _run(cut, split)
    recoverable = [e for e, s in zip(events, starts, strict=True) if s >= cut]
    opened = [e for e in out if isinstance(e, StreamOpened)]
    closed = {e.stream: e for e in out if isinstance(e, StreamClosed)}
    by_stream: dict[int, list[ChunkEvent]] = {}
    for e in out:
        if isinstance(e, ChunkEvent):
            by_stream.setdefault(e.stream, []).append(e)
    # the second exchange: parsed normally, complete
    normal = [o for o in opened if o.method == "POST"]
    assert len(normal) == 1 and normal[0].request.model == "m2"
    assert closed[normal[0].stream].state is StreamState.COMPLETE
    assert [c.text for c in by_stream[normal[0].stream] if c.text] == _texts(_events("m2"))
    recovered = [o for o in opened if o.method == ""]
    if not _texts(recoverable):
        # nothing provable carried text: at most an empty midway row (e.g. [DONE] alone)
        assert all(not c.text for o in recovered for c in by_stream.get(o.stream, []))
        return
    assert len(recovered) == 1, (cut, opened)
    rec = recovered[0]
    assert rec.dialect == "openai.chat" and rec.request == RequestSummary(model="m1")
    assert rec.client == CLIENT and rec.server == SERVER
    assert rec.exchange < normal[0].exchange
    got = [c.text for c in by_stream[rec.stream] if c.text]
    # never invented, never more or less than the provable events
    assert got == _texts(recoverable), (cut, split)
    done = closed[rec.stream]
    assert done.state is StreamState.MIDWAY and done.gap
    assert done.t_first_content is None
    assert done.done_seen
    resp = [e for e in out if isinstance(e, StreamResponse) and e.stream == rec.stream]
    assert resp and resp[0].status is None


def test_cut_inside_a_utf8_sequence_drops_that_chunk_only() -> None:
    first = _events("m1")
    resp1, starts = _response(first)
    i = next(k for k, e in enumerate(first) if "世".encode() in e)
    cut = resp1.index("世".encode(), starts[i]) + 1
    out, _, _ = _run(cut, 7)
    texts = [c.text for c in out if isinstance(c, ChunkEvent) and c.stream == 1 and c.text]
    assert texts == PIECES[i + 1 :]


# ---------------------------------------------------------------------------
# Graceful restart: checkpoint in one pipeline, adopt in the next
# ---------------------------------------------------------------------------


def _conversation(model: str) -> tuple[list[Segment], list[int]]:
    """Handshake, request, the streamed response (one segment per chunk), FIN.
    Returns the segments and, per event, the index of the segment carrying it."""
    from sniffer.core.events import FIN, SYN

    req = _request(model)
    events = _events(model)
    c_isn, s_isn = 1000, 70000
    segs = [
        Segment(1.0, *CLIENT, *SERVER, c_isn, 0, SYN, b""),
        Segment(1.001, *SERVER, *CLIENT, s_isn, c_isn + 1, SYN | ACK, b""),
        Segment(1.002, *CLIENT, *SERVER, c_isn + 1, s_isn + 1, ACK, b""),
        Segment(1.003, *CLIENT, *SERVER, c_isn + 1, s_isn + 1, ACK | PSH, req),
    ]
    pieces = [HEAD] + [f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events] + [b"0\r\n\r\n"]
    seq, t, where = s_isn + 1, 1.01, []
    for i, p in enumerate(pieces):
        if 0 < i <= len(events):
            where.append(len(segs))
        segs.append(Segment(t, *SERVER, *CLIENT, seq, c_isn + 1 + len(req), ACK | PSH, p))
        seq += len(p)
        t += 0.01
    segs.append(Segment(t, *CLIENT, *SERVER, c_isn + 1 + len(req), seq, FIN | ACK, b""))
    segs.append(Segment(t + 0.001, *SERVER, *CLIENT, seq, c_isn + 2 + len(req), FIN | ACK, b""))
    return segs, where


def _restart(stop_at: int, resume_at: int) -> tuple[list[object], list[object], list[int]]:
    """Pipeline A sees segments [0, stop_at), checkpoints and flushes; pipeline B
    adopts and sees [resume_at, end): the segments in between were missed."""
    segs, where = _conversation("m1")
    a = Pipeline()
    out_a: list[object] = []
    for s in segs[:stop_at]:
        out_a.extend(a.feed(s))
    entries = json.loads(json.dumps(a.checkpoint()))  # through JSON, as on disk
    out_a.extend(a.flush(segs[stop_at - 1].ts))
    b = Pipeline()
    assert b.adopt(entries, segs[resume_at].ts) == len(entries)
    out_b: list[object] = []
    for s in segs[resume_at:]:
        out_b.extend(b.feed(s))
    out_b.extend(b.flush(segs[-1].ts + 1))
    return out_a, out_b, where


def test_graceful_restart_continues_the_same_row_with_one_exact_gap() -> None:
    segs, where = _conversation("m1")
    stop_at, resume_at = where[3], where[6]  # events 3, 4, 5 sent while no capture ran
    missed = sum(len(s.payload) for s in segs[stop_at:resume_at])
    out_a, out_b, _ = _restart(stop_at, resume_at)
    # the first instance wrote the row and three chunks, and no summary for it
    assert [type(e).__name__ for e in out_a if isinstance(e, StreamClosed)] == []
    opened = [e for e in out_a if isinstance(e, StreamOpened)]
    assert len(opened) == 1
    sid = opened[0].stream
    assert [c.text for c in out_a if isinstance(c, ChunkEvent) and c.text] == PIECES[:3]
    # the second one: no new row, the same stream goes on after the gap
    assert not [e for e in out_b if isinstance(e, StreamOpened)]
    chunks_b = [c for c in out_b if isinstance(c, ChunkEvent)]
    assert {c.stream for c in chunks_b} == {sid}
    assert [c.text for c in chunks_b if c.text] == PIECES[6:]
    seqs = [c.seq for c in out_a + out_b if isinstance(c, ChunkEvent)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    idx = [c.chunk_index for c in out_a + out_b if isinstance(c, ChunkEvent) and c.text]
    assert idx == list(range(1, len(idx) + 1))
    (closed,) = [e for e in out_b if isinstance(e, StreamClosed)]
    assert closed.stream == sid and closed.state is StreamState.GAP and closed.gap
    assert f"({missed} bytes in 1 gap, 0 more unframed)" in closed.reason
    first_a = next(c.ts for c in out_a if isinstance(c, ChunkEvent) and c.text)
    assert closed.t_first_content == first_a  # the TTFT measured before the restart stays
    assert closed.chunk_count == len(PIECES) - 3 and closed.done_seen


def test_graceful_restart_without_missed_bytes_is_complete() -> None:
    _, where = _conversation("m1")
    out_a, out_b, _ = _restart(where[4], where[4])
    texts = [c.text for c in out_a + out_b if isinstance(c, ChunkEvent) and c.text]
    assert texts == PIECES
    (closed,) = [e for e in out_b if isinstance(e, StreamClosed)]
    assert closed.state is StreamState.COMPLETE and not closed.gap


def test_a_midway_stream_is_handed_over_too() -> None:
    """A stream recovered mid-way and still under way at a graceful stop goes on
    in the next instance as the same midway row."""
    segs, where = _conversation("m1")
    late = segs[where[2] :]  # the capture began at event 2's segment
    a = Pipeline()
    out_a: list[object] = []
    for s in late[: where[5] - where[2]]:
        out_a.extend(a.feed(s))
    entries = json.loads(json.dumps(a.checkpoint()))
    assert len(entries) == 1 and entries[0]["midway"]
    out_a.extend(a.flush(late[0].ts))
    b = Pipeline()
    assert b.adopt(entries, segs[where[5]].ts) == 1
    out_b: list[object] = []
    for s in segs[where[5] :]:
        out_b.extend(b.feed(s))
    out_b.extend(b.flush(segs[-1].ts + 1))
    (opened,) = [e for e in out_a + out_b if isinstance(e, StreamOpened)]
    texts = [c.text for c in out_a + out_b if isinstance(c, ChunkEvent) and c.text]
    assert texts == PIECES[2:]
    (closed,) = [e for e in out_b if isinstance(e, StreamClosed)]
    assert closed.stream == opened.stream and closed.state is StreamState.MIDWAY
    assert closed.t_first_content is None


def test_a_connection_silent_through_a_short_instance_is_handed_over_again() -> None:
    """The second instance stops before the adopted connection sent anything: it
    hands it over again as it came, and the third goes on with the same row."""
    segs, where = _conversation("m1")
    a = Pipeline()
    out: list[object] = []
    for s in segs[: where[3]]:
        out.extend(a.feed(s))
    entries = json.loads(json.dumps(a.checkpoint(now=10.0)))
    b = Pipeline()
    assert b.adopt(entries, 10.0) == 1
    again = json.loads(json.dumps(b.checkpoint(now=10.5)))
    assert [(e["stream"], e["seq"]) for e in again] == [(e["stream"], e["seq"]) for e in entries]
    out.extend(b.flush(10.5))
    assert not [e for e in out if isinstance(e, StreamClosed)]
    c = Pipeline()
    assert c.adopt(again, segs[where[5]].ts) == 1
    for s in segs[where[5] :]:
        out.extend(c.feed(s))
    out.extend(c.flush(segs[-1].ts + 1))
    assert len([e for e in out if isinstance(e, StreamOpened)]) == 1
    (closed,) = [e for e in out if isinstance(e, StreamClosed)]
    assert closed.state is StreamState.GAP
    assert [x.text for x in out if isinstance(x, ChunkEvent) and x.text] == (
        PIECES[:3] + PIECES[5:]
    )
    # silent for longer than RESUME_SILENCE after its adoption: over
    d = Pipeline()
    assert d.adopt(entries, 10.0) == 1
    assert d.checkpoint(now=100.0) == []


def test_two_restarts_in_a_row_add_up_exactly() -> None:
    """The second stop comes before the first gap could be resynchronised: the
    bytes held then count as lost, and the row says two gaps."""
    segs, where = _conversation("m1")
    a = Pipeline()
    out: list[object] = []
    for s in segs[: where[3]]:
        out.extend(a.feed(s))
    entries = json.loads(json.dumps(a.checkpoint()))
    b = Pipeline()
    assert b.adopt(entries, segs[where[5]].ts) == 1
    out.extend(b.feed(segs[where[5]]))  # one chunk after the gap: not provable yet
    entries = json.loads(json.dumps(b.checkpoint()))
    assert entries and entries[0]["http"]["gaps"] == 1
    c = Pipeline()
    assert c.adopt(entries, segs[where[7]].ts) == 1
    for s in segs[where[7] :]:
        out.extend(c.feed(s))
    out.extend(c.flush(segs[-1].ts + 1))
    missed = sum(len(s.payload) for s in segs[where[3] : where[7]])
    assert [x.text for x in out if isinstance(x, ChunkEvent) and x.text] == (
        PIECES[:3] + PIECES[7:]
    )
    (closed,) = [e for e in out if isinstance(e, StreamClosed)]
    assert f"({missed} bytes in 2 gaps, 0 more unframed)" in closed.reason


# ---------------------------------------------------------------------------
# The model of a midway row: from the recovered chunks, written at close
# ---------------------------------------------------------------------------


def _opened(stream: int, model: str | None) -> StreamOpened:
    return StreamOpened(
        stream=stream,
        conn=1,
        exchange=stream,
        ts=1.0,
        client=CLIENT,
        server=SERVER,
        method="" if model is None else "POST",
        path="" if model is None else "/v1/responses",
        request_headers=(),
        request_body=None,
        request=RequestSummary() if model is None else RequestSummary(model=model),
        dialect="openai.responses",
        label=None,
        capture="packet",
    )


def _closed(stream: int, state: StreamState, model: str | None) -> StreamClosed:
    return StreamClosed(
        stream, 2.0, state, "x", True, state == StreamState.MIDWAY, None, 2.0, 1, 1, 1, (), None,
        None, response_model=model,
    )  # fmt: skip


def test_midway_row_model_comes_from_the_chunks_at_close(tmp_path: object) -> None:
    """A midway row is inserted before any chunk names the model (Responses name
    it in ``response.completed``): the close fills it, whether the row is still
    in the writer's batch or already in the database. A row with a request
    keeps the model the request asked for."""
    from pathlib import Path

    from sqlalchemy import select

    from sniffer.store.models import streams
    from sniffer.store.writer import StoreWriter

    w = StoreWriter(str(Path(str(tmp_path)) / "m.db"))
    w.write(_opened(101, None))  # closed in the same batch
    w.write(_opened(102, None))  # closed after a flush: the UPDATE path
    w.write(_opened(103, "asked-model"))  # a full exchange: request model kept
    w.write(_opened(104, None))  # midway, no chunk named a model: stays null
    w.write(_closed(101, StreamState.MIDWAY, "gpt-4.1-mini"))
    w.flush()
    w.write(_closed(102, StreamState.MIDWAY, "gpt-4.1-mini"))
    w.write(_closed(103, StreamState.COMPLETE, "served-model"))
    w.write(_closed(104, StreamState.MIDWAY, None))
    w.close()
    with w.engine.connect() as c:
        got = dict(c.execute(select(streams.c.id, streams.c.model)).all())
    assert got == {101: "gpt-4.1-mini", 102: "gpt-4.1-mini", 103: "asked-model", 104: None}
