"""HTTP exchanges → LLM streams: body decoding, dialect extraction, stream state (sans-IO).

Input is the output of ``http1.HttpParser`` (HTTP messages plus connection
events passed through); output is what the store writes: ``ConnectionOpened``
/ ``ConnectionClosed``, ``StreamOpened``, ``StreamResponse``, ``ChunkEvent``,
``StreamClosed`` and ``PipelineError``.

Every HTTP exchange becomes a stream row. Exchanges whose request matches a
known LLM API (``dialects.select_dialect``) get their response body decoded —
``text/event-stream`` with the WHATWG SSE decoder, NDJSON line by line, any
other body as one JSON document at the end — and each item turned into chunk
events. The stream is closed with a summary whose ``state`` never claims a
stream whole that lost bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sniffer.core.credentials import (
    scrub_error_text,
    scrub_headers,
    scrub_url,
)
from sniffer.core.events import (
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    EndReason,
    FlowEnd,
    FlowGap,
    Headers,
    HttpAnomaly,
    HttpBody,
    HttpEnd,
    HttpError,
    HttpRequest,
    HttpResponse,
    HttpResync,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamFlagged,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.core.http1 import HttpOutput
from sniffer.core.native import body_chunks, ndjson_decoder, sse_decoder
from sniffer.core.resync import CHUNKED, ItemSync, sniff_item_format
from sniffer.core.sse import (
    DEFAULT_MAX_LINE,
    ItemDecoder,
    NdjsonDecoder,
    NdjsonItems,
    SseDecoder,
    SseItems,
)
from sniffer.llm.dialects import dialect_by_name, guess_dialect, select_dialect
from sniffer.llm.dialects.base import (
    AFTER_DONE,
    DONE,
    ERROR,
    INVALID,
    OTHER,
    OUTPUT_KINDS,
    ROLE,
    STREAM_LEVEL,
    Delta,
    Dialect,
)
from sniffer.llm.dialects.openai import server_stats
from sniffer.llm.values import EMPTY_REQUEST, RequestSummary, Usage, json_loads, scan_request

if TYPE_CHECKING:
    from sniffer._native import Core

#: Gap reason of a stream adopted from a checkpoint taken inside an item.
RESTART_ITEM = "sidecar restarted inside an item"
#: Items of a recovered body held until one of them names its dialect.
MAX_UNGUESSED_ITEMS = 256
#: Decoded bytes of a recovered body looked at to tell SSE from NDJSON.
MAX_SNIFF = 64 * 1024
#: Request body bytes kept per exchange (stored and parsed); past it the
#: stream is flagged ``request-cut`` and its parameters are read from the start.
MAX_REQUEST_BODY = 4 << 20
#: Non-streamed response body bytes kept per exchange.
MAX_RESPONSE_BODY = 16 << 20
#: Chunk rows of events that carry no output (role preludes, keep-alives,
#: metadata, unparseable items: :data:`QUIET_KINDS` with nothing but ``raw``;
#: and every item after the end marker) stored per stream. Past it they are
#: counted, not stored (flag ``events-capped``): 10,000 is far above what a real
#: stream sends (a role prelude per choice, a ping every few seconds), and
#: bounds a flood of empty events (``data:`` blank lines, 7 bytes each) to a
#: few MB of rows. Output (content, reasoning, tool calls, finish, usage,
#: logprobs, server tokens, errors) is never capped this way.
MAX_QUIET_EVENTS = 10_000
#: Delta kinds that may carry no output (see :data:`MAX_QUIET_EVENTS`); the
#: end marker is not one (it comes once: what follows it is after-done).
QUIET_KINDS = frozenset({ROLE, OTHER, INVALID})
#: ``errors`` rows written per connection for one kind of TCP anomaly; past it
#: they are counted, and one row at the connection's close says how many more.
MAX_ANOMALY_ROWS = 16
#: Closed exchanges of a connection remembered, so that an anomaly touching
#: their bytes after their close still names and flags their stream.
_CLOSED_KEPT = 4
#: each state's ``value`` (an enum member's ``value`` is a property: a look-up
#: here costs less, once per closed stream)
_STATE_NAMES: dict[StreamState, str] = {state: state.value for state in StreamState}

#: The TCP anomalies (``FlowAnomaly.kind``) that make a stream's bytes doubtful,
#: and the flag they give it. The others leave the stored bytes right: a
#: buffer cap declares a gap (the stream says so), a segment out of the window
#: or after the FIN is dropped as the receiver drops it.
ANOMALY_FLAGS: dict[str, StreamFlag] = {"overlap-mismatch": StreamFlag.OVERLAP_MISMATCH}

#: What the ``errors`` row of each anomaly kind says it did.
_ANOMALY_TEXT = {
    "buffer-cap": "the out-of-order buffer overflowed its cap: the oldest hole was declared lost",
    "out-of-window": "a segment far beyond the expected sequence number was dropped",
    "after-fin": "data after the FIN was dropped",
}

NDJSON_TYPES = frozenset(
    {"application/x-ndjson", "application/ndjson", "application/jsonl", "application/json-lines"}
)


def _header(headers: Headers, name: str) -> str | None:
    for n, v in headers:
        if n == name:
            return v
    return None


def _fmt(ep: tuple[str, int]) -> str:
    return f"[{ep[0]}]:{ep[1]}" if ":" in ep[0] else f"{ep[0]}:{ep[1]}"


@dataclass
class StreamStats:
    """Counters of the stream stage (``replay --json``, the daemon's stats)."""

    streams_opened: int = 0
    streams_closed: int = 0
    chunk_events: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # by stage
    anomalies: dict[str, int] = field(default_factory=dict)  # TCP anomalies by kind
    states: dict[str, int] = field(default_factory=dict)  # closed streams by state


class _Conn:
    __slots__ = ("anomaly_rows", "client_end", "closed", "early", "opened")

    def __init__(self, opened: ConnectionOpened) -> None:
        self.opened = opened
        self.client_end: str | None = None  # "fin"/"rst" once the client's side ended
        self.anomaly_rows: dict[str, int] = {}  # TCP anomalies seen, by kind
        # anomalies of a request whose head has not come yet (its exchange is not known)
        self.early: list[HttpAnomaly] = []
        # exchange → (stream, flags) of the last ones closed
        self.closed: dict[int, tuple[int, tuple[StreamFlag, ...]]] = {}


class _Exchange:
    """One request/response exchange being assembled."""

    __slots__ = (
        "body",
        "chunk_count",
        "chunk_idx",
        "closed",
        "conn",
        "decoder",
        "dialect",
        "done_seen",
        "error",
        "event_count",
        "exchange",
        "finish",
        "flags",
        "gap",
        "gap_reason",
        "gaps",
        "invalid",
        "item_sync",
        "lost",
        "ndjson",
        "opened",
        "overlong",
        "quiet",
        "recovered",
        "req",
        "req_body",
        "req_bytes",
        "req_cut",
        "req_end",
        "requested_n",
        "resp",
        "resp_bytes",
        "resp_end",
        "seq",
        "sniff",
        "stream",
        "t_first",
        "t_last",
        "text_len",
        "truncated_event",
        "unframed",
        "unguessed",
        "usage",
    )

    def __init__(self, stream: int, conn: int, exchange: int) -> None:
        self.stream = stream
        self.conn = conn
        self.exchange = exchange
        self.req: HttpRequest | None = None
        self.req_body = bytearray()
        self.req_bytes = 0
        self.req_cut = False  # request bytes past the cap were dropped
        self.req_end: EndReason | None = None
        self.opened = False
        self.dialect: Dialect | None = None
        self.resp: HttpResponse | None = None
        self.resp_bytes = 0
        self.resp_end: EndReason | None = None
        # protocols, not the classes: the native core's decoders stand in
        self.decoder: SseItems | None = None
        self.ndjson: NdjsonItems | None = None
        self.body: bytearray | None = None  # non-streaming body of a dialect exchange
        self.seq = 0
        self.chunk_idx: dict[int, int] = {}
        self.chunk_count = 0
        self.event_count = 0
        self.text_len = 0
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.done_seen = False
        self.finish: dict[int, str] = {}
        self.usage: Usage | None = None
        self.gap = False
        self.gap_reason = ""
        self.error: str | None = None
        self.invalid = 0
        self.overlong = 0  # lines over the cap dropped by decoders since replaced
        self.quiet = 0  # events carrying no output, stored or not (MAX_QUIET_EVENTS)
        self.requested_n = 1  # the request's n (choices the stream must finish)
        self.truncated_event = False
        self.closed = False
        # A body picked up mid-way (core.resync): no request, no head.
        self.recovered: HttpResync | None = None
        self.item_sync: ItemSync | None = None  # drops bytes up to the first whole item
        self.sniff: bytearray | None = None  # recovered: bytes until SSE/NDJSON is told
        self.unguessed: list[tuple[float, str, str]] | None = None  # items before the dialect
        # gaps inside the body, each resumed (lost, restart): count, bytes (None: unknown)
        self.gaps = 0
        self.lost: int | None = 0
        self.unframed = 0  # bytes dropped after those gaps up to a provable boundary
        self.flags: list[StreamFlag] = []  # StreamClosed.flags, in the order first seen


class StreamAssembler:
    """Sans-IO: HTTP events in, store events out."""

    def __init__(
        self,
        *,
        stream_id_base: int = 1,
        stream_ids: Callable[[], int] | None = None,
        labels: Mapping[int, str] | None = None,
        max_request_body: int = MAX_REQUEST_BODY,
        max_response_body: int = MAX_RESPONSE_BODY,
        max_quiet_events: int = MAX_QUIET_EVENTS,
        max_line: int = DEFAULT_MAX_LINE,
        native: bool = False,
    ) -> None:
        self._next_id = stream_id_base
        #: hands out stream ids when given (the store's id blocks); else base, base + 1, …
        self._stream_ids = stream_ids
        self._labels = dict(labels or {})
        self._max_req = max_request_body
        self._max_resp = max_response_body
        self._max_quiet = max_quiet_events
        self._max_line = max_line  # the SSE/NDJSON decoders' line cap
        #: the item decoders: the Python ones, or the native core's (``native``,
        #: same interface and events; ``tests/test_native_sse.py``)
        self._sse: Callable[[int], SseItems] = SseDecoder
        self._ndjson: Callable[[int], NdjsonItems] = NdjsonDecoder
        #: the native item loop (``sniffer._native.body_chunks``: the SSE or
        #: NDJSON decoder's items through the dialect and :meth:`_deltas` in
        #: one call per body event), or None
        self._body_chunks: Any = None
        if native:
            self._sse = sse_decoder
            self._ndjson = ndjson_decoder
            self._body_chunks = body_chunks()
        self._conns: dict[int, _Conn] = {}
        self._ex: dict[tuple[int, int], _Exchange] = {}
        #: the keys of ``_ex`` by connection, in ``_ex``'s order (a connection's
        #: close, gap or forgetting visits its own exchanges, not all of them:
        #: with thousands of concurrent streams a scan per close was quadratic)
        self._by_conn: dict[int, dict[int, None]] = {}
        self.stats = StreamStats()

    @property
    def open_streams(self) -> int:
        return len(self._ex)

    def set_labels(self, labels: Mapping[int, str]) -> None:
        self._labels = dict(labels)

    # ------------------------------------------------------------------ public

    def feed(self, ev: HttpOutput) -> list[StoreEvent]:
        out: list[StoreEvent] = []
        self.feed_into(ev, out)
        return out

    def feed_into(self, ev: HttpOutput, out: list[StoreEvent]) -> None:
        """``feed``, appending to ``out`` (the pipeline's list: no list per event)."""
        try:
            if type(ev) is HttpBody:  # the hot path (one per streamed chunk), inlined
                assert isinstance(ev, HttpBody)
                conn, exchange, ts, from_client, data = ev
                x = self._ex.get((conn, exchange))
                if x is not None:
                    if from_client:
                        self._request_body(x, data)
                    else:
                        self._response_body(x, ts, data, out)
                return
            self._feed(ev, out)
        except Exception as exc:  # RecursionError, MemoryError, a bug: this exchange only
            self._contain(ev, exc, out)

    def feed_held(
        self,
        core: Core,
        i: int,
        stop: int,
        out: list[StoreEvent],
        dead: set[int],
        calls: dict[tuple[int, int], Any],
    ) -> tuple[int, BaseException | None]:
        """The response bodies the native core holds at outputs ``i``,
        ``i + 1``, … (before ``stop``) of its last call (``None`` there; see
        ``sniffer._native.Core.feed_bodies``), through :meth:`_response_body`'s
        native item loop in one call; what ``feed_into`` gives for each. The
        pipeline's rules come along: a body of a connection in ``dead`` is
        dropped; one of a gRPC call (a key of ``calls``), or one this loop does
        not take (a recovered body, a whole document), stops it. Returns
        ``(j, exc)``: the outputs before ``j`` are done; ``exc``: raised on
        body ``j``, for the caller to :meth:`contain`; else output ``j`` (if
        before ``stop``) is left to the caller."""
        j, n, errors, exc = core.feed_bodies(self._ex, i, stop, out, self._max_quiet, dead, calls)
        self._native_counts(n, errors)
        return j, exc

    def _native_counts(self, chunk_events: int, dialect_errors: int) -> None:
        """What the native item loop counted (``_deltas`` and ``_capped`` count
        them in the Python one)."""
        if chunk_events:
            self.stats.chunk_events += chunk_events
        if dialect_errors:
            self.stats.errors["dialect"] = self.stats.errors.get("dialect", 0) + dialect_errors

    def contain(self, ev: HttpOutput, exc: BaseException, out: list[StoreEvent]) -> None:
        """What ``feed_into`` does when handling ``ev`` raised ``exc``: an
        ``Exception`` is contained (:meth:`_contain`), anything else raised."""
        if not isinstance(exc, Exception):
            raise exc
        self._contain(ev, exc, out)

    def _contain(self, ev: HttpOutput, exc: BaseException, out: list[StoreEvent]) -> None:
        """An exception inside the stage while handling ``ev``: recorded on its
        exchange (which stops decoding its body and ends in state error); the
        connection and every other exchange go on."""
        exchange = getattr(ev, "exchange", None)
        x = self._ex.get((ev.conn, exchange)) if exchange is not None else None
        msg = f"{type(exc).__name__} while handling {type(ev).__name__}"
        if x is not None:
            self._fault(x, ev.ts, msg, out)
            if isinstance(ev, HttpEnd) and not ev.from_client and not x.closed:
                self._close(x, ev.ts, out)
            return
        self._count_error("streams")
        out.append(PipelineError(ev.ts, "streams", "internal", msg, ev.conn, None))

    def _fault(self, x: _Exchange, ts: float, msg: str, out: list[StoreEvent]) -> None:
        """Record an error on exchange ``x`` and stop decoding its response body."""
        self._count_error("streams")
        if x.error is None:
            x.error = msg
        x.decoder = None
        x.ndjson = None
        x.body = None
        out.append(PipelineError(ts, "streams", "internal", msg, x.conn, x.stream))

    # One exchange's transitions in one place, per HTTP event: kept whole (C901).
    def _feed(self, ev: HttpOutput, out: list[StoreEvent]) -> None:  # noqa: C901
        t = type(ev)
        if t is HttpBody:
            assert isinstance(ev, HttpBody)
            x = self._ex.get((ev.conn, ev.exchange))
            if x is not None:
                if ev.from_client:
                    self._request_body(x, ev.data)
                else:
                    self._response_body(x, ev.ts, ev.data, out)
        elif t is HttpRequest:
            assert isinstance(ev, HttpRequest)
            x = self._exchange(ev.conn, ev.exchange)
            x.req = ev
            c = self._conns.get(ev.conn)
            if c is not None and c.early:
                early = [a for a in c.early if a.exchange == ev.exchange]
                c.early = [a for a in c.early if a.exchange != ev.exchange]
                for a in early:
                    self._anomaly(a, out, defer=False)
        elif t is HttpEnd:
            assert isinstance(ev, HttpEnd)
            x = self._ex.get((ev.conn, ev.exchange))
            if x is not None:
                if ev.from_client:
                    self._request_end(x, ev, out)
                else:
                    self._response_end(x, ev, out)
        elif t is HttpResponse:
            assert isinstance(ev, HttpResponse)
            if not ev.informational:
                x = self._exchange(ev.conn, ev.exchange)
                self._response_head(x, ev, out)
        elif t is HttpError:
            assert isinstance(ev, HttpError)
            self._http_error(ev, out)
        elif t is HttpResync:
            assert isinstance(ev, HttpResync)
            self._resync(ev)
        elif t is ConnectionOpened:
            assert isinstance(ev, ConnectionOpened)
            self._conns[ev.conn] = _Conn(ev)
            out.append(ev)
        elif t is FlowEnd:
            assert isinstance(ev, FlowEnd)
            c = self._conns.get(ev.conn)
            if c is not None and ev.from_client and c.client_end is None:
                c.client_end = ev.reason
        elif t is FlowGap:
            assert isinstance(ev, FlowGap)
            # Unattributable capture loss: every open exchange on the connection
            # may have lost bytes.
            for key in self._conn_keys(ev.conn):
                x = self._ex[key]
                if not x.closed:
                    self._mark_gap(x, f"capture lost packets ({ev.reason})")
        elif t is ConnectionClosed:
            assert isinstance(ev, ConnectionClosed)
            c = self._conns.get(ev.conn)
            if c is not None:
                self._anomalies_at_close(c, ev.ts, out)
            mark = len(out)  # ``out`` may already hold other events' output
            for key in self._conn_keys(ev.conn):
                x = self._ex[key]
                if x.resp_end is None:
                    x.resp_end = EndReason.RST if ev.reason == "rst" else EndReason.EOF
                try:
                    self._close(x, ev.ts, out, closing_reason=ev.reason)
                except Exception as exc:
                    self._fault(x, ev.ts, f"{type(exc).__name__} while closing", out)
                    if not any(
                        type(e) is StreamClosed and e.stream == x.stream for e in out[mark:]
                    ):
                        x.closed = False
                        self._close(x, ev.ts, out, closing_reason=ev.reason)
            self._conns.pop(ev.conn, None)
            out.append(ev)
        elif t is HttpAnomaly:
            assert isinstance(ev, HttpAnomaly)
            self._count_anomaly(ev.kind)
            self._anomaly(ev, out)

    # ------------------------------------------------------------- anomalies

    def _count_anomaly(self, kind: str) -> None:
        self.stats.anomalies[kind] = self.stats.anomalies.get(kind, 0) + 1

    def _anomaly(self, ev: HttpAnomaly, out: list[StoreEvent], defer: bool = True) -> None:
        """A TCP anomaly (counted once, by the caller): flag the exchange(s) it
        touched when it makes their bytes doubtful, and record it (at most
        ``MAX_ANOMALY_ROWS`` rows per connection and kind)."""
        c = self._conns.get(ev.conn)
        flag = ANOMALY_FLAGS.get(ev.kind)
        stream: int | None = None
        late = False
        if ev.exchange is None:  # HTTP/2: every exchange open on the connection
            if flag is not None:
                for key in self._conn_keys(ev.conn):
                    y = self._ex[key]
                    if not y.closed:
                        self._flag(y, flag)
        else:
            x = self._ex.get((ev.conn, ev.exchange))
            if x is not None:
                stream = x.stream
                if flag is not None:
                    self._flag(x, flag)
            elif c is not None and ev.exchange in c.closed:
                # (a copy of its last bytes after the close: the row is flagged now)
                stream, flags = c.closed[ev.exchange]
                if flag is not None and flag not in flags:
                    flags = (*flags, flag)
                    c.closed[ev.exchange] = (stream, flags)
                    out.append(StreamFlagged(stream, ev.ts, flags))
                    late = True
            elif defer and c is not None and ev.from_client and len(c.early) < MAX_ANOMALY_ROWS:
                c.early.append(ev)  # the request's head is still to come: wait for it
                return
        if c is not None:
            seen = c.anomaly_rows.get(ev.kind, 0) + 1
            c.anomaly_rows[ev.kind] = seen
            if seen > MAX_ANOMALY_ROWS:
                return
        side = "client" if ev.from_client else "server"
        if ev.kind == "overlap-mismatch" and ev.offset >= 0:
            message = (
                f"{side} bytes {ev.offset}..{ev.offset + ev.length} ({ev.length} bytes; offsets "
                "in that direction's byte stream) arrived twice with different content: the "
                "first copy was kept, the later one dropped"
            )
        else:
            what = _ANOMALY_TEXT.get(ev.kind, ev.kind)
            message = f"{side}: {what}" + (f" ({ev.detail})" if ev.detail else "")
        if late:
            message += " (after its stream closed)"
        self._count_error("reassembly")
        out.append(PipelineError(ev.ts, "reassembly", ev.kind, message, ev.conn, stream))

    def _anomalies_at_close(self, c: _Conn, ts: float, out: list[StoreEvent]) -> None:
        """The connection closes: anomalies whose request never came are recorded
        without a stream, and the rows not written one by one are summed up."""
        early, c.early = c.early, []
        for a in early:
            self._anomaly(a, out, defer=False)
        conn = c.opened.conn
        for kind, seen in c.anomaly_rows.items():
            if seen > MAX_ANOMALY_ROWS:
                self._count_error("reassembly")
                out.append(
                    PipelineError(
                        ts,
                        "reassembly",
                        kind,
                        f"{seen - MAX_ANOMALY_ROWS} more on this connection (the first "
                        f"{MAX_ANOMALY_ROWS} were recorded one by one)",
                        conn,
                    )
                )

    # ----------------------------------------------------------- checkpoints

    def checkpoint(self, conn: int, exchange: int) -> dict[str, Any] | None:
        """The state of an open streamed LLM exchange that a restarted instance
        needs to go on writing the same row (JSON-ready), or None. ``idle``: the
        item decoder holds nothing (it stands at an event boundary)."""
        x = self._ex.get((conn, exchange))
        c = self._conns.get(conn)
        if x is None or c is None or x.closed or not x.opened or x.dialect is None:
            return None
        if x.unguessed is not None or x.sniff is not None:
            return None
        if x.resp is None and x.recovered is None:
            return None
        dec = x.decoder if x.decoder is not None else x.ndjson
        if dec is None:
            return None
        o = c.opened
        return {
            "stream": x.stream,
            "client": list(o.client),
            "server": list(o.server),
            "capture": o.capture,
            "dialect": x.dialect.name,
            "format": "sse" if x.decoder is not None else "ndjson",
            "idle": dec.idle and x.item_sync is None,
            "status": x.resp.status if x.resp is not None else None,
            "n": x.requested_n,
            "chunk_seq": x.seq,
            "chunk_idx": {str(k): v for k, v in x.chunk_idx.items()},
            "chunk_count": x.chunk_count,
            "event_count": x.event_count,
            "text_len": x.text_len,
            "t_first": x.t_first,
            "t_last": x.t_last,
            "done_seen": x.done_seen,
            "finish": {str(k): v for k, v in x.finish.items()},
            "usage": x.usage.raw if x.usage is not None else None,
            "gap": x.gap,
            "gap_reason": x.gap_reason,
            "error": x.error,
            "req_bytes": x.req_bytes,
            "resp_bytes": x.resp_bytes,
            "midway": x.recovered is not None,
            "gaps": x.gaps,
            "lost": x.lost,
            "unframed": x.unframed,
            "flags": [str(f) for f in x.flags],
            "quiet": x.quiet,
            "overlong": x.overlong + dec.overlong,
        }

    def forget(self, conn: int) -> None:
        """Drop a connection and its exchanges without closing them (checkpointed)."""
        for key in self._conn_keys(conn):
            self._drop(key)
        self._conns.pop(conn, None)

    def adopt(self, conn: int, exchange: int, ts: float, st: dict[str, Any]) -> None:
        """Go on with a stream another instance checkpointed: the same row (no
        ``StreamOpened``), its counters, a fresh item decoder (and, unless the
        checkpoint stood at an event boundary, one that first drops bytes up to
        the next whole item)."""
        client = (str(st["client"][0]), int(st["client"][1]))
        server = (str(st["server"][0]), int(st["server"][1]))
        self._conns[conn] = _Conn(
            ConnectionOpened(conn, ts, client, server, False, str(st.get("capture", "packet")))
        )
        x = _Exchange(int(st["stream"]), conn, exchange)
        self._add((conn, exchange), x)
        x.opened = True
        x.dialect = dialect_by_name(str(st["dialect"]))
        if st["status"] is not None:
            x.resp = HttpResponse(conn, exchange, ts, int(st["status"]), "", "1.1", ())
        if st["format"] == "sse":
            x.decoder = self._sse(self._max_line)
        else:
            x.ndjson = self._ndjson(self._max_line)
        if not st["idle"]:
            x.item_sync = ItemSync(str(st["format"]), at_boundary=False)
            self._mark_gap(x, RESTART_ITEM)
        x.requested_n = max(1, int(st.get("n") or 1))
        x.quiet = int(st.get("quiet") or 0)
        x.overlong = int(st.get("overlong") or 0)
        x.seq = int(st["chunk_seq"])
        x.chunk_idx = {int(k): int(v) for k, v in st["chunk_idx"].items()}
        x.chunk_count = int(st["chunk_count"])
        x.event_count = int(st["event_count"])
        x.text_len = int(st["text_len"])
        x.t_first = st["t_first"]
        x.t_last = st["t_last"]
        x.done_seen = bool(st["done_seen"])
        x.finish = {int(k): str(v) for k, v in st["finish"].items()}
        x.usage = _checkpoint_usage(st["usage"])
        if st["gap"]:
            self._mark_gap(x, str(st["gap_reason"]))
        x.error = st["error"]
        x.gaps = int(st.get("gaps") or 0)
        x.lost = None if st.get("lost", 0) is None else int(st.get("lost") or 0)
        x.unframed = int(st.get("unframed") or 0)
        known = StreamFlag._value2member_map_
        x.flags = [StreamFlag(f) for f in st.get("flags") or () if f in known]
        x.req_bytes = int(st["req_bytes"])
        x.resp_bytes = int(st["resp_bytes"])
        if st.get("midway"):
            x.recovered = HttpResync(conn, exchange, ts, CHUNKED, 0, True)
            x.gap = True
            x.gap_reason = "started mid-way: capture began inside the response"

    def close_adopted(self, conn: int, ts: float, why: str) -> list[StoreEvent]:
        """Close the adopted streams of a connection as gapped (a stale checkpoint)."""
        out: list[StoreEvent] = []
        for key in self._conn_keys(conn):
            x = self._ex[key]
            self._mark_gap(x, why)
            x.resp_end = EndReason.EOF
            self._close(x, ts, out)
        self._conns.pop(conn, None)
        out.append(ConnectionClosed(conn, ts, "restart"))
        return out

    # -------------------------------------------------------------- requests

    def _exchange(self, conn: int, exchange: int) -> _Exchange:
        key = (conn, exchange)
        x = self._ex.get(key)
        if x is None:
            if self._stream_ids is not None:
                x = _Exchange(self._stream_ids(), conn, exchange)
            else:
                x = _Exchange(self._next_id, conn, exchange)
                self._next_id += 1
            self._add(key, x)
        return x

    def _add(self, key: tuple[int, int], x: _Exchange) -> None:
        """``_ex[key] = x``, indexed by connection (``_by_conn``)."""
        self._ex[key] = x
        self._by_conn.setdefault(key[0], {})[key[1]] = None

    def _drop(self, key: tuple[int, int]) -> None:
        """Remove ``key`` from ``_ex`` (if there) and its connection's index."""
        if self._ex.pop(key, None) is not None:
            keys = self._by_conn[key[0]]
            del keys[key[1]]
            if not keys:
                del self._by_conn[key[0]]

    def _conn_keys(self, conn: int) -> list[tuple[int, int]]:
        """The keys of ``conn``'s exchanges in ``_ex``, in ``_ex``'s order."""
        keys = self._by_conn.get(conn)
        return [(conn, e) for e in keys] if keys else []

    def _request_body(self, x: _Exchange, data: bytes) -> None:
        x.req_bytes += len(data)
        room = self._max_req - len(x.req_body)
        if room >= len(data):
            x.req_body += data
            return
        if room > 0:
            x.req_body += data[:room]
        x.req_cut = True

    def _request_end(self, x: _Exchange, ev: HttpEnd, out: list[StoreEvent]) -> None:
        x.req_end = ev.reason
        if ev.reason is EndReason.GAP:
            self._mark_gap(x, "request bytes lost")
        if not x.opened:
            self._open(x, out)

    def _open(self, x: _Exchange, out: list[StoreEvent], first_item: str | None = None) -> None:
        """Emit StreamOpened once the request is known (whole, or as much as came).

        A recovered body (no request seen) opens when its items name the dialect
        (``first_item``), or at its close: request fields stay empty, only the
        model is taken from the item where it says."""
        x.opened = True
        if x.recovered is not None:
            self._open_recovered(x, out, first_item)
            return
        c = self._conns.get(x.conn)
        opened = c.opened if c is not None else None
        client = opened.client if opened else ("", 0)
        server = opened.server if opened else ("", 0)
        req = x.req
        body_text: str | None = None
        parsed: Any = None
        cut = x.req_cut
        if x.req_body:
            body_text = x.req_body.decode("utf-8", "replace")
            if cut:
                # the start of a longer JSON document: read its top-level keys
                parsed = scan_request(body_text)
            else:
                try:
                    parsed = json_loads(body_text)
                except ValueError:
                    parsed = None
                except RecursionError:  # nested deeper than the parser goes
                    parsed = None
                    ts = x.req.ts if x.req else 0.0
                    self._fault(x, ts, "request body: JSON nested too deep", out)
        method = req.method if req else ""
        target = req.target if req else ""
        path = scrub_url(target.split("?", 1)[0])
        try:
            x.dialect = select_dialect(method, target, parsed) if req else None
            summary = RequestSummary.parse(parsed)
        except Exception as exc:  # odd input must cost this exchange only
            x.dialect = None
            summary = EMPTY_REQUEST
            self._fault(x, req.ts if req else 0.0, f"request: {type(exc).__name__}", out)
        n = summary.n
        x.requested_n = n if n is not None and n > 0 else 1
        if cut:
            self._request_cut(x, req.ts if req else 0.0, out, summary)
        self.stats.streams_opened += 1
        out.append(
            StreamOpened(
                stream=x.stream,
                conn=x.conn,
                exchange=x.exchange,
                ts=req.ts if req else (x.resp.ts if x.resp else 0.0),
                client=client,
                server=server,
                method=method,
                path=path,
                request_headers=scrub_headers(req.headers) if req else (),
                request_body=body_text,
                request=summary,
                dialect=x.dialect.name if x.dialect is not None else None,
                label=self._labels.get(server[1]),
                capture=opened.capture if opened else "packet",
                pid=opened.pid if opened else None,
                comm=opened.comm if opened else None,
            )
        )
        if summary.out_of_range:  # left out of the row: an integer wider than its column
            self._count_error("streams")
            fields = ", ".join(summary.out_of_range)
            out.append(
                PipelineError(
                    req.ts if req else 0.0,
                    "streams",
                    "out-of-range",
                    f"request: {fields}: an integer out of range, not stored",
                    x.conn,
                    x.stream,
                )
            )

    def _request_cut(
        self, x: _Exchange, ts: float, out: list[StoreEvent], summary: RequestSummary | None
    ) -> None:
        """The request body went past the cap (at the open, or later): flagged
        ``request-cut``, with an error row naming what was read of it."""
        if StreamFlag.REQUEST_CUT in x.flags:
            return
        self._flag(x, StreamFlag.REQUEST_CUT)
        self._count_error("streams")
        more = "+" if x.req_end is None else ""  # still coming when the stream opened
        message = f"request body of {x.req_bytes}{more} bytes cut at the {self._max_req}-byte cap"
        if summary is None:
            message += " after the stream opened"
        elif summary.present():
            message += f"; read from the part kept: {', '.join(summary.present())}"
        else:
            message += "; no parameter found in the part kept"
        out.append(PipelineError(ts, "streams", "request-cut", message, x.conn, x.stream))

    def _open_recovered(self, x: _Exchange, out: list[StoreEvent], item: str | None) -> None:
        rec = x.recovered
        assert rec is not None
        c = self._conns.get(x.conn)
        opened = c.opened if c is not None else None
        server = opened.server if opened else ("", 0)
        dialect = x.dialect  # set when an item named it (``item``)
        model = dialect.item_model(item) if item is not None and dialect is not None else None
        self.stats.streams_opened += 1
        out.append(
            StreamOpened(
                stream=x.stream,
                conn=x.conn,
                exchange=x.exchange,
                ts=rec.ts,
                client=opened.client if opened else ("", 0),
                server=server,
                method="",
                path="",
                request_headers=(),
                request_body=None,
                request=RequestSummary(model=model) if model is not None else EMPTY_REQUEST,
                dialect=x.dialect.name if x.dialect is not None else None,
                label=self._labels.get(server[1]),
                capture=opened.capture if opened else "packet",
                pid=opened.pid if opened else None,
                comm=opened.comm if opened else None,
            )
        )
        out.append(StreamResponse(x.stream, rec.ts, None, (), "", True))

    # ------------------------------------------------------------- responses

    def _response_head(self, x: _Exchange, ev: HttpResponse, out: list[StoreEvent]) -> None:
        if not x.opened:
            if x.req is None:
                x.resp = ev  # for the open timestamp
            self._open(x, out)
        x.resp = ev
        ctype = (_header(ev.headers, "content-type") or "").split(";", 1)[0].strip().lower()
        streaming = False
        if x.dialect is not None:
            if ctype == "text/event-stream":
                x.decoder = self._sse(self._max_line)
                streaming = True
            elif ctype in NDJSON_TYPES:
                x.ndjson = self._ndjson(self._max_line)
                streaming = True
            else:
                x.body = bytearray()
        out.append(
            StreamResponse(x.stream, ev.ts, ev.status, scrub_headers(ev.headers), ctype, streaming)
        )

    def _response_body(self, x: _Exchange, ts: float, data: bytes, out: list[StoreEvent]) -> None:
        x.resp_bytes += len(data)
        if x.sniff is not None:
            data = self._sniff(x, data)
            if not data:
                return
        if x.item_sync is not None:
            data = x.item_sync.feed(data)
            if not data:
                return
            if x.item_sync.synced:
                x.item_sync = None
        if x.unguessed is not None:
            self._guess(x, ts, data, out)
            return
        dialect = x.dialect
        if dialect is None:
            return
        native = self._body_chunks
        if native is not None and (x.decoder is not None or x.ndjson is not None):
            # the loops below in one native call (``native/py/src/chunks.rs``)
            n, errors, exc = native(x, ts, data, out, self._max_quiet)
            self._native_counts(n, errors)
            if exc is not None:
                raise exc
        elif x.decoder is not None:
            event = dialect.event
            for etype, item, _id, _retry in x.decoder.feed(data):
                if x.done_seen:
                    self._after_done(x, ts, item, out)
                else:
                    self._deltas(x, ts, event(item, etype), out)
        elif x.ndjson is not None:
            for line in x.ndjson.feed(data):
                if x.done_seen:
                    self._after_done(x, ts, line, out)
                else:
                    self._deltas(x, ts, dialect.event(line, "ndjson"), out)
        elif x.body is not None:
            room = self._max_resp - len(x.body)
            if room > 0:
                x.body += data[:room]

    # ------------------------------------------------------------ recovered

    def _resync(self, ev: HttpResync) -> None:
        """A response body picked up again (see ``core.resync``)."""
        key = (ev.conn, ev.exchange)
        x = self._ex.get(key)
        at_boundary = ev.framing == CHUNKED
        if x is None or not ev.recovered:
            if x is None:
                x = self._exchange(ev.conn, ev.exchange)
            if not ev.recovered:
                # Bytes of a known message were lost: its item in flight is cut,
                # the items after the sync point decode as usual.
                # every gap adds up: one reason for the row, with the totals
                x.gaps += ev.gaps
                x.lost = None if ev.lost is None or x.lost is None else x.lost + ev.lost
                x.unframed += ev.skipped
                lost = "an unknown number of" if x.lost is None else str(x.lost)
                if not x.gap or x.gap_reason.startswith(("response bytes lost", RESTART_ITEM)):
                    x.gap = True
                    x.gap_reason = (
                        f"response bytes lost ({lost} bytes in {x.gaps} gap"
                        f"{'s' if x.gaps > 1 else ''}, {x.unframed} more unframed)"
                    )
                if x.decoder is not None:
                    x.overlong += x.decoder.overlong
                    x.decoder = self._sse(self._max_line)
                    x.item_sync = ItemSync("sse", at_boundary=at_boundary)
                elif x.ndjson is not None:
                    x.overlong += x.ndjson.overlong
                    x.ndjson = self._ndjson(self._max_line)
                    x.item_sync = ItemSync("ndjson", at_boundary=at_boundary)
                else:
                    x.body = None  # a JSON document with a hole in it is no document
                return
        # A body whose request and head were never seen: its items name the dialect.
        x.recovered = ev
        x.gap = True
        x.gap_reason = (
            f"started mid-way: capture began inside the response "
            f"({ev.skipped} bytes before the sync point)"
        )
        x.sniff = bytearray()
        x.unguessed = []

    def _sniff(self, x: _Exchange, data: bytes) -> bytes:
        """Recovered body: hold bytes until they show SSE or NDJSON; then set the
        decoders up and return what was held."""
        sniff = x.sniff
        assert sniff is not None and x.recovered is not None
        sniff += data
        at_boundary = x.recovered.framing == CHUNKED
        fmt = sniff_item_format(bytes(sniff), at_start=at_boundary)
        if fmt is None:
            if len(sniff) > MAX_SNIFF:
                del sniff[: len(sniff) - 16]
            return b""
        x.sniff = None
        if fmt == "sse":
            x.decoder = self._sse(self._max_line)
        else:
            x.ndjson = self._ndjson(self._max_line)
        x.item_sync = ItemSync(fmt, at_boundary=at_boundary)
        return bytes(sniff)

    def _guess(self, x: _Exchange, ts: float, data: bytes, out: list[StoreEvent]) -> None:
        """Recovered body: decode items, hold them until one names the dialect,
        then open the stream and replay them."""
        pending = x.unguessed
        assert pending is not None
        if x.decoder is not None:
            items = [(sse.data, sse.event) for sse in x.decoder.feed(data)]
        elif x.ndjson is not None:
            items = [(line, "ndjson") for line in x.ndjson.feed(data)]
        else:
            return
        for item, event in items:
            if x.unguessed is None:
                assert x.dialect is not None
                if x.done_seen:
                    self._after_done(x, ts, item, out)
                else:
                    self._deltas(x, ts, x.dialect.event(item, event), out)
                continue
            name = guess_dialect(event, item)
            dialect = dialect_by_name(name) if name is not None else None
            if dialect is None:
                if len(pending) < MAX_UNGUESSED_ITEMS:
                    pending.append((ts, item, event))
                continue
            x.dialect = dialect
            x.unguessed = None
            self._open(x, out, first_item=item)
            for t0, held, held_event in [*pending, (ts, item, event)]:
                if x.done_seen:
                    self._after_done(x, t0, held, out)
                else:
                    self._deltas(x, t0, dialect.event(held, held_event), out)

    def _deltas(self, x: _Exchange, ts: float, deltas: list[Delta], out: list[StoreEvent]) -> None:
        append = out.append
        seq0 = x.seq
        for d in deltas:
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
                error,
                server_tokens,
            ) = d
            if kind in QUIET_KINDS and self._capped(x, d):
                continue
            index = 0
            if text:
                index = x.chunk_idx.get(choice, 0) + 1
                x.chunk_idx[choice] = index
                x.chunk_count += 1
                x.text_len += len(text)
            if x.t_first is None and kind in OUTPUT_KINDS:
                x.t_first = ts
            if finish_reason is not None:
                x.finish[choice] = finish_reason
            if usage is not None:
                x.usage = usage
            if kind == DONE:
                x.done_seen = True
            elif kind == ERROR:
                x.error = error or "error object in stream"
            elif kind == INVALID:
                x.invalid += 1
                self._count_error("dialect")
                append(
                    PipelineError(
                        ts, "dialect", "invalid", error or "unparseable item", x.conn, x.stream
                    )
                )
            seq = x.seq
            append(
                ChunkEvent(
                    x.stream,
                    ts,
                    seq,
                    choice,
                    index,
                    kind,
                    text,
                    reasoning,
                    tool_calls,
                    finish_reason,
                    logprobs,
                    usage,
                    raw,
                    server_tokens,
                )
            )
            x.seq = seq + 1
        n = x.seq - seq0
        if n:
            t_last = x.t_last
            if t_last is not None and ts < t_last:
                self._flag(x, StreamFlag.CLOCK_BACKWARDS)
            x.t_last = ts
            x.event_count += n
            self.stats.chunk_events += n

    def _capped(self, x: _Exchange, d: Delta) -> bool:
        """A delta of a :data:`QUIET_KINDS` kind: when it carries nothing but
        ``raw`` it counts towards :data:`MAX_QUIET_EVENTS`; past the cap it is
        not stored (True), an unparseable item still counted as one."""
        if (
            d.text
            or d.reasoning
            or d.tool_calls is not None
            or d.finish_reason is not None
            or d.logprobs is not None
            or d.usage is not None
            or d.server_tokens is not None
        ):
            return False
        x.quiet += 1
        if x.quiet <= self._max_quiet:
            return False
        if d.kind == INVALID:
            x.invalid += 1
            self._count_error("dialect")
        return True

    def _after_done(self, x: _Exchange, ts: float, item: str, out: list[StoreEvent]) -> None:
        """An item after the end marker: clients have stopped reading, so it is
        no part of the answer. Stored as it came (``raw``, kind ``after_done``,
        stream-level, no chunk index), the stream flagged ``after-done``; it
        changes no state and counts towards :data:`MAX_QUIET_EVENTS`."""
        self._flag(x, StreamFlag.AFTER_DONE)
        x.quiet += 1
        if x.quiet > self._max_quiet:
            return
        seq = x.seq
        out.append(
            ChunkEvent(
                x.stream, ts, seq, STREAM_LEVEL, 0, AFTER_DONE, "", "", None, None, None, None, item
            )
        )
        x.seq = seq + 1
        x.event_count += 1
        self.stats.chunk_events += 1

    def _response_end(self, x: _Exchange, ev: HttpEnd, out: list[StoreEvent]) -> None:
        x.resp_end = ev.reason
        if ev.reason is EndReason.GAP:
            self._mark_gap(x, "response bytes lost")
        self._close(x, ev.ts, out)

    # ---------------------------------------------------------------- errors

    def _count_error(self, stage: str) -> None:
        self.stats.errors[stage] = self.stats.errors.get(stage, 0) + 1

    def _http_error(self, ev: HttpError, out: list[StoreEvent]) -> None:
        self._count_error("http")
        x = self._ex.get((ev.conn, ev.exchange)) if ev.exchange is not None else None
        message = scrub_error_text(ev.message)
        if x is not None and ev.kind != "desync":
            side = "request" if ev.from_client else "response"
            x.error = f"{side} {ev.kind}: {message}"
        out.append(
            PipelineError(
                ev.ts,
                "http",
                ev.kind,
                message,
                ev.conn,
                x.stream if x is not None else None,
            )
        )

    def _check_clock(self, x: _Exchange, ts: float) -> None:
        """At the close: a capture clock that went backwards across the exchange
        (the close before the last chunk or the request, the response head before
        the request) flags it; chunks already compared as they came."""
        back = x.t_last is not None and ts < x.t_last
        req = x.req
        if req is not None:
            back = back or ts < req.ts or (x.resp is not None and x.resp.ts < req.ts)
        if back:
            self._flag(x, StreamFlag.CLOCK_BACKWARDS)

    @staticmethod
    def _flag(x: _Exchange, flag: StreamFlag) -> None:
        """Note what the stream's state does not say (``StreamClosed.flags``)."""
        if flag not in x.flags:
            x.flags.append(flag)

    def _mark_gap(self, x: _Exchange, why: str) -> None:
        if not x.gap:
            x.gap = True
            x.gap_reason = why

    # ----------------------------------------------------------------- close

    def _close(
        self, x: _Exchange, ts: float, out: list[StoreEvent], closing_reason: str | None = None
    ) -> None:
        if x.closed:
            return
        x.closed = True
        self._drop((x.conn, x.exchange))
        if not x.opened:
            self._open(x, out)
        response_body: str | None = None
        try:
            response_body = self._finish_body(x, ts, out)
        except Exception as exc:  # deep JSON, memory: this exchange ends in error
            response_body = None
            self._fault(x, ts, f"{type(exc).__name__} in the response body", out)
        self._check_clock(x, ts)
        if x.req_cut:
            self._request_cut(x, ts, out, None)
        c = self._conns.get(x.conn)
        if c is not None:
            kept = c.closed
            kept[x.exchange] = (x.stream, tuple(x.flags))
            if len(kept) > _CLOSED_KEPT:
                del kept[next(iter(kept))]
        state, reason = self._verdict(x, closing_reason)
        self.stats.streams_closed += 1
        states = self.stats.states
        name = _STATE_NAMES[state]
        states[name] = states.get(name, 0) + 1
        out.append(
            StreamClosed(
                stream=x.stream,
                ts=ts,
                state=state,
                reason=reason,
                done_seen=x.done_seen,
                gap=x.gap,
                t_first_content=x.t_first if x.recovered is None else None,
                t_last_chunk=x.t_last,
                chunk_count=x.chunk_count,
                event_count=x.event_count,
                text_len=x.text_len,
                finish_reasons=tuple(sorted(x.finish.items())),
                usage=x.usage,
                response_body=response_body,
                error=x.error,
                request_bytes=x.req_bytes,
                response_bytes=x.resp_bytes,
                response_id=getattr(x.dialect, "response_id", None),
                response_model=getattr(x.dialect, "response_model", None),
                flags=tuple(x.flags),
            )
        )

    def _finish_body(self, x: _Exchange, ts: float, out: list[StoreEvent]) -> str | None:
        """The end of the response body: flush the decoders; a whole body is parsed."""
        response_body: str | None = None
        dialect = x.dialect
        if dialect is not None:
            if x.decoder is not None:
                x.decoder.close()
                x.truncated_event = x.decoder.truncated_event
                x.overlong += x.decoder.overlong
                if x.decoder.errors:
                    self._count_error("sse")
                    out.append(
                        PipelineError(
                            ts, "sse", "line", _decoder_errors(x.decoder), x.conn, x.stream
                        )
                    )
            elif x.ndjson is not None:
                if x.resp_end is EndReason.COMPLETE:
                    for line in x.ndjson.close():
                        if x.done_seen:
                            self._after_done(x, ts, line, out)
                        else:
                            self._deltas(x, ts, dialect.event(line, "ndjson"), out)
                x.overlong += x.ndjson.overlong
                if x.ndjson.errors:
                    self._count_error("ndjson")
                    out.append(
                        PipelineError(
                            ts, "ndjson", "line", _decoder_errors(x.ndjson), x.conn, x.stream
                        )
                    )
            if x.overlong:
                self._flag(x, StreamFlag.ITEM_OVER_CAP)
            if x.quiet > self._max_quiet:
                self._flag(x, StreamFlag.EVENTS_CAPPED)
                self._count_error("streams")
                out.append(
                    PipelineError(
                        ts,
                        "streams",
                        "events-capped",
                        f"{x.quiet - self._max_quiet} of {x.quiet} events carrying no output "
                        f"counted, not stored (cap: {self._max_quiet} per stream)",
                        x.conn,
                        x.stream,
                    )
                )
            elif x.body is not None and x.resp_end is EndReason.COMPLETE and x.body:
                response_body = x.body.decode("utf-8", "replace")
                self._deltas(x, ts, dialect.body(response_body), out)
        return response_body

    def _verdict(self, x: _Exchange, closing_reason: str | None) -> tuple[StreamState, str]:
        """The stream's final state and why. A stream with a gap is never complete."""
        if x.recovered is not None:
            ended = "finished" if x.done_seen or x.finish else "not finished"
            return StreamState.MIDWAY, f"{x.gap_reason}; {ended}"
        if x.gap:
            return StreamState.GAP, x.gap_reason
        end = x.resp_end
        resp = x.resp
        if resp is None:
            if end is EndReason.ERROR:
                return StreamState.ERROR, x.error or "malformed response"
            if x.error:
                return StreamState.ERROR, x.error
            why = "capture ended" if closing_reason == "eof" else "connection closed"
            return StreamState.TRUNCATED, f"no response ({why})"
        if end is EndReason.ERROR or (x.error and x.dialect is None):
            return StreamState.ERROR, x.error or "malformed response"
        if x.error:
            return StreamState.ERROR, x.error
        if resp.status >= 400:
            return StreamState.ERROR, f"HTTP {resp.status}"
        if end is not EndReason.COMPLETE:
            if x.done_seen and x.dialect is not None and self._all_finished(x):
                # Every choice finished and the end marker arrived: the client got
                # the whole stream; only the body's last framing bytes are missing
                # (clients close right after [DONE]).
                return StreamState.COMPLETE, "complete (connection closed before the body ended)"
            c = self._conns.get(x.conn)
            if c is not None and c.client_end is not None:
                return StreamState.TRUNCATED, f"client closed the connection ({c.client_end})"
            if end is EndReason.RST:
                return StreamState.TRUNCATED, "connection reset"
            if closing_reason == "eof":
                return StreamState.TRUNCATED, "capture ended before the response did"
            return StreamState.TRUNCATED, "server closed before the response ended"
        if x.dialect is None or (x.decoder is None and x.ndjson is None):
            if x.dialect is not None and x.invalid:
                return StreamState.ERROR, "response body is not valid JSON"
            return StreamState.COMPLETE, "complete"
        # A streamed LLM response: every choice must finish (or [DONE] arrive).
        n = x.requested_n
        finished = sum(1 for c in x.finish if c != STREAM_LEVEL)
        if finished >= n or (x.done_seen and finished > 0):
            return StreamState.COMPLETE, "complete"
        if x.done_seen:
            return StreamState.COMPLETE, "complete ([DONE] without finish_reason)"
        if x.truncated_event:
            return StreamState.TRUNCATED, "body ended inside an event"
        return StreamState.TRUNCATED, f"ended without finish_reason ({finished} of {n} choices)"

    @staticmethod
    def _all_finished(x: _Exchange) -> bool:
        return sum(1 for c in x.finish if c != STREAM_LEVEL) >= x.requested_n


def _checkpoint_usage(value: Any) -> Usage | None:
    """A checkpoint's usage: the usage object (JSON text in checkpoints written
    before usage was typed)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    try:
        usage = Usage.parse(value)
    except ValueError:
        return None
    # the server's speculative-decoding figures and timings travel in the
    # usage JSON; the restored usage reads them again, as the dialect did
    return None if usage is None else server_stats(usage)


def _decoder_errors(dec: ItemDecoder) -> str:
    """The error row of an item decoder: its last error, and how many there were."""
    last = dec.last_error or ""
    return last if dec.errors == 1 else f"{dec.errors} errors, the last: {last}"
