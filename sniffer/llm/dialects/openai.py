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
  delta the usage goes to; so is vLLM's per-request ``metrics`` object
  (``--per-request-spec-decode-metrics``: ``metrics.speculative_decoding`` on
  the final chunk or in the body) and the ``spec_*`` fields of SGLang's
  ``meta_info`` (top level, or per choice in a non-streamed body with
  ``return_meta_info``). :func:`server_stats` reads them into the usage's
  typed :class:`~sniffer.llm.values.SpecDecode` and
  :class:`~sniffer.llm.values.ServerTimings`, every number range-checked;
* ``data: [DONE]`` → DONE; ``{"error": {...}}``, ``{"error": "text"}`` or a flat
  ``{"object": "error", "message": ...}`` (older vLLM) → ERROR;
* broken JSON or a wrong shape → INVALID with the raw text; never an exception.

U+FFFD inside content is content: the token-boundary anomaly is for the
tokens stage to report, not a parse error.

Each item's JSON is parsed once and only the fields present are re-serialised.

When the native core runs, :meth:`_OpenAIBase.event` hands each streamed item
to it first (:data:`_NATIVE_CHUNK`): it returns these same deltas for the
common case and None for anything it is not sure of, which the Python below
then handles; the Python stays the reference (``tests/test_native_openai.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from json import loads as _json_loads
from typing import Any

from sniffer import native_core
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
    NO_PROOF,
    OTHER,
    PROOF_OBJECT_FIELD,
    PROOF_WEAK_SHAPE,
    REASONING,
    ROLE,
    STREAM_LEVEL,
    TOOL_CALL,
    USAGE,
    Delta,
)
from sniffer.llm.values import (
    INDEX_MAX,
    OutOfRange,
    ServerTimings,
    SpecDecode,
    Usage,
    as_float,
    as_int,
)

__all__ = [
    "OpenAIChat",
    "OpenAICompletions",
    "probe_chat",
    "probe_completions",
    "server_stats",
]


def _first_choice(obj: dict[str, Any]) -> dict[str, Any] | None:
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def probe_chat(event_type: str, obj: dict[str, Any] | None) -> int:
    """How strongly one streamed item proves a chat completions stream (see
    ``base.Probe``): its ``object`` tag, or a first choice with a ``delta``."""
    if obj is None:
        return NO_PROOF
    if obj.get("object") == "chat.completion.chunk":
        return PROOF_OBJECT_FIELD
    first = _first_choice(obj)
    return PROOF_WEAK_SHAPE if first is not None and "delta" in first else NO_PROOF


def probe_completions(event_type: str, obj: dict[str, Any] | None) -> int:
    """How strongly one streamed item proves a completions stream (see
    ``base.Probe``): its ``object`` tag, or a first choice with a ``text``."""
    if obj is None:
        return NO_PROOF
    if obj.get("object") == "text_completion":
        return PROOF_OBJECT_FIELD
    first = _first_choice(obj)
    return PROOF_WEAK_SHAPE if first is not None and "text" in first else NO_PROOF


_DONE = "[DONE]"
#: What an empty event (``data:`` and a blank line) is: nothing we model.
_EMPTY_EVENT = Delta(STREAM_LEVEL, OTHER, raw="")

_new_tuple = tuple.__new__

#: ``sniffer._native.openai_chunk(data, chat, want_name)`` when the native core
#: runs (else None): a streamed item's deltas, the reply's model and id when
#: ``want_name``, and the chunk's usage, timings, metrics and meta_info values
#: when it has any (read by :func:`_with_usage`), for the common case it can be
#: sure of (``native/core/src/openai.rs``); None for any other item, which the
#: Python below handles (the reference; ``tests/test_native_openai.py`` holds
#: the two together).
NativeChunk = Callable[
    [str, bool, bool],
    "tuple[list[Delta], str | None, str | None, tuple[Any, Any, Any, Any] | None] | None",
]
_NATIVE_CHUNK: NativeChunk | None = getattr(native_core()[0], "openai_chunk", None)


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


# ---------------------------------------------------------------------------
# Server-reported speculative decoding and timings (kept apart: one function
# reads them, with a range on every number)
# ---------------------------------------------------------------------------

#: Largest token count, verification step count or histogram bin believed.
MAX_SPEC_COUNT = 1_000_000_000
#: Largest server-reported duration believed, in milliseconds (~11.6 days).
MAX_SERVER_MS = 1e9
#: Largest mean number of tokens per verification step believed.
MAX_ACCEPT_LENGTH = 10_000.0
#: Longest acceptance histogram kept (bins: 0, 1, … accepted tokens per step).
MAX_HISTOGRAM_BINS = 1024
#: The keys of SGLang's ``meta_info`` that describe speculative decoding.
SGLANG_SPEC_PREFIX = "spec_"


class _Ranged:
    """Reads numbers from one untrusted object, keeping those in range and
    naming the others."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.rejected: list[str] = []

    def count(self, key: str) -> int | None:
        raw = self.obj.get(key)
        if raw is None:
            return None
        value = as_int(raw)
        if value is None and type(raw) is float and raw.is_integer():
            value = int(raw)
        if value is None or not 0 <= value <= MAX_SPEC_COUNT:
            self.rejected.append(key)
            return None
        return value

    def number(self, key: str, low: float, high: float) -> float | None:
        raw = self.obj.get(key)
        if raw is None:
            return None
        value = as_float(raw)
        if value is None or not low <= value <= high:
            self.rejected.append(key)
            return None
        return value

    def histogram(self, key: str) -> tuple[int, ...]:
        raw = self.obj.get(key)
        if raw is None:
            return ()
        if type(raw) is not list or len(raw) > MAX_HISTOGRAM_BINS:
            self.rejected.append(key)
            return ()
        out: list[int] = []
        for v in raw:
            n = as_int(v)
            if n is None or not 0 <= n <= MAX_SPEC_COUNT:
                self.rejected.append(key)
                return ()
            out.append(n)
        return tuple(out)


def _spec(
    source: str,
    r: _Ranged,
    draft: int | None,
    accepted: int | None,
    steps: int | None,
    length: float | None,
    rate: float | None,
    histogram: tuple[int, ...] = (),
    accepted_key: str = "accepted",
) -> SpecDecode | None:
    if accepted is not None and draft is not None and accepted > draft:
        r.rejected.append(accepted_key)  # more accepted than drafted: not believed
        accepted = None
    if rate is None and accepted is not None and draft:
        rate = accepted / draft
    if length is None and accepted is not None and steps:
        # derived, so held to the range a reported length is held to (the
        # counts themselves are kept: each was in range)
        derived = 1.0 + accepted / steps
        length = derived if derived <= MAX_ACCEPT_LENGTH else None
    nothing = all(v is None for v in (draft, accepted, steps, length, rate))
    if nothing and not histogram and not r.rejected:
        return None
    return SpecDecode(
        source, draft, accepted, steps, length, rate, histogram, tuple(dict.fromkeys(r.rejected))
    )


def _vllm_spec(metrics: Any) -> SpecDecode | None:
    """vLLM's ``metrics.speculative_decoding``: num_draft_tokens,
    num_accepted_draft_tokens (or num_accepted_tokens), num_spec_steps,
    mean_acceptance_length, draft_acceptance_rate, acceptance_histogram."""
    sd = metrics.get("speculative_decoding") if type(metrics) is dict else None
    if type(sd) is not dict:
        return None
    r = _Ranged(sd)
    accepted_key = (
        "num_accepted_draft_tokens" if "num_accepted_draft_tokens" in sd else "num_accepted_tokens"
    )
    return _spec(
        "vllm",
        r,
        r.count("num_draft_tokens"),
        r.count(accepted_key),
        r.count("num_spec_steps"),
        r.number("mean_acceptance_length", 0.0, MAX_ACCEPT_LENGTH),
        r.number("draft_acceptance_rate", 0.0, 1.0),
        r.histogram("acceptance_histogram"),
        accepted_key,
    )


def _sglang_spec(meta: Any) -> SpecDecode | None:
    """SGLang's ``meta_info``: spec_verify_ct, spec_num_proposed_drafts,
    spec_num_correct_drafts, spec_accept_length, spec_accept_rate."""
    if type(meta) is not dict:
        return None
    r = _Ranged(meta)
    return _spec(
        "sglang",
        r,
        r.count("spec_num_proposed_drafts"),
        r.count("spec_num_correct_drafts"),
        r.count("spec_verify_ct"),
        r.number("spec_accept_length", 0.0, MAX_ACCEPT_LENGTH),
        r.number("spec_accept_rate", 0.0, 1.0),
        accepted_key="spec_num_correct_drafts",
    )


def _llamacpp(timings: Any) -> tuple[SpecDecode | None, ServerTimings | None]:
    """llama.cpp's ``timings``: prompt_n, prompt_ms, predicted_n,
    predicted_ms; draft_n and draft_n_accepted when it speculated."""
    if type(timings) is not dict:
        return None, None
    r = _Ranged(timings)
    spec = None
    if "draft_n" in timings or "draft_n_accepted" in timings:
        spec = _spec(
            "llama.cpp",
            r,
            r.count("draft_n"),
            r.count("draft_n_accepted"),
            None,
            None,
            None,
            accepted_key="draft_n_accepted",
        )
        r.rejected = []
    t = ServerTimings(
        r.count("prompt_n"),
        r.number("prompt_ms", 0.0, MAX_SERVER_MS),
        r.count("predicted_n"),
        r.number("predicted_ms", 0.0, MAX_SERVER_MS),
    )
    if r.rejected:
        t = ServerTimings(t.prompt_n, t.prompt_ms, t.predicted_n, t.predicted_ms, tuple(r.rejected))
    if t == ServerTimings():
        return spec, None
    return spec, t


def server_stats(usage: Usage) -> Usage:
    """``usage`` with the speculative-decoding figures and timings the server
    put beside it (kept in its JSON as ``timings``, ``metrics`` and
    ``meta_info``, see :func:`_with_server_objects`) read into typed values.
    A value outside its range is dropped and named in the value's
    ``rejected``; an object of the wrong shape is ignored (it stays in the
    stored usage JSON)."""
    raw = usage.raw
    if type(raw) is not dict:
        return usage
    spec, timings = _llamacpp(raw.get("timings"))
    vllm = _vllm_spec(raw.get("metrics"))
    sglang = _sglang_spec(raw.get("meta_info"))
    spec = vllm or sglang or spec
    if spec is None and timings is None:
        return usage
    return replace(usage, speculative=spec, timings=timings)


def _with_server_objects(usage: Any, timings: Any, metrics: Any, meta: Any) -> Any:
    """The usage JSON with llama.cpp's ``timings``, vLLM's ``metrics`` and the
    ``spec_*`` fields of SGLang's ``meta_info`` kept inside it."""
    if usage is not None and type(usage) is not dict:
        return usage
    out = dict(usage) if usage is not None else {}
    if timings is not None:
        out["timings"] = timings
    if metrics is not None:
        out["metrics"] = metrics
    if type(meta) is dict:
        spec = {k: v for k, v in meta.items() if k.startswith(SGLANG_SPEC_PREFIX)}
        if spec:
            out["meta_info"] = spec
    return out if out or usage is not None else None


def _usage_value(usage: Any, timings: Any, metrics: Any, meta: Any) -> Usage | None:
    """The typed usage of a chunk's (or body's) ``usage``, ``timings``,
    ``metrics`` and ``meta_info`` values (None: no usage); raises
    :class:`OutOfRange` for a count out of range."""
    if timings is not None or metrics is not None or meta is not None:
        usage = _with_server_objects(usage, timings, metrics, meta)
    usage_value = None if usage is None else Usage.parse(usage)
    if usage_value is not None and (timings is not None or metrics is not None or meta):
        usage_value = server_stats(usage_value)
    return usage_value


class _OpenAIBase(JsonDialect):
    """Parsing shared by both endpoints; subclasses read one choice."""

    name = "openai"
    #: chat chunks (``choices[].delta``), not completions ones (``choices[].text``)
    _chat = False

    #: Whether the native streams loop (``sniffer._native.body_chunks``) may
    #: extract this dialect's items itself, as :meth:`event` would: 2 chat,
    #: 1 completions, 0 no (the native extraction is off); it then sets
    #: ``response_model``, ``response_id`` and ``_named`` as :meth:`event`
    #: does, and hands every item it declines (or with usage) to :meth:`event`.
    #: A class attribute, fixed when the module loads (a property cost a
    #: Python call per body event); the native loop reads it from the class
    #: (once per class and call), never from the instance.
    native_chunks = 0 if _NATIVE_CHUNK is None else 1

    def event(self, data: str, event_type: str) -> list[Delta]:
        """One SSE event's data (or NDJSON line): ``JsonDialect.event`` with its
        calls inlined (one per streamed chunk); the native core's extraction
        first, when it runs."""
        if data == _DONE:
            return [Delta(STREAM_LEVEL, DONE)]
        if not data:  # an empty event (what _unparsed makes of it, without two exceptions)
            return [_EMPTY_EVENT]
        native = _NATIVE_CHUNK
        if native is not None:
            got = native(data, self._chat, not self._named)
            if got is not None:
                deltas, model, rid, server = got
                if model is not None:  # what self._name(obj) finds
                    self.response_model = model
                    if rid is not None:
                        self.response_id = rid
                    self._named = True
                if server is None:
                    return deltas
                return _with_usage(data, deltas, server)
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
        metrics = get("metrics")
        meta = get("meta_info")
        if not stream and meta is None and type(choices) is list and choices:
            first = choices[0]
            meta = first.get("meta_info") if type(first) is dict else None
        # per chunk: no call when there is no usage (the common case)
        if usage is None and timings is None and metrics is None and meta is None:
            usage_value = None
        else:
            usage_value = _usage_value(usage, timings, metrics, meta)
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


def _with_usage(data: str, deltas: list[Delta], server: tuple[Any, Any, Any, Any]) -> list[Delta]:
    """The native extraction's deltas with the usage of the chunk, read here
    from its ``usage``, ``timings``, ``metrics`` and ``meta_info`` values
    (``server``) as :meth:`_OpenAIBase._chunk` reads them: on the last
    choice's delta, or a USAGE delta for a chunk without choices."""
    try:
        value = _usage_value(*server)
    except (Shape, OutOfRange) as exc:
        return _invalid(data, str(exc))
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        return _invalid(data, f"{type(exc).__name__}: {exc}")
    if value is None:
        return deltas
    last = deltas[-1]
    if last.choice == STREAM_LEVEL:  # no choices: the OTHER delta of an empty chunk
        return [Delta(STREAM_LEVEL, USAGE, usage=value)]
    deltas[-1] = last._replace(usage=value)
    return deltas


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

    name = "openai.chat"
    _chat = True
    native_chunks = 0 if _NATIVE_CHUNK is None else 2

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

    name = "openai.completions"

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
