"""streams: HTTP exchanges → LLM streams (dialect extraction, TTFT, verdicts, credentials)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from sniffer.core.credentials import is_credential_header, scrub_headers
from sniffer.core.events import (
    FLAG_TEXT,
    LOSSY_FLAGS,
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    EndReason,
    FlowEnd,
    FlowGap,
    Headers,
    HttpAnomaly,
    HttpBody,
    HttpEnd,
    HttpRequest,
    HttpResponse,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamFlagged,
    StreamOpened,
    StreamResponse,
    StreamState,
    stream_flags,
)
from sniffer.core.http1 import HttpOutput
from sniffer.core.streams import (
    MAX_ANOMALY_ROWS,
    StreamAssembler,
)
from sniffer.llm.values import RequestSummary, Usage
from tests.cores import both_cores

#: every test against both cores: under ``native`` the stage runs the native
#: item decoders and SSE loop (``sniffer._native.body_chunks``)
core = both_cores(globals(), StreamAssembler=lambda: partial(StreamAssembler, native=True))

CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 8001)
SSE: Headers = (("content-type", "text/event-stream; charset=utf-8"),)


def chat_request(ts: float = 1.0, **body: object) -> list[HttpOutput]:
    payload = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    payload.update(body)
    raw = json.dumps(payload).encode()
    headers: Headers = (
        ("host", "x"),
        ("authorization", "Bearer sk-secret"),
        ("x-api-key", "k"),
        ("x-session-token", "t"),
        ("content-type", "application/json"),
    )
    return [
        HttpRequest(1, 0, ts, "POST", "/v1/chat/completions?x=1", "1.1", headers),
        HttpBody(1, 0, ts, True, raw),
        HttpEnd(1, 0, ts, True, EndReason.COMPLETE),
    ]


def sse(ts: float, *objs: object) -> HttpBody:
    text = "".join("data: " + (o if isinstance(o, str) else json.dumps(o)) + "\n\n" for o in objs)
    return HttpBody(1, 0, ts, False, text.encode())


def delta(
    content: str | None = None, role: str | None = None, index: int = 0, **kw: object
) -> dict:
    d: dict[str, object] = {}
    if role is not None:
        d["role"] = role
    if content is not None:
        d["content"] = content
    choice: dict[str, object] = {"index": index, "delta": d, "finish_reason": None}
    choice.update(kw)
    return {"choices": [choice]}


def run(events: Sequence[HttpOutput], **kw: object) -> list[StoreEvent]:
    a = StreamAssembler(**kw)  # type: ignore[arg-type]
    out: list[StoreEvent] = []
    for ev in [ConnectionOpened(1, 0.5, CLIENT, SERVER, True), *events]:
        out.extend(a.feed(ev))
    return out


def closed(out: Sequence[StoreEvent]) -> StreamClosed:
    (c,) = [e for e in out if isinstance(e, StreamClosed)]
    return c


def head(ts: float = 2.0, status: int = 200, headers: Headers = SSE) -> HttpResponse:
    return HttpResponse(1, 0, ts, status, "OK", "1.1", headers)


def end(ts: float, reason: EndReason = EndReason.COMPLETE) -> HttpEnd:
    return HttpEnd(1, 0, ts, False, reason)


def test_ttft_is_the_first_content_not_the_role_prelude_nor_usage() -> None:
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("", role="assistant")),
            sse(4.0, {"choices": [], "usage": {"prompt_tokens": 3}}),
            sse(5.0, delta("Hel")),
            sse(6.0, delta("lo")),
            sse(7.0, delta(finish_reason="stop")),
            sse(7.5, "[DONE]"),
            end(8.0),
        ]
    )
    c = closed(out)
    assert c.t_first_content == 5.0
    assert c.t_last_chunk == 7.5
    assert c.state is StreamState.COMPLETE and c.done_seen and not c.gap
    chunks = [e for e in out if isinstance(e, ChunkEvent)]
    assert [(e.kind, e.chunk_index, e.text) for e in chunks] == [
        ("role", 0, ""),
        ("usage", 0, ""),
        ("content", 1, "Hel"),
        ("content", 2, "lo"),
        ("finish", 0, ""),
        ("done", 0, ""),
    ]
    assert [e.seq for e in chunks] == list(range(6))
    assert c.chunk_count == 2 and c.text_len == 5 and c.event_count == 6


def test_reasoning_counts_for_ttft() -> None:
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}),
            sse(4.0, delta("x", finish_reason="stop")),
            end(5.0),
        ]
    )
    assert closed(out).t_first_content == 3.0


def test_n2_needs_every_choice_to_finish() -> None:
    events = [
        *chat_request(n=2),
        head(),
        sse(3.0, delta("a", index=0), delta("b", index=1)),
        sse(4.0, delta(index=0, finish_reason="stop")),
    ]
    c = closed(run([*events, end(5.0)]))
    assert c.state is StreamState.TRUNCATED
    assert "1 of 2" in c.reason
    c = closed(run([*events, sse(4.5, delta(index=1, finish_reason="length")), end(5.0)]))
    assert c.state is StreamState.COMPLETE
    assert c.finish_reasons == ((0, "stop"), (1, "length"))


def test_usage_in_the_finish_chunk_and_no_done_is_complete() -> None:
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("x")),
            sse(
                4.0,
                {
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
                },
            ),
            end(5.0),
        ]
    )
    c = closed(out)
    assert c.state is StreamState.COMPLETE and not c.done_seen
    assert c.usage is not None and c.usage.completion_tokens == 1


def test_a_gap_is_never_complete() -> None:
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("x")),
            end(4.0, EndReason.GAP),
        ]
    )
    c = closed(out)
    assert c.state is StreamState.GAP and c.gap


def test_kernel_drop_marks_open_streams_as_gapped() -> None:
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("x")),
            FlowGap(1, 3.5, False, None, "kernel-drop"),
            sse(4.0, delta(finish_reason="stop"), "[DONE]"),
            end(5.0),
        ]
    )
    c = closed(out)
    assert c.state is StreamState.GAP and "kernel" in c.reason


def test_client_abort_is_truncated_with_the_reason() -> None:
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("x")),
            FlowEnd(1, 3.5, True, "fin"),
            end(4.0, EndReason.EOF),
            ConnectionClosed(1, 4.0, "fin"),
        ]
    )
    c = closed(out)
    assert c.state is StreamState.TRUNCATED and c.reason.startswith("client closed")


def test_error_status_error_object_and_broken_json() -> None:
    c = closed(
        run(
            [
                *chat_request(),
                head(status=429, headers=(("content-type", "application/json"),)),
                HttpBody(1, 0, 2.5, False, b'{"error": {"message": "slow down"}}'),
                end(3.0),
            ]
        )
    )
    assert c.state is StreamState.ERROR and c.error == "slow down"

    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("x")),
            sse(3.5, "{not json"),
            sse(4.0, {"error": {"message": "boom"}}),
            end(5.0),
        ]
    )
    c = closed(out)
    assert c.state is StreamState.ERROR and c.error == "boom"
    errors = [e for e in out if isinstance(e, PipelineError)]
    assert [(e.stage, e.kind) for e in errors] == [("dialect", "invalid")]


def test_non_streaming_body_is_one_chunk() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "whole"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
    }
    out = run(
        [
            *chat_request(stream=False),
            head(headers=(("content-type", "application/json"),)),
            HttpBody(1, 0, 3.0, False, json.dumps(body).encode()),
            end(3.0),
        ]
    )
    chunks = [e for e in out if isinstance(e, ChunkEvent)]
    assert [(e.kind, e.chunk_index, e.text) for e in chunks] == [
        ("content", 1, "whole"),
        ("usage", 0, ""),
    ]
    c = closed(out)
    assert c.state is StreamState.COMPLETE and c.response_body == json.dumps(body)
    resp = next(e for e in out if isinstance(e, StreamResponse))
    assert not resp.streaming


def test_request_fields_label_and_no_credentials() -> None:
    out = run([*chat_request(temperature=0, seed=7), head(), end(3.0)], labels={8001: "sparse"})
    opened = next(e for e in out if isinstance(e, StreamOpened))
    assert opened.path == "/v1/chat/completions"
    assert opened.dialect == "openai.chat"
    assert opened.label == "sparse"
    assert opened.request.temperature == 0 and opened.request.seed == 7
    assert opened.request.prompt_len == 1
    names = {n for n, _ in opened.request_headers}
    assert names == {"host", "content-type"}


def test_credential_names() -> None:
    for name in (
        "Authorization",
        "Cookie",
        "Set-Cookie",
        "api-key",
        "X-API-Key",
        "x-auth-token",
        "my-secret",
    ):
        assert is_credential_header(name), name
    for name in ("content-type", "host", "accept", "user-agent"):
        assert not is_credential_header(name), name
    assert scrub_headers((("Authorization", "x"), ("accept", "*/*"))) == (("accept", "*/*"),)


def test_exchange_without_response_is_closed_at_connection_end() -> None:
    out = run([*chat_request(), ConnectionClosed(1, 9.0, "eof")])
    c = closed(out)
    assert c.state is StreamState.TRUNCATED and "no response" in c.reason


def test_client_closing_right_after_done_is_still_complete() -> None:
    # The openai SDK closes as soon as it reads [DONE], before the chunked terminator.
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("x"), delta(finish_reason="stop"), "[DONE]"),
            FlowEnd(1, 3.1, True, "rst"),
            end(3.2, EndReason.RST),
        ]
    )
    c = closed(out)
    assert c.state is StreamState.COMPLETE and "closed before the body ended" in c.reason
    # Without [DONE] the same cut is a truncation.
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("x"), delta(finish_reason="stop")),
            FlowEnd(1, 3.1, True, "rst"),
            end(3.2, EndReason.RST),
        ]
    )
    assert closed(out).state is StreamState.TRUNCATED


def test_an_exchange_no_dialect_claims_opens_with_dialect_none() -> None:
    out = run(
        [
            HttpRequest(1, 0, 1.0, "GET", "/v1/models", "1.1", (("host", "x"),)),
            HttpEnd(1, 0, 1.0, True, EndReason.COMPLETE),
            head(headers=(("content-type", "application/json"),)),
            end(3.0),
        ]
    )
    opened = next(e for e in out if isinstance(e, StreamOpened))
    assert opened.dialect is None
    assert opened.request == RequestSummary()


def test_usage_is_parsed_once_and_travels_typed_to_the_close() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    out = run(
        [
            *chat_request(),
            head(),
            sse(3.0, delta("hi")),
            sse(4.0, {"choices": [], "usage": usage}),
            end(5.0),
        ]
    )
    (chunk,) = [e for e in out if isinstance(e, ChunkEvent) and e.usage is not None]
    assert isinstance(chunk.usage, Usage) and chunk.usage.raw == usage
    assert closed(out).usage is chunk.usage
    assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens) == (3, 2)


# ------------------------------------------------------------------ flags


def _chat(*chunk_times: float, end_ts: float = 9.0) -> list[HttpOutput]:
    """A complete chat stream whose content chunks come at ``chunk_times``."""
    return [
        *chat_request(),
        head(),
        *(sse(t, delta(f"w{i}")) for i, t in enumerate(chunk_times)),
        sse(chunk_times[-1], delta(finish_reason="stop"), "[DONE]"),
        end(end_ts),
    ]


def test_a_clock_going_backwards_flags_the_stream_and_keeps_it() -> None:
    """A capture timestamp earlier than the one before (a stepped clock, a merged
    capture) keeps every chunk as captured, and the stream says so in its flags
    (a warning: nothing was lost)."""
    steady = closed(run(_chat(3.0, 4.0, 5.0)))
    assert steady.flags == () and steady.state is StreamState.COMPLETE
    back = run(_chat(3.0, 2.5, 5.0))
    c = closed(back)
    assert c.flags == (StreamFlag.CLOCK_BACKWARDS,)
    assert c.state is StreamState.COMPLETE and c.text_len == len("w0w1w2")
    assert [e.ts for e in back if isinstance(e, ChunkEvent) and e.text] == [3.0, 2.5, 5.0]
    # a close before the request (a negative duration) is caught too, and one
    # before the last chunk
    c = closed(run(_chat(3.0, 4.0, end_ts=0.9)))
    assert StreamFlag.CLOCK_BACKWARDS in c.flags
    assert closed(run(_chat(3.0, 4.0, end_ts=3.5))).flags == (StreamFlag.CLOCK_BACKWARDS,)
    assert StreamFlag.CLOCK_BACKWARDS not in LOSSY_FLAGS


def test_flags_are_named_once_and_read_back_from_the_column() -> None:
    assert set(FLAG_TEXT) == set(StreamFlag)
    assert stream_flags(None) == [] and stream_flags("") == []
    assert stream_flags('["clock-backwards", "from-a-newer-writer"]') == [
        StreamFlag.CLOCK_BACKWARDS,
        "from-a-newer-writer",
    ]
    assert stream_flags("not json") == ["not json"]


# ------------------------------------------------------------------ caps (#24)


def _errors(out: Sequence[StoreEvent]) -> list[tuple[str, str]]:
    return [(e.stage, e.kind) for e in out if isinstance(e, PipelineError)]


def _chunks(out: Sequence[StoreEvent]) -> list[ChunkEvent]:
    return [e for e in out if isinstance(e, ChunkEvent)]


def test_an_sse_line_over_the_cap_is_dropped_and_fails_the_stream() -> None:
    """The event whose line is over the decoders' line cap is dropped; the stream
    (complete on the wire) carries the lossy flag and an sse error row."""
    long = delta("x" * 200)
    events = [
        *chat_request(),
        head(),
        sse(3.0, delta("a"), long, delta("b"), long),
        sse(4.0, delta(finish_reason="stop"), "[DONE]"),
        end(5.0),
    ]
    out = run(events, max_line=100)
    c = closed(out)
    assert c.state is StreamState.COMPLETE and c.text_len == 2
    assert c.flags == (StreamFlag.ITEM_OVER_CAP,) and StreamFlag.ITEM_OVER_CAP in LOSSY_FLAGS
    (err,) = [e for e in out if isinstance(e, PipelineError)]
    assert (err.stage, err.kind) == ("sse", "line") and err.message.startswith("2 errors")
    assert closed(run(events)).flags == ()  # under the default cap: nothing dropped


def _ollama(lines: Sequence[str], ts: float = 3.0) -> list[HttpOutput]:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    return [
        HttpRequest(1, 0, 1.0, "POST", "/api/chat", "1.1", (("host", "x"),)),
        HttpBody(1, 0, 1.0, True, raw),
        HttpEnd(1, 0, 1.0, True, EndReason.COMPLETE),
        head(headers=(("content-type", "application/x-ndjson"),)),
        HttpBody(1, 0, ts, False, "".join(f"{x}\n" for x in lines).encode()),
        end(ts + 1),
    ]


def _ollama_line(content: str, done: bool = False) -> str:
    obj: dict[str, object] = {"model": "m", "message": {"role": "assistant", "content": content}}
    obj["done"] = done
    if done:
        obj["done_reason"] = "stop"
    return json.dumps(obj)


def test_an_ndjson_line_over_the_cap_is_dropped_with_an_error_row_and_a_flag() -> None:
    """Before #24 the NDJSON decoder's errors were never read: the line vanished."""
    lines = [_ollama_line("a"), _ollama_line("y" * 300), _ollama_line("b"), _ollama_line("", True)]
    out = run(_ollama(lines), max_line=120)
    c = closed(out)
    assert c.state is StreamState.COMPLETE and c.text_len == 2
    assert c.flags == (StreamFlag.ITEM_OVER_CAP,)
    assert _errors(out) == [("ndjson", "line")]
    assert closed(run(_ollama(lines))).flags == ()


def test_events_without_output_past_the_cap_are_counted_not_stored() -> None:
    """A flood of empty events, keep-alives and role preludes costs at most the
    cap in rows; the count is in the events-capped error row; events carrying
    output (content, logprobs on an empty delta, usage, finish) are never capped."""
    cap = 5
    lp = {"content": [{"token": "\ufffd", "logprob": -0.1}]}
    events = [
        *chat_request(),
        head(),
        sse(3.0, delta("", role="assistant"), *([""] * 8), "not json", delta("Hi")),
        sse(3.5, *({"choices": [{"index": 0, "delta": {"content": ""}, "logprobs": lp}]},) * 3),
        sse(3.6, *([""] * 4), {"choices": [], "usage": {"prompt_tokens": 1}}),
        sse(4.0, delta(finish_reason="stop"), "[DONE]"),
        end(5.0),
    ]
    out = run(events, max_quiet_events=cap)
    c = closed(out)
    kinds = [e.kind for e in _chunks(out)]
    assert kinds.count("role") + kinds.count("other") + kinds.count("invalid") == cap + 3
    # the 3 "other" deltas with logprobs are output: stored past the cap
    assert sum(1 for e in _chunks(out) if e.logprobs) == 3
    assert kinds[-3:] == ["usage", "finish", "done"] and "content" in kinds
    assert c.state is StreamState.COMPLETE and c.text_len == 2 and c.done_seen
    assert c.flags == (StreamFlag.EVENTS_CAPPED,)
    assert c.event_count == len(kinds)
    (err,) = [e for e in out if isinstance(e, PipelineError) and e.kind == "events-capped"]
    assert err.message.startswith(f"9 of {cap + 9} events")  # 1 role, 12 empty, 1 not json
    # the unparseable item came past the cap: counted, neither chunk nor error row
    assert "invalid" not in kinds and ("dialect", "invalid") not in _errors(out)
    assert closed(run(events)).flags == ()  # default cap: all stored


def test_items_after_done_are_stored_apart_not_in_the_answer() -> None:
    """Clients stop at [DONE]: what follows is stored as after_done chunks (raw,
    stream-level, no index), changes neither text, counts, finish nor usage,
    and flags the stream."""
    ghost = delta(" ghost", finish_reason="length")
    events = [
        *chat_request(),
        head(),
        sse(3.0, delta("Hi")),
        sse(4.0, delta(finish_reason="stop"), "[DONE]", ghost),
        sse(4.5, {"choices": [], "usage": {"prompt_tokens": 9}}, "[DONE]"),
        end(5.0),
    ]
    out = run(events)
    c = closed(out)
    assert (c.text_len, c.chunk_count, c.finish_reasons, c.usage) == (2, 1, ((0, "stop"),), None)
    assert c.flags == (StreamFlag.AFTER_DONE,) and c.state is StreamState.COMPLETE
    assert c.t_last_chunk == 4.0
    apart = [e for e in _chunks(out) if e.kind == "after_done"]
    assert [e.raw for e in apart] == [
        json.dumps(ghost),
        json.dumps({"choices": [], "usage": {"prompt_tokens": 9}}),
        "[DONE]",
    ]
    assert all(e.choice == -1 and e.chunk_index == 0 and e.text == "" for e in apart)
    assert [e.seq for e in _chunks(out)] == list(range(len(_chunks(out))))
    # past the events cap they are counted too
    capped = closed(run(events, max_quiet_events=1))
    assert capped.flags == (StreamFlag.AFTER_DONE, StreamFlag.EVENTS_CAPPED)


def test_a_request_over_the_cap_is_read_from_its_start_and_flagged() -> None:
    """A long prompt: the parameters before it are read from the part kept
    (``values.scan_request``), ``n`` among them drives the verdict; the stream is
    flagged request-cut with an error row naming what was read."""
    body = {
        "model": "m",
        "stream": True,
        "n": 2,
        "temperature": 0.5,
        "max_completion_tokens": 9,
        "messages": [{"role": "user", "content": "p" * 500}],
        "seed": 3,  # after the cut: unknown
    }
    raw = json.dumps(body).encode()  # in this order: the prompt, then seed
    events = [
        HttpRequest(1, 0, 1.0, "POST", "/v1/chat/completions", "1.1", (("host", "x"),)),
        HttpBody(1, 0, 1.0, True, raw[:100]),
        HttpBody(1, 0, 1.0, True, raw[100:]),
        HttpEnd(1, 0, 1.0, True, EndReason.COMPLETE),
        head(),
        sse(3.0, delta("a"), delta("b", index=1)),
        sse(4.0, delta(finish_reason="stop")),
        end(5.0),
    ]
    out = run(events, max_request_body=300)
    (opened,) = [e for e in out if isinstance(e, StreamOpened)]
    assert opened.request == RequestSummary(
        model="m", stream=True, n=2, temperature=0.5, max_tokens=9
    )
    assert opened.dialect == "openai.chat" and opened.request_body is not None
    assert len(opened.request_body) == 300
    c = closed(out)
    assert c.flags == (StreamFlag.REQUEST_CUT,)
    # n = 2 read from the cut body: one finished choice of two is not complete
    assert c.state is StreamState.TRUNCATED
    (err,) = [e for e in out if isinstance(e, PipelineError)]
    assert err.kind == "request-cut" and "model, stream, temperature" in err.message
    whole = run(events)
    assert closed(whole).flags == () and not _errors(whole)


# ------------------------------------------------------------ TCP anomalies


def overlap(ts: float, from_client: bool, exchange: int | None = 0) -> HttpAnomaly:
    return HttpAnomaly(
        1, exchange, ts, from_client, "overlap-mismatch", "bytes 30..34 differ", 30, 4
    )


def errors_of(out: Sequence[StoreEvent], stage: str = "reassembly") -> list[PipelineError]:
    return [e for e in out if isinstance(e, PipelineError) and e.stage == stage]


def test_overlap_mismatch_flags_its_exchange_and_records_which_copy_was_kept() -> None:
    """Bytes that arrived twice with different content, in the request or the
    response: the stream is flagged (lossy: the stored copy may not be what the
    endpoint read) and one errors row says where and which copy was kept."""
    assert StreamFlag.OVERLAP_MISMATCH in LOSSY_FLAGS
    for from_client in (True, False):
        a = StreamAssembler()
        out = a.feed(ConnectionOpened(1, 0.5, CLIENT, SERVER, True))
        for ev in [*_chat(3.0, 4.0)[:4], overlap(3.5, from_client), *_chat(3.0, 4.0)[4:]]:
            out += a.feed(ev)
        c = closed(out)
        assert c.flags == (StreamFlag.OVERLAP_MISMATCH,)
        assert c.state is StreamState.COMPLETE and c.text_len == len("w0w1")  # the first copy
        (err,) = errors_of(out)
        side = "client" if from_client else "server"
        assert (err.kind, err.conn, err.stream, err.ts) == ("overlap-mismatch", 1, c.stream, 3.5)
        assert err.message.startswith(f"{side} bytes 30..34 (4 bytes")
        assert "the first copy was kept" in err.message
        assert a.stats.anomalies == {"overlap-mismatch": 1} and a.stats.errors["reassembly"] == 1


def test_other_tcp_anomalies_are_recorded_and_counted_but_do_not_flag() -> None:
    """A segment beyond the window or after the FIN is dropped as the receiver
    drops it; a buffer cap declares a gap the stream shows anyway: none makes
    the stored bytes doubtful."""
    events = _chat(3.0, 4.0)
    kinds = ("out-of-window", "after-fin", "buffer-cap")
    anomalies = [HttpAnomaly(1, 0, 3.5, False, k, "x") for k in kinds]
    a = StreamAssembler()
    out: list[StoreEvent] = []
    for ev in [ConnectionOpened(1, 0.5, CLIENT, SERVER, True), *events[:4], *anomalies]:
        out += a.feed(ev)
    for ev in events[4:]:
        out += a.feed(ev)
    assert closed(out).flags == ()
    assert [e.kind for e in errors_of(out)] == list(kinds)
    assert a.stats.anomalies == dict.fromkeys(kinds, 1)


def test_anomaly_rows_are_capped_per_connection_and_kind() -> None:
    """A flood of anomalies (a hostile sender) costs a bounded number of rows:
    past the cap they are counted and summed up in one row at the close."""
    n = MAX_ANOMALY_ROWS + 5
    events = _chat(3.0, 4.0)
    out = run([*events[:4], *(overlap(3.5, False) for _ in range(n)), *events[4:], _close(9.5)])
    rows = errors_of(out)
    assert len(rows) == MAX_ANOMALY_ROWS + 1
    assert rows[-1].message.startswith("5 more on this connection")
    assert rows[-1].stream is None and rows[-1].conn == 1


def test_anomaly_before_the_request_head_waits_for_its_exchange() -> None:
    """An overlap inside a request head not yet complete names an exchange the
    streams stage does not know yet: it is applied when the request comes (and
    recorded without a stream if it never does)."""
    out = run([overlap(0.9, True), *_chat(3.0, 4.0)])
    c = closed(out)
    assert c.flags == (StreamFlag.OVERLAP_MISMATCH,)
    assert [e.stream for e in errors_of(out)] == [c.stream]
    orphan = run([overlap(0.9, True, exchange=5), _close(2.0)])
    (err,) = errors_of(orphan)
    assert err.stream is None and err.kind == "overlap-mismatch"


def test_anomaly_after_its_stream_closed_flags_the_closed_row() -> None:
    """The response's last segment again, different, after the stream closed
    (the evasion that alters the final bytes): the row is flagged then, its
    flags so far kept."""
    out = run([*_chat(3.0, 2.5), overlap(9.5, False), overlap(9.6, False)])
    c = closed(out)
    assert c.flags == (StreamFlag.CLOCK_BACKWARDS,)
    (late,) = [e for e in out if isinstance(e, StreamFlagged)]
    assert late == StreamFlagged(
        c.stream, 9.5, (StreamFlag.CLOCK_BACKWARDS, StreamFlag.OVERLAP_MISMATCH)
    )
    assert out.index(late) > out.index(c)
    errs = errors_of(out)
    assert [e.stream for e in errs] == [c.stream] * 2
    assert errs[0].message.endswith("(after its stream closed)")


def test_anomaly_without_an_exchange_flags_every_open_exchange_of_its_connection() -> None:
    """HTTP/2: the frames of several exchanges interleave on one direction."""
    events = _chat(3.0, 4.0)
    out = run([*events[:4], overlap(3.5, False, exchange=None), *events[4:]])
    assert closed(out).flags == (StreamFlag.OVERLAP_MISMATCH,)
    (err,) = errors_of(out)
    assert err.stream is None


def _close(ts: float) -> ConnectionClosed:
    return ConnectionClosed(1, ts, "fin")


def _on(conn: int, ev: HttpOutput, exchange: int = 0) -> HttpOutput:
    """``ev`` on connection ``conn``, exchange ``exchange``."""
    if isinstance(ev, HttpBody):
        return ev._replace(conn=conn, exchange=exchange)
    return replace(ev, conn=conn, exchange=exchange)


def test_a_connections_close_and_gap_touch_only_its_own_exchanges() -> None:
    """Four connections streaming at once, two exchanges pipelined on one: a
    gap on one connection marks only its open stream, a connection's close ends
    only its own streams (both of them, in their order), and the others go on
    to close complete, whatever the order the connections opened in."""
    a = StreamAssembler()
    out: list[StoreEvent] = []
    conns = (7, 3, 9, 5)
    for c in conns:
        out += a.feed(ConnectionOpened(c, 0.5, CLIENT, (SERVER[0], SERVER[1] + c), True))
    opening = [*chat_request(), head(), sse(3.0, delta("x"))]
    for c in conns:
        for ev in opening:
            out += a.feed(_on(c, ev))
    for ev in opening:  # a second exchange pipelined on connection 3, streaming too
        out += a.feed(_on(3, ev, exchange=1))
    out += a.feed(FlowGap(9, 3.5, False, None, "kernel-drop"))
    mark = len(out)
    out += a.feed(ConnectionClosed(3, 4.0, "rst"))
    closed_by_3 = [e for e in out[mark:] if isinstance(e, StreamClosed)]
    for c in (7, 9, 5):
        for ev in [sse(4.0, delta(finish_reason="stop"), "[DONE]"), end(5.0)]:
            out += a.feed(_on(c, ev))
    conn_of = {e.stream: e.conn for e in out if isinstance(e, StreamOpened)}
    assert [(conn_of[e.stream], e.state) for e in closed_by_3] == [
        (3, StreamState.TRUNCATED),
        (3, StreamState.TRUNCATED),
    ]
    assert closed_by_3[0].stream < closed_by_3[1].stream  # exchange 0, then 1
    later = [e for e in out[mark:] if isinstance(e, StreamClosed) and e not in closed_by_3]
    assert [(conn_of[e.stream], e.state) for e in later] == [
        (7, StreamState.COMPLETE),
        (9, StreamState.GAP),
        (5, StreamState.COMPLETE),
    ]
    assert a.open_streams == 0
