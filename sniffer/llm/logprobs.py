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

Anything else gives ``None`` (not understood), never an exception.
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

__all__ = ["Alternative", "TokenLogprob", "output_logprobs", "parse_logprobs", "token_starts"]


@dataclass(frozen=True, slots=True)
class Alternative:
    text: str
    logprob: float
    raw: bytes | None = None

    @property
    def key(self) -> bytes:
        return self.raw if self.raw is not None else self.text.encode("utf-8", "surrogatepass")


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


def parse_logprobs(text: str | None) -> list[TokenLogprob] | None:
    """The tokens of one chunk's stored logprobs JSON; None when not understood."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if data is None:
        return []
    if isinstance(data, list):
        items = data
    elif isinstance(data, dict):
        if "content" in data or "refusal" in data:
            items = (data.get("content") or []) + (data.get("refusal") or [])
        elif "tokens" in data:
            return _completions(data)
        elif "text" in data or "token" in data:
            items = [data]
        elif not data:
            return []
        else:
            return None
    else:
        return None
    if not isinstance(items, list):
        return None
    out: list[TokenLogprob] = []
    for item in items:
        t = _openai_item(item)
        if t is None:
            return None
        out.append(t)
    return out


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
