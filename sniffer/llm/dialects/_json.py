"""What the JSON-speaking dialects share: parsing, bad-input deltas, and the
``event``/``body`` entry points that turn broken JSON and wrong shapes into
``INVALID`` deltas instead of exceptions, and the checks every dialect holds
the integers it reads to (:func:`index_at`, :func:`count_at`,
:func:`check_token_ids`; the ranges are ``sniffer.llm.values``'): an integer
out of range makes its item INVALID, never a number clamped into range."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sniffer.llm.dialects.base import ERROR, INVALID, OTHER, STREAM_LEVEL, Delta
from sniffer.llm.values import (
    COUNT_RANGE,
    INDEX_MAX,
    TOKEN_ID_RANGE,
    OutOfRange,
    check_int,
)

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


def bad_index(where: str, value: Any) -> Shape:
    """The error for a choice / block / output index that is not an integer in
    :data:`~sniffer.llm.values.INDEX_RANGE` (the caller has checked it is not)."""
    try:
        check_int(value, (0, INDEX_MAX), where)
    except OutOfRange as exc:
        if type(value) is float or value >= 0:  # a float past the range: a too-wide integer
            return Shape(str(exc))
    return not_a(where, value, "a non-negative integer")


def index_at(obj: dict[str, Any], key: str, where: str, default: Any = None) -> int:
    """``obj[key]`` (``default`` when absent) as an index; ``Shape`` if it is not one."""
    value = obj.get(key, default)
    if type(value) is not int or not 0 <= value <= INDEX_MAX:
        raise bad_index(where, value)
    return value


def count_at(obj: dict[str, Any], key: str, where: str) -> int | None:
    """``obj[key]`` when it is an integer count (:data:`~sniffer.llm.values.COUNT_RANGE`);
    None when absent or not an integer; ``OutOfRange`` outside the range."""
    return check_int(obj.get(key), COUNT_RANGE, where)


def _token_object(item: Any) -> bool:
    """``item`` is a token object (``{"token"|"text": str, "logprob": number, "id"?}``),
    not a map of token strings to log-probabilities (OpenAI completions'
    ``top_logprobs``, where a token may well be spelled ``id``)."""
    if type(item) is not dict:
        return False
    text = item.get("token", item.get("text"))
    return type(text) is str and type(item.get("logprob")) in (int, float)


def check_token_ids(logprobs: Any, where: str) -> None:
    """Hold the token ids of a logprobs value to :data:`~sniffer.llm.values.TOKEN_ID_RANGE`
    (``OutOfRange`` otherwise): the ``id``/``token_id`` of each token object
    (:func:`_token_object`) in a list, in an OpenAI ``content``/``refusal``
    list, or the value itself (TGI), and of their ``top_logprobs``/``top_tokens``
    alternatives. Other values pass (kept as JSON text, read by
    ``sniffer.llm.logprobs``)."""
    if type(logprobs) is dict:
        items: Any = [logprobs]
        for key in ("content", "refusal"):
            if type(logprobs.get(key)) is list:
                items = items + logprobs[key]
    elif type(logprobs) is list:
        items = logprobs
    else:
        return
    for item in items:
        if not _token_object(item):
            continue
        for key in ("id", "token_id"):
            check_int(item.get(key), TOKEN_ID_RANGE, f"{where}.{key}")
        for key in ("top_logprobs", "top_tokens"):
            alts = item.get(key)
            if type(alts) is list:
                for alt in alts:
                    if _token_object(alt):
                        for k in ("id", "token_id"):
                            check_int(alt.get(k), TOKEN_ID_RANGE, f"{where}.{key}.{k}")


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
    """``fn(*args)``, with a wrong shape, an integer out of range (or any value
    error) as an INVALID delta."""
    try:
        return fn(*args)
    except (Shape, OutOfRange) as exc:
        return invalid(raw, str(exc))
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        return invalid(raw, f"{type(exc).__name__}: {exc}")


#: What an empty item (``data:`` and a blank line) is: nothing we model.
_EMPTY_EVENT = Delta(STREAM_LEVEL, OTHER, raw="")


class JsonDialect:
    """``event``/``body`` for dialects whose items are JSON documents. Subclasses
    implement ``_streamed(obj, data, event_type)`` and ``_whole(obj, body)``."""

    name = "json"
    #: see ``base.Dialect.whole_message``
    whole_message = False
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

    def item_model(self, data: str) -> str | None:
        """The model one streamed item names: at the top level (OpenAI chunks,
        Ollama), in the ``message`` (Anthropic ``message_start``) or the
        ``response`` (Responses ``response.created``) object; any string."""
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        for holder in (obj, obj.get("message"), obj.get("response")):
            if isinstance(holder, dict) and isinstance(holder.get("model"), str):
                return str(holder["model"])
        return None

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
