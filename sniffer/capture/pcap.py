"""Capture file reader: classic pcap and pcapng, plain or gzip-compressed.

>>> reader = read_capture("trace.pcapng")          # doctest: +SKIP
>>> for segment in reader:                         # doctest: +SKIP
...     ...
>>> reader.stats, reader.error                     # doctest: +SKIP

``read_capture()`` checks the file header and raises :class:`CaptureFileError`
(offset 0) when the file cannot be opened or is not a capture at all. Once
iteration has started, a truncated or corrupt file never raises: every packet
before the bad offset is yielded, then iteration stops and ``reader.error``
holds the :class:`CaptureFileError` naming that offset.

The file is mapped into memory (or, when gzip-compressed, decompressed into
memory) and walked with ``struct.unpack_from``; packets are parsed in place by
:mod:`sniffer.capture.packet`. Offsets (``.offset``, ``.size``, error offsets)
count bytes of the capture data, i.e. of the *decompressed* stream for a
gzip file.

With the native core, ``reader.segment_batches()`` gives the same segments
as batches (``sniffer._native.SegmentBatch``, a few thousand at a time, for
``Pipeline.feed_batch``): a classic pcap file is walked and its frames parsed
in Rust, one call per batch; so are a pcapng file's runs of packet and
skippable blocks (``read_pcapng``), the walk handing every other block —
section and interface descriptions, anything truncated or corrupt — back to
the Python walk's code for that one block. The stats, offsets and errors are
those of the iteration.

Supported: pcap in both byte orders with microsecond (``a1b2c3d4``) or
nanosecond (``a1b23c4d``) timestamps; pcapng with any number of sections in
either byte order, interface blocks with ``if_tsresol`` (power of 10 or of 2)
and ``if_tsoffset``, enhanced, simple and obsolete packet blocks; other blocks
are skipped by their length.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sniffer.capture.packet import (
    SUPPORTED_LINKTYPES,
    FrameParserAt,
    UnsupportedLinkType,
    frame_parser_at,
)
from sniffer.core.events import Segment
from sniffer.core.native import NATIVE

if TYPE_CHECKING:
    from sniffer._native import SegmentBatch

__all__ = [
    "CaptureFileError",
    "CaptureReader",
    "CaptureStats",
    "read_capture",
]

_PCAP_MAGIC_US = 0xA1B2C3D4
_PCAP_MAGIC_NS = 0xA1B23C4D
_PCAPNG_SHB = 0x0A0D0D0A
_PCAPNG_BOM = 0x1A2B3C4D
_GZIP_MAGIC = b"\x1f\x8b"

_BT_IDB = 0x00000001
_BT_OPB = 0x00000002  # obsolete packet block
_BT_SPB = 0x00000003
_BT_EPB = 0x00000006

_OPT_END = 0
_OPT_IF_TSRESOL = 9
_OPT_IF_TSOFFSET = 14

# Largest captured length accepted in a pcap record whatever the snaplen says
# (Wireshark's limit for ordinary link types). Anything larger is corruption.
_MAX_CAPLEN = 262144


class CaptureFileError(Exception):
    """A capture file that cannot be read, or is truncated or corrupt at ``offset``."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(slots=True)
class CaptureStats:
    """Counts over the packets read so far."""

    packets: int = 0  # all packet records/blocks
    tcp_segments: int = 0  # packets yielded as Segments
    non_tcp: int = 0  # everything else (ARP, UDP, fragments, unsupported link types, …)
    bytes: int = 0  # captured bytes of all packets (link-layer frames)
    first_ts: float | None = None
    last_ts: float | None = None


def _no_parse(buf: bytes | memoryview, ts: float, off: int = 0, end: int = -1) -> Segment | None:
    return None


def _parser_for(linktype: int) -> FrameParserAt:
    try:
        return frame_parser_at(linktype)
    except UnsupportedLinkType:
        return _no_parse


@dataclass(slots=True)
class _Interface:
    """A pcapng interface: its link type, frame parser and timestamp units."""

    linktype: int
    parse: FrameParserAt
    divisor: int  # timestamp units per second
    tsoffset: int  # seconds added to every timestamp
    snaplen: int


class CaptureReader:
    """An iterable over the TCP segments of one capture file (single pass).

    Attributes: ``format`` ("pcap" or "pcapng"), ``compressed`` (gzip),
    ``linktypes`` (distinct link types, in the order seen), ``size`` (bytes of
    capture data), ``offset`` (bytes consumed so far), ``stats``
    (:class:`CaptureStats`) and ``error`` (:class:`CaptureFileError` or ``None``).
    """

    def __init__(
        self,
        path: str,
        data: Any,
        fmt: str,
        *,
        compressed: bool,
        closer: Callable[[], None] | None = None,
        gzip_problem: str | None = None,
    ) -> None:
        self.path = path
        self.format = fmt
        self.compressed = compressed
        self.size: int = len(data)
        self.offset: int = 0
        self.stats = CaptureStats()
        self.error: CaptureFileError | None = None
        self.linktypes: list[int] = []
        self._data: Any = data
        self._closer = closer
        self._gzip_problem = gzip_problem
        self._gen: Generator[Segment, None, None] | None = None
        self._batches: Generator[SegmentBatch, None, None] | None = None
        if fmt == "pcap":
            self._init_pcap()
        else:
            self._init_pcapng()

    # -- public -------------------------------------------------------------

    def __iter__(self) -> Iterator[Segment]:
        if self._gen is None:
            self._gen = self._walk_pcap() if self.format == "pcap" else self._walk_pcapng()
        return self._gen

    def segment_batches(self, max_packets: int = 4096) -> Iterator[SegmentBatch]:
        """The segments in native batches (the native core only; see the module
        docstring). Single pass, like iterating the reader: use one or the other."""
        if NATIVE is None:
            raise RuntimeError("segment_batches needs the native core")
        if self._gen is not None:
            raise RuntimeError("the capture is already being read")
        if self.format == "pcap":
            gen = self._walk_pcap_native(max_packets)
        else:
            gen = self._walk_pcapng(max_packets)
        self._gen = self._empty()  # iterating the reader now yields nothing
        self._batches = gen
        return gen

    def close(self) -> None:
        """Stop iteration and release the file mapping. Segments already yielded stay valid."""
        gen = self._gen
        if gen is None:
            self._gen = self._empty()
        else:
            gen.close()  # runs the walk's cleanup if it is suspended; no-op once finished
        if self._batches is not None:
            self._batches.close()
        self._release()

    def _release(self) -> None:
        self._data = b""
        closer, self._closer = self._closer, None
        if closer is not None:
            closer()

    @staticmethod
    def _empty() -> Generator[Segment, None, None]:
        yield from ()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<CaptureReader {self.path!r} {self.format} offset={self.offset}/{self.size} "
            f"packets={self.stats.packets} error={self.error!s}>"
        )

    # -- classic pcap ---------------------------------------------------------

    def _init_pcap(self) -> None:
        data = self._data
        if self.size < 24:
            raise CaptureFileError(
                f"truncated pcap file header at offset 0 (needs 24 bytes, {self.size} left)", 0
            )
        (magic,) = struct.unpack_from("<I", data, 0)
        endian = "<" if magic in (_PCAP_MAGIC_US, _PCAP_MAGIC_NS) else ">"
        (magic,) = struct.unpack_from(endian + "I", data, 0)
        _major, _minor, _zone, _sigfigs, snaplen, linktype = struct.unpack_from(
            endian + "HHiIII", data, 4
        )
        linktype &= 0xFFFF  # upper bits carry FCS information
        self._endian = endian
        self._scale = 1_000_000_000 if magic == _PCAP_MAGIC_NS else 1_000_000
        self._snaplen = snaplen
        self._linktype = linktype
        self.linktypes.append(linktype)
        self.offset = 24

    def _walk_pcap(self) -> Generator[Segment, None, None]:
        data = self._data
        size = self.size
        stats = self.stats
        unpack_rec = struct.Struct(self._endian + "IIII").unpack_from
        parse = _parser_for(self._linktype)
        scale = self._scale
        limit = max(self._snaplen, _MAX_CAPLEN)
        off = 24
        packets = tcp = nbytes = 0
        ts = 0.0
        error: CaptureFileError | None = None
        try:
            while off < size:
                left = size - off
                if left < 16:
                    error = CaptureFileError(
                        f"truncated packet record header at offset {off}"
                        f" (needs 16 bytes, {left} left)",
                        off,
                    )
                    break
                sec, frac, caplen, _origlen = unpack_rec(data, off)
                if caplen > limit:
                    error = CaptureFileError(
                        f"corrupt packet record at offset {off}"
                        f" (captured length {caplen} exceeds {limit})",
                        off,
                    )
                    break
                start = off + 16
                end = start + caplen
                if end > size:
                    error = CaptureFileError(
                        f"truncated packet record at offset {off}"
                        f" (needs {16 + caplen} bytes, {left} left)",
                        off,
                    )
                    break
                ts = sec + frac / scale
                if not packets:
                    stats.first_ts = ts
                packets += 1
                nbytes += caplen
                off = end
                seg = parse(data, ts, start, end)
                if seg is not None:
                    tcp += 1
                    self.offset = off
                    stats.packets = packets
                    stats.tcp_segments = tcp
                    stats.non_tcp = packets - tcp
                    stats.bytes = nbytes
                    stats.last_ts = ts
                    yield seg
        finally:
            self._finish(off, packets, tcp, nbytes, ts, error)

    def _walk_pcap_native(self, max_packets: int) -> Generator[SegmentBatch, None, None]:
        """``_walk_pcap`` in Rust (``sniffer._native.read_pcap``), a batch per call."""
        assert NATIVE is not None
        read = NATIVE.read_pcap
        data = self._data
        size = self.size
        stats = self.stats
        linktype = self._linktype if self._linktype in SUPPORTED_LINKTYPES else 0xFFFFFFFF
        big = self._endian == ">"
        limit = max(self._snaplen, _MAX_CAPLEN)
        off = 24
        packets = tcp = nbytes = 0
        ts = 0.0
        error: CaptureFileError | None = None
        try:
            while off < size:
                batch, off, n, b, first, last, bad = read(
                    linktype, data, off, big, self._scale, limit, max_packets
                )
                if n:
                    if not packets:
                        stats.first_ts = first
                    packets += n
                    nbytes += b
                    ts = last
                if bad is not None:
                    error = _pcap_record_error(bad, size, limit)
                if len(batch):
                    tcp = self._count_batch(batch, off, packets, tcp, nbytes)
                    yield batch
                if bad is not None:
                    break
        finally:
            self._finish(off, packets, tcp, nbytes, ts, error)

    def _count_batch(
        self, batch: SegmentBatch, off: int, packets: int, tcp: int, nbytes: int
    ) -> int:
        """The stats once ``batch`` (read up to ``off``, ``packets`` packets and
        ``nbytes`` bytes so far) is handed out; the TCP segments counted so far."""
        tcp += len(batch)
        self.offset = off
        stats = self.stats
        stats.packets = packets
        stats.tcp_segments = tcp
        stats.non_tcp = packets - tcp
        stats.bytes = nbytes
        stats.last_ts = batch.last_ts
        return tcp

    # -- pcapng -------------------------------------------------------------

    def _init_pcapng(self) -> None:
        data = self._data
        endian = self._section_endian(0)  # raises: offset 0 is the file header
        if endian is None:
            raise CaptureFileError(
                "not a pcapng file: bad byte-order magic in the section header at offset 0", 0
            )
        # Look ahead for the interfaces declared before the first packet, so that
        # .linktypes is useful before iteration starts.
        hdr = struct.Struct(endian + "II").unpack_from
        off = 0
        while self.size - off >= 12:
            btype, blen = hdr(data, off)
            if blen < 12 or blen % 4 or blen > self.size - off:
                break
            if btype == _BT_IDB and blen >= 20:
                (linktype,) = struct.unpack_from(endian + "H", data, off + 8)
                if linktype not in self.linktypes:
                    self.linktypes.append(linktype)
            elif btype != _PCAPNG_SHB:
                break
            off += blen

    def _section_endian(self, off: int) -> str | None:
        """Byte order of the section header block at ``off``; raise if it is cut short."""
        left = self.size - off
        if left < 28:
            raise CaptureFileError(
                f"truncated section header block at offset {off} (needs 28 bytes, {left} left)",
                off,
            )
        (bom,) = struct.unpack_from("<I", self._data, off + 8)
        if bom == _PCAPNG_BOM:
            return "<"
        if bom == 0x4D3C2B1A:
            return ">"
        return None

    def _interface(self, endian: str, off: int, blen: int) -> _Interface:
        data = self._data
        linktype, _reserved, snaplen = struct.unpack_from(endian + "HHI", data, off + 8)
        divisor = 1_000_000
        tsoffset = 0
        pos = off + 16
        end = off + blen - 4
        opt = struct.Struct(endian + "HH").unpack_from
        while end - pos >= 4:
            code, length = opt(data, pos)
            pos += 4
            if code == _OPT_END or length > end - pos:
                break
            if code == _OPT_IF_TSRESOL and length >= 1:
                value = data[pos]
                exponent = value & 0x7F
                divisor = 2**exponent if value & 0x80 else 10**exponent
            elif code == _OPT_IF_TSOFFSET and length >= 8:
                (tsoffset,) = struct.unpack_from(endian + "q", data, pos)
            pos += (length + 3) & ~3
        if linktype not in self.linktypes:
            self.linktypes.append(linktype)
        return _Interface(linktype, _parser_for(linktype), divisor, tsoffset, snaplen)

    # One pass over the pcapng blocks, per packet on the replay path: kept whole (C901).
    def _walk_pcapng(self, native_batch: int = 0) -> Generator[Any, None, None]:  # noqa: C901
        """The pcapng blocks in order: Segments (the reference walk), or with
        ``native_batch`` (the native core) SegmentBatches: runs of packet and
        skippable blocks walked by ``sniffer._native.read_pcapng``, at most
        ``native_batch`` packets a call, which stops at any block it does not
        take (section and interface blocks, anything truncated or corrupt, a
        timestamp it cannot compute as Python does); that block is handled
        here, by the same code as in the reference walk (one place for each
        rule and message), and its segment, if any, batched alone."""
        read = NATIVE.read_pcapng if native_batch and NATIVE is not None else None
        to_batch = NATIVE.segment_batch if NATIVE is not None else None
        native_ifaces: list[tuple[int, int, int, int]] = []
        data = self._data
        size = self.size
        stats = self.stats
        off = 0
        packets = tcp = nbytes = 0
        ts = 0.0
        error: CaptureFileError | None = None
        interfaces: list[_Interface] = []
        endian = "<"
        hdr: Callable[[Any, int], tuple[Any, ...]] = struct.Struct("<II").unpack_from
        u32: Callable[[Any, int], tuple[Any, ...]] = struct.Struct("<I").unpack_from
        epb: Callable[[Any, int], tuple[Any, ...]] = struct.Struct("<IIIII").unpack_from
        opb: Callable[[Any, int], tuple[Any, ...]] = struct.Struct("<HHIIII").unpack_from
        try:
            while off < size:
                if read is not None:
                    batch, off, n, b, first, ts, refused = read(
                        data, off, endian == ">", native_ifaces, ts, native_batch
                    )
                    if n:
                        if not packets and first is not None:
                            stats.first_ts = first
                        packets += n
                        nbytes += b
                    if len(batch):
                        tcp = self._count_batch(batch, off, packets, tcp, nbytes)
                        yield batch
                    if not refused:
                        continue
                left = size - off
                if left < 12:
                    error = CaptureFileError(
                        f"truncated block header at offset {off} (needs 12 bytes, {left} left)",
                        off,
                    )
                    break
                btype, blen = hdr(data, off)
                if btype == _PCAPNG_SHB:
                    try:
                        section_endian = self._section_endian(off)
                    except CaptureFileError as exc:
                        error = exc
                        break
                    if section_endian is None:
                        error = CaptureFileError(
                            f"corrupt section header block at offset {off} (bad byte-order magic)",
                            off,
                        )
                        break
                    endian = section_endian
                    hdr = struct.Struct(endian + "II").unpack_from
                    u32 = struct.Struct(endian + "I").unpack_from
                    epb = struct.Struct(endian + "IIIII").unpack_from
                    opb = struct.Struct(endian + "HHIIII").unpack_from
                    btype, blen = hdr(data, off)
                    interfaces = []
                    native_ifaces = []
                if blen < 12 or blen & 3:
                    error = CaptureFileError(
                        f"corrupt block at offset {off} (block length {blen})", off
                    )
                    break
                if blen > left:
                    error = CaptureFileError(
                        f"truncated block at offset {off} (needs {blen} bytes, {left} left)", off
                    )
                    break
                if u32(data, off + blen - 4)[0] != blen:
                    error = CaptureFileError(
                        f"corrupt block at offset {off} (trailing length does not match {blen})",
                        off,
                    )
                    break
                if btype in (_BT_EPB, _BT_OPB):
                    if blen < 32:
                        error = CaptureFileError(
                            f"corrupt packet block at offset {off} (block length {blen})", off
                        )
                        break
                    if btype == _BT_EPB:
                        ifid, ts_hi, ts_lo, caplen, _origlen = epb(data, off + 8)
                    else:
                        ifid, _drops, ts_hi, ts_lo, caplen, _origlen = opb(data, off + 8)
                    start = off + 28
                    end = start + caplen
                    if end > off + blen - 4:
                        error = CaptureFileError(
                            f"corrupt packet block at offset {off} (captured length {caplen}"
                            f" does not fit in block length {blen})",
                            off,
                        )
                        break
                    packets += 1
                    nbytes += caplen
                    if ifid >= len(interfaces):
                        off += blen
                        continue  # no such interface: counted, not parsed
                    iface = interfaces[ifid]
                    ts = ((ts_hi << 32) | ts_lo) / iface.divisor + iface.tsoffset
                elif btype == _BT_SPB:
                    if blen < 16:
                        error = CaptureFileError(
                            f"corrupt simple packet block at offset {off} (block length {blen})",
                            off,
                        )
                        break
                    (origlen,) = u32(data, off + 8)
                    caplen = min(origlen, blen - 16)
                    packets += 1
                    if not interfaces:
                        nbytes += caplen
                        off += blen
                        continue
                    iface = interfaces[0]
                    if iface.snaplen and caplen > iface.snaplen:
                        caplen = iface.snaplen
                    nbytes += caplen
                    start = off + 12
                    end = start + caplen
                    # no timestamp: reuse the previous packet's
                elif btype == _BT_IDB:
                    if blen < 20:
                        error = CaptureFileError(
                            f"corrupt interface description block at offset {off}"
                            f" (block length {blen})",
                            off,
                        )
                        break
                    iface = self._interface(endian, off, blen)
                    interfaces.append(iface)
                    native_ifaces.append(_native_interface(iface))
                    off += blen
                    continue
                else:
                    off += blen  # section header, statistics, name resolution, custom…
                    continue
                if packets == 1:
                    stats.first_ts = ts
                off += blen
                seg = iface.parse(data, ts, start, end)
                if seg is not None:
                    tcp += 1
                    self.offset = off
                    stats.packets = packets
                    stats.tcp_segments = tcp
                    stats.non_tcp = packets - tcp
                    stats.bytes = nbytes
                    stats.last_ts = ts
                    yield seg if read is None or to_batch is None else to_batch([seg])
        finally:
            self._finish(off, packets, tcp, nbytes, ts, error)

    # -- common -----------------------------------------------------------------

    def _finish(
        self,
        off: int,
        packets: int,
        tcp: int,
        nbytes: int,
        ts: float,
        error: CaptureFileError | None,
    ) -> None:
        stats = self.stats
        self.offset = off
        stats.packets = packets
        stats.tcp_segments = tcp
        stats.non_tcp = packets - tcp
        stats.bytes = nbytes
        if packets:
            stats.last_ts = ts
        if off < self.size and error is None:
            return  # the consumer stopped early: nothing is wrong with the file
        if self._gzip_problem is not None:
            if error is None:
                error = CaptureFileError(
                    f"{self._gzip_problem} at offset {off} of the decompressed data", off
                )
            else:
                error = CaptureFileError(f"{error} ({self._gzip_problem})", error.offset)
        self.error = error
        self._release()


# Largest timestamp divisor the native pcapng walk takes: up to 2^53 it
# divides exactly as Python's int/int (pcapng.rs `div_round`).
_NATIVE_MAX_DIVISOR = 1 << 53


def _native_interface(iface: _Interface) -> tuple[int, int, int, int]:
    """``iface`` for ``read_pcapng``: (linktype, or 0xFFFFFFFF if the native
    core does not parse it; divisor, or 0 if the native walk must hand its
    packets back; tsoffset; snaplen)."""
    linktype = iface.linktype if iface.linktype in SUPPORTED_LINKTYPES else 0xFFFFFFFF
    divisor = iface.divisor if iface.divisor <= _NATIVE_MAX_DIVISOR else 0
    return (linktype, divisor, iface.tsoffset, iface.snaplen)


def _pcap_record_error(bad: tuple[str, int, int], size: int, limit: int) -> CaptureFileError:
    """The error ``_walk_pcap`` gives for a bad record (``read_pcap``'s report)."""
    kind, off, value = bad
    left = size - off
    if kind == "header":
        return CaptureFileError(
            f"truncated packet record header at offset {off} (needs 16 bytes, {left} left)", off
        )
    if kind == "caplen":
        return CaptureFileError(
            f"corrupt packet record at offset {off} (captured length {value} exceeds {limit})", off
        )
    return CaptureFileError(
        f"truncated packet record at offset {off} (needs {16 + value} bytes, {left} left)", off
    )


def _gunzip(raw: bytes) -> tuple[bytes, str | None]:
    """Decompress every gzip member; on damage return what came out and why it stopped."""
    out: list[bytes] = []
    rest = raw
    while rest:
        dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out.append(dec.decompress(rest))
        except zlib.error as exc:
            return b"".join(out), f"corrupt gzip stream ({exc})"
        if not dec.eof:
            out.append(dec.flush())
            return b"".join(out), "truncated gzip stream"
        rest = dec.unused_data
        if rest and not rest.startswith(_GZIP_MAGIC):
            break  # trailing garbage after the last member (gzip(1) ignores it too)
    return b"".join(out), None


def _closer(mapped: mmap.mmap, fh: Any) -> Callable[[], None]:
    def close() -> None:
        mapped.close()
        fh.close()

    return close


def _format_of(head: bytes) -> str | None:
    if len(head) < 4:
        return None
    (le,) = struct.unpack_from("<I", head, 0)
    (be,) = struct.unpack_from(">I", head, 0)
    if _PCAP_MAGIC_US in (le, be) or _PCAP_MAGIC_NS in (le, be):
        return "pcap"
    if le == _PCAPNG_SHB:
        return "pcapng"
    return None


def read_capture(path: str | os.PathLike[str]) -> CaptureReader:
    """Open a pcap or pcapng file (gzip-compressed or not) for reading.

    Raises :class:`CaptureFileError` (offset 0) if the file cannot be opened,
    is empty, or is not a pcap/pcapng capture (checked from its first bytes,
    whatever its extension). Damage found later is reported in
    ``reader.error`` once iteration stops, never raised.
    """
    name = os.fspath(path)
    try:
        fh = open(name, "rb")  # noqa: SIM115 - closed by the reader (mmap) or below
    except OSError as exc:
        raise CaptureFileError(
            f"cannot open capture file {name}: {exc.strerror or exc}", 0
        ) from exc
    closer: Callable[[], None] | None = None
    gzip_problem: str | None = None
    compressed = False
    try:
        head = fh.read(2)
        fh.seek(0)
        data: Any
        if head == _GZIP_MAGIC:
            compressed = True
            data, gzip_problem = _gunzip(fh.read())
            fh.close()
        else:
            try:
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError):  # empty file, pipe, special file
                data = fh.read()
                fh.close()
            else:
                data = mapped
                closer = _closer(mapped, fh)

    except OSError as exc:
        fh.close()
        raise CaptureFileError(
            f"cannot read capture file {name}: {exc.strerror or exc}", 0
        ) from exc

    head = bytes(data[:4])
    fmt = _format_of(head)
    if fmt is None:
        what = "gzip-compressed file" if compressed else "file"
        if not head:
            message = f"{name}: empty {what}, not a pcap or pcapng capture"
        else:
            message = (
                f"{name}: not a pcap or pcapng capture (unknown magic {head.hex()} at offset 0"
                f" of the {what})"
            )
        if closer is not None:
            closer()
        raise CaptureFileError(message, 0)
    try:
        return CaptureReader(
            name, data, fmt, compressed=compressed, closer=closer, gzip_problem=gzip_problem
        )
    except CaptureFileError:
        if closer is not None:
            closer()
        raise
