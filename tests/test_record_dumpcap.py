"""The recording scripts' dumpcap (``scripts/record_pcaps.py``'s ``Dumpcap``):
its stop waits until the capture's last packets are in the file, and the marker
datagrams it sends for that are taken out again (``tests/dumpcap.py``)."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from tests.dumpcap import MARKER, strip_markers

REPO = Path(__file__).resolve().parents[1]


def _pcap(frames: list[tuple[int, bytes]], tail: bytes = b"") -> bytes:
    """A classic pcap file (Ethernet, microseconds) of ``frames`` (second,
    frame), then ``tail``."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for sec, f in frames:
        out.append(struct.pack("<IIII", sec, 0, len(f), len(f)) + f)
    return b"".join(out) + tail


def _udp(dport: int, payload: bytes) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    return bytes(
        Ether() / IP(src="127.0.0.1", dst="127.0.0.1") / UDP(sport=40000, dport=dport) / payload
    )


def _tcp(dport: int, payload: bytes) -> bytes:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    return bytes(
        Ether() / IP(src="127.0.0.1", dst="127.0.0.1") / TCP(sport=40000, dport=dport) / payload
    )


def test_strip_markers_takes_out_only_the_markers(tmp_path: Path) -> None:
    keep = [
        _tcp(8080, b"GET / HTTP/1.1\r\n\r\n"),
        _udp(5353, MARKER),  # another port
        _udp(9999, b"not a marker"),  # the marker port, another payload
        _tcp(9999, MARKER),  # TCP, not UDP
    ]
    marker = _udp(9999, MARKER)
    frames = list(enumerate([keep[0], marker, keep[1], keep[2], marker, keep[3]]))
    tail = struct.pack("<IIII", 1_800_000_000, 0, 60, 60) + b"x" * 10  # a record cut short
    pcap = tmp_path / "c.pcap"
    pcap.write_bytes(_pcap(frames, tail))
    assert strip_markers(pcap, 9999) == 2
    assert pcap.read_bytes() == _pcap([f for f in frames if f[1] != marker], tail)
    assert strip_markers(pcap, 9999) == 0


def test_strip_markers_refuses_other_link_types(tmp_path: Path) -> None:
    pcap = tmp_path / "c.pcap"
    pcap.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 113))
    with pytest.raises(ValueError, match="link type 113"):
        strip_markers(pcap, 9999)


@pytest.mark.skipif(
    shutil.which("dumpcap") is None or os.geteuid() != 0,
    reason="needs dumpcap and root (CAP_NET_RAW) to capture on lo",
)
def test_stop_keeps_the_connections_last_packets(tmp_path: Path) -> None:
    """The old stop (SIGINT 0.3 s after the traffic) lost the packets of
    dumpcap's last, unwritten block: the close's final ACK among them."""
    from scapy.layers.inet import TCP, UDP
    from scapy.utils import rdpcap

    sys.path.insert(0, str(REPO / "scripts"))
    from record_pcaps import Dumpcap

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    pcap = tmp_path / "c.pcap"
    cap = Dumpcap(pcap, port)
    try:
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            for i in range(20):
                c.sendall(b"piece %d\n" % i)
                c.recv(4096)
            c.shutdown(socket.SHUT_WR)
            while c.recv(4096):
                pass
        t.join(10)
    finally:
        cap.stop()
        srv.close()
    packets = rdpcap(str(pcap))
    assert not [p for p in packets if UDP in p], "marker datagrams left in the capture"
    tcp = [p[TCP] for p in packets if TCP in p]
    fins = [s for s in tcp if s.flags & 0x01]
    assert {s.sport for s in fins} == {port, cap_client_port(tcp, port)}
    server_fin = next(s for s in fins if s.sport == port)
    final_ack = server_fin.seq + 1
    assert any(s.dport == port and s.flags & 0x10 and s.ack == final_ack for s in tcp), (
        "the client's ACK of the server's FIN (the connection's last packet) is missing"
    )


def cap_client_port(segments: list[object], port: int) -> int:
    """The client's port: the other end of the connection's SYN."""
    syn = next(
        s for s in segments if getattr(s, "flags", 0) & 0x02 and getattr(s, "dport", 0) == port
    )
    return int(getattr(syn, "sport", 0))
