"""When a test's ``dumpcap`` has written what was sent: the tests that record real
loopback traffic with ``dumpcap -P`` and replay the file.

dumpcap hands packets to its file a block of its capture ring at a time (a
block is handed over when full or some hundreds of ms after its first
packet), and a SIGINT stops it without reading the blocks not handed over
yet: packets sent just before the stop are simply not in the file. So a test
sends traffic on a captured port after its own (a "poke") and waits until the
file holds a packet captured after a moment that followed everything it
needs: a packet captured later is written only after every packet captured
before it (dumpcap writes the ring's blocks, and their packets, in order). The
file growing is not that proof: dumpcap may still be writing an earlier block
while the one holding the test's last packets is open, and the SIGINT then
loses that one.

The recording scripts (``scripts/record_pcaps.py``'s ``Dumpcap``) cannot poke
the captured port: a poke would be a connection in the fixture. They capture
UDP datagrams to a second, "marker" port beside it, send markers until one is
in the file, and strip the markers from the file afterwards.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: Classic pcap magic numbers (microsecond and nanosecond timestamps).
_MAGIC_US, _MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D


def _header(data: bytes) -> tuple[str, float]:
    """The byte order and the timestamps' unit of a classic pcap file's bytes."""
    for order in ("<", ">"):
        (magic,) = struct.unpack_from(order + "I", data)
        if magic in (_MAGIC_US, _MAGIC_NS):
            return order, 1e-6 if magic == _MAGIC_US else 1e-9
    raise ValueError("not a classic pcap file (dumpcap -P)")


def _records(data: bytes) -> Iterator[tuple[int, int, float]]:
    """(offset, end, capture time) of each whole record of a classic pcap file's
    bytes; a record cut short at the end (dumpcap still writing it) is left out."""
    if len(data) < 24:
        return
    order, scale = _header(data)
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack_from(order + "IIII", data, off)
        end = off + 16 + incl
        if end > len(data):
            return
        yield off, end, sec + frac * scale
        off = end


def last_packet_time(pcap: Path) -> float | None:
    """The capture time (wall clock) of the last whole record of a classic pcap
    file dumpcap may still be writing; None before its first whole record."""
    last = None
    for _off, _end, ts in _records(pcap.read_bytes()):
        last = ts
    return last


#: The payload of a marker datagram.
MARKER = b"sparseety dumpcap marker"


def free_udp_port() -> int:
    """A UDP port nothing listens on at the moment (the markers' destination)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def marker_filter(port: int, marker_port: int) -> str:
    """dumpcap's capture filter for TCP ``port`` plus the markers to ``marker_port``."""
    return f"tcp port {port} or (udp dst port {marker_port})"


def send_marker(marker_port: int) -> None:
    """One marker datagram to 127.0.0.1:``marker_port`` (no one listens: the
    kernel answers with an ICMP error, which the filter leaves out)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(MARKER, ("127.0.0.1", marker_port))


def _is_marker(frame: bytes, marker_port: int) -> bool:
    """An Ethernet frame (what dumpcap writes for ``lo``) holding an IPv4 UDP
    datagram to ``marker_port`` with the marker payload."""
    if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00" or frame[14] >> 4 != 4:
        return False
    ihl = (frame[14] & 0x0F) * 4
    udp = 14 + ihl
    if frame[14 + 9] != 17 or len(frame) < udp + 8:
        return False
    (dport,) = struct.unpack_from("!H", frame, udp + 2)
    return dport == marker_port and frame[udp + 8 :] == MARKER


def strip_markers(pcap: Path, marker_port: int) -> int:
    """Rewrite ``pcap`` (classic pcap, Ethernet) without its marker datagrams;
    returns how many were taken out."""
    data = pcap.read_bytes()
    order, _scale = _header(data)
    (linktype,) = struct.unpack_from(order + "I", data, 20)
    if linktype != 1:
        raise ValueError(f"{pcap}: link type {linktype}, markers are only stripped from Ethernet")
    kept = [data[:24]]
    stripped = 0
    end = 24
    for off, end, _ts in _records(data):
        if _is_marker(data[off + 16 : end], marker_port):
            stripped += 1
        else:
            kept.append(data[off:end])
    kept.append(data[end:])  # a record cut short stays as dumpcap left it
    pcap.write_bytes(b"".join(kept))
    return stripped


def wait_written_after(
    pcap: Path, since: float, poke: Callable[[], None], what: str, polls: int = 400
) -> None:
    """Call ``poke`` (traffic on a captured port) until ``pcap`` holds a packet
    captured after ``since`` (``time.time()`` taken once everything the test
    needs was sent): then all of that is in the file. Polled every 25 ms; the
    bound is only reached when the test fails."""
    for _ in range(polls):
        poke()
        last = last_packet_time(pcap)
        if last is not None and last > since:
            return
        time.sleep(0.025)
    raise AssertionError(f"timed out waiting for {what}")
