"""The native OpenAI chunk extraction (``native/core/src/openai.rs``, issue #25)
against the Python dialects (``sniffer/llm/dialects/openai.py``, the reference).

The OpenAI dialects hand each streamed item to ``sniffer._native.openai_chunk``
when the native core runs; it returns the deltas for the common case and None
("not mine") for anything it is not sure of, which the Python then handles.
Here every item of every bundled capture, generated chunks (random shapes,
escapes, numbers at their edges, duplicate keys, lone surrogates) and fuzz
mutations of the captured items go through a dialect with the native
extraction and one without: the deltas (field by field, types included) and
the reply's model and id must be the same. Replays of a few captures with each
core must write the same store.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sniffer.capture.pcap import read_capture
from sniffer.core import native as core_native
from sniffer.core.pipeline import Pipeline, PipelineConfig
from sniffer.llm.dialects import openai
from sniffer.llm.dialects.base import Delta

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from fuzz import MUTATIONS, edge_ints, mutate  # noqa: E402

pytestmark = [
    pytest.mark.native,
    pytest.mark.filterwarnings("ignore:Generating overly large repr"),
    pytest.mark.skipif(
        openai._NATIVE_CHUNK is None,
        reason=f"the native core is not available ({core_native.UNAVAILABLE or 'SPARSEETY_PURE'})",
    ),
]

#: Least share of a capture's JSON items (not ``[DONE]``, not empty) that the
#: native extraction must take: all but usage, timings, errors and bad input.
MIN_NATIVE_SHARE = 0.99


@contextmanager
def reference() -> Iterator[None]:
    """The pure-Python dialects only."""
    with mock.patch.object(openai, "_NATIVE_CHUNK", None):
        yield


def _dialect(chat: bool) -> openai.OpenAIChat | openai.OpenAICompletions:
    return openai.OpenAIChat() if chat else openai.OpenAICompletions()


def strict(deltas: list[Delta]) -> list[tuple[Any, ...]]:
    """Deltas compared with their fields' types (``1 == True`` otherwise)."""
    assert all(type(d) is Delta for d in deltas)
    return [tuple((type(f).__name__, f) for f in d) for d in deltas]


def check_items(chat: bool, items: list[tuple[str, str]]) -> int:
    """Feed ``(data, event_type)`` items in order to a dialect with the native
    extraction and one without; both must give the same deltas and names.
    Returns how many items the native extraction took."""
    nat, ref = _dialect(chat), _dialect(chat)
    chunk = openai._NATIVE_CHUNK
    assert chunk is not None
    taken = 0
    for data, event_type in items:
        want_name = not nat._named
        took = data and data != "[DONE]" and chunk(data, chat, want_name) is not None
        taken += bool(took)
        got = nat.event(data, event_type)
        with reference():
            expected = ref.event(data, event_type)
        assert strict(got) == strict(expected), data
        assert (nat.response_model, nat.response_id, nat._named) == (
            ref.response_model,
            ref.response_id,
            ref._named,
        ), data
    return taken


# ------------------------------------------------------------ the captures


def captures() -> list[Path]:
    return sorted(p for p in (REPO / "pcaps").rglob("*.pcap") if p.is_file())


@cache
def capture_items(path: Path) -> list[tuple[bool, list[tuple[str, str]]]]:
    """Each OpenAI exchange of the capture: (chat, its items in order), as the
    streams stage hands them to the dialect on a replay."""
    # keyed by the dialect itself (held, so that no other one reuses its id)
    by_dialect: dict[int, tuple[openai._OpenAIBase, list[tuple[str, str]]]] = {}
    event = openai._OpenAIBase.event

    def record(self: openai._OpenAIBase, data: str, event_type: str) -> list[Delta]:
        by_dialect.setdefault(id(self), (self, []))[1].append((data, event_type))
        return event(self, data, event_type)

    with mock.patch.object(openai._OpenAIBase, "event", record):
        # the pure stages: the native SSE loop extracts most items without `event`
        pipe = Pipeline(PipelineConfig(native=False))
        last = 0.0
        for seg in read_capture(path):
            last = seg.ts
            pipe.feed(seg)
        pipe.flush(last + 1e6)
    return [(d._chat, items) for d, items in by_dialect.values()]


def test_the_captures_have_openai_items() -> None:
    counts = {p.name: sum(len(items) for _, items in capture_items(p)) for p in captures()}
    assert len(counts) > 50
    assert counts["chat_english.pcap"] > 30 and counts["completions.pcap"] > 30
    assert counts["llamacpp_spec.pcap"] > 200


@pytest.mark.parametrize("path", captures(), ids=lambda p: str(p.relative_to(REPO / "pcaps")))
def test_capture_items_give_the_same_deltas(path: Path) -> None:
    total = taken = 0
    for chat, items in capture_items(path):
        taken += check_items(chat, items)
        total += sum(1 for data, _ in items if data and data != "[DONE]")
    assert taken >= MIN_NATIVE_SHARE * total - 2, (taken, total)  # ≤ 2 usage/error items


@pytest.mark.parametrize(
    "name",
    [
        "llamacpp/llamacpp_plain.pcap",  # llama-cpp-python: logprobs on every chunk
        "llamacpp/llamacpp_spec.pcap",
        "llamacpp/llamacpp_kvq8.pcap",
        "include_usage.pcap",  # usage chunk with "choices": []
        "dialect_spec_llamacpp.pcap",  # llama.cpp's timings on the last chunk
        "dialect_spec_vllm.pcap",  # vLLM's metrics.speculative_decoding beside usage
        "n2.pcap",
        "reasoning_tools.pcap",
        "completions.pcap",
    ],
)
def test_real_server_shapes_are_all_native(name: str) -> None:
    """Every JSON item of these captures goes the native way."""
    for chat, items in capture_items(REPO / "pcaps" / name):
        json_items = [(d, e) for d, e in items if d and d != "[DONE]"]
        assert check_items(chat, json_items) == len(json_items)


# ------------------------------------------------------- generated chunks

INT_EDGES = (
    0,
    1,
    -1,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    10**18 - 1,
    10**18,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
)
ints = st.one_of(st.sampled_from(INT_EDGES), st.integers(-(2**70), 2**70), st.integers(0, 9))
#: values in [-2, -1) with 17 binary fraction digits: 18 significant decimal
#: digits ending in 5, a tie for the 17-digit shortest repr (float32 logprobs)
ties = st.integers(2**17, 2**18 - 1).map(lambda m: -m / 2**17)
floats = st.one_of(
    ties,
    st.floats(),  # NaN and infinities too (json.dumps writes NaN, Infinity)
    st.floats(width=32),  # float32 logprobs: exact ties for the shortest repr
    st.sampled_from((0.0, -0.0, 1e16, 1e-5, 1e-4, 5e-324, 1.7976931348623157e308, 0.5)),
)
texts = st.one_of(
    st.text(max_size=8),
    st.text(st.characters(codec=None, categories=None), max_size=6),  # lone surrogates
    st.sampled_from(("", "\ufffd", "\u2028", '"\\/', "\x00\x1f\x7f", "é😀", "  ")),
)
leaves = st.one_of(st.none(), st.booleans(), ints, floats, texts)
any_json = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=4), kids, max_size=3)
    ),
    max_leaves=8,
)


def typed(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``right`` (9 in 10), else null or any other JSON value."""
    return st.integers(0, 9).flatmap(lambda k: st.one_of(st.none(), any_json) if k == 9 else right)


def choice_of(
    ints: st.SearchStrategy[int], floats: st.SearchStrategy[float], texts: st.SearchStrategy[str]
) -> st.SearchStrategy[dict[str, Any]]:
    """Choice objects of chat and completions chunks, leaves drawn from these."""
    token_object = st.fixed_dictionaries(
        {"token": typed(texts), "logprob": typed(floats)},
        optional={
            "id": typed(ints),
            "token_id": typed(ints),
            "bytes": typed(st.lists(st.integers(0, 255), max_size=3)),
            "top_logprobs": st.lists(
                st.fixed_dictionaries(
                    {"token": texts, "logprob": floats}, optional={"id": ints, "token_id": ints}
                ),
                max_size=2,
            ),
        },
    )
    logprobs = typed(
        st.one_of(
            st.fixed_dictionaries(
                {}, optional={"content": st.lists(token_object, max_size=2), "refusal": st.none()}
            ),
            st.lists(token_object, max_size=2),
            st.fixed_dictionaries(  # completions: parallel lists
                {
                    "tokens": st.lists(texts, max_size=2),
                    "token_logprobs": st.lists(floats, max_size=2),
                    "top_logprobs": st.lists(
                        st.dictionaries(texts, floats, max_size=2), max_size=2
                    ),
                }
            ),
        )
    )
    tool_calls = typed(
        st.lists(
            st.fixed_dictionaries(
                {"index": ints},
                optional={
                    "id": texts,
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {}, optional={"name": texts, "arguments": texts}
                    ),
                },
            ),
            max_size=2,
        )
    )
    message = st.fixed_dictionaries(
        {},
        optional={
            "role": typed(st.sampled_from(("assistant", None))),
            "content": typed(texts),
            "reasoning_content": typed(texts),
            "reasoning": typed(texts),
            "tool_calls": tool_calls,
            "refusal": typed(texts),
        },
    )
    choice = st.fixed_dictionaries(
        {},
        optional={
            "index": typed(st.one_of(st.integers(0, 3), ints)),
            "delta": typed(message),
            "text": typed(texts),
            "finish_reason": typed(st.sampled_from(("stop", "length", "tool_calls", ""))),
            "stop_reason": typed(ints),
            "logprobs": logprobs,
            "meta_info": typed(st.dictionaries(st.sampled_from(("spec_verify_ct", "x")), ints)),
        },
    )
    return choice


choice = choice_of(ints, floats, texts)
#: leaves of the common case: 64-bit integers, finite floats, no lone surrogates
plain_ints = st.one_of(st.integers(0, 2**32), st.sampled_from(INT_EDGES))
plain_floats = st.one_of(
    ties,
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
)
plain_texts = st.one_of(
    st.text(max_size=8), st.sampled_from(("", "\ufffd", "\u2028", '"\\/', "\x00\x1f\x7f", "é😀"))
)
plain_choice = choice_of(plain_ints, plain_floats, plain_texts)


#: mostly what a server reports, now and then a number at an edge
counts = st.one_of(plain_ints, plain_ints, ints)
numbers = st.one_of(plain_floats, plain_floats, floats, counts)
usage = st.fixed_dictionaries(
    {}, optional={"prompt_tokens": counts, "completion_tokens": counts, "total_tokens": counts}
)
timings = st.fixed_dictionaries(
    {},
    optional={
        "prompt_n": counts,
        "prompt_ms": numbers,
        "predicted_n": counts,
        "predicted_ms": numbers,
        "draft_n": counts,
        "draft_n_accepted": counts,
    },
)
metrics = st.fixed_dictionaries(
    {},
    optional={
        "speculative_decoding": st.fixed_dictionaries(
            {},
            optional={
                "num_draft_tokens": counts,
                "num_accepted_tokens": counts,
                "draft_acceptance_rate": numbers,
                "acceptance_histogram": st.lists(counts, max_size=3),
            },
        )
    },
)
#: what servers send (the native extraction's share), a field off now and then
plausible_chunk = st.fixed_dictionaries(
    {
        "id": st.sampled_from(("chatcmpl-1", "cmpl-x")),
        "object": st.sampled_from(("chat.completion.chunk", "text_completion")),
        "model": typed(st.sampled_from(("m", "", "Qwen/Qwen3-0.6B"))),
        "choices": typed(st.lists(plain_choice, max_size=3)),
    },
    optional={
        "created": typed(plain_ints),
        "system_fingerprint": typed(plain_texts),
        "usage": st.one_of(st.none(), usage),
        "timings": st.one_of(st.none(), timings),
        "metrics": st.one_of(st.none(), metrics),
        "meta_info": st.one_of(
            st.none(),
            st.dictionaries(
                st.sampled_from(("spec_accept_rate", "spec_verify_ct", "e2e")), numbers
            ),
        ),
    },
)
#: every top-level field, usage and errors included
wild_chunk = st.fixed_dictionaries(
    {},
    optional={
        "id": typed(st.sampled_from(("chatcmpl-1", "", "cmpl-x"))),
        "object": typed(st.sampled_from(("chat.completion.chunk", "text_completion", "error"))),
        "created": typed(ints),
        "model": typed(st.sampled_from(("m", "", "Qwen/Qwen3-0.6B"))),
        "system_fingerprint": typed(texts),
        "choices": st.one_of(st.lists(choice, max_size=3), typed(st.lists(choice, max_size=1))),
        "usage": st.one_of(st.none(), usage, any_json),
        "timings": st.one_of(st.none(), timings),
        "metrics": st.one_of(st.none(), metrics),
        "meta_info": st.one_of(st.none(), st.dictionaries(st.just("spec_accept_rate"), floats)),
        "error": st.one_of(st.none(), texts, st.fixed_dictionaries({"message": texts})),
        "message": st.one_of(texts, st.fixed_dictionaries({"model": texts, "id": texts})),
        "response": st.fixed_dictionaries({"model": texts}),
    },
)


def render(obj: Any, style: int, dup: bool) -> str:
    """``obj`` as JSON text in one of several styles; ``dup``: the top-level
    object's first member repeated (with null) at its end."""
    if style == 0:
        text = json.dumps(obj)
    elif style == 1:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    else:
        text = json.dumps(obj, indent=1)
    if dup and type(obj) is dict and obj:
        key = json.dumps(next(iter(obj)))
        text = text.rstrip()[:-1].rstrip() + f", {key}: null}}"
    return text


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(plausible_chunk, plausible_chunk, wild_chunk), min_size=1, max_size=3),
    st.booleans(),
    st.integers(0, 2),
    st.integers(0, 9).map(lambda k: k == 9),
)
def test_generated_chunks_give_the_same_deltas(
    objs: list[dict[str, Any]], chat: bool, style: int, dup: bool
) -> None:
    check_items(chat, [(render(o, style, dup), "message") for o in objs])


@settings(max_examples=300)
@given(any_json, st.booleans())
def test_generated_json_values_give_the_same_deltas(obj: Any, chat: bool) -> None:
    check_items(
        chat, [(json.dumps(obj), "message"), (json.dumps(obj, ensure_ascii=False), "ndjson")]
    )


@settings(max_examples=300)
@given(st.lists(floats, min_size=1, max_size=4), st.booleans())
def test_floats_in_logprobs_are_python_reprs(values: list[float], chat: bool) -> None:
    entries = [{"token": "t", "logprob": v} for v in values]
    obj = {
        "choices": [
            {"index": 0, "delta": {"content": "x"}, "text": "x", "logprobs": {"content": entries}}
        ]
    }
    check_items(chat, [(json.dumps(obj), "message")])


@settings(max_examples=200)
@given(
    st.text(max_size=3), st.sampled_from(("\\ud800", "\\udfff", "\\ud83d\\ude00", "\\u0000", "\\/"))
)
def test_escapes_and_lone_surrogates(prefix: str, escape: str) -> None:
    content = json.dumps(prefix)[:-1] + escape + '"'
    data = '{"choices":[{"index":0,"delta":{"content":' + content + "}}]}"
    check_items(True, [(data, "message")])


@cache
def _corpus_items() -> list[tuple[bool, str]]:
    names = ("reasoning_tools.pcap", "n2.pcap", "completions.pcap", "chat_emoji.pcap")
    out = []
    for name in names:
        for chat, items in capture_items(REPO / "pcaps" / name):
            out += [(chat, d) for d, _ in items if d and d != "[DONE]"]
    out += [
        (True, d)
        for chat, items in capture_items(REPO / "pcaps" / "llamacpp" / "llamacpp_spec.pcap")
        for d, _ in items[:12]
    ]
    return out


@settings(max_examples=800)
@given(st.integers(0, 10**6), MUTATIONS)
def test_mutated_capture_items_give_the_same_deltas(k: int, ops: list[Any]) -> None:
    """The fuzz campaign's JSON mutations of captured items."""
    items = _corpus_items()
    chat, data = items[k % len(items)]
    mutated = mutate(data.encode(), ops).decode("utf-8", "replace")
    check_items(chat, [(mutated, "message")])


@settings(max_examples=300)
@given(st.integers(0, 10**6), st.integers(0, 64), st.booleans())
def test_edge_integers_in_capture_items(k: int, which: int, every: bool) -> None:
    """The fuzz campaign's integer edges (``fuzz.edge_ints``) in captured items."""
    items = _corpus_items()
    chat, data = items[k % len(items)]
    check_items(chat, [(edge_ints(data, which, every), "message")])


def test_hand_picked_items() -> None:
    cases = [
        '{"choices":[{"index":0,"delta":{"content":"a"}}],"choices":[]}',
        '{"model":"m","id":"i","choices":[{"delta":{"role":"assistant"}}]}',
        '{"model":"","message":{"model":"mm","id":"ii"},"choices":[]}',
        '{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":'
        '[{"token":"x","logprob":-1.3712844848632812,"id":4294967295}]}}]}',
        '{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":'
        '[{"token":"x","logprob":-1,"id":4294967296}]}}]}',
        '{"choices":[{"index":1e0,"delta":{}}]}',
        '{"choices":[{"index":-0,"delta":{"content":"x"}}]}',
        '{"choices":[{"index":0,"delta":{"content":"x"}}]} ',
        '\ufeff{"choices":[]}',
        '{"choices":[{"index":0,"delta":{"tool_calls":'
        '[{"function":{"arguments":"{\\"a\\": 1e400}"}}]}}]}',
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"x":1E400}]}}]}',
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"x":NaN}]}}]}',
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"x":123456789012345678901234}]}}]}',
        '{"choices":[{"index":0,"text":"t","finish_reason":"stop"}]}',
        '{"choices":[{"delta":{"role":null,"content":""}}]}',
        '{"choices":[{"delta":{"role":0}}]}',
        '{"choices":[{"delta":{"reasoning_content":null,"reasoning":"r"}}]}',
        '{"choices":[{"delta":{"reasoning_content":"","reasoning":"r"}}]}',
        '{"choices":[{"delta":{"tool_calls":[]},"finish_reason":""}]}',
        '{"choices":[{"delta":null,"finish_reason":null,"logprobs":null}]}',
        '{"choices":[{"delta":{"content":"a"}},{"index":0,"delta":{"content":"b"}}]}',
        '{"choices":null}',
        '{"choices":0}',
        "[]",
        " [DONE] ",
    ]
    for data in cases:
        for chat in (True, False):
            check_items(chat, [(data, "message"), (data, "error")])


# ---------------------------------------------------------------- the store

STORE_CAPTURES = (
    "llamacpp/llamacpp_spec.pcap",
    "reasoning_tools.pcap",
    "n2.pcap",
    "completions.pcap",
    "fffd.pcap",
    "include_usage.pcap",
    "faults/midway_openai_chat.pcap",
    "faults/sec_big_int.pcap",
)

DUMP = (
    "import sys; sys.path.insert(0, 'scripts'); from pathlib import Path; "
    "from replay_snapshot import dump; from sniffer.llm.dialects import openai; "
    "print(openai._NATIVE_CHUNK is not None); out = Path(sys.argv[1]); out.mkdir(); "
    "[dump(Path('pcaps', p), out, out) for p in sys.argv[2:]]"
)


def test_replays_write_the_same_store_with_either_core(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(core_native.PURE_ENV, None)
    native_on = {}
    for name, pure in (("pure", "1"), ("native", "")):
        res = subprocess.run(
            [sys.executable, "-c", DUMP, str(tmp_path / name), *STORE_CAPTURES],
            cwd=REPO,
            env={**env, core_native.PURE_ENV: pure} if pure else env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        native_on[name] = res.stdout.split()[0]
    assert native_on == {"pure": "False", "native": "True"}
    names = sorted(n for n in os.listdir(tmp_path / "pure") if ".db" not in n)
    assert len(names) >= 8 * len(STORE_CAPTURES)
    _, mismatch, errors = filecmp.cmpfiles(
        tmp_path / "pure", tmp_path / "native", names, shallow=False
    )
    assert not mismatch and not errors, f"differ: {mismatch[:20]} {errors[:20]}"
