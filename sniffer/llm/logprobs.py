"""Per-token log-probabilities as servers stream them (pure; no I/O).

One chunk's stored ``logprobs`` JSON (see :mod:`sniffer.llm.dialects`) becomes
a list of :class:`TokenLogprob`: the token's text (and bytes when sent), its
log-probability and the top alternatives the server listed. Shapes read:

* OpenAI chat: ``{"content": [{"token", "logprob", "bytes"?, "top_logprobs":
  [{"token", "logprob", "bytes"?}, ...]}, ...]}`` (``"refusal"`` too);
* OpenAI completions: ``{"tokens": [...], "token_logprobs": [...],
  "top_logprobs": [{token: logprob, ...}, ...]}``;
* TGI: a token object ``{"id", "text", "logprob", "special"}`` or a list of them
  (no alternatives: TGI sends ``top_tokens`` only when asked, as a list next to
  the token, read when present).

Anything else gives ``None`` (not understood), never an exception. The same
parse (:class:`ChunkLogprobs`) gives the server's own tokens too
(:class:`ServerToken`: texts, ids, bytes; plain ids read as well), for the
token pass and the token analysis.
:func:`output_logprobs` joins one output's chunks and keeps the list only when
the tokens spell the output's text (their bytes, decoded with U+FFFD for
invalid sequences as servers do), so a position in it is a position in the text.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sniffer.llm.values import TOKEN_ID_RANGE, in_range

__all__ = [
    "Alternative",
    "ChunkLogprobs",
    "ServerToken",
    "TokenLogprob",
    "output_logprobs",
    "parse_logprobs",
    "parse_server_tokens",
    "read_logprobs",
    "token_starts",
]


@dataclass(frozen=True, slots=True)
class Alternative:
    """One server-reported token (text, log-probability, raw bytes if given)."""

    text: str
    logprob: float
    raw: bytes | None = None

    @property
    def key(self) -> bytes:
        return self.raw if self.raw is not None else self.text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class ServerToken:
    """One token as the server reported it: its text, id and bytes when sent."""

    text: str
    id: int | None = None
    raw: bytes | None = None  # the token's bytes when the server sent them


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: text, bytes (when sent), log-probability (None when
    not sent) and the server's top alternatives (may include the token itself)."""

    text: str
    logprob: float | None
    top: tuple[Alternative, ...] = ()
    raw: bytes | None = None
    id: int | None = None
    #: False when some listed alternative could not be read (e.g. a logprob that
    #: is not a number): "not among the alternatives" then proves nothing
    top_complete: bool = True

    @property
    def key(self) -> bytes:
        """What identifies the token across two streams: its bytes."""
        return self.raw if self.raw is not None else self.text.encode("utf-8", "surrogatepass")


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) or f == -math.inf else None


def _raw(x: Any) -> bytes | None:
    if isinstance(x, list) and all(isinstance(b, int) and 0 <= b < 256 for b in x):
        return bytes(x)
    return None


def _alt(item: Any) -> Alternative | None:
    if not isinstance(item, dict):
        return None
    text = item.get("token", item.get("text"))
    lp = _num(item.get("logprob"))
    raw = _raw(item.get("bytes"))
    if lp is None:
        return None
    if not isinstance(text, str):
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace")
    return Alternative(text, lp, raw)


def _openai_item(item: Any) -> TokenLogprob | None:
    if not isinstance(item, dict):
        return None
    text = item.get("token", item.get("text"))
    raw = _raw(item.get("bytes"))
    tid = item.get("id")
    tid = tid if in_range(tid, TOKEN_ID_RANGE) else None
    if not isinstance(text, str):
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace")
    tops: list[Alternative] = []
    top = item.get("top_logprobs", item.get("top_tokens"))
    complete = True
    if isinstance(top, list):
        for t in top:
            a = _alt(t)
            if a is not None:
                tops.append(a)
            else:
                complete = False
    lp = _num(item.get("logprob"))
    complete = complete and (lp is not None or item.get("logprob") is None)
    return TokenLogprob(text, lp, tuple(tops), raw, tid, complete)


#: How the top level of a chunk's logprobs JSON reads (:class:`ChunkLogprobs`).
_NOT_UNDERSTOOD = 0
_ITEMS = 1  # a list of token items (a list, or OpenAI chat's content + refusal)
_COMPLETIONS = 2  # OpenAI completions' parallel lists
_ONE = 3  # one token object (TGI)
_EMPTY = 4  # null or {}: no tokens


class ChunkLogprobs:
    """One chunk's stored logprobs JSON, parsed once; two views of its tokens:

    * :meth:`tokens`: with their log-probabilities and alternatives
      (:class:`TokenLogprob`, for the reports' logprob columns and causes);
    * :meth:`server_tokens`: the server's own token texts and ids
      (:class:`ServerToken`, for the token pass and the token analysis), which
      also reads plain ids and objects that carry an ``id`` only.

    Each view is None when the JSON is not understood as such tokens (broken
    JSON, another shape, an item that is not a token)."""

    __slots__ = ("_data", "_items", "_kind")

    def __init__(self, text: str) -> None:
        self._kind = _NOT_UNDERSTOOD
        self._items: Any = []  # what the tokens are listed in (a list, if understood)
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # broken, or nested past the parser's depth
            self._data: Any = None
            return
        self._data = data
        if data is None:
            self._kind = _EMPTY
        elif isinstance(data, list):
            self._kind, self._items = _ITEMS, data
        elif isinstance(data, dict):
            if "content" in data or "refusal" in data:
                parts = (data.get("content") or [], data.get("refusal") or [])
                if isinstance(parts[0], list) and isinstance(parts[1], list):
                    self._kind = _ITEMS
                    self._items = parts[0] + parts[1]
            elif "tokens" in data:
                self._kind = _COMPLETIONS
            elif "id" in data or "text" in data or "token" in data:
                self._kind, self._items = _ONE, [data]
            elif not data:
                self._kind = _EMPTY

    def tokens(self) -> list[TokenLogprob] | None:
        """The tokens with their log-probabilities; None when not understood."""
        kind = self._kind
        if kind == _EMPTY:
            return []
        if kind == _COMPLETIONS:
            return _completions(self._data)
        items = self._items
        if (
            kind == _NOT_UNDERSTOOD
            or (kind == _ONE and "text" not in self._data and "token" not in self._data)
            or not isinstance(items, list)
        ):
            return None
        out: list[TokenLogprob] = []
        for item in items:
            t = _openai_item(item)
            if t is None:
                return None
            out.append(t)
        return out

    def server_tokens(self) -> list[ServerToken] | None:
        """The server-reported tokens (texts, ids, bytes); None when not understood."""
        kind = self._kind
        if kind == _NOT_UNDERSTOOD:
            return None
        items = self._data["tokens"] if kind == _COMPLETIONS else self._items
        if not isinstance(items, list):
            return None
        out: list[ServerToken] = []
        for item in items:
            tok = _server_token(item)
            if tok is None:
                return None
            out.append(tok)
        return out


def read_logprobs(text: str) -> ChunkLogprobs:
    """One chunk's stored logprobs JSON, parsed once (see :class:`ChunkLogprobs`)."""
    return ChunkLogprobs(text)


def parse_logprobs(text: str | None) -> list[TokenLogprob] | None:
    """The tokens of one chunk's stored logprobs JSON; None when not understood."""
    return None if text is None else ChunkLogprobs(text).tokens()


def parse_server_tokens(logprobs: str) -> list[ServerToken] | None:
    """Server-reported tokens in one chunk's stored logprobs JSON; None if unparseable.

    Accepted shapes: OpenAI chat ``{"content": [{"token", "bytes"?, ...}]}``
    (``"refusal"`` too), OpenAI completions ``{"tokens": [...]}``, a TGI token
    object ``{"id", "text"}`` or a list of such objects (or of plain ids).
    ``null`` and empty objects give ``[]``.
    """
    return ChunkLogprobs(logprobs).server_tokens()


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _server_token(item: Any) -> ServerToken | None:
    if isinstance(item, str):
        return ServerToken(item)
    if _is_int(item):
        return ServerToken(f"token_id:{item}", item) if in_range(item, TOKEN_ID_RANGE) else None
    if not isinstance(item, dict):
        return None
    text = item.get("token", item.get("text"))
    tid = item.get("id", item.get("token_id"))
    tid = tid if in_range(tid, TOKEN_ID_RANGE) else None
    raw_list = item.get("bytes")
    raw: bytes | None = None
    if isinstance(raw_list, list) and all(_is_int(b) and 0 <= b < 256 for b in raw_list):
        raw = bytes(raw_list)
    if not isinstance(text, str):
        if tid is None and raw is None:
            return None
        text = raw.decode("utf-8", "replace") if raw is not None else f"token_id:{tid}"
    return ServerToken(text, tid, raw)


def _completions(data: dict[str, Any]) -> list[TokenLogprob] | None:
    tokens = data.get("tokens")
    lps = data.get("token_logprobs")
    tops = data.get("top_logprobs")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return None
    out: list[TokenLogprob] = []
    for i, tok in enumerate(tokens):
        lp = _num(lps[i]) if isinstance(lps, list) and i < len(lps) else None
        alts: list[Alternative] = []
        complete = True
        if isinstance(tops, list) and i < len(tops) and isinstance(tops[i], dict):
            for k, v in tops[i].items():
                f = _num(v)
                if isinstance(k, str) and f is not None:
                    alts.append(Alternative(k, f))
                else:
                    complete = False
        out.append(TokenLogprob(tok, lp, tuple(alts), top_complete=complete))
    return out


def output_logprobs(
    chunk_logprobs: Iterable[str | None], text: str
) -> tuple[TokenLogprob, ...] | None:
    """The tokens of one output (its text chunks' logprobs, in order), or None
    when a text chunk has none, one is not understood, or the tokens' bytes do
    not spell ``text``."""
    out: list[TokenLogprob] = []
    for lp in chunk_logprobs:
        got = parse_logprobs(lp)
        if got is None:
            return None
        out.extend(got)
    if not out:
        return None
    raw = b"".join(t.key for t in out)
    # servers decode the generated bytes with replacement (U+FFFD for a token
    # that ends a character another token never completes): so do we
    if raw != text.encode("utf-8", "surrogatepass") and raw.decode("utf-8", "replace") != text:
        return None
    return tuple(out)


def token_starts(tokens: Sequence[TokenLogprob]) -> list[int]:
    """Character start of each token in the text they spell (by bytes: a token
    that ends inside a UTF-8 character starts at that character)."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    starts: list[int] = []
    chars = 0
    for t in tokens:
        starts.append(chars)
        chars += len(dec.decode(t.key))
    return starts
