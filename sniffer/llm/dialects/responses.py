"""OpenAI Responses API (``POST /v1/responses``), streamed and not.

A Responses stream is a sequence of named SSE events whose JSON ``data`` repeats
the name in ``type`` (the ``type`` in the data wins; the SSE ``event:`` field is
the fallback). There is no ``[DONE]``: the terminal event is
``response.completed``, ``response.incomplete`` or ``response.failed``.

Mapping (``Delta.choice`` is the item's ``output_index``):

* ``response.output_text.delta`` → CONTENT (``delta``; a non-empty ``logprobs``
  list is kept as ``logprobs``);
* ``response.reasoning_text.delta``, ``response.reasoning_summary_text.delta``
  (any ``response.reasoning….delta`` with a string ``delta``) → REASONING;
* ``response.output_item.added`` of a ``function_call`` / ``custom_tool_call``
  item → TOOL_CALL carrying the call id and name; then
  ``response.function_call_arguments.delta`` /
  ``response.custom_tool_call_input.delta`` → TOOL_CALL with the arguments
  piece. ``tool_calls`` uses the Chat Completions delta shape, so consumers
  assemble tool calls of every dialect the same way:
  ``[{"index":0,"id":…,"type":"function","function":{"name":…,"arguments":…}}]``
  (``id``/``type``/``name`` only on the first piece);
* ``response.output_item.added`` of a ``message`` item → ROLE (the prelude);
* ``response.completed`` → one FINISH ``"completed"`` per output index seen,
  the response's ``usage`` on the last of them, then a stream-level DONE;
  ``response.incomplete`` the same with ``"incomplete: <reason>"``;
  ``response.failed`` → FINISH ``"failed"`` per output index, then ERROR with
  the response's error message (no DONE);
* an ``error`` event (or any ``{"error": {...}}`` object) → ERROR;
* every other event (created, in_progress, content_part.*, *.done, refusal
  deltas, annotations, built-in tool progress, …) → OTHER with ``raw`` kept;
* broken JSON or a wrong shape → INVALID; never an exception.

A non-streaming body (a ``response`` object) gives one Delta per output item:
a ``message`` → CONTENT (its ``output_text`` parts joined), ``reasoning`` →
REASONING (summary and reasoning text joined), ``function_call`` → TOOL_CALL
with the whole arguments; each carries the status-derived finish reason, the
last one the usage. A failed response adds ERROR.
"""

from __future__ import annotations

from typing import Any

from sniffer.llm.dialects._json import JsonDialect
from sniffer.llm.dialects._json import check_token_ids as _check_token_ids
from sniffer.llm.dialects._json import dumps as _dumps
from sniffer.llm.dialects._json import error_message as _error_message
from sniffer.llm.dialects._json import index_at as _index_at
from sniffer.llm.dialects._json import not_a as _not
from sniffer.llm.dialects.base import (
    CONTENT,
    DONE,
    ERROR,
    FINISH,
    NO_PROOF,
    OTHER,
    PROOF_EVENT_NAME,
    PROOF_TYPE_FIELD,
    REASONING,
    ROLE,
    STREAM_LEVEL,
    TOOL_CALL,
    Delta,
)
from sniffer.llm.values import INDEX_RANGE, Usage, check_int

__all__ = ["OpenAIResponses", "probe", "responses_finish_reason", "tool_call_delta"]

#: What every event name (SSE ``event:``, and each event's ``type``) starts with.
_EVENT_PREFIX = "response."


def probe(event_type: str, obj: dict[str, Any] | None) -> int:
    """How strongly one streamed item proves a Responses stream (see
    ``base.Probe``): by its SSE event name, or by its ``type``."""
    if event_type.startswith(_EVENT_PREFIX):
        return PROOF_EVENT_NAME
    typ = obj.get("type") if obj is not None else None
    if isinstance(typ, str) and typ.startswith(_EVENT_PREFIX):
        return PROOF_TYPE_FIELD
    return NO_PROOF


_TOOL_ITEMS = frozenset({"function_call", "custom_tool_call"})
_TOOL_ARG_DELTAS = frozenset(
    {"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"}
)
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def responses_finish_reason(response: dict[str, Any], fallback: str | None) -> str | None:
    """The finish reason of a response object: ``"completed"``, ``"failed"``,
    ``"incomplete: <reason>"`` (``"incomplete"`` without details), else ``fallback``."""
    status = response.get("status")
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return f"incomplete: {reason}" if isinstance(reason, str) and reason else "incomplete"
    if status in ("completed", "failed", "cancelled"):
        return str(status)
    return fallback


def _output_index(obj: dict[str, Any]) -> int:
    return _index_at(obj, "output_index", "output_index", 0)


def _string(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if type(value) is not str:
        raise _not(key, value, "a string")
    return value


def tool_call_delta(call_id: Any, name: Any, arguments: str, index: int = 0) -> str:
    """One tool-call piece as Chat Completions ``delta.tool_calls`` JSON text:
    ``[{"index":…,"id":…,"type":"function","function":{"name":…,"arguments":…}}]``
    (``id`` and ``name`` only when given)."""
    call: dict[str, Any] = {"index": index}
    if isinstance(call_id, str):
        call["id"] = call_id
    call["type"] = "function"
    function: dict[str, Any] = {}
    if isinstance(name, str):
        function["name"] = name
    function["arguments"] = arguments
    call["function"] = function
    text: str = _dumps([call])
    return text


class OpenAIResponses(JsonDialect):
    """``POST /v1/responses``: named SSE events, or one ``response`` object."""

    name = "openai.responses"
    whole_message = True  # content blocks / output items are one output

    def __init__(self) -> None:
        self._outputs: set[int] = set()  # output indices seen in this stream

    # ------------------------------------------------------------- streamed

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("the event", obj, "an object")
        kind = obj.get("type")
        if type(kind) is not str:
            kind = event_type
        if kind == "error":
            err = obj.get("error")
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=_error_message(err or obj))]
        if kind == "response.output_text.delta":
            index = _output_index(obj)
            self._outputs.add(index)
            piece = _string(obj, "delta")
            if not piece:
                return [Delta(index, OTHER, raw=data)]
            logprobs = obj.get("logprobs")
            _check_token_ids(logprobs, "logprobs")
            return [
                Delta(index, CONTENT, text=piece, logprobs=_dumps(logprobs) if logprobs else None)
            ]
        if kind.startswith("response.reasoning") and kind.endswith(".delta"):
            index = _output_index(obj)
            self._outputs.add(index)
            reasoning = obj.get("delta")
            if type(reasoning) is str and reasoning:
                return [Delta(index, REASONING, reasoning=reasoning)]
            return [Delta(index, OTHER, raw=data)]
        if kind in _TOOL_ARG_DELTAS:
            index = _output_index(obj)
            self._outputs.add(index)
            piece = _string(obj, "delta")
            return [Delta(index, TOOL_CALL, tool_calls=tool_call_delta(None, None, piece))]
        if kind == "response.output_item.added":
            index = _output_index(obj)
            self._outputs.add(index)
            item = obj.get("item")
            if type(item) is not dict:
                raise _not("item", item, "an object")
            item_type = item.get("type")
            if item_type in _TOOL_ITEMS:
                args = item.get("arguments", item.get("input", ""))
                calls = tool_call_delta(
                    item.get("call_id"), item.get("name"), args if type(args) is str else ""
                )
                return [Delta(index, TOOL_CALL, tool_calls=calls)]
            if item_type == "message":
                return [Delta(index, ROLE)]
            return [Delta(index, OTHER, raw=data)]
        if kind in _TERMINAL:
            return self._terminal(kind, obj, data)
        if obj.get("error") is not None and not kind.startswith("response."):
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=_error_message(obj["error"]))]
        return [Delta(_safe_index(obj), OTHER, raw=data)]

    def _terminal(self, kind: str, obj: dict[str, Any], data: str) -> list[Delta]:
        response = obj.get("response")
        if type(response) is not dict:
            raise _not("response", response, "an object")
        fallback = kind.removeprefix("response.")
        finish = responses_finish_reason(response, fallback)
        if kind == "response.failed":
            finish = "failed"
        usage = response.get("usage")
        usage_value = None if usage is None else Usage.parse(usage)
        outputs = set(self._outputs)
        output = response.get("output")
        if type(output) is list:
            outputs.update(range(len(output)))
        if not outputs:
            outputs.add(0)
        order = sorted(outputs)
        out = [
            Delta(i, FINISH, finish_reason=finish, usage=usage_value if i == order[-1] else None)
            for i in order
        ]
        if kind == "response.failed":
            err = response.get("error")
            message = _error_message(err) if err is not None else "response failed"
            out.append(Delta(STREAM_LEVEL, ERROR, raw=data, error=message))
        else:
            out.append(Delta(STREAM_LEVEL, DONE))
        return out

    # ---------------------------------------------------------- non-streamed

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("the body", obj, "an object")
        err = obj.get("error")
        output = obj.get("output")
        if err is not None and output is None:
            return [Delta(STREAM_LEVEL, ERROR, raw=body, error=_error_message(err))]
        if type(output) is not list:
            raise _not("output", output, "an array")
        finish = responses_finish_reason(obj, None)
        out: list[Delta] = []
        for position, item in enumerate(output):
            if type(item) is not dict:
                raise _not(f"output[{position}]", item, "an object")
            out.append(_output_item(item, position, finish, body))
        if not out:
            out.append(Delta(0, FINISH if finish is not None else OTHER, finish_reason=finish))
        usage = obj.get("usage")
        if usage is not None:
            out[-1] = out[-1]._replace(usage=Usage.parse(usage))
        if obj.get("status") == "failed" or err is not None:
            message = _error_message(err) if err is not None else "response failed"
            out.append(Delta(STREAM_LEVEL, ERROR, raw=body, error=message))
        return out


def _safe_index(obj: dict[str, Any]) -> int:
    """The ``output_index`` of an event not modelled: stream level when it has
    none (or not an integer); a number out of range is bad input."""
    index = check_int(obj.get("output_index"), INDEX_RANGE, "output_index")
    return STREAM_LEVEL if index is None else index


def _parts_text(parts: Any, types: tuple[str, ...], key: str, where: str) -> str:
    if parts is None:
        return ""
    if type(parts) is not list:
        raise _not(where, parts, "an array")
    pieces: list[str] = []
    for part in parts:
        if type(part) is dict and part.get("type") in types:
            text = part.get(key)
            if type(text) is str:
                pieces.append(text)
    return "".join(pieces)


def _output_item(item: dict[str, Any], position: int, finish: str | None, body: str) -> Delta:
    item_type = item.get("type")
    if item_type == "message":
        text = _parts_text(item.get("content"), ("output_text",), "text", "content")
        logprobs: list[Any] = []
        for part in item.get("content") or []:
            if type(part) is dict and part.get("type") == "output_text":
                lp = part.get("logprobs")
                _check_token_ids(lp, "logprobs")
                if type(lp) is list:
                    logprobs.extend(lp)
        return Delta(
            position,
            CONTENT if text else _ended(finish),
            text=text,
            finish_reason=finish,
            logprobs=_dumps(logprobs) if logprobs else None,
        )
    if item_type == "reasoning":
        reasoning = _parts_text(
            item.get("summary"), ("summary_text",), "text", "summary"
        ) + _parts_text(item.get("content"), ("reasoning_text",), "text", "content")
        return Delta(
            position,
            REASONING if reasoning else _ended(finish),
            reasoning=reasoning,
            finish_reason=finish,
        )
    if item_type in _TOOL_ITEMS:
        args = item.get("arguments", item.get("input", ""))
        calls = tool_call_delta(
            item.get("call_id"), item.get("name"), args if type(args) is str else ""
        )
        return Delta(position, TOOL_CALL, tool_calls=calls, finish_reason=finish)
    return Delta(position, OTHER, finish_reason=finish, raw=_dumps(item))


def _ended(finish: str | None) -> str:
    """The kind of an item without output: FINISH when it carries a finish reason."""
    return FINISH if finish is not None else OTHER
