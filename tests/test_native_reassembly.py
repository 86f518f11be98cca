"""Both cores identical: the native link layer and TCP reassembly
(``sniffer._native``, Rust) against the Python reference
(``sniffer.capture.packet``, ``sniffer.core.reassembly``).

* every bundled capture (``pcaps/**``, the fault fixtures, the peer corpus,
  the HTTP/2 captures): the same segments, the same reader stats and errors,
  the same flow event sequences (timestamps compared as floats, exactly);
* (replay with each core gives byte-identical stores: tests/test_native_stores.py);
* generated segment sequences (reordering, duplicates, overlaps with the same
  and with different bytes, gaps, ACKs ahead of data, SYN/FIN/RST, port reuse,
  sequence numbers near 2**32, an id source that fails, capture gaps, idle
  sweeps, checkpoints and adoption) give the same events and counters;
* hostile frames (random bytes, truncations and mutations of real frames,
  IHL < 5, IPv6 extension header chains) give the same segment or None, and
  never crash.

Everything here needs the extension: the tests are skipped without it, and
fail when CI is true (the ``native`` marker, tests/conftest.py).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sniffer.capture.packet import SUPPORTED_LINKTYPES, parse_frame
from sniffer.capture.pcap import read_capture
from sniffer.core import native as core_native
from sniffer.core.events import ACK, FIN, PSH, RST, SYN, CaptureGap, FlowEvent, Segment
from sniffer.core.pipeline import Pipeline, PipelineConfig
from sniffer.core.reassembly import Reassembler

REPO = Path(__file__).resolve().parent.parent
NATIVE = core_native.NATIVE

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(
        NATIVE is None,
        reason=f"the native core is not available ({core_native.UNAVAILABLE or 'SPARSEETY_PURE'})",
    ),
]

MASK = 0xFFFFFFFF


def captures() -> list[Path]:
    found = [
        p
        for root in (REPO / "pcaps", REPO / "tests" / "data")
        for p in root.rglob("*")
        if p.is_file() and p.name.endswith((".pcap", ".pcapng", ".pcap.gz"))
    ]
    return sorted(found)


def _native_reassembler(**kw: Any) -> core_native.NativeReassembler:
    return core_native.NativeReassembler(**kw)


def _python_events(segs: list[Segment], r: Reassembler) -> list[FlowEvent]:
    out: list[FlowEvent] = []
    for s in segs:
        out += r.feed(s)
    return out


def _same(a: list[FlowEvent], b: list[FlowEvent]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert type(x) is type(y) and x == y, (x, y)
        assert x.ts.hex() == y.ts.hex()  # the identical float


# ---------------------------------------------------------------- captures


def test_the_bundled_captures_are_all_found() -> None:
    names = {p.name for p in captures()}
    assert len(names) > 60
    assert any("faults" in str(p) for p in captures())
    assert any("peer-pcaps" in str(p) for p in captures())
    assert any(n.startswith("h2") for n in names)


@pytest.mark.parametrize("path", captures(), ids=lambda p: str(p.relative_to(REPO)))
def test_captures_give_the_same_segments_and_flow_events(path: Path) -> None:
    pure = read_capture(path)
    segs = list(pure)
    nat = read_capture(path)
    batches = list(nat.segment_batches(max_packets=97))  # odd size: batches end anywhere
    assert [s for b in batches for s in b.segments()] == segs
    assert nat.stats == pure.stats and nat.offset == pure.offset
    assert str(nat.error) == str(pure.error)

    for ports in (frozenset(), frozenset({8000, 8080, 11434, 80})):
        py = Reassembler(server_ports=ports, hole_timeout=0.05)
        na = _native_reassembler(server_ports=ports, hole_timeout=0.05)
        expected = _python_events(segs, py)
        got: list[FlowEvent] = []
        for b in batches:
            events, fed, skipped, errors = na.feed_batch(b)
            assert (fed, skipped, errors) == (len(b), 0, [])
            got += events
        last = segs[-1].ts if segs else 0.0
        expected += py.expire(last + 0.5)
        got += na.expire(last + 0.5)
        expected += py.flush(last + 1)
        got += na.flush(last + 1)
        _same(expected, got)
        assert na.stats == py.stats
        assert na.open_connections == py.open_connections == 0


def test_replay_runs_the_native_core_unless_told_not_to() -> None:
    code = "from sniffer.core.pipeline import Pipeline; print(Pipeline().native)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(core_native.PURE_ENV, None)
    run = [sys.executable, "-c", code]
    assert subprocess.run(run, env=env, capture_output=True, text=True).stdout.strip() == "True"
    env[core_native.PURE_ENV] = "1"
    assert subprocess.run(run, env=env, capture_output=True, text=True).stdout.strip() == "False"


# ------------------------------------------------------ generated segments

CLI = ("127.0.0.1", 43210)
SRV = ("127.0.0.1", 8000)
CLI6 = ("::1", 43210)
SRV6 = ("::1", 8000)

isns = st.one_of(st.integers(0, MASK), st.integers(MASK - 64, MASK), st.integers(0, 64))


@st.composite
def conversations(draw: st.DrawFn) -> list[Segment | CaptureGap | tuple[str, float]]:
    """Segments of one or two connections, cut, reordered, duplicated, lost,
    overlapped with other bytes, with ACKs, FIN/RST, port reuse; plus capture
    gaps and idle sweeps (``("expire", ts)``)."""
    items: list[Segment | CaptureGap | tuple[str, float]] = []
    ts = 1.0
    six = draw(st.booleans())
    cli, srv = (CLI6, SRV6) if six else (CLI, SRV)
    for _conn in range(draw(st.integers(1, 2))):
        cisn, sisn = draw(isns), draw(isns)
        handshake = draw(st.booleans())
        req = draw(st.binary(min_size=0, max_size=120))
        resp = draw(st.binary(min_size=1, max_size=200))
        pieces: list[Segment] = []
        if handshake:
            pieces.append(Segment(ts, *cli, *srv, cisn, 0, SYN, b""))
            pieces.append(Segment(ts, *srv, *cli, sisn, (cisn + 1) & MASK, SYN | ACK, b""))
        for sender, isn, peer_isn, body in ((0, cisn, sisn, req), (1, sisn, cisn, resp)):
            src, dst = (cli, srv) if sender == 0 else (srv, cli)
            pos = 0
            while pos < len(body):
                n = draw(st.integers(1, max(1, len(body) - pos)))
                payload = body[pos : pos + n]
                if draw(st.integers(0, 9)) == 0:  # a copy with other bytes
                    payload = bytes(b ^ 0x5A for b in payload)
                seq = (isn + 1 + pos) & MASK
                ack = (peer_isn + 1 + draw(st.integers(0, 300))) & MASK
                pieces.append(Segment(ts, *src, *dst, seq, ack, ACK | PSH, payload))
                if draw(st.integers(0, 5)) == 0:  # an overlapping retransmission
                    back = draw(st.integers(0, pos))
                    pieces.append(
                        Segment(ts, *src, *dst, (isn + 1 + back) & MASK, ack, ACK, body[back:pos])
                    )
                pos += n
            end_flag = draw(st.sampled_from([0, FIN | ACK, FIN | ACK, RST]))
            if end_flag:
                seq = (isn + 1 + len(body)) & MASK
                pieces.append(Segment(ts, *src, *dst, seq, 0, end_flag, b""))
        # reorder a little, lose some, duplicate some
        order = draw(st.permutations(range(len(pieces)))) if draw(st.booleans()) else None
        seq_pieces = [pieces[i] for i in order] if order is not None else pieces
        for p in seq_pieces:
            ts += draw(st.sampled_from([0.0, 0.001, 0.01, 0.7, 2.5]))
            kind = draw(st.integers(0, 19))
            if kind == 0:
                continue  # lost
            p = p._replace(ts=ts)
            items.append(p)
            if kind == 1:
                items.append(p)  # duplicate
            elif kind == 2:
                items.append(CaptureGap(ts, 3, draw(st.sampled_from(["kernel", "queue", "ebpf"]))))
            elif kind == 3:
                items.append(("expire", ts + draw(st.sampled_from([0.5, 5.0, 400.0]))))
    return items


def _drive(r: Any, items: list[Any], native: bool) -> list[Any]:
    """Feed items one batch at a time (native: runs of segments in one call)."""
    out: list[Any] = []
    run: list[Segment] = []

    def flush_run() -> None:
        if not run:
            return
        if native:
            events, _fed, _skipped, errors = r.feed_batch(NATIVE.segment_batch(run))
            pos = 0
            for at, ts, msg in errors:
                out.extend(events[pos:at])
                out.append(("error", ts, msg))
                pos = at
            out.extend(events[pos:])
        else:
            for s in run:
                try:
                    out.extend(r.feed(s))
                except Exception as exc:
                    out.append(("error", s.ts, f"{type(exc).__name__}: {exc}"))
        run.clear()

    for it in items:
        if isinstance(it, Segment):
            run.append(it)
            continue
        flush_run()
        if isinstance(it, CaptureGap):
            out += r.capture_gap(it)
        else:
            out += r.expire(it[1])
    flush_run()
    out += r.flush(1e6)
    return out


class FlakyIds:
    """An id source that fails every third call (the store's id blocks, unavailable)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        if self.n % 3 == 0:
            raise LookupError("no id block")
        return 100 + self.n


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    st.sampled_from([frozenset(), frozenset({8000}), frozenset({43210})]),
    st.sampled_from([1 << 20, 64]),  # max_buffer: the cap hit with out-of-order data
    st.booleans(),
    st.sampled_from([1, 2, 100_000]),  # max_connections: eviction
)
def test_generated_conversations_give_identical_events(
    items: list[Any], ports: frozenset[int], max_buffer: int, flaky: bool, max_conns: int
) -> None:
    kw: dict[str, Any] = {
        "server_ports": ports,
        "max_buffer": max_buffer,
        "max_connections": max_conns,
    }
    if flaky:
        py = Reassembler(conn_ids=FlakyIds(), **kw)
        na = _native_reassembler(conn_ids=FlakyIds(), **kw)
    else:
        py = Reassembler(conn_id_base=7, **kw)
        na = _native_reassembler(conn_id_base=7, **kw)
    expected = _drive(py, items, native=False)
    got = _drive(na, items, native=True)
    assert got == expected
    assert [type(e) for e in got] == [type(e) for e in expected]
    assert na.stats == py.stats


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(0, 40), st.floats(0, 120))
def test_checkpoint_and_adopt_agree(items: list[Any], cut_at: int, later: float) -> None:
    """Checkpoint mid-way, forget, adopt into a new instance, go on: same events."""
    segs = [it for it in items if isinstance(it, Segment)]
    first, rest = segs[:cut_at], segs[cut_at:]
    results = []
    for native in (False, True):
        r: Any = _native_reassembler() if native else Reassembler()
        events = _drive_segments(r, first, native)
        now = (first[-1].ts if first else 0.0) + later
        handed = []
        for conn in sorted({e.conn for e in events}):
            seqs = r.checkpoint(conn, now)
            if seqs is not None:
                r.forget(conn)
                handed.append((conn, seqs))
        r2: Any = _native_reassembler() if native else Reassembler()
        for conn, (c2s, s2c) in handed:
            r2.adopt(conn, now, CLI, SRV, c2s, s2c)
        events += _drive_segments(r2, rest, native) + r2.flush(1e6) + r.flush(1e6)
        results.append((events, handed, r.open_connections, r2.open_connections))
    assert results[0] == results[1]


def _drive_segments(r: Any, segs: list[Segment], native: bool) -> list[Any]:
    if native:
        return list(r.feed_batch(NATIVE.segment_batch(segs))[0]) if segs else []
    return _python_events(segs, r)


def test_adopt_with_a_malformed_checkpoint_entry_matches_nothing() -> None:
    """A non-canonical address text or a port out of range: the adopted
    connection is never found by a segment (a new one opens), in both cores."""
    outs = []
    for r in (Reassembler(), _native_reassembler()):
        r.adopt(5, 1.0, ("::0:1", 1), ("127.0.0.1", 70000), 10, -1)
        r.adopt(6, 1.0, ("::1", 2), ("::1", 3), 10, 20)
        assert r.open_connections == 2
        events = r.feed(Segment(2.0, "::1", 1, "127.0.0.1", 70000 & 0xFFFF, 10, 0, ACK, b"x"))
        events += r.feed(Segment(2.1, "::1", 2, "::1", 3, 15, 0, ACK, b"y"))
        events += r.flush(3.0)
        outs.append(events)
    assert outs[0] == outs[1]
    assert outs[0][0].conn == 1 and outs[0][0].syn_seen is False  # opened anew
    assert any(getattr(e, "data", None) == b"y" and e.conn == 6 for e in outs[0])


def test_pipeline_records_a_dropped_segment_like_the_python() -> None:
    def broken() -> int:
        raise LookupError("no ids")

    outs = []
    for native in (False, True):
        pipe = Pipeline(PipelineConfig(conn_ids=broken, native=native))
        segs = [
            Segment(1.0, *CLI, *SRV, 1, 0, SYN, b""),
            Segment(1.1, *CLI, *SRV, 2, 0, ACK, b"GET / HTTP/1.1\r\n\r\n"),
        ]
        if native:
            out = pipe.feed_batch(NATIVE.segment_batch(segs))
        else:
            out = [e for s in segs for e in pipe.feed(s)]
        outs.append((out, pipe.internal_errors, pipe.segments))
    assert outs[0] == outs[1]
    assert outs[0][1] == 2 and "LookupError: no ids (segment dropped)" in outs[0][0][0].message


def test_feed_batch_filters_ports_and_shares_like_replay() -> None:
    from sniffer.runtime.replay import Shares

    segs = [
        Segment(1.0 + i, "127.0.0.1", 40000 + i, "127.0.0.1", 8000 + (i % 3), 1, 0, ACK, b"x")
        for i in range(40)
    ]
    batch = NATIVE.segment_batch(segs)
    fed = []
    for k in range(3):
        pipe = Pipeline(PipelineConfig(only_ports=frozenset({8000, 8001}), native=True))
        ref = Pipeline(PipelineConfig(only_ports=frozenset({8000, 8001}), native=False))
        # two calls: the split goes on where the first call left it
        got = pipe.feed_batch(batch, 5, 20, k, 3) + pipe.feed_batch(batch, 20, 35, k, 3)
        shares = Shares(3)
        want = [e for s in segs[5:35] if shares.take(s.sport, s.dport) == k for e in ref.feed(s)]
        assert got == want
        assert (pipe.segments, pipe.skipped) == (ref.segments, ref.skipped)
        assert pipe.skipped > 0
        fed.append(pipe.segments + pipe.skipped)
    assert fed == [10, 10, 10]  # 30 connections of one segment each: 10 per worker


def test_shares_follow_the_work_not_a_hash() -> None:
    """One long connection and many short ones: the long one's worker gets no
    new connection until the others have caught up with it (by segments)."""
    from sniffer.runtime.replay import Shares

    shares = Shares(2)
    assert [shares.take(50000, 8000) for _ in range(10)] == [0] * 10
    assert [shares.take(50001 + i, 8000) for i in range(10)] == [1] * 10
    assert shares.take(50100, 8000) == 0  # 10 segments each: fewer port pairs wins
    assert shares.take(8000, 50000) == 0  # the other direction of the first connection
    segs = [
        Segment(float(i), "127.0.0.1", p, "127.0.0.1", 8000, 1, 0, ACK, b"x")
        for i, p in enumerate([50000] * 10 + list(range(50001, 50011)) + [50100, 50000])
    ]
    got = []
    for k in range(2):
        pipe = Pipeline(PipelineConfig(native=True))
        pipe.feed_batch(NATIVE.segment_batch(segs), 0, None, k, 2)
        got.append(pipe.segments)
    assert got == [12, 10]


# ----------------------------------------------------------- hostile frames


def _ip4_tcp(payload: bytes = b"data", ihl: int = 5, total: int | None = None) -> bytes:
    opts = b"\x01" * (max(ihl, 5) * 4 - 20)
    tot = 20 + len(opts) + 20 + len(payload) if total is None else total
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x40 | ihl, 0, tot, 0, 0, 64, 6, 0, b"\x7f\0\0\1", b"\x7f\0\0\2"
    )
    tcp = struct.pack("!HHIIBBHHH", 8000, 43210, 1, 2, 0x50, ACK, 0, 0, 0)
    return ip + opts + tcp + payload


def _ip6_tcp(ext: bytes, nh: int, payload: bytes = b"data", plen: int | None = None) -> bytes:
    n = len(ext) + 20 + len(payload) if plen is None else plen
    head = struct.pack("!IHBB16s16s", 6 << 28, n, nh, 64, b"\0" * 15 + b"\1", b"\0" * 15 + b"\1")
    tcp = struct.pack("!HHIIBBHHH", 8000, 43210, 1, 2, 0x50, ACK, 0, 0, 0)
    return head + ext + tcp + payload


ETH = b"\0" * 12
REAL_FRAMES = [
    ETH + b"\x08\x00" + _ip4_tcp(),
    ETH + b"\x81\x00\x00\x01\x08\x00" + _ip4_tcp(b"vlan"),
    ETH + b"\x08\x00" + _ip4_tcp(b"opts", ihl=7),
    ETH + b"\x86\xdd" + _ip6_tcp(b"\x06\x00" + b"\0" * 6, 0),
    ETH + b"\x86\xdd" + _ip6_tcp(b"\x3c\x00" + b"\0" * 6 + b"\x06\x00" + b"\0" * 6, 0),
]


def _compare_frames(linktype: int, frames: list[bytes]) -> None:
    ts = [1.0 + i / 7 for i in range(len(frames))]
    data = b"".join(frames)
    bounds: list[int] = []
    pos = 0
    for f in frames:
        bounds += [pos, pos + len(f)]
        pos += len(f)
    got = NATIVE.parse_frames(linktype, data, ts, bounds).segments()
    want = [s for s in (parse_frame(linktype, f, t) for f, t in zip(frames, ts, strict=True)) if s]
    assert got == want


@pytest.mark.parametrize(
    "frame",
    [
        _ip4_tcp(ihl=4),
        _ip4_tcp(ihl=0),
        _ip4_tcp(ihl=15),
        _ip4_tcp(total=39),
        _ip4_tcp(total=0),
        _ip4_tcp(total=0xFFFF),
        _ip6_tcp(b"\0\xff" + b"\0" * 6, 0),  # a 2 KiB hop-by-hop header in a short frame
        _ip6_tcp(b"\0\0" + b"\0" * 6, 0) * 1,
        _ip6_tcp(b"".join(b"\0\0" + b"\0" * 6 for _ in range(17)), 0),  # a loop of 17
        _ip6_tcp(b"\x06\x00" + b"\0" * 6, 44),  # a fragment header
        _ip6_tcp(b"\x06\x01" + b"\0" * 2, 51),  # AH
        _ip6_tcp(b"", 6, plen=3),
    ],
)
def test_hostile_ip_packets(frame: bytes) -> None:
    for linktype in (101, 228, 229):
        _compare_frames(linktype, [frame, frame[:-1], frame[:20], frame[:1], b""])


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(sorted(SUPPORTED_LINKTYPES | {2, 999})),
    st.lists(
        st.one_of(
            st.binary(max_size=120),
            st.builds(
                lambda f, i, b: f[:i] + bytes([b]) + f[i + 1 :],
                st.sampled_from(REAL_FRAMES),
                st.integers(0, 120),
                st.integers(0, 255),
            ),
            st.builds(lambda f, n: f[:n], st.sampled_from(REAL_FRAMES), st.integers(0, 120)),
            st.builds(
                lambda f, n: f[n:], st.sampled_from(REAL_FRAMES), st.sampled_from([4, 14, 16, 20])
            ),
        ),
        max_size=12,
    ),
)
def test_random_and_mutated_frames_parse_alike(linktype: int, frames: list[bytes]) -> None:
    _compare_frames(linktype, frames)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=16, max_size=16))
def test_ipv6_text_is_inet_ntop(raw: bytes) -> None:
    frame = _ip6_tcp(b"", 6)
    frame = frame[:8] + raw + raw + frame[40:]
    _compare_frames(229, [frame])


def test_read_pcap_reports_bad_records_like_the_reader(tmp_path: Path) -> None:
    head = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    rec = ETH + b"\x08\x00" + _ip4_tcp()
    good = struct.pack("<IIII", 5, 250_000, len(rec), len(rec)) + rec
    cases = {
        "short-header": head + good + b"\0" * 7,
        "caplen": head + good + struct.pack("<IIII", 5, 0, 300_000, 10),
        "cut-record": head + good + struct.pack("<IIII", 5, 0, 50, 50) + b"\0" * 10,
    }
    for name, raw in cases.items():
        path = tmp_path / f"{name}.pcap"
        path.write_bytes(raw)
        pure = read_capture(path)
        segs = list(pure)
        nat = read_capture(path)
        assert [s for b in nat.segment_batches() for s in b.segments()] == segs
        assert str(nat.error) == str(pure.error) and pure.error is not None
        assert nat.stats == pure.stats and nat.offset == pure.offset
