"""The native byte-level BPE (``sniffer._native.BpeModel``) and the lazy
library tokenizer built on it (``LoadedTokenizer`` without a library
``Tokenizer`` until first need): the same ids, offsets, texts and lookups as
the tokenizers library, and the library left unloaded on ASCII texts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

import sniffer
from sniffer.llm.logprobs import ServerToken
from sniffer.llm.tokens import (
    ChunkInput,
    LoadedTokenizer,
    StreamInput,
    TokenizerLoadError,
    TokenizerRegistry,
    TokenizerSpec,
    _bytes_to_byte_level,
    _load,
    _native_bpe,
    analyze_streams,
    default_tokenizer_dir,
)
from sniffer.llm.values import Usage

JSON = default_tokenizer_dir() / "tokenizer.json"


def _native_mod() -> Any:
    from sniffer import native_core

    mod = native_core()[0]
    if mod is None:
        pytest.skip("the native core does not run")
    return mod


@pytest.fixture(scope="module")
def lib() -> Tokenizer:
    return Tokenizer.from_file(str(JSON))


@pytest.fixture(scope="module")
def model() -> Any:
    return _native_mod().BpeModel.from_file(str(JSON))


def _lazy() -> LoadedTokenizer:
    _native_mod()
    tok = _load(str(default_tokenizer_dir()), "ds")
    assert not tok.library_loaded
    return tok


@pytest.fixture(scope="module")
def lazy() -> LoadedTokenizer:
    return _lazy()


_ASCII = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=40)
_WORDY = st.lists(
    st.sampled_from(
        ["the", " the", "ing", " 12345", "w12.34 ", "\n", "\r\n", "  ", "\t", "'s", "x", "<", "|"]
        + [chr(c) for c in range(128)]
    ),
    max_size=30,
).map("".join)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_ASCII, _WORDY, st.text(max_size=12)))
def test_bpe_of_a_piece_equals_the_librarys(lib: Tokenizer, model: Any, piece: str) -> None:
    # the model alone (no pre-tokenizer): bytes spelled in the byte-level alphabet
    data = piece.encode("utf-8", "surrogatepass")
    want = [t.id for t in lib.model.tokenize(_bytes_to_byte_level(data))]
    assert model.encode_piece(piece) == want


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_ASCII, _WORDY), max_size=8))
def test_lazy_tokenizer_encodes_as_the_library(
    lib: Tokenizer, lazy: LoadedTokenizer, texts: list[str]
) -> None:
    tok = lazy
    encs = lib.encode_batch(texts, add_special_tokens=False)
    decoded = lib.decode_batch([e.ids for e in encs], skip_special_tokens=False)
    want = [(tuple(e.ids), e.offsets, d) for e, d in zip(encs, decoded, strict=True)]
    assert tok._encode_checked(texts) == want
    for flag in (False, True):
        ids = [e.ids for e in lib.encode_batch(texts, add_special_tokens=flag)]
        assert tok._encode_ids(texts, flag) == ids
    assert tok.decode_batch([w[0] for w in want]) == [w[2] for w in want]
    # only texts with an added token's content go to the library
    added = [c for _, c in tok._native.added]
    if not tok.library_loaded:
        assert not any(c in t for t in texts for c in added)


def test_lookups_equal_the_librarys(lib: Tokenizer, model: Any) -> None:
    tok = _lazy()
    assert tok.vocab_size == lib.get_vocab_size(with_added_tokens=True) == model.vocab_size
    n = lib.get_vocab_size(with_added_tokens=True) + 10
    for i in range(n):
        t = lib.id_to_token(i)
        assert tok.id_to_token(i) == t
        if t is not None:
            assert tok.token_to_id(t) == lib.token_to_id(t)
    for t in ["", "nope", "<think>", "Ġthe", "the", "<｜begin▁of▁sentence｜>"]:
        assert tok.token_to_id(t) == lib.token_to_id(t)
    for bad in (-1, 2**40):
        with pytest.raises(OverflowError):
            lib.id_to_token(bad)
        with pytest.raises(OverflowError):
            tok.id_to_token(bad)
    assert not tok.library_loaded
    assert tok.unk_id is None and tok.byte_level and tok.plain_byte_level


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 129_279), max_size=12))
def test_decode_equals_the_librarys(lib: Tokenizer, lazy: LoadedTokenizer, ids: list[int]) -> None:
    tok = lazy
    assert tok.decode(ids) == lib.decode(ids, skip_special_tokens=False)
    assert tok.token_text(ids[0] if ids else 0) == lib.decode(
        [ids[0] if ids else 0], skip_special_tokens=False
    )
    # a partial UTF-8 character decodes to U+FFFD as the library does it
    assert tok.decode([*ids, 1, -1, 2]) == tok.decode([*ids, 1]) + "<REDACTED>" + tok.decode([2])


def test_ascii_token_pass_leaves_the_library_unloaded(lib: Tokenizer) -> None:
    _native_mod()
    registry = TokenizerRegistry()
    registry.preload()
    tok = registry.default()
    assert not tok.library_loaded
    chunks = [ChunkInput(0, 0, "", None, None)]
    chunks += [ChunkInput(i + 1, 0, f"w{i}.{i} ", None, None) for i in range(20)]
    chunks.append(ChunkInput(21, 0, "", "stop", None))
    s = StreamInput(
        stream_id=1,
        model="deepseek-v4",
        request={"model": "deepseek-v4", "messages": [{"role": "user", "content": "Hi 123!"}]},
        chunks=chunks,
        usage=Usage.parse({"prompt_tokens": 9, "completion_tokens": 40, "total_tokens": 49}),
        gap=False,
        done_seen=True,
        include_usage_requested=True,
    )
    (res,) = analyze_streams(registry, [s])
    text = "".join(c.text for c in chunks)
    assert list(res.output_ids[0]) == lib.encode(text, add_special_tokens=False).ids
    assert list(res.prompt_ids) == lib.encode("user: Hi 123!\n").ids
    assert tok.server_token_id(ServerToken(" w")) == lib.token_to_id("Ġw")
    assert tok.server_token_id(ServerToken("<think>")) == lib.token_to_id("<think>")
    assert not tok.library_loaded
    # a non-ASCII text needs the library: loaded now, same answer
    assert tok.encode_with_offsets(["héllo"])[0][0] == lib.encode("héllo").ids
    assert tok.library_loaded


def _write(tmp_path: Path, edit: Any) -> Path:
    config = json.loads(JSON.read_text("utf-8"))
    edit(config)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(config), "utf-8")
    return path


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c["model"].__setitem__("dropout", 0.1),
        lambda c: c["model"].__setitem__("ignore_merges", True),
        lambda c: c["model"].__setitem__("byte_fallback", True),
        lambda c: c["model"].__setitem__("unk_token", "<think>"),
        lambda c: c.__setitem__("truncation", {"max_length": 5}),
        lambda c: c.__setitem__("normalizer", {"type": "NFC"}),
        lambda c: c["pre_tokenizer"]["pretokenizers"][0]["pattern"].__setitem__("Regex", "x"),
        lambda c: c["post_processor"].__setitem__("trim_offsets", True),
        lambda c: c.__setitem__("decoder", None),
        lambda c: c["model"].__setitem__("vocab", {**c["model"]["vocab"], "zz": 0}),  # two ids 0
        lambda c: c.__setitem__("extra", 1),
    ],
)
def test_other_configurations_load_the_library(tmp_path: Path, edit: Any) -> None:
    _native_mod()
    path = _write(tmp_path, edit)
    assert _native_bpe(path) is None
    try:
        tok = _load(str(path), "x")
    except TokenizerLoadError:
        return  # the library refuses it too
    assert tok.library_loaded


def test_deepseeks_file_rewritten_is_read_natively(tmp_path: Path) -> None:
    _native_mod()
    path = _write(tmp_path, lambda c: None)
    assert _native_bpe(path) is not None
    assert not _load(str(path), "x").library_loaded


@pytest.mark.parametrize("cut", [0, 1000, 3_000_000])
def test_broken_file_fails_at_preload_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    _native_mod()
    path = tmp_path / "tokenizer.json"
    path.write_bytes(JSON.read_bytes()[:cut])
    registry = TokenizerRegistry([TokenizerSpec("m", str(path))])
    with pytest.raises(TokenizerLoadError) as native:
        registry.preload_configured()
    monkeypatch.setattr(sniffer, "_native_loaded", (None, None))  # SPARSEETY_PURE
    with pytest.raises(TokenizerLoadError) as pure:
        TokenizerRegistry([TokenizerSpec("m", str(path))]).preload_configured()
    assert str(native.value) == str(pure.value)
    assert "cannot load" in str(native.value)


def test_merge_out_of_vocabulary_fails_at_preload(tmp_path: Path) -> None:
    _native_mod()
    path = _write(tmp_path, lambda c: c["model"]["merges"].append("Ġqqq zzz"))
    with pytest.raises(TokenizerLoadError, match="cannot load"):
        TokenizerRegistry([TokenizerSpec("m", str(path))]).preload_configured()


def test_pure_core_loads_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sniffer, "_native_loaded", (None, None))  # SPARSEETY_PURE
    tok = _load(str(default_tokenizer_dir()), "ds")
    assert tok.library_loaded and tok._fast is None and tok._native is None


def test_lazy_tokenizer_needs_its_parts() -> None:
    with pytest.raises(ValueError):
        LoadedTokenizer("x", None)


def test_registry_not_native_first_loads_the_library_without_the_native_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``stats``' registry (``native_first=False``: it needs offsets for every
    text) loads the library's tokenizer at once and never reads the file
    natively; ids, offsets and texts are those of the native-first one."""
    _native_mod()
    import sniffer.llm.tokens as tokens_module

    reads: list[Path] = []
    real = tokens_module._native_bpe

    def counted(path: Path) -> Any:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(tokens_module, "_native_bpe", counted)
    library = TokenizerRegistry(native_first=False).default()
    assert library.library_loaded and library._native is None and reads == []
    lazy = TokenizerRegistry().default()
    assert not lazy.library_loaded and lazy._native is not None and reads == [JSON]
    texts = ["Hello, world!", "naïve café — 東京 🙂", "  spaces\tand\nlines  ", ""]
    assert library.encode_with_offsets(texts) == lazy.encode_with_offsets(texts)
    ids = library.encode_batch(texts)
    assert ids == lazy.encode_batch(texts)
    assert library.decode_batch(ids) == lazy.decode_batch(ids)
