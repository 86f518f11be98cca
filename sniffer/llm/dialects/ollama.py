"""Ollama native API: ``POST /api/generate`` and ``POST /api/chat``.

Streamed replies are NDJSON (``application/x-ndjson``), one object per line;
``"stream": false`` gives one JSON object. Shapes::

    /api/generate  {"model":…,"created_at":…,"response":"The","done":false}
    /api/chat      {"model":…,"message":{"role":"assistant","content":"The"},"done":false}
    last line      {…,"done":true,"done_reason":"stop","total_duration":…,"load_duration":…,
                    "prompt_eval_count":…,"prompt_eval_duration":…,"eval_count":…,"eval_duration":…}
    error          {"error":"model 'x' not found"}

Mapping (``Delta.choice`` is always 0):

* ``response`` / ``message.content`` → CONTENT; ``thinking`` /
  ``message.thinking`` → REASONING; ``message.tool_calls`` → TOOL_CALL, in the
  Chat Completions delta shape (``arguments`` re-serialised as a JSON string,
  since Ollama sends an object);
* a chat line with nothing but the role → ROLE; any other empty line → OTHER;
* ``"done": true`` → its Delta carries ``done_reason`` as the finish reason
  and the server-reported timings as usage — the fields ``total_duration``,
  ``load_duration``, ``prompt_eval_count``, ``prompt_eval_duration``,
  ``eval_count``, ``eval_duration`` under their own names (durations in
  nanoseconds; the store reads ``prompt_eval_count``/``eval_count`` as token
  counts) — and is followed by a stream-level DONE (Ollama's end marker);
  ``context`` (the conversation's token ids) is not kept;
* ``{"error": …}`` → ERROR; broken JSON or a wrong shape → INVALID.

A non-streaming body is the same object with ``done`` true: one Delta (no
DONE).
"""

from __future__ import annotations

from typing import Any

from sniffer.llm.dialects._json import JsonDialect
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
    PROOF_STRONG_SHAPE,
    REASONING,
    ROLE,
    STREAM_LEVEL,
    TOOL_CALL,
    Delta,
)
from sniffer.llm.values import INDEX_RANGE, Usage, check_int

__all__ = ["TIMING_FIELDS", "OllamaChat", "OllamaGenerate", "probe_chat", "probe_generate"]


def _ollama_item(event_type: str, obj: dict[str, Any] | None) -> bool:
    """An NDJSON line, or an object with Ollama's ``done`` field."""
    return obj is not None and (event_type == "ndjson" or "done" in obj)


def probe_chat(event_type: str, obj: dict[str, Any] | None) -> int:
    """How strongly one streamed item proves an ``/api/chat`` stream (see
    ``base.Probe``): an Ollama item with a ``message`` object."""
    if obj is None or not _ollama_item(event_type, obj):
        return NO_PROOF
    return PROOF_STRONG_SHAPE if isinstance(obj.get("message"), dict) else NO_PROOF


def probe_generate(event_type: str, obj: dict[str, Any] | None) -> int:
    """How strongly one streamed item proves an ``/api/generate`` stream (see
    ``base.Probe``): an Ollama item with a ``response`` string (and no
    ``message`` object, which makes it a chat item)."""
    if obj is None or not _ollama_item(event_type, obj) or isinstance(obj.get("message"), dict):
        return NO_PROOF
    return PROOF_STRONG_SHAPE if isinstance(obj.get("response"), str) else NO_PROOF


#: Server-reported counts and timings kept, under Ollama's own names, as usage.
TIMING_FIELDS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


def _str_field(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if type(value) is not str:
        raise _not(where, value, "a string")
    return value


def _tool_calls(calls: Any) -> str | None:
    if calls is None:
        return None
    if type(calls) is not list:
        raise _not("message.tool_calls", calls, "an array")
    out: list[dict[str, Any]] = []
    for position, call in enumerate(calls):
        if type(call) is not dict:
            raise _not(f"message.tool_calls[{position}]", call, "an object")
        function = call.get("function")
        if type(function) is not dict:
            raise _not(f"message.tool_calls[{position}].function", function, "an object")
        where = f"message.tool_calls[{position}].function.index"
        index = check_int(function.get("index"), INDEX_RANGE, where)
        entry: dict[str, Any] = {"index": position if index is None else index}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        entry["type"] = "function"
        fn: dict[str, Any] = {}
        if isinstance(function.get("name"), str):
            fn["name"] = function["name"]
        args = function.get("arguments")
        fn["arguments"] = args if type(args) is str else ("" if args is None else _dumps(args))
        entry["function"] = fn
        out.append(entry)
    return _dumps(out) if out else None


class _OllamaBase(JsonDialect):
    name = "ollama"
    _chat = False

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        return self._item(obj, data, True)

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        return self._item(obj, body, False)

    def _item(self, obj: Any, data: str, stream: bool) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("the item", obj, "an object")
        err = obj.get("error")
        if err is not None:
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=_error_message(err))]
        role = False
        tool_text: str | None = None
        if self._chat:
            message = obj.get("message")
            if message is None:
                message = {}
            elif type(message) is not dict:
                raise _not("message", message, "an object")
            text = _str_field(message, "content", "message.content")
            reasoning = _str_field(message, "thinking", "message.thinking")
            tool_text = _tool_calls(message.get("tool_calls"))
            role = message.get("role") is not None
        else:
            text = _str_field(obj, "response", "response")
            reasoning = _str_field(obj, "thinking", "thinking")
        done = obj.get("done")
        if done is not None and type(done) is not bool:
            raise _not("done", done, "a boolean")
        finish: str | None = None
        usage: Usage | None = None
        if done:
            reason = obj.get("done_reason")
            if reason is not None and type(reason) is not str:
                raise _not("done_reason", reason, "a string")
            finish = reason
            for k in TIMING_FIELDS:  # counts and nanosecond durations (the counts: Usage)
                _count_at(obj, k, k)
            timings = {k: obj[k] for k in TIMING_FIELDS if obj.get(k) is not None}
            usage = Usage.parse(timings) if timings else None
        raw: str | None = None
        if text:
            kind = CONTENT
        elif reasoning:
            kind = REASONING
        elif tool_text is not None:
            kind = TOOL_CALL
        elif done:
            kind = FINISH
        elif role and stream:
            kind = ROLE
        else:
            kind = OTHER
            raw = data
        delta = Delta(
            0,
            kind,
            text=text,
            reasoning=reasoning,
            tool_calls=tool_text,
            finish_reason=finish,
            usage=usage,
            raw=raw,
        )
        if done and stream:
            return [delta, Delta(STREAM_LEVEL, DONE)]
        return [delta]


class OllamaGenerate(_OllamaBase):
    """``POST /api/generate``: ``response`` pieces."""

    name = "ollama.generate"
    _chat = False


class OllamaChat(_OllamaBase):
    """``POST /api/chat``: ``message.content`` pieces."""

    name = "ollama.chat"
    _chat = True
