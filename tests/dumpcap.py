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
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

#: Classic pcap magic numbers (microsecond and nanosecond timestamps).
_MAGIC_US, _MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D


def last_packet_time(pcap: Path) -> float | None:
    """The capture time (wall clock) of the last whole record of a classic pcap
    file dumpcap may still be writing; None before its first whole record."""
    data = pcap.read_bytes()
    if len(data) < 24:
        return None
    for order in ("<", ">"):
        (magic,) = struct.unpack_from(order + "I", data)
        if magic in (_MAGIC_US, _MAGIC_NS):
            break
    else:
        raise ValueError(f"{pcap}: not a classic pcap file (dumpcap -P)")
    scale = 1e-6 if magic == _MAGIC_US else 1e-9
    last = None
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack_from(order + "IIII", data, off)
        if off + 16 + incl > len(data):
            break  # a record dumpcap is still writing
        last = sec + frac * scale
        off += 16 + incl
    return last


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
