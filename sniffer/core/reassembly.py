"""TCP reassembly, sans-IO: captured segments in, ordered bytes per direction out.

``Reassembler.feed`` takes one :class:`~sniffer.core.events.Segment` and returns the
flow events it caused (:class:`~sniffer.core.events.ConnectionOpened`,
:class:`~sniffer.core.events.FlowData`, :class:`~sniffer.core.events.FlowGap`,
:class:`~sniffer.core.events.FlowEnd`, :class:`~sniffer.core.events.ConnectionClosed`,
:class:`~sniffer.core.events.FlowAnomaly`). Nothing here opens a socket or a file,
reads a clock or logs: time is the capture timestamp of the segments, and
``expire(now)``/``flush(ts)`` are driven by the caller.

Model
-----
A connection is keyed by its unordered 4-tuple and has two *halves* (one per
direction). Each half maps 32-bit sequence numbers to unbounded byte offsets:
offset 0 is the first data byte (the byte after the SYN when the handshake was
seen, else the first byte captured). Sequence numbers are unwrapped relative
to the next expected one, so streams longer than 4 GiB and ISNs near 2**32
need nothing special.

Per half, every byte below ``next_off`` has been delivered or declared lost;
bytes above it that arrived early sit in a capped out-of-order buffer of
non-overlapping pieces. The first copy of every byte wins: retransmissions are
dropped (and counted), and an overlap whose bytes differ from the first copy is
counted as inconsistent and reported as a ``FlowAnomaly``. Already-delivered
bytes are compared against the last delivered chunk only.

Roles
-----
The sender of a SYN (without ACK) is the client; the sender of a SYN+ACK is
the server. With no handshake seen (capture started mid-stream), the endpoint
whose port is in ``server_ports`` is the server; failing that, the endpoint
with the lower port number is the server (on a tie, the destination of the
first captured segment). The HTTP stage may still swap roles by content.

Loss
----
A hole (bytes that never arrived) becomes ``FlowGap(nbytes=<exact>,
reason="lost")`` and delivery resumes after it, when:

(a) the other direction acknowledges bytes beyond the hole start (the receiver
    got them, so the capture lost them), even with nothing buffered. ACKs are
    read on every segment, pure ACKs included; an ACK of the SYN or the FIN is
    not data. The loss is declared when this direction next sends payload or a
    FIN (after placing that segment), so a capture that shows an ACK just
    before the data it acknowledges (neighbouring packets swapped) loses
    nothing; if it sends nothing more, rules (b) and (d) apply to the ACKed
    range as if it were buffered data. An ACK more than 2**30 ahead is bogus
    and ignored;
(b) buffered out-of-order data has waited more than ``hole_timeout`` seconds of
    capture time (checked on ``feed`` for that connection and on ``expire``);
(c) the out-of-order buffer of the direction exceeds ``max_buffer``;
(d) a FIN, RST, ``flush`` or expiry arrives with a hole pending.

Data later arriving for a range already declared lost is dropped and counted
as a retransmission: bytes are never delivered out of order.

Opening
-------
A SYN, a SYN+ACK or a segment with payload on an unknown 4-tuple opens a
connection (ids sequential from ``conn_id_base``); a bare ACK, FIN or RST does
not. A direction first seen without its SYN starts at the first sequence number
with payload, after a ``FlowGap(nbytes=None, reason="midstream")``.

Events per ``feed``
-------------------
Contiguous bytes are coalesced: one call yields at most one ``FlowData`` per
direction between two gaps of that direction (so usually exactly one).

Closing
-------
FIN: ``FlowEnd("fin")`` once every byte before the FIN has been delivered or
declared lost; both halves FIN'd gives ``ConnectionClosed("fin")``. RST ends
every open half with ``"rst"`` and closes the connection. A closed connection
lingers briefly as a tombstone so that its last ACKs do not open a mid-stream
connection. A SYN on a closed or closing 4-tuple, or with another ISN, is port
reuse: the old connection is ended with reason ``"idle"`` (it was not seen to
finish) and a new one opened. A retransmitted SYN (same ISN) changes nothing.

Memory and cost
---------------
At most ``max_connections`` connections are tracked: when full, closed
tombstones are dropped first, then the least recently active connection is
closed with ``"idle"`` (a linear scan, only when the table is full). Each
direction buffers at most ``max_buffer`` out-of-order bytes and keeps the last
1 KiB it delivered. A connection that never buffers costs under 1 KiB. The
common cases are a few attribute operations: an in-order segment with nothing
buffered becomes one ``FlowData`` carrying the segment's own payload object, and
a pure ACK that acknowledges no more than was captured returns ``[]``.

``stats.gaps`` counts every ``FlowGap`` except ``"midstream"`` ones (those
count in ``stats.midstream``, per direction), including ``capture_gap``'s.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from sniffer.core.events import (
    ACK,
    FIN,
    RST,
    SYN,
    CaptureGap,
    ConnectionClosed,
    ConnectionOpened,
    Endpoint,
    FlowAnomaly,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
    Segment,
)

__all__ = ["Reassembler", "ReassemblyStats"]

#: builds a NamedTuple event (FlowData, HttpBody) in one C call on the hot path
_new_tuple = tuple.__new__
_MASK = 0xFFFFFFFF
_WRAP = 1 << 32
_HALF_WRAP = 1 << 31
#: Largest distance ahead of the expected byte that a segment or an ACK may be
#: (the largest scaled TCP window); beyond it the number is treated as bogus.
_MAX_WINDOW = 1 << 30
#: Seconds an adopted connection may stay silent and still be handed over again
#: at the next graceful stop (see ``Reassembler.checkpoint``).
RESUME_SILENCE = 60.0
#: Capture seconds a closed connection stays known, so that late ACKs and
#: retransmissions after its close are recognised instead of opening a new one.
_CLOSED_LINGER = 10.0
_SYN_FIN_RST = SYN | FIN | RST
#: Bytes of the last delivered chunk kept per direction to check retransmissions against.
_PREV_MAX = 1024

# Shared empty lists: a direction gets its own buffer lists only while it buffers
# (most never do), which keeps an idle connection small. Never mutated.
_NO_INTS: list[int] = []
_NO_BYTES: list[bytes] = []
_NO_FLOATS: list[float] = []

_Key = tuple[str, int, str, int]


@dataclass(slots=True)
class ReassemblyStats:
    """Counters, all monotonically increasing."""

    segments: int = 0  # segments fed
    bytes_delivered: int = 0  # payload bytes delivered as FlowData
    retransmissions: int = 0  # segments carrying bytes already seen, delivered or declared lost
    overlaps_inconsistent: int = 0  # retransmissions whose bytes differ from the first copy
    out_of_order: int = 0  # segments buffered ahead of a hole
    gaps: int = 0  # FlowGap events other than "midstream"
    gap_bytes: int = 0  # bytes declared lost (gaps of known size)
    connections: int = 0  # connections opened
    midstream: int = 0  # directions first seen without their SYN
    buffer_cap_hits: int = 0  # times an out-of-order buffer overflowed max_buffer
    port_reuse: int = 0  # SYNs that replaced a known connection


class _Conn:
    __slots__ = ("c2s", "closed", "id", "keys", "s2c")

    def __init__(self, conn_id: int, ts: float, client: Endpoint, server: Endpoint) -> None:
        self.id = conn_id
        self.closed = False
        self.keys: tuple[_Key, _Key] = (
            (client[0], client[1], server[0], server[1]),
            (server[0], server[1], client[0], client[1]),
        )
        self.c2s = _Half(self, True, ts)
        self.s2c = _Half(self, False, ts)
        self.c2s.peer = self.s2c
        self.s2c.peer = self.c2s

    @property
    def last_ts(self) -> float:
        """Capture time of the last segment seen in either direction."""
        return max(self.c2s.last_ts, self.s2c.last_ts)


class _Half:
    """One direction of a connection.

    States: *unstarted* (``next_seq == -1``: no SYN, no payload yet), *open*
    (``fast`` when nothing is buffered and no FIN is known), *ended*.
    """

    __slots__ = (
        "acc",
        "ack_target",
        "conn",
        "conn_id",
        "ended",
        "fast",
        "fin_off",
        "from_client",
        "isn",
        "last_ts",
        "live",
        "next_off",
        "next_seq",
        "peer",
        "pend_bytes",
        "pend_data",
        "pend_offs",
        "pend_oldest",
        "pend_ts",
        "prev_data",
        "prev_off",
        "resume",
    )

    def __init__(self, conn: _Conn, from_client: bool, ts: float) -> None:
        self.conn = conn
        self.conn_id = conn.id
        self.last_ts = ts  # capture time of the last segment sent in this direction
        self.peer: _Half = self
        self.from_client = from_client
        self.live = True  # the connection is not closed
        self.isn = -1  # SYN sequence number, -1 when not seen
        self.next_seq = -1  # sequence number of next_off, -1 while unstarted
        self.next_off = 0  # offset of the next byte to deliver
        self.fin_off: int | None = None  # offset the FIN occupies, once seen
        self.ended = False
        self.fast = False  # open, nothing buffered, no FIN: in-order data goes straight out
        # Out-of-order buffer: sorted, non-overlapping pieces in parallel lists.
        self.pend_offs = _NO_INTS
        self.pend_data = _NO_BYTES
        self.pend_ts = _NO_FLOATS
        self.pend_bytes = 0
        self.pend_oldest = 0.0
        self.acc = _NO_BYTES  # bytes made deliverable during the current call
        self.ack_target = 0  # offset the peer acknowledged up to, when beyond next_off
        self.prev_off = 0  # the last delivered chunk, to check retransmissions against
        self.prev_data = b""
        self.resume = False  # adopted from a checkpoint: the first segment shows the gap

    def start(self, seq: int) -> None:
        self.next_seq = seq & _MASK
        self.next_off = 0
        self.fast = self.live and self.fin_off is None and not self.ended


class Reassembler:
    """Per-connection, per-direction TCP stream reassembly (see the module docstring)."""

    def __init__(
        self,
        *,
        conn_id_base: int = 1,
        conn_ids: Callable[[], int] | None = None,
        server_ports: frozenset[int] = frozenset(),
        max_buffer: int = 4 << 20,
        idle_timeout: float = 300.0,
        hole_timeout: float = 1.0,
        max_connections: int = 100_000,
    ) -> None:
        self.server_ports = server_ports
        self.max_buffer = max_buffer
        self.idle_timeout = idle_timeout
        self.hole_timeout = hole_timeout
        self.max_connections = max(1, max_connections)
        self.stats = ReassemblyStats()
        self._next_id = conn_id_base
        #: hands out connection ids when given (the store's id blocks); else base, base + 1, …
        self._conn_ids = conn_ids
        self._halves: dict[_Key, _Half] = {}
        self._conns: dict[int, _Conn] = {}
        self._open = 0

    @property
    def open_connections(self) -> int:
        """Connections opened and not yet closed."""
        return self._open

    # ------------------------------------------------------------------ feed

    def feed(self, seg: Segment) -> list[FlowEvent]:
        """Process one captured segment; return the flow events it caused."""
        self.stats.segments += 1
        ts, src, sport, dst, dport, seq, ack, flags, payload = seg
        h = self._halves.get((src, sport, dst, dport))
        if h is None or flags & _SYN_FIN_RST or not h.live:
            return self._feed_slow(seg, h)
        # Fast path: an established connection, no SYN/FIN/RST.
        h.last_ts = ts
        p = h.peer
        if not payload:
            # A pure ACK: usually it acknowledges exactly what was captured, or less.
            if flags & ACK and ack != p.next_seq and p.next_seq >= 0:
                d = (ack - p.next_seq) & _MASK
                if d <= _MAX_WINDOW:
                    self._ack_ahead(p, d, ts)
            if h.pend_offs or p.pend_offs:
                out: list[FlowEvent] = []
                self._check_holes(h, ts, out)
                self._check_holes(p, ts, out)
                return out
            return []
        out = []
        if flags & ACK and ack != p.next_seq and p.next_seq >= 0:
            d = (ack - p.next_seq) & _MASK
            if d <= _MAX_WINDOW:
                self._ack_ahead(p, d, ts)
        if h.fast and seq == h.next_seq:
            n = len(payload)
            off = h.next_off
            h.next_seq = (seq + n) & _MASK
            h.next_off = off + n
            if n <= _PREV_MAX:
                h.prev_off = off
                h.prev_data = payload
            else:
                h.prev_off = off + n - _PREV_MAX
                h.prev_data = payload[-_PREV_MAX:]
            self.stats.bytes_delivered += n
            out.append(_new_tuple(FlowData, (h.conn_id, ts, h.from_client, payload)))
        else:
            self._data(h, seq, payload, ts, out)
            if h.ack_target > h.next_off:
                self._resolve_acked(h, ts, out)
            self._flush_acc(h, ts, out)
        if h.pend_offs or p.pend_offs:
            self._check_holes(h, ts, out)
            self._check_holes(p, ts, out)
        return out

    def _feed_slow(self, seg: Segment, h: _Half | None) -> list[FlowEvent]:
        ts, seq, ack, flags, payload = seg.ts, seg.seq, seg.ack, seg.flags, seg.payload
        out: list[FlowEvent] = []
        if flags & SYN:
            if flags & RST:
                return out  # nonsense flag combination
            h = self._on_syn(seg, h, out)
            if h is None:
                return out
            seq = (seq + 1) & _MASK  # the SYN occupies one sequence number
        elif h is None:
            if not payload or flags & RST:
                return out  # no connection worth opening for a bare ACK/FIN/RST
            h = self._open_midstream(seg, out)
        conn = h.conn
        h.last_ts = ts
        if conn.closed:
            if payload:
                self.stats.retransmissions += 1  # late data after the close
            return out
        p = h.peer
        if flags & ACK:
            pn = p.next_seq
            if ack != pn and pn >= 0 and not p.ended:
                d = (ack - pn) & _MASK
                if d <= _MAX_WINDOW:
                    self._ack_ahead(p, d, ts)
        if flags & RST:
            if not conn.closed:
                self._close(conn, "rst", ts, out)
            return out
        if payload:
            self._data(h, seq, payload, ts, out)
        if h.ack_target > h.next_off:
            self._resolve_acked(h, ts, out)
        if flags & FIN:
            self._fin(h, (seq + len(payload)) & _MASK, ts, out)
        if not conn.closed:
            self._check_holes(h, ts, out)
            self._check_holes(p, ts, out)
            self._flush_acc(h, ts, out)
        return out

    # ------------------------------------------------------- connection setup

    def _on_syn(self, seg: Segment, h: _Half | None, out: list[FlowEvent]) -> _Half | None:
        ts, src, sport, dst, dport, seq, ack, flags, _ = seg
        synack = bool(flags & ACK)
        if h is not None:
            conn = h.conn
            p = h.peer
            closing = (
                conn.closed or h.ended or p.ended or h.fin_off is not None or p.fin_off is not None
            )
            if not closing:
                if not synack:
                    if h.from_client and h.isn == seq:
                        return h  # retransmitted SYN
                elif not h.from_client:
                    if h.isn == seq:
                        return h  # retransmitted SYN+ACK
                    if h.next_seq < 0:  # the answer to the SYN we saw
                        h.isn = seq
                        h.start(seq + 1)
                        return h
            # Port reuse: the old connection is gone, unseen.
            self.stats.port_reuse += 1
            if not conn.closed:
                self._close(conn, "idle", ts, out)
            self._forget(conn)
        if not synack:
            conn = self._new_conn(ts, (src, sport), (dst, dport), True, out)
            h = conn.c2s
        else:
            conn = self._new_conn(ts, (dst, dport), (src, sport), True, out)
            h = conn.s2c
            # The SYN+ACK acknowledges the client's ISN + 1.
            conn.c2s.isn = (ack - 1) & _MASK
            conn.c2s.start(ack)
        h.isn = seq
        h.start(seq + 1)
        return h

    def _open_midstream(self, seg: Segment, out: list[FlowEvent]) -> _Half:
        ts, src, sport, dst, dport = seg[0], seg[1], seg[2], seg[3], seg[4]
        ports = self.server_ports
        if dport in ports:
            src_is_server = False
        elif sport in ports:
            src_is_server = True
        else:
            src_is_server = sport < dport
        if src_is_server:
            conn = self._new_conn(ts, (dst, dport), (src, sport), False, out)
            return conn.s2c
        conn = self._new_conn(ts, (src, sport), (dst, dport), False, out)
        return conn.c2s

    def _new_conn(
        self, ts: float, client: Endpoint, server: Endpoint, syn_seen: bool, out: list[FlowEvent]
    ) -> _Conn:
        if len(self._conns) >= self.max_connections:
            self._evict(ts, out)
        if self._conn_ids is not None:
            conn = _Conn(self._conn_ids(), ts, client, server)
        else:
            conn = _Conn(self._next_id, ts, client, server)
            self._next_id += 1
        self._conns[conn.id] = conn
        self._halves[conn.keys[0]] = conn.c2s
        self._halves[conn.keys[1]] = conn.s2c
        self._open += 1
        self.stats.connections += 1
        out.append(ConnectionOpened(conn.id, ts, client, server, syn_seen))
        return conn

    def _evict(self, ts: float, out: list[FlowEvent]) -> None:
        """Make room for one connection: drop closed ones, else the least recently active."""
        closed = [c for c in self._conns.values() if c.closed]
        for c in closed:
            self._forget(c)
        if len(self._conns) < self.max_connections:
            return
        oldest = min(self._conns.values(), key=lambda c: c.last_ts)
        self._close(oldest, "idle", ts, out)
        self._forget(oldest)

    def _forget(self, conn: _Conn) -> None:
        self._conns.pop(conn.id, None)
        for key, half in zip(conn.keys, (conn.c2s, conn.s2c), strict=True):
            if self._halves.get(key) is half:
                del self._halves[key]
            # Break the cycles (half -> conn -> half, half -> peer -> half) so
            # that reference counting frees the connection now: the daemon's GC
            # thresholds make full collections rare, and forgotten connections
            # (with their buffers) piled up until one (~1.6 KB per stream).
            del half.conn, half.peer

    # ------------------------------------------------------------ data path

    def _start_midstream(self, h: _Half, seq: int, ts: float, out: list[FlowEvent]) -> None:
        h.start(seq)
        self.stats.midstream += 1
        out.append(FlowGap(h.conn.id, ts, h.from_client, None, "midstream"))

    def _data(self, h: _Half, seq: int, data: bytes, ts: float, out: list[FlowEvent]) -> None:
        """Place payload at ``seq`` (slow path): trim, buffer or deliver into ``h.acc``."""
        if h.ended:
            self.stats.retransmissions += 1
            return
        if h.next_seq < 0:
            self._start_midstream(h, seq, ts, out)
        elif h.resume:
            self._resume(h, seq, ts, out)
        d = (seq - h.next_seq) & _MASK
        if d >= _HALF_WRAP:
            d -= _WRAP
        nxt = h.next_off
        off = nxt + d
        end = off + len(data)
        if d > _MAX_WINDOW:
            out.append(
                FlowAnomaly(h.conn.id, ts, h.from_client, "out-of-window", f"{d} bytes ahead")
            )
            return
        if h.fin_off is not None and end > h.fin_off:
            if off >= h.fin_off:
                out.append(FlowAnomaly(h.conn.id, ts, h.from_client, "after-fin", ""))
                return
            data = data[: h.fin_off - off]
            end = h.fin_off
        if off < nxt:
            self.stats.retransmissions += 1
            self._check_delivered(h, off, data, ts, out)
            if end <= nxt:
                return
            data = data[nxt - off :]
            off = nxt
        if off == nxt and not h.pend_offs:
            h.acc = [data]  # empty on entry: flushed at the end of every call
            h.next_off = end
            h.next_seq = (h.next_seq + len(data)) & _MASK
            return
        if off > nxt:
            self.stats.out_of_order += 1
        self._insert(h, off, data, ts, out)
        self._drain(h)
        if h.pend_bytes > self.max_buffer:
            self.stats.buffer_cap_hits += 1
            out.append(
                FlowAnomaly(
                    h.conn.id, ts, h.from_client, "buffer-cap", f"{h.pend_bytes} bytes buffered"
                )
            )
            while h.pend_bytes > self.max_buffer and h.pend_offs:
                self._skip_hole(h, ts, out)

    def _resume(self, h: _Half, seq: int, ts: float, out: list[FlowEvent]) -> None:
        """First segment of a direction adopted from a checkpoint: the bytes sent
        between the checkpoint and now were never captured, an exact gap."""
        h.resume = False
        h.fast = h.live and h.fin_off is None and not h.ended
        d = (seq - h.next_seq) & _MASK
        if 0 < d <= _MAX_WINDOW:
            self.stats.gaps += 1
            out.append(FlowGap(h.conn.id, ts, h.from_client, d, "restart"))
            h.next_seq = seq & _MASK
            h.next_off += d

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, conn_id: int, now: float | None = None) -> tuple[int, int] | None:
        """(next client→server sequence number, next server→client one) of an open
        connection, or None. Bytes buffered beyond a hole (or acknowledged but not
        captured: the last packets before a stop) are left to the next instance's
        exact gap, which starts at the first byte not delivered. A connection
        adopted and silent since is handed over again (same numbers) when it
        was adopted less than ``RESUME_SILENCE`` seconds before ``now`` (an
        instance stopped right after it started), else it is over."""
        c = self._conns.get(conn_id)
        if c is None or c.closed:
            return None
        halves = (c.c2s, c.s2c)
        if c.s2c.next_seq < 0 or any(h.ended or h.fin_off is not None for h in halves):
            return None  # (a client direction not seen yet, -1, is fine: mid-way starts)
        if c.s2c.resume and (now is None or now - c.last_ts > RESUME_SILENCE):
            return None  # adopted and silent since: over (closed as gapped by flush)
        return c.c2s.next_seq, c.s2c.next_seq

    def forget(self, conn_id: int) -> None:
        """Drop a connection without closing it (it was checkpointed)."""
        c = self._conns.get(conn_id)
        if c is not None:
            if not c.closed:
                self._open -= 1
            self._forget(c)

    def adopt(
        self, conn_id: int, ts: float, client: Endpoint, server: Endpoint, c2s: int, s2c: int
    ) -> None:
        """Take over a connection another instance checkpointed: no
        ``ConnectionOpened`` (its row exists); each direction goes on at the
        given sequence number, and the first segment captured shows, exactly,
        what was missed in between (``FlowGap(reason="restart")``)."""
        if len(self._conns) >= self.max_connections:
            self._evict(ts, [])
        conn = _Conn(conn_id, ts, client, server)
        self._conns[conn_id] = conn
        self._halves[conn.keys[0]] = conn.c2s
        self._halves[conn.keys[1]] = conn.s2c
        self._open += 1
        for h, seq in ((conn.c2s, c2s), (conn.s2c, s2c)):
            if seq < 0:
                continue  # never seen: it starts mid-way when it shows up
            h.start(seq)
            h.fast = False  # the first segment goes through _data (see _resume)
            h.resume = True

    def _check_delivered(
        self, h: _Half, off: int, data: bytes, ts: float, out: list[FlowEvent]
    ) -> None:
        """Compare retransmitted bytes with the last delivered chunk, where they overlap."""
        p_off = h.prev_off
        prev = h.prev_data
        a = max(off, p_off)
        b = min(off + len(data), p_off + len(prev))
        if a < b and data[a - off : b - off] != prev[a - p_off : b - p_off]:
            self._mismatch(h, a, b, ts, out)

    def _mismatch(self, h: _Half, a: int, b: int, ts: float, out: list[FlowEvent]) -> None:
        self.stats.overlaps_inconsistent += 1
        out.append(
            FlowAnomaly(
                h.conn.id,
                ts,
                h.from_client,
                "overlap-mismatch",
                f"bytes {a}..{b} differ from the first copy",
                a,
                b - a,
            )
        )

    def _insert(self, h: _Half, off: int, data: bytes, ts: float, out: list[FlowEvent]) -> None:
        """Buffer ``data`` at ``off`` (>= next_off), keeping the first copy of every byte."""
        offs, datas, tss = h.pend_offs, h.pend_data, h.pend_ts
        end = off + len(data)
        i = bisect_right(offs, off) - 1
        while i > 0 and not datas[i]:
            i -= 1  # step back over ACK markers to the last piece starting before off
        if i < 0 or offs[i] + len(datas[i]) <= off:
            i += 1
        pieces: list[tuple[int, bytes]] = []
        cur = off
        covered = False
        mism: tuple[int, int] | None = None
        j = i
        while j < len(offs) and offs[j] < end:
            eo = offs[j]
            ed = datas[j]
            ee = eo + len(ed)
            if eo > cur:
                pieces.append((cur, data[cur - off : eo - off]))
            a = max(cur, eo)
            b = min(end, ee)
            if a < b:
                covered = True
                if mism is None and data[a - off : b - off] != ed[a - eo : b - eo]:
                    mism = (a, b)
            cur = max(cur, ee)
            j += 1
        if cur < end:
            pieces.append((cur, data if cur == off else data[cur - off :]))
        if covered:
            self.stats.retransmissions += 1
        if mism is not None:
            self._mismatch(h, mism[0], mism[1], ts, out)
        if not pieces:
            return
        if not offs:
            h.pend_oldest = ts
            offs = h.pend_offs = []
            datas = h.pend_data = []
            tss = h.pend_ts = []
        for p_off, p_data in pieces:
            k = bisect_left(offs, p_off)
            offs.insert(k, p_off)
            datas.insert(k, p_data)
            tss.insert(k, ts)
            h.pend_bytes += len(p_data)
        h.fast = False

    def _drain(self, h: _Half) -> None:
        """Move buffered pieces that start at or before next_off into ``h.acc``."""
        offs = h.pend_offs
        if not offs or offs[0] > h.next_off:
            return
        datas = h.pend_data
        k = 0
        n = len(offs)
        nxt = h.next_off
        freed = 0
        while k < n and offs[k] <= nxt:
            data = datas[k]
            freed += len(data)
            skip = nxt - offs[k]
            if skip < len(data):
                piece = data[skip:] if skip else data
                if h.acc:
                    h.acc.append(piece)
                else:
                    h.acc = [piece]
                nxt = offs[k] + len(data)
            k += 1
        h.pend_bytes -= freed
        h.next_seq = (h.next_seq + (nxt - h.next_off)) & _MASK
        h.next_off = nxt
        if k < n:
            del offs[:k]
            del datas[:k]
            del h.pend_ts[:k]
            h.pend_oldest = min(h.pend_ts)
        else:
            h.pend_offs, h.pend_data, h.pend_ts = _NO_INTS, _NO_BYTES, _NO_FLOATS
            h.fast = h.live and h.fin_off is None and not h.ended

    def _gap(self, h: _Half, n: int, ts: float, out: list[FlowEvent]) -> None:
        """Declare the next ``n`` bytes lost."""
        self._flush_acc(h, ts, out)
        out.append(FlowGap(h.conn.id, ts, h.from_client, n, "lost"))
        self.stats.gaps += 1
        self.stats.gap_bytes += n
        h.next_off += n
        h.next_seq = (h.next_seq + n) & _MASK

    def _skip_hole(self, h: _Half, ts: float, out: list[FlowEvent]) -> None:
        """Declare the hole before the first buffered piece lost, and deliver what follows."""
        n = h.pend_offs[0] - h.next_off
        if n > 0:
            self._gap(h, n, ts, out)
        self._drain(h)

    def _skip_to(self, h: _Half, target: int, ts: float, out: list[FlowEvent]) -> None:
        """Every byte below ``target`` not buffered is lost: declare gaps, deliver the rest."""
        while h.next_off < target:
            offs = h.pend_offs
            if offs and offs[0] <= h.next_off:
                self._drain(h)
                continue
            stop = offs[0] if offs and offs[0] < target else target
            self._gap(h, stop - h.next_off, ts, out)
        self._drain(h)

    def _ack_ahead(self, p: _Half, d: int, ts: float) -> None:
        """The other side acknowledged ``d`` sequence numbers beyond ``p.next_off``.

        Those bytes reached the receiver, so any of them not captured are lost. The
        loss is declared when ``p`` next sends payload or FIN (so a capture that shows
        an ACK just before the data it acknowledges loses nothing), after
        hole_timeout, or on FIN/RST/flush/expiry: the ACK leaves a zero-length marker
        in the out-of-order buffer, which the hole rules treat like buffered data.
        """
        if p.ended:
            return
        target = p.next_off + d
        if p.fin_off is not None and target > p.fin_off:
            target = p.fin_off  # an ACK of the FIN is not data
        if target <= p.next_off or target <= p.ack_target:
            return
        p.ack_target = target
        offs = p.pend_offs
        if not offs:
            p.pend_oldest = ts
            offs = p.pend_offs = []
            p.pend_data = []
            p.pend_ts = []
        k = bisect_left(offs, target)
        offs.insert(k, target)
        p.pend_data.insert(k, b"")
        p.pend_ts.insert(k, ts)
        p.fast = False

    def _resolve_acked(self, h: _Half, ts: float, out: list[FlowEvent]) -> None:
        """``h`` sent again: bytes its peer acknowledged that are still missing are lost."""
        if h.ended:
            return
        self._skip_to(h, h.ack_target, ts, out)
        self._flush_acc(h, ts, out)
        self._maybe_fin_end(h, ts, out)

    def _check_holes(self, h: _Half, ts: float, out: list[FlowEvent]) -> None:
        """Declare holes lost whose buffered data waited longer than hole_timeout."""
        limit = self.hole_timeout
        changed = False
        while h.pend_offs and ts - h.pend_oldest > limit:
            self._skip_hole(h, ts, out)
            changed = True
        if changed:
            self._flush_acc(h, ts, out)
            self._maybe_fin_end(h, ts, out)

    def _flush_acc(self, h: _Half, ts: float, out: list[FlowEvent]) -> None:
        acc = h.acc
        if not acc:
            return
        data = acc[0] if len(acc) == 1 else b"".join(acc)
        h.acc = _NO_BYTES
        if not data:
            return
        keep = data if len(data) <= _PREV_MAX else data[-_PREV_MAX:]
        h.prev_off = h.next_off - len(keep)
        h.prev_data = keep
        self.stats.bytes_delivered += len(data)
        out.append(_new_tuple(FlowData, (h.conn.id, ts, h.from_client, data)))

    # ------------------------------------------------------------- closing

    def _fin(self, h: _Half, fin_seq: int, ts: float, out: list[FlowEvent]) -> None:
        if h.ended:
            return
        if h.next_seq < 0:
            self._start_midstream(h, fin_seq, ts, out)
        if h.fin_off is None:
            d = (fin_seq - h.next_seq) & _MASK
            if d >= _HALF_WRAP:
                d -= _WRAP
            if d > _MAX_WINDOW:
                out.append(FlowAnomaly(h.conn.id, ts, h.from_client, "out-of-window", "FIN"))
                return
            h.fin_off = max(h.next_off + d, h.next_off)
            h.fast = False
            self._trim_beyond_fin(h)
        if h.next_off < h.fin_off:
            self._skip_to(h, h.fin_off, ts, out)  # a hole before the FIN is lost
        self._maybe_fin_end(h, ts, out)

    @staticmethod
    def _trim_beyond_fin(h: _Half) -> None:
        fin = h.fin_off
        assert fin is not None
        offs, datas, tss = h.pend_offs, h.pend_data, h.pend_ts
        if not offs:
            return
        k = bisect_left(offs, fin)
        for data in datas[k:]:
            h.pend_bytes -= len(data)
        del offs[k:], datas[k:], tss[k:]
        for i in range(k):
            over = offs[i] + len(datas[i]) - fin
            if over > 0:
                h.pend_bytes -= over
                datas[i] = datas[i][: len(datas[i]) - over]
        if h.ack_target > fin:
            h.ack_target = fin

    def _maybe_fin_end(self, h: _Half, ts: float, out: list[FlowEvent]) -> None:
        if h.ended or h.fin_off is None or h.next_off < h.fin_off:
            return
        self._flush_acc(h, ts, out)
        out.append(FlowEnd(h.conn.id, ts, h.from_client, "fin"))
        h.ended = True
        h.fast = False
        h.next_seq = (h.next_seq + 1) & _MASK  # the FIN's sequence number
        h.next_off += 1
        if h.peer.ended and not h.conn.closed:
            self._close(h.conn, "fin", ts, out)

    def _end_half(self, h: _Half, reason: str, ts: float, out: list[FlowEvent]) -> None:
        if not h.ended:
            while h.pend_offs:
                self._skip_hole(h, ts, out)
            self._flush_acc(h, ts, out)
            out.append(FlowEnd(h.conn.id, ts, h.from_client, reason))
            h.ended = True
        h.fast = False
        h.live = False

    def _close(self, conn: _Conn, reason: str, ts: float, out: list[FlowEvent]) -> None:
        if conn.s2c.resume:
            # adopted from a checkpoint and never heard of again: whatever the
            # server sent after the checkpoint was missed (count unknown)
            conn.s2c.resume = False
            self.stats.gaps += 1
            out.append(FlowGap(conn.id, ts, False, None, "restart"))
        self._end_half(conn.c2s, reason, ts, out)
        self._end_half(conn.s2c, reason, ts, out)
        conn.closed = True
        self._open -= 1
        out.append(ConnectionClosed(conn.id, ts, reason))

    # ------------------------------------------------------ time and capture

    def expire(self, now: float) -> list[FlowEvent]:
        """Close connections idle for idle_timeout and declare holes older than hole_timeout."""
        out: list[FlowEvent] = []
        linger = min(_CLOSED_LINGER, self.idle_timeout)
        for conn in list(self._conns.values()):
            idle = now - conn.last_ts
            if conn.closed:
                if idle >= linger:
                    self._forget(conn)
            elif idle >= self.idle_timeout:
                self._close(conn, "idle", now, out)
                self._forget(conn)
            else:
                for h in (conn.c2s, conn.s2c):
                    if h.pend_offs:
                        self._check_holes(h, now, out)
        return out

    def flush(self, ts: float) -> list[FlowEvent]:
        """End of capture: deliver what can be delivered and close every connection."""
        out: list[FlowEvent] = []
        for conn in list(self._conns.values()):
            if not conn.closed:
                self._close(conn, "eof", ts, out)
        self._conns.clear()
        self._halves.clear()
        return out

    def capture_gap(self, gap: CaptureGap) -> list[FlowEvent]:
        """The capture lost packets it cannot attribute: every open direction may have a gap."""
        reason = "kernel-drop" if gap.source == "kernel" else gap.source
        out: list[FlowEvent] = []
        for conn in self._conns.values():
            if conn.closed:
                continue
            for h in (conn.c2s, conn.s2c):
                if not h.ended:
                    out.append(FlowGap(conn.id, gap.ts, h.from_client, None, reason))
                    self.stats.gaps += 1
        return out
