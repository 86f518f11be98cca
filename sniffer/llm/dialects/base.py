"""What every LLM API dialect extractor produces, and the interface it implements.

A dialect is sans-IO: it receives one decoded body item at a time (the ``data``
of one SSE event, one NDJSON line, or a whole non-streaming JSON body) and
returns ``Delta`` values. The streams stage turns deltas into ``ChunkEvent``s,
adding the stream id, capture time and chunk numbering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from sniffer.llm.values import Usage

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
#: Not a dialect's: the streams stage stores an item that came after the end
#: marker as a chunk of this kind (``raw`` only), apart from the answer.
AFTER_DONE = "after_done"

OUTPUT_KINDS = frozenset({CONTENT, REASONING, TOOL_CALL})

# How strongly one streamed item proves a dialect, when the request that would
# name it was not seen (a body recovered mid-way): the answers of a dialect's
# ``probe``. The strongest proof wins; a tie goes to the dialect registered first.
NO_PROOF = 0
#: The shape of the fields, least specific (OpenAI's ``choices`` entries).
PROOF_WEAK_SHAPE = 1
#: The shape of the fields (TGI's ``token`` object).
PROOF_SHAPE = 2
#: The shape of the fields, most specific (Ollama's NDJSON objects with ``done``).
PROOF_STRONG_SHAPE = 3
#: The item's ``object`` tag (OpenAI's ``chat.completion.chunk``).
PROOF_OBJECT_FIELD = 4
#: The item's ``type`` tag (Anthropic's and Responses' event types).
PROOF_TYPE_FIELD = 5
#: The SSE ``event:`` name, whatever the data holds.
PROOF_EVENT_NAME = 6

#: ``probe(event_type, obj)``: how strongly one streamed item proves the
#: dialect (one of the ``PROOF_*`` values, or :data:`NO_PROOF`). ``event_type``
#: is the SSE ``event`` field ("message" by default) or "ndjson" for an NDJSON
#: line; ``obj`` the item's JSON object, None when it is not one (broken JSON,
#: ``[DONE]``, an array).
Probe = Callable[[str, "dict[str, Any] | None"], int]


class Delta(NamedTuple):
    """What a dialect extracts from one item for one choice (or the stream).

    A ``NamedTuple``, not a frozen dataclass: one is made per streamed chunk and
    only read once, by the streams stage, which unpacks it (a tuple is built in
    one C call; a frozen dataclass sets its 11 fields one Python call each).
    Change a field with ``delta._replace(...)``."""

    choice: int
    kind: str
    text: str = ""
    reasoning: str = ""
    tool_calls: str | None = None  # JSON text
    finish_reason: str | None = None
    logprobs: str | None = None  # JSON text, as the server sent it
    usage: Usage | None = None  # parsed once here; the store writes its JSON
    raw: str | None = None  # the item as received, for INVALID / OTHER / ERROR
    error: str | None = None  # message for ERROR / INVALID
    server_tokens: str | None = None  # JSON list of server-reported token ids/texts (TGI)


class Dialect(Protocol):
    """One instance per exchange; holds whatever state the wire format needs."""

    name: str
    #: The output is the whole message, all its output items / content blocks
    #: in index order (Responses, Anthropic), not one output per block / choice.
    whole_message: bool

    def event(self, data: str, event_type: str) -> list[Delta]:
        """One streamed item: SSE event data (``event_type`` is the SSE ``event:``
        field, "message" by default) or one NDJSON line (``event_type`` "ndjson")."""
        ...

    def body(self, body: str) -> list[Delta]:
        """A whole non-streaming response body."""
        ...

    def item_model(self, data: str) -> str | None:
        """The model one streamed item names, if any: what a stream picked up
        mid-way, whose request was never seen, records as its model."""
        ...
