"""Live AF_PACKET capture on ``lo`` (needs root or CAP_NET_RAW).

Every test makes its own loopback traffic on a free port; loops are bounded by
a count of polls, never by measuring time.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sniffer.capture import afpacket
from sniffer.capture.afpacket import (
    AfPacketSource,
    CaptureError,
    CaptureStats,
    have_capture_privilege,
)
from sniffer.core.events import ACK, FIN, PSH, RST, SYN, CaptureGap, Segment
from sniffer.core.native import NATIVE

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        not have_capture_privilege(),
        reason="live capture needs root or CAP_NET_RAW (packet sockets)",
    ),
]

Item = Segment | CaptureGap
MAX_POLLS = 400  # × 0.05 s: a generous bound, only reached when a test fails


def collect(
    src: AfPacketSource, done: Callable[[list[Item]], bool], polls: int = MAX_POLLS
) -> list[Item]:
    got: list[Item] = []
    for _ in range(polls):
        got += src.poll(0.05)
        if done(got):
            break
    return got


def drain(src: AfPacketSource) -> list[Item]:
    """Everything the source still has: poll until two empty batches in a row."""
    got: list[Item] = []
    empty = 0
    for _ in range(MAX_POLLS):
        batch = src.poll(0.05)
        got += batch
        empty = 0 if batch else empty + 1
        if empty >= 2:
            break
    return got


def segments(items: list[Item]) -> list[Segment]:
    return [i for i in items if isinstance(i, Segment)]


@dataclass
class Conversation:
    host: str
    port: int
    client: tuple[str, int] = ("", 0)
    sent_c2s: bytes = b""
    sent_s2c: bytes = b""
    retrans_c2s: int = 0
    retrans_s2c: int = 0


def free_listener(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.bind((host, 0))
    srv.listen(4)
    return srv


def converse(srv: socket.socket, messages: list[tuple[bool, bytes]]) -> Conversation:
    """Connect to ``srv``, send each message (True: client→server), then close."""
    host, port = srv.getsockname()[:2]
    conv = Conversation(host, port)
    c = socket.create_connection((host, port))
    s, _ = srv.accept()
    conv.client = c.getsockname()[:2]
    with c, s:
        for to_server, data in messages:
            a, b = (c, s) if to_server else (s, c)
            a.sendall(data)
            want = len(data)
            buf = bytearray()
            while len(buf) < want:
                chunk = b.recv(want - len(buf))
                assert chunk, "peer closed early"
                buf += chunk
            assert bytes(buf) == data
            if to_server:
                conv.sent_c2s += data
            else:
                conv.sent_s2c += data
        c.shutdown(socket.SHUT_WR)
        assert s.recv(1) == b""
        s.shutdown(socket.SHUT_WR)
        assert c.recv(1) == b""
        conv.retrans_c2s = total_retrans(c)
        conv.retrans_s2c = total_retrans(s)
    return conv


def fins_both_ways(port: int) -> Callable[[list[Item]], bool]:
    def done(items: list[Item]) -> bool:
        fins = {(g.sport == port) for g in segments(items) if g.flags & FIN}
        return len(fins) == 2

    return done


def check_stream(
    segs: list[Segment],
    src: tuple[str, int],
    dst: tuple[str, int],
    data: bytes,
    retransmissions: int = 0,
) -> None:
    """One direction: SYN once, every payload byte captured and in sequence, FIN.

    A byte range seen twice is allowed only as a TCP retransmission (identical
    bytes, at most as many repeats as the sender's ``tcpi_total_retrans``): a
    capture that counts loopback packets twice would exceed that at once.
    """
    one_way = [g for g in segs if (g.src, g.sport) == src and (g.dst, g.dport) == dst]
    syns = [g for g in one_way if g.flags & SYN]
    assert 1 <= len(syns) <= 1 + retransmissions
    isn = syns[0].seq
    stream = bytearray(len(data))
    seen = bytearray(len(data))
    repeats = 0
    for g in one_way:
        if not g.payload:
            continue
        start = (g.seq - isn - 1) & 0xFFFFFFFF
        end = start + len(g.payload)
        assert end <= len(data), "bytes beyond what was sent"
        if any(seen[start:end]):
            repeats += 1
            covered = [i for i in range(start, end) if seen[i]]
            assert all(stream[i] == g.payload[i - start] for i in covered)
        stream[start:end] = g.payload
        seen[start:end] = b"\x01" * len(g.payload)
    assert repeats <= retransmissions, "duplicate bytes that TCP did not retransmit"
    assert all(seen), "captured bytes have a hole"
    assert bytes(stream) == data
    fins = [g for g in one_way if g.flags & FIN]
    assert 1 <= len(fins) <= 1 + retransmissions
    assert all(f.seq == (isn + 1 + len(data)) & 0xFFFFFFFF for f in fins)


def total_retrans(sock: socket.socket) -> int:
    """``tcp_info.tcpi_total_retrans`` (a u32 at byte 100 of struct tcp_info)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("=I", raw, 100)[0])


MESSAGES = [
    (True, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"),
    (False, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"),
    (False, b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'),
    (True, bytes(range(256)) * 400),  # 100 KiB: several segments, > lo MTU
    (False, b"data: [DONE]\n\n"),
]


@pytest.fixture(params=["tpacket_v3", "recv"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def open_source(port: int | tuple[int, ...] | None, backend: str, **kw: int) -> AfPacketSource:
    ports = (port,) if isinstance(port, int) else port
    src = AfPacketSource(
        "lo", ports, use_ring=backend == "tpacket_v3", ring_blocks=8, block_size=1 << 20, **kw
    )
    src.open()
    assert src.backend == backend
    return src


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_every_payload_byte_once(host: str, backend: str) -> None:
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    srv = free_listener(host)
    other = free_listener(host)
    port, other_port = srv.getsockname()[1], other.getsockname()[1]
    src = open_source(port, backend)
    try:
        with srv, other:
            t0 = time.time()
            conv = converse(srv, MESSAGES)
            t1 = time.time()
            noise = converse(other, [(True, b"other port " * 100), (False, b"ignored")])
        items = collect(src, fins_both_ways(port))
        items += src.poll(0)
        t_polled = time.time()
        stats = src.stats()
    finally:
        src.close()
    segs = segments(items)
    assert not [i for i in items if isinstance(i, CaptureGap)]
    client, server = conv.client, (host, port)
    # Only our port, only segments with payload or SYN/FIN/RST: no pure ACK.
    for g in segs:
        assert port in (g.sport, g.dport)
        assert other_port not in (g.sport, g.dport)
        # not the noise connection's packets (its client may reuse our client's
        # ephemeral port: the kernel only keeps 4-tuples unique, so compare those)
        assert {(g.src, g.sport), (g.dst, g.dport)} != {noise.client, (host, other_port)}
        assert g.payload or g.flags & (SYN | FIN | RST), f"pure ACK delivered: {g}"
        assert {(g.src, g.sport), (g.dst, g.dport)} == {client, server}
        assert g.ts > 0
    check_stream(segs, client, server, conv.sent_c2s, conv.retrans_c2s)
    check_stream(segs, server, client, conv.sent_s2c, conv.retrans_s2c)
    syn = next(g for g in segs if g.flags & SYN and not g.flags & ACK)
    assert (syn.src, syn.sport) == client
    assert any(g.flags & SYN and g.flags & ACK and (g.src, g.sport) == server for g in segs)
    assert any(g.flags & PSH for g in segs)
    # Kernel capture times, on the wall clock. (Not necessarily in capture order:
    # lo queues packets per CPU, a sender that moves between CPUs can be reordered.)
    # The recv backend's first packets may carry the time of recvmsg instead: the
    # kernel turns receive timestamps on asynchronously after SO_TIMESTAMPNS.
    if backend == "recv":
        t1 = t_polled
    assert all(t0 <= g.ts <= t1 for g in segs)
    # The kernel filter let nothing else through; each loopback packet counted once.
    assert stats == CaptureStats(
        packets=len(segs),
        bytes=stats.bytes,
        kernel_drops=0,
        freezes=0,
        backend=backend,
        segments=len(segs),
        unparsed=0,
        outgoing_skipped=0,
        truncated=0,
    )
    assert stats.bytes > len(conv.sent_c2s) + len(conv.sent_s2c)


def test_finish_returns_what_no_poll_has_returned_yet(backend: str) -> None:
    """At a stop the capture thread polls no more; ``finish`` reads what the
    kernel still holds: here a whole conversation still in the ring's open
    block (its timeout is long) or in the socket's queue, never polled. Without
    it the last packets before a stop were lost (issue #24: a live test's last
    streams stored truncated under load)."""
    srv = free_listener("127.0.0.1")
    port = srv.getsockname()[1]
    src = open_source(port, backend, block_timeout_ms=400)
    try:
        with srv:
            conv = converse(srv, MESSAGES)
        items = src.finish()
        assert fins_both_ways(port)(items)
        assert src.finish() == []  # nothing twice
    finally:
        src.close()
    segs = segments(items)
    check_stream(segs, conv.client, ("127.0.0.1", port), conv.sent_c2s, conv.retrans_c2s)
    check_stream(segs, ("127.0.0.1", port), conv.client, conv.sent_s2c, conv.retrans_s2c)
    assert src.finish() == []  # closed: nothing, no error


def test_finish_under_steady_traffic_reads_up_to_the_stop_not_on(backend: str) -> None:
    """Traffic that goes on after a stop (the serving node does not pause for
    the sidecar) keeps the kernel handing blocks over: ``finish`` takes the
    packets captured before it was called (here the last ones sent before it)
    and returns within about a block timeout, instead of reading on until the
    ring's size in polls had passed (an eight-block ring of 100 ms blocks:
    the packets of the next second, and as much more gap in a graceful
    restart)."""
    srv = free_listener("127.0.0.1")
    port = srv.getsockname()[1]
    src = AfPacketSource(
        "lo",
        (port,),
        use_ring=backend == "tpacket_v3",
        ring_blocks=16,
        block_size=1 << 20,
        block_timeout_ms=100,
    )
    src.open()
    stop = threading.Event()
    sent: list[float] = []  # wall-clock time before each send

    def send(c: socket.socket) -> None:
        for _ in range(800):  # 10 ms apart: at most ~8 s
            if stop.wait(0.01):
                return
            sent.append(time.time())
            c.sendall(b"steady" * 20)

    try:
        with srv, socket.create_connection(("127.0.0.1", port)) as c:
            s, _ = srv.accept()
            with s:
                t = threading.Thread(target=send, args=(c,), daemon=True)
                t.start()
                for _ in range(200):  # until ~50 sends, the ring never polled
                    if len(sent) >= 50:
                        break
                    time.sleep(0.01)
                called = time.time()
                last_before = sent[-1]
                items = src.finish()
                stop.set()
                t.join(5)
    finally:
        src.close()
    times = [seg.ts for seg in segments(items) if seg.payload and seg.dport == port]
    assert times and max(times) >= last_before - 0.05  # the last sends before the stop
    # the ring's size in polls would be 18 block timeouts (~2 s) of traffic
    assert max(times) < called + 1.0, (max(times) - called, len(times))


def test_a_stopped_daemon_stores_the_packets_still_in_the_ring(tmp_path: Path) -> None:
    """The daemon, capturing on ``lo`` through a ring whose blocks are handed
    over 2 s after their first packet (or when full), is stopped right after
    an SSE exchange: its packets are all still in the open block, never
    polled. The stop reads them (``finish``): the stream is stored complete,
    not lost (before, a stop under load lost a stream's last packets)."""
    import io
    import json
    import sqlite3
    import threading

    from sniffer.runtime.config import Config
    from sniffer.runtime.daemon import Daemon
    from sniffer.runtime.log import Log
    from sniffer.runtime.notify import Notifier

    srv = free_listener("127.0.0.1")
    port = srv.getsockname()[1]
    db = str(tmp_path / "ring.db")
    cfg = Config(database=db, ports=(port,), flush_interval=0.05)
    d = Daemon(
        cfg,
        log=Log("debug", io.StringIO()),
        source_factory=lambda _cfg, _ids: AfPacketSource(
            "lo", (port,), ring_blocks=8, block_size=1 << 20, block_timeout_ms=2000
        ),
        notifier=Notifier({}),
        install_signals=False,
    )
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(d.run()), daemon=True)
    runner.start()
    assert d.started.wait(30)
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    events = [
        {"choices": [{"index": 0, "delta": {"content": "ring"}}]},
        {"choices": [{"index": 0, "delta": {"content": " kept"}, "finish_reason": "stop"}]},
    ]
    sse = b"".join(b"data: %s\n\n" % json.dumps(e).encode() for e in events)
    sse += b"data: [DONE]\n\n"
    with srv:
        converse(
            srv,
            [
                (
                    True,
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
                ),
                (
                    False,
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(sse), sse),
                ),
            ],
        )
    d.request_stop()  # before the ring's block is handed over
    runner.join(60)
    assert codes == [0]
    with sqlite3.connect(db) as c:
        assert c.execute("select state from streams").fetchall() == [("complete",)]
        texts = c.execute("select text from chunks where chunk_index > 0 order by seq")
        assert "".join(t for (t,) in texts) == "ring kept"


def test_all_ports_and_several_ports(backend: str) -> None:
    a, b, c = free_listener("127.0.0.1"), free_listener("127.0.0.1"), free_listener("127.0.0.1")
    pa, pb, pc = (x.getsockname()[1] for x in (a, b, c))
    two = open_source((pa, pb), backend)
    every = open_source(None, backend)
    try:
        with a, b, c:
            convs = [converse(srv, [(True, b"ping"), (False, b"pong")]) for srv in (a, b, c)]
        retrans = [cv.retrans_c2s + cv.retrans_s2c for cv in convs]
        got_two = collect(two, lambda items: len(segments(items)) >= 12)
        got_two += drain(two)
        # every port: whatever else runs on lo is captured too, so count ours
        got_all = collect(every, lambda items: len(_on(segments(items), pa, pb, pc)) >= 18)
        got_all += drain(every)
    finally:
        two.close()
        every.close()
    ports_two = {g.sport for g in segments(got_two)} | {g.dport for g in segments(got_two)}
    assert pa in ports_two and pb in ports_two and pc not in ports_two
    # SYN, SYN-ACK, 2 data, 2 FIN per connection: 6 each (plus TCP retransmissions).
    assert 12 <= len(segments(got_two)) <= 12 + retrans[0] + retrans[1]
    ours = _on(segments(got_all), pa, pb, pc)
    assert 18 <= len(ours) <= 18 + sum(retrans)


def _on(segs: list[Segment], *ports: int) -> list[Segment]:
    """The segments of connections to one of ``ports``."""
    return [g for g in segs if {g.sport, g.dport} & set(ports)]


def bad_checksum_frames(port: int, seqs: list[int], payload: bytes) -> list[bytes]:
    """TCP segments to ``port`` that the IP layer drops (bad header checksum) after
    packet sockets saw them: no socket answers, no RST, nothing else on the wire."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    template = bytearray(
        bytes(
            Ether(src="00:00:00:00:00:00", dst="00:00:00:00:00:00")
            / IP(src="127.0.0.1", dst="127.0.0.1")
            / TCP(sport=40000, dport=port, seq=0, flags="PA")
            / payload
        )
    )
    template[24] ^= 0xFF  # IPv4 header checksum
    frames = []
    for seq in seqs:
        struct.pack_into("!I", template, 14 + 20 + 4, seq)
        frames.append(bytes(template))
    return frames


def inject(frames: list[bytes]) -> None:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0) as tx:
        tx.bind(("lo", 0))
        for f in frames:
            tx.send(f)


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kernel_drops_become_capture_gap(backend: str) -> None:
    """A tiny buffer, N frames sent while nobody reads: the kernel drops some,
    and captured + dropped accounts for every frame."""
    port = unused_port()
    n = 3000
    frames = bad_checksum_frames(port, [1000 + 100 * i for i in range(n)], b"x" * 100)
    if backend == "tpacket_v3":
        src = AfPacketSource(
            "lo", (port,), ring_blocks=2, block_size=4096, frame_size=2048, block_timeout_ms=1
        )
    else:
        src = AfPacketSource("lo", (port,), use_ring=False, rcvbuf=4096)
    src.open()
    try:
        inject(frames)
        items = drain(src)
        stats = src.stats()  # reads the kernel counters; the next poll reports the rest
        items += src.poll(0)
        assert src.poll(0) == []
    finally:
        src.close()
    gaps = [i for i in items if isinstance(i, CaptureGap)]
    segs = segments(items)
    assert stats.kernel_drops > 0
    assert gaps, "drops were not reported as a CaptureGap"
    assert all(g.source == "kernel" and g.dropped > 0 for g in gaps)
    assert sum(g.dropped for g in gaps) == stats.kernel_drops
    assert len(segs) == stats.segments
    assert len(segs) + stats.kernel_drops == n
    # Captured frames are frames that were sent, each once.
    seqs = [g.seq for g in segs]
    assert len(set(seqs)) == len(seqs)
    assert set(seqs) <= {1000 + 100 * i for i in range(n)}
    # A gap's time is the capture time of the last segment delivered before it.
    for i, item in enumerate(items):
        if isinstance(item, CaptureGap):
            before = segments(items[:i])
            if before:
                assert item.ts == before[-1].ts
    if backend == "tpacket_v3":
        assert stats.freezes > 0


def test_ring_gap_sits_between_the_packets_around_the_loss() -> None:
    """Frames sent before the loss come before the gap; frames sent after it, after."""
    port = unused_port()
    src = AfPacketSource(
        "lo", (port,), ring_blocks=2, block_size=4096, frame_size=2048, block_timeout_ms=1
    )
    src.open()
    try:
        assert src.poll(0) == []
        inject(bad_checksum_frames(port, list(range(1000)), b"a" * 100))  # overflows
        items = drain(src)
        late = list(range(10_000, 10_010))
        inject(bad_checksum_frames(port, late, b"b" * 100))  # fits, after the loss
        items += drain(src)
        stats = src.stats()
        items += src.poll(0)
    finally:
        src.close()
    gaps = [i for i, item in enumerate(items) if isinstance(item, CaptureGap)]
    assert len(gaps) == 1
    gap = items[gaps[0]]
    assert isinstance(gap, CaptureGap)
    assert gap.dropped == stats.kernel_drops > 0
    before, after = segments(items[: gaps[0]]), segments(items[gaps[0] :])
    assert before and all(g.seq < 1000 for g in before)
    assert [g.seq for g in after] == late
    assert len(before) + gap.dropped == 1000
    assert gap.ts == before[-1].ts


def test_frame_larger_than_ring_block_is_counted_truncated() -> None:
    port = unused_port()
    src = AfPacketSource("lo", (port,), ring_blocks=2, block_size=4096, frame_size=2048)
    src.open()
    try:
        inject(bad_checksum_frames(port, [7], b"z" * 6000))
        segs = segments(collect(src, lambda items: bool(items)))
        stats = src.stats()
    finally:
        src.close()
    assert len(segs) == 1
    assert 0 < len(segs[0].payload) < 6000
    assert segs[0].payload == b"z" * len(segs[0].payload)
    assert stats.truncated == 1


def test_recv_fallback_when_ring_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(afpacket, "PACKET_RX_RING", 0x7FFF)  # an option the kernel lacks
    srv = free_listener("127.0.0.1")
    port = srv.getsockname()[1]
    src = AfPacketSource("lo", (port,))
    src.open()
    try:
        assert src.backend == "recv"
        assert src.ring_error and "PACKET_RX_RING refused" in src.ring_error
        assert "backend=recv" in src.describe() and "ring unavailable" in src.describe()
        with srv:
            conv = converse(srv, [(True, b"abc"), (False, b"defg")])
        segs = segments(collect(src, fins_both_ways(port)))
    finally:
        src.close()
    check_stream(segs, conv.client, ("127.0.0.1", port), b"abc", conv.retrans_c2s)


def test_outgoing_copies_dropped_when_ignore_outgoing_refused(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old kernels refuse PACKET_IGNORE_OUTGOING: lo then shows each packet twice,
    and the outgoing copy must be dropped by its packet type."""
    monkeypatch.setattr(afpacket, "PACKET_IGNORE_OUTGOING", 0x7FFF)
    srv = free_listener("127.0.0.1")
    port = srv.getsockname()[1]
    src = open_source(port, backend)
    try:
        with srv:
            conv = converse(srv, MESSAGES[:3])
        segs = segments(collect(src, fins_both_ways(port)))
        segs += segments(drain(src))
        stats = src.stats()
    finally:
        src.close()
    check_stream(segs, conv.client, ("127.0.0.1", port), conv.sent_c2s, conv.retrans_c2s)
    check_stream(segs, ("127.0.0.1", port), conv.client, conv.sent_s2c, conv.retrans_s2c)
    assert stats.outgoing_skipped == len(segs)


def test_describe() -> None:
    src = AfPacketSource("lo", (8000,))
    assert src.describe() == (
        "iface=lo backend=tpacket_v3 filter='tcp port 8000 and (payload or syn/fin/rst)'"
    )
    src.open()
    try:
        assert src.describe().startswith("iface=lo backend=tpacket_v3 filter='tcp port 8000")
        assert "ring=32x512KiB" in src.describe()  # default ring: 32 blocks of 512 KiB
        assert src.fileno >= 0
    finally:
        src.close()
    assert src.fileno == -1


def test_close_is_idempotent_and_poll_after_close_fails() -> None:
    src = AfPacketSource("lo", (8000,))
    src.close()  # never opened
    src.open()
    src.open()  # already open: no-op
    src.close()
    src.close()
    with pytest.raises(CaptureError, match="not open"):
        src.poll(0)
    with AfPacketSource("lo", None, use_ring=False) as again:
        assert again.poll(0) is not None
    assert again.fileno == -1


def test_bad_interface() -> None:
    with pytest.raises(CaptureError, match=r"^no such interface 'eth9x'$"):
        AfPacketSource("eth9x", (8000,)).open()
    with pytest.raises(CaptureError, match="invalid interface name"):
        AfPacketSource("a" * 20, (8000,))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ports": [0]}, "bad capture filter"),
        ({"ports": []}, "bad capture filter"),
        ({"block_size": 1000}, "block_size"),
        ({"frame_size": 3000}, "frame_size"),
        ({"ring_blocks": 0}, "ring_blocks"),
    ],
)
def test_bad_parameters(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(CaptureError, match=match):
        AfPacketSource("lo", **kwargs)  # type: ignore[arg-type]


def test_unprivileged_open_has_actionable_message() -> None:
    code = (
        "import os\n"
        "from sniffer.capture.afpacket import AfPacketSource, CaptureError\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        "    AfPacketSource('lo', (8000,)).open()\n"
        "except CaptureError as e:\n"
        "    print(e)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        check=True,
    )
    assert out.stdout.strip() == (
        "cannot open packet socket on 'lo': Operation not permitted (needs root or CAP_NET_RAW)"
    )


@pytest.fixture(autouse=True)
def _no_leaked_fds() -> Iterator[None]:
    before = set(os.listdir("/proc/self/fd"))
    yield
    after = set(os.listdir("/proc/self/fd"))
    leaked = [fd for fd in after - before if _is_packet_socket(fd)]
    assert not leaked, f"packet sockets left open: {leaked}"


def _is_packet_socket(fd: str) -> bool:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    if not target.startswith("socket:["):
        return False
    inode = target[8:-1]
    with open("/proc/net/packet") as fh:
        return any(line.split()[-1] == inode for line in fh.readlines()[1:])


@pytest.mark.native
@pytest.mark.skipif(NATIVE is None, reason="the native core is not available")
def test_native_batches_give_the_same_segments() -> None:
    """``batches=True`` (the daemon's mode with the native core): one
    ``SegmentBatch`` per ring block, holding exactly the segments the Python
    parser gives for the same packets (a second socket on the same traffic)."""
    srv = free_listener("127.0.0.1")
    port = srv.getsockname()[1]
    plain = open_source(port, "tpacket_v3")
    batched = AfPacketSource("lo", (port,), ring_blocks=8, block_size=1 << 20, batches=True)
    batched.open()
    try:
        with srv:
            converse(srv, MESSAGES)
        items = collect(plain, fins_both_ways(port))
        got: list[Segment | CaptureGap] = []
        for _ in range(MAX_POLLS):
            for item in batched.poll(0.05):
                assert isinstance(item, NATIVE.SegmentBatch)
                got += item.segments()
            if len([g for g in segments(got) if g.flags & FIN]) >= 2:
                break
        got += [s for b in batched.poll(0) for s in b.segments()]
        assert batched.stats().segments == len(got)
    finally:
        plain.close()
        batched.close()

    def key(s: Segment) -> tuple[object, ...]:
        return s._replace(ts=0.0)  # each socket stamps its own copy

    want = segments(items)
    assert len(want) > 10
    assert sorted(map(key, segments(got))) == sorted(map(key, want))


def _ring_block(frames: list[tuple[bytes, int, int]], block_size: int = 1 << 16) -> bytearray:
    """A ``TPACKET_V3`` ring block as the kernel lays it out (descriptor, then
    one ``tpacket3_hdr`` + ``sockaddr_ll`` + frame per packet): ``frames`` are
    (frame, sll_pkttype, bytes the wire had beyond the captured ones)."""
    block = bytearray(block_size)
    first = 48
    struct.pack_into("=II", block, 12, len(frames), first)
    off = first
    mac = 82  # TPACKET_ALIGN(68) + 2 (Ethernet, as the kernel pads it)
    for i, (frame, pkttype, beyond) in enumerate(frames):
        size = (mac + len(frame) + 15) & ~15
        nxt = 0 if i == len(frames) - 1 else size
        struct.pack_into(
            "=IIIIIIH",
            block,
            off,
            nxt,
            1_700_000_000 + i,
            987_654_321 - i,
            len(frame),
            len(frame) + beyond,
            1,
            mac,
        )
        block[off + 58] = pkttype
        block[off + mac : off + mac + len(frame)] = frame
        off += size
    return block


@pytest.mark.native
@pytest.mark.skipif(NATIVE is None, reason="the native core is not available")
@pytest.mark.parametrize("skip_outgoing", [True, False])
def test_native_block_walk_is_the_reference_walk(skip_outgoing: bool) -> None:
    """``sniffer._native.parse_block`` counts and parses a ring block exactly as
    ``AfPacketSource._walk_block`` does: the same segments with the same
    timestamps, outgoing copies, truncated frames and non-TCP frames alike."""
    from tests.test_pcap import tcp_frame

    frames = [
        (tcp_frame(0), 0, 0),
        (tcp_frame(1), afpacket.PACKET_OUTGOING, 0),  # lo's second copy
        (tcp_frame(2, b"x" * 300), 0, 1200),  # cut by the snap length
        (b"\x00" * 14 + b"not ip", 0, 0),  # no TCP segment
        (tcp_frame(3), 0, 0),
    ]
    ring = _ring_block(frames)
    src = AfPacketSource("lo", (8000,), block_size=len(ring))
    src._skip_outgoing = skip_outgoing
    view = memoryview(ring)
    py_out: list[object] = []
    py_counts = src._walk_block(ring, view, 0, py_out)  # type: ignore[arg-type]
    batch, *native_counts = NATIVE.parse_block(1, view, 0, len(ring), skip_outgoing)
    assert tuple(native_counts[:4]) == py_counts[:2] + py_counts[3:5]
    assert native_counts[4] == py_counts[5]
    assert len(batch) == py_counts[2]
    assert batch.segments() == py_out
    want_packets = 4 if skip_outgoing else 5
    assert py_counts[0] == want_packets and py_counts[4] == 1
    assert len(py_out) == (3 if skip_outgoing else 4)
    assert py_counts[5] == 1_700_000_004 + (987_654_321 - 4) * 1e-9
    with pytest.raises(ValueError, match="past the ring"):
        NATIVE.parse_block(1, view, 8, len(ring), skip_outgoing)
