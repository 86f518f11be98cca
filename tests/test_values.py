"""Typed LLM values (sniffer.llm.values): usage and request summary, parsed once."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import StreamOpened
from sniffer.llm.dialects.anthropic import AnthropicMessages
from sniffer.llm.dialects.base import OUTPUT_KINDS, STREAM_LEVEL
from sniffer.llm.dialects.ollama import OllamaChat, OllamaGenerate
from sniffer.llm.dialects.openai import OpenAIChat, OpenAICompletions
from sniffer.llm.dialects.responses import OpenAIResponses
from sniffer.llm.dialects.tgi import TgiGenerate
from sniffer.llm.tokens import ChunkInput, StreamInput, TokenizerRegistry, analyze_streams
from sniffer.llm.values import (
    EMPTY_REQUEST,
    MAX_SCANNED_KEYS,
    MAX_USAGE_DEPTH,
    UNREAD,
    RequestSummary,
    Usage,
    scan_request,
)
from sniffer.store.models import PLAIN_HTTP
from sniffer.store.writer import StoreWriter, usage_json


def js(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------- Usage.parse


@pytest.mark.parametrize(
    ("raw", "prompt", "completion"),
    [
        # OpenAI chat / completions (and TGI, whose dialect names them so)
        ({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}, 3, 5),
        # Responses, Anthropic
        ({"input_tokens": 4, "output_tokens": 6}, 4, 6),
        ({"output_tokens": 6}, None, 6),
        # Ollama: the store writes its evaluation counters as token counts
        ({"prompt_eval_count": 2, "eval_count": 1, "total_duration": 5}, 2, 1),
        # wrong types are no counts; the first usable name wins
        ({"prompt_tokens": "3", "completion_tokens": True}, None, None),
        ({"prompt_tokens": "3", "input_tokens": 7}, 7, None),
        ([1, 2], None, None),
        ("x", None, None),
    ],
)
def test_usage_counts_under_every_dialects_names(
    raw: Any, prompt: int | None, completion: int | None
) -> None:
    u = Usage.parse(raw)
    assert u is not None and u.raw is raw
    assert (u.prompt_tokens, u.completion_tokens) == (prompt, completion)
    assert u.is_object is isinstance(raw, dict)


def test_usage_null_is_none() -> None:
    assert Usage.parse(None) is None
    assert Usage.loads(None) is None and Usage.loads("") is None
    assert Usage.loads("{broken") is None
    u = Usage.loads('{"prompt_tokens":1}')
    assert u is not None and u.prompt_tokens == 1


def test_usage_reasoning_and_total() -> None:
    u = Usage.parse(
        {
            "prompt_tokens": 5,
            "completion_tokens": 9,
            "total_tokens": 14,
            "completion_tokens_details": {"reasoning_tokens": 4},
        }
    )
    assert u is not None and (u.reasoning_tokens, u.total_tokens) == (4, 14)
    r = Usage.parse({"output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 2}})
    assert r is not None and r.reasoning_tokens == 2


def test_usage_tokenizer_counts_leave_out_ollama_eval_counters() -> None:
    """The store reads Ollama's counters (the old writer decoder did); the
    token check does not compare them (the old token decoder did not)."""
    ollama = Usage.parse({"prompt_eval_count": 26, "eval_count": 9})
    assert ollama is not None
    assert (ollama.prompt_tokens, ollama.completion_tokens) == (26, 9)
    assert ollama.tokenizer_counts() == (None, None)
    openai = Usage.parse({"prompt_tokens": 26, "completion_tokens": 9})
    assert openai is not None and openai.tokenizer_counts() == (26, 9)
    anthropic = Usage.parse({"input_tokens": 26, "output_tokens": 9})
    assert anthropic is not None and anthropic.tokenizer_counts() == (26, 9)


def test_usage_is_immutable_hashable_and_pickles() -> None:
    u = Usage.parse({"prompt_tokens": 1, "completion_tokens": 2})
    assert u is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        u.prompt_tokens = 5  # type: ignore[misc]
    assert hash(u) == hash(Usage.parse({"prompt_tokens": 1, "completion_tokens": 2}))
    assert pickle.loads(pickle.dumps(u)) == u
    assert not hasattr(u, "__dict__")


def test_usage_nested_absurdly_deep_is_bad_input() -> None:
    deep: Any = 1
    for _ in range(MAX_USAGE_DEPTH + 1):
        deep = {"x": deep}
    with pytest.raises(ValueError, match="deeper"):
        Usage.parse(deep)
    # a dialect records it as an INVALID item instead of raising
    (d,) = OpenAIChat().event(js({"choices": [], "usage": deep}), "message")
    assert d.kind == "invalid" and d.usage is None


# --------------------------------------------- every dialect's usage, parsed once


def _usage_of(deltas: list[Any]) -> Usage:
    found = [d.usage for d in deltas if d.usage is not None]
    assert found, deltas
    return found[-1]


def test_every_dialect_hands_a_typed_usage_with_its_counts() -> None:
    cases: list[tuple[Any, str, tuple[int | None, int | None]]] = [
        (
            OpenAIChat(),
            js({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
            (7, 3),
        ),
        (
            OpenAICompletions(),
            js(
                {
                    "choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 2, "completion_tokens": 1},
                }
            ),
            (2, 1),
        ),
        (
            OllamaGenerate(),
            js(
                {
                    "model": "m",
                    "response": "",
                    "done": True,
                    "prompt_eval_count": 26,
                    "eval_count": 9,
                }
            ),
            (26, 9),
        ),
        (
            OllamaChat(),
            js(
                {
                    "model": "m",
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "prompt_eval_count": 4,
                    "eval_count": 5,
                }
            ),
            (4, 5),
        ),
        (
            TgiGenerate(),
            js(
                {
                    "token": {"id": 1, "text": "x", "logprob": 0.0, "special": False},
                    "generated_text": "x",
                    "details": {
                        "finish_reason": "length",
                        "generated_tokens": 1,
                        "input_length": 3,
                    },
                }
            ),
            (3, 1),
        ),
    ]
    for dialect, item, counts in cases:
        u = _usage_of(
            dialect.event(item, "ndjson" if "Ollama" in type(dialect).__name__ else "message")
        )
        assert (u.prompt_tokens, u.completion_tokens) == counts, type(dialect).__name__


def test_anthropic_usage_is_a_snapshot_of_the_merged_counts() -> None:
    a = AnthropicMessages()
    start = a.event(
        js(
            {
                "type": "message_start",
                "message": {
                    "id": "m1",
                    "model": "c",
                    "usage": {"input_tokens": 25, "output_tokens": 1},
                },
            }
        ),
        "message_start",
    )
    first = a.event(
        js({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 7}}), "message_delta"
    )
    last = a.event(
        js(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 15},
            }
        ),
        "message_delta",
    )
    assert _usage_of(start).raw == {"input_tokens": 25, "output_tokens": 1}
    u1, u2 = _usage_of(first), _usage_of(last)
    assert (u1.prompt_tokens, u1.completion_tokens) == (25, 7)  # not changed by the later delta
    assert (u2.prompt_tokens, u2.completion_tokens) == (25, 15)


def test_responses_usage() -> None:
    body = js(
        {
            "id": "r",
            "model": "m",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "hi"}],
                }
            ],
            "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
        }
    )
    u = _usage_of(OpenAIResponses().body(body))
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (5, 2, 7)


def test_store_writes_the_usage_json_the_dialect_received() -> None:
    raw = {"prompt_tokens": 1, "completion_tokens": 2, "timings": {"predicted_ms": 1.5}, "名": "é"}
    assert usage_json(Usage.parse(raw)) == js(raw)
    assert usage_json(Usage.parse([1, 2])) == "[1,2]"
    assert usage_json(None) is None


# ------------------------------------------- the two old decoders, both kept


def _analyze(usage: Usage | None) -> dict[str, int]:
    registry = TokenizerRegistry()
    s = StreamInput(
        stream_id=1,
        model="deepseek-v4",
        request={"model": "deepseek-v4", "messages": [{"role": "user", "content": "hi"}]},
        chunks=[ChunkInput(1, 0, "Hello there", "stop", None)],
        usage=usage,
        gap=False,
        done_seen=True,
        include_usage_requested=False,
    )
    (res,) = analyze_streams(registry, [s])
    return dict(res.usage_diff)


def test_token_check_compares_openai_and_anthropic_counts_not_ollama_counters() -> None:
    assert set(_analyze(Usage.parse({"prompt_tokens": 1, "completion_tokens": 50}))) == {
        "prompt_tokens",
        "completion_tokens",
    }
    assert set(_analyze(Usage.parse({"input_tokens": 1, "output_tokens": 50}))) == {
        "prompt_tokens",
        "completion_tokens",
    }
    assert _analyze(Usage.parse({"prompt_eval_count": 1, "eval_count": 50})) == {}
    assert _analyze(Usage.parse([1])) == {}


def test_store_keeps_ollama_counts_in_the_token_columns(tmp_path: Any) -> None:
    from sniffer.core.events import StreamClosed, StreamState
    from sniffer.store import queries

    w = StoreWriter(str(tmp_path / "t.db"))
    w.write(_opened(1, None))
    w.write(
        StreamClosed(
            1, 1.0, StreamState.COMPLETE, "ok", True, False, None, None, 0, 0, 0, (),
            Usage.parse({"prompt_eval_count": 26, "eval_count": 9}), None,
        )
    )  # fmt: skip
    w.flush()
    row = queries.get_stream(w.store, 1)
    w.close()
    assert row is not None
    assert (row["prompt_tokens"], row["completion_tokens"]) == (26, 9)
    assert row["usage"] == '{"prompt_eval_count":26,"eval_count":9}'
    assert row["dialect"] == PLAIN_HTTP  # dialect None is stored as before


# ---------------------------------------------------------------- RequestSummary


def test_request_summary_types_untrusted_fields_once() -> None:
    r = RequestSummary.parse(
        {
            "model": "m",
            "stream": True,
            "temperature": 0,
            "top_p": "high",
            "top_k": 40,
            "max_completion_tokens": 16,
            "n": 2,
            "seed": 2**70,
            "logprobs": True,
            "top_logprobs": 3,
            "stream_options": {"include_usage": True},
            "messages": [{}, {}],
        }
    )
    assert r == RequestSummary(
        model="m",
        stream=True,
        temperature=0.0,
        top_k=40,
        max_tokens=16,
        n=2,
        logprobs=True,
        top_logprobs=3,
        prompt_len=2,
        include_usage=True,
        out_of_range=("seed",),
    )
    assert r.present() == (
        "model",
        "stream",
        "temperature",
        "top_k",
        "max_tokens",
        "n",
        "logprobs",
        "top_logprobs",
        "prompt_len",
        "include_usage",
        "out_of_range",
    )
    # false, zero and empty are set values; only None, include_usage false and
    # no out-of-range field are left out
    quiet = RequestSummary.parse({"temperature": 0, "logprobs": False, "stream": False})
    assert quiet.present() == ("stream", "temperature", "logprobs")
    assert repr(quiet) == "RequestSummary(stream=False, temperature=0.0, logprobs=False)"
    assert EMPTY_REQUEST.present() == () and repr(EMPTY_REQUEST) == "RequestSummary()"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # TGI parameters, Ollama options: lifted to the same names
        (
            {"inputs": "x", "parameters": {"temperature": 0.5, "max_new_tokens": 9, "seed": 1}},
            RequestSummary(temperature=0.5, max_tokens=9, seed=1, prompt_len=1),
        ),
        (
            {"model": "l", "prompt": "x", "options": {"num_predict": 4, "top_k": 5}},
            RequestSummary(model="l", max_tokens=4, top_k=5, prompt_len=1),
        ),
        # Anthropic system counts as a message; Responses max_output_tokens
        (
            {"model": "c", "system": "s", "messages": [{}], "max_tokens": 10},
            RequestSummary(model="c", max_tokens=10, prompt_len=2),
        ),
        (
            {"model": "r", "input": "x", "max_output_tokens": 7},
            RequestSummary(model="r", max_tokens=7, prompt_len=1),
        ),
        # completions logprobs is a number; an invalid max_tokens falls through
        (
            {"prompt": ["a", "b"], "logprobs": 5, "max_tokens": "9", "max_completion_tokens": 3},
            RequestSummary(logprobs=5, max_tokens=3, prompt_len=2),
        ),
        ({"temperature": [[[[1]]]], "stream_options": {"include_usage": "yes"}}, EMPTY_REQUEST),
        ([1, 2], EMPTY_REQUEST),
        (None, EMPTY_REQUEST),
    ],
)
def test_request_summary_per_dialect(body: Any, expected: RequestSummary) -> None:
    assert RequestSummary.parse(body) == expected


def test_request_summary_is_immutable() -> None:
    r = RequestSummary(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.model = "x"  # type: ignore[misc]
    assert repr(r) == "RequestSummary(model='m')"
    assert pickle.loads(pickle.dumps(r)) == r


# ---------------------------------------------------------------- dialect None


def _opened(sid: int, dialect: str | None) -> StreamOpened:
    return StreamOpened(
        sid, 1, 0, 0.0, ("127.0.0.1", 1), ("127.0.0.1", 2), "GET", "/", (), None, dialect=dialect
    )


def test_not_an_llm_stream_is_dialect_none() -> None:
    ev = _opened(1, None)
    assert ev.dialect is None and ev.request is EMPTY_REQUEST
    assert STREAM_LEVEL == -1 and {"content", "reasoning", "tool_call"} == OUTPUT_KINDS


# ------------------------------------------- the start of a cut request (#24)

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet='ab"\\{}[]:,\u00e9\u4e2d \n', max_size=12),
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["model", "n", "stream", 'k"}']), inner, max_size=3),
    ),
    max_leaves=8,
)
_request_keys = ["model", "stream", "messages", "n", "temperature", "stream_options", "seed"]


@settings(max_examples=150, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(_request_keys), _json_value, min_size=1),
    compact=st.booleans(),
    data=st.data(),
)
def test_scan_request_reads_exactly_the_whole_top_level_values_of_any_prefix(
    body: dict[str, Any], compact: bool, data: st.DataObject
) -> None:
    """Cut anywhere, the scan gives the object's first keys in order, each with
    its value when it was read (never a wrong one, never a nested key); the
    whole text gives the whole object."""
    text = json.dumps(body, separators=(",", ":") if compact else (", ", ": "))
    assert scan_request(text) == body
    for cut in data.draw(st.lists(st.integers(0, len(text)), max_size=12)):
        got = scan_request(text[:cut])
        assert list(got) == list(body)[: len(got)], text[:cut]
        for key, value in got.items():
            assert value is UNREAD or value == body[key], (text[:cut], key)


def test_scan_request_on_hostile_starts() -> None:
    assert scan_request("") == {} and scan_request("[1, 2") == {} and scan_request("{") == {}
    assert scan_request('{"n": 2, "temperature": 0.7') == {"n": 2, "temperature": UNREAD}
    assert scan_request('{"n": 2, "stream": tru') == {"n": 2, "stream": UNREAD}
    # nesting deeper than the decoder goes: that value is unread, no exception
    assert scan_request('{"n": 1, "x": ' + "[" * 100_000) == {"n": 1, "x": UNREAD}
    # a number too long for int(): unread
    assert scan_request('{"seed": ' + "9" * 5000 + ', "n": 1}')["seed"] is UNREAD
    # keys inside strings and nested objects are not top-level keys
    got = scan_request('{"messages": [{"model": "evil", "content": "\\"n\\": 9"}], "model": "m"')
    assert got == {"messages": [{"model": "evil", "content": '"n": 9'}], "model": "m"}
    # at most MAX_SCANNED_KEYS keys are read
    many = "{" + ",".join(f'"k{i}": {i}' for i in range(3 * MAX_SCANNED_KEYS)) + ","
    assert len(scan_request(many)) == MAX_SCANNED_KEYS


def test_a_cut_request_gives_the_summary_of_its_start() -> None:
    text = json.dumps(
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_output_tokens": 5,
            "top_p": 0.9,
            "messages": [{"role": "user", "content": "x" * 100}],
            "temperature": 0.1,
        }
    )[:-40]
    summary = RequestSummary.parse(scan_request(text))
    assert summary == RequestSummary(
        model="m", stream=True, include_usage=True, max_tokens=5, top_p=0.9
    )
    assert summary.prompt_len is None  # the messages were cut: not counted


def test_request_summary_out_of_range_order_and_first_max_tokens() -> None:
    # the max_tokens names are typed in order up to the first integer in range
    # (those after it are not looked at), then the other integer fields in
    # field order; each out-of-range one is named once, in that order
    big = 2**70
    r = RequestSummary.parse(
        {
            "prompt": "p",
            "top_logprobs": big,
            "logprobs": -big,
            "seed": big,
            "n": 2**31,
            "top_k": big,
            "max_output_tokens": big,
            "max_completion_tokens": 7,
            "max_tokens": big,
        }
    )
    assert r.max_tokens == 7 and r.prompt_len == 1
    assert (r.top_k, r.n, r.seed, r.logprobs, r.top_logprobs) == (None,) * 5
    assert r.out_of_range == ("max_tokens", "top_k", "n", "seed", "logprobs", "top_logprobs")
    # a bool is no integer (never out of range); logprobs keeps it
    r = RequestSummary.parse({"max_tokens": True, "n": False, "logprobs": True, "seed": 1.0})
    assert (r.max_tokens, r.n, r.logprobs, r.seed, r.out_of_range) == (None, None, True, None, ())
    r = RequestSummary.parse({"max_tokens": big, "max_output_tokens": big})
    assert r.max_tokens is None and r.out_of_range == ("max_tokens", "max_output_tokens")


@pytest.mark.parametrize(
    "path",
    [
        "sniffer.llm.values.RequestSummary",
        "sniffer.llm.tokens.Anomaly",
        "sniffer.llm.tokens.StreamInput",
        "sniffer.llm.tokens.ChoiceChunks",
        "sniffer.llm.tokens.StreamTokens",
        "sniffer.store.tokens_store.ChoiceTokenRow",
        "sniffer.store.tokens_store.StreamTokenRow",
        *(
            f"sniffer.core.events.{name}"
            for name in (
                "ConnectionOpened",
                "ConnectionClosed",
                "HttpRequest",
                "HttpResponse",
                "HttpEnd",
                "StreamOpened",
                "StreamResponse",
                "StreamClosed",
                "ChunkEvent",
            )
        ),
    ],
)
def test_values_made_per_request_stream_or_anomaly_have_the_slot_init(path: str) -> None:
    """The values made once per request, stream or token anomaly, and the
    events made once per connection, exchange or chunk, get ``slot_init``'s
    ``__init__`` (the slots' setters, not ``object.__setattr__``): same
    parameters and defaults (a default factory's value new in each object),
    frozen, equal to what ``replace`` gives."""
    import importlib

    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert "_set0" in cls.__init__.__globals__, cls  # the fast one
    fields = dataclasses.fields(cls)
    missing = dataclasses.MISSING
    required = [f for f in fields if f.default is missing and f.default_factory is missing]
    args = {f.name: (f"v-{f.name}",) for f in required}
    obj, other = cls(**args), cls(**args)
    for f in fields:  # the given values, and the declared defaults
        if f.default_factory is not missing:
            value = getattr(obj, f.name)
            assert value == f.default_factory() and value is not getattr(other, f.name)
        else:
            assert getattr(obj, f.name) is args.get(f.name, f.default), (cls, f.name)
    positional = cls(*[args.get(f.name, getattr(obj, f.name)) for f in fields])
    assert positional == obj
    if all(f.default_factory is missing for f in fields):  # (a dict is no key)
        assert hash(positional) == hash(obj)
    assert dataclasses.replace(obj) == obj
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, fields[0].name, 1)
    with pytest.raises(TypeError):
        cls(*[None] * (len(fields) + 1))


def test_slot_init_refuses_what_it_cannot_set() -> None:
    """A field not in ``__init__`` is refused at class creation, not silently
    left unset; one with a default factory gets a new value per object, or
    the one given (the factory not called)."""
    from sniffer.llm.values import slot_init

    with pytest.raises(TypeError, match="not supported by slot_init"):

        @slot_init
        @dataclasses.dataclass(frozen=True, slots=True)
        class _NotInit:
            items: list[int] = dataclasses.field(default_factory=list, init=False)

    made: list[int] = []

    def factory() -> list[int]:
        made.append(1)
        return []

    @slot_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class _WithFactory:
        first: int
        items: list[int] = dataclasses.field(default_factory=factory)
        last: int = 3

    a, b = _WithFactory(1), _WithFactory(1, last=4)
    assert (a.items, b.items, a.last, b.last, len(made)) == ([], [], 3, 4, 2)
    assert a.items is not b.items
    given = [5]
    c = _WithFactory(2, given)
    assert c.items is given and len(made) == 2
    assert c == _WithFactory(first=2, items=[5], last=3)


def _loads_or_none(text: str | None) -> Any:
    """What the token pass's request parsing was: ``json.loads``, None for NULL,
    an empty text or an error."""
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "{}",
        '{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}',
        '{"a": 1} ',
        '{"a": 1}\n',
        ' {"a": 1}',
        '{"a": 1}x',
        '{"a": 1}{"b": 2}',
        '{"a": 1',
        "{",
        '{"a": NaN, "b": Infinity}',
        '{"a": 123456789012345678901234567890}',
        '{"a": -9223372036854775809, "b": 18446744073709551616}',  # past 64 bits
        '{"a": 9223372036854775807, "b": -9223372036854775808}',
        '{"a": [0.1, -0.0, 5e-324, 1.5e300, 2.2250738585072011e-308]}',
        '{"a": 1e400, "b": -1e400}',  # past a double: json gives infinities
        '{"a": 0.12345678901234567890123}',  # a long mantissa
        '{"a": "\\ud800"}',
        '{"a": 1, "a": 2}',
        "\ufeff{}",
        "[1, 2]",
        "3",
        "nope",
        '{"a": "\x01"}',
        "{" + '"a":[' * 5000 + "]" * 5000 + "}",
    ],
)
def test_json_or_none_is_json_loads_or_none(text: str | None) -> None:
    """The fast path (an object read to its end by the C scanner) gives what
    ``json.loads`` gives, and every other text goes through it: trailing or
    leading whitespace, extra data, cut texts, NaN, big integers, lone
    surrogates, a BOM, other values, control characters, too deep."""
    from sniffer.llm.values import json_or_none

    got, want = json_or_none(text), _loads_or_none(text)
    assert got == want or (got != got and want != want)  # (NaN: not equal to itself)
    assert type(got) is type(want)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    ),
    st.sampled_from(["", " ", "x", "}", "\n"]),
)
def test_json_or_none_on_any_object(value: Any, tail: str) -> None:
    """Any JSON object text, as written or with something after it."""
    from sniffer.llm.values import json_or_none

    text = json.dumps({"v": value}) + tail
    assert json_or_none(text) == _loads_or_none(text)
