"""Request fingerprints: which recorded streams asked the same question.

Two streams have the same fingerprint when they sent the same normalised
prompt with the same generation parameters and, optionally, the same served
model name and the same label. ``stats`` groups repeats of one request by the
fingerprint *with* label and model (one label may serve several models; their
outputs are not repeats of each other). ``diff`` pairs baseline and candidate
streams by the fingerprint *without* the label and, by default, *without* the
model name: two deployments under test are addressed by different names
(``llama-70b`` vs ``llama-70b-sparse``), and a key holding the name would pair
nothing (``--match-model`` puts it back).

Normalisation (pure, no I/O), for every dialect's request:

* chat ``messages`` (OpenAI, Ollama chat, Anthropic with its ``system``,
  Responses ``input`` lists with ``instructions``): each message becomes
  ``[role, text]`` where text is the string content, or the text parts of a
  list content joined; the name and tool-call fields of a message are kept as
  canonical JSON; a system prompt given beside the messages (``system``,
  ``instructions``) becomes a leading system message; CRLF becomes LF;
* a plain prompt: completions ``prompt``, Ollama generate ``prompt`` (with its
  ``system``), Responses ``input`` string (with ``instructions``), TGI
  ``inputs``: the text; a list of strings or token ids is kept as canonical JSON;
* generation parameters: the top-level keys of :data:`SAMPLING_KEYS` and
  :data:`EXTRA_KEYS`, plus every key of TGI ``parameters`` and Ollama
  ``options`` (except :data:`NESTED_IGNORED`), under one canonical name
  (:data:`ALIASES`: ``max_completion_tokens``, ``max_output_tokens``,
  ``max_new_tokens`` and ``num_predict`` count as ``max_tokens``,
  ``stop_sequences`` as ``stop``, ``repeat_penalty`` as
  ``repetition_penalty``), numbers canonicalised (``0`` and ``0.0`` are the
  same temperature); absent keys are absent (no server default is assumed);
* everything else (``stream``, ``stream_options``, ``user``, ``logprobs``,
  TGI ``details``, headers, ids) is ignored: it does not change what a
  deterministic server generates.

A body that is not JSON is fingerprinted by its raw text (plus model and label).
The key is the first 16 hex digits of a BLAKE2b hash of the canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALIASES",
    "EXTRA_KEYS",
    "NESTED_IGNORED",
    "SAMPLING_KEYS",
    "Fingerprint",
    "fingerprint",
    "normalise_request",
]

#: Request keys that change what a server generates (besides model and prompt).
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "n",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "logit_bias",
    "response_format",
    "tools",
    "tool_choice",
    "ignore_eos",
    "reasoning_effort",
)
#: Further top-level keys that change the answer in some dialect (completions
#: ``suffix``/``echo``/``best_of``, Anthropic ``thinking``, Responses
#: ``reasoning``/``text``, Ollama ``format``/``template``/``raw``/``think``).
EXTRA_KEYS = (
    "max_completion_tokens",
    "max_output_tokens",
    "max_new_tokens",
    "stop_sequences",
    "suffix",
    "echo",
    "best_of",
    "thinking",
    "reasoning",
    "text",
    "format",
    "template",
    "raw",
    "think",
    "truncate",
)
#: Other names of one parameter, as the dialects spell it.
ALIASES = {
    "max_completion_tokens": "max_tokens",
    "max_output_tokens": "max_tokens",
    "max_new_tokens": "max_tokens",
    "num_predict": "max_tokens",
    "stop_sequences": "stop",
    "repeat_penalty": "repetition_penalty",
}
#: Keys of TGI ``parameters`` that ask for more detail, not for other text.
NESTED_IGNORED = frozenset({"details", "decoder_input_details", "top_n_tokens"})
#: Row columns used when the request body is missing or unparseable.
_ROW_PARAMS = ("temperature", "top_p", "seed", "n", "max_tokens")
PREVIEW = 120


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What identifies repeats of one request: model, prompt, parameters, label."""

    key: str  # 16 hex digits
    model: str | None
    prompt: str  # human-readable preview of the normalised prompt (≤ 120 chars)
    params: tuple[tuple[str, Any], ...]  # sorted (name, canonical value)
    label: str | None  # None when fingerprinted without the label


def _canon_number(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return v
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v.is_integer():
            return int(v)
    return v


def _canon(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_canon(x) for x in v]
    if isinstance(v, str):
        return v.replace("\r\n", "\n")
    return _canon_number(v)


def _content_text(content: Any) -> Any:
    if isinstance(content, str):
        return content.replace("\r\n", "\n")
    if isinstance(content, list):
        if all(isinstance(p, str) or (isinstance(p, dict) and "text" in p) for p in content):
            return "".join(
                p if isinstance(p, str) else str(p.get("text", "")) for p in content
            ).replace("\r\n", "\n")
        return _canon(content)  # images, audio: keep the structure
    if content is None:
        return ""
    return _canon(content)


def _system(body: Mapping[str, Any]) -> Any:
    """The system prompt given beside the prompt (Anthropic/Ollama ``system``,
    Responses ``instructions``), or None."""
    system = body.get("system")
    if system is None:
        system = body.get("instructions")
    return system


def _messages(body: Mapping[str, Any]) -> list[list[Any]] | None:
    raw = body.get("messages")
    if raw is None and isinstance(body.get("input"), list):
        raw = body["input"]
    if not isinstance(raw, list):
        return None
    out: list[list[Any]] = []
    system = _system(body)
    if system is not None:
        out.append(["system", _content_text(system)])
    for m in raw:
        if not isinstance(m, dict):
            out.append(["?", _canon(m)])
            continue
        item: list[Any] = [str(m.get("role", "")), _content_text(m.get("content"))]
        extra = {k: _canon(v) for k, v in m.items() if k not in ("role", "content")}
        if extra:
            item.append(extra)
        out.append(item)
    return out


def _params(body: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if value is None:
            return
        name = ALIASES.get(key, key)
        params.setdefault(name, _canon(value))  # the first spelling found wins

    for key in (*SAMPLING_KEYS, *EXTRA_KEYS):
        put(key, body.get(key))
    for nested in ("parameters", "options"):  # TGI, Ollama
        inner = body.get(nested)
        if isinstance(inner, dict):
            for key, value in sorted(inner.items()):
                if key not in NESTED_IGNORED:
                    put(str(key), value)
    return params


def normalise_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical parts of a parsed request body: ``model``, ``messages`` or
    ``prompt`` (with ``system`` when one is given beside it), and ``params``."""
    out: dict[str, Any] = {"model": body.get("model")}
    messages = _messages(body)
    if messages is not None:
        out["messages"] = messages
    else:
        prompt = body.get("prompt")
        if prompt is None and isinstance(body.get("input"), str):
            prompt = body["input"]
        if prompt is None and "inputs" in body:  # TGI
            prompt = body["inputs"]
        out["prompt"] = _canon(prompt)
        system = _system(body)
        if system is not None:
            out["system"] = _content_text(system)
    out["params"] = _params(body)
    return out


def _preview(norm: dict[str, Any]) -> str:
    if "messages" in norm:
        parts = []
        for m in norm["messages"]:
            text = m[1] if isinstance(m[1], str) else json.dumps(m[1], ensure_ascii=False)
            parts.append(f"{m[0]}: {text}")
        text = " | ".join(parts)
    else:
        p = norm.get("prompt")
        text = p if isinstance(p, str) else json.dumps(p, ensure_ascii=False)
        if isinstance(norm.get("system"), str):
            text = f"system: {norm['system']} | {text}"
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def fingerprint(
    row: Mapping[str, Any], *, with_label: bool = True, with_model: bool = True
) -> Fingerprint:
    """The fingerprint of a ``streams`` row (uses ``request_json``, ``model``,
    ``label`` and, without a parseable body, the sampling columns).

    ``with_label`` / ``with_model``: whether the label / the served model name
    are part of the key (``Fingerprint.model`` is the model either way)."""
    raw = row.get("request_json")
    body: Any = None
    if isinstance(raw, str):
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
    if isinstance(body, dict):
        norm = normalise_request(body)
        if norm.get("model") is None and row.get("model") is not None:
            norm["model"] = row.get("model")
    else:
        params = {k: _canon(row.get(k)) for k in _ROW_PARAMS if row.get(k) is not None}
        norm = {"model": row.get("model"), "raw": raw if isinstance(raw, str) else None}
        norm["params"] = params
    label = row.get("label") if with_label else None
    keyed = norm if with_model else {k: v for k, v in norm.items() if k != "model"}
    canonical = json.dumps(
        {"r": keyed, "label": label}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    key = hashlib.blake2b(canonical.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    if "raw" in norm:
        r = norm["raw"] or ""
        prompt = " ".join(r.split())[:PREVIEW]
    else:
        prompt = _preview(norm)
    model = norm.get("model")
    return Fingerprint(
        key=key,
        model=model if isinstance(model, str) else None if model is None else str(model),
        prompt=prompt,
        params=tuple(sorted(norm["params"].items())),
        label=label,
    )
