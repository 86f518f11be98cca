"""The typed LLM values the dialect and stream stages hand downstream.

An LLM request and a usage block are parsed once, where they are understood,
into the small immutable values below; every later stage (writer, metrics,
OTLP, token analysis, reports) reads their fields. Only the store turns them
back into JSON.

* :class:`Usage`: the server's token counts under any dialect's names, with
  the usage object as the server sent it (``raw``) for the store.
* :class:`RequestSummary`: the request parameters the store and the exporters
  use, coerced from untrusted JSON once.
* :class:`SpecDecode` and :class:`ServerTimings`: what a server reports about
  one request's speculative decoding and its own prompt/generation times
  (vLLM, llama.cpp, SGLang), carried on :class:`Usage`.

"Not an LLM stream" is ``StreamOpened.dialect is None``; the output kinds are
``sniffer.llm.dialects.base.OUTPUT_KINDS``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

import orjson as _orjson

__all__ = [
    "COUNT_RANGE",
    "EMPTY_REQUEST",
    "INDEX_MAX",
    "INDEX_RANGE",
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_USAGE_DEPTH",
    "REQUEST_RANGES",
    "TOKEN_ID_RANGE",
    "UNREAD",
    "OutOfRange",
    "RequestSummary",
    "ServerTimings",
    "SpecDecode",
    "Usage",
    "as_bool",
    "as_float",
    "as_int",
    "as_str",
    "check_int",
    "in_range",
    "include_usage",
    "json_loads",
    "json_or_none",
    "scan_request",
    "slot_init",
]

_T = TypeVar("_T")


#: What a field with a default factory is given when the caller gives nothing
#: (:func:`slot_init`; the generated ``__init__`` has a sentinel of its own).
_NOTHING: Any = object()


if TYPE_CHECKING:
    # the type checker sees the dataclass with its generated __init__: the one
    # slot_init puts in its place has the same parameters
    from dataclasses import dataclass as slot_dataclass
else:

    def slot_dataclass(**kwargs: Any) -> Callable[[type[_T]], type[_T]]:
        """``dataclass(**kwargs)`` without the ``__init__`` that :func:`slot_init`
        replaces (building it is an ``exec``, ~0.2 ms of start-up per class)."""
        return dataclass(init=False, **kwargs)


def slot_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass a faster ``__init__``: the generated one
    sets each field through ``object.__setattr__`` (a frozen class refuses plain
    assignment); this one calls the slots' descriptors directly, about half the
    cost, for the values made once per chunk, exchange, connection, request or
    token anomaly (the pipeline's events, :class:`RequestSummary`,
    ``sniffer.llm.tokens.Anomaly``; each one costs an ``exec`` at import). Same
    parameters, defaults and resulting object (equality, hashing, ``replace``,
    repr are untouched). A field with a default factory gets a new value from
    it when not given, as the generated ``__init__`` does (the token pass's
    per-stream values, ``StreamTokens`` and its rows, have such fields).

    While the native core runs, the descriptors are called in one native
    call (``sniffer._native.SlotFiller``: their C setter, no Python call per
    field; each such call costs ~800 instructions, a ``StreamOpened`` of 17
    fields ~14k of its ~16k); the pure core keeps the Python calls.

    Declare the dataclass with :func:`slot_dataclass` (``init=False``): its
    own ``__init__`` would be built (an ``exec``, ~0.2 ms of start-up per
    class) only to be replaced. Such a class needs a docstring: without one,
    ``dataclass`` writes its signature into ``__doc__`` before this
    ``__init__`` exists."""
    scope: dict[str, Any] = {"_NOTHING": _NOTHING}
    params: list[str] = []
    body: list[str] = []
    names: list[str] = []
    for i, f in enumerate(fields(cls)):  # type: ignore[arg-type]
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: not supported by slot_init")
        names.append(f.name)
        scope[f"_set{i}"] = cls.__dict__[f.name].__set__
        if f.default_factory is not MISSING:
            scope[f"_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_NOTHING")
            body.append(f"    _set{i}(self, _factory{i}() if {f.name} is _NOTHING else {f.name})\n")
            continue
        if f.default is MISSING:
            params.append(f.name)
        else:
            scope[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        body.append(f"    _set{i}(self, {f.name})\n")
    filler = _slot_filler(cls)
    if filler is not None:
        scope["_fill"] = filler
        body = [
            f"    {n} = _factory{i}() if {n} is _NOTHING else {n}\n"
            for i, n in enumerate(names)
            if f"_factory{i}" in scope
        ]
        body.append(f"    _fill(self, {', '.join(names)})\n")
    exec(f"def __init__(self, {', '.join(params)}):\n{''.join(body)}", scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    setattr(cls, "__init__", init)  # noqa: B010 (mypy refuses assigning to a method)
    return cls


def _slot_filler(cls: type) -> Callable[..., None] | None:
    """``fill(obj, *values)`` of ``sniffer._native.SlotFiller(cls)`` while the
    native core runs, else None (the pure core, or no extension)."""
    from sniffer import native_core

    native = native_core()[0]
    if native is None:
        return None
    fill: Callable[..., None] = native.SlotFiller(cls).fill
    return fill


# ---------------------------------------------------------------------------
# the range of every integer that comes off the wire
# ---------------------------------------------------------------------------

#: The widths of the store's integer columns (``sniffer.store.models``):
#: ``Integer`` is 32-bit signed on PostgreSQL, ``BigInteger`` (and every SQLite
#: INTEGER) 64-bit signed. A driver refuses a Python integer wider than its
#: column (``OverflowError``, "integer out of range").
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: An integer read off the wire is held to the range of the column it lands
#: in before it becomes a typed value; out of range, the item it came in is
#: bad input (recorded with an error on its stream), never a number clamped
#: into range. A choice, content block or output index: ``chunks.choice``
#: (``Integer``), never negative (-1 is ``STREAM_LEVEL``).
INDEX_MAX = INT32_MAX
INDEX_RANGE = (0, INDEX_MAX)
#: A count a server reports (usage tokens, cached tokens, Ollama's nanosecond
#: durations): ``streams.prompt_tokens`` / ``completion_tokens`` (``BigInteger``).
COUNT_RANGE = (0, INT64_MAX)
#: A token id (logprobs, TGI tokens, a prompt of ids): the tokenizers' ids are
#: 32-bit unsigned; kept inside JSON text, compared with the tokenizer's.
TOKEN_ID_RANGE = (0, 2**32 - 1)
#: The request fields :class:`RequestSummary` types, by the column they land
#: in (``streams.n`` is ``Integer``; ``max_tokens`` and ``seed`` ``BigInteger``;
#: the others have no column: the 64-bit integers of OTLP attributes).
REQUEST_RANGES: dict[str, tuple[int, int]] = {
    "n": (INT32_MIN, INT32_MAX),
    "max_tokens": (INT64_MIN, INT64_MAX),
    "max_completion_tokens": (INT64_MIN, INT64_MAX),
    "max_output_tokens": (INT64_MIN, INT64_MAX),
    "seed": (INT64_MIN, INT64_MAX),
    "top_k": (INT64_MIN, INT64_MAX),
    "top_logprobs": (INT64_MIN, INT64_MAX),
    "logprobs": (INT64_MIN, INT64_MAX),
    "prompt_len": (INT32_MIN, INT32_MAX),
}


class OutOfRange(ValueError):
    """A JSON integer outside the range of what it is (:func:`check_int`)."""


def in_range(value: Any, bounds: tuple[int, int]) -> bool:
    """``value`` is a JSON integer (not a bool) within ``bounds`` (inclusive)."""
    return type(value) is int and bounds[0] <= value <= bounds[1]


def _shown(value: int | float) -> str:
    text = str(value)
    return text if len(text) <= 30 else f"{text[:12]}… ({len(text)} digits)"


def check_int(value: Any, bounds: tuple[int, int], where: str) -> int | None:
    """``value`` when it is a JSON integer within ``bounds``; None when it is
    not an integer at all (a string, a bool, null, a float within the bounds:
    the caller decides what that means); raises :class:`OutOfRange` for a
    number outside them: an integer, or a float (infinity from ``1e400``, and
    an integer too wide for the fast JSON parser, which reads one past 64 bits
    as a float).

    >>> check_int(3, INDEX_RANGE, "index"), check_int("3", INDEX_RANGE, "index")
    (3, None)
    >>> check_int(2**63, INDEX_RANGE, "index")
    Traceback (most recent call last):
    ...
    sniffer.llm.values.OutOfRange: index is 9223372036854775808, out of range [0, 2147483647]
    """
    t = type(value)
    if t is int:
        if bounds[0] <= value <= bounds[1]:
            return value
    elif t is not float or bounds[0] <= value <= bounds[1]:
        return None
    lo, hi = bounds
    raise OutOfRange(f"{where} is {_shown(value)}, out of range [{lo}, {hi}]")


def as_int(value: Any) -> int | None:
    """``value`` when it is a JSON integer that fits a 64-bit column (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if INT64_MIN <= value <= INT64_MAX else None


#: (a tuple: ``int | float`` in the call would make a union at every call)
_NUMBER = (int, float)


def as_float(value: Any) -> float | None:
    """``value`` as a finite float when it is a JSON number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        return None
    try:
        result = float(value)
    except OverflowError:
        return None
    return result if result == result and abs(result) != float("inf") else None


def as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _first_int(obj: dict[str, Any], keys: tuple[str, ...]) -> tuple[int | None, str | None]:
    for key in keys:
        value = as_int(obj.get(key))
        if value is not None:
            return value, key
    return None, None


# ---------------------------------------------------------------------------
# usage
# ---------------------------------------------------------------------------

#: Where each dialect puts its counts, in the order they are looked for:
#: OpenAI chat/completions and TGI (as the TGI dialect names them), Responses
#: and Anthropic, Ollama.
PROMPT_KEYS = ("prompt_tokens", "input_tokens", "prompt_eval_count")
COMPLETION_KEYS = ("completion_tokens", "output_tokens", "eval_count")
#: Ollama's evaluation counters. ``prompt_eval_count`` leaves out a prompt
#: prefix the server had cached, so the token check does not compare them with
#: its own counts (:meth:`Usage.tokenizer_counts`).
EVAL_COUNTERS = frozenset({"prompt_eval_count", "eval_count"})
#: Other counts of a usage object, checked (:data:`COUNT_RANGE`) though not
#: typed: the totals and the cache counts of OpenAI (in ``*_details``) and
#: Anthropic (top level).
OTHER_COUNT_KEYS = ("total_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
DETAIL_KEYS = (
    "prompt_tokens_details",
    "completion_tokens_details",
    "input_tokens_details",
    "output_tokens_details",
)


def _counts(
    obj: dict[str, Any], keys: tuple[str, ...], where: str
) -> tuple[int | None, str | None]:
    """The first of ``keys`` that holds an integer count, and its key; raises
    :class:`OutOfRange` for a count outside :data:`COUNT_RANGE` under any of them."""
    found: tuple[int | None, str | None] = (None, None)
    for key in keys:
        value = check_int(obj.get(key), COUNT_RANGE, f"{where}.{key}")
        if value is not None and found[0] is None:
            found = (value, key)
    return found


#: A usage object nested deeper than this is bad input (the store could not
#: serialise it): :meth:`Usage.parse` raises ``ValueError``.
MAX_USAGE_DEPTH = 64


def _too_deep(value: Any) -> bool:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if type(v) is dict:
            v = v.values()
        elif type(v) is not list:
            continue
        if depth >= MAX_USAGE_DEPTH:
            return True
        stack.extend((x, depth + 1) for x in v if type(x) is dict or type(x) is list)
    return False


# ---------------------------------------------------------------------------
# server-reported speculative decoding and timings
# ---------------------------------------------------------------------------

#: The servers whose per-request speculative-decoding figures are read.
SPEC_SOURCES = ("vllm", "llama.cpp", "sglang")
#: Histogram buckets of the per-request figures (Prometheus and OTLP): mean
#: tokens per verification step, and accepted / drafted.
ACCEPT_LENGTH_BUCKETS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 11.0, 16.0)
ACCEPTANCE_RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True, slots=True)
class SpecDecode:
    """One request's speculative decoding, as the server reported it.

    ``draft_tokens`` the drafter proposed, ``accepted_tokens`` of them the
    target model accepted, ``steps`` verification steps (vLLM
    ``num_spec_steps``, SGLang ``spec_verify_ct``; llama.cpp does not say),
    ``accept_length`` the mean tokens one step produced (1 + accepted / steps:
    vLLM ``mean_acceptance_length``, SGLang ``spec_accept_length``),
    ``acceptance_rate`` accepted / drafted, ``histogram`` the steps that
    accepted 0, 1, 2, … drafted tokens (vLLM ``acceptance_histogram``).
    Each is None (or empty) when the server did not send it, or sent a value
    outside its range: those fields are named in ``rejected``.
    """

    source: str
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    steps: int | None = None
    accept_length: float | None = None
    acceptance_rate: float | None = None
    histogram: tuple[int, ...] = ()
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """llama.cpp's own account of a request (``timings``): prompt tokens
    evaluated and the milliseconds it took, tokens generated and theirs.
    Out-of-range values are None and named in ``rejected``."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    """A server-reported usage block, parsed once (:meth:`parse`).

    ``raw`` is the object as the server sent it (the dialect's merged object
    for Anthropic, the counts and timings for Ollama and TGI); the store
    serialises it. ``prompt_tokens``/``completion_tokens`` are read under
    every dialect's names (:data:`PROMPT_KEYS`, :data:`COMPLETION_KEYS`: the
    first that holds an integer wins; ``prompt_key``/``completion_key`` name
    it); ``reasoning_tokens`` from ``completion_tokens_details`` or
    ``output_tokens_details``. A usage that is not a JSON object keeps ``raw``
    and has no counts.

    >>> u = Usage.parse({"prompt_eval_count": 26, "eval_count": 9})
    >>> (u.prompt_tokens, u.completion_tokens, u.tokenizer_counts())
    (26, 9, (None, None))
    """

    raw: Any = field(hash=False)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    total_tokens: int | None = None
    prompt_key: str | None = None
    completion_key: str | None = None
    #: what the server reported about speculative decoding and its timings
    #: (set by the OpenAI dialect from ``timings``, ``metrics``, ``meta_info``)
    speculative: SpecDecode | None = None
    timings: ServerTimings | None = None

    @classmethod
    def parse(cls, obj: Any) -> Usage | None:
        """The usage in a parsed JSON value; None for JSON ``null`` (no usage).
        Raises ``ValueError`` for an object nested absurdly deep, and
        :class:`OutOfRange` for a count (tokens, cached tokens, the totals) that
        is an integer outside :data:`COUNT_RANGE` (bad input: the dialect
        records it as an INVALID item)."""
        if obj is None:
            return None
        if _too_deep(obj):
            raise ValueError(f"usage nests deeper than {MAX_USAGE_DEPTH} levels")
        if type(obj) is not dict:
            return cls(obj)
        prompt, pkey = _counts(obj, PROMPT_KEYS, "usage")
        completion, ckey = _counts(obj, COMPLETION_KEYS, "usage")
        _counts(obj, OTHER_COUNT_KEYS, "usage")  # checked; total_tokens is typed below
        for key in DETAIL_KEYS:  # reasoning, cached, audio, prediction tokens
            detail = obj.get(key)
            if type(detail) is dict:
                for name, value in detail.items():
                    check_int(value, COUNT_RANGE, f"usage.{key}.{name}")
        details = obj.get("completion_tokens_details") or obj.get("output_tokens_details")
        reasoning = as_int(details.get("reasoning_tokens")) if isinstance(details, dict) else None
        return cls(obj, prompt, completion, reasoning, as_int(obj.get("total_tokens")), pkey, ckey)

    @classmethod
    def loads(cls, text: str | None) -> Usage | None:
        """The usage in a stored JSON text (``streams.usage``); None when there
        is none or it does not parse."""
        if not text:
            return None
        try:
            return cls.parse(json.loads(text))
        except (ValueError, RecursionError):
            return None

    @property
    def is_object(self) -> bool:
        """The server sent a JSON object (anything else carries no counts)."""
        return type(self.raw) is dict

    def tokenizer_counts(self) -> tuple[int | None, int | None]:
        """(prompt, completion) to compare with a tokenizer's own counts: the
        OpenAI, Responses, Anthropic and TGI counts, not Ollama's evaluation
        counters (:data:`EVAL_COUNTERS`)."""
        prompt = None if self.prompt_key in EVAL_COUNTERS else self.prompt_tokens
        completion = None if self.completion_key in EVAL_COUNTERS else self.completion_tokens
        return prompt, completion


# ---------------------------------------------------------------------------
# request summary
# ---------------------------------------------------------------------------

_TOP_LEVEL = (
    "model",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "seed",
    "stream_options",
    "logprobs",
    "top_logprobs",
)


def _request_fields(body: Any) -> dict[str, Any]:
    """The request parameters every dialect understands, from a parsed JSON
    body, as sent (untrusted values; :meth:`RequestSummary.parse` types them).

    ``prompt_len`` is the number of messages for chat-style requests and 1 for a
    prompt string (the seed log's convention). Sampling parameters nested the
    way TGI (``parameters``) and Ollama (``options``) send them are lifted to
    the same names; Anthropic's ``system`` counts as one more message.
    """
    if not isinstance(body, dict):
        return {}
    out: dict[str, Any] = {}
    for key in _TOP_LEVEL:
        if key in body:
            out[key] = body[key]
    nested = body.get("parameters") if isinstance(body.get("parameters"), dict) else None
    if nested is None and isinstance(body.get("options"), dict):
        nested = body["options"]
    if nested is not None:  # TGI "parameters", Ollama "options"
        for key in ("temperature", "top_p", "top_k", "seed"):
            if key in nested and key not in out:
                out[key] = nested[key]
        for key in ("max_new_tokens", "num_predict"):
            if key in nested and "max_tokens" not in out:
                out["max_tokens"] = nested[key]
    messages = body.get("messages")
    if isinstance(messages, list):
        out["prompt_len"] = len(messages) + (1 if body.get("system") else 0)
    elif "prompt" in body or "input" in body or "inputs" in body:
        prompt = body.get("prompt", body.get("input", body.get("inputs")))
        out["prompt_len"] = len(prompt) if isinstance(prompt, list) else 1
    return out


# ---------------------------------------------------------------------------
# the start of a cut request body
# ---------------------------------------------------------------------------


class _Unread:
    """The value of a top-level key :func:`scan_request` saw but did not read."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNREAD"


#: The value of a key :func:`scan_request` found but could not read (the cut
#: ends inside it): present (``"messages" in body`` holds), of no usable type.
UNREAD: Any = _Unread()

_WS = re.compile(r"[ \t\n\r]*")
#: What may follow a whole JSON number (not the end of the text: "0.7" cut to "0").
_AFTER_VALUE = frozenset({",", "}", " ", "\t", "\n", "\r"})
_DECODER = json.JSONDecoder()
#: Top-level keys :func:`scan_request` reads at most (a request has tens; a
#: hostile body of 700,000 one-character keys would cost seconds).
MAX_SCANNED_KEYS = 1024


def _skip_ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m is not None else pos


def scan_request(text: str) -> dict[str, Any]:
    """The top-level keys of the START of a JSON object (a request body cut by a
    size cap), each with its value when that is whole in ``text``. It stops at
    the first value the text ends inside (or a number at the very end, which
    the cut may have shortened: that key gets :data:`UNREAD`), at the first
    thing that is not JSON and after :data:`MAX_SCANNED_KEYS` keys. Each value
    is read whole by the standard library's decoder (C speed, bounded
    nesting), so keys inside nested values or strings are never taken for
    top-level ones. Linear in ``len(text)`` on any input.

    >>> scan_request('{"model": "m", "stream": true, "messages": [{"content": "a}b')
    {'model': 'm', 'stream': True, 'messages': UNREAD}
    """
    out: dict[str, Any] = {}
    decode = _DECODER.raw_decode
    pos = _skip_ws(text, 0)
    if text[pos : pos + 1] != "{":
        return out
    pos += 1
    for _ in range(MAX_SCANNED_KEYS):
        pos = _skip_ws(text, pos)
        if text[pos : pos + 1] != '"':
            return out
        try:
            key, pos = decode(text, pos)
        except ValueError:
            return out
        pos = _skip_ws(text, pos)
        if text[pos : pos + 1] != ":":
            return out
        pos = _skip_ws(text, pos + 1)
        try:
            value, end = decode(text, pos)
        except (ValueError, RecursionError):  # the cut is inside it, or it is not JSON
            out[key] = UNREAD
            return out
        if text[end : end + 1] not in _AFTER_VALUE and type(value) in (int, float):
            out[key] = UNREAD  # a number the cut may have shortened
            return out
        out[key] = value
        pos = _skip_ws(text, end)
        if text[pos : pos + 1] != ",":
            return out
        pos += 1
    return out


#: The standard library's C scanner (what ``json.loads`` ends up calling; set
#: by ``JSONDecoder.__init__``, so typeshed does not know it).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


#: Every byte as ``0`` if it is an ASCII digit, else as a space: a text's
#: runs of digits found by one substring test on its translated bytes (a
#: regex's search stops at each digit, ~4x orjson's whole parse).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
#: 19 digits in a row: a number orjson may read otherwise than ``json`` (an
#: integer past 64 bits becomes a float there).
_LONG_DIGITS = b"0" * 19


def json_loads(text: str) -> Any:
    """``json.loads(text)``, the same value and errors: a text that starts
    with ``{`` (a request body as sent, once per stream) is read by orjson
    (~4x less than the C scanner ``json.loads`` calls) unless a run of 19
    digits may be an integer orjson would give as a float; what orjson
    refuses (NaN, Infinity, lone surrogates, numbers past a double's range,
    anything not JSON) goes to the C scanner when it reads an object to the
    text's end, without ``json.loads``' three wrappers' checks; any other
    text through ``json.loads`` itself, which raises its errors."""
    if text[:1] == "{":
        raw = text.encode("utf-8", "surrogatepass")
        if _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZEROS):
            try:
                return _orjson.loads(raw)
            except _orjson.JSONDecodeError:
                pass
        value, end = _SCAN(text, 0)
        if end == len(text):
            return value
    return json.loads(text)


def json_or_none(text: str | None) -> Any:
    """The JSON value of a stored text (a request body): None for NULL, an
    empty text or one that is not JSON (too deep included), as ``json.loads``
    says (through :func:`json_loads`: once per stream the token pass takes)."""
    if not text:
        return None
    try:
        return json_loads(text)
    except (ValueError, RecursionError):
        return None


def include_usage(body: Any) -> bool:
    """Whether a parsed JSON request body asks for a usage chunk
    (``stream_options.include_usage`` is true): ``RequestSummary.include_usage``,
    without typing the other fields (the token pass needs this one only)."""
    so = body.get("stream_options") if isinstance(body, dict) else None
    return isinstance(so, dict) and so.get("include_usage") is True


_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _ranged(key: str, value: Any, bad: list[str]) -> int | None:
    """``value`` when it is an integer (not a bool) in the range of field
    ``key`` (:data:`REQUEST_RANGES`); an integer out of it puts ``key`` in ``bad``."""
    if type(value) is not int:
        return None
    lo, hi = REQUEST_RANGES[key]
    if lo <= value <= hi:
        return value
    bad.append(key)
    return None


@slot_init
@slot_dataclass(frozen=True, slots=True, repr=False)
class RequestSummary:
    """What the store and the exporters use of an LLM request, typed once.

    Every field is None when the request did not send it with a usable type
    (a string ``temperature``, …) or sent an integer outside the field's range
    (:data:`REQUEST_RANGES`: then its name is in ``out_of_range``). ``max_tokens``
    is the first integer of ``max_tokens``, ``max_completion_tokens`` and
    ``max_output_tokens`` (TGI's ``max_new_tokens`` and Ollama's
    ``num_predict`` count as ``max_tokens``); ``include_usage`` is
    ``stream_options.include_usage is true``.

    >>> r = RequestSummary.parse({"model": "m", "messages": [{}, {}], "temperature": 0})
    >>> (r.model, r.temperature, r.prompt_len, r.stream)
    ('m', 0.0, 2, None)
    """

    model: str | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    n: int | None = None
    seed: int | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    prompt_len: int | None = None
    include_usage: bool = False
    #: the fields that were integers outside their range (:data:`REQUEST_RANGES`),
    #: left None: the streams stage records an error for them
    out_of_range: tuple[str, ...] = ()

    @classmethod
    def parse(cls, body: Any) -> RequestSummary:
        """The summary of a parsed JSON request body (anything: a non-object
        gives an empty summary)."""
        f = _request_fields(body)
        if not f:
            return EMPTY_REQUEST
        bad: list[str] = []  # in the order the fields are typed, as the error lists them
        get = f.get
        max_tokens: int | None = None
        for key in _MAX_TOKENS_KEYS:  # the first one that is an integer in range
            if key in f:  # (absent: None, no call)
                max_tokens = _ranged(key, f[key], bad)
                if max_tokens is not None:
                    break
        # each a look-up when absent (most of them): no call, no closure per request
        top_k = _ranged("top_k", f["top_k"], bad) if "top_k" in f else None
        n = _ranged("n", f["n"], bad) if "n" in f else None
        seed = _ranged("seed", f["seed"], bad) if "seed" in f else None
        logprobs = get("logprobs")
        if not isinstance(logprobs, bool):
            logprobs = _ranged("logprobs", logprobs, bad)
        top_logprobs = (
            _ranged("top_logprobs", f["top_logprobs"], bad) if "top_logprobs" in f else None
        )
        prompt_len = _ranged("prompt_len", f["prompt_len"], bad) if "prompt_len" in f else None
        return cls(
            model=as_str(get("model")),
            stream=as_bool(get("stream")),
            temperature=as_float(f["temperature"]) if "temperature" in f else None,
            top_p=as_float(f["top_p"]) if "top_p" in f else None,
            top_k=top_k,
            max_tokens=max_tokens,
            n=n,
            seed=seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            prompt_len=prompt_len,
            include_usage=include_usage(f),
            out_of_range=tuple(bad),
        )

    def present(self) -> tuple[str, ...]:
        """The names of the fields that are set, in field order: not None,
        ``include_usage`` only when true, ``out_of_range`` only when not empty.

        >>> RequestSummary.parse({"model": "m", "temperature": 0, "n": 2**40}).present()
        ('model', 'temperature', 'out_of_range')
        """
        names: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == () or (f.name == "include_usage" and not value):
                continue
            names.append(f.name)
        return tuple(names)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.present())
        return f"RequestSummary({inner})"


#: The summary of a request with nothing usable in it.
EMPTY_REQUEST = RequestSummary()
