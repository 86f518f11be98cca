"""Unit tests for sniffer.core.reassembly: one test (or a few) per rule."""

from __future__ import annotations

from typing import TypeVar

from sniffer.core.events import (
    ACK,
    FIN,
    PSH,
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
from sniffer.core.reassembly import Reassembler

T = TypeVar("T")

CLI = ("127.0.0.1", 40000)
SRV = ("127.0.0.1", 8000)
MASK = 0xFFFFFFFF


class Peer:
    """Builds segments for one TCP connection, tracking sequence numbers."""

    def __init__(
        self, cisn: int = 1000, sisn: int = 5000, cli: Endpoint = CLI, srv: Endpoint = SRV
    ) -> None:
        self.cisn = cisn
        self.sisn = sisn
        self.cli = cli
        self.srv = srv

    def c(
        self, ts: float, seq: int, flags: int = ACK | PSH, data: bytes = b"", ack: int = 0
    ) -> Segment:
        """Client → server segment; ``seq`` is relative to the first data byte."""
        return Segment(
            ts,
            self.cli[0],
            self.cli[1],
            self.srv[0],
            self.srv[1],
            (self.cisn + 1 + seq) & MASK,
            (self.sisn + 1 + ack) & MASK,
            flags,
            data,
        )

    def s(
        self, ts: float, seq: int, flags: int = ACK | PSH, data: bytes = b"", ack: int = 0
    ) -> Segment:
        """Server → client segment."""
        return Segment(
            ts,
            self.srv[0],
            self.srv[1],
            self.cli[0],
            self.cli[1],
            (self.sisn + 1 + seq) & MASK,
            (self.cisn + 1 + ack) & MASK,
            flags,
            data,
        )

    def syn(self, ts: float = 0.0) -> Segment:
        return Segment(ts, *self.cli, *self.srv, self.cisn, 0, SYN, b"")

    def synack(self, ts: float = 0.0) -> Segment:
        return Segment(ts, *self.srv, *self.cli, self.sisn, (self.cisn + 1) & MASK, SYN | ACK, b"")

    def handshake(self, r: Reassembler, ts: float = 0.0) -> list[FlowEvent]:
        out = r.feed(self.syn(ts))
        out += r.feed(self.synack(ts))
        out += r.feed(self.c(ts, 0, ACK))
        return out


def data(events: list[FlowEvent], from_client: bool | None = None) -> bytes:
    return b"".join(
        e.data
        for e in events
        if isinstance(e, FlowData) and (from_client is None or e.from_client == from_client)
    )


def of(events: list[FlowEvent], cls: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, cls)]


# --------------------------------------------------------------------- basics


def test_handshake_opens_connection_with_roles() -> None:
    r = Reassembler(conn_id_base=7)
    ev = Peer().handshake(r)
    assert ev == [ConnectionOpened(7, 0.0, CLI, SRV, True)]
    assert r.open_connections == 1
    assert r.stats.connections == 1


def test_in_order_data_both_directions() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    assert r.feed(p.c(1.0, 0, data=b"GET / HTTP/1.1\r\n\r\n")) == [
        FlowData(1, 1.0, True, b"GET / HTTP/1.1\r\n\r\n")
    ]
    assert r.feed(p.s(2.0, 0, data=b"HTTP/1.1 200 OK\r\n", ack=18)) == [
        FlowData(1, 2.0, False, b"HTTP/1.1 200 OK\r\n")
    ]
    assert r.feed(p.s(2.5, 17, data=b"\r\n", ack=18)) == [FlowData(1, 2.5, False, b"\r\n")]
    assert r.stats.bytes_delivered == 18 + 17 + 2


def test_reorder_is_buffered_and_coalesced() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    assert r.feed(p.s(1.0, 4, data=b"4567")) == []
    assert r.feed(p.s(1.1, 8, data=b"89")) == []
    assert r.stats.out_of_order == 2
    ev = r.feed(p.s(1.2, 0, data=b"0123"))
    assert ev == [FlowData(1, 1.2, False, b"0123456789")]


def test_duplicate_is_dropped_and_counted() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"hello"))
    assert r.feed(p.s(1.1, 0, data=b"hello")) == []
    assert r.stats.retransmissions == 1
    assert r.stats.overlaps_inconsistent == 0
    # duplicate of a buffered segment
    r.feed(p.s(1.2, 10, data=b"xyz"))
    assert r.feed(p.s(1.3, 10, data=b"xyz")) == []
    assert r.stats.retransmissions == 2
    assert data(r.feed(p.s(1.4, 5, data=b"world"))) == b"worldxyz"


def test_partial_overlap_consistent_keeps_new_bytes() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"abcd"))
    ev = r.feed(p.s(1.1, 2, data=b"cdef"))
    assert ev == [FlowData(1, 1.1, False, b"ef")]
    assert r.stats.retransmissions == 1
    assert r.stats.overlaps_inconsistent == 0
    assert of(ev, FlowAnomaly) == []


def test_overlap_inconsistent_first_copy_wins_delivered() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"abcd"))
    ev = r.feed(p.s(1.1, 2, data=b"XYef"))
    assert data(ev) == b"ef"
    (anom,) = of(ev, FlowAnomaly)
    assert anom.kind == "overlap-mismatch" and anom.from_client is False
    assert r.stats.overlaps_inconsistent == 1


def test_overlap_inconsistent_first_copy_wins_buffered() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 4, data=b"4567"))
    ev = r.feed(p.s(1.1, 2, data=b"23XX67"))  # overlaps 45 with different bytes
    assert [a.kind for a in of(ev, FlowAnomaly)] == ["overlap-mismatch"]
    assert r.stats.overlaps_inconsistent == 1
    ev = r.feed(p.s(1.2, 0, data=b"01"))
    assert data(ev) == b"01234567"


def test_overlap_mismatch_says_where_the_copies_differ() -> None:
    """The anomaly carries the overlap found to differ as byte offsets of its
    direction (offset 0: the first data byte): the range two copies share, in
    delivered bytes or buffered ones; the first copy is what is delivered."""
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.c(1.0, 0, data=b"POST / HTTP/1.1\r\n"))
    # a retransmission overlapping the END of the delivered segment, then new bytes
    ev = r.feed(p.c(1.1, 7, data=b"XTTP/1.1\r\nHost"))
    (a,) = of(ev, FlowAnomaly)
    assert (a.from_client, a.offset, a.length) == (True, 7, 10)
    assert a.detail == "bytes 7..17 differ from the first copy"
    assert data(ev) == b"Host"
    # buffered: a piece ahead of a hole, then a copy overlapping its START
    r.feed(p.s(2.0, 10, data=b"klmnop"))
    ev = r.feed(p.s(2.1, 6, data=b"ghijKL"))
    (a,) = of(ev, FlowAnomaly)
    assert (a.from_client, a.offset, a.length) == (False, 10, 2)
    assert data(r.feed(p.s(2.2, 0, data=b"abcdef"))) == b"abcdefghijklmnop"
    assert r.stats.overlaps_inconsistent == 2 and r.stats.retransmissions == 2


def test_overlaps_with_the_same_bytes_are_retransmissions_without_anomaly() -> None:
    """Partial overlaps at the start and at the end of segments, delivered and
    buffered, with identical bytes: counted as retransmissions, nothing else."""
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"abcdef"))
    r.feed(p.s(1.1, 12, data=b"mnop"))  # ahead of a hole
    out = r.feed(p.s(1.2, 4, data=b"efgh"))  # overlaps the end of a delivered segment
    out += r.feed(p.s(1.3, 10, data=b"klmn"))  # overlaps the start of a buffered one
    out += r.feed(p.s(1.4, 8, data=b"ij"))
    assert of(out, FlowAnomaly) == []
    assert data(out) == b"ghijklmnop"
    assert r.stats.retransmissions == 2 and r.stats.overlaps_inconsistent == 0


def test_overlap_spanning_several_buffered_pieces() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 3, data=b"3"))
    r.feed(p.s(1.0, 6, data=b"67"))
    r.feed(p.s(1.0, 2, data=b"23456789"))  # fills around and between, consistent
    assert r.stats.overlaps_inconsistent == 0
    assert data(r.feed(p.s(1.1, 0, data=b"01"))) == b"0123456789"


def test_wraparound_across_2_32() -> None:
    r = Reassembler()
    p = Peer(cisn=MASK - 3, sisn=MASK - 1)
    p.handshake(r)
    chunks = [b"abc", b"defgh", b"ij", b"klmnopq"]
    off = 0
    got = b""
    for i, ch in enumerate(chunks):
        got += data(r.feed(p.s(1.0 + i, off, data=ch)))
        assert r.feed(p.c(1.0 + i, 0, ACK, ack=off + len(ch))) == []  # ACKs wrap too
        off += len(ch)
    assert got == b"".join(chunks)
    # reorder across the wrap
    assert r.feed(p.s(9.0, off + 3, data=b"WXYZ")) == []
    assert data(r.feed(p.s(9.1, off, data=b"rst"))) == b"rstWXYZ"
    assert r.stats.gaps == 0


def test_long_stream_offsets_grow_beyond_4gib() -> None:
    r = Reassembler()
    p = Peer(sisn=0)
    p.handshake(r)
    block = b"z" * 65536
    total = 0
    # 70000 blocks of 64 KiB = ~4.6 GB of sequence space, wrapping once.
    for _ in range(70000):
        ev = r.feed(p.s(1.0, total, data=block))
        assert len(ev) == 1
        total += len(block)
    assert r.stats.bytes_delivered == total
    assert data(r.feed(p.s(2.0, total, data=b"end"))) == b"end"


# ----------------------------------------------------------------- FIN / RST


def test_fin_both_directions_closes() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.c(1.0, 0, data=b"req"))
    ev = r.feed(p.c(1.1, 3, ACK | FIN))
    assert ev == [FlowEnd(1, 1.1, True, "fin")]
    # the ACK of the client's FIN is not data loss
    ev = r.feed(p.s(1.2, 0, ACK | PSH, data=b"resp", ack=4))
    assert ev == [FlowData(1, 1.2, False, b"resp")]
    ev = r.feed(p.s(1.3, 4, ACK | FIN, ack=4))
    assert ev == [FlowEnd(1, 1.3, False, "fin"), ConnectionClosed(1, 1.3, "fin")]
    assert r.open_connections == 0
    # the last ACK does not open a new connection
    assert r.feed(p.c(1.4, 4, ACK, ack=5)) == []
    assert r.stats.gaps == 0 and r.stats.connections == 1


def test_fin_with_payload() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    ev = r.feed(p.s(1.0, 0, ACK | PSH | FIN, data=b"bye"))
    assert ev == [FlowData(1, 1.0, False, b"bye"), FlowEnd(1, 1.0, False, "fin")]


def test_fin_with_hole_declares_gap() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"0123"))
    r.feed(p.s(1.1, 10, data=b"abc"))  # 4..10 missing
    ev = r.feed(p.s(1.2, 13, ACK | FIN))
    assert ev == [
        FlowGap(1, 1.2, False, 6, "lost"),
        FlowData(1, 1.2, False, b"abc"),
        FlowEnd(1, 1.2, False, "fin"),
    ]
    assert r.stats.gaps == 1 and r.stats.gap_bytes == 6
    # the missing data arriving late is dropped, never delivered out of order
    assert r.feed(p.s(1.3, 4, data=b"456789")) == []
    assert r.stats.retransmissions == 1


def test_fin_retransmitted_and_data_after_fin_dropped() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, ACK | FIN, data=b"ab"))
    assert r.feed(p.s(1.1, 0, ACK | FIN, data=b"ab")) == []


def test_rst_ends_both_directions() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.c(1.0, 0, data=b"req"))
    ev = r.feed(p.s(2.0, 0, RST | ACK, ack=3))
    assert ev == [
        FlowEnd(1, 2.0, True, "rst"),
        FlowEnd(1, 2.0, False, "rst"),
        ConnectionClosed(1, 2.0, "rst"),
    ]
    assert r.open_connections == 0
    assert r.feed(p.c(2.1, 3, RST)) == []
    assert r.feed(p.c(2.2, 3, data=b"late")) == []


def test_rst_after_one_fin_ends_only_the_open_direction() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.c(1.0, 0, ACK | FIN))
    ev = r.feed(p.s(2.0, 0, RST))
    assert ev == [FlowEnd(1, 2.0, False, "rst"), ConnectionClosed(1, 2.0, "rst")]


def test_rst_with_buffered_data_declares_hole_and_delivers() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 5, data=b"later"))
    ev = r.feed(p.c(2.0, 0, RST))
    assert ev == [
        FlowEnd(1, 2.0, True, "rst"),
        FlowGap(1, 2.0, False, 5, "lost"),
        FlowData(1, 2.0, False, b"later"),
        FlowEnd(1, 2.0, False, "rst"),
        ConnectionClosed(1, 2.0, "rst"),
    ]


# ------------------------------------------------------------- connections


def test_syn_retransmit_is_not_a_new_connection() -> None:
    r = Reassembler()
    p = Peer()
    r.feed(p.syn(0.0))
    assert r.feed(p.syn(1.0)) == []
    r.feed(p.synack(1.1))
    assert r.feed(p.synack(1.2)) == []
    assert r.stats.connections == 1 and r.stats.port_reuse == 0


def test_port_reuse_after_close() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.c(1.0, 0, ACK | FIN))
    r.feed(p.s(1.0, 0, ACK | FIN, ack=1))
    q = Peer(cisn=77777, sisn=99999)
    ev = r.feed(q.syn(2.0))
    assert ev == [ConnectionOpened(2, 2.0, CLI, SRV, True)]
    assert r.stats.port_reuse == 1
    r.feed(q.synack(2.0))
    assert r.feed(q.s(2.1, 0, data=b"new")) == [FlowData(2, 2.1, False, b"new")]


def test_port_reuse_new_isn_closes_open_connection() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 3, data=b"buffered"))  # a hole at 0..3
    q = Peer(cisn=123, sisn=456)
    ev = r.feed(q.syn(2.0))
    assert ev == [
        FlowEnd(1, 2.0, True, "idle"),
        FlowGap(1, 2.0, False, 3, "lost"),
        FlowData(1, 2.0, False, b"buffered"),
        FlowEnd(1, 2.0, False, "idle"),
        ConnectionClosed(1, 2.0, "idle"),
        ConnectionOpened(2, 2.0, CLI, SRV, True),
    ]
    assert r.stats.port_reuse == 1
    assert r.open_connections == 1


def test_port_reuse_while_closing() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.c(1.0, 0, ACK | FIN))  # half closed
    ev = r.feed(p.syn(2.0))  # same ISN, but the connection is closing
    assert [type(e) for e in ev] == [FlowEnd, ConnectionClosed, ConnectionOpened]
    assert r.stats.port_reuse == 1


def test_synack_first_sets_roles_and_client_start() -> None:
    r = Reassembler()
    p = Peer()
    ev = r.feed(p.synack(0.0))
    assert ev == [ConnectionOpened(1, 0.0, CLI, SRV, True)]
    assert r.feed(p.c(1.0, 0, data=b"abc")) == [FlowData(1, 1.0, True, b"abc")]
    assert r.stats.midstream == 0


def test_midstream_start_emits_gap_first() -> None:
    r = Reassembler()
    p = Peer()
    ev = r.feed(p.s(1.0, 100, data=b"data: x\n\n"))
    assert ev == [
        ConnectionOpened(1, 1.0, CLI, SRV, False),
        FlowGap(1, 1.0, False, None, "midstream"),
        FlowData(1, 1.0, False, b"data: x\n\n"),
    ]
    assert r.feed(p.s(1.1, 109, data=b"more")) == [FlowData(1, 1.1, False, b"more")]
    # a pure ACK from the other direction does not start it
    assert r.feed(p.c(1.2, 50, ACK, ack=113)) == []
    ev = r.feed(p.c(1.3, 50, data=b"req"))
    assert ev == [FlowGap(1, 1.3, True, None, "midstream"), FlowData(1, 1.3, True, b"req")]
    assert r.stats.midstream == 2
    assert r.stats.gaps == 0


def test_bare_ack_or_rst_for_unknown_connection_is_ignored() -> None:
    r = Reassembler()
    p = Peer()
    assert r.feed(p.c(1.0, 0, ACK)) == []
    assert r.feed(p.c(1.0, 0, RST)) == []
    assert r.stats.connections == 0


def test_role_guess_server_ports() -> None:
    r = Reassembler(server_ports=frozenset({50000}))
    p = Peer(cli=("10.0.0.1", 1234), srv=("10.0.0.2", 50000))
    (opened,) = of(r.feed(p.c(1.0, 0, data=b"x")), ConnectionOpened)
    assert opened.client == ("10.0.0.1", 1234) and opened.server == ("10.0.0.2", 50000)
    # the same when the server speaks first
    r = Reassembler(server_ports=frozenset({50000}))
    (opened,) = of(r.feed(p.s(1.0, 0, data=b"x")), ConnectionOpened)
    assert opened.client == ("10.0.0.1", 1234) and opened.server == ("10.0.0.2", 50000)


def test_role_guess_lower_port_is_server() -> None:
    r = Reassembler()
    p = Peer(cli=("::1", 9000), srv=("::1", 80))
    (opened,) = of(r.feed(p.c(1.0, 0, data=b"x")), ConnectionOpened)
    assert opened.server == ("::1", 80) and not opened.syn_seen
    r = Reassembler()
    ev = r.feed(p.s(1.0, 0, data=b"x"))
    (opened,) = of(ev, ConnectionOpened)
    assert opened.server == ("::1", 80)
    assert of(ev, FlowData)[0].from_client is False


# --------------------------------------------------------------------- gaps


def test_ack_driven_gap_with_buffered_data() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"0123"))
    r.feed(p.s(1.1, 8, data=b"89"))
    assert r.feed(p.c(1.2, 0, ACK, ack=10)) == []  # the client got 4..8, we did not
    # the loss is declared when the server sends again
    ev = r.feed(p.s(1.3, 10, data=b"ab"))
    assert ev == [FlowGap(1, 1.3, False, 4, "lost"), FlowData(1, 1.3, False, b"89ab")]


def test_ack_driven_gap_without_buffered_data() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"0123"))
    assert r.feed(p.c(1.2, 0, ACK, ack=9)) == []
    # delivery continues after the hole, whose size the ACK gave
    ev = r.feed(p.s(1.3, 9, data=b"9"))
    assert ev == [FlowGap(1, 1.3, False, 5, "lost"), FlowData(1, 1.3, False, b"9")]
    # the lost bytes arriving late are dropped as retransmission
    assert r.feed(p.s(1.4, 4, data=b"45678")) == []
    assert r.stats.retransmissions == 1
    assert r.stats.gap_bytes == 5


def test_ack_driven_gap_when_the_sender_says_nothing_more() -> None:
    r = Reassembler(hole_timeout=1.0)
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"0123"))
    r.feed(p.c(1.2, 0, ACK, ack=9))
    assert r.expire(2.0) == []
    assert r.expire(2.3) == [FlowGap(1, 2.3, False, 5, "lost")]
    # or a FIN, or the end of the capture
    r = Reassembler()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"0123"))
    r.feed(p.c(1.2, 0, ACK, ack=9))
    assert r.feed(p.s(1.3, 9, ACK | FIN)) == [
        FlowGap(1, 1.3, False, 5, "lost"),
        FlowEnd(1, 1.3, False, "fin"),
    ]
    r = Reassembler()
    p.handshake(r)
    r.feed(p.c(1.2, 0, ACK, ack=3))
    assert r.flush(1.5)[:2] == [FlowEnd(1, 1.5, True, "eof"), FlowGap(1, 1.5, False, 3, "lost")]


def test_ack_before_its_data_in_capture_order_is_not_loss() -> None:
    """Two data segments swapped by the capture, the ACK of both captured in between."""
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"0123"))
    assert r.feed(p.s(1.1, 8, data=b"89")) == []
    assert r.feed(p.c(1.1, 0, ACK, ack=10)) == []
    ev = r.feed(p.s(1.2, 4, data=b"4567"))
    assert ev == [FlowData(1, 1.2, False, b"456789")]
    # ACK arriving before data with nothing buffered
    assert r.feed(p.c(1.3, 0, ACK, ack=13)) == []
    assert r.feed(p.s(1.3, 10, data=b"abc")) == [FlowData(1, 1.3, False, b"abc")]
    assert r.feed(p.s(1.4, 13, data=b"d")) == [FlowData(1, 1.4, False, b"d")]
    assert r.stats.gaps == 0 and r.stats.retransmissions == 0


def test_ack_driven_gap_on_data_segment_and_partial_buffer() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 2, data=b"23"))
    r.feed(p.s(1.0, 6, data=b"6789"))
    # the client's data segment acks up to 8: holes 0..2 and 4..6 are lost, 8..10 waits
    assert r.feed(p.c(1.1, 0, data=b"req", ack=8)) == [FlowData(1, 1.1, True, b"req")]
    ev = r.feed(p.s(1.2, 12, data=b"cd", ack=3))
    assert ev == [
        FlowGap(1, 1.2, False, 2, "lost"),
        FlowData(1, 1.2, False, b"23"),
        FlowGap(1, 1.2, False, 2, "lost"),
        FlowData(1, 1.2, False, b"6789"),
    ]
    assert data(r.feed(p.s(1.3, 10, data=b"ab", ack=3))) == b"abcd"


def test_ack_of_syn_and_fin_is_not_loss() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, ACK | FIN, data=b"x"))
    assert r.feed(p.c(1.1, 0, ACK, ack=2)) == []
    assert r.stats.gaps == 0


def test_old_and_bogus_acks_are_ignored() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"0123456789"))
    assert r.feed(p.c(1.1, 0, ACK, ack=3)) == []  # behind: in flight
    assert r.feed(p.c(1.2, 0, ACK, ack=(1 << 31) - 5)) == []  # implausibly far ahead
    assert r.feed(p.c(1.3, 0, 0, ack=500)) == []  # no ACK flag: ack field means nothing
    assert r.stats.gaps == 0


def test_hole_timeout_on_feed() -> None:
    r = Reassembler(hole_timeout=1.0)
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 3, data=b"345"))
    assert r.feed(p.s(1.5, 6, data=b"67")) == []
    ev = r.feed(p.c(2.01, 0, ACK))  # any segment of the connection advances time
    assert ev == [FlowGap(1, 2.01, False, 3, "lost"), FlowData(1, 2.01, False, b"34567")]


def test_hole_timeout_on_expire_handles_successive_holes() -> None:
    r = Reassembler(hole_timeout=1.0)
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 3, data=b"345"))
    r.feed(p.s(1.8, 10, data=b"ab"))
    assert r.expire(1.9) == []
    assert r.expire(2.5) == [
        FlowGap(1, 2.5, False, 3, "lost"),
        FlowData(1, 2.5, False, b"345"),
    ]
    assert r.expire(2.9) == [FlowGap(1, 2.9, False, 4, "lost"), FlowData(1, 2.9, False, b"ab")]
    assert r.feed(p.s(3.0, 12, data=b"c")) == [FlowData(1, 3.0, False, b"c")]


def test_buffer_cap_declares_gap() -> None:
    r = Reassembler(max_buffer=10)
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 5, data=b"56789"))
    r.feed(p.s(1.0, 20, data=b"kl"))
    ev = r.feed(p.s(1.1, 12, data=b"cdefgh"))  # 13 bytes buffered > 10
    assert ev == [
        FlowAnomaly(1, 1.1, False, "buffer-cap", "13 bytes buffered"),
        FlowGap(1, 1.1, False, 5, "lost"),
        FlowData(1, 1.1, False, b"56789"),
    ]
    assert r.stats.buffer_cap_hits == 1
    # remaining buffered data still waits for its hole
    assert data(r.feed(p.s(1.2, 10, data=b"ab"))) == b"abcdefghkl"[:8]
    assert data(r.feed(p.s(1.3, 18, data=b"ij"))) == b"ijkl"


def test_capture_gap_marks_every_open_direction() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    q = Peer(cli=("127.0.0.1", 40001))
    q.handshake(r)
    r.feed(q.c(1.0, 0, ACK | FIN))
    ev = r.capture_gap(CaptureGap(2.0, 17, "kernel"))
    assert ev == [
        FlowGap(1, 2.0, True, None, "kernel-drop"),
        FlowGap(1, 2.0, False, None, "kernel-drop"),
        FlowGap(2, 2.0, False, None, "kernel-drop"),
    ]
    assert of(r.capture_gap(CaptureGap(2.0, 1, "queue")), FlowGap)[0].reason == "queue"


# ------------------------------------------------------------- time, memory


def test_idle_expiry() -> None:
    r = Reassembler(idle_timeout=60.0)
    p = Peer()
    p.handshake(r)
    r.feed(p.s(10.0, 0, data=b"x"))
    assert r.expire(69.0) == []
    ev = r.expire(70.0)
    assert ev == [
        FlowEnd(1, 70.0, True, "idle"),
        FlowEnd(1, 70.0, False, "idle"),
        ConnectionClosed(1, 70.0, "idle"),
    ]
    assert r.open_connections == 0
    # forgotten: the next data segment is a new, mid-stream connection
    ev = r.feed(p.s(71.0, 1, data=b"y"))
    assert isinstance(ev[0], ConnectionOpened) and ev[0].conn == 2


def test_closed_connection_lingers_then_is_forgotten() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.c(1.0, 0, RST))
    assert r.expire(2.0) == []
    assert r.feed(p.c(2.0, 0, ACK | PSH, data=b"late")) == []
    assert r.expire(100.0) == []
    assert isinstance(r.feed(p.c(101.0, 0, data=b"new"))[0], ConnectionOpened)


def test_flush_declares_holes_and_closes_everything() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"ab"))
    r.feed(p.s(1.0, 4, data=b"ef"))
    ev = r.flush(5.0)
    assert ev == [
        FlowEnd(1, 5.0, True, "eof"),
        FlowGap(1, 5.0, False, 2, "lost"),
        FlowData(1, 5.0, False, b"ef"),
        FlowEnd(1, 5.0, False, "eof"),
        ConnectionClosed(1, 5.0, "eof"),
    ]
    assert r.open_connections == 0
    assert r.flush(6.0) == []


def test_max_connections_evicts_oldest_idle() -> None:
    r = Reassembler(max_connections=2)
    peers = [Peer(cli=("127.0.0.1", 40000 + i)) for i in range(3)]
    peers[0].handshake(r, 1.0)
    peers[1].handshake(r, 2.0)
    r.feed(peers[0].c(3.0, 0, data=b"keep me"))  # conn 1 is now the most recent
    ev = peers[2].handshake(r, 4.0)
    assert ev == [
        FlowEnd(2, 4.0, True, "idle"),
        FlowEnd(2, 4.0, False, "idle"),
        ConnectionClosed(2, 4.0, "idle"),
        ConnectionOpened(3, 4.0, peers[2].cli, SRV, True),
    ]
    assert r.open_connections == 2


def test_max_connections_drops_closed_first() -> None:
    r = Reassembler(max_connections=2)
    a = Peer(cli=("127.0.0.1", 40000))
    b = Peer(cli=("127.0.0.1", 40001))
    c = Peer(cli=("127.0.0.1", 40002))
    a.handshake(r, 1.0)
    b.handshake(r, 2.0)
    r.feed(b.c(2.5, 0, RST))
    ev = c.handshake(r, 3.0)
    assert ev == [ConnectionOpened(3, 3.0, c.cli, SRV, True)]
    assert r.open_connections == 2


def test_out_of_window_segment_is_dropped() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    ev = r.feed(p.s(1.0, (1 << 30) + 10, data=b"bogus"))
    assert [e.kind for e in of(ev, FlowAnomaly)] == ["out-of-window"]
    assert r.feed(p.s(1.1, 0, data=b"ok")) == [FlowData(1, 1.1, False, b"ok")]


def test_tfo_syn_with_payload() -> None:
    r = Reassembler()
    p = Peer()
    s = p.syn(0.0)._replace(payload=b"early")
    ev = r.feed(s)
    assert ev[1:] == [FlowData(1, 0.0, True, b"early")]
    assert r.feed(p.c(0.1, 5, data=b"!")) == [FlowData(1, 0.1, True, b"!")]


def test_rst_ack_number_declares_loss_before_closing() -> None:
    r = Reassembler()
    p = Peer()
    p.handshake(r)
    r.feed(p.s(1.0, 0, data=b"01"))
    r.feed(p.s(1.0, 5, data=b"56"))
    ev = r.feed(p.c(2.0, 0, RST | ACK, ack=9))  # the client got 0..9
    assert ev == [
        FlowEnd(1, 2.0, True, "rst"),
        FlowGap(1, 2.0, False, 3, "lost"),
        FlowData(1, 2.0, False, b"56"),
        FlowGap(1, 2.0, False, 2, "lost"),
        FlowEnd(1, 2.0, False, "rst"),
        ConnectionClosed(1, 2.0, "rst"),
    ]
