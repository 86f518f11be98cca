"""Anthropic Messages API (``POST /v1/messages``), streamed and not.

A stream is a sequence of named SSE events (the ``type`` inside the data wins
over the SSE ``event:`` field): ``message_start``, then per content block
``content_block_start`` / ``content_block_delta``… / ``content_block_stop``,
then ``message_delta`` (stop reason, cumulative usage) and ``message_stop``;
``ping`` may come anywhere, and so may ``error``.

Mapping (``Delta.choice`` is the content block ``index``):

* ``message_start`` → stream-level ROLE carrying ``message.usage``;
* ``content_block_delta``: ``text_delta`` → CONTENT, ``thinking_delta`` →
  REASONING, ``input_json_delta`` → TOOL_CALL (the ``partial_json`` piece);
  ``signature_delta``, ``citations_delta`` and unknown deltas → OTHER with
  ``raw``;
* ``content_block_start`` of a ``tool_use`` / ``server_tool_use`` block →
  TOOL_CALL with its id and name; a start whose ``text`` / ``thinking`` is
  non-empty → CONTENT / REASONING; any other start → OTHER;
* ``tool_calls`` uses the Chat Completions delta shape
  ``[{"index":0,"id":…,"type":"function","function":{"name":…,"arguments":…}}]``
  (``id``/``type``/``name`` only on the block start), so tool calls of every
  dialect assemble the same way;
* ``message_delta`` → FINISH with ``delta.stop_reason`` on **every content
  block seen** (thinking, text, tool use…; block 0 when there were none), so
  each output position the export lists ends with the message's stop reason,
  as every output item of a Responses stream does. Usage:
  ``message_delta.usage`` holds cumulative counts (often only
  ``output_tokens``), so the usage attached (to the last FINISH) is
  ``message_start``'s usage updated with it — the stored usage then has both
  ``input_tokens`` and ``output_tokens``;
* ``message_stop`` → stream-level DONE (the stream's end marker);
* ``error`` (``{"type":"error","error":{"type":…,"message":…}}``) → ERROR;
* ``ping``, ``content_block_stop`` and unknown events → OTHER with ``raw``;
* broken JSON or a wrong shape → INVALID; never an exception.

A non-streaming body (a ``message`` object) gives one Delta per content
block: text → CONTENT, thinking → REASONING, tool_use → TOOL_CALL (the whole
``input`` as JSON arguments), others → OTHER; every block carries
``stop_reason``; the last Delta carries ``usage``.
"""

from __future__ import annotations

from typing import Any

from sniffer.llm.dialects._json import JsonDialect
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
    USAGE,
    Delta,
)
from sniffer.llm.dialects.responses import tool_call_delta
from sniffer.llm.values import Usage

__all__ = ["AnthropicMessages", "probe"]

#: The event names (SSE ``event:``, and each event's ``type``) of a stream.
_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
)


def probe(event_type: str, obj: dict[str, Any] | None) -> int:
    """How strongly one streamed item proves a Messages stream (see ``base.Probe``):
    by its SSE event name, or by its ``type``."""
    if event_type in _EVENTS:
        return PROOF_EVENT_NAME
    typ = obj.get("type") if obj is not None else None
    if isinstance(typ, str) and typ in _EVENTS:
        return PROOF_TYPE_FIELD
    return NO_PROOF


_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use"})


def _block_index(obj: dict[str, Any]) -> int:
    return _index_at(obj, "index", "index")


def _as_dict(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    if type(value) is not dict:
        raise _not(key, value, "an object")
    return value


class AnthropicMessages(JsonDialect):
    """``POST /v1/messages``: named SSE events, or one ``message`` object."""

    name = "anthropic.messages"
    whole_message = True  # content blocks / output items are one output

    def __init__(self) -> None:
        self._blocks: dict[int, str] = {}  # block index → block type
        self._usage: dict[str, Any] = {}  # message_start usage, updated by message_delta

    # ------------------------------------------------------------- streamed

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("the event", obj, "an object")
        kind = obj.get("type")
        if type(kind) is not str:
            kind = event_type
        if kind == "content_block_delta":
            return [self._block_delta(obj, data)]
        if kind == "content_block_start":
            return [self._block_start(obj, data)]
        if kind == "message_delta":
            return self._message_delta(obj)
        if kind == "message_start":
            message = _as_dict(obj, "message")
            usage = message.get("usage")
            if type(usage) is dict:
                self._usage = dict(usage)
            return [Delta(STREAM_LEVEL, ROLE, usage=Usage.parse(usage))]
        if kind == "message_stop":
            return [Delta(STREAM_LEVEL, DONE)]
        if kind == "error" or obj.get("error") is not None:
            err = obj.get("error")
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=_error_message(err or obj))]
        if kind == "content_block_stop":
            # a block whose start was not seen (a stream recovered mid-way) still ends
            index = _block_index(obj)
            self._blocks.setdefault(index, "")
            return [Delta(index, OTHER, raw=data)]
        return [Delta(STREAM_LEVEL, OTHER, raw=data)]  # ping, unknown events

    def _block_start(self, obj: dict[str, Any], data: str) -> Delta:
        index = _block_index(obj)
        block = _as_dict(obj, "content_block")
        block_type = block.get("type")
        self._blocks[index] = block_type if type(block_type) is str else ""
        if block_type in _TOOL_BLOCKS:
            return Delta(
                index, TOOL_CALL, tool_calls=tool_call_delta(block.get("id"), block.get("name"), "")
            )
        if block_type == "text":
            text = block.get("text")
            if type(text) is str and text:
                return Delta(index, CONTENT, text=text)
        elif block_type == "thinking":
            thinking = block.get("thinking")
            if type(thinking) is str and thinking:
                return Delta(index, REASONING, reasoning=thinking)
        return Delta(index, OTHER, raw=data)

    def _block_delta(self, obj: dict[str, Any], data: str) -> Delta:
        index = _block_index(obj)
        delta = _as_dict(obj, "delta")
        delta_type = delta.get("type")
        if delta_type == "text_delta":
            text = delta.get("text")
            if type(text) is not str:
                raise _not("delta.text", text, "a string")
            if text:
                self._blocks.setdefault(index, "text")
                return Delta(index, CONTENT, text=text)
        elif delta_type == "thinking_delta":
            thinking = delta.get("thinking")
            if type(thinking) is not str:
                raise _not("delta.thinking", thinking, "a string")
            if thinking:
                self._blocks.setdefault(index, "thinking")
                return Delta(index, REASONING, reasoning=thinking)
        elif delta_type == "input_json_delta":
            piece = delta.get("partial_json")
            if type(piece) is not str:
                raise _not("delta.partial_json", piece, "a string")
            self._blocks.setdefault(index, "tool_use")
            return Delta(index, TOOL_CALL, tool_calls=tool_call_delta(None, None, piece))
        return Delta(index, OTHER, raw=data)

    def _message_delta(self, obj: dict[str, Any]) -> list[Delta]:
        delta = obj.get("delta")
        if delta is None:
            delta = {}
        elif type(delta) is not dict:
            raise _not("delta", delta, "an object")
        usage = obj.get("usage")
        if type(usage) is dict:
            self._usage.update({k: v for k, v in usage.items() if v is not None})
        elif usage is not None:
            raise _not("usage", usage, "an object")
        # a copy: self._usage goes on changing
        usage_value = Usage.parse(dict(self._usage)) if self._usage else None
        stop = delta.get("stop_reason")
        if stop is None:
            return [Delta(STREAM_LEVEL, USAGE, usage=usage_value)]
        if type(stop) is not str:
            raise _not("delta.stop_reason", stop, "a string")
        targets = sorted(self._blocks) or [0]
        return [
            Delta(i, FINISH, finish_reason=stop, usage=usage_value if i == targets[-1] else None)
            for i in targets
        ]

    # ---------------------------------------------------------- non-streamed

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("the body", obj, "an object")
        if obj.get("type") == "error" or obj.get("error") is not None:
            err = obj.get("error")
            return [Delta(STREAM_LEVEL, ERROR, raw=body, error=_error_message(err or obj))]
        content = obj.get("content")
        if type(content) is not list:
            raise _not("content", content, "an array")
        stop = obj.get("stop_reason")
        if stop is not None and type(stop) is not str:
            raise _not("stop_reason", stop, "a string")
        out: list[Delta] = []
        for index, block in enumerate(content):
            if type(block) is not dict:
                raise _not(f"content[{index}]", block, "an object")
            out.append(_whole_block(block, index, stop))
        if not out:
            out.append(Delta(0, FINISH if stop is not None else OTHER, finish_reason=stop))
        usage = obj.get("usage")
        if usage is not None:
            out[-1] = out[-1]._replace(usage=Usage.parse(usage))
        return out


def _whole_block(block: dict[str, Any], index: int, stop: str | None) -> Delta:
    block_type = block.get("type")
    if block_type == "text":
        text = block.get("text")
        if type(text) is not str:
            raise _not(f"content[{index}].text", text, "a string")
        return Delta(index, CONTENT if text else _ended(stop), text=text, finish_reason=stop)
    if block_type == "thinking":
        thinking = block.get("thinking")
        if type(thinking) is not str:
            raise _not(f"content[{index}].thinking", thinking, "a string")
        return Delta(
            index, REASONING if thinking else _ended(stop), reasoning=thinking, finish_reason=stop
        )
    if block_type in _TOOL_BLOCKS:
        args = block.get("input")
        calls = tool_call_delta(
            block.get("id"), block.get("name"), "" if args is None else _dumps(args)
        )
        return Delta(index, TOOL_CALL, tool_calls=calls, finish_reason=stop)
    return Delta(index, OTHER, finish_reason=stop, raw=_dumps(block))


def _ended(finish: str | None) -> str:
    """The kind of an item without output: FINISH when it carries a finish reason."""
    return FINISH if finish is not None else OTHER
