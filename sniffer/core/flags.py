"""The stream flags: what the tool noticed about a stream that its state does
not say (``streams.flags``), their meaning and which of them fail ``verify``.

Apart from :mod:`sniffer.core.events` (which re-exports them, as the pipeline
sets them) so that the commands that only read flags from the store
(``streams``, ``show``, ``stats``, ``verify``) start without building the
pipeline's event classes (~15 ms of their start-up).
"""

from __future__ import annotations

import enum
import json

__all__ = ["FLAG_TEXT", "LOSSY_FLAGS", "StreamFlag", "stream_flags"]


class StreamFlag(enum.StrEnum):
    """Something the tool noticed about a stream that its state does not say,
    stored in ``streams.flags`` (in the order first seen) and reported by
    ``verify``. A flag in :data:`LOSSY_FLAGS` means the tool dropped or could not
    trust data of the stream: ``verify`` fails the stream, whatever its state.
    The others mark odd input the tool kept as it came (a warning)."""

    #: the capture clock went backwards inside the exchange (a later packet has
    #: an earlier timestamp): durations and gaps computed from it are not real
    CLOCK_BACKWARDS = "clock-backwards"
    #: an SSE line or NDJSON line longer than the decoders' line cap
    #: (``sniffer.core.sse.DEFAULT_MAX_LINE``) was dropped with its item
    ITEM_OVER_CAP = "item-over-cap"
    #: more events that carry no output (role preludes, keep-alives, metadata,
    #: unparseable items, anything after the end marker) than the stream
    #: stage keeps per stream (``sniffer.core.streams.MAX_QUIET_EVENTS``): the
    #: rest were counted (the ``events-capped`` error row), not stored
    EVENTS_CAPPED = "events-capped"
    #: the request body was longer than the stream stage keeps
    #: (``sniffer.core.streams.MAX_REQUEST_BODY``): the stored request is its
    #: start, and its parameters were read from that part only
    REQUEST_CUT = "request-cut"
    #: the server sent items after its end marker (``data: [DONE]``): clients
    #: stop reading there, so they are stored apart (chunk kind ``after_done``)
    #: and are not part of the answer
    AFTER_DONE = "after-done"
    #: the stream had more chunk events than the token collector keeps per
    #: stream (``sniffer.record.token_collector.MAX_CHUNKS``): token ids were
    #: computed for the first of them only
    TOKENS_CAPPED = "tokens-capped"
    #: TCP bytes of the exchange arrived twice with different content: the
    #: reassembler kept the first copy, the endpoint's application may have
    #: read the other (the classic evasion of a passive sniffer); the
    #: ``errors`` rows (stage ``reassembly``) say where and which copy was kept
    OVERLAP_MISMATCH = "overlap-mismatch"


#: Flags that fail ``verify`` (data dropped or ambiguous); the rest warn.
#: ``item-over-cap`` drops an item, which may have carried output;
#: ``overlap-mismatch`` stores bytes the endpoint may not have read. The others
#: lose no output: ``events-capped`` counts events that carry none,
#: ``request-cut`` keeps the response whole, ``after-done`` keeps what came
#: after the end marker apart, ``tokens-capped`` stores every chunk (only the
#: token analysis stops at the cap).
LOSSY_FLAGS: frozenset[StreamFlag] = frozenset(
    {StreamFlag.ITEM_OVER_CAP, StreamFlag.OVERLAP_MISMATCH}
)

#: What each flag means, for ``verify``'s findings and ``show``.
FLAG_TEXT: dict[str, str] = {
    StreamFlag.CLOCK_BACKWARDS: "the capture clock went backwards during the exchange",
    StreamFlag.ITEM_OVER_CAP: (
        "an SSE or NDJSON line over the line cap was dropped with its item: "
        "the stored stream may lack output the server sent"
    ),
    StreamFlag.EVENTS_CAPPED: (
        "events carrying no output past the per-stream cap were counted, not stored "
        "(the count is in the events-capped error row); no output was dropped"
    ),
    StreamFlag.REQUEST_CUT: (
        "the request body was over the cap: its start is stored and its parameters "
        "were read from that part (the response is whole)"
    ),
    StreamFlag.AFTER_DONE: (
        "the server sent items after its end marker: stored apart (kind after_done), "
        "not part of the answer, as clients stop reading at the marker"
    ),
    StreamFlag.TOKENS_CAPPED: (
        "more chunk events than the token collector keeps per stream: token ids cover "
        "the first of them only; the chunks are stored whole (the tool's own cap, "
        "nothing lost on the wire or in the store), so the token checks that need "
        "every token are skipped"
    ),
    StreamFlag.OVERLAP_MISMATCH: "TCP bytes arrived twice with different content (the first "
    "copy was kept; the endpoint may have read the other)",
}


def stream_flags(column: str | None) -> list[StreamFlag | str]:
    """The flags of a ``streams.flags`` value (JSON list or NULL), known ones as
    :class:`StreamFlag`; a name this code does not know (a newer writer's) is
    kept as its text."""
    if not column:
        return []
    try:
        names = json.loads(column)
    except ValueError:
        return [column]
    if not isinstance(names, list):
        return [str(names)]
    known = StreamFlag._value2member_map_
    return [StreamFlag(n) if n in known else str(n) for n in names]
