"""What the JSON-speaking dialects share: parsing, bad-input deltas, and the
``event``/``body`` entry points that turn broken JSON and wrong shapes into
``INVALID`` deltas instead of exceptions."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sniffer.llm.dialects.base import ERROR, INVALID, OTHER, STREAM_LEVEL, Delta

try:  # orjson parses a chat chunk about 3x faster; json is the fallback and the reference
    import orjson as _orjson

    #: the fast parser, and the error after which ``json`` gets a second look
    fast_loads: Callable[[str], Any] = _orjson.loads
    FastDecodeError: type[ValueError] = _orjson.JSONDecodeError

except ImportError:  # pragma: no cover - orjson is a declared dependency
    fast_loads = json.loads
    FastDecodeError = ValueError


def loads(text: str) -> Any:
    try:
        return fast_loads(text)
    except FastDecodeError:
        # orjson refuses NaN/Infinity and lone surrogates that json accepts.
        return json.loads(text)


#: compact JSON text, non-ASCII kept as is (what we store for nested objects)
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class Shape(Exception):
    """The item parsed as JSON but does not have the shape of this dialect."""


def error_message(err: Any) -> str:
    if isinstance(err, str):
        return err
    if isinstance(err, dict):
        msg = err.get("message")
        if isinstance(msg, str) and msg:
            return msg
    text: str = dumps(err)
    return text


def not_a(where: str, value: Any, expected: str) -> Shape:
    return Shape(f"{where} is a JSON {json_type(value)}, not {expected}")


def json_type(value: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        int: "number",
        float: "number",
        bool: "boolean",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def invalid(data: str, message: str) -> list[Delta]:
    return [Delta(STREAM_LEVEL, INVALID, raw=data, error=message)]


def guarded(fn: Callable[..., list[Delta]], raw: str, *args: Any) -> list[Delta]:
    """``fn(*args)``, with a wrong shape (or any value error) as an INVALID delta."""
    try:
        return fn(*args)
    except Shape as exc:
        return invalid(raw, str(exc))
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        return invalid(raw, f"{type(exc).__name__}: {exc}")


#: What an empty item (``data:`` and a blank line) is: nothing we model.
_EMPTY_EVENT = Delta(STREAM_LEVEL, OTHER, raw="")


class JsonDialect:
    """``event``/``body`` for dialects whose items are JSON documents. Subclasses
    implement ``_streamed(obj, data, event_type)`` and ``_whole(obj, body)``."""

    name = "json"
    #: the reply's ``id`` and ``model`` as the server named them (first seen)
    response_id: str | None = None
    response_model: str | None = None
    _named = False  # both looked for and at least one found: stop looking

    def event(self, data: str, event_type: str) -> list[Delta]:
        """One SSE event's data, or one NDJSON line (``event_type`` "ndjson")."""
        if not data:  # an empty event (what _unparsed makes of it, without the exception)
            return [_EMPTY_EVENT]
        try:
            obj = loads(data)
        except (ValueError, RecursionError) as exc:
            return self._unparsed(data, event_type, exc)
        if not self._named and type(obj) is dict:
            self._name(obj)
        return guarded(self._streamed, data, obj, data, event_type)

    def body(self, body: str) -> list[Delta]:
        """A whole non-streaming response body."""
        try:
            obj = loads(body)
        except (ValueError, RecursionError) as exc:
            return invalid(body, f"broken JSON: {exc}")
        if not self._named and type(obj) is dict:
            self._name(obj)
        return guarded(self._whole, body, obj, body)

    def _name(self, obj: dict[str, Any]) -> None:
        """Note the reply's id and model: top level (OpenAI chunks and bodies,
        Ollama) or in the ``message`` (Anthropic ``message_start``) or
        ``response`` (Responses ``response.created``) object."""
        for where in (obj, obj.get("message"), obj.get("response")):
            if type(where) is not dict:
                continue
            rid, model = where.get("id"), where.get("model")
            if type(model) is str and model:
                self.response_model = model
                if type(rid) is str and rid:
                    self.response_id = rid
                self._named = True
                return

    def _unparsed(self, data: str, event_type: str, exc: Exception) -> list[Delta]:
        stripped = data.strip()
        if not stripped:
            return [Delta(STREAM_LEVEL, OTHER, raw=data)]
        if event_type == "error":  # an SSE "event: error" whose data is plain text
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=stripped)]
        return invalid(data, f"broken JSON: {exc}")

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        raise NotImplementedError

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        raise NotImplementedError
