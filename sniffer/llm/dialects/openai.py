"""OpenAI Chat Completions and (legacy) Completions, streamed and not.

Wire shapes handled (all seen from real servers):

* the role prelude ``{"delta":{"role":"assistant","content":""}}`` (vLLM,
  OpenAI, llama.cpp) → ROLE, never output;
* ``delta.content`` / ``text`` → CONTENT; ``delta.reasoning_content`` or
  ``delta.reasoning`` → REASONING; ``delta.tool_calls`` → TOOL_CALL;
  a ``finish_reason`` alone → FINISH; ``""`` with no role (llama.cpp, for a
  token ending inside a UTF-8 character) → OTHER with ``raw`` kept;
* ``n > 1``: one Delta per entry of ``choices``, keyed by its ``index``;
* ``usage`` on a chunk that has choices (transformers serve puts it in the
  finish chunk, vLLM ``continuous_usage_stats`` on every chunk) is attached to
  the chunk's last Delta; on a chunk with ``choices`` empty, null or missing it
  is a stream-level USAGE Delta;
* llama.cpp's ``timings`` object (on the last chunk, or on every chunk with
  ``timings_per_token``) is kept in the usage JSON under ``"timings"``
  (``{"timings": {...}}`` when the chunk has no usage), so it travels with the
  delta the usage goes to;
* ``data: [DONE]`` → DONE; ``{"error": {...}}``, ``{"error": "text"}`` or a flat
  ``{"object": "error", "message": ...}`` (older vLLM) → ERROR;
* broken JSON or a wrong shape → INVALID with the raw text; never an exception.

U+FFFD inside content is content: the token-boundary anomaly is for the
tokens stage to report, not a parse error.

Each item's JSON is parsed once and only the fields present are re-serialised.
"""

from __future__ import annotations

from json import loads as _json_loads
from typing import Any

from sniffer.llm.dialects._json import FastDecodeError as _FastDecodeError
from sniffer.llm.dialects._json import JsonDialect, Shape
from sniffer.llm.dialects._json import bad_index as _bad_index
from sniffer.llm.dialects._json import check_token_ids as _check_token_ids
from sniffer.llm.dialects._json import dumps as _dumps
from sniffer.llm.dialects._json import error_message as _error_message
from sniffer.llm.dialects._json import fast_loads as _fast_loads
from sniffer.llm.dialects._json import invalid as _invalid
from sniffer.llm.dialects._json import not_a as _not
from sniffer.llm.dialects.base import (
    CONTENT,
    DONE,
    ERROR,
    FINISH,
    OTHER,
    REASONING,
    ROLE,
    STREAM_LEVEL,
    TOOL_CALL,
    USAGE,
    Delta,
)
from sniffer.llm.values import INDEX_MAX, OutOfRange, Usage

__all__ = ["CHAT", "COMPLETIONS", "OpenAIChat", "OpenAICompletions"]

#: The dialects' names, as module constants: the registry reads these, never
#: ``OpenAIChat.name`` (compiled with mypyc, a class attribute that instances
#: override is not readable through the class).
CHAT = "openai.chat"
COMPLETIONS = "openai.completions"

_DONE = "[DONE]"
#: What an empty event (``data:`` and a blank line) is: nothing we model.
_EMPTY_EVENT = Delta(STREAM_LEVEL, OTHER, raw="")

_new_tuple = tuple.__new__


def _delta(
    choice: int,
    kind: str,
    text: str,
    reasoning: str,
    tool_calls: str | None,
    finish_reason: str | None,
    logprobs: str | None,
    usage: Usage | None,
    raw: str | None,
) -> Delta:
    """``Delta(choice, kind, text, …, raw)`` built in one C call: the hot path
    (one per streamed chunk) skips the named tuple's keyword-handling
    ``__new__``; ``error`` and ``server_tokens`` are None."""
    return _new_tuple(
        Delta,
        (
            choice,
            kind,
            text,
            reasoning,
            tool_calls,
            finish_reason,
            logprobs,
            usage,
            raw,
            None,
            None,
        ),
    )


def _with_timings(usage: Any, timings: Any) -> Any:
    """llama.cpp's ``timings`` (prompt_n, prompt_ms, predicted_n, predicted_ms, …)
    kept inside the usage JSON as ``"timings"``."""
    if usage is None:
        return {"timings": timings}
    if type(usage) is dict:
        return {**usage, "timings": timings}
    return usage


class _OpenAIBase(JsonDialect):
    """Parsing shared by both endpoints; subclasses read one choice."""

    name = "openai"

    def event(self, data: str, event_type: str) -> list[Delta]:
        """One SSE event's data (or NDJSON line): ``JsonDialect.event`` with its
        calls inlined (one per streamed chunk)."""
        if data == _DONE:
            return [Delta(STREAM_LEVEL, DONE)]
        if not data:  # an empty event (what _unparsed makes of it, without two exceptions)
            return [_EMPTY_EVENT]
        try:
            try:
                obj = _fast_loads(data)
            except _FastDecodeError:
                obj = _json_loads(data)  # NaN, Infinity, lone surrogates
        except (ValueError, RecursionError) as exc:
            return self._unparsed(data, event_type, exc)
        if not self._named and type(obj) is dict:
            self._name(obj)
        try:
            return self._chunk(obj, data, True)
        except (Shape, OutOfRange) as exc:
            return _invalid(data, str(exc))
        except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
            return _invalid(data, f"{type(exc).__name__}: {exc}")

    def _unparsed(self, data: str, event_type: str, exc: Exception) -> list[Delta]:
        if data.strip() == _DONE:
            return [Delta(STREAM_LEVEL, DONE)]
        return super()._unparsed(data, event_type, exc)

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        return self._chunk(obj, data, True)

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        return self._chunk(obj, body, False)

    def _chunk(self, obj: Any, data: str, stream: bool) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("the item", obj, "an object")
        get = obj.get
        err = get("error")
        if err is not None:
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=_error_message(err))]
        if get("object") == "error":
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=_error_message(obj))]
        choices = get("choices")
        usage = get("usage")
        timings = get("timings")
        if timings is not None:
            usage = _with_timings(usage, timings)
        # per chunk: no call when there is no usage (the common case)
        usage_value = None if usage is None else Usage.parse(usage)
        if not choices:
            if choices is not None and type(choices) is not list:
                raise _not("choices", choices, "an array")
            if usage_value is not None:
                return [Delta(STREAM_LEVEL, USAGE, usage=usage_value)]
            return [Delta(STREAM_LEVEL, OTHER, raw=data)]
        if type(choices) is not list:
            raise _not("choices", choices, "an array")
        read = self._choice
        if len(choices) == 1:  # the usual case
            if stream:
                return [read(choices[0], 0, data, True, usage_value)]
            out = [read(choices[0], 0, data, False, None)]
        else:
            last = len(choices) - 1 if stream else -1
            out = [
                read(choice, position, data, stream, usage_value if position == last else None)
                for position, choice in enumerate(choices)
            ]
            if stream:
                return out
        if usage_value is not None:
            out.append(Delta(STREAM_LEVEL, USAGE, usage=usage_value))
        return out

    def _choice(
        self, choice: Any, position: int, data: str, stream: bool, usage: Usage | None
    ) -> Delta:
        """One entry of ``choices``; ``usage`` (streaming only) goes on its Delta."""
        raise NotImplementedError


def _index(choice: dict[str, Any], position: int) -> int:
    index = choice.get("index", position)
    if type(index) is not int or not 0 <= index <= INDEX_MAX:
        raise _bad_index(f"choices[{position}].index", index)
    return index


def _logprobs_text(logprobs: Any, position: int) -> str | None:
    """The choice's logprobs as JSON text (None for none), its token ids checked."""
    if logprobs is None:
        return None
    _check_token_ids(logprobs, f"choices[{position}].logprobs")
    text: str = _dumps(logprobs)
    return text


class OpenAIChat(_OpenAIBase):
    """``POST /v1/chat/completions``: ``choices[].delta`` streamed, ``choices[].message`` whole."""

    name = CHAT

    def _choice(
        self, choice: Any, position: int, data: str, stream: bool, usage: Usage | None
    ) -> Delta:
        if type(choice) is not dict:
            raise _not(f"choices[{position}]", choice, "an object")
        index = choice.get("index", position)  # _index(), inlined: one per streamed chunk
        if type(index) is not int or not 0 <= index <= INDEX_MAX:
            raise _bad_index(f"choices[{position}].index", index)
        key = "delta" if stream else "message"
        msg = choice.get(key)
        if msg is None:
            msg = {}
        elif type(msg) is not dict:
            raise _not(f"choices[{position}].{key}", msg, "an object")
        get = msg.get
        content = get("content")
        if content is not None and type(content) is not str:
            raise _not(f"choices[{position}].{key}.content", content, "a string")
        reasoning = get("reasoning_content")
        if reasoning is None:
            reasoning = get("reasoning")
        if reasoning is not None and type(reasoning) is not str:
            raise _not(f"choices[{position}].{key}.reasoning_content", reasoning, "a string")
        tool_calls = get("tool_calls")
        tool_text: str | None = None
        if tool_calls is not None:
            if type(tool_calls) is not list:
                raise _not(f"choices[{position}].{key}.tool_calls", tool_calls, "an array")
            if tool_calls:
                tool_text = _dumps(tool_calls)
        finish = choice.get("finish_reason")
        if finish is not None and type(finish) is not str:
            raise _not(f"choices[{position}].finish_reason", finish, "a string")
        logprobs = choice.get("logprobs")
        logprobs_text = None if logprobs is None else _logprobs_text(logprobs, position)
        raw = None
        if content:
            kind = CONTENT
        elif reasoning:
            kind = REASONING
        elif tool_text is not None:
            kind = TOOL_CALL
        elif finish is not None:
            kind = FINISH
        elif stream and get("role") is not None:
            kind = ROLE
        else:
            kind = OTHER
            raw = data
        return _new_tuple(  # _delta(), inlined
            Delta,
            (
                index,
                kind,
                content or "",
                reasoning or "",
                tool_text,
                finish,
                logprobs_text,
                usage,
                raw,
                None,
                None,
            ),
        )


class OpenAICompletions(_OpenAIBase):
    """``POST /v1/completions``: ``choices[].text``, streamed or whole."""

    name = COMPLETIONS

    def _choice(
        self, choice: Any, position: int, data: str, stream: bool, usage: Usage | None
    ) -> Delta:
        if type(choice) is not dict:
            raise _not(f"choices[{position}]", choice, "an object")
        index = _index(choice, position)
        text = choice.get("text")
        if text is not None and type(text) is not str:
            raise _not(f"choices[{position}].text", text, "a string")
        finish = choice.get("finish_reason")
        if finish is not None and type(finish) is not str:
            raise _not(f"choices[{position}].finish_reason", finish, "a string")
        logprobs = choice.get("logprobs")
        logprobs_text = None if logprobs is None else _logprobs_text(logprobs, position)
        raw = None
        if text:
            kind = CONTENT
        elif finish is not None:
            kind = FINISH
        else:
            kind = OTHER
            raw = data
        return _delta(index, kind, text or "", "", None, finish, logprobs_text, usage, raw)
