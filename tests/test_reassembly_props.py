"""Property tests for sniffer.core.reassembly: random cuts, orders, duplicates and losses."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core import reassembly
from sniffer.core.events import (
    ACK,
    FIN,
    PSH,
    SYN,
    ConnectionClosed,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
    Segment,
)
from sniffer.core.reassembly import Reassembler

MASK = 0xFFFFFFFF
CLI = ("127.0.0.1", 43210)
SRV = ("127.0.0.1", 8000)

isns = st.one_of(
    st.integers(0, MASK),
    st.integers(MASK - 64, MASK),  # the stream wraps within a few bytes
    st.integers(0, 64),
)


@st.composite
def cut(draw: st.DrawFn, min_size: int = 1) -> tuple[bytes, list[tuple[int, int]]]:
    """A byte string and the (start, end) ranges of the segments it is cut into."""
    body = draw(st.binary(min_size=min_size, max_size=400))
    points = draw(st.sets(st.integers(1, len(body) - 1), max_size=30)) if len(body) > 1 else set()
    bounds = [0, *sorted(points), len(body)]
    return body, list(pairwise(bounds))


def seg(
    ts: float, isn: int, start: int, payload: bytes, flags: int = ACK | PSH, ack: int = 0
) -> Segment:
    """A client → server segment; ``ack`` is the raw acknowledgment number."""
    return Segment(ts, *CLI, *SRV, (isn + 1 + start) & MASK, ack, flags, payload)


def syn(isn: int) -> Segment:
    return Segment(0.0, *CLI, *SRV, isn, 0, SYN, b"")


def client_ack(ts: float, sisn: int, upto: int) -> Segment:
    """A server → client pure ACK of the client's bytes below ``upto``."""
    return Segment(ts, *SRV, *CLI, sisn, 0, ACK, b"")._replace(ack=upto)


def run(r: Reassembler, segs: list[Segment], end_ts: float) -> list[FlowEvent]:
    out: list[FlowEvent] = []
    for s in segs:
        out += r.feed(s)
    out += r.flush(end_ts)
    # the shared empty buffers that idle directions point at were never written to
    assert reassembly._NO_INTS == [] and reassembly._NO_BYTES == [] and reassembly._NO_FLOATS == []
    return out


def delivered(events: list[FlowEvent]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, FlowData))


def reconstruct(events: list[FlowEvent], body: bytes) -> int:
    """Check the client direction is ``body`` with holes; return the offset reached."""
    pos = 0
    for e in events:
        if isinstance(e, FlowData):
            assert e.from_client
            assert body[pos : pos + len(e.data)] == e.data
            pos += len(e.data)
        elif isinstance(e, FlowGap):
            assert e.reason == "lost" and e.nbytes is not None and e.nbytes > 0
            pos += e.nbytes
    return pos


@settings(max_examples=300, deadline=None)
@given(
    data=cut(),
    isn=isns,
    rnd=st.randoms(use_true_random=False),
    dup_rate=st.floats(0, 1),
    n_extra=st.integers(0, 8),
)
def test_any_order_with_duplicates_reassembles_exactly(
    data: tuple[bytes, list[tuple[int, int]]],
    isn: int,
    rnd: object,
    dup_rate: float,
    n_extra: int,
) -> None:
    import random

    assert isinstance(rnd, random.Random)
    body, ranges = data
    pieces = list(ranges)
    pieces += [r for r in ranges if rnd.random() < dup_rate]  # exact duplicates
    for _ in range(n_extra):  # retransmissions re-cut at other boundaries
        a = rnd.randrange(len(body))
        b = rnd.randrange(a, len(body)) + 1
        pieces.append((a, b))
    rnd.shuffle(pieces)
    segs = [syn(isn)] + [seg(1.0, isn, a, body[a:b]) for a, b in pieces]
    r = Reassembler(hole_timeout=10.0)
    events = run(r, segs, 2.0)
    assert delivered(events) == body
    assert not [e for e in events if isinstance(e, FlowGap)]
    assert r.stats.overlaps_inconsistent == 0
    assert r.stats.bytes_delivered == len(body)
    assert events[-1] == ConnectionClosed(1, 2.0, "eof")


@settings(max_examples=300, deadline=None)
@given(
    data=cut(min_size=2),
    isn=isns,
    rnd=st.randoms(use_true_random=False),
    dup_rate=st.floats(0, 1),
    with_fin=st.booleans(),
)
def test_one_lost_segment_is_one_exact_gap(
    data: tuple[bytes, list[tuple[int, int]]],
    isn: int,
    rnd: object,
    dup_rate: float,
    with_fin: bool,
) -> None:
    import random

    assert isinstance(rnd, random.Random)
    body, ranges = data
    if len(ranges) < 2 and not with_fin:
        return  # losing the only segment without a FIN leaves nothing to notice
    # Without a FIN the loss of the last segment cannot be seen from sequence numbers.
    lost_i = rnd.randrange(len(ranges) if with_fin else len(ranges) - 1)
    la, lb = ranges[lost_i]
    kept = [r for i, r in enumerate(ranges) if i != lost_i]
    pieces = kept + [r for r in kept if rnd.random() < dup_rate]
    rnd.shuffle(pieces)
    segs = [syn(isn)] + [seg(1.0, isn, a, body[a:b]) for a, b in pieces]
    if with_fin:
        segs.append(seg(1.5, isn, len(body), b"", ACK | FIN))
    r = Reassembler(hole_timeout=10.0)
    events = run(r, segs, 2.0)
    gaps = [e for e in events if isinstance(e, FlowGap)]
    assert len(gaps) == 1
    assert gaps[0].nbytes == lb - la and gaps[0].reason == "lost"
    assert gaps[0].ts == (1.5 if with_fin else 2.0)
    i = events.index(gaps[0])
    assert delivered(events[:i]) == body[:la]
    assert delivered(events[i:]) == body[lb:]
    ends = [e for e in events if isinstance(e, FlowEnd) and e.from_client]
    assert [e.reason for e in ends] == ["fin" if with_fin else "eof"]
    assert r.stats.gap_bytes == lb - la


@settings(max_examples=300, deadline=None)
@given(
    data=cut(),
    isn=isns,
    sisn=isns,
    rnd=st.randoms(use_true_random=False),
    loss=st.floats(0, 0.5),
    n_acks=st.integers(0, 6),
    max_buffer=st.sampled_from([16, 64, 4 << 20]),
    with_fin=st.booleans(),
)
def test_any_loss_gives_the_stream_with_exact_holes(
    data: tuple[bytes, list[tuple[int, int]]],
    isn: int,
    sisn: int,
    rnd: object,
    loss: float,
    n_acks: int,
    max_buffer: int,
    with_fin: bool,
) -> None:
    """Whatever is lost, reordered, timed out or capped, output is the body with holes."""
    import random

    assert isinstance(rnd, random.Random)
    body, ranges = data
    pieces = [r for r in ranges if rnd.random() >= loss]
    pieces += [r for r in pieces if rnd.random() < 0.2]
    rnd.shuffle(pieces)
    segs: list[Segment] = [
        syn(isn),
        Segment(0.0, *SRV, *CLI, sisn, (isn + 1) & MASK, SYN | ACK, b""),
    ]
    ts = 0.0
    for a, b in pieces:
        ts += rnd.choice([0.0, 0.01, 0.3])
        segs.append(seg(ts, isn, a, body[a:b], ack=(sisn + 1) & MASK))
    for _ in range(n_acks):  # the receiver acknowledges some prefix, at a random point
        upto = rnd.randrange(len(body) + 1)
        ack = client_ack(0.0, (sisn + 1) & MASK, (isn + 1 + upto) & MASK)
        segs.insert(rnd.randrange(2, len(segs) + 1), ack)
    clock = 0.0  # capture time never goes backwards
    for i, s in enumerate(segs):
        clock = max(clock, s.ts)
        segs[i] = s._replace(ts=clock)
    if with_fin:
        segs.append(seg(ts + 0.1, isn, len(body), b"", ACK | FIN, ack=(sisn + 1) & MASK))
    r = Reassembler(hole_timeout=0.5, max_buffer=max_buffer)
    events = run(r, segs, ts + 1.0)
    client_events = [e for e in events if getattr(e, "from_client", True)]
    pos = reconstruct(client_events, body)
    delivered_set = sum(len(e.data) for e in client_events if isinstance(e, FlowData))
    lost = sum(e.nbytes or 0 for e in client_events if isinstance(e, FlowGap))
    assert delivered_set + lost == pos
    if with_fin:
        assert pos == len(body)
    else:
        assert pos <= len(body)
    ends = [e for e in events if isinstance(e, FlowEnd) and e.from_client]
    assert len(ends) == 1
    assert sum(isinstance(e, ConnectionClosed) for e in events) == 1


@settings(max_examples=200, deadline=None)
@given(
    data=cut(),
    rnd=st.randoms(use_true_random=False),
)
def test_midstream_any_order_never_delivers_out_of_order(
    data: tuple[bytes, list[tuple[int, int]]],
    rnd: object,
) -> None:
    """Without a SYN the first segment with payload sets the start; output is still ordered."""
    import random

    assert isinstance(rnd, random.Random)
    body, ranges = data
    pieces = list(ranges)
    rnd.shuffle(pieces)
    first = pieces[0][0]
    segs = [seg(1.0, 7, a, body[a:b]) for a, b in pieces]
    r = Reassembler(hole_timeout=10.0)
    events = run(r, segs, 2.0)
    gaps = [e for e in events if isinstance(e, FlowGap)]
    assert gaps and gaps[0].reason == "midstream" and gaps[0].nbytes is None
    assert len(gaps) == 1
    assert delivered(events) == body[first:]
    assert r.stats.midstream == 1


@settings(max_examples=300, deadline=None)
@given(
    data=cut(),
    isn=isns,
    sisn=isns,
    rnd=st.randoms(use_true_random=False),
    ack_rate=st.floats(0, 1),
    swap_rate=st.floats(0, 1),
)
def test_acks_of_captured_data_never_make_a_gap(
    data: tuple[bytes, list[tuple[int, int]]],
    isn: int,
    sisn: int,
    rnd: object,
    ack_rate: float,
    swap_rate: float,
) -> None:
    """Data with the receiver's ACKs, neighbours swapped by the capture: nothing is lost."""
    import random

    assert isinstance(rnd, random.Random)
    body, ranges = data
    wire: list[Segment] = []
    for a, b in ranges:
        wire.append(seg(0.0, isn, a, body[a:b], ack=(sisn + 1) & MASK))
        if rnd.random() < ack_rate:  # a (possibly delayed) ACK of everything so far
            wire.append(client_ack(0.0, (sisn + 1) & MASK, (isn + 1 + b) & MASK))
    i = 0
    while i + 1 < len(wire):  # disjoint swaps of neighbouring packets
        if rnd.random() < swap_rate:
            wire[i], wire[i + 1] = wire[i + 1], wire[i]
            i += 2
        else:
            i += 1
    synack = Segment(0.0, *SRV, *CLI, sisn, (isn + 1) & MASK, SYN | ACK, b"")
    segs = [syn(isn), synack, *(s._replace(ts=1.0 + k * 1e-4) for k, s in enumerate(wire))]
    segs.append(seg(5.0, isn, len(body), b"", ACK | FIN, ack=(sisn + 1) & MASK))
    r = Reassembler()
    events = run(r, segs, 6.0)
    assert not [e for e in events if isinstance(e, FlowGap)]
    assert delivered(events) == body
    assert FlowEnd(1, 5.0, True, "fin") in events
