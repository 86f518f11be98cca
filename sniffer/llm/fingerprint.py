"""Request fingerprints: which recorded streams asked the same question.

Two streams have the same fingerprint when they sent the same model the same
normalised prompt with the same sampling parameters (and, optionally, carry
the same label). ``stats`` groups repeats of one request by the fingerprint
*with* the label; ``diff`` pairs baseline and candidate streams by the
fingerprint *without* it.

Normalisation (pure, no I/O):

* chat ``messages`` (and Anthropic ``system``, Responses ``input`` lists and
  ``instructions``): each message becomes ``[role, text]`` where text is the
  string content, or the text parts of a list content joined; the name and
  tool-call fields of a message are kept as canonical JSON; CRLF becomes LF;
* completion ``prompt`` (or Responses ``input`` string): the text; a list of
  strings or token ids is kept as canonical JSON;
* sampling parameters: :data:`SAMPLING_KEYS` present in the request body, with
  numbers canonicalised (``0`` and ``0.0`` are the same temperature,
  ``max_completion_tokens``/``max_output_tokens`` count as ``max_tokens``);
  absent keys are absent (no server default is assumed);
* everything else (``stream``, ``stream_options``, ``user``, ``logprobs``,
  headers, ids) is ignored: it does not change what a deterministic server
  generates.

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
_MAX_TOKEN_ALIASES = ("max_tokens", "max_completion_tokens", "max_output_tokens")
#: Row columns used when the request body is missing or unparseable.
_ROW_PARAMS = ("temperature", "top_p", "seed", "n", "max_tokens")
PREVIEW = 120


@dataclass(frozen=True, slots=True)
class Fingerprint:
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


def _messages(body: Mapping[str, Any]) -> list[list[Any]] | None:
    raw = body.get("messages")
    if raw is None and isinstance(body.get("input"), list):
        raw = body["input"]
    if not isinstance(raw, list):
        return None
    out: list[list[Any]] = []
    system = body.get("system", body.get("instructions"))
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


def normalise_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical parts of a parsed request body: ``model``, ``messages`` or
    ``prompt``, and ``params``."""
    out: dict[str, Any] = {"model": body.get("model")}
    messages = _messages(body)
    if messages is not None:
        out["messages"] = messages
    else:
        prompt = body.get("prompt")
        if prompt is None and isinstance(body.get("input"), str):
            prompt = body["input"]
        out["prompt"] = _canon(prompt)
    params: dict[str, Any] = {}
    for key in SAMPLING_KEYS:
        if key == "max_tokens":
            for alias in _MAX_TOKEN_ALIASES:
                if body.get(alias) is not None:
                    params[key] = _canon(body[alias])
                    break
        elif key in body and body[key] is not None:
            params[key] = _canon(body[key])
    out["params"] = params
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
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def fingerprint(row: Mapping[str, Any], *, with_label: bool = True) -> Fingerprint:
    """The fingerprint of a ``streams`` row (uses ``request_json``, ``model``,
    ``label`` and, without a parseable body, the sampling columns)."""
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
    canonical = json.dumps(
        {"r": norm, "label": label}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
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
