"""Fast link-layer → IPv4/IPv6 → TCP frame parsing, shared by the pcap reader and
the live AF_PACKET source.

``parse_frame(linktype, buf, ts)`` turns one captured frame into a
:class:`~sniffer.core.events.Segment`, or ``None`` for anything that is not a TCP
segment we can use (ARP, UDP, non-first IPv4 fragments, IPv6 fragments,
truncated headers, unknown ethertypes). It never raises on bad input.

For hot loops, ``frame_parser(linktype)`` returns a function specialised for one
link type so that nothing is dispatched per packet.

Rules worth knowing:

- The IP total length (IPv4) or payload length (IPv6) cuts trailing link-layer
  padding (Ethernet pads short frames to 60 bytes). When the frame is shorter
  than the IP length (snaplen), the payload is what was captured. A length of 0
  (TSO/BIG TCP captures, IPv6 jumbograms) means "up to the end of the frame".
- A first IPv4 fragment (offset 0, MF set) still carries the TCP header: its
  segment is returned with the partial payload, and the reassembler sees the
  missing bytes as a gap. Later fragments are dropped (no TCP header).
- IPv6 hop-by-hop, routing, destination-options and AH headers are skipped;
  a fragment header makes the packet ``None``.
- ``Segment.flags`` is the TCP flags byte as on the wire (FIN, SYN, RST, PSH,
  ACK, URG, ECE, CWR bits).

This module is sans-IO: it opens nothing, reads no clock and logs nothing.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Protocol

from sniffer.core.events import Segment

__all__ = [
    "LINKTYPE_ETHERNET",
    "LINKTYPE_IPV4",
    "LINKTYPE_IPV6",
    "LINKTYPE_LINUX_SLL",
    "LINKTYPE_LINUX_SLL2",
    "LINKTYPE_LOOP",
    "LINKTYPE_NULL",
    "LINKTYPE_RAW",
    "LINKTYPE_RAW_ALIASES",
    "SUPPORTED_LINKTYPES",
    "FrameParser",
    "FrameParserAt",
    "UnsupportedLinkType",
    "frame_parser",
    "frame_parser_at",
    "linktype_name",
    "parse_frame",
]

LINKTYPE_NULL = 0  # BSD loopback: 4-byte address family, host byte order of the writer
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101  # raw IPv4/IPv6, version from the first nibble
LINKTYPE_RAW_ALIASES = (12, 14)  # DLT_RAW values some platforms write into files
LINKTYPE_LOOP = 108  # OpenBSD loopback: 4-byte address family, network byte order
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

_NAMES: dict[int, str] = {
    LINKTYPE_NULL: "NULL",
    LINKTYPE_ETHERNET: "ETHERNET",
    LINKTYPE_RAW: "RAW",
    12: "RAW",
    14: "RAW",
    LINKTYPE_LOOP: "LOOP",
    LINKTYPE_LINUX_SLL: "LINUX_SLL",
    LINKTYPE_IPV4: "IPV4",
    LINKTYPE_IPV6: "IPV6",
    LINKTYPE_LINUX_SLL2: "LINUX_SLL2",
}

SUPPORTED_LINKTYPES: frozenset[int] = frozenset(_NAMES)

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
_VLAN_TPIDS = frozenset((0x8100, 0x88A8, 0x9100, 0x9200))

AF_INET = 2
_AF_INET6_VALUES = frozenset((24, 28, 30, 10))  # BSDs, macOS/FreeBSD, and Linux (10)

IPPROTO_TCP = 6
_IPV6_SKIPPABLE = frozenset((0, 43, 60))  # hop-by-hop, routing, destination options
_IPPROTO_AH = 51
_IPPROTO_FRAGMENT = 44
_MAX_IPV6_EXT_HEADERS = 16

FrameParser = Callable[[bytes | memoryview, float], Segment | None]


class FrameParserAt(Protocol):
    """``f(buf, ts, off=0, end=len(buf))``: parse the frame ``buf[off:end]``."""

    def __call__(
        self, buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1
    ) -> Segment | None: ...


class UnsupportedLinkType(ValueError):
    """The link type has no parser here."""

    def __init__(self, linktype: int) -> None:
        super().__init__(f"unsupported link type {linktype}")
        self.linktype = linktype


def linktype_name(linktype: int) -> str:
    """A short name for a link type ("ETHERNET", "LINUX_SLL", …, or "LINKTYPE_<n>")."""
    return _NAMES.get(linktype, f"LINKTYPE_{linktype}")


# ---------------------------------------------------------------------------
# address text cache
# ---------------------------------------------------------------------------

_ADDR_CACHE_MAX = 4096
_addr_cache: dict[bytes, str] = {}
_inet_ntop = socket.inet_ntop


def _addr4(raw: bytes) -> str:
    text = _addr_cache.get(raw)
    if text is None:
        text = _inet_ntop(socket.AF_INET, raw)
        if len(_addr_cache) >= _ADDR_CACHE_MAX:
            _addr_cache.clear()
        _addr_cache[raw] = text
    return text


def _addr6(raw: bytes) -> str:
    text = _addr_cache.get(raw)
    if text is None:
        text = _inet_ntop(socket.AF_INET6, raw)
        if len(_addr_cache) >= _ADDR_CACHE_MAX:
            _addr_cache.clear()
        _addr_cache[raw] = text
    return text


# ---------------------------------------------------------------------------
# IP + TCP
# ---------------------------------------------------------------------------

# IPv4 header without options followed by the first 14 bytes of TCP:
# ver_ihl, total_len, frag, proto, src, dst, sport, dport, seq, ack, data_off, flags
_IP4TCP = struct.Struct("!BxHxxHxBxx4s4sHHIIBB")
# IPv4 header alone (options case): ver_ihl, total_len, frag, proto, src, dst
_IP4 = struct.Struct("!BxHxxHxBxx4s4s")
# sport, dport, seq, ack, data_off, flags
_TCP = struct.Struct("!HHIIBB")
# IPv6 fixed header: ver/tc/flow, payload_len, next_header, src, dst
_IP6 = struct.Struct("!IHBx16s16s")
_U16 = struct.Struct("!H")
_U32BE = struct.Struct(">I")
_U32LE = struct.Struct("<I")
_BB = struct.Struct("BB")
_unpack_ip4tcp = _IP4TCP.unpack_from
_unpack_ip4 = _IP4.unpack_from
_unpack_tcp = _TCP.unpack_from
_unpack_ip6 = _IP6.unpack_from
_unpack_u16 = _U16.unpack_from
_unpack_bb = _BB.unpack_from
# Ethernet header (ethertype) + IPv4 without options + TCP, for the common case.
_ETHIP4TCP = struct.Struct("!12xHBxHxxHxBxx4s4sHHIIBB")
_unpack_ethip4tcp = _ETHIP4TCP.unpack_from

# Building the NamedTuple through tuple.__new__ skips its Python-level __new__
# (about half the cost of making a Segment).
_new_tuple = tuple.__new__
_cache_get = _addr_cache.get


def _seg4(
    ts: float,
    src: bytes,
    sport: int,
    dst: bytes,
    dport: int,
    seq: int,
    ack: int,
    flags: int,
    payload: bytes | memoryview,
) -> Segment:
    """Build a Segment from raw IPv4 addresses (slow paths only)."""
    if type(payload) is not bytes:
        payload = bytes(payload)
    return Segment(ts, _addr4(src), sport, _addr4(dst), dport, seq, ack, flags, payload)


def _ip4(buf: bytes | memoryview, off: int, end: int, ts: float) -> Segment | None:
    """IPv4 packet at ``buf[off:end]``."""
    if end - off < 40:
        return None
    vihl, total, frag, proto, src, dst, sport, dport, seq, ack, doff, flags = _unpack_ip4tcp(
        buf, off
    )
    if vihl != 0x45:
        return _ip4_options(buf, off, end, ts)
    if proto != IPPROTO_TCP or frag & 0x1FFF:
        return None
    if total:
        if total < 40:
            return None
        if off + total < end:
            end = off + total
    start = off + 20 + ((doff >> 4) << 2)
    if doff < 0x50 or start > end:
        return None
    payload = buf[start:end]
    if type(payload) is not bytes:
        payload = bytes(payload)
    s = _cache_get(src)
    if s is None:
        s = _addr4(src)
    d = _cache_get(dst)
    if d is None:
        d = _addr4(dst)
    return _new_tuple(Segment, (ts, s, sport, d, dport, seq, ack, flags, payload))


def _ip4_options(buf: bytes | memoryview, off: int, end: int, ts: float) -> Segment | None:
    """IPv4 with options (IHL > 5), or not IPv4 at all."""
    vihl, total, frag, proto, src, dst = _unpack_ip4(buf, off)
    ihl = (vihl & 0x0F) << 2
    if vihl >> 4 != 4 or ihl < 20 or proto != IPPROTO_TCP or frag & 0x1FFF:
        return None
    tcp = off + ihl
    if end - tcp < 20:
        return None
    if total:
        if total < ihl + 20:
            return None
        if off + total < end:
            end = off + total
    sport, dport, seq, ack, doff, flags = _unpack_tcp(buf, tcp)
    start = tcp + ((doff >> 4) << 2)
    if doff < 0x50 or start > end:
        return None
    return _seg4(ts, src, sport, dst, dport, seq, ack, flags, buf[start:end])


def _ip6(buf: bytes | memoryview, off: int, end: int, ts: float) -> Segment | None:
    """IPv6 packet at ``buf[off:end]``."""
    if end - off < 60:
        return None
    vtf, plen, nh, src, dst = _unpack_ip6(buf, off)
    if vtf >> 28 != 6:
        return None
    if plen and off + 40 + plen < end:
        end = off + 40 + plen
    pos = off + 40
    if nh != IPPROTO_TCP:
        for _ in range(_MAX_IPV6_EXT_HEADERS):
            if nh in _IPV6_SKIPPABLE:
                if end - pos < 8:
                    return None
                nh, hlen = _unpack_bb(buf, pos)
                pos += (hlen + 1) << 3
            elif nh == _IPPROTO_AH:
                if end - pos < 8:
                    return None
                nh, hlen = _unpack_bb(buf, pos)
                pos += (hlen + 2) << 2
            else:
                break
            if nh == IPPROTO_TCP:
                break
        if nh != IPPROTO_TCP:
            return None  # fragment, ESP, no-next-header, UDP, ICMPv6, too many headers…
    if end - pos < 20:
        return None
    sport, dport, seq, ack, doff, flags = _unpack_tcp(buf, pos)
    start = pos + ((doff >> 4) << 2)
    if doff < 0x50 or start > end:
        return None
    payload = buf[start:end]
    if type(payload) is not bytes:
        payload = bytes(payload)
    s = _cache_get(src)
    if s is None:
        s = _addr6(src)
    d = _cache_get(dst)
    if d is None:
        d = _addr6(dst)
    return _new_tuple(Segment, (ts, s, sport, d, dport, seq, ack, flags, payload))


def _ip_any(buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1) -> Segment | None:
    """Raw IP: the version nibble picks IPv4 or IPv6."""
    if end < 0:
        end = len(buf)
    if end <= off:
        return None
    version = buf[off] >> 4
    if version == 4:
        return _ip4(buf, off, end, ts)
    if version == 6:
        return _ip6(buf, off, end, ts)
    return None


def _by_ethertype(
    ethertype: int, buf: bytes | memoryview, off: int, end: int, ts: float
) -> Segment | None:
    if ethertype == ETH_P_IP:
        return _ip4(buf, off, end, ts)
    if ethertype == ETH_P_IPV6:
        return _ip6(buf, off, end, ts)
    return None


# ---------------------------------------------------------------------------
# link layers (all take buf, off, end, ts)
# ---------------------------------------------------------------------------


def _ethernet(buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1) -> Segment | None:
    if end < 0:
        end = len(buf)
    if end - off >= 54:
        # Fast path: untagged Ethernet, IPv4 without options, TCP.
        et, vihl, total, frag, proto, src, dst, sport, dport, seq, ack, doff, flags = (
            _unpack_ethip4tcp(buf, off)
        )
        if et == ETH_P_IP and vihl == 0x45:
            if proto != IPPROTO_TCP or frag & 0x1FFF:
                return None
            ip = off + 14
            if total:
                if total < 40:
                    return None
                if ip + total < end:
                    end = ip + total
            start = ip + 20 + ((doff >> 4) << 2)
            if doff < 0x50 or start > end:
                return None
            payload = buf[start:end]
            if type(payload) is not bytes:
                payload = bytes(payload)
            s = _cache_get(src)
            if s is None:
                s = _addr4(src)
            d = _cache_get(dst)
            if d is None:
                d = _addr4(dst)
            return _new_tuple(Segment, (ts, s, sport, d, dport, seq, ack, flags, payload))
    elif end - off < 14:
        return None
    (ethertype,) = _unpack_u16(buf, off + 12)
    pos = off + 14
    while ethertype in _VLAN_TPIDS:
        if end - pos < 4:
            return None
        (ethertype,) = _unpack_u16(buf, pos + 2)
        pos += 4
    return _by_ethertype(ethertype, buf, pos, end, ts)


def _linux_sll(buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1) -> Segment | None:
    if end < 0:
        end = len(buf)
    # pkttype(2) hatype(2) halen(2) addr(8) protocol(2)
    if end - off < 16:
        return None
    (proto,) = _unpack_u16(buf, off + 14)
    return _by_ethertype(proto, buf, off + 16, end, ts)


def _linux_sll2(buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1) -> Segment | None:
    if end < 0:
        end = len(buf)
    # protocol(2) reserved(2) ifindex(4) hatype(2) pkttype(1) halen(1) addr(8)
    if end - off < 20:
        return None
    (proto,) = _unpack_u16(buf, off)
    return _by_ethertype(proto, buf, off + 20, end, ts)


def _family(family: int, buf: bytes | memoryview, off: int, end: int, ts: float) -> Segment | None:
    if family == AF_INET:
        return _ip4(buf, off, end, ts)
    if family in _AF_INET6_VALUES:
        return _ip6(buf, off, end, ts)
    return None


def _null(buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1) -> Segment | None:
    if end < 0:
        end = len(buf)
    # Address family in the writer's host byte order: accept either order.
    if end - off < 4:
        return None
    (family,) = _U32LE.unpack_from(buf, off)
    if family > 0xFFFF:
        (family,) = _U32BE.unpack_from(buf, off)
    return _family(family, buf, off + 4, end, ts)


def _loop(buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1) -> Segment | None:
    if end < 0:
        end = len(buf)
    if end - off < 4:
        return None
    (family,) = _U32BE.unpack_from(buf, off)
    return _family(family, buf, off + 4, end, ts)


_PARSERS: dict[int, FrameParserAt] = {
    LINKTYPE_NULL: _null,
    LINKTYPE_ETHERNET: _ethernet,
    LINKTYPE_RAW: _ip_any,
    12: _ip_any,
    14: _ip_any,
    LINKTYPE_LOOP: _loop,
    LINKTYPE_LINUX_SLL: _linux_sll,
    LINKTYPE_IPV4: _ip_any,
    LINKTYPE_IPV6: _ip_any,
    LINKTYPE_LINUX_SLL2: _linux_sll2,
}


def frame_parser_at(linktype: int) -> FrameParserAt:
    """Like :func:`frame_parser`, with optional bounds: ``f(buf, ts, off=0, end=len(buf))``
    parses the frame ``buf[off:end]`` in place (the file reader uses this to avoid
    slicing each frame out of the file). It is the very same function object."""
    try:
        return _PARSERS[linktype]
    except KeyError:
        raise UnsupportedLinkType(linktype) from None


def frame_parser(linktype: int) -> FrameParser:
    """Return ``f(buf, ts) -> Segment | None`` specialised for ``linktype``.

    Raises :class:`UnsupportedLinkType` (a ``ValueError``) for link types not in
    :data:`SUPPORTED_LINKTYPES`.
    """
    try:
        return _PARSERS[linktype]
    except KeyError:
        raise UnsupportedLinkType(linktype) from None


def parse_frame(linktype: int, buf: bytes | memoryview, ts: float) -> Segment | None:
    """Parse one captured frame of ``linktype`` into a TCP :class:`Segment`.

    Returns ``None`` for anything that is not a usable TCP segment, including
    frames of an unsupported link type. Never raises on malformed input.
    """
    parser = _PARSERS.get(linktype)
    if parser is None:
        return None
    return parser(buf, ts)
