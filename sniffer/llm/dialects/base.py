"""What every LLM API dialect extractor produces, and the interface it implements.

A dialect is sans-IO: it receives one decoded body item at a time (the ``data``
of one SSE event, one NDJSON line, or a whole non-streaming JSON body) and
returns ``Delta`` values. The streams stage turns deltas into ``ChunkEvent``s,
adding the stream id, capture time and chunk numbering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

#: ``Delta.choice`` for items that belong to the stream rather than a choice:
#: a usage-only chunk, ``[DONE]``, an error object, an unparseable event.
STREAM_LEVEL = -1

# Delta kinds. "content", "reasoning" and "tool_call" carry output; the first of
# them in a stream is the time-to-first-token moment. "role" is the
# ``{"role":"assistant","content":""}`` prelude and never counts as output.
CONTENT = "content"
REASONING = "reasoning"
TOOL_CALL = "tool_call"
ROLE = "role"
FINISH = "finish"
USAGE = "usage"
DONE = "done"
ERROR = "error"
INVALID = "invalid"  # the item could not be parsed (broken JSON, wrong shape)
OTHER = "other"  # parsed, but nothing we model (keep-alive, metadata events)

OUTPUT_KINDS = frozenset({CONTENT, REASONING, TOOL_CALL})


@dataclass(frozen=True, slots=True)
class Delta:
    choice: int
    kind: str
    text: str = ""
    reasoning: str = ""
    tool_calls: str | None = None  # JSON text
    finish_reason: str | None = None
    logprobs: str | None = None  # JSON text, as the server sent it
    usage: str | None = None  # JSON text
    raw: str | None = None  # the item as received, for INVALID / OTHER / ERROR
    error: str | None = None  # message for ERROR / INVALID
    server_tokens: str | None = None  # JSON list of server-reported token ids/texts (TGI)


class Dialect(Protocol):
    """One instance per exchange; holds whatever state the wire format needs."""

    name: str

    def event(self, data: str, event_type: str) -> list[Delta]:
        """One streamed item: SSE event data (``event_type`` is the SSE ``event:``
        field, "message" by default) or one NDJSON line (``event_type`` "ndjson")."""
        ...

    def body(self, body: str) -> list[Delta]:
        """A whole non-streaming response body."""
        ...


def request_fields(body: Any) -> dict[str, Any]:
    """The request parameters every dialect understands, from a parsed JSON body.

    ``prompt_len`` is the number of messages for chat-style requests and 1 for a
    prompt string (the seed log's convention). Sampling parameters nested the
    way TGI (``parameters``) and Ollama (``options``) send them are lifted to
    the same names; Anthropic's ``system`` counts as one more message.
    """
    if not isinstance(body, dict):
        return {}
    out: dict[str, Any] = {}
    for key in (
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
    ):
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
