"""LLM API dialects and the registry that picks one per exchange.

A dialect is chosen from the request line (and, for formats whose path is
ambiguous, the parsed request body). ``REGISTRY`` is an ordered list of
``(matcher, factory)`` pairs: the first matcher that accepts the request wins
and its factory makes a NEW dialect instance for that exchange (dialects may
hold per-stream state). Add a dialect with :func:`register`::

    register("ollama.chat", lambda method, path, request: path == "/api/chat", OllamaChat)

Put more specific matchers first (``insert=True`` puts a matcher at the front).

A dialect whose stream can be recognised from its items alone (a body picked up
mid-way, whose request was never seen) registers its ``probe`` too (see
``base.Probe``); :func:`guess_dialect` asks every probe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sniffer.llm.dialects import anthropic, ollama, openai, responses, tgi
from sniffer.llm.dialects.anthropic import AnthropicMessages
from sniffer.llm.dialects.base import NO_PROOF, Dialect, Probe
from sniffer.llm.dialects.kserve import GrpcRaw, KServeInfer
from sniffer.llm.dialects.ollama import OllamaChat, OllamaGenerate
from sniffer.llm.dialects.openai import OpenAIChat, OpenAICompletions
from sniffer.llm.dialects.responses import OpenAIResponses
from sniffer.llm.dialects.tgi import TgiGenerate

__all__ = [
    "KNOWN_DIALECTS",
    "REGISTRY",
    "WHOLE_MESSAGE_DIALECTS",
    "Factory",
    "Matcher",
    "dialect_by_name",
    "guess_dialect",
    "normalize_path",
    "register",
    "select_dialect",
]

#: ``matcher(method, path, request)``: method upper-cased, path normalised by
#: :func:`normalize_path`, request the parsed JSON body (or None / anything).
Matcher = Callable[[str, str, Any], bool]
Factory = Callable[[], Dialect]

#: name → factory, for dialects named by the stream itself (a body recovered mid-way).
FACTORIES: dict[str, Factory] = {}
#: Ordered (matcher, factory) pairs; the first match wins.
REGISTRY: list[tuple[Matcher, Factory]] = []
#: Names of the registered dialects, in registration order.
KNOWN_DIALECTS: list[str] = []
#: (name, probe) of the dialects that can be recognised from their items, in
#: registration order (a tie between two probes goes to the first).
PROBES: list[tuple[str, Probe]] = []
#: Names of the registered dialects whose output is the whole message (their
#: ``whole_message``): reports and metrics take its blocks as one output.
WHOLE_MESSAGE_DIALECTS: set[str] = set()


def register(
    name: str,
    matcher: Matcher,
    factory: Factory,
    *,
    insert: bool = False,
    probe: Probe | None = None,
) -> None:
    """Add a dialect: ``factory()`` must return a fresh instance named ``name``;
    ``probe`` recognises its streamed items when no request names it."""
    if insert:
        REGISTRY.insert(0, (matcher, factory))
    else:
        REGISTRY.append((matcher, factory))
    if name not in KNOWN_DIALECTS:
        KNOWN_DIALECTS.append(name)
    FACTORIES.setdefault(name, factory)
    if FACTORIES[name]().whole_message:
        WHOLE_MESSAGE_DIALECTS.add(name)
    if probe is not None and all(known != name for known, _ in PROBES):
        PROBES.append((name, probe))


def dialect_by_name(name: str) -> Dialect | None:
    """A new instance of the dialect registered as ``name``, or None."""
    factory = FACTORIES.get(name)
    return factory() if factory is not None else None


def normalize_path(target: str) -> str:
    """The path of a request target: no scheme/authority (absolute-form targets
    sent to proxies), no query or fragment, no trailing slash."""
    if target[:1] == "/" and target[-1] != "/" and "?" not in target and "#" not in target:
        return target  # (the usual origin-form path: as it is)
    if target.startswith(("http://", "https://")):
        slash = target.find("/", target.find("//") + 2)
        target = target[slash:] if slash >= 0 else "/"
    for sep in ("?", "#"):
        cut = target.find(sep)
        if cut >= 0:
            target = target[:cut]
    if len(target) > 1:
        target = target.rstrip("/") or "/"
    return target


def _is_post(method: str) -> bool:
    return method == "POST"


def _openai_chat(method: str, path: str, request: Any) -> bool:
    return _is_post(method) and path in ("/v1/chat/completions", "/chat/completions")


def _openai_completions(method: str, path: str, request: Any) -> bool:
    return _is_post(method) and path in ("/v1/completions", "/completions")


register(OpenAIChat.name, _openai_chat, OpenAIChat, probe=openai.probe_chat)
register(
    OpenAICompletions.name, _openai_completions, OpenAICompletions, probe=openai.probe_completions
)


def _openai_responses(method: str, path: str, request: Any) -> bool:
    return _is_post(method) and path in ("/v1/responses", "/responses")


def _anthropic_messages(method: str, path: str, request: Any) -> bool:
    return _is_post(method) and path in ("/v1/messages", "/messages")


def _tgi_generate(method: str, path: str, request: Any) -> bool:
    if not _is_post(method):
        return False
    if path in ("/generate", "/generate_stream"):
        return True
    # TGI's root route takes the same body: {"inputs": …, "parameters": …, "stream": …}
    return path == "/" and isinstance(request, dict) and "inputs" in request


def _ollama_generate(method: str, path: str, request: Any) -> bool:
    return _is_post(method) and path == "/api/generate"


def _ollama_chat(method: str, path: str, request: Any) -> bool:
    return _is_post(method) and path == "/api/chat"


register(OpenAIResponses.name, _openai_responses, OpenAIResponses, probe=responses.probe)
register(AnthropicMessages.name, _anthropic_messages, AnthropicMessages, probe=anthropic.probe)
register(TgiGenerate.name, _tgi_generate, TgiGenerate, probe=tgi.probe)
register(OllamaGenerate.name, _ollama_generate, OllamaGenerate, probe=ollama.probe_generate)
register(OllamaChat.name, _ollama_chat, OllamaChat, probe=ollama.probe_chat)


def _kserve_infer(method: str, path: str, request: Any) -> bool:
    return _is_post(method) and path in (
        "/inference.GRPCInferenceService/ModelStreamInfer",
        "/inference.GRPCInferenceService/ModelInfer",
    )


def _grpc_raw(method: str, path: str, request: Any) -> bool:
    return isinstance(request, dict) and isinstance(request.get("grpc"), str)


register(KServeInfer.name, _kserve_infer, KServeInfer)
register(GrpcRaw.name, _grpc_raw, GrpcRaw)


def select_dialect(method: str, path: str, request: Any) -> Dialect | None:
    """A new dialect instance for this exchange, or None when no dialect applies.

    ``path`` may be the raw request target (query string and all).

    >>> select_dialect("POST", "/v1/chat/completions?x=1", {}).name
    'openai.chat'
    >>> select_dialect("GET", "/v1/models", None) is None
    True
    """
    method = method.upper()
    path = normalize_path(path)
    for matcher, factory in REGISTRY:
        try:
            matched = matcher(method, path, request)
        except Exception:  # a buggy matcher must not take the pipeline down
            continue
        if matched:
            return factory()
    return None


def guess_dialect(event_type: str, data: str) -> str | None:
    """The dialect name one streamed item proves, or ``None`` when it proves none
    (``[DONE]``, a keep-alive, broken JSON). ``event_type`` is the SSE ``event``
    field ("message" by default) or "ndjson" for an NDJSON line. Every
    registered probe is asked; the strongest proof wins.

    >>> guess_dialect("message", '{"object": "chat.completion.chunk", "choices": []}')
    'openai.chat'
    >>> guess_dialect("message", "[DONE]") is None
    True
    """
    try:
        parsed: Any = json.loads(data)
    except (ValueError, RecursionError):
        parsed = None
    obj = parsed if isinstance(parsed, dict) else None
    best, found = NO_PROOF, None
    for name, probe in PROBES:
        try:
            proof = probe(event_type, obj)
        except Exception:  # a buggy probe must not take the pipeline down
            continue
        if proof > best:
            best, found = proof, name
    return found
