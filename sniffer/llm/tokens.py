"""Token layer: a tokenizer registry and per-chunk token attribution.

What this module computes, per recorded stream:

* which tokenizer was used (``StreamTokens.tokenizer``: the configured source,
  or ``"default:deepseek-v4"`` when the stream's model has none configured);
* the prompt's token ids (chat template when the tokenizer has one, else the
  documented fallback, see :meth:`LoadedTokenizer.prompt_ids`);
* the token ids of each choice's full reconstructed text, and for every chunk
  the ids attributed to it (see :func:`attribute_chunks`);
* the server-reported tokens (OpenAI ``logprobs``, TGI ``token``), compared
  with our own tokenization;
* ``usage`` against our own counts;
* :class:`Anomaly` values, one kind per thing worth reporting.

Purity: everything here is sans-IO (no socket, no clock, no logging) with ONE
exception: :class:`TokenizerRegistry` reads tokenizer files from local disk
(``tokenizer.json``, ``tokenizer_config.json``, the Hugging Face cache) the
first time a tokenizer is needed, and caches the result. It never downloads:
Hugging Face ids are resolved with ``local_files_only=True``. A GGUF model
file's tokenizer is converted once and the result written to a cache folder
(:func:`gguf_cache_dir`), the only file this module writes.

Per-chunk attribution is incremental in effect but not in cost: each choice's
full text is encoded once with character offsets, and every token goes to the
chunk that contains its first character. Concatenating the per-chunk ids gives
exactly the full encoding. A token whose characters continue past the end of
its chunk *straddles* the boundary: re-encoding the prefix up to that chunk
would have produced different tokens there, which is what a server streaming
token by token never does, so it is recorded (``ChunkTokens.straddles`` and a
``"straddle"`` anomaly).

Anomaly kinds and what ``Anomaly.position`` means for each (``choice`` is the
choice index, or -1 for the stream as a whole):

===================== ========================================================
kind                  position
===================== ========================================================
replacement_char      token index of the token covering the U+FFFD character
straddle              token index of the straddling token
multi_token_chunk     token index of the first token of the first such chunk
                      (one summary anomaly per choice; the distribution is in
                      ``StreamTokens.tokens_per_chunk``)
unk                   token index of the UNK token
roundtrip             character offset of the first difference
usage_mismatch        None (choice -1); detail names the field and both counts
usage_missing         None (choice -1)
finish_missing        None
content_after_finish  token index of the token covering the first character of
                      the first chunk with text after the finish (one per choice)
gap                   None (choice -1)
server_token_mismatch index of the first differing token
server_tokens_invalid None; logprobs that could not be parsed
prompt_template       None (choice -1); the chat template failed, fallback used
tokenizer_error       None (choice -1); the configured tokenizer failed to load,
                      the default was used
===================== ========================================================

Each (kind, choice) pair lists at most :data:`MAX_ANOMALIES_PER_KIND`
anomalies; when there are more, one further anomaly with position None says
how many were left out.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import re
import threading
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, islice, repeat
from operator import gt, itemgetter, le, sub
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

if TYPE_CHECKING:  # imported where used: a command that loads no tokenizer skips it
    from tokenizers import Encoding, Tokenizer

from sniffer.llm.logprobs import ServerToken, parse_server_tokens
from sniffer.llm.registry import (
    DEFAULT_NAME,
    GGUF_SUFFIX,
    TOKENIZERS_PARALLELISM,
    TokenizerLoadError,
    TokenizerRegistry,
    TokenizerSpec,
    _has_chat_template,
    default_tokenizer_dir,
)
from sniffer.llm.values import TOKEN_ID_RANGE, Usage, in_range, slot_dataclass, slot_init

__all__ = [
    "DEFAULT_NAME",
    "GGUF_SUFFIX",
    "MAX_ANOMALIES_PER_KIND",
    "TOKENIZERS_PARALLELISM",
    "Anomaly",
    "AnomalyColumns",
    "ChoiceChunks",
    "ChunkColumns",
    "ChunkInput",
    "ChunkTokens",
    "LoadedTokenizer",
    "Straddle",
    "StreamInput",
    "StreamTokens",
    "TokenizerLoadError",
    "TokenizerRegistry",
    "TokenizerSpec",
    "analyze_streams",
    "attribute_chunks",
    "default_tokenizer_dir",
    "gc_paused",
    "gguf_cache_dir",
    "kind_counts",
    "prompt_method",
]

#: Cap on listed anomalies per (kind, choice) in one stream.
MAX_ANOMALIES_PER_KIND = 32

_STREAM = -1  # Anomaly.choice for stream-level anomalies (dialects.base.STREAM_LEVEL)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
_TOKEN_ID_TEXT = re.compile(r"^token_id:(\d{1,12})$")


# ---------------------------------------------------------------------------
# Byte-level (GPT-2 style) alphabet: how byte-level BPE vocabularies spell bytes
# ---------------------------------------------------------------------------


def _byte_alphabet() -> tuple[str, ...]:
    # Printable Latin-1 bytes stand for themselves; every other byte is given
    # the next unused code point from 256 upwards, in byte order.
    keep = set(range(ord("!"), ord("~") + 1))
    keep |= set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    out: list[str] = []
    extra = 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return tuple(out)


_BYTE_CHARS = _byte_alphabet()
#: A byte-level vocabulary's character → the byte it spells.
_BYTE_OF = {c: b for b, c in enumerate(_BYTE_CHARS)}


def _bytes_to_byte_level(data: bytes) -> str:
    return "".join(_BYTE_CHARS[b] for b in data)


# ---------------------------------------------------------------------------
# Loaded tokenizer
# ---------------------------------------------------------------------------


@slot_init  # one per stream the token pass analyses
@slot_dataclass(frozen=True, slots=True)
class _PromptPlan:
    """How to tokenize a request's prompt: text segments and literal id segments."""

    segments: tuple[str | tuple[int, ...], ...]
    add_special_tokens: bool
    error: str | None = None  # the chat template failed; this plan is the fallback


#: Token bytes a tokenizer keeps (``LoadedTokenizer._pieces``, ~100 bytes
#: each): emptied when full, so that a daemon that saw most of a large
#: vocabulary keeps a few MB at most.
_MAX_PIECES = 65_536


class LoadedTokenizer:
    """A fast tokenizer (``tokenizers.Tokenizer``) plus an optional chat template.

    All methods are pure computations. Output text is encoded without special
    tokens (``add_special_tokens=False``) and decoded without skipping them.
    """

    def __init__(
        self,
        name: str,
        tokenizer: Tokenizer | None,
        chat: Any = None,
        *,
        native: Any = None,
        load: Callable[[], Tokenizer] | None = None,
    ) -> None:
        """``chat`` is a loaded ``transformers`` tokenizer whose
        ``apply_chat_template`` renders chat prompts, or None for the fallback.

        ``tokenizer`` None: the library's tokenizer is loaded by ``load`` on
        first need (:attr:`_tok`), and ``native`` (``sniffer._native.BpeModel``
        of the same file, accepted by :func:`_native_fits`) serves meanwhile:
        the fast path's pieces, ``decode`` of plain tokens, the vocabulary
        lookups (:func:`_native_bpe`)."""
        self.name = name
        self._lib: Tokenizer | None = tokenizer
        self._load_lib = load
        self._lib_lock = threading.Lock()
        self._native = native
        self._chat = chat
        self._added: frozenset[int] | None = None
        if tokenizer is None:
            if native is None or load is None:
                raise ValueError("a lazy tokenizer needs its native model and a loader")
            self.vocab_size: int = native.vocab_size
            self.unk_id: int | None = None  # _native_fits: no UNK token
            self.byte_level: bool = True  # _native_fits: the ByteLevel decoder
            self.plain_byte_level: bool = _has_encode_batch_fast()
            self._added = frozenset(i for i, _ in native.added)
            self._fast: Any = (
                _new_piece_encoder([c for _, c in native.added]) if self.plain_byte_level else None
            )
        else:
            self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
            unk = getattr(tokenizer.model, "unk_token", None)
            self.unk_id = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
            from tokenizers import decoders

            self.byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
            #: the token pass may take offsets and decoded texts from the tokens'
            #: bytes (see :meth:`_encode_checked`)
            self.plain_byte_level = _plain_byte_level(tokenizer)
            #: the native fast path of DeepSeek's tokenizer on ASCII texts, or None
            #: (:func:`_piece_encoder`)
            self._fast = _piece_encoder(tokenizer) if self.plain_byte_level else None
        self._pieces: dict[int, bytes] = {}  # id → its bytes (b"": not a plain token)
        self._chars: dict[int, int] = {}  # id → characters its bytes start (UTF-8)
        self._cont: set[int] = set()  # ids whose first byte continues a character

    @property
    def _tok(self) -> Tokenizer:
        """The library's tokenizer, loaded now if it was left to first need
        (once, under a lock; a failure raises :class:`TokenizerLoadError`
        each time)."""
        tok = self._lib
        if tok is None:
            with self._lib_lock:
                tok = self._lib
                if tok is None:
                    assert self._load_lib is not None
                    tok = self._lib = self._load_lib()
        return tok

    @property
    def library_loaded(self) -> bool:
        """Whether the tokenizers library's tokenizer is loaded (tests, benchmarks)."""
        return self._lib is not None

    @property
    def has_chat_template(self) -> bool:
        return self._chat is not None

    def __repr__(self) -> str:
        return f"LoadedTokenizer({self.name!r}, vocab_size={self.vocab_size})"

    # -- encoding ----------------------------------------------------------

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens added)."""
        return [e.ids for e in self._encode(texts, False)]

    def encode_with_offsets(
        self, texts: Sequence[str]
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Token ids and (start, end) character offsets of each token, per text."""
        return [(e.ids, e.offsets) for e in self._encode(texts, False)]

    def _encode(self, texts: Sequence[str], add_special_tokens: bool) -> list[Encoding]:
        if not texts:
            return []
        return self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)

    def _encode_ids(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        """Token ids of each text, without the offsets: through the native
        fast path when there is one (:func:`_piece_encoder`, as in
        :meth:`_encode_checked`), else ``encode_batch_fast`` (tokenizers >=
        0.20, does not track them: ~20 % less work)."""
        if not texts:
            return []
        out: list[list[int] | None] = [None] * len(texts)
        todo: Sequence[int] = range(len(texts))
        if self._fast is not None:  # the special tokens flag adds none (_piece_encoder)
            # (ends=False: a list of ids per text, no token ends made)
            for i, got in enumerate(self._fast.encode(list(texts), self._encode_pieces, False)):
                if got is not None:
                    out[i] = got
            todo = [i for i, o in enumerate(out) if o is None]
        if todo:
            encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
            encs = encode([texts[i] for i in todo], add_special_tokens=add_special_tokens)
            for i, e in zip(todo, encs, strict=True):
                out[i] = e.ids
        return cast("list[list[int]]", out)

    def _encode_checked(self, texts: Sequence[str]) -> list[_Encoded]:
        """Ids, character offsets and ``decode(ids)`` of each text (no special
        tokens added): what ``encode_batch`` and ``decode_batch`` give.

        With the native fast path (:func:`_piece_encoder`: DeepSeek's
        tokenizer, the native core loaded) an ASCII text that holds no added
        token is cut into its pre-tokens natively and its ids are its
        pieces' ids, known from earlier texts or asked of the library in one
        batch (:meth:`_encode_pieces`); its tokens tile it. Every other text,
        or all of them without the fast path, go as follows. With a plain
        byte-level tokenizer (:func:`_plain_byte_level`) the texts
        are encoded without offsets (``encode_batch_fast``), and when a text's
        tokens are plain vocabulary entries whose bytes joined are the text's
        UTF-8 bytes, its offsets come from those bytes
        (:meth:`_offsets_from_bytes`) and ``decode`` gives the text back (the
        ByteLevel decoder joins the bytes). A text with a token that is not a
        plain vocabulary entry (an added token, UNK), or whose bytes differ,
        goes through the tokenizer's offsets and decoder like any other
        text. Asking the tokenizer for offsets and decoding back costs it
        about as much again as its ids on the token pass's short texts."""
        out: list[_Encoded | None] = [None] * len(texts)
        todo: Sequence[int] = range(len(texts))
        if self._fast is not None and texts:
            for i, got in enumerate(self._fast.encode(list(texts), self._encode_pieces)):
                if got is not None:
                    out[i] = (got[0], _Tiled(got[1]), texts[i])
            todo = [i for i, o in enumerate(out) if o is None]
        if self.plain_byte_level and todo:
            encs = self._tok.encode_batch_fast([texts[i] for i in todo], add_special_tokens=False)
            for i, e in zip(todo, encs, strict=True):
                ids = e.ids
                offsets = self._offsets_from_bytes(texts[i], ids)
                if offsets is not None:
                    out[i] = (tuple(ids), offsets, texts[i])
        rest = [i for i in todo if out[i] is None]
        if rest:
            encs = self._encode([texts[i] for i in rest], False)
            all_ids = [e.ids for e in encs]
            decoded = self._decode_ids(all_ids)  # an encoding's ids are never masked
            for i, e, ids, dec in zip(rest, encs, all_ids, decoded, strict=True):
                out[i] = (tuple(ids), e.offsets, dec)
        return cast("list[_Encoded]", out)

    def _encode_pieces(self, pieces: list[str]) -> list[tuple[list[int], Sequence[int]] | None]:
        """The fast path's question to the library: per piece (ASCII), its
        ids and their ends when its tokens are plain entries that spell it
        (:meth:`_offsets_from_bytes`), else None (its texts take the
        library's path). Natively when the tokenizer came from
        :func:`_native_bpe` (``BpeModel.encode_pieces``: the same ids, the
        library is not loaded)."""
        if self._native is not None:
            got = self._native.encode_pieces(pieces)
            return cast("list[tuple[list[int], Sequence[int]] | None]", got)
        encs = self._tok.encode_batch_fast(pieces, add_special_tokens=False)
        out: list[tuple[list[int], Sequence[int]] | None] = []
        for piece, e in zip(pieces, encs, strict=True):
            ids = e.ids
            offsets = self._offsets_from_bytes(piece, ids)
            out.append((ids, offsets.ends) if type(offsets) is _Tiled else None)
        return out

    def _offsets_from_bytes(self, text: str, ids: list[int]) -> Sequence[tuple[int, int]] | None:
        """The character offsets of ``ids`` in ``text`` from their bytes, as
        the tokenizers library reports them for byte-level BPE, or None when
        a token is not a plain vocabulary entry or the bytes joined are not
        the text's UTF-8 bytes.

        A token spans the characters of its bytes: from the character of its
        first byte to the end of the character of its last byte. Its end is
        thus the count of characters started up to its last byte (the bytes
        that are not UTF-8 continuation bytes, 0x80-0xBF: ``_chars``); its
        start is the previous token's end, less one when its first byte
        continues a character the previous token started (``_cont``): the
        tokens holding parts of one character (byte-level BPE splits
        characters it has no merge for) each get that whole character, and
        neighbours overlap by it. An ASCII text's tokens, and any text whose
        tokens all start a character, tile it (:class:`_Tiled`: the
        attribution reads the ends only)."""
        pieces_of = self._pieces
        try:
            pieces = list(map(pieces_of.__getitem__, ids))
        except KeyError:  # ids not seen yet (it stops at the first)
            missing = set(ids).difference(pieces_of)
            if len(pieces_of) + len(missing) > _MAX_PIECES:
                pieces_of.clear()
                self._chars.clear()
                self._cont.clear()
                missing = set(ids)
            for i in missing:
                self._learn(i)
            pieces = list(map(pieces_of.__getitem__, ids))
        if not all(pieces):
            return None  # a token that is not a plain entry (b"")
        if text.isascii():  # one character per byte
            if b"".join(pieces) != text.encode("ascii"):
                return None
            return _Tiled(list(accumulate(map(len, pieces))))
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the tokenizer's way
            return None
        if b"".join(pieces) != data:
            return None
        ends = list(accumulate(map(self._chars.__getitem__, ids)))
        cont = self._cont
        if cont.isdisjoint(ids):
            return _Tiled(ends)
        # token k starts where k - 1 ends, less one when it continues a character
        starts = map(sub, chain((0,), ends), map(cont.__contains__, ids))
        return list(zip(starts, ends, strict=True))

    def _learn(self, i: int) -> None:
        """Keeps token ``i``'s bytes (:meth:`_piece`), how many characters
        they start, and whether the first continues a character."""
        piece = self._piece(i)
        self._pieces[i] = piece
        self._chars[i] = sum(1 for b in piece if b & 0xC0 != 0x80)
        if piece and piece[0] & 0xC0 == 0x80:
            self._cont.add(i)

    def _piece(self, i: int) -> bytes:
        """The bytes token ``i`` spells in a byte-level vocabulary; b"" for an
        added token, UNK, an unknown id or a token with a character outside
        the byte alphabet."""
        added = self._added
        if added is None:
            added = self._added = frozenset(self._tok.get_added_tokens_decoder())
        token = self.id_to_token(i)
        if token is None or i in added or i == self.unk_id:
            return b""
        try:
            return bytes(map(_BYTE_OF.__getitem__, token))
        except KeyError:
            return b""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; a run of masked ids (negative: what redaction
        removed, see ``tokenize_pass.MASKED_ID``) decodes to ``<REDACTED>``."""
        ids = list(ids)
        if not ids or min(ids) >= 0:
            return self._decode_one(ids)
        out: list[str] = []
        run: list[int] = []
        masked = False
        for i in ids:
            if i < 0:
                if run:
                    out.append(self._decode_one(run))
                    run = []
                if not masked:
                    out.append("<REDACTED>")
                masked = True
            else:
                run.append(i)
                masked = False
        if run:
            out.append(self._decode_one(run))
        return "".join(out)

    def _decode_one(self, ids: list[int]) -> str:
        """``decode`` of ids that hold no masked id: natively when each is a
        plain model token and the library is lazy (the ByteLevel decoder
        joins their bytes), else the library's."""
        if self._native is not None:
            got = self._native.decode(ids)
            if got is not None:
                return cast("str", got)
        return self._tok.decode(ids, skip_special_tokens=False)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        if not batch:
            return []
        if any(ids and min(ids) < 0 for ids in batch):
            return [self.decode(ids) for ids in batch]
        return self._decode_ids(batch)

    def _decode_ids(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """The texts of token id sequences that hold no masked (negative) id."""
        if not batch:
            return []
        if self._native is not None:
            return [self._decode_one(list(ids)) for ids in batch]
        return self._tok.decode_batch(list(batch), skip_special_tokens=False)

    def id_to_token(self, i: int) -> str | None:
        if self._native is not None:  # added tokens first, then the model's (the library's order)
            return cast("str | None", self._native.id_to_token(i))
        return self._tok.id_to_token(i)

    def token_to_id(self, t: str) -> int | None:
        if self._native is not None:
            return cast("int | None", self._native.token_to_id(t))
        return self._tok.token_to_id(t)

    def token_text(self, i: int) -> str:
        """What token ``i`` decodes to on its own (may contain U+FFFD for partial bytes)."""
        return self.decode([i])

    def server_token_id(self, tok: ServerToken) -> int | None:
        """Our id for a server-reported token, or None when it maps to none."""
        if tok.id is not None:
            return tok.id
        m = _TOKEN_ID_TEXT.match(tok.text)
        if m:
            tid = int(m.group(1))
            return tid if in_range(tid, TOKEN_ID_RANGE) else None
        raw = tok.raw if tok.raw is not None else tok.text.encode("utf-8", "surrogatepass")
        if self.byte_level:
            i = self.token_to_id(_bytes_to_byte_level(raw))
            if i is not None:
                return i
        i = self.token_to_id(tok.text)
        if i is None and tok.raw is not None:
            i = self.token_to_id(tok.raw.decode("utf-8", "replace"))
        return i

    # -- prompts -----------------------------------------------------------

    def prompt_ids(self, request: dict[str, Any]) -> list[int]:
        """Token ids of the prompt of a parsed request body.

        Chat requests (``messages``; Anthropic ``system``; Responses ``input``
        list and ``instructions``): the tokenizer's chat template with
        ``add_generation_prompt=True``, rendered to text and encoded without
        adding special tokens (the template carries them). Without a template,
        or if the template fails on this request, the fallback: one line
        ``"{role}: {content}\\n"`` per message (text parts of list contents
        joined), encoded with the tokenizer's own special tokens.
        Completion requests: ``prompt`` (or Responses ``input`` string) encoded
        with special tokens; a list of strings is encoded one by one and
        concatenated; token-id prompts are taken as they are.
        A request with no prompt gives ``[]``.
        """
        return self._prompt_ids_batch([self._prompt_plan(request)])[0]

    def _prompt_plan(self, request: dict[str, Any]) -> _PromptPlan | None:
        messages = _chat_messages(request)
        if messages is not None:
            error: str | None = None
            if self._chat is not None:
                try:
                    rendered = self._chat.apply_chat_template(
                        messages,
                        tools=request.get("tools") or None,
                        tokenize=False,
                        add_generation_prompt=True,
                    )
                except Exception as exc:  # a template may raise anything on odd input
                    error = f"{type(exc).__name__}: {exc}"
                else:
                    if isinstance(rendered, str):
                        return _PromptPlan((rendered,), False)
                    error = f"chat template returned {type(rendered).__name__}"
            text = "".join(f"{m['role']}: {_content_text(m.get('content'))}\n" for m in messages)
            return _PromptPlan((text,), True, error)
        prompt = request.get("prompt")
        if prompt is None and isinstance(request.get("input"), str):
            prompt = request["input"]
        if isinstance(prompt, str):
            return _PromptPlan((prompt,), True)
        if isinstance(prompt, list) and prompt:
            if all(_is_int(x) for x in prompt):
                return _PromptPlan((tuple(prompt),), True)
            segs: list[str | tuple[int, ...]] = []
            for p in prompt:
                if isinstance(p, str):
                    segs.append(p)
                elif isinstance(p, list) and all(_is_int(x) for x in p):
                    segs.append(tuple(p))
            return _PromptPlan(tuple(segs), True)
        return None

    def _prompt_ids_batch(self, plans: Sequence[_PromptPlan | None]) -> list[list[int]]:
        """Prompt ids for many plans: one encode batch per special-token setting."""
        texts: dict[bool, list[str]] = {False: [], True: []}
        for plan in plans:
            if plan is not None:
                texts[plan.add_special_tokens].extend(
                    s for s in plan.segments if isinstance(s, str)
                )
        encoded = {flag: iter(self._encode_ids(ts, flag)) for flag, ts in texts.items()}
        out: list[list[int]] = []
        for plan in plans:
            ids: list[int] = []
            if plan is not None:
                for seg in plan.segments:
                    if isinstance(seg, str):
                        ids.extend(next(encoded[plan.add_special_tokens]))
                    else:
                        ids.extend(seg)
            out.append(ids)
        return out


def _state(component: Any) -> Any:
    """A tokenizer component's configuration (its JSON), None when absent."""
    if component is None:
        return None
    try:
        return json.loads(component.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return {"type": "?"}


def _plain_byte_level(tokenizer: Tokenizer) -> bool:
    """Whether the tokens of a text spell its UTF-8 bytes in order, each
    token's offsets being the characters of its bytes, and ``decode`` joins
    them: a BPE model with a byte-level vocabulary, no normalizer (or an
    empty sequence of them), a pre-tokenizer that only splits (``Split``
    pieces not removed) then maps bytes (``ByteLevel`` without an added
    prefix space), no post-processor or a ``ByteLevel`` one that does not
    trim offsets, and the ``ByteLevel`` decoder. DeepSeek's tokenizer is one
    (as GPT-2's and many others' would be without their extra steps);
    ``encode_batch_fast`` (tokenizers >= 0.20) is needed too."""
    from tokenizers import decoders, models

    if not hasattr(tokenizer, "encode_batch_fast"):
        return False
    if not isinstance(tokenizer.model, models.BPE) or not isinstance(
        tokenizer.decoder, decoders.ByteLevel
    ):
        return False
    norm = _state(tokenizer.normalizer)
    if norm is not None and norm != {"type": "Sequence", "normalizers": []}:
        return False
    post = _state(tokenizer.post_processor)
    if post is not None and (post.get("type") != "ByteLevel" or post.get("trim_offsets")):
        return False
    pre = _state(tokenizer.pre_tokenizer)
    steps = pre.get("pretokenizers") if pre is not None and pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not steps:
        return False
    *splits, last = steps
    return (
        isinstance(last, dict)
        and last.get("type") == "ByteLevel"
        and last.get("add_prefix_space") is False
        and all(
            isinstance(x, dict) and x.get("type") == "Split" and x.get("behavior") != "Removed"
            for x in splits
        )
    )


#: DeepSeek's pre-tokenizer, as its configuration reads: the one the native
#: fast path implements (``sparseety_core::pretok``).
_FAST_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {
            "type": "Split",
            "pattern": {"Regex": "\\p{N}{1,3}"},
            "behavior": "Isolated",
            "invert": False,
        },
        {
            "type": "Split",
            "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
            "behavior": "Isolated",
            "invert": False,
        },
        {
            "type": "Split",
            "pattern": {
                "Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
            },
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}


def _piece_encoder(tokenizer: Tokenizer) -> Any:
    """The native fast path's encoder (``sniffer._native.PieceEncoder``) for a
    plain byte-level tokenizer (:func:`_plain_byte_level`) whose encoding of
    a text is its pre-tokens' encodings joined and whose pre-tokenizer is
    DeepSeek's (:data:`_FAST_PRE_TOKENIZER`, what the encoder implements):
    a BPE model without dropout, no truncation nor padding. Its
    post-processor adds no token (none, or ``ByteLevel``), so the ids are
    the same with or without ``add_special_tokens`` (prompts are encoded
    with it, :meth:`LoadedTokenizer._encode_ids`). None for any
    other tokenizer, or when the native core does not run (``SPARSEETY_PURE``
    keeps the library's path, the reference). Reads the small components'
    configurations only (the model's holds the 6 MB vocabulary)."""
    from sniffer import native_core

    mod = native_core()[0]
    if mod is None or getattr(tokenizer.model, "dropout", None) is not None:
        return None
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return None
    if _state(tokenizer.pre_tokenizer) != _FAST_PRE_TOKENIZER:
        return None
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    return mod.PieceEncoder(added)


def _new_piece_encoder(added: list[str]) -> Any:
    """A ``PieceEncoder`` for a tokenizer with these added tokens' contents,
    or None without the native core."""
    from sniffer import native_core

    mod = native_core()[0]
    return None if mod is None else mod.PieceEncoder(added)


def _has_encode_batch_fast() -> bool:
    """Whether the installed tokenizers library has ``encode_batch_fast``
    (>= 0.20; :func:`_plain_byte_level`), without loading a tokenizer."""
    from tokenizers import Tokenizer

    return hasattr(Tokenizer, "encode_batch_fast")


def _native_bpe(path: Path) -> Any:
    """``sniffer._native.BpeModel`` of ``path`` (a ``tokenizer.json``) when the
    native core runs and its configuration is one whose token pass needs
    nothing of the library on ASCII texts (:func:`_native_fits`), else None
    (the library loads it now, as before: a file the native reader refuses
    is left for the library to accept or to report)."""
    from sniffer import native_core

    mod = native_core()[0]
    if mod is None or not hasattr(mod, "BpeModel"):
        return None
    try:
        model = mod.BpeModel.from_file(str(path))
        config = json.loads(model.config)
    except (OSError, ValueError):
        return None
    return model if _native_fits(config) else None


def _native_fits(config: Any) -> bool:
    """Whether a ``tokenizer.json``'s configuration (``BpeModel.config``: its
    components and the model's flags) is DeepSeek's as :func:`_piece_encoder`
    and :func:`_plain_byte_level` accept it: a BPE model without dropout,
    UNK, subword prefix or suffix, byte fallback or ``ignore_merges``; no
    normalizer (or an empty sequence), DeepSeek's pre-tokenizer
    (:data:`_FAST_PRE_TOKENIZER`), no truncation nor padding, no
    post-processor or a ``ByteLevel`` one that does not trim offsets (it
    adds no token), and the ``ByteLevel`` decoder (its flags play no part in
    decoding). ``BpeModel`` then finds the ids the library finds."""
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        return False
    m = config["model"]
    post = config.get("post_processor")
    decoder = config.get("decoder")
    return (
        m.get("type") in (None, "BPE")
        and m.get("dropout") is None
        and m.get("unk_token") is None
        and m.get("continuing_subword_prefix") is None
        and m.get("end_of_word_suffix") is None
        and not m.get("fuse_unk")
        and not m.get("byte_fallback")
        and not m.get("ignore_merges")
        and config.get("truncation") is None
        and config.get("padding") is None
        and config.get("normalizer") in (None, {"type": "Sequence", "normalizers": []})
        and config.get("pre_tokenizer") == _FAST_PRE_TOKENIZER
        and (
            post is None
            or (
                isinstance(post, dict)
                and post.get("type") == "ByteLevel"
                and not post.get("trim_offsets")
            )
        )
        and isinstance(decoder, dict)
        and decoder.get("type") == "ByteLevel"
    )


def prompt_method(tok: LoadedTokenizer | tuple[str, bool], request: Any) -> str | None:
    """How :meth:`LoadedTokenizer.prompt_ids` counts this request's prompt, in
    words: the chat template, the fallback when the tokenizer has none, or a
    plain prompt (None when the request carries no prompt). ``tok`` may be
    the tokenizer or its ``(name, has chat template)`` from
    :meth:`TokenizerRegistry.template_info` (nothing loaded)."""
    if not isinstance(request, dict):
        return None
    if _chat_messages(request) is not None:
        name, has_chat = (
            (tok.name, tok.has_chat_template) if isinstance(tok, LoadedTokenizer) else tok
        )
        if has_chat:
            return "chat template"
        return f"no chat template in {name}: counted as 'role: content' lines"
    if request.get("prompt") is not None or isinstance(request.get("input"), str):
        return "plain prompt"
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return ""


def _chat_messages(request: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's chat messages (system first), or None for a non-chat request."""
    raw = request.get("messages")
    if raw is None and isinstance(request.get("input"), list):
        raw = request["input"]
    if not isinstance(raw, list):
        return None
    out: list[dict[str, Any]] = []
    system = request.get("system", request.get("instructions"))
    if system is not None:
        out.append({"role": "system", "content": _content_text(system)})
    for m in raw:
        if isinstance(m, dict) and isinstance(m.get("role"), str):
            msg = dict(m)
            if not isinstance(msg.get("content"), str):
                msg["content"] = _content_text(msg.get("content"))
            out.append(msg)
    return out


# ---------------------------------------------------------------------------
# Registry: the one I/O point of this module
# ---------------------------------------------------------------------------


def _load(source: str, name: str, native_first: bool = True) -> LoadedTokenizer:
    """The tokenizer of ``source`` (see :class:`TokenizerSpec`); ``native_first``:
    see :class:`TokenizerRegistry`."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        return _load_gguf(path, name)
    if path.is_file():
        return _load_file(path, name, native_first)
    if path.is_dir():
        return _load_dir(path, name, native_first)
    if not _HUB_ID.match(source) or source.startswith((".", "/", "~")):
        raise TokenizerLoadError(f"tokenizer {source!r}: no such file or directory")
    try:
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download(source, local_files_only=True)
    except Exception as exc:
        raise TokenizerLoadError(
            f"tokenizer {source!r}: not a local path and not in the local Hugging Face cache "
            f"(offline lookup only, nothing is downloaded): {type(exc).__name__}"
        ) from exc
    return _load_dir(Path(snapshot), name, native_first)


def _from_file(path: Path, label: Path) -> Tokenizer:
    """The library's ``Tokenizer.from_file``; a failure is a
    :class:`TokenizerLoadError` naming ``label``."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        raise TokenizerLoadError(f"tokenizer {str(label)!r}: cannot load: {exc}") from exc


def _tokenizer_json(
    path: Path, label: Path, name: str, native_first: bool = True
) -> Callable[[Any], LoadedTokenizer]:
    """A ``tokenizer.json``'s tokenizer, given its chat tokenizer: read
    natively with the library left to first need when :func:`_native_bpe`
    takes it (DeepSeek's: ~0.1 s instead of 0.25-0.35 s of CPU, and a
    replay of ASCII streams never needs the library), else loaded by the
    library now (a file it cannot load fails here, as before). Not
    ``native_first``: the library now, without the native reading."""
    native = _native_bpe(path) if native_first else None
    if native is not None:
        load = functools.partial(_from_file, path, label)
        return lambda chat: LoadedTokenizer(name, None, chat, native=native, load=load)
    tok = _from_file(path, label)
    return lambda chat: LoadedTokenizer(name, tok, chat)


def _load_file(path: Path, name: str, native_first: bool = True) -> LoadedTokenizer:
    make = _tokenizer_json(path, path, name, native_first)
    chat = None
    if path.name == "tokenizer.json" and _has_chat_template(path.parent):
        chat = _load_chat(path.parent)
    return make(chat)


def _load_dir(path: Path, name: str, native_first: bool = True) -> LoadedTokenizer:
    from tokenizers import Tokenizer

    chat = _load_chat(path) if _has_chat_template(path) else None
    if (path / "tokenizer.json").is_file():
        return _tokenizer_json(path / "tokenizer.json", path, name, native_first)(chat)
    # No tokenizer.json (e.g. sentencepiece only): let transformers build the fast one.
    hf = chat if chat is not None else _load_auto(path)
    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TokenizerLoadError(f"tokenizer {str(path)!r}: no fast tokenizer available")
    return LoadedTokenizer(name, backend, chat)


def gguf_cache_dir() -> Path:
    """Where the tokenizers converted from GGUF files are kept:
    ``$XDG_CACHE_HOME/sparseety/gguf-tokenizers`` (``~/.cache/…`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparseety" / "gguf-tokenizers"


def _gguf_cache_key(path: Path) -> str:
    """The file's identity: its resolved path, size and modification time."""
    import hashlib  # for GGUF files only (~2.5 ms of run's start-up)

    st = path.stat()
    ident = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _load_gguf(path: Path, name: str) -> LoadedTokenizer:
    """The tokenizer embedded in a GGUF file (llama.cpp's model format): its
    metadata (``tokenizer.ggml.*``, and ``tokenizer.chat_template`` when the
    file has one) read by transformers with the ``gguf`` package, as the fast
    tokenizer transformers builds from it.

    The conversion reads every vocabulary entry through ``gguf``'s reader
    (~40 s of CPU for Gemma 3's 262,144 entries), so its result — the
    transformers tokenizer saved with ``save_pretrained`` — is kept in
    :func:`gguf_cache_dir` under the file's identity (path, size, mtime) and
    loaded from there the next time (as a folder with ``tokenizer.json``). A
    cache that cannot be written is skipped."""
    try:
        key = _gguf_cache_key(path)
    except OSError as exc:
        raise TokenizerLoadError(f"tokenizer {str(path)!r}: cannot read: {exc}") from exc
    cached = gguf_cache_dir() / key
    if (cached / "tokenizer.json").is_file():
        try:
            return _load_dir(cached, name)
        except TokenizerLoadError:
            pass  # a damaged cache entry: convert again
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise TokenizerLoadError(
            f"tokenizer {str(path)!r}: transformers cannot read the tokenizer of this GGUF "
            f"file (needs the gguf package): {type(exc).__name__}: {exc}"
        ) from exc
    from tokenizers import Tokenizer

    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TokenizerLoadError(f"tokenizer {str(path)!r}: no fast tokenizer in this GGUF file")
    chat = hf if getattr(hf, "chat_template", None) else None
    try:
        tmp = cached.with_name(f"{key}.tmp-{os.getpid()}")
        hf.save_pretrained(str(tmp))
        os.replace(tmp, cached)
    except OSError:
        pass  # no cache: the next load converts again
    return LoadedTokenizer(name, backend, chat)


def _load_chat(path: Path) -> Any:
    return _load_auto(path)


def _load_auto(path: Path) -> Any:
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise TokenizerLoadError(
            f"tokenizer {str(path)!r}: transformers cannot load it offline: {exc}"
        ) from exc


# ---------------------------------------------------------------------------
# Inputs and outputs of the analysis
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkInput:
    """One stored chunk. ``choice`` -1 is stream-level (usage-only, [DONE]); a
    ``finish_reason`` on a stream-level chunk finishes every choice."""

    seq: int
    choice: int
    text: str
    finish_reason: str | None
    logprobs: str | None  # JSON text as stored


_V = TypeVar("_V")


class _BuiltOnFirstUse(Sequence[_V]):
    """A sequence whose values ``_build`` makes on first use, once (the token
    pass reads the columns behind them instead). It equals another of its kind,
    a list or a tuple with the same values; a slice is of ``_build``'s type."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: Sequence[_V] | None = None

    def _build(self) -> Sequence[_V]:
        raise NotImplementedError

    def _values(self) -> Sequence[_V]:
        items = self._items
        if items is None:
            items = self._items = self._build()
        return items

    def __len__(self) -> int:
        return len(self._values())

    @overload
    def __getitem__(self, i: int) -> _V: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[_V]: ...
    def __getitem__(self, i: int | slice) -> _V | Sequence[_V]:
        return self._values()[i]

    def __iter__(self) -> Iterator[_V]:
        return iter(self._values())

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            assert isinstance(other, _BuiltOnFirstUse)
            return list(self._values()) == list(other._values())
        if isinstance(other, list | tuple):
            return list(self._values()) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class ChunkColumns(_BuiltOnFirstUse[ChunkInput]):
    """A stream's chunks in columns, as the token collector keeps them: seq,
    choice and text length per chunk, all texts joined into one string, and
    ``(finish_reason, logprobs)`` only for the chunks that carry one (keyed by
    position). The analysis reads the columns and builds no object per chunk;
    indexing or iterating builds the ``ChunkInput`` values (once)."""

    __slots__ = ("choices", "extra", "lens", "seqs", "text")

    def __init__(
        self,
        seqs: Sequence[int],
        choices: Sequence[int],
        lens: Sequence[int],
        text: str,
        extra: Mapping[int, tuple[str | None, str | None]],
    ) -> None:
        self.seqs = seqs
        self.choices = choices
        self.lens = lens
        self.text = text
        self.extra = extra
        super().__init__()

    @classmethod
    def of(cls, chunks: Sequence[ChunkInput]) -> ChunkColumns:
        """The columns of ``chunks`` (in the order given)."""
        if isinstance(chunks, ChunkColumns):
            return chunks
        texts = [c.text for c in chunks]
        extra = {
            i: (c.finish_reason, c.logprobs)
            for i, c in enumerate(chunks)
            if c.finish_reason is not None or c.logprobs is not None
        }
        return cls(
            [c.seq for c in chunks],
            [c.choice for c in chunks],
            list(map(len, texts)),
            "".join(texts),
            extra,
        )

    def _build(self) -> list[ChunkInput]:
        extra = self.extra
        none = (None, None)
        text = self.text
        items = []
        pos = 0
        for i, (seq, choice, n) in enumerate(zip(self.seqs, self.choices, self.lens, strict=True)):
            items.append(ChunkInput(seq, choice, text[pos : pos + n], *extra.get(i, none)))
            pos += n
        return items

    def __len__(self) -> int:
        return len(self.lens)

    def __repr__(self) -> str:
        return f"ChunkColumns({list(self._values())!r})"

    def in_seq_order(self) -> ChunkColumns:
        """These chunks sorted by seq (stably): ``self`` when they already are."""
        seqs = self.seqs
        if not isinstance(seqs, list):
            seqs = list(seqs)
        if seqs == sorted(seqs):  # (a C sort finds one run: cheaper than pairwise <=)
            return self
        return ChunkColumns.of(sorted(self._values(), key=_seq))


def _tiled(ends: Sequence[int]) -> list[tuple[int, int]]:
    """The offsets of tokens that tile a text in order, from their ends."""
    # token k starts where k - 1 ends (the starts run one past the last token)
    return list(zip(chain((0,), ends), ends, strict=False))


class _Tiled(_BuiltOnFirstUse[tuple[int, int]]):
    """The offsets of tokens that tile a text in order, from their ends
    (token k spans ``ends[k - 1]:ends[k]``, the first from 0): what the token
    pass knows from their bytes of the tokens of a text none of whose
    characters they split (any ASCII text). The attribution
    reads ``ends`` (:func:`_attribute_tiled`); one offset is computed when
    asked for, all of them (a tuple per token) only when iterated. ``ends``
    is a list, or the native fast path's ``array('q')`` (no int object per
    token; the native attribution reads its buffer)."""

    __slots__ = ("ends",)

    def __init__(self, ends: Sequence[int]) -> None:
        self.ends = ends
        self._items = None  # (_BuiltOnFirstUse.__init__, without the call: one per text)

    def _build(self) -> list[tuple[int, int]]:
        return _tiled(self.ends)

    def __len__(self) -> int:
        return len(self.ends)

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[int, int]]: ...
    def __getitem__(self, i: int | slice) -> tuple[int, int] | Sequence[tuple[int, int]]:
        if isinstance(i, slice):
            return self._values()[i]
        ends = self.ends
        k = range(len(ends))[i]  # a negative index counts from the end; IndexError past it
        return (ends[k - 1] if k else 0, ends[k])

    def __repr__(self) -> str:
        return f"_Tiled({self.ends!r})"


@slot_init  # one per stream taken by the token pass
@slot_dataclass(frozen=True, slots=True)
class StreamInput:
    """One stream to analyse. ``request`` is the parsed JSON request body (it
    must hold ``messages``/``prompt`` for prompt tokens); ``usage`` the
    stream's last usage object."""

    stream_id: int
    model: str | None
    request: dict[str, Any]
    chunks: Sequence[ChunkInput]
    usage: Usage | None
    gap: bool
    done_seen: bool
    include_usage_requested: bool
    #: Redaction (the token pass stores nothing it removed): choice → the text
    #: as stored; choice → redacted spans of the ORIGINAL text (their ids are
    #: masked); ``redact`` finds such spans in any text (prompt, server tokens);
    #: ``mask_prompt`` says the request body had something redacted.
    stored_texts: Mapping[int, str] | None = None
    masks: Mapping[int, Sequence[tuple[int, int]]] | None = None
    redact: Callable[[str], list[tuple[int, int]]] | None = None
    mask_prompt: bool = False
    #: ``chunks`` is the start of the stream only (the token collector's cap,
    #: flag ``tokens-capped``): the checks that need every chunk (finish
    #: reasons, usage counts) are not made
    capped: bool = False


@dataclass(frozen=True, slots=True)
class ChunkTokens:
    """Token ids attributed to one text-carrying chunk (chunks without text get none).

    ``straddles`` counts the tokens of this chunk whose characters continue
    into a later chunk.
    """

    seq: int
    choice: int
    token_ids: tuple[int, ...]
    straddles: int


@slot_init
@slot_dataclass(frozen=True, slots=True)
class Anomaly:
    """One thing worth reporting in a stream's tokens (the kinds and what
    ``position`` means: the module docstring). Also the token pass's row of
    ``token_anomalies`` (``sniffer.store.tokens_store.TokenAnomalyRow``, the
    stream's id apart): made once per anomaly, at a few dozen per stream."""

    kind: str
    choice: int
    position: int | None
    detail: str


@slot_init  # one per choice of every stream the token pass analyses
@slot_dataclass(frozen=True, slots=True)
class ChoiceChunks:
    """One choice's text chunks in columns: seq, tokens attributed and
    straddling tokens per chunk (seq order), and the choice's full text;
    ``tokens_per_chunk`` is the distribution of ``counts`` (tokens → chunks
    with that many, by tokens)."""

    seqs: Sequence[int]
    counts: Sequence[int]
    straddles: Sequence[int]
    text: str
    tokens_per_chunk: dict[int, int] = field(default_factory=dict)


class _ChunkTokensView(_BuiltOnFirstUse[ChunkTokens]):
    """``StreamTokens.chunks``: the ``ChunkTokens`` values, built on first use
    from the per-choice columns (the token pass reads the columns instead)."""

    __slots__ = ("_output_ids", "_per_choice")

    def __init__(
        self, output_ids: Mapping[int, tuple[int, ...]], per_choice: Mapping[int, ChoiceChunks]
    ) -> None:
        self._output_ids = output_ids
        self._per_choice = per_choice
        self._items = None  # (_BuiltOnFirstUse.__init__, without the call: one per stream)

    def _build(self) -> tuple[ChunkTokens, ...]:
        out: list[ChunkTokens] = []
        for ch, cc in self._per_choice.items():
            ids = self._output_ids[ch]
            pos = 0
            for seq, n, st in zip(cc.seqs, cc.counts, cc.straddles, strict=True):
                out.append(ChunkTokens(seq, ch, ids[pos : pos + n], st))
                pos += n
        if len(self._per_choice) > 1:
            out.sort(key=_chunk_seq)
        return tuple(out)

    def __repr__(self) -> str:
        return repr(tuple(self._values()))


class AnomalyColumns(_BuiltOnFirstUse[Anomaly]):
    """A stream's anomalies in columns: kind, choice, position and detail per
    anomaly, in order. ``StreamTokens.anomalies`` and the token pass's
    ``StreamTokenRow.anomalies``: the token pass writes its rows from the
    columns (``sniffer.store.tokens_store.write_token_rows``) and counts the
    kinds with a C pass per kind; the live traffic's streams have some 35
    anomalies each, an :class:`Anomaly` made and read per anomaly was a tenth
    of its token pass. Indexing or iterating builds the :class:`Anomaly`
    values (once); it equals a tuple or list of them."""

    __slots__ = ("_counts", "choices", "details", "kinds", "positions")

    def __init__(
        self,
        kinds: list[str],
        choices: list[int],
        positions: list[int | None],
        details: list[str],
    ) -> None:
        self.kinds = kinds
        self.choices = choices
        self.positions = positions
        self.details = details
        self._counts: dict[str, int] | None = None
        self._items = None  # (what _BuiltOnFirstUse.__init__ does, without the call)

    @classmethod
    def of(cls, anomalies: Sequence[Anomaly]) -> AnomalyColumns:
        """The columns of ``anomalies`` (themselves when they are columns)."""
        if isinstance(anomalies, AnomalyColumns):
            return anomalies
        return cls(
            [a.kind for a in anomalies],
            [a.choice for a in anomalies],
            [a.position for a in anomalies],
            [a.detail for a in anomalies],
        )

    def _build(self) -> tuple[Anomaly, ...]:
        return tuple(map(Anomaly, self.kinds, self.choices, self.positions, self.details))

    def __len__(self) -> int:
        return len(self.kinds)

    def __repr__(self) -> str:
        return repr(tuple(self._values()))

    def kind_counts(self) -> Mapping[str, int]:
        """Anomalies by kind, kinds in order of their first anomaly: a
        ``count()`` per kind (a C pass each: a stream has a few kinds), made
        once (the token pass's totals and the metrics both ask) and shared:
        not to be changed."""
        counts = self._counts
        if counts is None:
            kinds = self.kinds
            if len(kinds) < 2:
                counts = dict.fromkeys(kinds, 1)
            else:
                counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
            self._counts = counts
        return counts


def kind_counts(anomalies: Sequence[Anomaly]) -> Mapping[str, int]:
    """``anomalies`` by kind, kinds in order of their first anomaly (not to be
    changed: :meth:`AnomalyColumns.kind_counts` shares its own)."""
    if isinstance(anomalies, AnomalyColumns):
        return anomalies.kind_counts()
    out: dict[str, int] = {}
    for a in anomalies:
        out[a.kind] = out.get(a.kind, 0) + 1
    return out


@slot_init  # one per stream the token pass analyses
@slot_dataclass(frozen=True, slots=True)
class StreamTokens:
    """The token analysis of one stream (:func:`analyze_stream`)."""

    stream_id: int
    tokenizer: str
    prompt_ids: tuple[int, ...]
    output_ids: dict[int, tuple[int, ...]]  # choice → ids of the full text
    chunks: Sequence[ChunkTokens]  # in seq order
    tokens_per_chunk: dict[int, int]  # tokens attributed → number of text chunks
    server_tokens: dict[int, tuple[str, ...]]  # choice → token texts the server reported
    anomalies: Sequence[Anomaly]  # an AnomalyColumns (equals a tuple of Anomaly)
    usage_diff: dict[str, int]  # field → server-reported minus counted
    #: choice → its text chunks in columns (what ``chunks`` is built from)
    per_choice: dict[int, ChoiceChunks] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Attribution (pure, tokenizer-agnostic)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Straddle:
    """A token whose characters span more than one chunk."""

    token: int  # token index in the full encoding
    chunk: int  # index of the piece the token starts in
    last_chunk: int  # index of the piece the token ends in


def attribute_chunks(
    pieces: Sequence[str], ids: Sequence[int], offsets: Sequence[tuple[int, int]]
) -> tuple[list[list[int]], list[Straddle]]:
    """Split a full encoding of ``"".join(pieces)`` into per-piece token ids.

    Each token goes to the piece holding its first character (pieces with no
    text get no tokens), so the per-piece lists concatenate to ``ids``. A token
    whose end lies beyond the end of that piece is a straddle.
    """
    per, straddles = _attribute(pieces, tuple(ids), offsets)
    return [list(p) for p in per], [Straddle(*st) for st in straddles]


_StraddleT = tuple[int, int, int]  # Straddle as a plain tuple (hot path)
_START = itemgetter(0)
_END = itemgetter(1)


def _slices(ids: tuple[int, ...], counts: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    pos = 0
    for n in counts:
        out.append(ids[pos : pos + n])
        pos += n
    return out


def _attribute(
    pieces: Sequence[str], ids: tuple[int, ...], offsets: Sequence[tuple[int, int]]
) -> tuple[list[tuple[int, ...]], list[_StraddleT]]:
    """Per-piece token ids and straddles (see :func:`attribute_chunks`)."""
    counts, straddles = _attribute_counts([len(p) for p in pieces], len(ids), offsets)
    return _slices(ids, counts), straddles


def _attribute_walk(
    ids: tuple[int, ...], offsets: Sequence[tuple[int, int]], ends: list[int]
) -> tuple[list[tuple[int, ...]], list[_StraddleT]]:
    """:func:`_attribute` by walking token by token (the reference)."""
    counts, straddles = _attribute_counts_walk(offsets, ends)
    return _slices(ids, counts), straddles


def _attribute_counts(
    lens: Sequence[int], n_ids: int, offsets: Sequence[tuple[int, int]]
) -> tuple[list[int], list[_StraddleT]]:
    """Tokens attributed to each piece (given by its length) of a text whose
    encoding has ``n_ids`` tokens at ``offsets``, and the straddling tokens
    (token index, piece it starts in, piece it ends in)."""
    n = len(lens)
    if n == 0:
        return [], []
    ends = list(accumulate(lens))
    starts = list(map(_START, offsets))
    if not all(map(le, starts, islice(starts, 1, None))):  # never seen; the per-token walk
        return _attribute_counts_walk(offsets, ends)
    # Token starts are sorted: the tokens of piece j are a slice, cut where
    # the starts reach the piece's end. Only the last token of a piece can
    # reach past its end (tokens cover disjoint byte ranges, in order).
    last = n - 1
    # The cut at a piece's end is the first token starting there (the usual
    # case: a piece ends where a token ends), found by one dict lookup per
    # piece; elsewhere (inside a token, or a piece that starts no token)
    # bisected. ``first`` maps a start to its first token (built backwards:
    # the earliest index of a repeated start is stored last).
    first = dict(zip(reversed(starts), range(len(starts) - 1, -1, -1), strict=True))
    found = list(map(first.get, islice(ends, last)))
    inside = found.count(None)
    his: list[int] = (  # the cut after piece j < last
        [
            bisect_left(starts, e) if h is None else h
            for h, e in zip(found, islice(ends, last), strict=True)
        ]
        if inside
        else cast("list[int]", found)
    )
    bounds = [0, *his, n_ids]
    counts = list(map(sub, islice(bounds, 1, None), bounds))
    if not last or not n_ids:
        return counts, []
    tails = list(map(_END, offsets))
    if not inside and all(map(le, tails, islice(starts, 1, None))):
        # every cut is a token start and no token reaches past the next
        # one's start: no token reaches past its piece
        return counts, []
    # piece j's last token ends past the piece: hi - 1 is -1 for an empty
    # slice at the start (filtered out by its count below)
    reach = map(gt, map(tails.__getitem__, map(sub, his, repeat(1))), ends)
    straddles: list[_StraddleT] = []
    for j in compress(range(last), reach):
        if counts[j]:
            k = his[j] - 1
            straddles.append((k, j, min(bisect_left(ends, tails[k], j), last)))
    return counts, straddles


_Attribution = Callable[
    [Sequence[int], int, Sequence[tuple[int, int]]], tuple[list[int], list[_StraddleT]]
]


@functools.cache
def _attribution() -> _Attribution:
    """:func:`_attribute_counts` as the native core has it
    (``sniffer._native.attribute_counts``: the same values from one pass over
    the pieces and one over the tokens), or this module's when the pure core
    runs (``SPARSEETY_PURE``) or the extension lacks it."""
    from sniffer import native_core

    mod = native_core()[0]
    native: _Attribution | None = getattr(mod, "attribute_counts", None)
    return native if native is not None else _attribute_counts


def _attribute_tiled(
    lens: Sequence[int], ends: Sequence[int]
) -> tuple[list[int], list[_StraddleT]]:
    """:func:`_attribute_counts` of tokens that tile the text in order, given
    by their ends (:class:`_Tiled`)."""
    return _attribute_counts(lens, len(ends), _tiled(ends))


_AttributionTiled = Callable[[Sequence[int], Sequence[int]], tuple[list[int], list[_StraddleT]]]


@functools.cache
def _attribution_tiled() -> _AttributionTiled:
    """:func:`_attribute_tiled` as the native core has it
    (``sniffer._native.attribute_tiled``: no tuple per token); else the
    offsets' attribution (:func:`_attribution`: an extension built before
    ``attribute_tiled`` still has ``attribute_counts``) on the tuples, which
    is this module's :func:`_attribute_tiled` when the pure core runs."""
    from sniffer import native_core

    mod = native_core()[0]
    native: _AttributionTiled | None = getattr(mod, "attribute_tiled", None)
    if native is not None:
        return native
    attribute = _attribution()
    if attribute is _attribute_counts:
        return _attribute_tiled

    def tiled(lens: Sequence[int], ends: Sequence[int]) -> tuple[list[int], list[_StraddleT]]:
        return attribute(lens, len(ends), _tiled(ends))

    return tiled


def _attribute_counts_walk(
    offsets: Sequence[tuple[int, int]], ends: list[int]
) -> tuple[list[int], list[_StraddleT]]:
    n = len(ends)
    counts = [0] * n
    straddles: list[_StraddleT] = []
    j = 0
    last = n - 1
    for k, (start, end) in enumerate(offsets):
        while j < last and ends[j] <= start:
            j += 1
        counts[j] += 1
        if end > ends[j] and j < last:
            straddles.append((k, j, min(bisect_left(ends, end), last)))
    return counts, straddles


#: What the analysis keeps of one choice's attribution (:func:`_choice_summary`):
#: tokens per chunk, straddling tokens per chunk (by the chunk they start in),
#: how many straddle, the token indices and ``straddle`` anomaly details of the
#: first ones listed, and tokens per chunk → chunks with that many (by tokens).
_Summary = tuple[list[int], list[int], int, list[int], list[str], dict[int, int]]


def _choice_summary(
    lens: Sequence[int],
    seqs: Sequence[int],
    n_ids: int,
    offsets: Sequence[tuple[int, int]],
    limit: int,
) -> _Summary:
    """The attribution of a choice's chunks (lengths ``lens``, seqs ``seqs``)
    among ``n_ids`` tokens at ``offsets`` (a :class:`_Tiled` is read by its
    ends), and what the analysis makes of it per chunk, listing at most
    ``limit`` straddles (the reference of the native ``choice_summary``)."""
    if type(offsets) is _Tiled:
        ends: Sequence[int] | None = offsets.ends
        counts, straddles = _attribution_tiled()(lens, offsets.ends)
    else:
        ends = None
        counts, straddles = _attribution()(lens, n_ids, offsets)
    straddle_count = [0] * len(counts)
    for _, first, _ in straddles:
        straddle_count[first] += 1
    listed: list[int] = []
    details: list[str] = []
    # tiling tokens' offsets from their ends, without a call per straddle
    for k, first, end_chunk in straddles[: max(0, limit)]:
        s0, e0 = offsets[k] if ends is None else (ends[k - 1] if k else 0, ends[k])
        listed.append(k)
        details.append(
            f"chars {s0}-{e0} span chunk_index {first + 1}..{end_chunk + 1} "
            f"(seq {seqs[first]}..{seqs[end_chunk]})"
        )
    return counts, straddle_count, len(straddles), listed, details, _histogram(counts)


_Summarizer = Callable[
    [Sequence[int], Sequence[int], int, Sequence[tuple[int, int]], int], _Summary
]


@functools.cache
def _summarizer() -> _Summarizer:
    """:func:`_choice_summary` as the native core has it
    (``sniffer._native.choice_summary`` and ``choice_summary_tiled``: one
    call, the listed straddles' details formatted there); this module's when
    the pure core runs or the extension lacks them."""
    from sniffer import native_core

    mod = native_core()[0]
    whole = getattr(mod, "choice_summary", None)
    tiled = getattr(mod, "choice_summary_tiled", None)
    if whole is None or tiled is None:
        return _choice_summary

    def native(
        lens: Sequence[int],
        seqs: Sequence[int],
        n_ids: int,
        offsets: Sequence[tuple[int, int]],
        limit: int,
    ) -> _Summary:
        if type(offsets) is _Tiled:
            return cast("_Summary", tiled(lens, seqs, offsets.ends, limit))
        return cast("_Summary", whole(lens, seqs, n_ids, offsets, limit))

    return native


# ---------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------


class _Anomalies:
    """Collects anomalies, listing at most MAX_ANOMALIES_PER_KIND per (kind,
    choice), in columns (:class:`AnomalyColumns`: no object per anomaly)."""

    __slots__ = ("choices", "counts", "details", "kinds", "positions")

    def __init__(self, initial: Sequence[Anomaly] = ()) -> None:
        self.kinds: list[str] = []
        self.choices: list[int] = []
        self.positions: list[int | None] = []
        self.details: list[str] = []
        self.counts: dict[tuple[str, int], int] = {}
        for a in initial:
            self.add(a.kind, a.choice, a.position, a.detail)

    def want(self, kind: str, choice: int) -> bool:
        """Count one anomaly; True if it is still to be listed."""
        key = (kind, choice)
        n = self.counts.get(key, 0) + 1
        self.counts[key] = n
        return n <= MAX_ANOMALIES_PER_KIND

    def take(self, kind: str, choice: int, n: int) -> int:
        """Count ``n`` anomalies; how many of them are still to be listed."""
        key = (kind, choice)
        before = self.counts.get(key, 0)
        self.counts[key] = before + n
        return max(0, min(n, MAX_ANOMALIES_PER_KIND - before))

    def room(self, kind: str, choice: int) -> int:
        """How many more anomalies of ``kind`` for ``choice`` would be listed."""
        return max(0, MAX_ANOMALIES_PER_KIND - self.counts.get((kind, choice), 0))

    def add(self, kind: str, choice: int, position: int | None, detail: str) -> None:
        if self.want(kind, choice):
            self.kinds.append(kind)
            self.choices.append(choice)
            self.positions.append(position)
            self.details.append(detail)

    def extend(
        self, kind: str, choice: int, positions: Sequence[int | None], details: Sequence[str]
    ) -> None:
        """List anomalies of one kind and choice (counted already: :meth:`take`)."""
        n = len(positions)
        self.kinds.extend(repeat(kind, n))
        self.choices.extend(repeat(choice, n))
        self.positions.extend(positions)
        self.details.extend(details)

    def result(self) -> AnomalyColumns:
        for (kind, choice), n in self.counts.items():
            if n > MAX_ANOMALIES_PER_KIND:
                more = n - MAX_ANOMALIES_PER_KIND
                self.kinds.append(kind)
                self.choices.append(choice)
                self.positions.append(None)
                self.details.append(f"{more} more not listed")
        return AnomalyColumns(self.kinds, self.choices, self.positions, self.details)


@dataclass(slots=True)
class _Choice:
    """One choice's text chunks (seq order), in columns."""

    seqs: list[int]
    lens: list[int]  # all > 0
    text: str  # their texts joined


@dataclass(slots=True)
class _Prepared:
    """A stream ready to be encoded: its tokenizer, choices and prompt plan."""

    stream: StreamInput
    name: str
    tok: LoadedTokenizer
    pre: list[Anomaly]  # anomalies found before tokenizing
    ordered: ChunkColumns  # all chunks in seq order
    choices: dict[int, _Choice]  # choice → its text chunks, in order of first text
    plan: _PromptPlan | None


#: ids, offsets (a list from the tokenizer, or ``_Tiled``), decoded
_Encoded = tuple[tuple[int, ...], Sequence[tuple[int, int]], str]


def analyze_streams(
    registry: TokenizerRegistry, streams: Sequence[StreamInput]
) -> list[StreamTokens]:
    """Token analysis of many streams, in the order given.

    Streams are grouped by tokenizer; each group makes one encode batch of all
    choice texts, one decode batch (round-trip check) and one or two prompt
    encode batches. A configured tokenizer that fails to load is replaced by
    the default, with a ``tokenizer_error`` anomaly.

    The cyclic garbage collector is paused for the duration of the call (the
    analysis builds many small acyclic objects; collections triggered by them
    would otherwise cost more than the analysis) and re-enabled afterwards if
    it was enabled.
    """
    with gc_paused():
        return _analyze(registry, streams)


#: Whether this process was forked holding frozen objects (``gc.freeze``: a
#: parallel replay's workers), None until asked after a fork. They stay frozen
#: for the process's life, so it is asked once: ``gc.get_freeze_count`` walks
#: every frozen object (~10 ms for a worker's inherited heap, at every batch a
#: worker hands its parent).
_frozen_at_fork: bool | None = False


def _forked() -> None:
    global _frozen_at_fork
    _frozen_at_fork = None


os.register_at_fork(after_in_child=_forked)


def _frozen() -> bool:
    """Whether objects are frozen (``gc.freeze``) in this process."""
    global _frozen_at_fork
    if _frozen_at_fork is None:
        _frozen_at_fork = gc.get_freeze_count() > 0
    return _frozen_at_fork or gc.get_freeze_count() > 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for a block that makes many small
    acyclic objects (the token pass's analysis, rows and SQL values), and
    what the block leaves alive moved to the oldest generation on the way out
    (``gc.freeze`` then ``gc.unfreeze``: two list splices, no walk). Re-enabled
    as it was, the young generation's next collection would otherwise walk
    every survivor (a batch's inputs and rows: as much as the collections it
    saved). Not when objects are frozen already (a forked replay worker
    inherits its parent's: unfreezing them would undo that). Nested uses do
    nothing more."""
    enabled = gc.isenabled()
    if not enabled:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not _frozen():
            gc.freeze()
            gc.unfreeze()
        gc.enable()


def _ordered(chunks: Sequence[ChunkInput]) -> ChunkColumns:
    """The chunks in seq order (a stable sort), in columns."""
    if isinstance(chunks, ChunkColumns):
        return chunks.in_seq_order()
    return ChunkColumns.of(sorted(chunks, key=_seq))


def _split_choices(cols: ChunkColumns) -> dict[int, _Choice]:
    """Choice → its chunks with text (choice >= 0, non-empty text), in seq order;
    choices in the order their first text came."""
    lens, choices = cols.lens, cols.choices
    # The common case: the chunks with text are one run of one choice (a
    # stream's role chunk before it, its finish and usage chunks after), so
    # the choice's text is all the text and its columns are slices; found by
    # C passes that compare small ints by identity (``count``), no object
    # per chunk (three iterator passes cost ~4x as much).
    n = len(lens)
    a = 0
    while a < n and not lens[a]:
        a += 1
    if a == n:
        return {}
    b = n
    while not lens[b - 1]:
        b -= 1
    only = choices[a]
    if only >= 0 and lens.count(0) == n - (b - a) and choices[a:b].count(only) == b - a:
        seqs = cols.seqs[a:b]
        run = lens[a:b]
        return {
            only: _Choice(
                seqs if type(seqs) is list else list(seqs),
                run if type(run) is list else list(run),
                cols.text,
            )
        }
    return _split_chunks(cols)


def _split_chunks(cols: ChunkColumns) -> dict[int, _Choice]:
    """:func:`_split_choices` chunk by chunk (the choices' texts interleave,
    or a stream-level chunk carries text)."""
    lens, choices = cols.lens, cols.choices
    parts: dict[int, tuple[list[int], list[int], list[str]]] = {}
    text = cols.text
    pos = 0
    for seq, ch, n in zip(cols.seqs, choices, lens, strict=True):
        if n and ch >= 0:
            got = parts.get(ch)
            if got is None:
                got = parts[ch] = ([], [], [])
            got[0].append(seq)
            got[1].append(n)
            got[2].append(text[pos : pos + n])
        pos += n
    return {ch: _Choice(s, ls, "".join(ts)) for ch, (s, ls, ts) in parts.items()}


#: Up to this many distinct token counts per chunk are counted one by one
#: (``count``); more, by one ``Counter`` pass (:func:`_histogram`).
_FEW = 8


def _analyze(registry: TokenizerRegistry, streams: Sequence[StreamInput]) -> list[StreamTokens]:
    prepared: list[_Prepared] = []
    # model → (name, tokenizer, tokenizer_error anomaly): resolved once per batch
    resolved: dict[str | None, tuple[str, LoadedTokenizer, Anomaly | None]] = {}
    for s in streams:
        got = resolved.get(s.model)
        if got is None:
            try:
                got = (*registry.resolve(s.model), None)
            except TokenizerLoadError as exc:
                failed = Anomaly("tokenizer_error", _STREAM, None, str(exc))
                got = (registry.default_name, registry.default(), failed)
            resolved[s.model] = got
        name, tok, error = got
        pre: list[Anomaly] = [] if error is None else [error]
        ordered = _ordered(s.chunks)
        choices = _split_choices(ordered)
        plan = tok._prompt_plan(s.request) if isinstance(s.request, dict) else None
        if plan is not None and plan.error is not None:
            pre.append(Anomaly("prompt_template", _STREAM, None, plan.error))
        prepared.append(_Prepared(s, name, tok, pre, ordered, choices, plan))

    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prepared):
        groups.setdefault(id(p.tok), []).append(i)

    results: list[StreamTokens | None] = [None] * len(prepared)
    for members in groups.values():
        tok = prepared[members[0]].tok
        keys = [(i, ch) for i in members for ch in prepared[i].choices]
        encoded = tok._encode_checked([prepared[i].choices[ch].text for i, ch in keys])
        prompts = tok._prompt_ids_batch([prepared[i].plan for i in members])
        enc_of: dict[tuple[int, int], _Encoded] = dict(zip(keys, encoded, strict=True))
        for i, prompt in zip(members, prompts, strict=True):
            results[i] = _assemble(prepared[i], prompt, enc_of, i)
    return [r for r in results if r is not None]


def _seq(c: ChunkInput) -> int:
    return c.seq


def _histogram(counts: list[int]) -> dict[int, int]:
    """Chunks by tokens attributed, by tokens: a ``count()`` per distinct value
    while there are few of them (a C pass each: a ``Counter`` costs ~10 µs for
    60 chunks), else one ``Counter`` pass (a ``count()`` per value would be
    quadratic in a stream whose chunks carry many different counts)."""
    values = sorted(set(counts))
    if len(values) <= _FEW:
        return {v: counts.count(v) for v in values}
    return dict(sorted(Counter(counts).items()))


def _assemble(
    p: _Prepared,
    prompt: list[int],
    enc_of: dict[tuple[int, int], _Encoded],
    index: int,
) -> StreamTokens:
    s, tok = p.stream, p.tok
    anomalies = _Anomalies(p.pre)
    output_ids: dict[int, tuple[int, ...]] = {}
    per_choice: dict[int, ChoiceChunks] = {}
    dist: dict[int, int] = {}
    server_tokens: dict[int, tuple[str, ...]] = {}
    late = _finish_anomalies(s, p.ordered, p.choices, anomalies) if not s.capped else {}
    summarize = _summarizer()

    for ch, cc in p.choices.items():
        ids, offsets, decoded = enc_of[(index, ch)]
        text = cc.text
        seqs = cc.seqs
        output_ids[ch] = ids
        kept = anomalies.room("straddle", ch)
        counts, straddle_count, n_straddles, listed, details, hist = summarize(
            cc.lens, seqs, len(ids), offsets, kept
        )
        if not dist:  # (the first choice: its histogram, in order of tokens)
            dist.update(hist)
        else:
            for n, m in hist.items():
                dist[n] = dist.get(n, 0) + m
        if n_straddles:
            anomalies.take("straddle", ch, n_straddles)
            anomalies.extend("straddle", ch, listed, details)
        per_choice[ch] = ChoiceChunks(seqs, counts, straddle_count, text, hist)

        multi = len(counts) - hist.get(0, 0) - hist.get(1, 0)  # chunks with 2+ tokens
        if multi:
            # the first chunk with 2+ tokens: the first of each such count, by
            # C passes (the counts above 1 are a few histogram keys)
            ci = min(map(counts.index, filter((1).__lt__, hist)))
            anomalies.add(
                "multi_token_chunk",
                ch,
                sum(counts[:ci]),
                f"{multi} of {len(seqs)} chunks carry more than one token "
                f"(first: chunk_index {ci + 1}, seq {seqs[ci]})",
            )

        late_seq = late[ch][0] if ch in late else None
        if late_seq is not None or "\ufffd" in text:
            starts = [o[0] for o in offsets]

            def token_at(char: int, starts: list[int] = starts) -> int | None:
                k = bisect_right(starts, char) - 1
                return k if k >= 0 else None

            char = 0
            for ci, (seq, n) in enumerate(zip(seqs, cc.lens, strict=True)):
                piece = text[char : char + n]
                bad = piece.find("\ufffd")
                if bad >= 0:
                    anomalies.add(
                        "replacement_char",
                        ch,
                        token_at(char + bad),
                        f"U+FFFD x{piece.count(chr(0xFFFD))} in chunk_index {ci + 1} "
                        f"(seq {seq}) at char {char + bad}",
                    )
                if seq == late_seq:
                    anomalies.add(
                        "content_after_finish",
                        ch,
                        token_at(char),
                        f"{len(late[ch])} chunk(s) with text after finish "
                        f"(first: chunk_index {ci + 1}, seq {seq})",
                    )
                char += n

        if tok.unk_id is not None and tok.unk_id in ids:
            for k, t in enumerate(ids):
                if t == tok.unk_id:
                    anomalies.add("unk", ch, k, f"UNK at chars {offsets[k][0]}-{offsets[k][1]}")
        if decoded != text:
            d = _first_difference(decoded, text)
            anomalies.add(
                "roundtrip",
                ch,
                d,
                f"decode(encode(text)) differs at char {d}: "
                f"{decoded[d : d + 12]!r} vs {text[d : d + 12]!r}",
            )

    _server_token_anomalies(p.ordered, tok, output_ids, server_tokens, anomalies)
    usage_diff = (
        _usage(s, p.plan is not None, len(prompt), output_ids, anomalies) if not s.capped else {}
    )
    if s.gap:
        anomalies.add("gap", _STREAM, None, "capture lost bytes of this stream")
    return StreamTokens(  # (positional: a keyword call costs a dict unpacked)
        s.stream_id,  # stream_id
        p.name,  # tokenizer
        tuple(prompt),  # prompt_ids
        output_ids,
        _ChunkTokensView(output_ids, per_choice),  # chunks
        dist if len(per_choice) < 2 else dict(sorted(dist.items())),  # tokens_per_chunk
        server_tokens,
        anomalies.result(),  # anomalies
        usage_diff,
        per_choice,
    )


def _chunk_seq(c: ChunkTokens) -> int:
    return c.seq


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _finish_anomalies(
    s: StreamInput,
    ordered: ChunkColumns,
    choices: dict[int, _Choice],
    anomalies: _Anomalies,
) -> dict[int, list[int]]:
    """Adds ``finish_missing``; returns choice → seqs of text chunks after its finish."""
    finished: dict[int, int] = {}  # choice → seq of its first finish
    stream_finish: int | None = None  # seq of the first stream-level finish
    after: dict[int, list[int]] = {}
    extra = ordered.extra
    # Nothing happens before the first finish: start the walk there.
    finishes = [i for i, (fr, _) in extra.items() if fr is not None]
    if finishes:
        first = min(finishes)
        seqs, chs, lens = ordered.seqs, ordered.choices, ordered.lens
        for i in range(first, len(lens)):
            seq, choice = seqs[i], chs[i]
            done_at = finished.get(choice, stream_finish)
            if lens[i] and choice >= 0 and done_at is not None and seq > done_at:
                after.setdefault(choice, []).append(seq)
            got = extra.get(i)
            if got is not None and got[0] is not None:
                if choice < 0:
                    stream_finish = seq if stream_finish is None else stream_finish
                else:
                    finished.setdefault(choice, seq)
    n = s.request.get("n") if isinstance(s.request, dict) else None
    wanted = n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1024 else 1
    if stream_finish is None:
        # the choices asked for and those that carried text: (0,) in the usual
        # case (one choice asked for, none or it carried text), without sets
        if wanted == 1 and (not choices or (len(choices) == 1 and 0 in choices)):
            expected: Sequence[int] = (0,)
        else:
            expected = sorted(set(range(wanted)) | set(choices))
        for ch in expected:
            if ch not in finished:
                anomalies.add(
                    "finish_missing",
                    ch,
                    None,
                    "no finish_reason" + ("" if s.done_seen else " and no [DONE]"),
                )
    return after


def _server_token_anomalies(
    ordered: ChunkColumns,
    tok: LoadedTokenizer,
    output_ids: dict[int, tuple[int, ...]],
    server_tokens: dict[int, tuple[str, ...]],
    anomalies: _Anomalies,
) -> None:
    reported: dict[int, list[ServerToken]] = {}
    extra = ordered.extra
    for i in sorted(extra):
        logprobs = extra[i][1]
        choice = ordered.choices[i]
        if logprobs is None or choice < 0:
            continue
        parsed = parse_server_tokens(logprobs)
        if parsed is None:
            anomalies.add(
                "server_tokens_invalid",
                choice,
                None,
                f"seq {ordered.seqs[i]}: logprobs not understood: {logprobs[:80]!r}",
            )
            continue
        reported.setdefault(choice, []).extend(parsed)
    for ch, toks in reported.items():
        if not toks:
            continue
        server_tokens[ch] = tuple(t.text for t in toks)
        theirs = [tok.server_token_id(t) for t in toks]
        ours = output_ids.get(ch, ())
        diff = next(
            (i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a is None or a != b),
            None,
        )
        if diff is None and len(theirs) == len(ours):
            continue
        at = diff if diff is not None else min(len(theirs), len(ours))
        server = f"{toks[at].text!r} (id {theirs[at]})" if at < len(toks) else "nothing"
        own = f"{tok.token_text(ours[at])!r} (id {ours[at]})" if at < len(ours) else "nothing"
        anomalies.add(
            "server_token_mismatch",
            ch,
            at,
            f"server reported {len(toks)} tokens, re-tokenization gives {len(ours)}; "
            f"at {at}: server {server} vs own {own}",
        )


def _usage(
    s: StreamInput,
    have_prompt: bool,
    prompt_count: int,
    output_ids: dict[int, tuple[int, ...]],
    anomalies: _Anomalies,
) -> dict[str, int]:
    """Server usage minus own counts. ``completion_tokens`` excludes the reported
    ``completion_tokens_details.reasoning_tokens`` (reasoning text is not tokenized here).
    A usage that is not a JSON object counts as none; Ollama's evaluation
    counters are not compared (``Usage.tokenizer_counts``)."""
    usage = s.usage
    if usage is None or not usage.is_object:
        if s.include_usage_requested:
            anomalies.add(
                "usage_missing", _STREAM, None, "stream_options.include_usage but no usage"
            )
        return {}
    diff: dict[str, int] = {}
    prompt, completion = usage.tokenizer_counts()
    if completion is not None:
        reasoning = usage.reasoning_tokens
        reported = completion - (reasoning or 0)
        own = sum(len(v) for v in output_ids.values())
        diff["completion_tokens"] = reported - own
        if reported != own:
            note = f" ({completion} minus {reasoning} reasoning)" if reasoning else ""
            anomalies.add(
                "usage_mismatch",
                _STREAM,
                None,
                f"completion_tokens: server {reported}{note}, counted {own}",
            )
    if prompt is not None and have_prompt:
        diff["prompt_tokens"] = prompt - prompt_count
        if prompt != prompt_count:
            anomalies.add(
                "usage_mismatch",
                _STREAM,
                None,
                f"prompt_tokens: server {prompt}, counted {prompt_count}",
            )
    return diff
