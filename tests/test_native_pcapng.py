"""The native pcapng walk (``sniffer._native.read_pcapng`` behind
``CaptureReader.segment_batches``) against the Python walk, the reference.

Random pcapng files — sections in both byte orders, interfaces with random
link types, resolutions, offsets and snaplens, enhanced/obsolete/simple packet
blocks carrying real TCP/IP frames and junk, statistics and custom blocks,
then truncated or corrupted anywhere — must give the same segments (the
identical timestamps), stats, offset, link types and error, message and offset.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import raw

from sniffer.capture.pcap import CaptureFileError, CaptureReader
from sniffer.core import native as core_native

NATIVE = core_native.NATIVE

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(
        NATIVE is None,
        reason=f"the native core is not available ({core_native.UNAVAILABLE or 'SPARSEETY_PURE'})",
    ),
]

SHB, IDB, OPB, SPB, NRB, ISB, EPB, CB = 0x0A0D0D0A, 1, 2, 3, 4, 5, 6, 0xBAD

_IP4 = raw(IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=40000, dport=8000, seq=7) / b"hello")
_IP6 = raw(IPv6(src="fe80::1", dst="2001:db8::2") / TCP(sport=8000, dport=1, flags="SA"))
# Frames by link type: 1 Ethernet, 101 raw IP, 228 IPv4, 0 BSD loopback (AF_INET), 147 (unsupported)
FRAMES: dict[int, list[bytes]] = {
    1: [raw(Ether() / IP(_IP4)), raw(Ether() / IPv6(_IP6))],
    101: [_IP4, _IP6],
    228: [_IP4],
    0: [struct.pack("<I", 2) + _IP4],
    147: [_IP4],
}
LINKTYPES = sorted(FRAMES)


def block(btype: int, body: bytes, order: str) -> bytes:
    body += b"\0" * (-len(body) % 4)
    length = 12 + len(body)
    return struct.pack(order + "II", btype, length) + body + struct.pack(order + "I", length)


def shb(order: str) -> bytes:
    return block(SHB, struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1), order)


def idb(
    order: str, linktype: int, snaplen: int, tsresol: int | None, tsoffset: int | None
) -> bytes:
    opts = b""
    if tsresol is not None:
        opts += struct.pack(order + "HH", 9, 1) + bytes([tsresol]) + b"\0\0\0"
    if tsoffset is not None:
        opts += struct.pack(order + "HHq", 14, 8, tsoffset)
    if opts:
        opts += struct.pack(order + "HH", 0, 0)
    return block(IDB, struct.pack(order + "HHI", linktype, 0, snaplen) + opts, order)


def packet(order: str, kind: int, ifid: int, units: int, frame: bytes, origlen: int) -> bytes:
    hi, lo = units >> 32, units & 0xFFFFFFFF
    if kind == EPB:
        head = struct.pack(order + "IIIII", ifid, hi, lo, len(frame), origlen)
    elif kind == OPB:
        head = struct.pack(order + "HHIIII", ifid & 0xFFFF, 0, hi, lo, len(frame), origlen)
    else:
        head = struct.pack(order + "I", origlen)
    return block(kind, head + frame, order)


frames = st.one_of(
    st.sampled_from([f for fs in FRAMES.values() for f in fs]),
    st.binary(max_size=80),
)
units = st.one_of(
    st.integers(0, 2**64 - 1),
    st.integers(1_600_000_000 * 10**9, 1_900_000_000 * 10**9),  # nanoseconds, ≥ 2^53
    st.integers(1_600_000_000 * 10**6, 1_900_000_000 * 10**6),  # microseconds
    st.integers(0, 10**6),
)
tsresols = st.one_of(
    st.none(), st.sampled_from([3, 6, 9, 15, 16, 19, 0x80 | 10, 0x80 | 30]), st.integers(0, 255)
)


@st.composite
def pcapng_files(draw: Any) -> bytes:
    order = draw(st.sampled_from("<>"))
    out = bytearray(shb(order))
    linktype = 1  # the last interface's: its frames are drawn more often
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["shb", "idb", "idb", "pkt", "pkt", "pkt", "pkt", "skip"]))
        if kind == "shb":
            order = draw(st.sampled_from("<>"))
            out += shb(order)
        elif kind == "idb":
            linktype = draw(st.sampled_from(LINKTYPES))
            out += idb(
                order,
                linktype,
                draw(st.sampled_from([0, 0, 20, 40, 65535])),
                draw(tsresols),
                draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
            )
        elif kind == "pkt":
            frame = draw(st.one_of(st.sampled_from(FRAMES[linktype]), frames))
            origlen = draw(st.one_of(st.just(len(frame)), st.integers(0, 200)))
            out += packet(
                order,
                draw(st.sampled_from([EPB, EPB, OPB, SPB])),
                draw(st.one_of(st.just(0), st.integers(0, 3))),
                draw(units),
                frame,
                origlen,
            )
        else:
            out += block(draw(st.sampled_from([ISB, NRB, CB])), draw(st.binary(max_size=24)), order)
    if draw(st.integers(0, 2)) == 0:  # corrupt a byte (a third of the files)
        at = draw(st.integers(0, len(out) - 1))
        out[at] = draw(st.integers(0, 255))
    if draw(st.integers(0, 2)) == 0:  # truncate (a third)
        del out[draw(st.integers(0, len(out))) :]
    return bytes(out)


def _walks(data: bytes, max_packets: int) -> tuple[Any, Any]:
    """(reference walk, native batches) of the same bytes: what each gives."""
    results = []
    for native in (False, True):
        try:
            reader = CaptureReader("x.pcapng", data, "pcapng", compressed=False)
        except CaptureFileError as exc:
            results.append(("raises", str(exc), exc.offset))
            continue
        if native:
            batches = list(reader.segment_batches(max_packets))
            segs = [s for b in batches for s in b.segments()]
        else:
            segs = list(reader)
        err = reader.error
        results.append(
            (
                segs,
                [s.ts.hex() for s in segs],
                reader.stats,
                reader.offset,
                reader.linktypes,
                None if err is None else (str(err), err.offset),
            )
        )
    return results[0], results[1]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pcapng_files(), st.sampled_from([1, 2, 3, 7, 4096]))
def test_random_pcapng_files_walk_alike(data: bytes, max_packets: int) -> None:
    pure, nat = _walks(data, max_packets)
    assert nat == pure


def test_nanosecond_timestamps_are_pythons_division() -> None:
    # float(v) / 1e9 is one ulp off for this count; Python's v / 10**9 is not
    v = 2_112_567_105_869_076_853
    assert float(v) / 1e9 != v / 10**9
    data = shb("<") + idb("<", 101, 0, 9, None) + packet("<", EPB, 0, v, _IP4, len(_IP4))
    pure, nat = _walks(data, 4096)
    assert nat == pure
    assert nat[0][0].ts == v / 10**9


def test_huge_divisors_and_offsets_agree() -> None:
    # 10**19 is above 2^53: that interface's packets are timed by Python
    order = ">"
    data = shb(order) + idb(order, 1, 0, 19, -(2**62)) + idb(order, 101, 0, 0x80 | 40, 2**62)
    for i in range(5):
        data += packet(order, EPB, i % 2, 2**63 + i, FRAMES[1][0] if i % 2 == 0 else _IP4, 64)
    pure, nat = _walks(data, 2)
    assert nat == pure and len(nat[0]) >= 2


def test_runs_of_packets_come_in_full_batches() -> None:
    # not one call (or batch) per packet: the native walk fills each batch
    data = shb("<") + idb("<", 101, 0, None, None)
    data += b"".join(packet("<", EPB, 0, 10**12 + i, _IP4, len(_IP4)) for i in range(100))
    data += block(ISB, b"\0" * 8, "<")
    reader = CaptureReader("x.pcapng", data, "pcapng", compressed=False)
    sizes = [len(b) for b in reader.segment_batches(32)]
    assert sizes == [32, 32, 32, 4]
    assert reader.stats.packets == 100 and reader.offset == len(data) and reader.error is None
