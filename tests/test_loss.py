"""Loss accounting (sniffer.capture.loss): what a dropped batch becomes; no thread, no clock."""

from __future__ import annotations

from sniffer.capture.loss import LossAccount
from sniffer.core.events import (
    CaptureGap,
    ConnectionClosed,
    ConnectionOpened,
    FlowAnomaly,
    FlowData,
    FlowEnd,
    FlowGap,
    Segment,
)

C, S = ("127.0.0.1", 40000), ("127.0.0.1", 8000)


def seg(ts: float, payload: bytes = b"x") -> Segment:
    return Segment(ts, *C, *S, 1, 1, 0x18, payload)


def test_nothing_dropped_nothing_pending() -> None:
    loss = LossAccount()
    assert not loss.pending and loss.lost == 0
    assert loss.marker() == [CaptureGap(0.0, 0, "queue")]


def test_segments_and_kernel_gaps_count_as_packets_and_the_marker_says_how_many() -> None:
    loss = LossAccount()
    assert loss.drop([seg(1.0), seg(2.0)]) == 2
    assert loss.drop([seg(3.0), CaptureGap(3.5, 7, "kernel")]) == 1 + 7
    assert loss.pending and loss.lost == 10
    assert loss.marker() == [CaptureGap(3.5, 10, "queue")]


def test_the_marker_time_is_the_latest_dropped_capture_time() -> None:
    loss = LossAccount()
    loss.drop([CaptureGap(9.0, 1, "kernel"), seg(5.0)])
    # a segment sets the time (segments arrive in capture order); a gap only raises it
    assert loss.marker() == [CaptureGap(5.0, 2, "queue")]


def test_a_queue_marker_in_a_dropped_batch_is_not_counted_again() -> None:
    loss = LossAccount()
    loss.drop([seg(1.0)])
    assert loss.drop([CaptureGap(1.0, 1, "queue"), seg(2.0)]) == 1
    assert loss.marker() == [CaptureGap(2.0, 2, "queue")]


def test_delivery_starts_afresh() -> None:
    loss = LossAccount()
    loss.drop([seg(1.0)])
    loss.delivered()
    assert not loss.pending and loss.lost == 0
    loss.drop([seg(4.0)])
    assert loss.marker() == [CaptureGap(4.0, 1, "queue")]


def test_packet_capture_ignores_flow_events() -> None:
    loss = LossAccount(ebpf=False)
    assert loss.drop([FlowData(1, 1.0, True, b"abc")]) == 0
    assert loss.marker() == [CaptureGap(0.0, 0, "queue")]


def test_ebpf_data_becomes_one_gap_per_direction_with_exact_bytes() -> None:
    loss = LossAccount(ebpf=True)
    n = loss.drop(
        [
            FlowData(1, 1.0, True, b"abc"),
            FlowData(1, 1.1, False, b"hello"),
            FlowData(1, 1.2, False, b"!!"),
            FlowGap(1, 1.3, True, 4, "overflow"),
        ]
    )
    assert n == 3  # data records; a gap carries no packet
    assert loss.marker() == [
        CaptureGap(1.3, 3, "queue"),
        FlowGap(1, 1.3, True, 7, "overflow"),
        FlowGap(1, 1.2, False, 7, "overflow"),
    ]


def test_ebpf_unknown_size_stays_unknown() -> None:
    loss = LossAccount(ebpf=True)
    loss.drop([FlowGap(2, 1.0, True, None, "lost"), FlowData(2, 1.1, True, b"zz")])
    assert loss.marker()[1:] == [FlowGap(2, 1.1, True, None, "overflow")]


def test_ebpf_structure_is_kept_and_gaps_come_before_their_end() -> None:
    loss = LossAccount(ebpf=True)
    opened = ConnectionOpened(2, 2.0, C, S, True, "ebpf")
    loss.drop(
        [
            opened,
            FlowData(2, 2.1, True, b"abc"),
            FlowData(2, 2.2, False, b"hello"),
            FlowEnd(2, 2.4, False, "fin"),
            FlowData(3, 2.45, True, b"q"),
            ConnectionClosed(2, 2.5, "fin"),
            FlowAnomaly(2, 2.6, False, "out-of-order"),
        ]
    )
    marker = loss.marker()
    assert marker[0] == CaptureGap(2.6, 3, "queue")
    rest = marker[1:]
    assert rest[0] == opened
    assert rest.index(FlowGap(2, 2.2, False, 5, "overflow")) < rest.index(
        FlowEnd(2, 2.4, False, "fin")
    )
    assert rest.index(FlowGap(2, 2.1, True, 3, "overflow")) < rest.index(
        ConnectionClosed(2, 2.5, "fin")
    )
    # a connection still open keeps its gap at the end
    assert rest[-1] == FlowGap(3, 2.45, True, 1, "overflow")
    assert not any(isinstance(e, FlowAnomaly) for e in rest)
