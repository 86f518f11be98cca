"""The typed values that travel between the pipeline stages.

capture ──Segment──► reassembly ──Conn*/Flow*──► http1 ──Http*──► streams ──Stream*/Chunk──► store

Every value is immutable. ``Segment``, ``FlowData`` and ``HttpBody`` are
``NamedTuple``s because one is made per captured packet or body piece (a frozen
dataclass costs several times as much to build, which matters at 150k
packets/s; the hot paths build them with ``tuple.__new__``, one C call);
everything else is a frozen, slotted dataclass (``ChunkEvent``, one per chunk,
and those made once per connection or exchange, with a faster ``__init__``).
Times are capture timestamps (float seconds since the Unix epoch): no stage
reads a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

# the stream flags live in sniffer.core.flags (the reading commands need them
# without this module's classes); the pipeline's modules import them from here
from sniffer.core.flags import FLAG_TEXT, LOSSY_FLAGS, StreamFlag, stream_flags  # noqa: F401
from sniffer.llm.values import EMPTY_REQUEST, RequestSummary, Usage, slot_dataclass, slot_init

# ---------------------------------------------------------------------------
# capture → reassembly
# ---------------------------------------------------------------------------

#: TCP flag bits as they appear in the TCP header's flags byte.
FIN = 0x01
SYN = 0x02
RST = 0x04
PSH = 0x08
ACK = 0x10


class Segment(NamedTuple):
    """One captured TCP segment (IPv4 or IPv6), as the capture layer saw it."""

    ts: float
    src: str  # IP address as text ("127.0.0.1", "::1")
    sport: int
    dst: str
    dport: int
    seq: int
    ack: int
    flags: int  # FIN/SYN/RST/PSH/ACK bits
    payload: bytes


Endpoint = tuple[str, int]


class CaptureGap(NamedTuple):
    """Capture lost packets it cannot attribute (kernel ring drops, queue loss).

    Every connection open at ``ts`` may have lost data: the reassembler marks
    all of them as possibly gapped.
    """

    ts: float
    dropped: int  # packets lost, as the capture source counted them
    source: str  # "kernel", "queue", "ebpf"


# ---------------------------------------------------------------------------
# reassembly → http1 (also produced directly by the eBPF backend)
# ---------------------------------------------------------------------------


@slot_init
@slot_dataclass(frozen=True, slots=True)
class ConnectionOpened:
    """A TCP connection seen for the first time (its SYN, or its first segment)."""

    conn: int  # connection id, unique within one pipeline run (from its id base)
    ts: float
    client: Endpoint  # the SYN sender when syn_seen, else a guess (see reassembly)
    server: Endpoint
    syn_seen: bool
    capture: str = "packet"  # "packet" or "ebpf"
    pid: int | None = None  # eBPF backend: owning process
    comm: str | None = None


class FlowData(NamedTuple):
    """In-order bytes of one direction of a connection.

    A ``NamedTuple`` like ``Segment`` (one per data packet): the reassembler
    builds it with ``tuple.__new__`` in one C call."""

    conn: int
    ts: float  # capture time of the packet that delivered the last of these bytes
    from_client: bool
    data: bytes


@dataclass(frozen=True, slots=True)
class FlowGap:
    """Bytes of one direction that will never arrive (lost, or capture began late).

    ``nbytes`` is the exact count when known from sequence numbers, ``None`` when
    unknown (kernel drops attributed to every open connection).
    """

    conn: int
    ts: float
    from_client: bool
    nbytes: int | None
    reason: str  # "lost", "midstream", "kernel-drop", "overflow", "ebpf-lost", "restart"


@dataclass(frozen=True, slots=True)
class FlowEnd:
    """One direction ended: FIN, RST, idle expiry or end of capture."""

    conn: int
    ts: float
    from_client: bool
    reason: str  # "fin", "rst", "idle", "eof"


@slot_init
@slot_dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """A connection ended (both directions, reset, idle expiry or end of capture)."""

    conn: int
    ts: float
    reason: str  # "fin", "rst", "idle", "eof"


@dataclass(frozen=True, slots=True)
class FlowAnomaly:
    """Something about the TCP stream worth counting (not fatal)."""

    conn: int
    ts: float
    from_client: bool
    kind: str  # "overlap-mismatch", "buffer-cap", "out-of-window", "after-fin"
    detail: str = ""
    #: "overlap-mismatch": where the two copies differ, as offsets in this
    #: direction's byte stream (0 = its first data byte): the first overlap found
    #: to differ, ``length`` bytes from ``offset``; -1 and 0 for the other kinds
    offset: int = -1
    length: int = 0


FlowEvent = ConnectionOpened | FlowData | FlowGap | FlowEnd | ConnectionClosed | FlowAnomaly

#: What ``Pipeline.reassembly_counts`` counts (``replay --json``'s
#: ``reassembly``, ``/metrics``' ``sparseety_reassembly_events_total{kind}``):
#: segments carrying bytes already seen (``retransmission``), of which those
#: whose bytes differ from the first copy (``overlap-mismatch``), segments
#: buffered ahead of a hole (``out-of-order``), out-of-order buffers over their
#: cap (``buffer-cap``), segments dropped as beyond the window
#: (``out-of-window``) or after the FIN (``after-fin``), holes declared lost
#: (``gap``), directions first seen without their SYN (``midstream``), SYNs
#: that replaced a known connection (``port-reuse``).
REASSEMBLY_KINDS = (
    "retransmission",
    "overlap-mismatch",
    "out-of-order",
    "buffer-cap",
    "out-of-window",
    "after-fin",
    "gap",
    "midstream",
    "port-reuse",
)

# ---------------------------------------------------------------------------
# http1 → streams
# ---------------------------------------------------------------------------

Headers = tuple[tuple[str, str], ...]  # (lower-case name, value), in wire order


@slot_init
@slot_dataclass(frozen=True, slots=True)
class HttpRequest:
    """A request head, one per exchange."""

    conn: int
    exchange: int  # 0, 1, 2 … per connection, in request order
    ts: float
    method: str
    target: str
    version: str  # "1.1", "1.0"
    headers: Headers


@slot_init
@slot_dataclass(frozen=True, slots=True)
class HttpResponse:
    """A response head (an informational 1xx one is followed by another)."""

    conn: int
    exchange: int
    ts: float
    status: int
    reason: str
    version: str
    headers: Headers
    informational: bool = False  # 1xx: more heads follow for this exchange


class HttpBody(NamedTuple):
    """A piece of a message body, de-chunked and content-decoded (gzip, deflate).

    A ``NamedTuple`` (one per body piece, i.e. per streamed chunk): the parsers
    build it with ``tuple.__new__`` in one C call."""

    conn: int
    exchange: int
    ts: float
    from_client: bool
    data: bytes


class EndReason(enum.StrEnum):
    COMPLETE = "complete"  # framing said the message ended
    GAP = "gap"  # bytes of this message were lost
    EOF = "eof"  # connection closed before the message ended
    RST = "rst"
    ERROR = "error"  # malformed framing (recorded in an HttpError too)


@slot_init
@slot_dataclass(frozen=True, slots=True)
class HttpEnd:
    """One direction of an exchange ended: its body is complete, or cut (``reason``)."""

    conn: int
    exchange: int
    ts: float
    from_client: bool
    reason: EndReason


@dataclass(frozen=True, slots=True)
class HttpTrailers:
    """Trailer fields of a message (HTTP/2 trailers, e.g. gRPC's ``grpc-status``)."""

    conn: int
    exchange: int
    ts: float
    from_client: bool
    headers: Headers


@dataclass(frozen=True, slots=True)
class HttpError:
    """Bad input on a connection; the connection goes on resynchronising."""

    conn: int
    exchange: int | None
    ts: float
    from_client: bool
    kind: str  # "framing", "not-http", "decode", "desync", "buffer-cap"
    message: str


@dataclass(frozen=True, slots=True)
class HttpResync:
    """A response body picked up again where its framing could be proven
    (``core.resync``): after a mid-stream start (``recovered``: a new exchange
    whose request and head were never seen) or after lost bytes inside a known
    message (the same exchange goes on, gapped). ``framing`` is ``"chunked"``
    (the body goes on at a proven chunk-size line) or ``"identity"`` (body
    bytes until close); ``skipped`` counts the bytes dropped before the sync
    point, ``lost`` the bytes of the gap when known."""

    conn: int
    exchange: int
    ts: float
    framing: str
    skipped: int
    recovered: bool
    lost: int | None = None
    gaps: int = 1  # gaps covered by ``lost`` (several when more came before the sync)


@dataclass(frozen=True, slots=True)
class HttpAnomaly:
    """A :class:`FlowAnomaly` of the reassembler, attributed by the HTTP stage to
    the exchange whose bytes it touched (see ``HttpParser``'s rule): ``exchange``
    None when it cannot be told (an HTTP/2 connection, whose frames interleave
    the exchanges: every exchange open on the connection; no exchange at all)."""

    conn: int
    exchange: int | None
    ts: float
    from_client: bool  # the direction, oriented as the HTTP stage settled the roles
    kind: str  # the FlowAnomaly's
    detail: str = ""
    offset: int = -1
    length: int = 0


HttpEvent = (
    HttpRequest
    | HttpResponse
    | HttpBody
    | HttpEnd
    | HttpError
    | HttpResync
    | HttpTrailers
    | HttpAnomaly
)

# ---------------------------------------------------------------------------
# streams → store, metrics, tokens
# ---------------------------------------------------------------------------


class StreamState(enum.StrEnum):
    OPEN = "open"
    COMPLETE = "complete"  # finish seen (and [DONE] when the server sends it), no gap
    TRUNCATED = "truncated"  # connection ended before the stream did (client abort, server cut)
    GAP = "gap"  # bytes were lost: never reported complete
    ERROR = "error"  # HTTP error status, error object, or malformed framing
    MIDWAY = "midway"  # capture began inside the response body: only its tail was recorded


@slot_init
@slot_dataclass(frozen=True, slots=True)
class StreamOpened:
    """A request/response exchange began (one row in the streams table)."""

    stream: int  # stream id, unique within one pipeline run (from its id base)
    conn: int
    exchange: int
    ts: float  # request head capture time
    client: Endpoint
    server: Endpoint
    method: str
    path: str
    request_headers: Headers  # credentials already removed
    request_body: str | None  # text of the request body (JSON as sent), None if absent
    request: RequestSummary = EMPTY_REQUEST  # the request fields, typed
    dialect: str | None = None  # "openai.chat", "openai.completions", …; None: not an LLM stream
    label: str | None = None
    capture: str = "packet"
    pid: int | None = None
    comm: str | None = None
    text_kept: bool = True  # False: sampled out, the chunk text is not stored


@slot_init
@slot_dataclass(frozen=True, slots=True)
class StreamResponse:
    """The response head of a recorded stream."""

    stream: int
    ts: float
    status: int | None  # None: a body recovered mid-way, its head never seen
    headers: Headers  # credentials removed
    content_type: str
    streaming: bool  # SSE / NDJSON body


@slot_init
@slot_dataclass(frozen=True, slots=True)
class ChunkEvent:
    """One streamed chunk for one choice (or the whole body of a non-streaming reply)."""

    stream: int
    ts: float  # capture time of the packet that completed the event
    seq: int  # 0, 1, 2 … per stream: order of events in the stream
    choice: int  # choice index (n > 1), Responses output_index, Anthropic block index
    chunk_index: int  # 1, 2, 3 … per (stream, choice), chunks that carry text only; 0 otherwise
    kind: str  # see dialects.base: content, reasoning, tool_call, role, finish, usage, done, …
    text: str = ""  # content delta (what a client appends), or completion text
    reasoning: str = ""
    tool_calls: str | None = None  # JSON text of the tool_calls delta
    finish_reason: str | None = None
    logprobs: str | None = None  # JSON text of the server-reported logprobs
    usage: Usage | None = None  # the usage object this chunk carried
    raw: str | None = None  # the event data as received, for kinds we do not model
    server_tokens: str | None = None  # JSON list of server-reported tokens (TGI token objects)


@slot_init
@slot_dataclass(frozen=True, slots=True)
class StreamClosed:
    """A recorded stream ended: its final state, timings and counts."""

    stream: int
    ts: float
    state: StreamState
    reason: str  # human-readable: why this state
    done_seen: bool
    gap: bool
    t_first_content: float | None
    t_last_chunk: float | None
    chunk_count: int  # chunk events that carried text
    event_count: int  # all chunk events
    text_len: int  # characters of content (all choices)
    finish_reasons: tuple[tuple[int, str], ...]  # (choice, finish_reason)
    usage: Usage | None  # the last usage object of the stream
    response_body: str | None  # non-streaming bodies (capped), else None
    error: str | None = None
    request_bytes: int = 0  # body bytes after de-chunking and content decoding
    response_bytes: int = 0
    response_id: str | None = None  # the reply's id, as the server named it
    response_model: str | None = None  # the model the server says answered
    flags: tuple[StreamFlag, ...] = ()  # in the order first seen


@dataclass(frozen=True, slots=True)
class PipelineError:
    """A recorded error: a counter is incremented and capture goes on."""

    ts: float
    stage: str  # "capture", "reassembly", "http", "sse", "dialect", "store"
    kind: str
    message: str
    conn: int | None = None
    stream: int | None = None


@dataclass(frozen=True, slots=True)
class StreamFlagged:
    """A flag found after the stream closed (TCP bytes of its response that came
    again, different, after its last byte): the stream's whole flag list now,
    written over ``streams.flags``."""

    stream: int
    ts: float
    flags: tuple[StreamFlag, ...]


StoreEvent = (
    ConnectionOpened
    | ConnectionClosed
    | StreamOpened
    | StreamResponse
    | ChunkEvent
    | StreamClosed
    | PipelineError
    | StreamFlagged
)
