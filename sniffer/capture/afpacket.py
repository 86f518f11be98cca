"""Live capture from a Linux ``AF_PACKET`` socket, with a TPACKET_V3 ring.

``AfPacketSource`` opens a raw packet socket on one interface (``lo`` by
default), attaches the classic BPF filter of :mod:`sniffer.capture.bpf` in the
kernel (TCP on the wanted ports, only segments with payload or SYN/FIN/RST), and
hands out :class:`~sniffer.core.events.Segment` values in batches from ``poll()``.

Two backends:

``tpacket_v3``
    A memory-mapped RX ring (``PACKET_VERSION=TPACKET_V3`` + ``PACKET_RX_RING``).
    The kernel packs frames into blocks; a block is handed to user space when
    full or after ``block_timeout_ms``. Each frame is parsed straight out of the
    mapping: the payload is copied exactly once, into the ``Segment``.
``recv``
    The fallback when the ring cannot be set up: ``recvmsg_into`` a
    preallocated buffer, with ``SO_TIMESTAMPNS`` kernel timestamps (the wall
    clock only if a frame arrives without one).

Order of setup, so that no unfiltered packet is ever queued: the socket is
created with protocol 0 (the kernel delivers nothing to it yet), the filter,
options and ring are set, and only then is it bound to the interface with
``ETH_P_ALL``. ``PACKET_IGNORE_OUTGOING`` makes each loopback packet appear
once (the incoming copy); if the kernel refuses it, outgoing copies are dropped
by their ``sll_pkttype``.

Kernel drops (ring full, receive buffer full) are read from
``PACKET_STATISTICS`` (which resets the kernel counters on every read, so they
are accumulated here) at most every 0.5 s, and at once when the kernel marks a
ring block ``TP_STATUS_LOSING``. New drops become a ``CaptureGap(source="kernel")``
in the batch: before the packets of the first block that followed the loss when
the ring says where it was, else at the end of the batch. The gap's ``ts`` is
the capture time of the last packet delivered before it (the wall clock if no
packet was captured yet).

This is a capture module: it owns a socket and reads the clock; it logs nothing.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import select
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sniffer.capture.bpf import FilterError, build_filter, describe_filter, sock_fprog
from sniffer.capture.packet import LINKTYPE_ETHERNET, frame_parser
from sniffer.core.events import CaptureGap, Segment
from sniffer.core.native import NATIVE

if TYPE_CHECKING:
    from typing import TypeAlias

    from sniffer._native import SegmentBatch

#: what a poll gives: segments (with ``batches``, native batches of them) and
#: kernel-drop markers
PollItem: TypeAlias = "Segment | CaptureGap | SegmentBatch"

__all__ = ["AfPacketSource", "CaptureError", "CaptureStats", "have_capture_privilege"]

# --- constants from linux/if_packet.h, linux/if_ether.h, asm-generic/socket.h ---
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_IGNORE_OUTGOING = 23
TPACKET_V3 = 2
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = 35  # also SCM_TIMESTAMPNS
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_LOSING = 4

ARPHRD_ETHER = 1
ARPHRD_LOOPBACK = 772
_ETHERNET_LIKE = frozenset((ARPHRD_ETHER, ARPHRD_LOOPBACK))

#: How often poll() reads the kernel drop counters (seconds).
STATS_INTERVAL = 0.5
#: Most frames one poll() returns with the recv backend.
RECV_BATCH = 8192
#: ``finish`` waits this much past the block timeout for the kernel to hand
#: over the last block (its timer is not exact to the millisecond)
FINISH_MARGIN_MS = 10
#: Receive buffer of the recv backend: the largest frame lo or a GRO NIC makes.
RECV_BUFSIZE = 1 << 18

# struct tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1:
# block_status (+8), num_pkts (+12), offset_to_first_pkt (+16), blk_len (+20) ...
_BLOCK_STATUS = 8
_BLOCK_NUM_PKTS = 12
_BLOCK_PKTS = struct.Struct("=II")  # num_pkts, offset_to_first_pkt
_U32 = struct.Struct("=I")
# struct tpacket3_hdr: tp_next_offset, tp_sec, tp_nsec, tp_snaplen, tp_len,
# tp_status, tp_mac (u16)
_PKT_HDR = struct.Struct("=IIIIIIH")
# sockaddr_ll follows the header at TPACKET_ALIGN(sizeof(tpacket3_hdr)) = 48;
# sll_pkttype is its byte 10.
_PKT_SLL_PKTTYPE = 48 + 10
_TPACKET3_HDRLEN = 48 + 20  # header + sockaddr_ll
_REQ3 = struct.Struct("=7I")  # struct tpacket_req3
_STATS_V3 = struct.Struct("=III")  # tp_packets, tp_drops, tp_freeze_q_cnt
_STATS_V1 = struct.Struct("=II")
_TIMESPEC = struct.Struct("=qq")

_PAGE = mmap.PAGESIZE


class CaptureError(Exception):
    """The capture cannot start or go on; the message is one actionable line."""


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """The capture's counters, cumulative since it opened."""

    packets: int  # frames delivered by the kernel past the filter (outgoing copies excluded)
    bytes: int  # captured bytes of those frames
    kernel_drops: int  # frames the kernel dropped (ring or receive buffer full), cumulative
    freezes: int  # times the TPACKET_V3 ring froze because user space was behind
    backend: str  # "tpacket_v3" or "recv"
    segments: int = 0  # frames that parsed into a Segment
    unparsed: int = 0  # frames the parser did not turn into a Segment
    outgoing_skipped: int = 0  # outgoing copies dropped in user space (old kernels)
    truncated: int = 0  # frames captured shorter than on the wire (ring block too small)


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


class AfPacketSource:
    """Live TCP segments from one interface. Not thread-safe: one reader.

    >>> src = AfPacketSource("lo", ports=(8000,))       # doctest: +SKIP
    >>> src.open(); batch = src.poll(0.1); src.close()  # doctest: +SKIP
    """

    backend: str

    def __init__(
        self,
        iface: str = "lo",
        ports: Sequence[int] | None = (8000,),
        *,
        ring_blocks: int = 32,
        block_size: int = 1 << 19,
        frame_size: int = 1 << 16,
        block_timeout_ms: int = 20,
        rcvbuf: int = 64 << 20,
        use_ring: bool = True,
        batches: bool = False,
    ) -> None:
        if not iface or len(iface) >= 16 or "/" in iface or any(c.isspace() for c in iface):
            raise CaptureError(f"invalid interface name {iface!r}")
        try:
            self._program = build_filter(ports)
            self._filter_text = describe_filter(ports)
        except FilterError as exc:
            raise CaptureError(f"bad capture filter: {exc}") from None
        if use_ring:
            if block_size < _PAGE or block_size % _PAGE:
                raise CaptureError(f"block_size {block_size} must be a multiple of {_PAGE}")
            if frame_size < _TPACKET3_HDRLEN or frame_size % 16 or block_size % frame_size:
                raise CaptureError(
                    f"frame_size {frame_size} must be a multiple of 16 that divides "
                    f"block_size {block_size}"
                )
            if not 1 <= ring_blocks <= 1 << 16:
                raise CaptureError(f"ring_blocks {ring_blocks} out of range 1-65536")
            if not 0 <= block_timeout_ms <= 60_000:
                raise CaptureError(f"block_timeout_ms {block_timeout_ms} out of range 0-60000")
        self.iface = iface
        self.ports = None if ports is None else tuple(ports)
        self._ring_blocks = ring_blocks
        self._block_size = block_size
        self._frame_size = frame_size
        self._block_timeout_ms = block_timeout_ms
        self._rcvbuf = rcvbuf
        self._use_ring = use_ring
        self.backend = "tpacket_v3" if use_ring else "recv"
        self.ring_error: str | None = None  # why the ring was not used, if it was wanted

        self._sock: socket.socket | None = None
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None  # of the ring mapping
        self._poller: Any = None
        self._block = 0  # next ring block to read
        self._skip_outgoing = False
        self._parse = frame_parser(LINKTYPE_ETHERNET)
        #: the native core parses each ring block in one call: polls give
        #: ``sniffer._native.SegmentBatch`` items instead of ``Segment``s
        self._native = NATIVE if batches else None
        if batches and NATIVE is None:
            raise CaptureError("batches need the native core (sniffer._native)")
        self._recv_buf = bytearray()
        self._recv_view = memoryview(self._recv_buf)

        self._packets = 0
        self._bytes = 0
        self._segments = 0
        self._outgoing_skipped = 0
        self._truncated = 0
        self._kernel_drops = 0
        self._freezes = 0
        self._pending_drops = 0
        self._last_ts: float | None = None
        self._stats_at = float("-inf")

    # ------------------------------------------------------------------ setup

    def open(self) -> None:
        """Open the socket, attach the filter, set up the ring and bind.

        Raises :class:`CaptureError` with a one-line reason. Opening an open
        source does nothing.
        """
        if self._sock is not None:
            return
        try:
            socket.if_nametoindex(self.iface)
        except OSError:
            raise CaptureError(f"no such interface {self.iface!r}") from None
        if self._use_ring:
            try:
                self._open(ring=True)
                return
            except _RingUnavailable as exc:
                self.ring_error = str(exc)
        self._open(ring=False)

    def _open(self, *, ring: bool) -> None:
        try:
            # Protocol 0: nothing is delivered until bind() names ETH_P_ALL, so no
            # unfiltered packet can be queued while the socket is being set up.
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        except PermissionError:
            raise CaptureError(
                f"cannot open packet socket on {self.iface!r}: Operation not permitted "
                "(needs root or CAP_NET_RAW)"
            ) from None
        except OSError as exc:
            raise CaptureError(
                f"cannot open packet socket on {self.iface!r}: {_os_reason(exc)}"
            ) from None
        mm: mmap.mmap | None = None
        try:
            fprog, _keep = sock_fprog(self._program)
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
            except OSError as exc:
                raise CaptureError(f"cannot attach BPF filter: {_os_reason(exc)}") from None
            del _keep
            try:
                sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                skip_outgoing = False
            except OSError:  # kernel < 4.20
                skip_outgoing = True
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, self._rcvbuf)
            except OSError:  # needs CAP_NET_ADMIN; SO_RCVBUF is capped by rmem_max
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            if ring:
                mm = self._setup_ring(sock)
            else:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                sock.bind((self.iface, ETH_P_ALL))
            except OSError as exc:
                if exc.errno == errno.ENODEV:
                    raise CaptureError(f"no such interface {self.iface!r}") from None
                raise CaptureError(
                    f"cannot bind packet socket to {self.iface!r}: {_os_reason(exc)}"
                ) from None
            hatype = sock.getsockname()[3]
            if hatype not in _ETHERNET_LIKE:
                raise CaptureError(
                    f"interface {self.iface!r} has link type {hatype} (ARPHRD); only "
                    "Ethernet and loopback interfaces are supported"
                )
            sock.setblocking(False)
        except BaseException:
            if mm is not None:
                mm.close()
            sock.close()
            raise
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLERR)
        self._sock, self._mm, self._poller = sock, mm, poller
        self._view = None if mm is None else memoryview(mm)
        self._skip_outgoing = skip_outgoing
        self._block = 0
        self.backend = "tpacket_v3" if ring else "recv"
        if not ring:
            self._recv_buf = bytearray(RECV_BUFSIZE)
            self._recv_view = memoryview(self._recv_buf)
        self._stats_at = float("-inf")

    def _setup_ring(self, sock: socket.socket) -> mmap.mmap:
        size = self._ring_blocks * self._block_size
        try:
            sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
            req = _REQ3.pack(
                self._block_size,
                self._ring_blocks,
                self._frame_size,
                (self._block_size // self._frame_size) * self._ring_blocks,
                self._block_timeout_ms,
                0,  # tp_sizeof_priv
                0,  # tp_feature_req_word
            )
            sock.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
        except OSError as exc:
            sock.close()
            raise _RingUnavailable(f"PACKET_RX_RING refused: {_os_reason(exc)}") from None
        try:
            return mmap.mmap(
                sock.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except OSError as exc:
            sock.close()
            raise _RingUnavailable(f"cannot map {size} byte ring: {_os_reason(exc)}") from None

    # ------------------------------------------------------------------ reading

    def poll(self, timeout: float) -> list[PollItem]:
        """Wait up to ``timeout`` seconds for packets and return what is ready.

        The batch may be empty. Frames the parser cannot use are counted
        (``stats().unparsed``) and skipped; nothing here raises on bad packets.
        """
        if self._sock is None:
            raise CaptureError("capture source is not open")
        out: list[PollItem] = []
        wait_ms = max(0, int(timeout * 1000 + 0.999))
        if self._mm is not None:
            if not self._block_ready() and wait_ms:
                self._wait(wait_ms)
            assert self._view is not None
            self._drain_ring(self._mm, self._view, out)
        else:
            self._drain_recv(out, wait_ms)
        now = time.monotonic()
        if now - self._stats_at >= STATS_INTERVAL:
            self._stats_at = now
            self._read_kernel_stats()
        if self._pending_drops:
            self._emit_gap(out)
        return out

    def _wait(self, wait_ms: int) -> None:
        self._poller.poll(wait_ms)  # EINTR is retried by Python (PEP 475)

    def _block_ready(self) -> bool:
        assert self._mm is not None
        status = _U32.unpack_from(self._mm, self._block * self._block_size + _BLOCK_STATUS)[0]
        return bool(status & TP_STATUS_USER)

    def _drain_ring(self, mm: mmap.mmap, view: memoryview, out: list[Any]) -> None:
        """Every block the kernel has handed over, in ring order: its frames
        appended to ``out`` (segments, or one ``SegmentBatch`` per block with the
        native core), the block given back, a kernel-drop gap put ahead of the
        packets of a block the kernel closed while losing."""
        walk = self._walk_block if self._native is None else self._walk_block_native
        block_size = self._block_size
        nblocks = self._ring_blocks
        packets = nbytes = segments = skipped = truncated = 0
        last_ts = self._last_ts
        for _ in range(nblocks):
            base = self._block * block_size
            status = _U32.unpack_from(mm, base + _BLOCK_STATUS)[0]
            if not status & TP_STATUS_USER:
                break
            if status & TP_STATUS_LOSING:
                # Packets were dropped before this block was closed: put the gap
                # ahead of its packets.
                self._read_kernel_stats()
                self._stats_at = time.monotonic()
                if self._pending_drops:
                    self._last_ts = last_ts
                    self._emit_gap(out)
            p, n, g, k, t, ts = walk(mm, view, base, out)
            packets += p
            nbytes += n
            segments += g
            skipped += k
            truncated += t
            if ts is not None:
                last_ts = ts
            _U32.pack_into(mm, base + _BLOCK_STATUS, TP_STATUS_KERNEL)
            self._block = (self._block + 1) % nblocks
        self._last_ts = last_ts
        self._packets += packets
        self._bytes += nbytes
        self._segments += segments
        self._outgoing_skipped += skipped
        self._truncated += truncated

    def _walk_block(
        self, mm: mmap.mmap, view: memoryview, base: int, out: list[Any]
    ) -> tuple[int, int, int, int, int, float | None]:
        """The frames of the block at ``base`` to segments (the reference of
        ``sniffer._native.parse_block``): (packets, bytes, segments, outgoing
        copies skipped, truncated frames, last capture time)."""
        parse = self._parse
        unpack_pkt = _PKT_HDR.unpack_from
        skip_outgoing = self._skip_outgoing
        append = out.append
        packets = nbytes = segments = skipped = truncated = 0
        last_ts: float | None = None
        num, first = _BLOCK_PKTS.unpack_from(mm, base + _BLOCK_NUM_PKTS)
        off = base + first
        for _ in range(num):
            next_off, sec, nsec, snaplen, wirelen, _st, mac = unpack_pkt(mm, off)
            if skip_outgoing and mm[off + _PKT_SLL_PKTTYPE] == PACKET_OUTGOING:
                skipped += 1
            else:
                packets += 1
                nbytes += snaplen
                if snaplen < wirelen:
                    truncated += 1
                ts = sec + nsec * 1e-9
                last_ts = ts
                start = off + mac
                try:
                    # A view of the frame in the ring: the parser copies the
                    # payload once, into the Segment's bytes.
                    seg = parse(view[start : start + snaplen], ts)
                except Exception:  # the parser promises not to raise; stay alive anyway
                    seg = None
                if seg is not None:
                    segments += 1
                    append(seg)
            if not next_off:
                break
            off += next_off
        return packets, nbytes, segments, skipped, truncated, last_ts

    def _walk_block_native(
        self, mm: mmap.mmap, view: memoryview, base: int, out: list[Any]
    ) -> tuple[int, int, int, int, int, float | None]:
        """``_walk_block`` in one native call: the block's segments as one
        ``SegmentBatch`` (appended when it holds any)."""
        assert self._native is not None
        batch, packets, nbytes, skipped, truncated, last_ts = self._native.parse_block(
            LINKTYPE_ETHERNET, view, base, self._block_size, self._skip_outgoing
        )
        segments = len(batch)
        if segments:
            out.append(batch)
        return packets, nbytes, segments, skipped, truncated, last_ts

    def _drain_recv(self, out: list[PollItem], wait_ms: int) -> None:
        sock = self._sock
        assert sock is not None
        parse = self._parse
        buf, view = self._recv_buf, self._recv_view
        ancsize = socket.CMSG_SPACE(_TIMESPEC.size)
        waited = False
        for _ in range(RECV_BATCH):
            try:
                n, anc, flags, addr = sock.recvmsg_into([buf], ancsize)
            except BlockingIOError:
                if waited or not wait_ms or out:
                    break
                waited = True
                self._wait(wait_ms)
                continue
            if self._skip_outgoing and addr[2] == PACKET_OUTGOING:
                self._outgoing_skipped += 1
                continue
            ts: float | None = None
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(data)
                    ts = sec + nsec * 1e-9
            if ts is None:  # documented last resort: no kernel timestamp on the frame
                ts = time.time()
            self._packets += 1
            self._bytes += n
            if flags & socket.MSG_TRUNC:
                self._truncated += 1
            self._last_ts = ts
            try:
                seg = parse(view[:n], ts)
            except Exception:
                seg = None
            if seg is not None:
                self._segments += 1
                out.append(seg)

    # ------------------------------------------------------------------ drops

    def _read_kernel_stats(self) -> None:
        if self._sock is None:
            return
        try:
            raw = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _STATS_V3.size)
        except OSError:
            return
        if len(raw) >= _STATS_V3.size:
            _total, drops, freezes = _STATS_V3.unpack_from(raw)
        else:
            _total, drops = _STATS_V1.unpack_from(raw)
            freezes = 0
        self._kernel_drops += drops
        self._pending_drops += drops
        self._freezes += freezes

    def _emit_gap(self, out: list[PollItem]) -> None:
        ts = self._last_ts if self._last_ts is not None else time.time()
        out.append(CaptureGap(ts=ts, dropped=self._pending_drops, source="kernel"))
        self._pending_drops = 0

    # ------------------------------------------------------------------ info

    def stats(self) -> CaptureStats:
        """Cumulative counters. Reads the kernel drop counters now; drops not yet
        reported as a CaptureGap are reported by the next ``poll()``."""
        self._read_kernel_stats()
        return CaptureStats(
            packets=self._packets,
            bytes=self._bytes,
            kernel_drops=self._kernel_drops,
            freezes=self._freezes,
            backend=self.backend,
            segments=self._segments,
            unparsed=self._packets - self._segments,
            outgoing_skipped=self._outgoing_skipped,
            truncated=self._truncated,
        )

    def describe(self) -> str:
        """One line for logs: interface, backend, filter."""
        text = f"iface={self.iface} backend={self.backend} filter='{self._filter_text}'"
        if self._mm is not None:
            text += (
                f" ring={self._ring_blocks}x{self._block_size >> 10}KiB"
                f" timeout={self._block_timeout_ms}ms"
            )
        if self.ring_error:
            text += f" (ring unavailable: {self.ring_error})"
        return text

    @property
    def fileno(self) -> int:
        """The socket's descriptor (for an outer select loop); -1 when closed."""
        return -1 if self._sock is None else self._sock.fileno()

    # ------------------------------------------------------------------ teardown

    def finish(self) -> list[PollItem]:
        """At a stop, what the kernel captured that no poll has returned yet:
        the last moments before the stop (part of the ``Source`` protocol; the
        eBPF source returns its open connections' ends here). A TPACKET_V3
        block is handed over when full or ``block_timeout_ms`` after its first
        packet, and a capture thread told to stop ends without polling again,
        so the packets of the last streams may still be in the ring (or the
        socket's queue): every block that holds a packet captured before this
        call is handed over within one block timeout of it, so read until then,
        then what is ready, until a poll brings nothing (at most the ring's size
        in polls). Traffic that goes on after the stop fills later blocks: they
        are not waited for (waiting until a wait brought nothing read on for as
        long as the traffic lasted, up to the ring's size in block timeouts: a
        graceful restart's gap grew by as much). Call it from one thread, once
        the capture thread has stopped."""
        if self._sock is None:
            return []
        out: list[PollItem] = []
        wait = (self._block_timeout_ms + FINISH_MARGIN_MS) / 1000 if self._mm is not None else 0.0
        deadline = time.monotonic() + wait
        for _ in range(self._ring_blocks + 2):
            batch = self.poll(max(0.0, deadline - time.monotonic()))
            if not batch:
                break
            out += batch
        return out

    def close(self) -> None:
        """Unmap the ring and close the socket. Safe to call more than once."""
        mm, sock, view = self._mm, self._sock, self._view
        self._mm = self._sock = self._view = None
        self._poller = None
        if view is not None:
            view.release()
        if mm is not None:
            # The mapping holds a dup of the socket: unmap first. A frame view kept
            # by someone (the parser copies, so nobody should) would keep the ring
            # alive until it is garbage-collected.
            with contextlib.suppress(BufferError):
                mm.close()
        if sock is not None:
            sock.close()

    def __enter__(self) -> AfPacketSource:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class _RingUnavailable(Exception):
    """The TPACKET_V3 ring could not be set up (the socket is closed)."""


def have_capture_privilege() -> bool:
    """True when this process can open a packet socket: CAP_NET_RAW is in its
    effective set (root normally has it; a root without it cannot)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 13))  # CAP_NET_RAW
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0
