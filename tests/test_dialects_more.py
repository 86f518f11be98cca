"""Responses, Anthropic Messages, TGI and Ollama extraction (plus llama.cpp / vLLM
extras of the OpenAI dialect), with event sequences shaped like the documented
wire formats, bad input, and whole exchanges through the streams stage."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import (
    ChunkEvent,
    ConnectionOpened,
    EndReason,
    HttpBody,
    HttpEnd,
    HttpRequest,
    HttpResponse,
    StreamClosed,
    StreamState,
)
from sniffer.core.sse import NdjsonDecoder, SseDecoder
from sniffer.core.streams import StreamAssembler
from sniffer.llm.dialects import dialect_by_name, select_dialect
from sniffer.llm.dialects.anthropic import AnthropicMessages
from sniffer.llm.dialects.base import (
    CONTENT,
    DONE,
    ERROR,
    FINISH,
    INVALID,
    OTHER,
    REASONING,
    ROLE,
    STREAM_LEVEL,
    TOOL_CALL,
    USAGE,
    Delta,
)
from sniffer.llm.dialects.ollama import OllamaChat, OllamaGenerate
from sniffer.llm.dialects.openai import OpenAIChat
from sniffer.llm.dialects.responses import OpenAIResponses
from sniffer.llm.dialects.tgi import TgiGenerate
from sniffer.llm.tokens import ServerToken, parse_server_tokens
from sniffer.llm.values import Usage
from sniffer.store.writer import usage_json

AnyDialect = OpenAIResponses | AnthropicMessages | TgiGenerate | OllamaGenerate | OllamaChat


def counts(usage: Usage | None) -> tuple[int | None, int | None]:
    """(prompt, completion) the store writes for a usage."""
    return (None, None) if usage is None else (usage.prompt_tokens, usage.completion_tokens)


def js(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def run(dialect: Any, events: list[tuple[str, str]]) -> list[Delta]:
    out: list[Delta] = []
    for event_type, data in events:
        out.extend(dialect.event(data, event_type))
    return out


def text_of(deltas: list[Delta], choice: int) -> str:
    return "".join(d.text for d in deltas if d.choice == choice)


def tool_args(deltas: list[Delta], choice: int) -> tuple[list[str], str]:
    """(names, concatenated arguments) of the tool-call pieces of one choice."""
    names: list[str] = []
    args = ""
    for d in deltas:
        if d.choice == choice and d.tool_calls is not None:
            for call in json.loads(d.tool_calls):
                fn = call["function"]
                if "name" in fn:
                    names.append(fn["name"])
                args += fn["arguments"]
    return names, args


def sse_bytes(events: list[tuple[str, str]], space: bool = True, named: bool = True) -> bytes:
    sep = ": " if space else ":"
    parts = []
    for event_type, data in events:
        head = f"event{sep}{event_type}\n" if named and event_type != "message" else ""
        parts.append(f"{head}data{sep}{data}\n\n")
    return "".join(parts).encode()


# ---------------------------------------------------------------------------
# Whole exchanges through the streams stage
# ---------------------------------------------------------------------------


def exchange(
    path: str,
    request: dict[str, Any],
    content_type: str,
    body_pieces: list[bytes],
    status: int = 200,
) -> tuple[list[ChunkEvent], StreamClosed]:
    """One request/response through StreamAssembler; the chunk events and the close."""
    asm = StreamAssembler()
    evs: list[Any] = [
        ConnectionOpened(1, 1.0, ("127.0.0.1", 40000), ("127.0.0.1", 8000), True),
        HttpRequest(1, 0, 1.0, "POST", path, "1.1", (("content-type", "application/json"),)),
        HttpBody(1, 0, 1.0, True, js(request).encode()),
        HttpEnd(1, 0, 1.0, True, EndReason.COMPLETE),
        HttpResponse(1, 0, 1.1, status, "OK", "1.1", (("content-type", content_type),)),
    ]
    evs += [HttpBody(1, 0, 1.2 + i / 100, False, p) for i, p in enumerate(body_pieces)]
    evs.append(HttpEnd(1, 0, 2.0, False, EndReason.COMPLETE))
    out: list[Any] = []
    for ev in evs:
        out.extend(asm.feed(ev))
    chunks = [e for e in out if isinstance(e, ChunkEvent)]
    closed = [e for e in out if isinstance(e, StreamClosed)]
    assert len(closed) == 1
    return chunks, closed[0]


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "request_body", "name"),
    [
        ("POST", "/v1/responses", {}, "openai.responses"),
        ("POST", "/responses/", {}, "openai.responses"),
        ("POST", "/v1/messages?beta=true", {}, "anthropic.messages"),
        ("POST", "/generate_stream", {"inputs": "x"}, "tgi.generate"),
        ("POST", "/generate", {"inputs": "x"}, "tgi.generate"),
        ("POST", "/", {"inputs": "x", "stream": True}, "tgi.generate"),
        ("POST", "/api/generate", {"model": "m"}, "ollama.generate"),
        ("post", "/api/chat", {"model": "m"}, "ollama.chat"),
        ("POST", "/v1/chat/completions", {}, "openai.chat"),
    ],
)
def test_registry_selects(method: str, path: str, request_body: Any, name: str) -> None:
    d = select_dialect(method, path, request_body)
    assert d is not None and d.name == name


@pytest.mark.parametrize(
    ("method", "path", "request_body"),
    [
        ("GET", "/api/chat", None),
        ("POST", "/", {"prompt": "x"}),
        ("POST", "/", None),
        ("GET", "/v1/responses", None),
        ("POST", "/api/tags", {}),
    ],
)
def test_registry_rejects(method: str, path: str, request_body: Any) -> None:
    assert select_dialect(method, path, request_body) is None


def test_registry_gives_fresh_instances() -> None:
    a = select_dialect("POST", "/v1/messages", {})
    b = select_dialect("POST", "/v1/messages", {})
    assert a is not b


# ---------------------------------------------------------------------------
# OpenAI Responses
# ---------------------------------------------------------------------------

RESP_USAGE = {
    "input_tokens": 12,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 8},
    "total_tokens": 32,
}


def response_obj(status: str, output: list[Any], usage: Any = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1741290958,
        "status": status,
        "model": "gpt-x",
        "output": output,
        "usage": usage,
        "error": None,
        "incomplete_details": None,
        **extra,
    }


def rev(seq: int, type_: str, **fields: Any) -> tuple[str, str]:
    """A Responses SSE event: (event name, data)."""
    return type_, js({"type": type_, "sequence_number": seq, **fields})


def responses_text_stream() -> list[tuple[str, str]]:
    reasoning_item = {"id": "rs_1", "type": "reasoning", "summary": []}
    msg_item = {
        "id": "msg_1",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    part = {"type": "output_text", "text": "", "annotations": []}
    final_msg = {
        **msg_item,
        "status": "completed",
        "content": [{**part, "text": "Hi there, friend."}],
    }
    final_rs = {**reasoning_item, "summary": [{"type": "summary_text", "text": "Greet them."}]}
    return [
        rev(0, "response.created", response=response_obj("in_progress", [])),
        rev(1, "response.in_progress", response=response_obj("in_progress", [])),
        rev(2, "response.output_item.added", output_index=0, item=reasoning_item),
        rev(
            3,
            "response.reasoning_summary_part.added",
            item_id="rs_1",
            output_index=0,
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        ),
        rev(
            4,
            "response.reasoning_summary_text.delta",
            item_id="rs_1",
            output_index=0,
            summary_index=0,
            delta="Greet ",
        ),
        rev(
            5,
            "response.reasoning_summary_text.delta",
            item_id="rs_1",
            output_index=0,
            summary_index=0,
            delta="them.",
        ),
        rev(6, "response.output_item.done", output_index=0, item=final_rs),
        rev(7, "response.output_item.added", output_index=1, item=msg_item),
        rev(
            8,
            "response.content_part.added",
            item_id="msg_1",
            output_index=1,
            content_index=0,
            part=part,
        ),
        *[
            rev(
                9 + i,
                "response.output_text.delta",
                item_id="msg_1",
                output_index=1,
                content_index=0,
                delta=piece,
                logprobs=[],
            )
            for i, piece in enumerate(["Hi", " there", ", friend", "."])
        ],
        rev(
            13,
            "response.output_text.done",
            item_id="msg_1",
            output_index=1,
            content_index=0,
            text="Hi there, friend.",
            logprobs=[],
        ),
        rev(14, "response.output_item.done", output_index=1, item=final_msg),
        rev(
            15,
            "response.completed",
            response=response_obj("completed", [final_rs, final_msg], RESP_USAGE),
        ),
    ]


def test_responses_text_stream() -> None:
    deltas = run(OpenAIResponses(), responses_text_stream())
    assert text_of(deltas, 1) == "Hi there, friend."
    assert text_of(deltas, 0) == ""
    assert "".join(d.reasoning for d in deltas if d.choice == 0) == "Greet them."
    content = [d for d in deltas if d.kind == CONTENT]
    assert [d.choice for d in content] == [1, 1, 1, 1]
    assert all(d.logprobs is None for d in content)  # [] is not kept
    assert [d.kind for d in deltas if d.kind == ROLE] == [ROLE]
    finishes = [d for d in deltas if d.kind == FINISH]
    assert [(d.choice, d.finish_reason) for d in finishes] == [(0, "completed"), (1, "completed")]
    assert finishes[0].usage is None
    assert finishes[1].usage is not None and finishes[1].usage.raw == RESP_USAGE
    assert deltas[-1] == Delta(STREAM_LEVEL, DONE)
    others = [d for d in deltas if d.kind == OTHER]
    assert others and all(d.raw for d in others)
    assert not [d for d in deltas if d.kind in (INVALID, ERROR)]


def test_responses_reasoning_text_and_logprobs() -> None:
    lp = [{"token": "Hi", "logprob": -0.1, "top_logprobs": []}]
    deltas = run(
        OpenAIResponses(),
        [
            rev(
                0,
                "response.reasoning_text.delta",
                item_id="rs",
                output_index=0,
                content_index=0,
                delta="think",
            ),
            rev(
                1,
                "response.output_text.delta",
                output_index=1,
                content_index=0,
                delta="Hi",
                logprobs=lp,
            ),
            rev(2, "response.output_text.delta", output_index=1, content_index=0, delta=""),
        ],
    )
    assert [(d.choice, d.kind) for d in deltas] == [(0, REASONING), (1, CONTENT), (1, OTHER)]
    assert deltas[0].reasoning == "think"
    assert deltas[1].logprobs is not None and json.loads(deltas[1].logprobs) == lp
    assert parse_server_tokens(deltas[1].logprobs) == [ServerToken("Hi")]


def test_responses_function_call_stream() -> None:
    item = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_abc",
        "name": "get_weather",
        "arguments": "",
        "status": "in_progress",
    }
    pieces = ['{"loc', 'ation":"Par', 'is"}']
    events = [
        rev(0, "response.created", response=response_obj("in_progress", [])),
        rev(1, "response.output_item.added", output_index=0, item=item),
        *[
            rev(
                2 + i,
                "response.function_call_arguments.delta",
                item_id="fc_1",
                output_index=0,
                delta=p,
            )
            for i, p in enumerate(pieces)
        ],
        rev(
            5,
            "response.function_call_arguments.done",
            item_id="fc_1",
            output_index=0,
            arguments="".join(pieces),
        ),
        rev(6, "response.completed", response=response_obj("completed", [item], RESP_USAGE)),
    ]
    deltas = run(OpenAIResponses(), events)
    names, args = tool_args(deltas, 0)
    assert names == ["get_weather"]
    assert args == '{"location":"Paris"}'
    first = json.loads(next(d.tool_calls for d in deltas if d.tool_calls))
    assert first == [
        {
            "index": 0,
            "id": "call_abc",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    assert [d.kind for d in deltas if d.choice == 0] == [*[TOOL_CALL] * 4, OTHER, FINISH]
    assert not any(d.text for d in deltas)


def test_responses_incomplete_and_failed() -> None:
    inc = response_obj(
        "incomplete",
        [],
        {"input_tokens": 3, "output_tokens": 5},
        incomplete_details={"reason": "max_output_tokens"},
    )
    deltas = run(
        OpenAIResponses(),
        [
            rev(0, "response.output_text.delta", output_index=0, content_index=0, delta="Hel"),
            rev(1, "response.incomplete", response=inc),
        ],
    )
    assert [(d.choice, d.kind, d.finish_reason) for d in deltas] == [
        (0, CONTENT, None),
        (0, FINISH, "incomplete: max_output_tokens"),
        (STREAM_LEVEL, DONE, None),
    ]
    failed = response_obj("failed", [], None, error={"code": "server_error", "message": "boom"})
    deltas = run(
        OpenAIResponses(),
        [
            rev(0, "response.output_text.delta", output_index=0, content_index=0, delta="Hel"),
            rev(1, "response.failed", response=failed),
        ],
    )
    assert [(d.kind, d.finish_reason) for d in deltas[1:]] == [(FINISH, "failed"), (ERROR, None)]
    assert deltas[2].error == "boom"
    assert not any(d.kind == DONE for d in deltas)


def test_responses_error_event_and_bad_input() -> None:
    d = OpenAIResponses()
    err = d.event(
        js({"type": "error", "code": "rate_limit", "message": "slow down", "param": None}), "error"
    )
    assert err[0].kind == ERROR and err[0].error == "slow down" and err[0].choice == STREAM_LEVEL
    assert d.event("not json", "error")[0].kind == ERROR
    broken = d.event(
        '{"type":"response.output_text.delta","delta":"x"', "response.output_text.delta"
    )
    assert broken[0].kind == INVALID and broken[0].raw and broken[0].error
    shape = d.event(js({"type": "response.output_text.delta", "delta": 5}), "x")
    assert shape[0].kind == INVALID and "delta" in (shape[0].error or "")
    neg = d.event(js({"type": "response.output_text.delta", "delta": "a", "output_index": -1}), "x")
    assert neg[0].kind == INVALID
    assert d.event("[1,2]", "message")[0].kind == INVALID
    unknown = d.event(js({"type": "response.web_search_call.searching", "output_index": 2}), "x")
    assert unknown == [
        Delta(2, OTHER, raw=js({"type": "response.web_search_call.searching", "output_index": 2}))
    ]
    assert d.event("", "message")[0].kind == OTHER
    # no "type" in the data: the SSE event name is used
    fallback = d.event(js({"output_index": 0, "delta": "ok"}), "response.output_text.delta")
    assert fallback[0].kind == CONTENT and fallback[0].text == "ok"
    # the terminal event without a response object is a shape error
    assert d.event(js({"type": "response.completed"}), "response.completed")[0].kind == INVALID


def test_responses_nonstream_body() -> None:
    output = [
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "plan"}]},
        {
            "type": "message",
            "id": "msg",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Hello ", "annotations": []},
                {"type": "refusal", "refusal": "nope"},
                {"type": "output_text", "text": "world", "annotations": []},
            ],
        },
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a":1}'},
        {"type": "web_search_call", "id": "ws", "status": "completed"},
    ]
    deltas = OpenAIResponses().body(js(response_obj("completed", output, RESP_USAGE)))
    assert [(d.choice, d.kind) for d in deltas] == [
        (0, REASONING),
        (1, CONTENT),
        (2, TOOL_CALL),
        (3, OTHER),
    ]
    assert deltas[0].reasoning == "plan"
    assert deltas[1].text == "Hello world"
    assert all(d.finish_reason == "completed" for d in deltas)
    assert tool_args(deltas, 2) == (["f"], '{"a":1}')
    assert deltas[-1].usage is not None and deltas[-1].usage.raw == RESP_USAGE
    assert all(d.usage is None for d in deltas[:-1])


def test_responses_nonstream_errors() -> None:
    d = OpenAIResponses()
    err = d.body(js({"error": {"message": "Invalid model", "type": "invalid_request_error"}}))
    assert [(x.kind, x.error) for x in err] == [(ERROR, "Invalid model")]
    failed = d.body(js(response_obj("failed", [], None, error={"code": "x", "message": "died"})))
    assert [x.kind for x in failed] == [FINISH, ERROR]
    assert failed[0].finish_reason == "failed"
    assert d.body("{")[0].kind == INVALID
    assert d.body(js({"output": "x"}))[0].kind == INVALID


def test_responses_exchange_is_complete() -> None:
    wire = sse_bytes(responses_text_stream())
    chunks, closed = exchange(
        "/v1/responses",
        {"model": "gpt-x", "input": "hi", "stream": True},
        "text/event-stream",
        [wire],
    )
    assert closed.state is StreamState.COMPLETE, closed.reason
    assert closed.done_seen
    assert closed.finish_reasons == ((0, "completed"), (1, "completed"))
    assert counts(closed.usage) == (12, 20)
    assert [c.chunk_index for c in chunks if c.text] == [1, 2, 3, 4]
    assert closed.text_len == len("Hi there, friend.")
    # TTFT is the reasoning delta (output), not the created/added events
    first_output = next(c for c in chunks if c.kind in (CONTENT, REASONING, TOOL_CALL))
    assert closed.t_first_content == first_output.ts


def test_responses_exchange_error_event_is_error() -> None:
    error = rev(99, "error", code="server_error", message="The server had an error")
    events = [*responses_text_stream()[:10], error]
    _, closed = exchange(
        "/v1/responses", {"model": "m", "stream": True}, "text/event-stream", [sse_bytes(events)]
    )
    assert closed.state is StreamState.ERROR
    assert closed.error == "The server had an error"


def test_responses_exchange_cut_is_truncated() -> None:
    events = responses_text_stream()[:11]  # no response.completed
    _, closed = exchange(
        "/v1/responses", {"model": "m", "stream": True}, "text/event-stream", [sse_bytes(events)]
    )
    assert closed.state is StreamState.TRUNCATED
    assert not closed.done_seen


# ---------------------------------------------------------------------------
# Anthropic Messages
# ---------------------------------------------------------------------------


def aev(type_: str, **fields: Any) -> tuple[str, str]:
    return type_, js({"type": type_, **fields})


START_USAGE = {
    "input_tokens": 25,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "output_tokens": 1,
}


def message_start() -> tuple[str, str]:
    return aev(
        "message_start",
        message={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-x",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": START_USAGE,
        },
    )


def anthropic_thinking_text_stream() -> list[tuple[str, str]]:
    return [
        message_start(),
        aev(
            "content_block_start",
            index=0,
            content_block={"type": "thinking", "thinking": "", "signature": ""},
        ),
        aev(
            "content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "Let me "}
        ),
        aev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "think."}),
        aev(
            "content_block_delta",
            index=0,
            delta={"type": "signature_delta", "signature": "EqQBCgIYAhIM"},
        ),
        aev("content_block_stop", index=0),
        aev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
        aev("ping"),
        *[
            aev("content_block_delta", index=1, delta={"type": "text_delta", "text": t})
            for t in ["Hello", "! 你好", " 👋🏽"]
        ],
        aev("content_block_stop", index=1),
        aev(
            "message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage={"output_tokens": 15},
        ),
        aev("message_stop"),
    ]


def test_anthropic_thinking_then_text() -> None:
    deltas = run(AnthropicMessages(), anthropic_thinking_text_stream())
    assert deltas[0].kind == ROLE and deltas[0].choice == STREAM_LEVEL
    assert deltas[0].usage is not None and deltas[0].usage.raw == START_USAGE
    assert "".join(d.reasoning for d in deltas if d.choice == 0) == "Let me think."
    assert text_of(deltas, 1) == "Hello! 你好 👋🏽"
    assert [d.kind for d in deltas if d.choice == 1] == [
        OTHER,
        CONTENT,
        CONTENT,
        CONTENT,
        OTHER,
        FINISH,
    ]
    finish = [d for d in deltas if d.kind == FINISH]
    # every block seen ends with the stop reason; the usage goes on the last one
    assert [(d.choice, d.finish_reason) for d in finish] == [(0, "end_turn"), (1, "end_turn")]
    assert finish[0].usage is None and finish[1].usage is not None
    merged = finish[1].usage.raw
    assert merged == {**START_USAGE, "output_tokens": 15}
    assert counts(finish[1].usage) == (25, 15)
    assert deltas[-1] == Delta(STREAM_LEVEL, DONE)
    signature = [d for d in deltas if d.raw and "signature_delta" in d.raw]
    assert len(signature) == 1 and signature[0].kind == OTHER
    assert not any(d.kind in (INVALID, ERROR) for d in deltas)


def test_anthropic_tool_use() -> None:
    events = [
        message_start(),
        aev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        aev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Checking."}),
        aev("content_block_stop", index=0),
        aev(
            "content_block_start",
            index=1,
            content_block={
                "type": "tool_use",
                "id": "toolu_01",
                "name": "get_weather",
                "input": {},
            },
        ),
        aev("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": ""}),
        aev(
            "content_block_delta",
            index=1,
            delta={"type": "input_json_delta", "partial_json": '{"city": "Par'},
        ),
        aev(
            "content_block_delta",
            index=1,
            delta={"type": "input_json_delta", "partial_json": 'is"}'},
        ),
        aev("content_block_stop", index=1),
        aev(
            "message_delta",
            delta={"stop_reason": "tool_use", "stop_sequence": None},
            usage={"output_tokens": 40},
        ),
        aev("message_stop"),
    ]
    deltas = run(AnthropicMessages(), events)
    assert tool_args(deltas, 1) == (["get_weather"], '{"city": "Paris"}')
    start = json.loads(next(d.tool_calls for d in deltas if d.tool_calls))
    assert start[0]["id"] == "toolu_01" and start[0]["type"] == "function"
    finish = [(d.choice, d.finish_reason, d.usage is not None) for d in deltas if d.kind == FINISH]
    assert finish == [(0, "tool_use", False), (1, "tool_use", True)]
    assert not any(d.text for d in deltas if d.choice == 1)


def test_anthropic_finish_without_blocks_goes_to_block_0() -> None:
    deltas = run(
        AnthropicMessages(),
        [
            message_start(),
            aev("message_delta", delta={"stop_reason": "max_tokens"}, usage={"output_tokens": 0}),
        ],
    )
    assert [(d.choice, d.kind, d.finish_reason) for d in deltas[1:]] == [(0, FINISH, "max_tokens")]
    # a message_delta without stop_reason only updates usage
    d = AnthropicMessages()
    out = d.event(
        js({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 3}}), "message_delta"
    )
    assert out[0].kind == USAGE and usage_json(out[0].usage) == js({"output_tokens": 3})


def test_anthropic_errors_and_bad_input() -> None:
    d = AnthropicMessages()
    err = d.event(
        js({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        "error",
    )
    assert [(x.choice, x.kind, x.error) for x in err] == [(STREAM_LEVEL, ERROR, "Overloaded")]
    assert d.event("<html>502</html>", "error")[0].kind == ERROR
    assert d.event("{oops", "content_block_delta")[0].kind == INVALID
    bad = d.event(
        js({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 3}}),
        "x",
    )
    assert bad[0].kind == INVALID and "delta.text" in (bad[0].error or "")
    no_index = d.event(
        js({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}}), "x"
    )
    assert no_index[0].kind == INVALID
    assert d.event(js({"type": "message_start", "message": 5}), "message_start")[0].kind == INVALID
    unknown = d.event(
        js({"type": "content_block_delta", "index": 2, "delta": {"type": "future_delta"}}), "x"
    )
    assert unknown[0].kind == OTHER and unknown[0].choice == 2 and unknown[0].raw
    assert d.event(js({"type": "brand_new_event"}), "brand_new_event")[0].kind == OTHER
    assert d.event(js({"type": "ping"}), "ping")[0].kind == OTHER
    # type missing: the SSE event name decides
    assert d.event(js({}), "message_stop")[0].kind == DONE


def test_anthropic_nonstream_body() -> None:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "Sure: "},
            {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"x": 2}},
            {"type": "redacted_thinking", "data": "abc"},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 30},
    }
    deltas = AnthropicMessages().body(js(body))
    assert [(d.choice, d.kind, d.finish_reason) for d in deltas] == [
        (0, REASONING, "tool_use"),
        (1, CONTENT, "tool_use"),
        (2, TOOL_CALL, "tool_use"),
        (3, OTHER, "tool_use"),
    ]
    assert deltas[1].text == "Sure: "
    assert tool_args(deltas, 2) == (["calc"], '{"x":2}')
    assert counts(deltas[-1].usage) == (10, 30)
    err = AnthropicMessages().body(
        js({"type": "error", "error": {"type": "not_found_error", "message": "no model"}})
    )
    assert [(x.kind, x.error) for x in err] == [(ERROR, "no model")]
    assert AnthropicMessages().body(js({"type": "message", "content": "x"}))[0].kind == INVALID
    empty = AnthropicMessages().body(
        js({"type": "message", "content": [], "stop_reason": "end_turn"})
    )
    assert [(d.choice, d.kind, d.finish_reason) for d in empty] == [(0, FINISH, "end_turn")]


def test_anthropic_exchange_complete_and_error() -> None:
    wire = sse_bytes(anthropic_thinking_text_stream())
    chunks, closed = exchange(
        "/v1/messages",
        {
            "model": "claude-x",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
        "text/event-stream",
        [wire[:100], wire[100:]],
    )
    assert closed.state is StreamState.COMPLETE, closed.reason
    assert closed.done_seen and closed.finish_reasons == ((0, "end_turn"), (1, "end_turn"))
    assert counts(closed.usage) == (25, 15)
    assert [c.chunk_index for c in chunks if c.choice == 1 and c.text] == [1, 2, 3]
    # an overloaded error mid-stream: error state even though a stop followed
    events = anthropic_thinking_text_stream()
    events.insert(9, aev("error", error={"type": "overloaded_error", "message": "Overloaded"}))
    _, closed = exchange(
        "/v1/messages", {"model": "m", "stream": True}, "text/event-stream", [sse_bytes(events)]
    )
    assert closed.state is StreamState.ERROR and closed.error == "Overloaded"


# ---------------------------------------------------------------------------
# TGI
# ---------------------------------------------------------------------------

TGI_TOKENS = [
    (4321, "Deep", -0.5, False),
    (6789, " learning", -0.2, False),
    (338, " is", -0.1, False),
    (2, "</s>", -0.01, True),
]


def tgi_events(details: bool = True) -> list[tuple[str, str]]:
    out = []
    last = len(TGI_TOKENS) - 1
    for i, (tid, text, lp, special) in enumerate(TGI_TOKENS):
        ev: dict[str, Any] = {
            "index": i + 1,
            "token": {"id": tid, "text": text, "logprob": lp, "special": special},
            "generated_text": None,
            "details": None,
            "top_tokens": None,
        }
        if i == last:
            ev["generated_text"] = "Deep learning is"
            if details:
                ev["details"] = {
                    "finish_reason": "eos_token",
                    "generated_tokens": 4,
                    "seed": None,
                    "input_length": 7,
                }
        out.append(("message", js(ev)))
    return out


def test_tgi_stream() -> None:
    deltas = run(TgiGenerate(), tgi_events())
    assert text_of(deltas, 0) == "Deep learning is"
    assert [d.kind for d in deltas] == [CONTENT, CONTENT, CONTENT, FINISH, DONE]
    assert all(d.choice == 0 for d in deltas[:4])
    for d, (tid, text, _, special) in zip(deltas, TGI_TOKENS, strict=False):
        assert d.server_tokens is not None
        (tok,) = json.loads(d.server_tokens)
        assert (tok["id"], tok["text"], tok["special"]) == (tid, text, special)
    assert deltas[0].logprobs is not None
    assert parse_server_tokens(deltas[0].logprobs) == [ServerToken("Deep", 4321)]
    last = deltas[3]
    assert last.logprobs is None and last.text == "" and last.raw  # special token kept in raw only
    assert last.finish_reason == "eos_token"
    assert last.usage is not None and last.usage.raw == {
        "prompt_tokens": 7,
        "completion_tokens": 4,
    }


def test_tgi_stream_without_details() -> None:
    events = tgi_events(details=False)[:3]
    final = json.loads(events[2][1])
    final["generated_text"] = "Deep learning is"
    events[2] = ("message", js(final))
    deltas = run(TgiGenerate(), events)
    assert [(d.kind, d.finish_reason) for d in deltas] == [
        (CONTENT, None),
        (CONTENT, None),
        (CONTENT, None),
        (DONE, None),
    ]
    assert deltas[2].raw is not None  # the final event (generated_text) kept


def test_tgi_errors_and_bad_input() -> None:
    d = TgiGenerate()
    err = d.event(
        js(
            {
                "error": "Request failed during generation: Server error: OOM",
                "error_type": "generation",
            }
        ),
        "message",
    )
    assert (
        err[0].kind == ERROR
        and err[0].error == "generation: Request failed during generation: Server error: OOM"
    )
    assert d.event("{", "message")[0].kind == INVALID
    assert d.event(js({"token": None}), "message")[0].kind == INVALID
    assert d.event(js({"token": {"id": 1, "text": 5}}), "message")[0].kind == INVALID
    assert (
        d.event(js({"token": {"id": 1, "text": "a"}, "generated_text": 3}), "message")[0].kind
        == INVALID
    )
    assert (
        d.event(js({"token": {"id": 1, "text": "a"}, "generated_text": "a", "details": []}), "m")[
            0
        ].kind
        == INVALID
    )
    empty = d.event(js({"token": {"id": 5, "text": "", "special": False}}), "message")
    assert empty[0].kind == OTHER and empty[0].server_tokens is not None


def test_tgi_generate_body() -> None:
    tokens = [
        {"id": 4321, "text": "Deep", "logprob": -0.5, "special": False},
        {"id": 6789, "text": " learning", "logprob": -0.2, "special": False},
        {"id": 2, "text": "</s>", "logprob": -0.01, "special": True},
    ]
    body = {
        "generated_text": "Deep learning",
        "details": {
            "finish_reason": "eos_token",
            "generated_tokens": 3,
            "seed": None,
            "prefill": [],
            "tokens": tokens,
        },
    }
    (d,) = TgiGenerate().body(js(body))
    assert (d.choice, d.kind, d.text, d.finish_reason) == (0, CONTENT, "Deep learning", "eos_token")
    assert d.server_tokens is not None and json.loads(d.server_tokens) == tokens
    assert d.logprobs is not None and json.loads(d.logprobs) == tokens[:2]
    assert counts(d.usage) == (None, 3)
    (listed,) = TgiGenerate().body(js([{"generated_text": "x"}]))
    assert listed.kind == CONTENT and listed.text == "x" and listed.finish_reason is None
    err = TgiGenerate().body(
        js(
            {
                "error": "Input validation error: `inputs` must not be empty",
                "error_type": "validation",
            }
        )
    )
    assert err[0].kind == ERROR
    assert TgiGenerate().body(js({"text": "x"}))[0].kind == INVALID
    assert TgiGenerate().body("nope")[0].kind == INVALID


def test_tgi_exchange_no_space_after_colon() -> None:
    wire = sse_bytes(tgi_events(), space=False, named=False)
    assert wire.startswith(b"data:{")
    chunks, closed = exchange(
        "/generate_stream",
        {"inputs": "What is deep learning?", "parameters": {"max_new_tokens": 20, "details": True}},
        "text/event-stream",
        [wire[i : i + 37] for i in range(0, len(wire), 37)],
    )
    assert closed.state is StreamState.COMPLETE, closed.reason
    assert closed.done_seen and closed.finish_reasons == ((0, "eos_token"),)
    assert "".join(c.text for c in chunks) == "Deep learning is"
    assert closed.chunk_count == 3


# ---------------------------------------------------------------------------
# Ollama
# ---------------------------------------------------------------------------

OLLAMA_TIMINGS = {
    "total_duration": 4935886791,
    "load_duration": 534986708,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 107345000,
    "eval_count": 5,
    "eval_duration": 4289432000,
}


def ollama_generate_lines() -> list[str]:
    lines = [
        js(
            {
                "model": "llama3.2",
                "created_at": "2024-08-04T08:52:19.385406455-07:00",
                "response": r,
                "done": False,
            }
        )
        for r in ["The", " sky", " is", " blue"]
    ]
    lines.append(
        js(
            {
                "model": "llama3.2",
                "created_at": "2024-08-04T19:22:45.499127Z",
                "response": "",
                "done": True,
                "done_reason": "stop",
                "context": [1, 2, 3],
                **OLLAMA_TIMINGS,
            }
        )
    )
    return lines


def ollama_chat_lines() -> list[str]:
    def msg(content: str, thinking: str | None = None) -> str:
        m: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking is not None:
            m["thinking"] = thinking
        return js(
            {"model": "qwen3", "created_at": "2024-08-04T08:52:19Z", "message": m, "done": False}
        )

    return [
        msg("", "Hmm"),
        msg("", ", sky."),
        msg("Blue"),
        msg(" 🌤"),
        js(
            {
                "model": "qwen3",
                "created_at": "2024-08-04T08:52:20Z",
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "length",
                **OLLAMA_TIMINGS,
            }
        ),
    ]


def test_ollama_generate_stream() -> None:
    deltas = run(OllamaGenerate(), [("ndjson", line) for line in ollama_generate_lines()])
    assert [d.kind for d in deltas] == [CONTENT] * 4 + [FINISH, DONE]
    assert text_of(deltas, 0) == "The sky is blue"
    fin = deltas[4]
    assert fin.finish_reason == "stop"
    assert fin.usage is not None and fin.usage.raw == OLLAMA_TIMINGS  # own names, no context
    assert counts(fin.usage) == (26, 5)


def test_ollama_chat_stream_thinking() -> None:
    deltas = run(OllamaChat(), [("ndjson", line) for line in ollama_chat_lines()])
    assert [d.kind for d in deltas] == [REASONING, REASONING, CONTENT, CONTENT, FINISH, DONE]
    assert "".join(d.reasoning for d in deltas) == "Hmm, sky."
    assert text_of(deltas, 0) == "Blue 🌤"
    assert deltas[4].finish_reason == "length"


def test_ollama_chat_tool_calls_and_role_only() -> None:
    d = OllamaChat()
    line = js(
        {
            "model": "m",
            "message": {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Toronto"}}}
                ],
            },
            "done": False,
        }
    )
    (tc,) = d.event(line, "ndjson")
    assert tc.kind == TOOL_CALL
    assert tc.tool_calls is not None
    assert json.loads(tc.tool_calls) == [
        {
            "index": 0,
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Toronto"}'},
        }
    ]
    (role,) = d.event(
        js({"message": {"role": "assistant", "content": ""}, "done": False}), "ndjson"
    )
    assert role.kind == ROLE
    (other,) = OllamaGenerate().event(js({"response": "", "done": False}), "ndjson")
    assert other.kind == OTHER and other.raw


def test_ollama_errors_and_bad_input() -> None:
    d = OllamaChat()
    err = d.event(js({"error": "model 'llama9' not found, try pulling it first"}), "ndjson")
    assert err == [
        Delta(
            STREAM_LEVEL,
            ERROR,
            raw=js({"error": "model 'llama9' not found, try pulling it first"}),
            error="model 'llama9' not found, try pulling it first",
        )
    ]
    assert d.event('{"message":', "ndjson")[0].kind == INVALID
    assert d.event(js({"message": "hi"}), "ndjson")[0].kind == INVALID
    assert d.event(js({"message": {"content": 1}}), "ndjson")[0].kind == INVALID
    assert d.event(js({"message": {"content": "a"}, "done": "yes"}), "ndjson")[0].kind == INVALID
    assert d.event(js({"message": {"content": "", "tool_calls": {}}}), "ndjson")[0].kind == INVALID
    assert OllamaGenerate().event(js({"response": 3}), "ndjson")[0].kind == INVALID
    assert OllamaGenerate().event("[]", "ndjson")[0].kind == INVALID


def test_ollama_nonstream_bodies() -> None:
    gen = js(
        {
            "model": "llama3.2",
            "response": "The sky is blue.",
            "done": True,
            "done_reason": "stop",
            **OLLAMA_TIMINGS,
        }
    )
    (d,) = OllamaGenerate().body(gen)
    assert (d.kind, d.text, d.finish_reason) == (CONTENT, "The sky is blue.", "stop")
    assert d.usage is not None and d.usage.raw == OLLAMA_TIMINGS
    chat = js(
        {
            "model": "m",
            "message": {"role": "assistant", "content": "Hi!", "thinking": "greet"},
            "done": True,
            "done_reason": "stop",
        }
    )
    (c,) = OllamaChat().body(chat)
    assert (c.kind, c.text, c.reasoning, c.finish_reason, c.usage) == (
        CONTENT,
        "Hi!",
        "greet",
        "stop",
        None,
    )
    assert OllamaChat().body(js({"error": "boom"}))[0].kind == ERROR
    assert OllamaChat().body("{")[0].kind == INVALID


def test_ollama_exchange_ndjson() -> None:
    wire = ("\n".join(ollama_generate_lines()) + "\n").encode()
    chunks, closed = exchange(
        "/api/generate",
        {"model": "llama3.2", "prompt": "Why is the sky blue?"},
        "application/x-ndjson",
        [wire[:50], wire[50:51], wire[51:]],
    )
    assert closed.state is StreamState.COMPLETE, closed.reason
    assert closed.done_seen and closed.finish_reasons == ((0, "stop"),)
    assert counts(closed.usage) == (26, 5)
    assert "".join(c.text for c in chunks) == "The sky is blue"
    # the server died before "done": truncated (the last line lacks its newline but
    # the body ended cleanly: it is still parsed)
    cut = ("\n".join(ollama_generate_lines()[:3])).encode()
    chunks, closed = exchange("/api/generate", {"model": "m"}, "application/x-ndjson", [cut])
    assert closed.state is StreamState.TRUNCATED
    assert "".join(c.text for c in chunks) == "The sky is"


def test_ollama_exchange_nonstream() -> None:
    body = js(
        {
            "model": "m",
            "message": {"role": "assistant", "content": "Hi!"},
            "done": True,
            "done_reason": "stop",
            **OLLAMA_TIMINGS,
        }
    )
    chunks, closed = exchange(
        "/api/chat",
        {"model": "m", "stream": False},
        "application/json; charset=utf-8",
        [body.encode()],
    )
    assert closed.state is StreamState.COMPLETE
    assert [(c.kind, c.text, c.chunk_index) for c in chunks] == [(CONTENT, "Hi!", 1)]
    assert counts(closed.usage) == (26, 5)


# ---------------------------------------------------------------------------
# OpenAI extras: llama.cpp timings, vLLM continuous usage stats
# ---------------------------------------------------------------------------

TIMINGS = {
    "prompt_n": 9,
    "prompt_ms": 12.5,
    "prompt_per_token_ms": 1.39,
    "prompt_per_second": 720.0,
    "predicted_n": 3,
    "predicted_ms": 30.1,
    "predicted_per_token_ms": 10.03,
    "predicted_per_second": 99.7,
}


def test_llamacpp_timings_kept_in_usage() -> None:
    last = js(
        {
            "choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
            "object": "chat.completion.chunk",
            "usage": {"completion_tokens": 3, "prompt_tokens": 9, "total_tokens": 12},
            "timings": TIMINGS,
        }
    )
    (d,) = OpenAIChat().event(last, "message")
    assert d.kind == FINISH and d.usage is not None
    usage = d.usage.raw
    assert usage["timings"] == TIMINGS and usage["prompt_tokens"] == 9
    assert counts(d.usage) == (9, 3)
    # timings alone on a choice-less chunk: a stream-level usage delta
    (t,) = OpenAIChat().event(js({"choices": [], "timings": TIMINGS}), "message")
    assert (
        t.kind == USAGE
        and t.choice == STREAM_LEVEL
        and usage_json(t.usage) == js({"timings": TIMINGS})
    )


def test_llamacpp_ping_comments_ignored() -> None:
    chunk = js({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
    wire = f": ping\r\n\r\ndata: {chunk}\r\n\r\n: ping\r\n\r\ndata: [DONE]\r\n\r\n".encode()
    chunks, closed = exchange(
        "/v1/chat/completions", {"model": "m", "stream": True}, "text/event-stream", [wire]
    )
    assert [c.kind for c in chunks] == [CONTENT, DONE]
    assert closed.state is StreamState.COMPLETE


def test_vllm_continuous_usage_stats() -> None:
    def chunk(content: str, n: int, finish: str | None = None) -> str:
        return js(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n},
            }
        )

    items = [chunk("A", 1), chunk("B", 2), chunk("", 3, "stop")]
    deltas = run(OpenAIChat(), [("message", i) for i in items])
    assert [counts(d.usage) for d in deltas] == [(5, 1), (5, 2), (5, 3)]
    wire = "".join(f"data: {i}\n\n" for i in [*items, "[DONE]"]).encode()
    chunks, closed = exchange(
        "/v1/chat/completions",
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        "text/event-stream",
        [wire],
    )
    assert [counts(c.usage) for c in chunks if c.usage] == [(5, 1), (5, 2), (5, 3)]
    assert counts(closed.usage) == (5, 3)
    assert closed.state is StreamState.COMPLETE


# ---------------------------------------------------------------------------
# Properties: random splits of the wire bytes, arbitrary input never raises
# ---------------------------------------------------------------------------

SSE_CASES: dict[str, tuple[type[Any], bytes]] = {
    "responses": (OpenAIResponses, sse_bytes(responses_text_stream())),
    "anthropic": (AnthropicMessages, sse_bytes(anthropic_thinking_text_stream())),
    "tgi": (TgiGenerate, sse_bytes(tgi_events(), space=False, named=False)),
}
NDJSON_CASES: dict[str, tuple[type[Any], bytes]] = {
    "ollama.generate": (OllamaGenerate, ("\n".join(ollama_generate_lines()) + "\n").encode()),
    "ollama.chat": (OllamaChat, ("\r\n".join(ollama_chat_lines()) + "\r\n").encode()),
}


def decode_sse(factory: type[Any], pieces: list[bytes]) -> list[Delta]:
    dialect = factory()
    dec = SseDecoder()
    out: list[Delta] = []
    for p in pieces:
        for ev in dec.feed(p):
            out.extend(dialect.event(ev.data, ev.event))
    dec.close()
    return out


def decode_ndjson(factory: type[Any], pieces: list[bytes]) -> list[Delta]:
    dialect = factory()
    dec = NdjsonDecoder()
    out: list[Delta] = []
    for p in pieces:
        for line in dec.feed(p):
            out.extend(dialect.event(line, "ndjson"))
    for line in dec.close():
        out.extend(dialect.event(line, "ndjson"))
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = []
    prev = 0
    for p in points:
        pieces.append(data[prev:p])
        prev = p
    pieces.append(data[prev:])
    return pieces


@pytest.mark.parametrize("case", sorted(SSE_CASES))
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=25))
def test_sse_dialects_split_anywhere(case: str, cuts: list[int]) -> None:
    factory, wire = SSE_CASES[case]
    whole = decode_sse(factory, [wire])
    assert whole and not any(d.kind in (INVALID, ERROR) for d in whole)
    assert any(d.kind == DONE for d in whole)
    assert decode_sse(factory, split(wire, cuts)) == whole


@pytest.mark.parametrize("case", sorted(NDJSON_CASES))
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=25))
def test_ndjson_dialects_split_anywhere(case: str, cuts: list[int]) -> None:
    factory, wire = NDJSON_CASES[case]
    whole = decode_ndjson(factory, [wire])
    assert [d.kind for d in whole][-2:] == [FINISH, DONE]
    assert decode_ndjson(factory, split(wire, cuts)) == whole


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
# objects that look like each dialect's items, with arbitrary values in the known keys
KEYS = [
    "type",
    "delta",
    "output_index",
    "item",
    "response",
    "index",
    "content_block",
    "message",
    "usage",
    "error",
    "token",
    "generated_text",
    "details",
    "done",
    "done_reason",
    "response",
    "thinking",
    "tool_calls",
    "text",
    "partial_json",
    "status",
    "output",
    "content",
    "stop_reason",
]
TYPES = [
    "response.output_text.delta",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.reasoning_text.delta",
    "content_block_start",
    "content_block_delta",
    "message_delta",
    "message_start",
    "message_stop",
    "error",
]
lookalikes = st.dictionaries(
    st.sampled_from(KEYS), json_values | st.sampled_from(TYPES), max_size=6
)

FACTORIES: list[type[Any]] = [
    OpenAIResponses,
    AnthropicMessages,
    TgiGenerate,
    OllamaGenerate,
    OllamaChat,
]


@settings(max_examples=300, deadline=None)
@given(
    item=st.one_of(json_values, lookalikes),
    event_type=st.sampled_from(["message", "error", "ndjson", *TYPES]),
)
def test_arbitrary_items_never_raise(item: Any, event_type: str) -> None:
    data = js(item)
    for factory in FACTORIES:
        for deltas in (factory().event(data, event_type), factory().body(data)):
            assert isinstance(deltas, list) and deltas
            for d in deltas:
                assert isinstance(d, Delta)
                assert d.choice >= STREAM_LEVEL
                if d.kind == INVALID:
                    assert d.raw == data and d.error


@settings(max_examples=100, deadline=None)
@given(data=st.text(max_size=40))
def test_arbitrary_text_never_raises(data: str) -> None:
    for factory in FACTORIES:
        assert all(isinstance(d, Delta) for d in factory().event(data, "message"))
        assert all(isinstance(d, Delta) for d in factory().body(data))


@pytest.mark.parametrize(
    ("name", "item", "want"),
    [
        ("openai.chat", '{"model":"m","object":"chat.completion.chunk","choices":[]}', "m"),
        ("ollama.chat", '{"model":"o","message":{"content":"x"},"done":false}', "o"),
        ("anthropic.messages", '{"type":"message_start","message":{"model":"a"}}', "a"),
        ("openai.responses", '{"type":"response.created","response":{"model":"r"}}', "r"),
        ("openai.chat", '{"model":"","message":{"model":"a"}}', ""),  # any string
        ("openai.chat", '{"model":5,"response":{"model":"r"}}', "r"),
        ("tgi.generate", '{"token":{"id":1,"text":"x"}}', None),
        ("openai.chat", "[DONE]", None),
        ("openai.chat", '["model"]', None),
        ("openai.chat", "[" * 5000, None),
    ],
)
def test_item_model_names_the_model_of_a_recovered_stream(
    name: str, item: str, want: str | None
) -> None:
    dialect = dialect_by_name(name)
    assert dialect is not None and dialect.item_model(item) == want


def test_register_takes_the_dialects_probe_and_whole_message() -> None:
    from sniffer.llm import dialects as reg
    from sniffer.llm.dialects.base import PROOF_EVENT_NAME

    assert {"anthropic.messages", "openai.responses"} == reg.WHOLE_MESSAGE_DIALECTS

    class Whole(AnthropicMessages):
        name = "test.whole"
        whole_message = True

    def probe(event_type: str, obj: dict[str, Any] | None) -> int:
        return PROOF_EVENT_NAME + 1 if event_type == "test.whole" else 0

    def boom(event_type: str, obj: dict[str, Any] | None) -> int:
        raise RuntimeError("buggy probe")

    saved = (list(reg.REGISTRY), list(reg.KNOWN_DIALECTS), dict(reg.FACTORIES), list(reg.PROBES))
    try:
        reg.register("test.boom", lambda m, p, r: False, OpenAIChat, probe=boom)
        reg.register("test.whole", lambda m, p, r: p == "/w", Whole, probe=probe)
        assert "test.whole" in reg.WHOLE_MESSAGE_DIALECTS
        assert reg.guess_dialect("test.whole", "{}") == "test.whole"
        assert reg.guess_dialect("message_start", "{}") == "anthropic.messages"
    finally:
        reg.REGISTRY[:], reg.KNOWN_DIALECTS[:], reg.PROBES[:] = saved[0], saved[1], saved[3]
        reg.FACTORIES.clear()
        reg.FACTORIES.update(saved[2])
        reg.WHOLE_MESSAGE_DIALECTS.discard("test.whole")
