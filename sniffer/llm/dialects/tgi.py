"""Hugging Face Text Generation Inference: ``POST /generate_stream`` and ``/generate``.

The stream is SSE (TGI writes ``data:{…}`` without a space); each event is one
generated token::

    {"index":1,"token":{"id":1234,"text":" Hello","logprob":-0.3,"special":false},
     "generated_text":null,"details":null,"top_tokens":null}

The last event carries ``generated_text`` (the whole text) and, when the
request asked for ``details``, ``details`` {finish_reason, generated_tokens,
seed, input_length}. Errors come as ``{"error": "...", "error_type": "..."}``.

Mapping (``Delta.choice`` is always 0; TGI's ``index`` is a token position):

* every token → ``server_tokens`` ``[token]`` (JSON list of the token object as
  sent); a non-special token with text → CONTENT with ``text`` and the token
  object as ``logprobs`` (``sniffer.llm.tokens`` reads server tokens from there);
* a special token (``"special": true``, e.g. ``</s>``) is not text: TGI's own
  ``generated_text`` leaves it out, so it is OTHER (FINISH when last) with
  ``raw`` kept and no ``logprobs`` (it would count as a token missing from the
  text);
* the last event (``generated_text`` not null): its Delta carries
  ``details.finish_reason`` and usage ``{"prompt_tokens": input_length,
  "completion_tokens": generated_tokens}`` (only the fields TGI sent), keeps
  ``raw``, and is followed by a stream-level DONE — ``generated_text`` is TGI's
  end-of-stream marker, with or without ``details``;
* an error object → ERROR; broken JSON or a wrong shape → INVALID.

A ``/generate`` body (``{"generated_text":…, "details":{…}}``, or a one-element
list of it as TGI's ``/`` route returns) is one CONTENT Delta with the finish
reason, usage, ``details.tokens`` as server tokens and the non-special ones as
``logprobs``. ``best_of_sequences`` are not recorded as choices.
"""

from __future__ import annotations

from typing import Any

from sniffer.llm.dialects._json import JsonDialect
from sniffer.llm.dialects._json import check_token_ids as _check_token_ids
from sniffer.llm.dialects._json import count_at as _count_at
from sniffer.llm.dialects._json import dumps as _dumps
from sniffer.llm.dialects._json import error_message as _error_message
from sniffer.llm.dialects._json import not_a as _not
from sniffer.llm.dialects.base import (
    CONTENT,
    DONE,
    ERROR,
    FINISH,
    NO_PROOF,
    OTHER,
    PROOF_SHAPE,
    STREAM_LEVEL,
    Delta,
)
from sniffer.llm.values import Usage

__all__ = ["TgiGenerate", "probe"]


def probe(event_type: str, obj: dict[str, Any] | None) -> int:
    """How strongly one streamed item proves a TGI stream (see ``base.Probe``):
    a ``token`` object with an ``id`` and a ``text``."""
    token = obj.get("token") if obj is not None else None
    if isinstance(token, dict) and "id" in token and "text" in token:
        return PROOF_SHAPE
    return NO_PROOF


def _error(obj: dict[str, Any], raw: str) -> Delta:
    message = _error_message(obj.get("error"))
    kind = obj.get("error_type")
    if isinstance(kind, str) and kind:
        message = f"{kind}: {message}"
    return Delta(STREAM_LEVEL, ERROR, raw=raw, error=message)


def _details(obj: dict[str, Any]) -> tuple[str | None, Usage | None]:
    """(finish_reason, usage) from an object's ``details``."""
    details = obj.get("details")
    if details is None:
        return None, None
    if type(details) is not dict:
        raise _not("details", details, "an object")
    finish = details.get("finish_reason")
    if finish is not None and type(finish) is not str:
        raise _not("details.finish_reason", finish, "a string")
    usage: dict[str, Any] = {}
    prompt = _count_at(details, "input_length", "details.input_length")
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    completion = _count_at(details, "generated_tokens", "details.generated_tokens")
    if completion is not None:
        usage["completion_tokens"] = completion
    return finish, (Usage.parse(usage) if usage else None)


class TgiGenerate(JsonDialect):
    """``/generate_stream`` token events, or a ``/generate`` body."""

    name = "tgi.generate"

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        return self._event(obj, data)

    def _event(self, obj: Any, data: str) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("the event", obj, "an object")
        if obj.get("error") is not None:
            return [_error(obj, data)]
        token = obj.get("token")
        if type(token) is not dict:
            raise _not("token", token, "an object")
        text = token.get("text")
        if type(text) is not str:
            raise _not("token.text", text, "a string")
        _check_token_ids(token, "token")
        generated = obj.get("generated_text")
        if generated is not None and type(generated) is not str:
            raise _not("generated_text", generated, "a string")
        last = generated is not None
        finish, usage = _details(obj) if last else (None, None)
        special = token.get("special") is True
        token_text = _dumps(token)
        tokens = "[" + token_text + "]"
        if text and not special:
            kind = CONTENT
        elif last:
            kind = FINISH
        else:
            kind = OTHER
        delta = Delta(
            0,
            kind,
            text="" if special else text,
            finish_reason=finish,
            logprobs=None if special else token_text,
            usage=usage,
            raw=data if (special or last or kind == OTHER) else None,
            server_tokens=tokens,
        )
        if last:
            return [delta, Delta(STREAM_LEVEL, DONE)]
        return [delta]

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        if type(obj) is list and len(obj) == 1:
            obj = obj[0]
        if type(obj) is not dict:
            raise _not("the body", obj, "an object")
        if obj.get("error") is not None:
            return [_error(obj, body)]
        text = obj.get("generated_text")
        if type(text) is not str:
            raise _not("generated_text", text, "a string")
        finish, usage = _details(obj)
        tokens: Any = None
        details = obj.get("details")
        if type(details) is dict:
            tokens = details.get("tokens")
        server_tokens: str | None = None
        logprobs: str | None = None
        if type(tokens) is list and tokens:
            _check_token_ids(tokens, "details.tokens")
            server_tokens = _dumps(tokens)
            plain = [t for t in tokens if not (type(t) is dict and t.get("special") is True)]
            logprobs = _dumps(plain)
        return [
            Delta(
                0,
                CONTENT if text else _ended(finish),
                text=text,
                finish_reason=finish,
                logprobs=logprobs,
                usage=usage,
                server_tokens=server_tokens,
            )
        ]


def _ended(finish: str | None) -> str:
    """The kind of an item without output: FINISH when it carries a finish reason."""
    return FINISH if finish is not None else OTHER
