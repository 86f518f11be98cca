"""Tests for sniffer.capture.packet: link layers, IPv4/IPv6, TCP, bad input."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop
from scapy.layers.l2 import ARP, CookedLinux, Dot1AD, Dot1Q, Ether, Loopback
from scapy.packet import Packet, raw

from sniffer.capture import packet
from sniffer.capture.packet import (
    LINKTYPE_ETHERNET,
    LINKTYPE_IPV4,
    LINKTYPE_IPV6,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    SUPPORTED_LINKTYPES,
    UnsupportedLinkType,
    frame_parser,
    frame_parser_at,
    linktype_name,
    parse_frame,
)
from sniffer.core.events import ACK, FIN, PSH, SYN, Segment

PAYLOAD = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


def tcp4(payload: bytes = PAYLOAD, **tcp: Any) -> Packet:
    fields: dict[str, Any] = {"sport": 40000, "dport": 8000, "seq": 1000, "ack": 2000}
    fields.update(tcp)
    fields.setdefault("flags", "PA")
    return IP(src="127.0.0.1", dst="10.1.2.3") / TCP(**fields) / payload


def tcp6(payload: bytes = PAYLOAD) -> Packet:
    return IPv6(src="::1", dst="fe80::1") / TCP(sport=5, dport=6, seq=7, ack=8, flags="A") / payload


def check4(seg: Segment | None, payload: bytes = PAYLOAD, ts: float = 12.5) -> None:
    assert seg is not None
    assert seg == Segment(ts, "127.0.0.1", 40000, "10.1.2.3", 8000, 1000, 2000, PSH | ACK, payload)
    assert type(seg.payload) is bytes


def check6(seg: Segment | None, payload: bytes = PAYLOAD) -> None:
    assert seg is not None
    assert seg == Segment(1.0, "::1", 5, "fe80::1", 6, 7, 8, ACK, payload)
    assert type(seg.payload) is bytes


def eth(**fields: Any) -> Packet:
    """Ethernet with explicit addresses (scapy would otherwise resolve routes)."""
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", **fields)


def sll2(proto: int, body: bytes) -> bytes:
    return struct.pack("!HHIHBB8s", proto, 0, 1, 772, 0, 6, b"") + body


# ---------------------------------------------------------------------------
# Ethernet
# ---------------------------------------------------------------------------


def test_ethernet_ipv4_tcp() -> None:
    frame = raw(eth() / tcp4())
    check4(parse_frame(LINKTYPE_ETHERNET, frame, 12.5))
    check4(frame_parser(LINKTYPE_ETHERNET)(frame, 12.5))
    check4(frame_parser_at(LINKTYPE_ETHERNET)(b"junk" + frame + b"tail", 12.5, 4, 4 + len(frame)))


def test_ethernet_padding_is_cut_by_ip_length() -> None:
    frame = raw(eth() / tcp4(b"", flags="A"))
    assert len(frame) == 54
    padded = frame + b"\xee" * 6  # minimum Ethernet frame, padding after the IP packet
    seg = parse_frame(LINKTYPE_ETHERNET, padded, 0.0)
    assert seg is not None and seg.payload == b"" and seg.flags == ACK
    seg = parse_frame(LINKTYPE_ETHERNET, raw(eth() / tcp4(b"xy")) + b"\0" * 4, 0.0)
    assert seg is not None and seg.payload == b"xy"


def test_snaplen_cut_takes_what_is_there() -> None:
    frame = raw(eth() / tcp4())
    seg = parse_frame(LINKTYPE_ETHERNET, frame[:-10], 12.5)
    check4(seg, PAYLOAD[:-10])


def test_ip_total_length_zero_means_to_end_of_frame() -> None:
    # TSO / BIG TCP captures carry a zero IPv4 total length.
    ip = bytearray(raw(tcp4()))
    ip[2:4] = b"\0\0"
    check4(parse_frame(LINKTYPE_RAW, bytes(ip), 12.5))


def test_tcp_options_are_skipped() -> None:
    pkt = tcp4(options=[("MSS", 1460), ("NOP", None), ("NOP", None), ("Timestamp", (1, 2))])
    check4(parse_frame(LINKTYPE_ETHERNET, raw(eth() / pkt), 12.5))


@pytest.mark.parametrize(
    "tags",
    [
        [Dot1Q(vlan=10)],
        [Dot1AD(vlan=20), Dot1Q(vlan=10)],  # QinQ
        [Dot1Q(vlan=1), Dot1Q(vlan=2), Dot1Q(vlan=3)],
    ],
)
def test_vlan_tags(tags: list[Packet]) -> None:
    stack: Packet = eth()
    for tag in tags:
        stack = stack / tag
    check4(parse_frame(LINKTYPE_ETHERNET, raw(stack / tcp4()), 12.5))
    check6(parse_frame(LINKTYPE_ETHERNET, raw(stack / tcp6()), 1.0))


def test_ethernet_ipv6() -> None:
    check6(parse_frame(LINKTYPE_ETHERNET, raw(eth() / tcp6()), 1.0))


@pytest.mark.parametrize(
    "frame",
    [
        raw(eth() / ARP()),
        raw(eth() / IP() / UDP(sport=1, dport=2) / (b"x" * 40)),
        raw(eth() / IPv6() / UDP() / (b"x" * 40)),
        raw(eth(type=0x88CC) / (b"\0" * 60)),  # LLDP
        raw(eth(type=100) / (b"\0" * 60)),  # 802.3 length field
    ],
    ids=["arp", "udp4", "udp6", "lldp", "802.3"],
)
def test_non_tcp_is_none(frame: bytes) -> None:
    assert parse_frame(LINKTYPE_ETHERNET, frame, 0.0) is None


# ---------------------------------------------------------------------------
# IPv4 details
# ---------------------------------------------------------------------------


def test_ipv4_fragments() -> None:
    later = raw(eth() / IP(src="1.2.3.4", dst="5.6.7.8", frag=185, proto=6) / (b"\0" * 40))
    assert parse_frame(LINKTYPE_ETHERNET, later, 0.0) is None
    first = tcp4()
    first[IP].flags = "MF"
    seg = parse_frame(LINKTYPE_ETHERNET, raw(eth() / first), 12.5)
    check4(seg)  # carries the TCP header: yielded, the rest shows up as a gap


def test_ipv4_options() -> None:
    pkt = tcp4()
    pkt[IP].options = [b"\x01\x01\x01\x00"]  # NOP NOP NOP EOL: IHL 6
    frame = raw(eth() / pkt)
    assert frame[14] == 0x46
    check4(parse_frame(LINKTYPE_ETHERNET, frame, 12.5))
    check4(parse_frame(LINKTYPE_ETHERNET, frame + b"\0" * 6, 12.5))  # padding cut too
    check4(parse_frame(LINKTYPE_RAW, frame[14:], 12.5))


def test_bad_ipv4_headers_are_none() -> None:
    ip = bytearray(raw(tcp4()))
    bad_ihl = bytearray(ip)
    bad_ihl[0] = 0x44  # IHL 4 < 5
    assert parse_frame(LINKTYPE_RAW, bytes(bad_ihl), 0.0) is None
    short_total = bytearray(ip)
    short_total[2:4] = struct.pack("!H", 30)
    assert parse_frame(LINKTYPE_RAW, bytes(short_total), 0.0) is None
    bad_doff = bytearray(ip)
    bad_doff[32] = 0x40  # TCP data offset 4 < 5
    assert parse_frame(LINKTYPE_RAW, bytes(bad_doff), 0.0) is None
    huge_doff = bytearray(raw(tcp4(b"")))
    huge_doff[32] = 0xF0  # options run past the end of the packet
    assert parse_frame(LINKTYPE_RAW, bytes(huge_doff), 0.0) is None


def test_every_truncated_header_is_none() -> None:
    for pkt, linktype in [
        (raw(eth() / tcp4(b"")), LINKTYPE_ETHERNET),
        (raw(eth() / Dot1Q() / tcp6(b"")), LINKTYPE_ETHERNET),
        (raw(tcp6(b"")), LINKTYPE_RAW),
        (sll2(0x0800, raw(tcp4(b""))), LINKTYPE_LINUX_SLL2),
    ]:
        for cut in range(len(pkt)):
            assert parse_frame(linktype, pkt[:cut], 0.0) is None, (linktype, cut)
        assert parse_frame(linktype, pkt, 0.0) is not None


# ---------------------------------------------------------------------------
# IPv6 details
# ---------------------------------------------------------------------------


def test_ipv6_extension_headers_are_skipped() -> None:
    pkt = (
        IPv6(src="::1", dst="fe80::1")
        / IPv6ExtHdrHopByHop()
        / IPv6ExtHdrDestOpt(options=[])
        / TCP(sport=5, dport=6, seq=7, ack=8, flags="A")
        / PAYLOAD
    )
    check6(parse_frame(LINKTYPE_ETHERNET, raw(eth() / pkt), 1.0))
    check6(parse_frame(LINKTYPE_ETHERNET, raw(eth() / pkt) + b"\0" * 8, 1.0))


def test_ipv6_fragment_is_none() -> None:
    pkt = IPv6(src="::1", dst="::1") / IPv6ExtHdrFragment() / TCP() / PAYLOAD
    assert parse_frame(LINKTYPE_RAW, raw(pkt), 0.0) is None


def test_ipv6_payload_length_cuts_padding_and_zero_means_to_end() -> None:
    frame = raw(tcp6())
    check6(parse_frame(LINKTYPE_IPV6, frame + b"pad", 1.0))
    jumbo = bytearray(frame)
    jumbo[4:6] = b"\0\0"
    check6(parse_frame(LINKTYPE_IPV6, bytes(jumbo), 1.0))


def test_ipv6_address_text() -> None:
    pkt = IPv6(src="2001:db8::1", dst="::ffff:127.0.0.1") / TCP() / b""
    seg = parse_frame(LINKTYPE_RAW, raw(pkt), 0.0)
    assert seg is not None
    assert seg.src == "2001:db8::1"
    assert seg.dst == "::ffff:127.0.0.1"


# ---------------------------------------------------------------------------
# other link types
# ---------------------------------------------------------------------------


def test_linux_sll() -> None:
    frame = raw(CookedLinux(pkttype=0, lladdrtype=772, lladdrlen=6, proto=0x0800) / tcp4())
    check4(parse_frame(LINKTYPE_LINUX_SLL, frame, 12.5))
    frame6 = raw(CookedLinux(proto=0x86DD) / tcp6())
    check6(parse_frame(LINKTYPE_LINUX_SLL, frame6, 1.0))
    assert parse_frame(LINKTYPE_LINUX_SLL, raw(CookedLinux(proto=0x0806) / ARP()), 0.0) is None


def test_linux_sll2() -> None:
    check4(parse_frame(LINKTYPE_LINUX_SLL2, sll2(0x0800, raw(tcp4())), 12.5))
    check6(parse_frame(LINKTYPE_LINUX_SLL2, sll2(0x86DD, raw(tcp6())), 1.0))
    assert parse_frame(LINKTYPE_LINUX_SLL2, sll2(0x0806, raw(ARP())), 0.0) is None


@pytest.mark.parametrize("order", ["<", ">"])
def test_null_loopback_either_byte_order(order: str) -> None:
    check4(parse_frame(LINKTYPE_NULL, struct.pack(order + "I", 2) + raw(tcp4()), 12.5))
    for family in (24, 28, 30):
        frame = struct.pack(order + "I", family) + raw(tcp6())
        check6(parse_frame(LINKTYPE_NULL, frame, 1.0))
    assert parse_frame(LINKTYPE_NULL, struct.pack(order + "I", 7) + raw(tcp4()), 0.0) is None


def test_null_loopback_scapy() -> None:
    check4(parse_frame(LINKTYPE_NULL, raw(Loopback() / tcp4()), 12.5))


def test_loop_is_network_order() -> None:
    check4(parse_frame(LINKTYPE_LOOP, struct.pack("!I", 2) + raw(tcp4()), 12.5))
    check6(parse_frame(LINKTYPE_LOOP, struct.pack("!I", 24) + raw(tcp6()), 1.0))
    assert parse_frame(LINKTYPE_LOOP, struct.pack("<I", 2) + raw(tcp4()), 0.0) is None


@pytest.mark.parametrize("linktype", [LINKTYPE_RAW, 12, 14, LINKTYPE_IPV4, LINKTYPE_IPV6])
def test_raw_ip(linktype: int) -> None:
    check4(parse_frame(linktype, raw(tcp4()), 12.5))
    check6(parse_frame(linktype, raw(tcp6()), 1.0))
    assert parse_frame(linktype, b"\x50" + b"\0" * 59, 0.0) is None  # version 5
    assert parse_frame(linktype, b"", 0.0) is None


# ---------------------------------------------------------------------------
# API details
# ---------------------------------------------------------------------------


def test_unknown_link_type() -> None:
    with pytest.raises(UnsupportedLinkType) as info:
        frame_parser(105)  # 802.11
    assert isinstance(info.value, ValueError)
    assert info.value.linktype == 105
    with pytest.raises(UnsupportedLinkType):
        frame_parser_at(9999)
    assert parse_frame(105, raw(eth() / tcp4()), 0.0) is None
    assert linktype_name(1) == "ETHERNET"
    assert linktype_name(105) == "LINKTYPE_105"


def test_every_supported_link_type_has_parsers() -> None:
    for linktype in SUPPORTED_LINKTYPES:
        assert frame_parser(linktype)(b"", 0.0) is None
        assert frame_parser_at(linktype)(b"", 0.0, 0, 0) is None
        assert frame_parser_at(linktype) is frame_parser(linktype)


def test_memoryview_input_gives_bytes_payload() -> None:
    frame = raw(eth() / tcp4())
    check4(parse_frame(LINKTYPE_ETHERNET, memoryview(frame), 12.5))
    writable = memoryview(bytearray(b"\xff" * 8 + frame))[8:]  # like an mmap'd ring slot
    check4(frame_parser(LINKTYPE_ETHERNET)(writable, 12.5))
    check6(parse_frame(LINKTYPE_ETHERNET, memoryview(bytearray(raw(eth() / tcp6()))), 1.0))


def test_flags_byte_is_passed_through() -> None:
    seg = parse_frame(LINKTYPE_RAW, raw(tcp4(b"", flags="FSRPAUEC")), 0.0)
    assert seg is not None and seg.flags == 0xFF
    seg = parse_frame(LINKTYPE_RAW, raw(tcp4(b"", flags="S")), 0.0)
    assert seg is not None and seg.flags == SYN
    seg = parse_frame(LINKTYPE_RAW, raw(tcp4(b"", flags="FA")), 0.0)
    assert seg is not None and seg.flags == FIN | ACK


def test_address_cache_is_capped_and_correct() -> None:
    packet._addr_cache.clear()
    template = bytearray(raw(tcp4(b"")))
    for i in range(packet._ADDR_CACHE_MAX + 500):
        template[12:16] = struct.pack("!I", 0x0A000000 + i)
        seg = parse_frame(LINKTYPE_RAW, bytes(template), 0.0)
        assert seg is not None
        assert seg.src == socket.inet_ntoa(struct.pack("!I", 0x0A000000 + i))
        assert len(packet._addr_cache) <= packet._ADDR_CACHE_MAX
    assert len(packet._addr_cache) < packet._ADDR_CACHE_MAX + 500


# ---------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    linktype=st.sampled_from([*sorted(SUPPORTED_LINKTYPES), 105]),
    data=st.binary(max_size=120),
)
def test_random_bytes_never_raise(linktype: int, data: bytes) -> None:
    seg = parse_frame(linktype, data, 0.0)
    assert seg is None or type(seg.payload) is bytes


_VALID = raw(eth() / Dot1Q() / tcp4(options=[("NOP", None)] * 4))
_VALID6 = raw(eth() / tcp6())


@settings(max_examples=300, deadline=None)
@given(
    frame=st.sampled_from([_VALID, _VALID6]),
    edits=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 200),
)
def test_mutated_frames_never_raise(frame: bytes, edits: list[tuple[int, int]], cut: int) -> None:
    buf = bytearray(frame)
    for pos, value in edits:
        if pos < len(buf):
            buf[pos] = value
    seg = parse_frame(LINKTYPE_ETHERNET, bytes(buf[:cut]), 0.0)
    if seg is not None:
        assert type(seg.payload) is bytes
        assert len(seg.payload) <= cut


@settings(max_examples=100, deadline=None)
@given(
    src=st.integers(0, 2**32 - 1),
    dst=st.integers(0, 2**32 - 1),
    sport=st.integers(0, 65535),
    dport=st.integers(0, 65535),
    seq=st.integers(0, 2**32 - 1),
    ack=st.integers(0, 2**32 - 1),
    flags=st.integers(0, 255),
    payload=st.binary(max_size=300),
    v6=st.booleans(),
)
def test_agrees_with_scapy(
    src: int,
    dst: int,
    sport: int,
    dport: int,
    seq: int,
    ack: int,
    flags: int,
    payload: bytes,
    v6: bool,
) -> None:
    tcp = TCP(sport=sport, dport=dport, seq=seq, ack=ack, flags=flags)
    if v6:
        s = socket.inet_ntop(socket.AF_INET6, src.to_bytes(4, "big") * 4)
        d = socket.inet_ntop(socket.AF_INET6, dst.to_bytes(4, "big") * 4)
        ip: Packet = IPv6(src=s, dst=d)
    else:
        s = socket.inet_ntoa(src.to_bytes(4, "big"))
        d = socket.inet_ntoa(dst.to_bytes(4, "big"))
        ip = IP(src=s, dst=d)
    seg = parse_frame(LINKTYPE_ETHERNET, raw(eth() / ip / tcp / payload), 3.25)
    assert seg == Segment(3.25, s, sport, d, dport, seq, ack, flags, payload)
