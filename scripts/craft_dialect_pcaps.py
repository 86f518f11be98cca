#!/usr/bin/env python3
"""Craft loopback captures of the non-OpenAI LLM APIs, with their expected results.

Writes ``pcaps/dialect_NAME.pcap`` and ``pcaps/dialect_NAME.expected.json`` for
the OpenAI Responses API (server port 8000), Anthropic Messages (8001), TGI
(8080) and Ollama (11434), each streaming and non-streaming. The bodies are
built from the documented wire formats of each API (no server was run); every
conversation is a complete TCP exchange over Ethernet as ``lo`` gives it:
handshake, request, response in several segments (SSE and NDJSON with chunked
transfer-encoding, writes split and merged at seeded random points), client
ACKs, FIN both ways.

Ground truth: the expected values are computed here from the same event lists
that are put on the wire (the text a client appends, per output position), not
from the sniffer. ``usage`` in the expected files is ``{"prompt_tokens",
"completion_tokens"}`` as the store must derive them from the dialect's own
usage fields (``tests/test_fixtures.py`` compares those two keys); the usage
object as the server sent it is in ``server_usage``.

The output is deterministic (fixed timestamps, ports, sequence numbers, seeds).

Usage: ``python scripts/craft_dialect_pcaps.py [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw
from scapy.utils import wrpcap

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
T0 = 1767225600.0  # 2026-01-01T00:00:00Z
MOD = 1 << 32


def js(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------
# Ground truth of one exchange
# ---------------------------------------------------------------------------


@dataclass
class Choice:
    text: str = ""
    chunks: int = 0
    finish_reason: str | None = None
    reasoning: str = ""
    tools: dict[str, dict[str, str]] = field(default_factory=dict)  # id → {id, name, arguments}

    def add_text(self, piece: str) -> None:
        if piece:
            self.text += piece
            self.chunks += 1

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "chunks": self.chunks,
        }
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.tools:
            out["tool_calls"] = list(self.tools.values())
        return out


@dataclass
class Exchange:
    path: str
    request: dict[str, Any]
    content_type: str
    writes: list[bytes]  # body writes (each one HTTP chunk when chunked)
    streaming: bool
    status: int = 200
    reason: str = "OK"
    extra_headers: tuple[tuple[str, str], ...] = ()
    request_headers: tuple[tuple[str, str], ...] = ()
    choices: dict[int, Choice] = field(default_factory=dict)
    usage: dict[str, Any] | None = None  # {"prompt_tokens", "completion_tokens"}
    server_usage: Any = None
    state: str = "complete"
    done_seen: bool = False
    sse_events: int | None = None
    error: Any = None
    speculative: dict[str, Any] | None = None  # what the server reported (expected columns)

    def choice(self, index: int) -> Choice:
        return self.choices.setdefault(index, Choice())


def sse(events: list[tuple[str | None, str]], space: bool = True) -> list[bytes]:
    """One write per event: ``event:`` line (when named) and ``data:`` line."""
    sep = ": " if space else ":"
    out = []
    for name, data in events:
        head = f"event{sep}{name}\n" if name else ""
        out.append(f"{head}data{sep}{data}\n\n".encode())
    return out


# ---------------------------------------------------------------------------
# OpenAI Responses
# ---------------------------------------------------------------------------


def _response(status: str, output: list[Any], usage: Any, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_67ccd2bed1ec8190b14f964abc054267",
        "object": "response",
        "created_at": 1767225600,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": "gpt-4.1-mini",
        "output": output,
        "parallel_tool_calls": True,
        "usage": usage,
        **extra,
    }


def responses_text() -> Exchange:
    ex = Exchange(
        "/v1/responses",
        {
            "model": "gpt-4.1-mini",
            "input": [{"role": "user", "content": "Say hello in three languages."}],
            "reasoning": {"summary": "auto"},
            "stream": True,
        },
        "text/event-stream; charset=utf-8",
        [],
        True,
    )
    summary = ["The user wants ", "greetings in three ", "languages."]
    text = ["Hello", "! ", "Bonjour", " ! ", "你好", "！", " 👋"]
    seq = 0
    events: list[tuple[str | None, str]] = []

    def ev(type_: str, **fields: Any) -> None:
        nonlocal seq
        events.append((type_, js({"type": type_, "sequence_number": seq, **fields})))
        seq += 1

    rs_item = {"id": "rs_1", "type": "reasoning", "summary": []}
    msg_item = {
        "id": "msg_1",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    ev("response.created", response=_response("in_progress", [], None))
    ev("response.in_progress", response=_response("in_progress", [], None))
    ev("response.output_item.added", output_index=0, item=rs_item)
    ev(
        "response.reasoning_summary_part.added",
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        part={"type": "summary_text", "text": ""},
    )
    for piece in summary:
        ev(
            "response.reasoning_summary_text.delta",
            item_id="rs_1",
            output_index=0,
            summary_index=0,
            delta=piece,
        )
        ex.choice(0).reasoning += piece
    full_summary = "".join(summary)
    ev(
        "response.reasoning_summary_text.done",
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        text=full_summary,
    )
    rs_done = {**rs_item, "summary": [{"type": "summary_text", "text": full_summary}]}
    ev("response.output_item.done", output_index=0, item=rs_done)
    ev("response.output_item.added", output_index=1, item=msg_item)
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    ev(
        "response.content_part.added",
        item_id="msg_1",
        output_index=1,
        content_index=0,
        part=part,
    )
    for piece in text:
        ev(
            "response.output_text.delta",
            item_id="msg_1",
            output_index=1,
            content_index=0,
            delta=piece,
            logprobs=[],
        )
        ex.choice(1).add_text(piece)
    full = "".join(text)
    ev(
        "response.output_text.done",
        item_id="msg_1",
        output_index=1,
        content_index=0,
        text=full,
        logprobs=[],
    )
    done_part = {**part, "text": full}
    ev(
        "response.content_part.done",
        item_id="msg_1",
        output_index=1,
        content_index=0,
        part=done_part,
    )
    msg_done = {**msg_item, "status": "completed", "content": [done_part]}
    ev("response.output_item.done", output_index=1, item=msg_done)
    usage = {
        "input_tokens": 14,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 37,
        "output_tokens_details": {"reasoning_tokens": 22},
        "total_tokens": 51,
    }
    ev("response.completed", response=_response("completed", [rs_done, msg_done], usage))
    ex.writes = sse(events)
    ex.sse_events = len(events)
    ex.choice(0).finish_reason = "completed"
    ex.choice(1).finish_reason = "completed"
    ex.usage = {"prompt_tokens": 14, "completion_tokens": 37}
    ex.server_usage = usage
    ex.done_seen = True
    return ex


def responses_tool() -> Exchange:
    ex = Exchange(
        "/v1/responses",
        {
            "model": "gpt-4.1-mini",
            "input": "What is the weather like in Paris today?",
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"location": {"type": "string"}},
                    },
                }
            ],
            "stream": True,
        },
        "text/event-stream; charset=utf-8",
        [],
        True,
    )
    item = {
        "id": "fc_1",
        "type": "function_call",
        "status": "in_progress",
        "arguments": "",
        "call_id": "call_DF3wZtLHv5eBNfURjvI8MULJ",
        "name": "get_weather",
    }
    pieces = ['{"', "location", '":"', "Paris", ",", " France", '"}']
    args = "".join(pieces)
    events: list[tuple[str | None, str]] = []
    seq = 0

    def ev(type_: str, **fields: Any) -> None:
        nonlocal seq
        events.append((type_, js({"type": type_, "sequence_number": seq, **fields})))
        seq += 1

    ev("response.created", response=_response("in_progress", [], None))
    ev("response.output_item.added", output_index=0, item=item)
    for piece in pieces:
        ev("response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta=piece)
    ev("response.function_call_arguments.done", item_id="fc_1", output_index=0, arguments=args)
    done = {**item, "status": "completed", "arguments": args}
    ev("response.output_item.done", output_index=0, item=done)
    usage = {"input_tokens": 57, "output_tokens": 18, "total_tokens": 75}
    ev("response.completed", response=_response("completed", [done], usage))
    ex.writes = sse(events)
    ex.sse_events = len(events)
    c = ex.choice(0)
    c.finish_reason = "completed"
    c.tools[item["call_id"]] = {"id": item["call_id"], "name": "get_weather", "arguments": args}
    ex.usage = {"prompt_tokens": 57, "completion_tokens": 18}
    ex.server_usage = usage
    ex.done_seen = True
    return ex


def responses_nonstream() -> Exchange:
    text = "Paris is the capital of France. 🇫🇷"
    output = [
        {
            "id": "rs_2",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "A geography question."}],
        },
        {
            "id": "msg_2",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        },
    ]
    usage = {"input_tokens": 11, "output_tokens": 29, "total_tokens": 40}
    body = js(_response("completed", output, usage)).encode()
    ex = Exchange(
        "/v1/responses",
        {"model": "gpt-4.1-mini", "input": "What is the capital of France?"},
        "application/json",
        [body[: len(body) // 2], body[len(body) // 2 :]],
        False,
    )
    ex.choice(0).reasoning = "A geography question."
    ex.choice(0).finish_reason = "completed"
    ex.choice(1).add_text(text)
    ex.choice(1).finish_reason = "completed"
    ex.usage = {"prompt_tokens": 11, "completion_tokens": 29}
    ex.server_usage = usage
    return ex


def responses_bad_request() -> Exchange:
    err = {
        "message": "The requested model 'gpt-nope' does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    ex = Exchange(
        "/v1/responses",
        {"model": "gpt-nope", "input": "hi"},
        "application/json",
        [js({"error": err}).encode()],
        False,
        status=400,
        reason="Bad Request",
    )
    ex.state = "error"
    ex.error = err
    return ex


# ---------------------------------------------------------------------------
# Anthropic Messages
# ---------------------------------------------------------------------------


def _anthropic_events() -> tuple[list[tuple[str | None, str]], Callable[..., None]]:
    events: list[tuple[str | None, str]] = []

    def ev(type_: str, **fields: Any) -> None:
        events.append((type_, js({"type": type_, **fields})))

    return events, ev


def _message_start(ev: Callable[..., None], usage: dict[str, Any]) -> None:
    ev(
        "message_start",
        message={
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-sonnet-4-5",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        },
    )


ANTHROPIC_HEADERS = (("x-api-key", "fixture-placeholder"), ("anthropic-version", "2023-06-01"))


def anthropic_thinking() -> Exchange:
    ex = Exchange(
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "thinking": {"type": "enabled", "budget_tokens": 512},
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Write a haiku about rain."}],
            "stream": True,
        },
        "text/event-stream; charset=utf-8",
        [],
        True,
        request_headers=ANTHROPIC_HEADERS,
    )
    events, ev = _anthropic_events()
    start_usage = {
        "input_tokens": 41,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    _message_start(ev, start_usage)
    ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""})
    for piece in ["Five, seven, ", "five syllables; ", "rain on a roof."]:
        ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": piece})
        ex.choice(0).reasoning += piece
    ev(
        "content_block_delta",
        index=0,
        delta={
            "type": "signature_delta",
            "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk",
        },
    )
    ev("content_block_stop", index=0)
    ev("content_block_start", index=1, content_block={"type": "text", "text": ""})
    ev("ping")
    for piece in ["Soft rain ", "on the roof—\n", "the kettle ", "hums along,\n", "雨の音 ☔"]:
        ev("content_block_delta", index=1, delta={"type": "text_delta", "text": piece})
        ex.choice(1).add_text(piece)
    ev("content_block_stop", index=1)
    ev(
        "message_delta",
        delta={"stop_reason": "end_turn", "stop_sequence": None},
        usage={"output_tokens": 58},
    )
    ev("message_stop")
    ex.writes = sse(events)
    ex.sse_events = len(events)
    ex.choice(0).finish_reason = "end_turn"  # the dialect ends every block seen
    ex.choice(1).finish_reason = "end_turn"
    ex.usage = {"prompt_tokens": 41, "completion_tokens": 58}
    ex.server_usage = {**start_usage, "output_tokens": 58}
    ex.done_seen = True
    return ex


def anthropic_tool() -> Exchange:
    ex = Exchange(
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 512,
            "tools": [
                {
                    "name": "get_weather",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
                }
            ],
            "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "stream": True,
        },
        "text/event-stream; charset=utf-8",
        [],
        True,
        request_headers=ANTHROPIC_HEADERS,
    )
    events, ev = _anthropic_events()
    start_usage = {"input_tokens": 380, "output_tokens": 1}
    _message_start(ev, start_usage)
    ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
    for piece in ["Let me ", "check that."]:
        ev("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
        ex.choice(0).add_text(piece)
    ev("content_block_stop", index=0)
    tool_id = "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
    ev(
        "content_block_start",
        index=1,
        content_block={"type": "tool_use", "id": tool_id, "name": "get_weather", "input": {}},
    )
    pieces = ["", '{"city"', ': "Os', 'lo"}']
    for piece in pieces:
        ev(
            "content_block_delta",
            index=1,
            delta={"type": "input_json_delta", "partial_json": piece},
        )
    ev("content_block_stop", index=1)
    ev(
        "message_delta",
        delta={"stop_reason": "tool_use", "stop_sequence": None},
        usage={"output_tokens": 67},
    )
    ev("message_stop")
    ex.writes = sse(events)
    ex.sse_events = len(events)
    ex.choice(0).finish_reason = "tool_use"
    c1 = ex.choice(1)
    c1.finish_reason = "tool_use"
    c1.tools[tool_id] = {"id": tool_id, "name": "get_weather", "arguments": "".join(pieces)}
    ex.usage = {"prompt_tokens": 380, "completion_tokens": 67}
    ex.server_usage = {**start_usage, "output_tokens": 67}
    ex.done_seen = True
    return ex


def anthropic_overloaded() -> Exchange:
    ex = Exchange(
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "stream": True,
        },
        "text/event-stream; charset=utf-8",
        [],
        True,
        request_headers=ANTHROPIC_HEADERS,
    )
    events, ev = _anthropic_events()
    _message_start(ev, {"input_tokens": 12, "output_tokens": 1})
    ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
    for piece in ["Once upon ", "a time"]:
        ev("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
        ex.choice(0).add_text(piece)
    err = {"type": "overloaded_error", "message": "Overloaded"}
    ev("error", error=err)
    ex.writes = sse(events)
    ex.sse_events = len(events)
    ex.state = "error"
    ex.error = err
    ex.usage = {"prompt_tokens": 12, "completion_tokens": 1}
    ex.server_usage = {"input_tokens": 12, "output_tokens": 1}
    return ex


def anthropic_nonstream() -> Exchange:
    text = "The capital of Japan is Tokyo (東京)."
    usage = {"input_tokens": 15, "output_tokens": 14}
    body = js(
        {
            "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
    ).encode()
    ex = Exchange(
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 128,
            "messages": [{"role": "user", "content": "Capital of Japan?"}],
        },
        "application/json",
        [body[:60], body[60:]],
        False,
        request_headers=ANTHROPIC_HEADERS,
    )
    ex.choice(0).add_text(text)
    ex.choice(0).finish_reason = "end_turn"
    ex.usage = {"prompt_tokens": 15, "completion_tokens": 14}
    ex.server_usage = usage
    return ex


# ---------------------------------------------------------------------------
# TGI
# ---------------------------------------------------------------------------

TGI_TOKENS: list[tuple[int, str, float, bool]] = [
    (15592, "Deep", -0.71, False),
    (6975, " learning", -0.02, False),
    (338, " is", -0.33, False),
    (263, " a", -0.12, False),
    (11306, " subset", -0.9, False),
    (310, " of", -0.01, False),
    (4933, " machine", -0.05, False),
    (6509, " learning", -0.01, False),
    (29889, ".", -0.4, False),
    (2, "</s>", -0.08, True),
]


def tgi_stream(details: bool, count: int) -> Exchange:
    tokens = TGI_TOKENS[:count]
    ex = Exchange(
        "/generate_stream",
        {
            "inputs": "What is deep learning?",
            "parameters": {"max_new_tokens": count if not details else 20, "details": details},
        },
        "text/event-stream",
        [],
        True,
    )
    events: list[tuple[str | None, str]] = []
    generated = "".join(t for _, t, _, special in tokens if not special)
    for i, (tid, text, lp, special) in enumerate(tokens):
        last = i == len(tokens) - 1
        item: dict[str, Any] = {
            "index": i + 1,
            "token": {"id": tid, "text": text, "logprob": lp, "special": special},
            "generated_text": generated if last else None,
            "details": None,
        }
        if last and details:
            item["details"] = {
                "finish_reason": "eos_token",
                "generated_tokens": len(tokens),
                "seed": None,
                "input_length": 7,
            }
        events.append((None, js(item)))
        if not special:
            ex.choice(0).add_text(text)
    ex.writes = sse(events, space=False)  # TGI writes "data:{…}"
    ex.sse_events = len(events)
    ex.done_seen = True  # generated_text marks the end
    if details:
        ex.choice(0).finish_reason = "eos_token"
        ex.usage = {"prompt_tokens": 7, "completion_tokens": len(tokens)}
    else:
        ex.choice(0)
    return ex


def tgi_nonstream() -> Exchange:
    tokens = [
        {"id": tid, "text": text, "logprob": lp, "special": special}
        for tid, text, lp, special in TGI_TOKENS
    ]
    text = "".join(str(t["text"]) for t in tokens if not t["special"])
    body = js(
        {
            "generated_text": text,
            "details": {
                "finish_reason": "eos_token",
                "generated_tokens": len(tokens),
                "seed": None,
                "prefill": [],
                "tokens": tokens,
            },
        }
    ).encode()
    ex = Exchange(
        "/generate",
        {
            "inputs": "What is deep learning?",
            "parameters": {"max_new_tokens": 20, "details": True},
        },
        "application/json",
        [body],
        False,
    )
    ex.choice(0).add_text(text)
    ex.choice(0).finish_reason = "eos_token"
    ex.usage = {"prompt_tokens": None, "completion_tokens": len(tokens)}
    return ex


# ---------------------------------------------------------------------------
# Server-reported speculative decoding (OpenAI-compatible servers)
# ---------------------------------------------------------------------------
#
# vLLM with --per-request-spec-decode-metrics: ``metrics.speculative_decoding``
# (num_spec_steps, num_draft_tokens, num_accepted_draft_tokens,
# mean_acceptance_length = 1 + accepted / steps, draft_acceptance_rate =
# accepted / drafted, acceptance_histogram[k] = steps that accepted k drafted
# tokens) on the final streamed chunk (with the usage of include_usage) or in
# the body. llama.cpp's llama-server: ``timings`` on the last chunk, with
# draft_n / draft_n_accepted when it speculated. SGLang: the ``spec_*`` fields
# of ``meta_info``, per choice of a non-streamed chat body with
# return_meta_info. Each exchange's ``speculative`` expected entry is what the
# store must hold for it, computed here from the same numbers by those
# definitions (a rate or length the server did not send is derived; a value
# out of its range is named in ``rejected``).

SPEC_PROMPT = [{"role": "user", "content": "Repeat after me: the cat sat on the mat."}]
SPEC_PIECES = ["The", " cat", " sat", " on", " the", " mat", "."]


def _spec_expected(
    source: str | None,
    draft: int | None = None,
    accepted: int | None = None,
    steps: int | None = None,
    length: float | None = None,
    rate: float | None = None,
    histogram: list[int] | None = None,
    timings: dict[str, Any] | None = None,
    rejected: list[str] | None = None,
) -> dict[str, Any]:
    if rate is None and accepted is not None and draft:
        rate = accepted / draft
    if length is None and accepted is not None and steps:
        length = 1 + accepted / steps
    return {
        "source": source,
        "draft_tokens": draft,
        "accepted_tokens": accepted,
        "steps": steps,
        "accept_length": length,
        "acceptance_rate": rate,
        "histogram": histogram,
        "timings": timings,
        "rejected": rejected,
    }


def _vllm_metrics(steps: int, histogram: list[int], k: int) -> dict[str, Any]:
    accepted = sum(i * n for i, n in enumerate(histogram))
    return {
        "speculative_decoding": {
            "num_spec_steps": steps,
            "num_draft_tokens": steps * k,
            "num_accepted_draft_tokens": accepted,
            "mean_acceptance_length": 1 + accepted / steps,
            "draft_acceptance_rate": accepted / (steps * k),
            "acceptance_histogram": histogram,
        }
    }


def vllm_spec_stream() -> Exchange:
    """vLLM stream: 3 tokens per chunk (one chunk per step), the metrics on
    the final usage chunk (choices [])."""
    ex = Exchange(
        "/v1/chat/completions",
        {
            "model": "Qwen/Qwen3-0.6B",
            "messages": SPEC_PROMPT,
            "stream": True,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        },
        "text/event-stream",
        [],
        True,
    )
    base = {"id": "chatcmpl-spec1", "object": "chat.completion.chunk", "created": 1767225600}
    base["model"] = "Qwen/Qwen3-0.6B"
    events: list[tuple[str | None, str]] = []
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    events.append((None, js({**base, "choices": [role]})))
    groups = [["The", " cat", " sat"], [" on", " the"], [" mat", "."]]
    for i, group in enumerate(groups):
        piece = "".join(group)
        finish = "stop" if i == len(groups) - 1 else None
        choice = {"index": 0, "delta": {"content": piece}, "finish_reason": finish}
        events.append((None, js({**base, "choices": [choice]})))
        ex.choice(0).add_text(piece)
    ex.choice(0).finish_reason = "stop"
    usage = {"prompt_tokens": 19, "completion_tokens": 7, "total_tokens": 26}
    metrics = _vllm_metrics(3, [0, 1, 2, 0], 3)  # 3 steps: 1, 2, 2 drafted tokens accepted
    events.append((None, js({**base, "choices": [], "usage": usage, "metrics": metrics})))
    events.append((None, "[DONE]"))
    ex.writes = sse(events)
    ex.sse_events = len(events)
    ex.done_seen = True
    ex.usage = {"prompt_tokens": 19, "completion_tokens": 7}
    ex.server_usage = {**usage, "metrics": metrics}  # the store keeps metrics in usage
    sd = metrics["speculative_decoding"]
    ex.speculative = _spec_expected(
        "vllm", 9, 5, 3, sd["mean_acceptance_length"], sd["draft_acceptance_rate"], [0, 1, 2, 0]
    )
    return ex


def vllm_spec_nonstream() -> Exchange:
    """vLLM /v1/completions without stream: the metrics in the body."""
    text = "alpha beta gamma alpha beta"
    metrics = _vllm_metrics(4, [1, 0, 1, 2], 3)
    body = {
        "id": "cmpl-spec2",
        "object": "text_completion",
        "created": 1767225600,
        "model": "Qwen/Qwen3-0.6B",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 12, "total_tokens": 23},
        "metrics": metrics,
    }
    ex = Exchange(
        "/v1/completions",
        {"model": "Qwen/Qwen3-0.6B", "prompt": "alpha beta gamma", "max_tokens": 12},
        "application/json",
        [js(body).encode()],
        False,
    )
    ex.choice(0).add_text(text)
    ex.choice(0).finish_reason = "length"
    ex.usage = {"prompt_tokens": 11, "completion_tokens": 12}
    ex.server_usage = {**body["usage"], "metrics": metrics}
    sd = metrics["speculative_decoding"]
    ex.speculative = _spec_expected(
        "vllm", 12, 8, 4, sd["mean_acceptance_length"], sd["draft_acceptance_rate"], [1, 0, 1, 2]
    )
    return ex


def llamacpp_spec_stream() -> Exchange:
    """llama-server stream: one token per event, ``timings`` with draft_n and
    draft_n_accepted on the last chunk."""
    ex = Exchange(
        "/v1/chat/completions",
        {"model": "gemma-3-270m", "messages": SPEC_PROMPT, "stream": True, "temperature": 0},
        "text/event-stream",
        [],
        True,
    )
    base = {"id": "chatcmpl-spec3", "object": "chat.completion.chunk", "created": 1767225600}
    base["model"] = "gemma-3-270m"
    events: list[tuple[str | None, str]] = []
    for i, piece in enumerate(SPEC_PIECES):
        delta = {"content": piece} if i else {"role": "assistant", "content": piece}
        events.append((None, js({**base, "choices": [{"index": 0, "delta": delta}]})))
        ex.choice(0).add_text(piece)
    timings = {
        "prompt_n": 17,
        "prompt_ms": 41.25,
        "prompt_per_token_ms": 2.43,
        "prompt_per_second": 412.1,
        "predicted_n": 7,
        "predicted_ms": 96.5,
        "predicted_per_token_ms": 13.79,
        "predicted_per_second": 72.5,
        "draft_n": 10,
        "draft_n_accepted": 6,
    }
    last = {"index": 0, "delta": {}, "finish_reason": "stop"}
    events.append((None, js({**base, "choices": [last], "timings": timings})))
    events.append((None, "[DONE]"))
    ex.choice(0).finish_reason = "stop"
    ex.writes = sse(events)
    ex.sse_events = len(events)
    ex.done_seen = True
    ex.server_usage = {"timings": timings}
    t = {k: timings[k] for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")}
    ex.speculative = _spec_expected("llama.cpp", 10, 6, timings=t)
    return ex


def llamacpp_spec_hostile() -> Exchange:
    """llama-server stream whose timings are out of range: more tokens accepted
    than drafted, a negative time; the rest is kept."""
    ex = llamacpp_spec_stream()
    timings = {"prompt_n": 17, "prompt_ms": -3.0, "predicted_n": 7, "predicted_ms": 96.5}
    timings |= {"draft_n": 4, "draft_n_accepted": 9}
    base = {"id": "chatcmpl-spec4", "object": "chat.completion.chunk", "created": 1767225600}
    last = {"index": 0, "delta": {}, "finish_reason": "stop"}
    data = js({**base, "model": "gemma-3-270m", "choices": [last], "timings": timings})
    ex.writes[-2] = f"data: {data}\n\n".encode()
    ex.server_usage = {"timings": timings}
    t = {"prompt_n": 17, "prompt_ms": None, "predicted_n": 7, "predicted_ms": 96.5}
    ex.speculative = _spec_expected(
        "llama.cpp", 4, None, timings=t, rejected=["draft_n_accepted", "prompt_ms"]
    )
    return ex


def sglang_spec_nonstream() -> Exchange:
    """SGLang chat without stream, return_meta_info: the spec_* fields of the
    choice's meta_info (other meta_info fields are not kept)."""
    text = "The cat sat on the mat."
    meta = {
        "id": "f3a1",
        "finish_reason": {"type": "stop", "matched": 1},
        "prompt_tokens": 19,
        "completion_tokens": 7,
        "cached_tokens": 0,
        "spec_verify_ct": 3,
        "spec_num_proposed_drafts": 9,
        "spec_num_correct_drafts": 4,
        "spec_accept_length": 7 / 3,
        "spec_accept_rate": 4 / 9,
        "e2e_latency": 0.0912,
    }
    body = {
        "id": "f3a1",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "meta_info": meta,
            }
        ],
        "usage": {"prompt_tokens": 19, "completion_tokens": 7, "total_tokens": 26},
    }
    ex = Exchange(
        "/v1/chat/completions",
        {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "messages": SPEC_PROMPT,
            "temperature": 0,
            "return_meta_info": True,
        },
        "application/json",
        [js(body).encode()],
        False,
    )
    ex.choice(0).add_text(text)
    ex.choice(0).finish_reason = "stop"
    ex.usage = {"prompt_tokens": 19, "completion_tokens": 7}
    spec_meta = {k: v for k, v in meta.items() if k.startswith("spec_")}
    ex.server_usage = {**body["usage"], "meta_info": spec_meta}  # only its spec_* fields
    ex.speculative = _spec_expected("sglang", 9, 4, 3, 7 / 3, 4 / 9)
    return ex


# ---------------------------------------------------------------------------
# Ollama
# ---------------------------------------------------------------------------

OLLAMA_TIMINGS = {
    "total_duration": 4935886791,
    "load_duration": 534986708,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 107345000,
    "eval_count": 9,
    "eval_duration": 4289432000,
}


def ollama_generate(stream: bool) -> Exchange:
    pieces = ["The", " sky", " is", " blue", " because", " of", " Rayleigh", " scattering", "."]
    ex = Exchange(
        "/api/generate",
        {
            "model": "llama3.2",
            "prompt": "Why is the sky blue?",
            **({} if stream else {"stream": False}),
        },
        "application/x-ndjson" if stream else "application/json; charset=utf-8",
        [],
        stream,
    )
    final = {
        "model": "llama3.2",
        "created_at": "2026-01-01T00:00:01.2Z",
        "response": "",
        "done": True,
        "done_reason": "stop",
        "context": [128006, 882, 128007, 271, 10445, 374, 279, 13180, 6437, 30],
        **OLLAMA_TIMINGS,
    }
    if stream:
        lines = [
            js(
                {
                    "model": "llama3.2",
                    "created_at": f"2026-01-01T00:00:00.{i + 1}Z",
                    "response": p,
                    "done": False,
                }
            )
            for i, p in enumerate(pieces)
        ]
        lines.append(js(final))
        ex.writes = [(line + "\n").encode() for line in lines]
        for p in pieces:
            ex.choice(0).add_text(p)
        ex.done_seen = True
    else:
        ex.writes = [js({**final, "response": "".join(pieces)}).encode()]
        ex.choice(0).add_text("".join(pieces))
    ex.choice(0).finish_reason = "stop"
    ex.usage = {"prompt_tokens": 26, "completion_tokens": 9}
    ex.server_usage = OLLAMA_TIMINGS
    return ex


def ollama_chat(stream: bool) -> Exchange:
    thinking = ["The user ", "greets me ", "in German."]
    pieces = ["Hallo", "! ", "Wie ", "geht's", "? 😊"]
    timings = {**OLLAMA_TIMINGS, "prompt_eval_count": 14, "eval_count": 31}
    ex = Exchange(
        "/api/chat",
        {
            "model": "qwen3",
            "messages": [{"role": "user", "content": "Hallo!"}],
            "think": True,
            **({} if stream else {"stream": False}),
        },
        "application/x-ndjson" if stream else "application/json; charset=utf-8",
        [],
        stream,
    )

    def line(message: dict[str, Any], done: bool = False, **extra: Any) -> str:
        return js(
            {
                "model": "qwen3",
                "created_at": "2026-01-01T00:00:00.5Z",
                "message": {"role": "assistant", **message},
                "done": done,
                **extra,
            }
        )

    if stream:
        lines = [line({"content": "", "thinking": t}) for t in thinking]
        lines += [line({"content": p}) for p in pieces]
        lines.append(line({"content": ""}, True, done_reason="stop", **timings))
        # Ollama writes each line as it is generated; the last one without "\n"
        ex.writes = [(ln + "\n").encode() for ln in lines[:-1]] + [lines[-1].encode()]
        for p in pieces:
            ex.choice(0).add_text(p)
        ex.done_seen = True
    else:
        body = line(
            {"content": "".join(pieces), "thinking": "".join(thinking)},
            True,
            done_reason="stop",
            **timings,
        )
        ex.writes = [body.encode()]
        ex.choice(0).add_text("".join(pieces))
    ex.choice(0).reasoning = "".join(thinking)
    ex.choice(0).finish_reason = "stop"
    ex.usage = {"prompt_tokens": 14, "completion_tokens": 31}
    ex.server_usage = timings
    return ex


# ---------------------------------------------------------------------------
# TCP conversations
# ---------------------------------------------------------------------------


class Conversation:
    """One TCP connection on loopback, packet by packet, with exact ACKs."""

    def __init__(self, cport: int, sport: int, t: float, isn_c: int, isn_s: int) -> None:
        self.cport = cport
        self.sport = sport
        self.t = t
        self.cseq = isn_c
        self.sseq = isn_s
        self.pkts: list[Packet] = []

    def _send(
        self, from_client: bool, flags: str, payload: bytes = b"", dt: float = 0.00005
    ) -> None:
        self.t += dt
        if from_client:
            sport, dport, seq, ack = self.cport, self.sport, self.cseq, self.sseq
        else:
            sport, dport, seq, ack = self.sport, self.cport, self.sseq, self.cseq
        tcp = TCP(sport=sport, dport=dport, seq=seq % MOD, flags=flags, window=65495)
        if "A" in flags:
            tcp.ack = ack % MOD
        pkt = (
            Ether(src="00:00:00:00:00:00", dst="00:00:00:00:00:00")
            / IP(src=HOST, dst=HOST, ttl=64)
            / tcp
        )
        if payload:
            pkt = pkt / Raw(payload)
        pkt.time = self.t
        self.pkts.append(pkt)
        advance = len(payload) + (1 if ("S" in flags or "F" in flags) else 0)
        if from_client:
            self.cseq += advance
        else:
            self.sseq += advance

    def handshake(self) -> None:
        self._send(True, "S")
        self._send(False, "SA")
        self._send(True, "A")

    def request(self, data: bytes) -> None:
        self._send(True, "PA", data, dt=0.0003)
        self._send(False, "A")

    def response(self, segments: list[tuple[float, bytes]]) -> None:
        for dt, data in segments:
            self._send(False, "PA", data, dt=dt)
            self._send(True, "A")

    def close(self) -> None:
        self._send(True, "FA", dt=0.001)
        self._send(False, "FA")
        self._send(True, "A")


def request_bytes(ex: Exchange, port: int) -> bytes:
    body = js(ex.request).encode()
    lines = [
        f"POST {ex.path} HTTP/1.1",
        f"Host: {HOST}:{port}",
        "Accept-Encoding: gzip, deflate",
        "Connection: keep-alive",
        "Content-Type: application/json",
        *(f"{k}: {v}" for k, v in ex.request_headers),
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def response_writes(ex: Exchange) -> list[bytes]:
    """The server's writes: the head, then the body (chunked when streaming)."""
    headers = [
        f"HTTP/1.1 {ex.status} {ex.reason}",
        "date: Thu, 01 Jan 2026 00:00:00 GMT",
        "server: uvicorn",
        f"content-type: {ex.content_type}",
        *(f"{k}: {v}" for k, v in ex.extra_headers),
    ]
    if ex.streaming:
        headers += ["cache-control: no-cache", "transfer-encoding: chunked"]
        writes = [("\r\n".join(headers) + "\r\n\r\n").encode()]
        writes += [f"{len(w):x}\r\n".encode() + w + b"\r\n" for w in ex.writes]
        writes.append(b"0\r\n\r\n")
        return writes
    body = b"".join(ex.writes)
    headers.append(f"content-length: {len(body)}")
    return [("\r\n".join(headers) + "\r\n\r\n").encode(), *ex.writes]


def segment(writes: list[bytes], rng: random.Random) -> list[tuple[float, bytes]]:
    """TCP segments from server writes: most writes go alone, some are split in
    two, some merged with the next one (as a busy server's socket does)."""
    out: list[tuple[float, bytes]] = []
    pending = b""
    for i, w in enumerate(writes):
        dt = 0.0 if pending else (0.004 if i == 0 else 0.012 + rng.random() * 0.008)
        data = pending + w
        pending = b""
        roll = rng.random()
        if roll < 0.2 and i + 1 < len(writes):
            pending = data  # goes out together with the next write
            continue
        if roll < 0.45 and len(data) > 2:
            cut = rng.randrange(1, len(data))
            out.append((dt, data[:cut]))
            out.append((0.0002, data[cut:]))
        else:
            out.append((dt, data))
    if pending:
        out.append((0.01, pending))
    return [(max(dt, 0.0001), d) for dt, d in out]


@dataclass
class Connection:
    cport: int
    exchanges: list[Exchange]


@dataclass
class Fixture:
    name: str
    description: str
    port: int
    connections: list[Connection]


def build(fx: Fixture, seed: int) -> tuple[list[Packet], dict[str, Any]]:
    rng = random.Random(seed)
    pkts: list[Packet] = []
    streams: list[dict[str, Any]] = []
    t = T0 + seed
    for ci, conn in enumerate(fx.connections):
        conv = Conversation(conn.cport, fx.port, t + ci * 0.5, 1_000_000 * (ci + 7), 3_000_000_000)
        conv.handshake()
        for xi, ex in enumerate(conn.exchanges):
            conv.request(request_bytes(ex, fx.port))
            conv.response(segment(response_writes(ex), rng))
            streams.append(expected_stream(ex, conn.cport, xi))
        conv.close()
        pkts += conv.pkts
    pkts.sort(key=lambda p: float(p.time))
    expected = {
        "fixture": fx.name,
        "description": fx.description,
        "server_host": HOST,
        "server_port": fx.port,
        "streams": streams,
        "errors_min": 0,
        "extra_streams_max": 0,
    }
    return pkts, expected


def expected_stream(ex: Exchange, cport: int, exchange: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "method": "POST",
        "path": ex.path,
        "model": ex.request.get("model"),
        "stream": ex.streaming,
        "status": ex.status,
        "client_port": cport,
        "state": ex.state,
        "gap": False,
        "done_seen": ex.done_seen,
        "choices": {str(k): c.json() for k, c in sorted(ex.choices.items())},
        "usage": ex.usage,
        "server_usage": ex.server_usage,
    }
    if ex.sse_events is not None:
        out["sse_events"] = ex.sse_events
    if ex.error is not None:
        out["error"] = ex.error
    if ex.speculative is not None:
        out["speculative"] = ex.speculative
    out["check_text"] = True
    out["exchange"] = exchange
    return out


FIXTURES = [
    Fixture(
        "dialect_responses_stream",
        "OpenAI Responses API stream on one keep-alive connection: reasoning summary "
        "(output 0) then text (output 1, CJK and emoji), response.completed with usage; "
        "then a function call (arguments deltas). No [DONE]: response.completed ends a stream",
        8000,
        [Connection(41000, [responses_text(), responses_tool()])],
    ),
    Fixture(
        "dialect_responses_nonstream",
        "OpenAI Responses API without stream: reasoning + message output items "
        "(Content-Length, body in two segments); then HTTP 400 with an error object",
        8000,
        [Connection(41010, [responses_nonstream(), responses_bad_request()])],
    ),
    Fixture(
        "dialect_anthropic_stream",
        "Anthropic Messages streams: thinking block 0 + text block 1 (ping, signature_delta), "
        "message_delta usage merged with message_start's; text + tool_use (input_json_delta) "
        "on a keep-alive connection; a second connection cut by an overloaded_error event",
        8001,
        [
            Connection(41100, [anthropic_thinking(), anthropic_tool()]),
            Connection(41102, [anthropic_overloaded()]),
        ],
    ),
    Fixture(
        "dialect_anthropic_nonstream",
        "Anthropic Messages without stream: one text block, stop_reason end_turn",
        8001,
        [Connection(41110, [anthropic_nonstream()])],
    ),
    Fixture(
        "dialect_tgi_stream",
        "TGI /generate_stream ('data:' without a space): with details, ending in a special "
        "</s> token (not text); then without details, cut by max_new_tokens "
        "(generated_text is the end marker, no finish_reason)",
        8080,
        [Connection(41200, [tgi_stream(True, len(TGI_TOKENS)), tgi_stream(False, 5)])],
    ),
    Fixture(
        "dialect_tgi_nonstream",
        "TGI /generate with details (tokens, special </s>)",
        8080,
        [Connection(41210, [tgi_nonstream()])],
    ),
    Fixture(
        "dialect_ollama_stream",
        "Ollama NDJSON streams: /api/generate (timings on the done line, context dropped); "
        "/api/chat with thinking then content, last line without a newline",
        11434,
        [Connection(41300, [ollama_generate(True)]), Connection(41302, [ollama_chat(True)])],
    ),
    Fixture(
        "dialect_ollama_nonstream",
        "Ollama with stream false: /api/generate and /api/chat (thinking) on one connection",
        11434,
        [Connection(41310, [ollama_generate(False), ollama_chat(False)])],
    ),
    Fixture(
        "dialect_spec_vllm",
        "CRAFTED to vLLM's documented per-request speculative-decoding metrics "
        "(--per-request-spec-decode-metrics): metrics.speculative_decoding on the final "
        "usage chunk of a chat stream (3 steps, histogram [0,1,2,0]); then in a "
        "non-streamed /v1/completions body",
        8000,
        [Connection(41400, [vllm_spec_stream(), vllm_spec_nonstream()])],
    ),
    Fixture(
        "dialect_spec_llamacpp",
        "CRAFTED to llama.cpp llama-server's documented timings: draft_n / draft_n_accepted "
        "with prompt_n/prompt_ms/predicted_n/predicted_ms on the last chunk; then a stream "
        "whose timings are out of range (accepted > drafted, a negative time): those "
        "values are rejected and named, the rest kept",
        8080,
        [Connection(41410, [llamacpp_spec_stream()]), Connection(41412, [llamacpp_spec_hostile()])],
    ),
    Fixture(
        "dialect_spec_sglang",
        "CRAFTED to SGLang's documented meta_info: a non-streamed chat body with "
        "return_meta_info, spec_verify_ct / spec_num_proposed_drafts / "
        "spec_num_correct_drafts / spec_accept_length / spec_accept_rate in the choice",
        30000,
        [Connection(41420, [sglang_spec_nonstream()])],
    ),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "pcaps")
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    for seed, fx in enumerate(FIXTURES):
        pkts, expected = build(fx, seed)
        pcap = ns.out / f"{fx.name}.pcap"
        wrpcap(str(pcap), pkts)
        exp = ns.out / f"{fx.name}.expected.json"
        exp.write_text(json.dumps(expected, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        states = ",".join(s["state"] for s in expected["streams"])
        print(
            f"{fx.name:30s} {pcap.stat().st_size:7d} B  {len(pkts):4d} packets  streams: {states}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
