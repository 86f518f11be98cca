"""Tests for sniffer.capture.pcap: formats, byte orders, timestamps, damage, gzip."""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Packet, raw
from scapy.utils import PcapNgWriter, wrpcap

from sniffer.capture.pcap import CaptureFileError, CaptureReader, read_capture
from sniffer.core.events import Segment

# The peer conformance corpus, vendored (tests/data/peer-pcaps/README.md: origin, licence).
PEER_PCAPS = Path(__file__).resolve().parent / "data" / "peer-pcaps" / "zeek-http"

SHB = 0x0A0D0D0A
IDB = 1
OPB = 2
SPB = 3
NRB = 4
ISB = 5
EPB = 6


def eth() -> Packet:
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def tcp_frame(i: int, payload: bytes | None = None) -> bytes:
    body = payload if payload is not None else f"chunk {i}\n".encode()
    return raw(
        eth()
        / IP(src="127.0.0.1", dst="127.0.0.1")
        / TCP(sport=40000, dport=8000, seq=1000 + i, ack=7, flags="PA")
        / body
    )


def raw_tcp(i: int) -> bytes:
    """A raw IPv4 TCP packet (no link layer)."""
    return raw(IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=2, seq=i) / b"raw")


UDP_FRAME = raw(eth() / IP(src="127.0.0.1", dst="127.0.0.1") / UDP(sport=53, dport=53) / b"q")
ARP_FRAME = raw(eth() / ARP())


def seqs(reader: CaptureReader) -> list[int]:
    return [seg.seq - 1000 for seg in reader]


# ---------------------------------------------------------------------------
# writers
# ---------------------------------------------------------------------------


def pcap_bytes(
    frames: Sequence[bytes],
    *,
    order: str = "<",
    ns: bool = False,
    linktype: int = 1,
    snaplen: int = 65535,
    times: Sequence[tuple[int, int]] | None = None,
) -> bytes:
    magic = 0xA1B23C4D if ns else 0xA1B2C3D4
    out = bytearray(struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))
    for i, frame in enumerate(frames):
        sec, frac = times[i] if times else (1_700_000_000 + i, 250_000 if not ns else 250_000_000)
        out += struct.pack(order + "IIII", sec, frac, len(frame), len(frame)) + frame
    return bytes(out)


def block(btype: int, body: bytes, order: str = "<") -> bytes:
    body += b"\0" * (-len(body) % 4)
    length = 12 + len(body)
    return struct.pack(order + "II", btype, length) + body + struct.pack(order + "I", length)


def option(code: int, value: bytes, order: str = "<") -> bytes:
    return struct.pack(order + "HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def shb(order: str = "<") -> bytes:
    body = struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1)
    return block(SHB, body, order)


def idb(linktype: int = 1, options: bytes = b"", order: str = "<", snaplen: int = 0) -> bytes:
    if options:
        options += struct.pack(order + "HH", 0, 0)
    return block(IDB, struct.pack(order + "HHI", linktype, 0, snaplen) + options, order)


def epb(frame: bytes, units: int, iface: int = 0, order: str = "<") -> bytes:
    head = struct.pack(
        order + "IIIII", iface, units >> 32, units & 0xFFFFFFFF, len(frame), len(frame)
    )
    return block(EPB, head + frame, order)


def opb(frame: bytes, units: int, iface: int = 0, order: str = "<") -> bytes:
    head = struct.pack(
        order + "HHIIII", iface, 0, units >> 32, units & 0xFFFFFFFF, len(frame), len(frame)
    )
    return block(OPB, head + frame, order)


def spb(frame: bytes, order: str = "<") -> bytes:
    return block(SPB, struct.pack(order + "I", len(frame)) + frame, order)


def write(tmp_path: Path, data: bytes, name: str = "cap.pcap") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------
# classic pcap
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("ns", [False, True])
def test_classic_pcap(tmp_path: Path, order: str, ns: bool) -> None:
    frames = [tcp_frame(0), UDP_FRAME, tcp_frame(1), ARP_FRAME, tcp_frame(2)]
    times = [(1_700_000_000, 123_456_000 if ns else 123_456)] * len(frames)
    reader = read_capture(write(tmp_path, pcap_bytes(frames, order=order, ns=ns, times=times)))
    assert reader.format == "pcap"
    assert reader.linktypes == [1]
    assert not reader.compressed
    segments = list(reader)
    assert [s.seq for s in segments] == [1000, 1001, 1002]
    assert segments[0] == Segment(
        1_700_000_000.123456, "127.0.0.1", 40000, "127.0.0.1", 8000, 1000, 7, 0x18, b"chunk 0\n"
    )
    assert reader.error is None
    stats = reader.stats
    assert (stats.packets, stats.tcp_segments, stats.non_tcp) == (5, 3, 2)
    assert stats.bytes == sum(len(f) for f in frames)
    assert stats.first_ts == stats.last_ts == pytest.approx(1_700_000_000.123456, abs=1e-6)
    assert reader.offset == reader.size == len(pcap_bytes(frames))


def test_nanosecond_timestamps_keep_sub_microsecond_order(tmp_path: Path) -> None:
    times = [(10, 1), (10, 999_999_999)]
    reader = read_capture(write(tmp_path, pcap_bytes([tcp_frame(0)] * 2, ns=True, times=times)))
    ts = [s.ts for s in reader]
    assert ts == [pytest.approx(10.000000001), pytest.approx(10.999999999)]


def test_pcap_raw_linktype_and_fcs_bits(tmp_path: Path) -> None:
    # The upper bits of the link type field carry FCS information, not the link type.
    data = pcap_bytes([raw_tcp(5)], linktype=101 | 0x10000000)
    reader = read_capture(write(tmp_path, data))
    assert reader.linktypes == [101]
    assert [(s.src, s.seq, s.payload) for s in reader] == [("10.0.0.1", 5, b"raw")]


def test_unsupported_linktype_counts_packets(tmp_path: Path) -> None:
    reader = read_capture(write(tmp_path, pcap_bytes([tcp_frame(0)] * 3, linktype=105)))
    assert list(reader) == []
    assert reader.linktypes == [105]
    assert (reader.stats.packets, reader.stats.non_tcp, reader.error) == (3, 3, None)


def test_empty_capture_has_no_packets(tmp_path: Path) -> None:
    reader = read_capture(write(tmp_path, pcap_bytes([])))
    assert list(reader) == []
    assert reader.error is None
    assert reader.stats.packets == 0 and reader.stats.first_ts is None


def test_scapy_wrpcap_interop(tmp_path: Path) -> None:
    pkts = [eth() / IP() / TCP(seq=i) / b"x" for i in range(5)]
    for i, p in enumerate(pkts):
        p.time = 1000 + i / 4
    path = tmp_path / "scapy.pcap"
    wrpcap(str(path), pkts)
    reader = read_capture(path)
    assert [(s.seq, s.ts) for s in reader] == [(i, 1000 + i / 4) for i in range(5)]


# ---------------------------------------------------------------------------
# pcapng
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["<", ">"])
def test_pcapng_epb_default_resolution(tmp_path: Path, order: str) -> None:
    data = (
        shb(order)
        + idb(order=order)
        + b"".join(
            epb(tcp_frame(i), 1_700_000_000_000_000 + i * 500_000, order=order) for i in range(3)
        )
    )
    reader = read_capture(write(tmp_path, data, "x.pcapng"))
    assert reader.format == "pcapng"
    assert reader.linktypes == [1]
    segs = list(reader)
    assert [s.seq for s in segs] == [1000, 1001, 1002]
    assert [s.ts for s in segs] == [1_700_000_000.0, 1_700_000_000.5, 1_700_000_001.0]
    assert reader.error is None and reader.offset == reader.size


@pytest.mark.parametrize(
    ("tsresol", "units", "expected"),
    [
        (9, 1_700_000_000_123_456_789, 1_700_000_000.123456789),  # 10^-9
        (3, 1_700_000_000_250, 1_700_000_000.25),  # 10^-3
        (0x80 | 10, 1024 * 1000 + 512, 1000.5),  # 2^-10
        (0x80 | 0, 42, 42.0),  # 2^0
    ],
)
def test_pcapng_if_tsresol(tmp_path: Path, tsresol: int, units: int, expected: float) -> None:
    data = shb() + idb(options=option(9, bytes([tsresol]))) + epb(tcp_frame(0), units)
    (seg,) = read_capture(write(tmp_path, data))
    assert seg.ts == pytest.approx(expected, abs=1e-9)


def test_pcapng_if_tsoffset(tmp_path: Path) -> None:
    opts = option(2, b"lo\0") + option(14, struct.pack("<q", 1_000_000))
    data = shb() + idb(options=opts) + epb(tcp_frame(0), 2_500_000)
    (seg,) = read_capture(write(tmp_path, data))
    assert seg.ts == 1_000_002.5


def test_pcapng_several_interfaces_and_linktypes(tmp_path: Path) -> None:
    data = (
        shb()
        + idb(1)
        + idb(101, options=option(9, b"\x09"))
        + epb(tcp_frame(0), 1_000_000, iface=0)
        + epb(raw_tcp(77), 2_000_000_000, iface=1)
        + epb(tcp_frame(1), 3_000_000, iface=5)  # no such interface: counted, not parsed
    )
    reader = read_capture(write(tmp_path, data))
    assert reader.linktypes == [1, 101]
    segs = list(reader)
    assert [(s.seq, s.ts) for s in segs] == [(1000, 1.0), (77, 2.0)]
    assert (reader.stats.packets, reader.stats.non_tcp) == (3, 1)
    assert reader.error is None


def test_pcapng_sections_with_both_byte_orders(tmp_path: Path) -> None:
    data = (
        shb("<")
        + idb(1, order="<")
        + epb(tcp_frame(0), 1_000_000, order="<")
        + shb(">")
        + idb(101, order=">")  # interface 0 of the new section
        + epb(raw_tcp(9), 2_000_000, order=">")
        + epb(raw_tcp(10), 3_000_000, iface=1, order=">")  # old section's iface 1 is gone
    )
    reader = read_capture(write(tmp_path, data))
    segs = list(reader)
    assert [(s.seq, s.ts) for s in segs] == [(1000, 1.0), (9, 2.0)]
    assert reader.linktypes == [1, 101]
    assert reader.stats.packets == 3 and reader.error is None


def test_pcapng_spb_reuses_previous_timestamp_and_opb(tmp_path: Path) -> None:
    data = (
        shb()
        + idb(1)
        + epb(tcp_frame(0), 5_000_000)
        + spb(tcp_frame(1))
        + opb(tcp_frame(2), 7_000_000)
        + spb(tcp_frame(3))
    )
    reader = read_capture(write(tmp_path, data))
    assert [(s.seq, s.ts) for s in reader] == [(1000, 5.0), (1001, 5.0), (1002, 7.0), (1003, 7.0)]
    assert reader.stats.packets == 4


def test_pcapng_spb_honours_snaplen(tmp_path: Path) -> None:
    frame = tcp_frame(0, b"0123456789")
    data = shb() + idb(1, snaplen=len(frame) - 4) + spb(frame)
    (seg,) = read_capture(write(tmp_path, data))
    assert seg.payload == b"012345"


def test_pcapng_unknown_blocks_are_skipped(tmp_path: Path) -> None:
    data = (
        shb()
        + block(0x0BAD, b"custom stuff")
        + idb(1)
        + block(NRB, b"\0" * 8)
        + epb(tcp_frame(0), 1)
        + block(ISB, b"\0" * 20)
        + block(0x40000BAD, b"x" * 13)
        + epb(tcp_frame(1), 2)
    )
    reader = read_capture(write(tmp_path, data))
    assert seqs(reader) == [0, 1]
    assert reader.error is None and reader.stats.packets == 2


def test_scapy_pcapng_interop(tmp_path: Path) -> None:
    path = tmp_path / "scapy.pcapng"
    writer = PcapNgWriter(str(path))
    for i in range(4):
        pkt = eth() / IPv6(src="::1", dst="::1") / TCP(seq=i) / b"six"
        pkt.time = 50 + i
        writer.write(pkt)
    writer.close()
    reader = read_capture(path)
    assert reader.format == "pcapng"
    assert [(s.src, s.seq, s.ts, s.payload) for s in reader] == [
        ("::1", i, 50.0 + i, b"six") for i in range(4)
    ]


# ---------------------------------------------------------------------------
# damage
# ---------------------------------------------------------------------------


def test_truncated_pcap_every_cut(tmp_path: Path) -> None:
    frames = [tcp_frame(i) for i in range(3)]
    data = pcap_bytes(frames)
    last = len(pcap_bytes(frames[:2]))  # offset of the third record
    for cut in range(last + 1, len(data)):
        reader = read_capture(write(tmp_path, data[:cut]))
        assert seqs(reader) == [0, 1], cut
        assert reader.error is not None, cut
        assert reader.error.offset == last
        assert f"offset {last}" in str(reader.error)
        assert reader.stats.packets == 2
        assert reader.offset == last
    reader = read_capture(write(tmp_path, data[:last]))  # cut on a record boundary
    assert seqs(reader) == [0, 1] and reader.error is None


def test_truncated_pcap_message(tmp_path: Path) -> None:
    frames = [tcp_frame(0), tcp_frame(1, b"y" * 1000)]
    data = pcap_bytes(frames)
    start = len(pcap_bytes(frames[:1]))
    reader = read_capture(write(tmp_path, data[: start + 216]))
    assert seqs(reader) == [0]
    assert str(reader.error) == (
        f"truncated packet record at offset {start} (needs {16 + len(frames[1])} bytes, 216 left)"
    )
    reader = read_capture(write(tmp_path, data[: start + 5]))
    list(reader)
    assert str(reader.error) == (
        f"truncated packet record header at offset {start} (needs 16 bytes, 5 left)"
    )


def test_corrupt_pcap_caplen(tmp_path: Path) -> None:
    data = bytearray(pcap_bytes([tcp_frame(0), tcp_frame(1), tcp_frame(2)]))
    second = len(pcap_bytes([tcp_frame(0)]))
    data[second + 8 : second + 12] = struct.pack("<I", 0x7FFFFFF0)
    reader = read_capture(write(tmp_path, bytes(data)))
    assert seqs(reader) == [0]
    assert reader.error is not None
    assert reader.error.offset == second
    assert "corrupt" in str(reader.error)


def test_truncated_pcapng_every_cut(tmp_path: Path) -> None:
    head = shb() + idb(1) + epb(tcp_frame(0), 1) + epb(tcp_frame(1), 2)
    data = head + epb(tcp_frame(2), 3)
    for cut in range(len(head) + 1, len(data)):
        reader = read_capture(write(tmp_path, data[:cut]))
        assert seqs(reader) == [0, 1], cut
        assert reader.error is not None
        assert reader.error.offset == len(head)
        assert f"offset {len(head)}" in str(reader.error)


@pytest.mark.parametrize(
    ("length", "what"),
    [
        (13, "block length 13"),  # not a multiple of 4
        (8, "block length 8"),  # shorter than a block header
        (0x7FFFFFF0, "needs"),  # runs past the end of the file
    ],
)
def test_corrupt_pcapng_block_length(tmp_path: Path, length: int, what: str) -> None:
    head = shb() + idb(1) + epb(tcp_frame(0), 1)
    bad = bytearray(epb(tcp_frame(1), 2))
    bad[4:8] = struct.pack("<I", length)
    data = head + bytes(bad) + epb(tcp_frame(2), 3)
    reader = read_capture(write(tmp_path, data))
    assert seqs(reader) == [0]
    assert reader.error is not None
    assert reader.error.offset == len(head)
    assert what in str(reader.error)


def test_pcapng_trailing_length_mismatch(tmp_path: Path) -> None:
    head = shb() + idb(1)
    bad = bytearray(epb(tcp_frame(0), 1))
    bad[-4:] = struct.pack("<I", len(bad) + 4)
    reader = read_capture(write(tmp_path, head + bytes(bad) + epb(tcp_frame(1), 2)))
    assert seqs(reader) == []
    assert reader.error is not None and reader.error.offset == len(head)
    assert "trailing length" in str(reader.error)


def test_pcapng_caplen_larger_than_block(tmp_path: Path) -> None:
    head = shb() + idb(1)
    bad = bytearray(epb(tcp_frame(0), 1))
    bad[20:24] = struct.pack("<I", 5000)  # captured length
    reader = read_capture(write(tmp_path, head + bytes(bad)))
    assert list(reader) == []
    assert reader.error is not None and reader.error.offset == len(head)


def test_pcapng_bad_second_section(tmp_path: Path) -> None:
    head = shb() + idb(1) + epb(tcp_frame(0), 1)
    bad = bytearray(shb())
    bad[8:12] = b"ABCD"  # byte-order magic
    reader = read_capture(write(tmp_path, head + bytes(bad) + epb(tcp_frame(1), 2)))
    assert seqs(reader) == [0]
    assert reader.error is not None and reader.error.offset == len(head)
    assert "byte-order" in str(reader.error)


def test_early_stop_is_not_an_error(tmp_path: Path) -> None:
    reader = read_capture(write(tmp_path, pcap_bytes([tcp_frame(i) for i in range(10)])))
    offsets = []
    for seg in reader:
        offsets.append(reader.offset)
        assert reader.stats.tcp_segments == seg.seq - 999
        if seg.seq == 1003:
            break
    assert offsets == sorted(offsets) and len(set(offsets)) == 4
    assert reader.error is None
    assert reader.offset < reader.size
    reader.close()


def test_context_manager_closes(tmp_path: Path) -> None:
    with read_capture(write(tmp_path, pcap_bytes([tcp_frame(0)]))) as reader:
        first = next(iter(reader))
    assert first.payload == b"chunk 0\n"  # segments outlive the mapping


# ---------------------------------------------------------------------------
# gzip
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cap.pcap.gz", "cap.pcap", "cap"])
def test_gzip_any_extension(tmp_path: Path, name: str) -> None:
    plain = pcap_bytes([tcp_frame(i) for i in range(4)])
    reader = read_capture(write(tmp_path, gzip.compress(plain), name))
    assert reader.compressed
    assert seqs(reader) == [0, 1, 2, 3]
    assert reader.error is None
    assert reader.size == len(plain)


def test_gzip_pcapng_multi_member(tmp_path: Path) -> None:
    plain = shb() + idb(1) + epb(tcp_frame(0), 1) + epb(tcp_frame(1), 2)
    data = gzip.compress(plain[:40]) + gzip.compress(plain[40:])
    reader = read_capture(write(tmp_path, data))
    assert reader.format == "pcapng"
    assert seqs(reader) == [0, 1]
    assert reader.error is None


def test_truncated_gzip(tmp_path: Path) -> None:
    frames = [tcp_frame(i, bytes(range(256)) * 4) for i in range(50)]
    packed = gzip.compress(pcap_bytes(frames))
    reader = read_capture(write(tmp_path, packed[: len(packed) * 2 // 3]))
    got = seqs(reader)
    assert 0 < len(got) < 50
    assert got == list(range(len(got)))
    assert reader.error is not None
    assert "gzip" in str(reader.error)
    assert reader.error.offset == reader.offset


# ---------------------------------------------------------------------------
# not a capture
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "not a pcap or pcapng capture"),
        (b"", "empty"),
        (b"\xd4\xc3", "not a pcap"),
        (gzip.compress(b"hello world, not a capture"), "gzip"),
        (struct.pack("<IHH", 0xA1B2C3D4, 2, 4), "truncated pcap file header at offset 0"),
        (struct.pack("<II", SHB, 28), "truncated section header block at offset 0"),
        (struct.pack("<IIIHHqI", SHB, 28, 0xDEADBEEF, 1, 0, -1, 28), "byte-order magic"),
    ],
    ids=["http", "empty", "short", "gzip-text", "pcap-header", "shb-short", "shb-bom"],
)
def test_not_a_capture_raises_at_open(tmp_path: Path, data: bytes, words: str) -> None:
    with pytest.raises(CaptureFileError) as info:
        read_capture(write(tmp_path, data, "notes.pcap"))
    assert info.value.offset == 0
    assert words in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CaptureFileError) as info:
        read_capture(tmp_path / "nope.pcap")
    assert "nope.pcap" in str(info.value)
    assert "No such file" in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CaptureFileError):
        read_capture(tmp_path)


# ---------------------------------------------------------------------------
# real captures (Zeek's HTTP trace corpus, with tshark's packet counts)
# ---------------------------------------------------------------------------

PEER_FILES = sorted(
    p
    for p in PEER_PCAPS.rglob("*")
    if p.is_file() and (".pcap" in p.name) and not p.name.endswith(".json")
)


@pytest.mark.parametrize("path", PEER_FILES, ids=lambda p: str(p.relative_to(PEER_PCAPS)))
def test_peer_pcaps_packet_counts(path: Path) -> None:
    expected = json.loads(Path(f"{path}.tshark.json").read_text())["stats"]
    reader = read_capture(path)
    segments = list(reader)
    assert reader.error is None
    assert reader.stats.packets == expected["packets"]
    assert len(segments) == reader.stats.tcp_segments > 0
    assert reader.offset == reader.size
    assert all(type(s.payload) is bytes for s in segments)


def test_peer_corpus_has_every_format() -> None:
    names = {p.name for p in PEER_FILES}
    assert len(PEER_FILES) == 40
    assert "cooper-grill-dvwa.pcapng" in names
    assert "1000-requests-one-dropped-response.pcap.gz" in names


def test_close_stops_iteration(tmp_path: Path) -> None:
    reader = read_capture(write(tmp_path, pcap_bytes([tcp_frame(i) for i in range(5)])))
    it = iter(reader)
    assert next(it).seq == 1000
    reader.close()
    assert list(it) == []
    assert reader.error is None and reader.stats.tcp_segments == 1
    unread = read_capture(write(tmp_path, pcap_bytes([tcp_frame(0)])))
    unread.close()
    assert list(unread) == []
