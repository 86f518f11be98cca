"""OpenAI chat/completions extraction, with chunks shaped as real servers send them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.sse import SseDecoder
from sniffer.llm.dialects import KNOWN_DIALECTS, REGISTRY, normalize_path, register, select_dialect
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
from sniffer.llm.dialects.openai import OpenAIChat, OpenAICompletions
from sniffer.llm.values import ServerTimings, Usage
from sniffer.store.writer import usage_json


def js(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def chat_chunk(*choices: dict[str, Any], usage: Any = "absent", **extra: Any) -> str:
    obj: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": list(choices),
        **extra,
    }
    if usage != "absent":
        obj["usage"] = usage
    return js(obj)


def choice(
    delta: dict[str, Any], index: int = 0, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish, **extra}


USAGE_OBJ = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
USAGE_TEXT = js(USAGE_OBJ)
USAGE_VALUE = Usage.parse(USAGE_OBJ)


def run(dialect: OpenAIChat | OpenAICompletions, events: list[str]) -> list[Delta]:
    out: list[Delta] = []
    for data in events:
        out.extend(dialect.event(data, "message"))
    return out


def kinds(deltas: list[Delta]) -> list[tuple[int, str]]:
    return [(d.choice, d.kind) for d in deltas]


# -- streamed chat -------------------------------------------------------------------------


def test_vllm_openai_stream_with_role_prelude_usage_and_done() -> None:
    events = [
        chat_chunk(choice({"role": "assistant", "content": ""})),
        chat_chunk(choice({"content": "Hel"})),
        chat_chunk(choice({"content": "lo"})),
        chat_chunk(choice({}, finish="stop")),
        chat_chunk(usage=USAGE_OBJ),
        "[DONE]",
    ]
    out = run(OpenAIChat(), events)
    assert kinds(out) == [
        (0, ROLE),
        (0, CONTENT),
        (0, CONTENT),
        (0, FINISH),
        (STREAM_LEVEL, USAGE),
        (STREAM_LEVEL, DONE),
    ]
    assert "".join(d.text for d in out) == "Hello"
    assert out[3].finish_reason == "stop"
    assert usage_json(out[4].usage) == USAGE_TEXT
    assert all(d.raw is None for d in out)  # raw only for kinds we do not model


def test_usage_chunk_with_null_choices() -> None:
    out = OpenAIChat().event(js({"choices": None, "usage": USAGE_OBJ}), "message")
    assert out == [Delta(STREAM_LEVEL, USAGE, usage=USAGE_VALUE)]


def test_usage_chunk_without_choices_key() -> None:
    out = OpenAIChat().event(js({"usage": USAGE_OBJ}), "message")
    assert out == [Delta(STREAM_LEVEL, USAGE, usage=USAGE_VALUE)]


def test_transformers_serve_usage_inside_finish_chunk_no_done() -> None:
    # transformers serve: no [DONE], usage on the finish chunk, "usage": null elsewhere
    events = [
        chat_chunk(choice({"role": "assistant", "content": "漢"}, logprobs=None), usage=None),
        chat_chunk(choice({"content": "字"}), usage=None),
        chat_chunk(choice({}, finish="length"), usage=USAGE_OBJ),
    ]
    out = run(OpenAIChat(), events)
    assert kinds(out) == [(0, CONTENT), (0, CONTENT), (0, FINISH)]
    assert out[0].text == "漢"  # content wins over role in the same delta
    assert out[0].usage is None and out[1].usage is None
    assert usage_json(out[2].usage) == USAGE_TEXT
    assert out[2].finish_reason == "length"


def test_vllm_continuous_usage_on_every_chunk() -> None:
    events = [
        chat_chunk(choice({"content": "a"}), usage={"completion_tokens": 1}),
        chat_chunk(choice({"content": "b"}), usage={"completion_tokens": 2}),
    ]
    out = run(OpenAIChat(), events)
    assert [usage_json(d.usage) for d in out] == [
        '{"completion_tokens":1}',
        '{"completion_tokens":2}',
    ]
    assert [d.kind for d in out] == [CONTENT, CONTENT]


def test_n2_interleaved_choices() -> None:
    events = [
        chat_chunk(
            choice({"role": "assistant", "content": ""}, 0),
            choice({"role": "assistant", "content": ""}, 1),
        ),
        chat_chunk(choice({"content": "x"}, 1)),
        chat_chunk(choice({"content": "y"}, 0)),
        chat_chunk(choice({"content": "z"}, 1), choice({"content": "w"}, 0)),
        chat_chunk(choice({}, 0, "stop"), choice({}, 1, "length"), usage=USAGE_OBJ),
    ]
    out = run(OpenAIChat(), events)
    assert kinds(out) == [
        (0, ROLE),
        (1, ROLE),
        (1, CONTENT),
        (0, CONTENT),
        (1, CONTENT),
        (0, CONTENT),
        (0, FINISH),
        (1, FINISH),
    ]
    text = {c: "".join(d.text for d in out if d.choice == c) for c in (0, 1)}
    assert text == {0: "yw", 1: "xz"}
    assert usage_json(out[-1].usage) == USAGE_TEXT and out[-2].usage is None
    assert out[-1].finish_reason == "length"


def test_choice_index_defaults_to_position() -> None:
    data = js({"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]})
    assert kinds(OpenAIChat().event(data, "message")) == [(0, CONTENT), (1, CONTENT)]


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning(key: str) -> None:
    events = [
        chat_chunk(choice({"role": "assistant", key: "think"})),
        chat_chunk(choice({key: " more", "content": None})),
        chat_chunk(choice({"content": "answer", key: None})),
    ]
    out = run(OpenAIChat(), events)
    assert kinds(out) == [(0, REASONING), (0, REASONING), (0, CONTENT)]
    assert [d.reasoning for d in out] == ["think", " more", ""]
    assert out[2].text == "answer"


def test_content_and_reasoning_in_one_delta_fill_both() -> None:
    out = OpenAIChat().event(chat_chunk(choice({"content": "a", "reasoning_content": "r"})), "m")
    assert out == [Delta(0, CONTENT, text="a", reasoning="r")]


def test_tool_call_deltas() -> None:
    first = [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    nxt = [{"index": 0, "function": {"arguments": '{"city":"Zürich"}'}}]
    events = [
        chat_chunk(choice({"role": "assistant", "content": None, "tool_calls": first})),
        chat_chunk(choice({"tool_calls": nxt})),
        chat_chunk(choice({}, finish="tool_calls")),
    ]
    out = run(OpenAIChat(), events)
    assert kinds(out) == [(0, TOOL_CALL), (0, TOOL_CALL), (0, FINISH)]
    assert out[0].tool_calls is not None and json.loads(out[0].tool_calls) == first
    assert out[1].tool_calls == '[{"index":0,"function":{"arguments":"{\\"city\\":\\"Zürich\\"}"}}]'
    assert out[2].finish_reason == "tool_calls"


def test_empty_tool_calls_list_is_not_a_tool_call() -> None:
    out = OpenAIChat().event(chat_chunk(choice({"content": "", "tool_calls": []})), "m")
    assert out[0].kind == OTHER and out[0].tool_calls is None


def test_logprobs_kept_as_compact_json() -> None:
    lp = {
        "content": [
            {"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": []},
        ]
    }
    out = OpenAIChat().event(chat_chunk(choice({"content": "Hi"}, logprobs=lp)), "m")
    assert out[0].logprobs == js(lp)
    out = OpenAIChat().event(chat_chunk(choice({"content": "Hi"}, logprobs=None)), "m")
    assert out[0].logprobs is None


def test_llamacpp_empty_content_delta_is_other_with_raw() -> None:
    data = chat_chunk(choice({"content": ""}))
    out = OpenAIChat().event(data, "message")
    assert out == [Delta(0, OTHER, raw=data)]


def test_replacement_char_in_content_is_content() -> None:
    out = OpenAIChat().event(chat_chunk(choice({"content": "\ufffd"})), "message")
    assert out == [Delta(0, CONTENT, text="\ufffd")]
    # as escaped JSON, too
    out = OpenAIChat().event('{"choices":[{"index":0,"delta":{"content":"\\ufffd"}}]}', "m")
    assert out == [Delta(0, CONTENT, text="\ufffd")]


def test_done_variants() -> None:
    d = OpenAIChat()
    assert d.event("[DONE]", "message") == [Delta(STREAM_LEVEL, DONE)]
    assert d.event(" [DONE] ", "message") == [Delta(STREAM_LEVEL, DONE)]


def test_chunk_with_nothing_modelled_is_other() -> None:
    data = js({"id": "x", "object": "chat.completion.chunk", "choices": []})
    assert OpenAIChat().event(data, "message") == [Delta(STREAM_LEVEL, OTHER, raw=data)]
    data = chat_chunk(choice({}))
    assert OpenAIChat().event(data, "message") == [Delta(0, OTHER, raw=data)]
    assert OpenAIChat().event("", "message") == [Delta(STREAM_LEVEL, OTHER, raw="")]


# -- errors and bad input ------------------------------------------------------------------


def test_error_object_mid_stream() -> None:
    err = js(
        {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}
    )
    events = [chat_chunk(choice({"content": "a"})), err]
    out = run(OpenAIChat(), events)
    assert out[1] == Delta(STREAM_LEVEL, ERROR, raw=err, error="CUDA out of memory")


def test_error_string_and_flat_vllm_error_and_message_less_error() -> None:
    d = OpenAIChat()
    assert d.event('{"error":"overloaded"}', "m")[0].error == "overloaded"
    flat = js({"object": "error", "message": "bad", "type": "BadRequestError", "code": 400})
    assert d.event(flat, "m") == [Delta(STREAM_LEVEL, ERROR, raw=flat, error="bad")]
    assert d.event('{"error":{"code":7}}', "m")[0].error == '{"code":7}'
    # "error": null is no error
    assert d.event('{"error":null,"choices":[{"delta":{"content":"a"}}]}', "m")[0].kind == CONTENT


def test_event_type_error_with_text_data() -> None:
    assert OpenAIChat().event("upstream died", "error") == [
        Delta(STREAM_LEVEL, ERROR, raw="upstream died", error="upstream died")
    ]


@pytest.mark.parametrize(
    "data",
    [
        '{"choices":[{"delta":{"content":"a"}',  # cut
        "{'single': 'quotes'}",
        "data: {}",
        "[" * 100_000 + "]" * 100_000,  # deeper than the recursion limit
    ],
)
def test_broken_json_is_invalid(data: str) -> None:
    for dialect in (OpenAIChat(), OpenAICompletions()):
        out = dialect.event(data, "message")
        assert len(out) == 1
        assert out[0].kind == INVALID and out[0].choice == STREAM_LEVEL
        assert out[0].raw == data and out[0].error
        assert dialect.body(data)[0].kind == INVALID


@pytest.mark.parametrize(
    "obj",
    [
        [1, 2],
        "text",
        42,
        {"choices": {"0": {}}},
        {"choices": "x"},
        {"choices": 0, "usage": USAGE_OBJ},
        {"choices": [1]},
        {"choices": [{"index": "0", "delta": {"content": "a"}}]},
        {"choices": [{"index": True, "delta": {"content": "a"}}]},
        {"choices": [{"delta": "a"}]},
        {"choices": [{"delta": {"content": ["a"]}}]},
        {"choices": [{"delta": {"content": 5}}]},
        {"choices": [{"delta": {"reasoning_content": {}}}]},
        {"choices": [{"delta": {"tool_calls": {"id": 1}}}]},
        {"choices": [{"delta": {}, "finish_reason": 1}]},
        {"choices": [{"delta": {"content": "ok"}}, {"delta": []}]},
    ],
)
def test_wrong_shapes_are_invalid(obj: Any) -> None:
    data = js(obj)
    out = OpenAIChat().event(data, "message")
    assert len(out) == 1, out
    assert out[0].kind == INVALID and out[0].raw == data and out[0].error


def test_completions_wrong_shapes() -> None:
    data = js({"choices": [{"text": 3}]})
    assert OpenAICompletions().event(data, "m")[0].kind == INVALID


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "delta",
                    "message",
                    "content",
                    "text",
                    "index",
                    "usage",
                    "error",
                    "finish_reason",
                    "role",
                    "tool_calls",
                    "logprobs",
                    "reasoning_content",
                    "object",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_json_values.map(js), st.text(max_size=40)))
def test_any_input_never_raises(data: str) -> None:
    for dialect in (OpenAIChat(), OpenAICompletions()):
        for out in (dialect.event(data, "message"), dialect.body(data)):
            assert out and all(isinstance(d, Delta) for d in out)
            for d in out:
                if d.kind in (INVALID, ERROR, OTHER):
                    assert d.raw is not None


# -- streamed completions ----------------------------------------------------------------


def test_completions_stream() -> None:
    def chunk(text: str, finish: str | None = None, **extra: Any) -> str:
        return js(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                **extra,
            }
        )

    lp = {"tokens": [" world"], "token_logprobs": [-0.5], "top_logprobs": None, "text_offset": [5]}
    events = [
        chunk("Hello"),
        js({"choices": [{"index": 0, "text": " world", "logprobs": lp, "finish_reason": None}]}),
        chunk("", "length"),
        js({"id": "cmpl-1", "choices": [], "usage": USAGE_OBJ}),
        "[DONE]",
    ]
    out = run(OpenAICompletions(), events)
    assert kinds(out) == [(0, CONTENT), (0, CONTENT), (0, FINISH), (-1, USAGE), (-1, DONE)]
    assert out[1].logprobs == js(lp)
    assert out[2].finish_reason == "length"
    assert "".join(d.text for d in out) == "Hello world"


def test_completions_empty_text_is_other() -> None:
    data = js({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
    assert OpenAICompletions().event(data, "m") == [Delta(0, OTHER, raw=data)]


# -- non-streaming bodies ----------------------------------------------------------------


def test_chat_body() -> None:
    body = js(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi 👋", "reasoning_content": "r"},
                    "finish_reason": "stop",
                    "logprobs": None,
                },
                {
                    "index": 1,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}],
                    },
                    "finish_reason": "tool_calls",
                },
                {
                    "index": 2,
                    "message": {"role": "assistant", "content": ""},
                    "finish_reason": "length",
                },
            ],
            "usage": USAGE_OBJ,
        }
    )
    out = OpenAIChat().body(body)
    assert out == [
        Delta(0, CONTENT, text="Hi 👋", reasoning="r", finish_reason="stop"),
        Delta(
            1,
            TOOL_CALL,
            tool_calls='[{"id":"c","type":"function","function":{"name":"f"}}]',
            finish_reason="tool_calls",
        ),
        Delta(2, FINISH, finish_reason="length"),
        Delta(STREAM_LEVEL, USAGE, usage=USAGE_VALUE),
    ]


def test_chat_body_reasoning_only() -> None:
    body = js({"choices": [{"message": {"role": "assistant", "reasoning_content": "hm"}}]})
    assert OpenAIChat().body(body) == [Delta(0, REASONING, reasoning="hm")]


def test_completions_body() -> None:
    body = js(
        {
            "object": "text_completion",
            "choices": [
                {"index": 0, "text": "a", "finish_reason": "stop", "logprobs": None},
                {"index": 1, "text": "b", "finish_reason": "length", "logprobs": {"tokens": ["b"]}},
            ],
            "usage": USAGE_OBJ,
        }
    )
    assert OpenAICompletions().body(body) == [
        Delta(0, CONTENT, text="a", finish_reason="stop"),
        Delta(1, CONTENT, text="b", finish_reason="length", logprobs='{"tokens":["b"]}'),
        Delta(STREAM_LEVEL, USAGE, usage=USAGE_VALUE),
    ]


def test_error_body() -> None:
    body = js({"error": {"message": "model not found", "type": "invalid_request_error"}})
    assert OpenAIChat().body(body) == [
        Delta(STREAM_LEVEL, ERROR, raw=body, error="model not found")
    ]


# -- end to end with the SSE decoder --------------------------------------------------------


def test_sse_bytes_to_deltas_split_anywhere() -> None:
    text = "漢字 and 😀"
    events = [
        chat_chunk(choice({"role": "assistant", "content": ""})),
        *(chat_chunk(choice({"content": ch})) for ch in text),
        chat_chunk(choice({}, finish="stop")),
        chat_chunk(usage=USAGE_OBJ),
        "[DONE]",
    ]
    raw = "".join(f"data: {e}\r\n\r\n" if i % 2 else f"data:{e}\n\n" for i, e in enumerate(events))
    raw_bytes = (": ping\n\n" + raw).encode()
    for cut in range(0, len(raw_bytes), 3):
        dec = SseDecoder()
        dialect = OpenAIChat()
        out: list[Delta] = []
        for piece in (raw_bytes[:cut], raw_bytes[cut:]):
            for sse in dec.feed(piece):
                out.extend(dialect.event(sse.data, sse.event))
        assert "".join(d.text for d in out) == text
        assert out[-1].kind == DONE and out[-2].kind == USAGE
        assert dec.comments == 1


# -- registry ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "name"),
    [
        ("POST", "/v1/chat/completions", "openai.chat"),
        ("POST", "/chat/completions", "openai.chat"),
        ("post", "/v1/chat/completions?api-version=1", "openai.chat"),
        ("POST", "/v1/chat/completions/", "openai.chat"),
        ("POST", "http://127.0.0.1:8000/v1/chat/completions", "openai.chat"),
        ("POST", "/v1/completions", "openai.completions"),
        ("POST", "/completions#x", "openai.completions"),
        ("GET", "/v1/chat/completions", None),
        ("POST", "/v1/embeddings", None),
        ("POST", "/v2/chat/completions", None),
        ("POST", "/v1/chat/completions/abc", None),
    ],
)
def test_select_dialect(method: str, target: str, name: str | None) -> None:
    dialect = select_dialect(method, target, {"model": "m"})
    assert (dialect.name if dialect else None) == name


def test_select_dialect_returns_new_instances() -> None:
    a = select_dialect("POST", "/v1/chat/completions", None)
    b = select_dialect("POST", "/v1/chat/completions", None)
    assert isinstance(a, OpenAIChat) and isinstance(b, OpenAIChat) and a is not b


def test_known_dialects_and_register() -> None:
    assert {"openai.chat", "openai.completions"} <= set(KNOWN_DIALECTS)
    saved_registry, saved_names = list(REGISTRY), list(KNOWN_DIALECTS)

    def boom(method: str, path: str, request: Any) -> bool:
        raise RuntimeError("buggy matcher")

    try:
        register("broken", boom, OpenAIChat, insert=True)
        register("test.x", lambda m, p, r: p == "/x", OpenAICompletions)
        assert "test.x" in KNOWN_DIALECTS
        assert isinstance(select_dialect("POST", "/x?y", None), OpenAICompletions)
        assert isinstance(select_dialect("POST", "/v1/chat/completions", None), OpenAIChat)
    finally:
        REGISTRY[:] = saved_registry
        KNOWN_DIALECTS[:] = saved_names


def test_normalize_path() -> None:
    assert normalize_path("/v1/chat/completions?x=1&y=/z") == "/v1/chat/completions"
    assert normalize_path("https://api.example.com") == "/"
    assert normalize_path("/") == "/"
    assert normalize_path("//") == "/"


def test_fast_delta_constructor_matches_delta() -> None:
    from sniffer.llm.dialects import openai as mod

    args = (1, CONTENT, "t", "r", "[]", "stop", "{}", Usage.parse({}), None)
    fast = mod._delta(*args)
    slow = Delta(
        1,
        CONTENT,
        text="t",
        reasoning="r",
        tool_calls="[]",
        finish_reason="stop",
        logprobs="{}",
        usage=Usage.parse({}),
        raw=None,
    )
    assert type(fast) is Delta
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert fast.error is None and fast.server_tokens is None
    with pytest.raises(AttributeError):
        fast.text = "x"  # type: ignore[misc]


# ---------------------------------------------------------------------------
# Server-reported speculative decoding and timings (vLLM, llama.cpp, SGLang)
# ---------------------------------------------------------------------------

VLLM_SPEC = {
    "num_spec_steps": 4,
    "num_draft_tokens": 12,
    "num_accepted_draft_tokens": 7,
    "mean_acceptance_length": 2.75,
    "draft_acceptance_rate": 7 / 12,
    "acceptance_histogram": [1, 1, 1, 1],
    "per_step_accepted": [0, 1, 3, 2],
    "per_step_drafted": [3, 3, 3, 3],
}


def _spec_of(data: str, stream: bool = True) -> tuple[Usage | None, str]:
    d = OpenAIChat().event(data, "message") if stream else OpenAIChat().body(data)
    usage = next((x.usage for x in d if x.usage is not None), None)
    return usage, usage_json(usage) or ""


def test_vllm_per_request_spec_decode_metrics_streamed_and_whole() -> None:
    """vLLM's ``metrics.speculative_decoding``: on the final usage chunk of a
    stream, and in a non-streamed body; typed, and kept in the usage JSON."""
    usage_obj = {"prompt_tokens": 5, "completion_tokens": 11}
    data = js({"choices": [], "usage": usage_obj, "metrics": {"speculative_decoding": VLLM_SPEC}})
    usage, stored = _spec_of(data)
    assert usage is not None and usage.speculative is not None
    sd = usage.speculative
    assert (sd.source, sd.draft_tokens, sd.accepted_tokens, sd.steps) == ("vllm", 12, 7, 4)
    assert (sd.accept_length, sd.acceptance_rate) == (2.75, 7 / 12)
    assert sd.histogram == (1, 1, 1, 1) and sd.rejected == ()
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 11)
    assert json.loads(stored)["metrics"]["speculative_decoding"] == VLLM_SPEC
    body = js(
        {
            "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": usage_obj,
            "metrics": {"speculative_decoding": VLLM_SPEC},
        }
    )
    whole, _ = _spec_of(body, stream=False)
    assert whole is not None and whole.speculative == sd


def test_llamacpp_timings_typed_with_draft_counts() -> None:
    timings = {"prompt_n": 9, "prompt_ms": 12.5, "predicted_n": 30, "predicted_ms": 410.0}
    timings |= {"draft_n": 40, "draft_n_accepted": 22, "predicted_per_second": 73.2}
    data = chat_chunk({"index": 0, "delta": {}, "finish_reason": "stop"}, timings=timings)
    usage, _ = _spec_of(data)
    assert usage is not None and usage.timings is not None and usage.speculative is not None
    assert usage.timings == ServerTimings(
        prompt_n=9, prompt_ms=12.5, predicted_n=30, predicted_ms=410.0, rejected=()
    )
    sd = usage.speculative
    assert (sd.source, sd.draft_tokens, sd.accepted_tokens) == ("llama.cpp", 40, 22)
    assert sd.acceptance_rate == 22 / 40 and sd.steps is None and sd.accept_length is None
    # plain llama.cpp timings (no drafting): timings only
    plain, _ = _spec_of(chat_chunk({"index": 0, "delta": {}}, timings={"predicted_n": 3}))
    assert plain is not None and plain.speculative is None
    assert plain.timings is not None and plain.timings.predicted_n == 3


def test_sglang_meta_info_spec_fields_only() -> None:
    """SGLang's ``meta_info`` (per choice, non-streamed): its ``spec_*``
    fields are read and kept; the rest of meta_info (logprob arrays, …) is not."""
    meta = {
        "spec_verify_ct": 3,
        "spec_num_proposed_drafts": 9,
        "spec_num_correct_drafts": 4,
        "spec_accept_length": 7 / 3,
        "spec_accept_rate": 4 / 9,
        "output_token_logprobs": [[-0.1, 1, None]] * 50,
    }
    body = js(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"content": "x"},
                    "finish_reason": "stop",
                    "meta_info": meta,
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 7},
        }
    )
    usage, stored = _spec_of(body, stream=False)
    assert usage is not None and usage.speculative is not None
    sd = usage.speculative
    assert (sd.source, sd.draft_tokens, sd.accepted_tokens, sd.steps) == ("sglang", 9, 4, 3)
    assert (sd.accept_length, sd.acceptance_rate) == (7 / 3, 4 / 9)
    assert (
        "output_token_logprobs" not in stored
        and json.loads(stored)["meta_info"]["spec_verify_ct"] == 3
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_draft_tokens", -1),
        ("num_draft_tokens", 2**63),
        ("num_draft_tokens", True),
        ("num_draft_tokens", "12"),
        ("num_spec_steps", 1.5),
        ("mean_acceptance_length", -0.5),
        ("mean_acceptance_length", 1e300),
        ("draft_acceptance_rate", 1.5),
        ("draft_acceptance_rate", float("nan")),
        ("acceptance_histogram", [1, -2]),
        ("acceptance_histogram", "1,2"),
        ("acceptance_histogram", list(range(2000))),
        ("num_accepted_draft_tokens", 13),  # more accepted than drafted
    ],
)
def test_spec_decode_out_of_range_is_rejected_and_named(field: str, value: Any) -> None:
    """Hostile numbers: the value is dropped and named in ``rejected``; every
    other field is kept, the chunk is not invalid."""
    spec = {**VLLM_SPEC, field: value}
    data = json.dumps(
        {"choices": [], "usage": {"prompt_tokens": 1}, "metrics": {"speculative_decoding": spec}}
    )
    (d,) = OpenAIChat().event(data, "message")
    assert d.kind == USAGE and d.usage is not None and d.usage.speculative is not None
    sd = d.usage.speculative
    assert sd.rejected == (field,)
    name = {
        "num_draft_tokens": "draft_tokens",
        "num_spec_steps": "steps",
        "mean_acceptance_length": "accept_length",
        "draft_acceptance_rate": "acceptance_rate",
        "acceptance_histogram": "histogram",
        "num_accepted_draft_tokens": "accepted_tokens",
    }[field]
    # a rate or length the server sent wrong is derived from its counts instead
    derived = {"accept_length": 1 + 7 / 4, "acceptance_rate": 7 / 12, "histogram": ()}
    assert getattr(sd, name) == derived.get(name)
    assert d.usage.prompt_tokens == 1


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                *sorted(VLLM_SPEC),
                *("draft_n", "draft_n_accepted", "prompt_ms", "spec_verify_ct", "spec_accept_rate"),
            ]
        ),
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=3)
        | st.lists(st.integers(), max_size=5),
    )
)
def test_spec_decode_never_raises_and_stays_in_range(obj: dict[str, Any]) -> None:
    for data in (
        {"choices": [], "metrics": {"speculative_decoding": obj}},
        {"choices": [], "timings": obj},
        {"choices": [], "meta_info": obj},
    ):
        for d in OpenAIChat().event(json.dumps(data), "message"):
            sd = d.usage.speculative if d.usage is not None else None
            if sd is None:
                continue
            for n in (sd.draft_tokens, sd.accepted_tokens, sd.steps, *sd.histogram):
                assert n is None or 0 <= n <= 10**9
            assert sd.acceptance_rate is None or 0.0 <= sd.acceptance_rate <= 1.0
            assert sd.accept_length is None or 0.0 <= sd.accept_length <= 1e4
            if sd.accepted_tokens is not None and sd.draft_tokens is not None:
                assert sd.accepted_tokens <= sd.draft_tokens


def test_a_derived_accept_length_out_of_range_is_not_kept() -> None:
    """vLLM without ``mean_acceptance_length``: 1 + accepted / steps is derived,
    and held to the same range (10,000 accepted in one step is not believed);
    the counts, each in range, are kept."""
    data = {
        "choices": [],
        "metrics": {
            "speculative_decoding": {
                "num_draft_tokens": 10_000,
                "num_accepted_draft_tokens": 10_000,
                "num_spec_steps": 1,
            }
        },
    }
    (d,) = [d for d in OpenAIChat().event(json.dumps(data), "message") if d.usage is not None]
    assert d.usage is not None and d.usage.speculative is not None
    sd = d.usage.speculative
    assert (sd.draft_tokens, sd.accepted_tokens, sd.steps) == (10_000, 10_000, 1)
    assert sd.accept_length is None and sd.acceptance_rate == 1.0
