"""Load the SparSEEty eBPF program and turn its ring records into flow events.

The kernel side (``sparseety.bpf.c``) sees the bytes a process hands to
``write``/``sendto``/``writev``/``sendmsg`` and gets back from
``read``/``recvfrom``/``readv``/``recvmsg`` on its TCP sockets. No packet is
reassembled: every record already carries in-order bytes of one direction of
one socket, with the byte offset of that direction before the record. This
module only checks those offsets and maps records to ``sniffer.core.events``.

Loading uses Debian's ``libbpf.so.1`` through ctypes (no pylibbpf, no bcc).

Selection (all done in the kernel, before a record is written):

* ``pids`` (thread-group ids) and ``comms`` (the calling thread's name,
  15 characters at most) select *processes*: a process is selected when its
  tgid is in ``pids`` or its comm is in ``comms``. With neither, every process
  is selected except the reading process itself.
* ``ports`` selects *sockets* whose local or remote port is in the set. When
  both kinds are given, a record must pass both.
* With ``ports`` and no process selector, a socket that matched only by its
  remote port and whose peer is a loopback address is skipped: the server
  side of that same connection is on this host and selected too, so each
  connection is recorded once, from the server's socket.

Client or server, per connection (the traced socket is one end of it):

1. the side whose port is in ``ports`` is the server;
2. else the side that was opened passively (seen as ``SYN_RECV ->
   ESTABLISHED`` while the program was attached) is the server;
3. else the side with the lower port is the server (ephemeral ports are high).

Bytes the server's socket received are ``from_client=True``; if the traced
socket is the client's, bytes it sent are.

Loss: every data record carries the byte offset of its direction, so a
missing record shows as a jump and becomes ``FlowGap(nbytes=jump,
reason="ebpf-lost")``. The kernel also counts lost bytes per connection; when
the global lost counter grows, open connections are checked against it at
once, so a loss is reported even before a later record reveals the jump (the
later jump is then not reported twice). A connection first seen without its
opening handshake (it predates the capture) starts with a
``FlowGap(nbytes=None, reason="midstream")`` in both directions.

Graceful restart: the offsets count from where THIS program first saw the
socket, so a new instance's offsets say nothing of what the old one saw. Every
data record therefore also carries (``aux``) the TCP sequence number of its
direction's offset 0, read from the socket itself (``write_seq`` after a send,
``copied_seq`` after a read): a count the kernel keeps for the socket's whole
life. ``checkpoint_positions`` gives, per open connection, the socket (its
``struct sock`` address and endpoints) and the sequence number of the next byte
per direction; ``adopt`` (before ``open``) takes such positions from the
previous instance: the first records of an adopted socket continue the SAME
connection id (no ``ConnectionOpened``, no "midstream" gap) after a
``FlowGap(reason="restart")`` of exactly the bytes the application moved
while no program was attached (``nbytes=None`` when a direction's position is
unknown).
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sniffer.core.events import (
    ConnectionClosed,
    ConnectionOpened,
    Endpoint,
    FlowAnomaly,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
)

__all__ = ["EbpfError", "EbpfSource", "default_obj_path"]

#: Names of the BPF programs in the object; all start with this prefix.
PROG_PREFIX = "spy_"

# --- record layout: mirrors struct rec_hdr in sparseety.bpf.c -----------------
HDR = struct.Struct("<QQQQIIIIiHHBBBBB3x16s16s16s")
HDR_FIELDS = (
    "ts", "sk", "offset", "aux", "serial", "len", "tgid", "pid", "fd", "lport", "rport",
    "kind", "dir", "role", "family", "state", "pad", "laddr", "raddr", "comm",
)  # fmt: skip
assert HDR.size == 112
K_DATA, K_EOF, K_SHUTDOWN, K_CLOSE = 1, 2, 3, 4
D_SENT, D_RECV = 0, 1
R_UNKNOWN, R_CLIENT, R_SERVER = 0, 1, 2
F_PIDS, F_COMMS, F_PORTS, F_DEDUPE = 1, 2, 4, 8
C_LOST_RECORDS, C_LOST_BYTES, C_READ_ERRORS, C_SERIAL, C_IOV_TRUNC = 0, 1, 2, 3, 4
C_NSLOTS = 8
#: K_DATA aux: SEQ_KNOWN | TCP sequence number of the direction's offset 0
SEQ_KNOWN = 1 << 32
_SEQ_MASK = 0xFFFFFFFF
#: A restart gap larger than this is not believed (sequence numbers wrapped,
#: or the address was reused by another socket): recorded as of unknown size.
_MAX_RESTART_GAP = 1 << 30
#: Seconds an adopted socket may stay silent and still be handed over again
#: (an instance stopped right after it started; after that it is over).
RESUME_SILENCE = 60.0
#: struct conn: off[2], lost[2], serial, role (+ padding)
CONN = struct.Struct("<QQQQIB3x")
# TCP states (include/net/tcp_states.h) that end in TCP_CLOSE by a reset/abort.
_RST_FROM = {1, 2, 3, 8}  # ESTABLISHED, SYN_SENT, SYN_RECV, CLOSE_WAIT

_CAP_SYS_ADMIN, _CAP_PERFMON, _CAP_BPF = 21, 38, 39
_TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
_BTF = "/sys/kernel/btf/vmlinux"

#: what the sample callback returns to end one drain early (libbpf passes it back)
_BATCH_FULL = errno_mod.ECANCELED

_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class EbpfError(Exception):
    """The eBPF backend cannot run here; the message names what is missing."""


def default_obj_path() -> Path:
    """Where ``build.sh`` puts the compiled object."""
    return Path(__file__).resolve().parent / "sparseety.bpf.o"


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _has_privileges() -> bool:
    caps = _effective_caps()
    if caps >> _CAP_SYS_ADMIN & 1:
        return True
    return bool(caps >> _CAP_BPF & 1 and caps >> _CAP_PERFMON & 1)


def _tracefs_ready() -> bool:
    return any(os.path.isdir(os.path.join(p, "events", "syscalls")) for p in _TRACEFS)


def _try_mount_tracefs() -> None:
    """Mount tracefs at /sys/kernel/tracing if it exists and is empty (root only)."""
    target = _TRACEFS[0]
    if not os.path.isdir(target) or os.listdir(target):
        return
    import ctypes.util  # (runs ldconfig; only here)

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount(b"tracefs", target.encode(), b"tracefs", 0, None)


def check_environment() -> None:
    """Raise ``EbpfError`` naming the first missing piece (BTF, tracefs, privileges)."""
    if not os.path.exists(_BTF):
        raise EbpfError(f"kernel has no BTF ({_BTF} missing)")
    if not _has_privileges():
        raise EbpfError("needs root or CAP_BPF+CAP_PERFMON")
    if not _tracefs_ready():
        _try_mount_tracefs()
    if not _tracefs_ready():
        if any(os.path.isdir(os.path.join(p, "events")) for p in _TRACEFS):
            raise EbpfError("kernel has no syscall tracepoints (CONFIG_FTRACE_SYSCALLS)")
        raise EbpfError("tracefs not mounted (mount -t tracefs nodev /sys/kernel/tracing)")


def _load_libbpf() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError as exc:
        raise EbpfError("libbpf.so.1 not found (apt-get install libbpf1)") from exc
    vp, c_int, c_char_p = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    protos: dict[str, tuple[Any, list[Any]]] = {
        "bpf_object__open_file": (vp, [c_char_p, vp]),
        "bpf_object__load": (c_int, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__next_program": (vp, [vp, vp]),
        "bpf_object__find_map_by_name": (vp, [vp, c_char_p]),
        "bpf_program__name": (c_char_p, [vp]),
        "bpf_program__attach": (vp, [vp]),
        "bpf_link__destroy": (c_int, [vp]),
        "bpf_map__fd": (c_int, [vp]),
        "bpf_map__set_max_entries": (c_int, [vp, ctypes.c_uint32]),
        "bpf_map_update_elem": (c_int, [c_int, vp, vp, ctypes.c_uint64]),
        "bpf_map_lookup_elem": (c_int, [c_int, vp, vp]),
        "ring_buffer__new": (vp, [c_int, _SAMPLE_FN, vp, vp]),
        "ring_buffer__poll": (c_int, [vp, c_int]),
        "ring_buffer__consume": (c_int, [vp]),
        "ring_buffer__free": (None, [vp]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def _addr(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    text = socket.inet_ntop(socket.AF_INET6, raw)
    return text[7:] if text.startswith("::ffff:") and "." in text else text


def _clock_offset() -> float:
    """REALTIME − MONOTONIC, from the tightest of a few bracketed samples."""
    best: tuple[float, float] | None = None
    for _ in range(7):
        m0 = time.clock_gettime(time.CLOCK_MONOTONIC)
        r = time.clock_gettime(time.CLOCK_REALTIME)
        m1 = time.clock_gettime(time.CLOCK_MONOTONIC)
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, r - (m0 + m1) / 2)
    assert best is not None
    return best[1]


@dataclass(slots=True)
class _Conn:
    """A traced socket's connection: its ids and per-direction offsets."""

    conn: int
    sk: int
    serial: int
    server_side: bool  # the traced socket is the server's end
    expected: list[int] = field(default_factory=lambda: [0, 0])  # next offset per dir
    lost_reported: list[int] = field(default_factory=lambda: [0, 0])
    prereported: list[int] = field(default_factory=lambda: [0, 0])
    ended: list[bool] = field(default_factory=lambda: [False, False])
    #: TCP sequence number of offset 0 per direction (from the records), if known
    seq0: list[int | None] = field(default_factory=lambda: [None, None])
    #: adopted: the previous instance's next sequence number per direction, until
    #: the first record of that direction shows the gap (None: unknown)
    resume: list[int | None] | None = None
    endpoints: tuple[Endpoint, Endpoint] = (("", 0), ("", 0))  # (local, remote)

    def from_client(self, direction: int) -> bool:
        return (direction == D_RECV) == self.server_side


class EbpfSource:
    """Syscall-level capture of selected processes' TCP bytes.

    ``open()`` loads and attaches; ``poll(timeout)`` returns the flow events
    that arrived; ``close()`` detaches everything. Usable as a context manager.
    """

    #: records turned into events per ``poll()`` at most (the rest stay in the ring)
    max_batch = 2048

    def __init__(
        self,
        *,
        ports: Sequence[int] = (),
        pids: Sequence[int] = (),
        comms: Sequence[str] = (),
        ring_bytes: int = 8 << 20,
        obj_path: str | None = None,
        conn_id_base: int = 1,
        exclude_self: bool = True,
        conn_ids: Callable[[], int] | None = None,
        idle_timeout: float = 300.0,
    ) -> None:
        for p in ports:
            if not 0 < int(p) < 65536:
                raise ValueError(f"port out of range: {p}")
        for c in comms:
            if not c or len(c.encode()) > 15:
                raise ValueError(f"comm must be 1..15 bytes: {c!r}")
        if ring_bytes < 4096 or ring_bytes & (ring_bytes - 1):
            raise ValueError("ring_bytes must be a power of two >= 4096")
        self.ports = tuple(sorted({int(p) for p in ports}))
        self.pids = tuple(sorted({int(p) for p in pids}))
        self.comms = tuple(sorted(set(comms)))
        self.ring_bytes = ring_bytes
        self.obj_path = Path(obj_path) if obj_path else default_obj_path()
        self.exclude_self = exclude_self
        #: an adopted socket silent this long (seconds) is taken for closed
        #: while no instance ran: its row ends as gapped
        self.idle_timeout = idle_timeout
        self._next_expiry = 0.0
        self._next_conn = conn_id_base
        #: hands out connection ids when given (the store's id blocks)
        self._conn_ids = conn_ids
        self._lib: ctypes.CDLL | None = None
        self._obj: int | None = None
        self._links: list[int] = []
        self._prog_names: list[str] = []
        self._rb: int | None = None
        self._cb: Any = None  # keeps the ctypes callback alive
        self._raw: list[bytes] = []
        self._conns: dict[tuple[int, int], _Conn] = {}
        #: sockets handed over by a previous instance (``adopt``), by sk
        self._adopted: dict[int, dict[str, Any]] = {}
        #: sockets handed over to the next instance (``forget``): their later
        #: records are that instance's (its sequence numbers size the gap)
        self._handed: set[int] = set()
        self._map_fds: dict[str, int] = {}
        self._clock = 0.0
        self._last_ts = 0.0
        self._kernel_counters = [0] * C_NSLOTS
        self._stats = {
            "records": 0,
            "bytes": 0,
            "lost_records": 0,
            "lost_bytes": 0,
            "read_errors": 0,
            "iov_truncated_bytes": 0,
            "connections": 0,
            "open_connections": 0,
            "gaps": 0,
            "gap_bytes": 0,
            "unnumbered_records": 0,  # dropped: no connection id (database unreachable)
            "handed_records": 0,  # after the checkpoint, of sockets handed over
        }

    # -- lifecycle -------------------------------------------------------------

    def __enter__(self) -> EbpfSource:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Check the environment, load the object, set the filters, attach, map the ring."""
        if self._obj is not None:
            return
        check_environment()
        if not self.obj_path.is_file():
            raise EbpfError(f"compiled BPF object not found: run make ebpf ({self.obj_path})")
        lib = _load_libbpf()
        self._lib = lib
        try:
            self._open_load_attach(lib)
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str) -> EbpfError:
        err = ctypes.get_errno()
        name = errno_mod.errorcode.get(err, str(err))
        hint = ""
        if err == errno_mod.EPERM:
            hint = " (needs root or CAP_BPF+CAP_PERFMON; lockdown or seccomp may forbid BPF)"
        return EbpfError(f"{what} failed: {name} {os.strerror(err)}{hint}")

    def _open_load_attach(self, lib: ctypes.CDLL) -> None:
        obj = lib.bpf_object__open_file(str(self.obj_path).encode(), None)
        if not obj:
            raise self._fail(f"bpf_object__open_file({self.obj_path})")
        self._obj = obj
        rb_map = lib.bpf_object__find_map_by_name(obj, b"rb")
        if not rb_map or lib.bpf_map__set_max_entries(rb_map, self.ring_bytes) != 0:
            raise EbpfError("BPF object has no ring buffer map 'rb' (rebuild: run make ebpf)")
        if lib.bpf_object__load(obj) != 0:
            raise self._fail("bpf_object__load (verifier log above)")
        for name in ("rb", "cfg", "pids", "comms", "ports", "conns", "counters"):
            m = lib.bpf_object__find_map_by_name(obj, name.encode())
            if not m:
                raise EbpfError(f"BPF object has no map {name!r} (rebuild: run make ebpf)")
            self._map_fds[name] = lib.bpf_map__fd(m)
        self._write_filters()
        self._clock = _clock_offset()
        prog = lib.bpf_object__next_program(obj, None)
        while prog:
            name = (lib.bpf_program__name(prog) or b"?").decode()
            link = lib.bpf_program__attach(prog)
            if not link:
                raise self._fail(f"attaching {name}")
            self._links.append(link)
            self._prog_names.append(name)
            prog = lib.bpf_object__next_program(obj, prog)
        self._cb = _SAMPLE_FN(self._on_sample)
        rb = lib.ring_buffer__new(self._map_fds["rb"], self._cb, None, None)
        if not rb:
            raise self._fail("ring_buffer__new")
        self._rb = rb

    def _update(self, name: str, key: bytes, value: bytes) -> None:
        assert self._lib is not None
        k = ctypes.create_string_buffer(key, len(key))
        v = ctypes.create_string_buffer(value, len(value))
        if self._lib.bpf_map_update_elem(self._map_fds[name], k, v, 0) != 0:
            raise self._fail(f"setting {name} filter")

    def _write_filters(self) -> None:
        flags = 0
        for pid in self.pids:
            self._update("pids", struct.pack("<I", pid), b"\x01")
            flags |= F_PIDS
        for comm in self.comms:
            self._update("comms", comm.encode().ljust(16, b"\0"), b"\x01")
            flags |= F_COMMS
        for port in self.ports:
            self._update("ports", struct.pack("<H", port), b"\x01")
            flags |= F_PORTS
        if flags & F_PORTS and not flags & (F_PIDS | F_COMMS):
            flags |= F_DEDUPE
        me = os.getpid() if self.exclude_self else 0
        self._update("cfg", struct.pack("<I", 0), struct.pack("<II", flags, me))

    def close(self) -> None:
        """Detach every program, free the ring and the object. Idempotent."""
        lib = self._lib
        if lib is None:
            return
        if self._rb is not None:
            lib.ring_buffer__free(self._rb)
            self._rb = None
        while self._links:
            lib.bpf_link__destroy(self._links.pop())
        if self._obj is not None:
            lib.bpf_object__close(self._obj)
            self._obj = None
        self._map_fds.clear()
        self._lib = None

    # -- reading ---------------------------------------------------------------

    def _on_sample(self, _ctx: int | None, data: int | None, size: int) -> int:
        if data:
            self._raw.append(ctypes.string_at(data, size))
        # Stop libbpf's drain loop after a batch: a writer that never pauses
        # would otherwise keep us consuming while nothing is turned into events,
        # and the unprocessed backlog would stall the next drain.
        return -_BATCH_FULL if len(self._raw) >= self.max_batch else 0

    def poll(self, timeout: float) -> list[FlowEvent]:
        """Wait up to ``timeout`` seconds for records; return their flow events."""
        if self._rb is None or self._lib is None:
            return []
        n = self._lib.ring_buffer__poll(self._rb, max(0, int(timeout * 1000)))
        if n < 0 and -n not in (errno_mod.EINTR, _BATCH_FULL):
            raise EbpfError(f"ring_buffer__poll failed: {os.strerror(-n)}")
        out: list[FlowEvent] = []
        self._process(out)
        self._check_counters(out)
        if self._adopted:
            self._expire_adopted(out, time.monotonic())
        return out

    def _expire_adopted(self, out: list[FlowEvent], now: float) -> None:
        """End the adopted sockets silent for ``idle_timeout``: they closed while
        no instance ran (no record will ever come), or went idle like any
        connection the idle timeout ends. Checked at most once a second."""
        if now < self._next_expiry:
            return
        self._next_expiry = now + 1.0
        for sk in [sk for sk, a in self._adopted.items() if now - a["at"] >= self.idle_timeout]:
            self._end_adopted(out, self._adopted.pop(sk)["conn"], self._last_ts or time.time())

    @staticmethod
    def _end_adopted(out: list[FlowEvent], conn: int, ts: float) -> None:
        # whatever the server sent after the checkpoint was missed (count unknown)
        out.append(FlowGap(conn, ts, False, None, "restart"))
        out.append(FlowEnd(conn, ts, True, "eof"))
        out.append(FlowEnd(conn, ts, False, "eof"))
        out.append(ConnectionClosed(conn, ts, "eof"))

    def _consume(self, out: list[FlowEvent]) -> None:
        if self._rb is not None and self._lib is not None:
            self._lib.ring_buffer__consume(self._rb)
        self._process(out)

    def _process(self, out: list[FlowEvent]) -> None:
        raw, self._raw = self._raw, []
        start = len(out)
        for rec in raw:
            if len(rec) < HDR.size:
                continue
            h = HDR.unpack_from(rec)
            ts_ns, sk, offset, aux, serial, length, tgid, _pid, _fd, lport, rport = h[:11]
            kind, direction, role, family, state, laddr, raddr, comm = h[11:]
            ts = ts_ns / 1e9 + self._clock
            self._last_ts = max(self._last_ts, ts)
            key = (sk, serial)
            c = self._conns.get(key)
            if c is None and sk in self._handed:
                # written after the checkpoint: the next instance counts these
                # bytes in its restart gap; a new connection here would be a
                # second, empty row for the stream
                self._stats["handed_records"] += 1
                continue
            if c is None and self._adopted:
                c = self._adopt_conn(out, key, ts, family, laddr, lport, raddr, rport)
            if c is None:
                if kind == K_CLOSE and offset == 0 and aux == 0:
                    continue
                try:
                    c = self._open_conn(
                        out, key, ts, family, laddr, lport, raddr, rport, role, tgid, comm
                    )
                except Exception:  # no connection id to be had (database away): record lost
                    self._stats["unnumbered_records"] += 1
                    continue
            d = direction & 1
            if kind == K_DATA:
                self._stats["records"] += 1
                if aux & SEQ_KNOWN and c.seq0[d] is None:
                    c.seq0[d] = aux & _SEQ_MASK
                if c.resume is not None:
                    self._resume(out, c, d, offset, ts)
                data = self._check_offset(out, c, d, offset, ts, rec[HDR.size : HDR.size + length])
                if data:
                    self._stats["bytes"] += len(data)
                    out.append(FlowData(c.conn, ts, c.from_client(d), data))
            elif kind in (K_EOF, K_SHUTDOWN):
                if c.resume is not None:
                    self._resume(out, c, d, None, ts)
                self._check_offset(out, c, d, offset, ts, b"")
                self._end(out, c, d, ts, "fin")
            elif kind == K_CLOSE:
                if c.resume is not None:
                    self._resume(out, c, D_SENT, None, ts)
                    self._resume(out, c, D_RECV, None, ts)
                self._check_offset(out, c, D_SENT, offset, ts, b"")
                self._check_offset(out, c, D_RECV, aux, ts, b"")
                self._close(out, c, ts, "rst" if state in _RST_FROM else "fin")
        _merge_syscall_pieces(out, start)

    def _open_conn(
        self,
        out: list[FlowEvent],
        key: tuple[int, int],
        ts: float,
        family: int,
        laddr: bytes,
        lport: int,
        raddr: bytes,
        rport: int,
        role: int,
        tgid: int,
        comm: bytes,
    ) -> _Conn:
        local: Endpoint = (_addr(family, laddr), lport)
        remote: Endpoint = (_addr(family, raddr), rport)
        if lport in self.ports:
            server_side = True
        elif rport in self.ports:
            server_side = False
        elif role != R_UNKNOWN:
            server_side = role == R_SERVER
        else:
            server_side = lport <= rport
        if self._conn_ids is not None:
            c = _Conn(self._conn_ids(), key[0], key[1], server_side)
        else:
            c = _Conn(self._next_conn, key[0], key[1], server_side)
            self._next_conn += 1
        self._conns[key] = c
        c.endpoints = (local, remote)
        self._stats["connections"] += 1
        client, server = (remote, local) if server_side else (local, remote)
        name = comm.split(b"\0", 1)[0].decode("utf-8", "replace") or None
        out.append(
            ConnectionOpened(
                conn=c.conn,
                ts=ts,
                client=client,
                server=server,
                syn_seen=role != R_UNKNOWN,
                capture="ebpf",
                pid=tgid or None,
                comm=name if tgid else None,
            )
        )
        if role == R_UNKNOWN:
            for d in (D_RECV, D_SENT):
                out.append(FlowGap(c.conn, ts, c.from_client(d), None, "midstream"))
        return c

    # -- graceful restart --------------------------------------------------------

    def checkpoint_positions(self) -> dict[int, dict[str, Any]]:
        """Per open connection id, what a restarted instance needs to pick the
        socket up (JSON-ready): its ``struct sock`` address, endpoints, which
        end the traced socket is, and the TCP sequence number of the next byte
        per direction (sent, received; None when no record showed it)."""
        out: dict[int, dict[str, Any]] = {}
        for c in self._conns.values():
            if c.ended[D_SENT] or c.ended[D_RECV]:
                continue
            seq: list[int | None] = []
            for d in (D_SENT, D_RECV):
                base = c.seq0[d]
                if base is None:
                    # adopted and this direction not seen since: still where it was
                    then = c.resume[d] if c.resume is not None else None
                    seq.append(then if then is not None and then >= 0 else None)
                    continue
                seq.append((base + c.expected[d]) & _SEQ_MASK)
            local, remote = c.endpoints
            out[c.conn] = {
                "sk": c.sk,
                "local": list(local),
                "remote": list(remote),
                "server_side": c.server_side,
                "seq": seq,
            }
        now = time.monotonic()
        for sk, a in self._adopted.items():
            if now - a["at"] <= RESUME_SILENCE:
                # adopted and not heard from yet: still where it was
                out[a["conn"]] = {
                    "sk": sk,
                    "local": list(a["local"]),
                    "remote": list(a["remote"]),
                    "server_side": a["server_side"],
                    "seq": list(a["seq"]),
                }
        return out

    def forget(self, conns: Sequence[int]) -> None:
        """Drop these connections without ending them (checkpointed): ``finish``
        leaves them open for the next instance, and records of their sockets
        still arriving (the streams go on) are left to it too."""
        ids = set(conns)
        for key in [k for k, c in self._conns.items() if c.conn in ids]:
            del self._conns[key]
            self._handed.add(key[0])
        for sk in [sk for sk, a in self._adopted.items() if a["conn"] in ids]:
            del self._adopted[sk]
            self._handed.add(sk)

    def adopt(self, entries: Sequence[tuple[int, dict[str, Any]]]) -> int:
        """(connection id, ``checkpoint_positions`` entry) pairs from a previous
        instance: records of those sockets continue those connection ids. Call
        before ``open``. Returns how many were taken (malformed ones are skipped)."""
        n = 0
        for conn, pos in entries:
            try:
                seq = [None if v is None else int(v) & _SEQ_MASK for v in pos["seq"]]
                self._adopted[int(pos["sk"])] = {
                    "conn": int(conn),
                    "local": (str(pos["local"][0]), int(pos["local"][1])),
                    "remote": (str(pos["remote"][0]), int(pos["remote"][1])),
                    "server_side": bool(pos["server_side"]),
                    "seq": [seq[0], seq[1]],
                    "at": time.monotonic(),
                }
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            n += 1
        return n

    def _adopt_conn(
        self,
        out: list[FlowEvent],
        key: tuple[int, int],
        ts: float,
        family: int,
        laddr: bytes,
        lport: int,
        raddr: bytes,
        rport: int,
    ) -> _Conn | None:
        """The first record of a socket a previous instance handed over: the
        same connection id, nothing opened (its row exists)."""
        a = self._adopted.get(key[0])
        if a is None:
            return None
        local: Endpoint = (_addr(family, laddr), lport)
        remote: Endpoint = (_addr(family, raddr), rport)
        if (local, remote) != (a["local"], a["remote"]):
            return None  # the address now belongs to another socket
        del self._adopted[key[0]]
        c = _Conn(a["conn"], key[0], key[1], a["server_side"])
        c.endpoints = (local, remote)
        c.resume = list(a["seq"])
        self._conns[key] = c
        self._stats["connections"] += 1
        return c

    def _resume(
        self, out: list[FlowEvent], c: _Conn, d: int, offset: int | None, ts: float
    ) -> None:
        """First record of direction ``d`` of an adopted socket: what the
        application moved while no instance ran, exactly when both sequence
        numbers are known."""
        assert c.resume is not None
        then = c.resume[d]
        if then == -1:
            return  # already resumed
        c.resume[d] = -1
        if all(v == -1 for v in c.resume):
            c.resume = None
        base = c.seq0[d]
        nbytes: int | None = None
        if then is None:
            # the previous instance never saw this direction: as if it began now
            out.append(FlowGap(c.conn, ts, c.from_client(d), None, "midstream"))
            return
        if base is not None and offset is not None:
            nbytes = (base + offset - then) & _SEQ_MASK
            if nbytes == 0:
                return
            if nbytes > _MAX_RESTART_GAP:
                nbytes = None
        self._stats["gaps"] += 1
        if nbytes is not None:
            self._stats["gap_bytes"] += nbytes
        out.append(FlowGap(c.conn, ts, c.from_client(d), nbytes, "restart"))

    def _gap(self, out: list[FlowEvent], c: _Conn, d: int, ts: float, nbytes: int) -> None:
        self._stats["gaps"] += 1
        self._stats["gap_bytes"] += nbytes
        c.lost_reported[d] += nbytes
        out.append(FlowGap(c.conn, ts, c.from_client(d), nbytes, "ebpf-lost"))

    def _check_offset(
        self, out: list[FlowEvent], c: _Conn, d: int, offset: int, ts: float, data: bytes
    ) -> bytes:
        """Compare a record's offset with what we expect; emit gaps; trim overlaps."""
        exp = c.expected[d]
        if offset > exp:
            jump = offset - exp
            covered = min(jump, c.prereported[d])
            c.prereported[d] -= covered
            if jump > covered:
                self._gap(out, c, d, ts, jump - covered)
        elif offset < exp:
            # Only possible if one socket is read or written by two threads at once.
            overlap = min(exp - offset, len(data))
            out.append(
                FlowAnomaly(c.conn, ts, c.from_client(d), "out-of-order", f"{exp - offset} bytes")
            )
            data = data[overlap:]
            offset += overlap
        c.expected[d] = max(exp, offset + len(data))
        return data

    def _end(self, out: list[FlowEvent], c: _Conn, d: int, ts: float, reason: str) -> None:
        if not c.ended[d]:
            c.ended[d] = True
            out.append(FlowEnd(c.conn, ts, c.from_client(d), reason))

    def _close(self, out: list[FlowEvent], c: _Conn, ts: float, reason: str) -> None:
        # Client direction first, as the packet reassembler does.
        for d in sorted((D_SENT, D_RECV), key=lambda d: not c.from_client(d)):
            self._end(out, c, d, ts, reason)
        out.append(ConnectionClosed(c.conn, ts, reason))
        self._conns.pop((c.sk, c.serial), None)

    def _read_counters(self) -> list[int]:
        assert self._lib is not None
        vals = []
        k = ctypes.c_uint32()
        v = ctypes.c_uint64()
        for slot in range(C_NSLOTS):
            k.value = slot
            v.value = 0
            self._lib.bpf_map_lookup_elem(
                self._map_fds["counters"], ctypes.byref(k), ctypes.byref(v)
            )
            vals.append(v.value)
        return vals

    def _check_counters(self, out: list[FlowEvent]) -> None:
        """When the kernel lost anything, report it on the connections it hit."""
        now = self._read_counters()
        before, self._kernel_counters = self._kernel_counters, now
        self._stats["lost_records"] = now[C_LOST_RECORDS]
        self._stats["lost_bytes"] = now[C_LOST_BYTES]
        self._stats["read_errors"] = now[C_READ_ERRORS]
        self._stats["iov_truncated_bytes"] = now[C_IOV_TRUNC]
        slots = (C_LOST_RECORDS, C_READ_ERRORS, C_IOV_TRUNC)
        if all(now[s] == before[s] for s in slots) or not self._conns:
            return
        assert self._lib is not None
        entries: dict[tuple[int, int], tuple[int, ...] | None] = {}
        buf = ctypes.create_string_buffer(CONN.size)
        for key in list(self._conns):
            k = ctypes.c_uint64(key[0])
            if self._lib.bpf_map_lookup_elem(self._map_fds["conns"], ctypes.byref(k), buf) == 0:
                vals = CONN.unpack(buf.raw)
                entries[key] = vals if vals[4] == key[1] else None
            else:
                entries[key] = None
        # A connection missing from the kernel map has closed; its close record
        # is in the ring unless it was lost. Drain the ring before deciding.
        self._consume(out)
        ts = self._last_ts
        for key, kentry in entries.items():
            c = self._conns.get(key)
            if c is None:
                continue
            if kentry is None:
                for d in (D_SENT, D_RECV):
                    if not c.ended[d]:
                        out.append(FlowGap(c.conn, ts, c.from_client(d), None, "ebpf-lost"))
                        self._stats["gaps"] += 1
                self._close(out, c, ts, "eof")
                continue
            for d in (D_SENT, D_RECV):
                extra = kentry[2 + d] - c.lost_reported[d]
                if extra > 0:
                    c.prereported[d] += extra
                    self._gap(out, c, d, ts, extra)

    def finish(self) -> list[FlowEvent]:
        """End every open connection (reason "eof"): call once capture is over."""
        out: list[FlowEvent] = self.drain()
        for c in list(self._conns.values()):
            self._close(out, c, self._last_ts, "eof")
        ts = self._last_ts or time.time()
        for a in self._adopted.values():
            # handed over and never heard of again
            self._end_adopted(out, a["conn"], ts)
        self._adopted.clear()
        return out

    def drain(self) -> list[FlowEvent]:
        """The flow events of the records still in the ring (capture stopped)."""
        out: list[FlowEvent] = []
        self._consume(out)
        return out

    # -- reporting -------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """records, bytes, lost_records, connections (+ lost_bytes, gaps, …)."""
        out = dict(self._stats)
        out["open_connections"] = len(self._conns)
        return out

    def describe(self) -> str:
        sel = []
        if self.pids:
            sel.append("pids=" + ",".join(map(str, self.pids)))
        if self.comms:
            sel.append("comms=" + ",".join(self.comms))
        if self.ports:
            sel.append("ports=" + ",".join(map(str, self.ports)))
        state = f"{len(self._links)} tracepoints attached" if self._links else "not attached"
        return (
            f"ebpf syscall capture ({' '.join(sel) or 'all processes'}; "
            f"ring {self.ring_bytes >> 10} KiB; {state}; object {self.obj_path})"
        )

    @property
    def program_names(self) -> tuple[str, ...]:
        """Names of the attached BPF programs (all start with ``spy_``)."""
        return tuple(self._prog_names)


def _merge_syscall_pieces(out: list[FlowEvent], start: int) -> None:
    """Join adjacent FlowData of one syscall (same conn, direction and timestamp)."""
    merged: list[FlowEvent] = []
    run: list[FlowData] = []

    def flush() -> None:
        if len(run) == 1:
            merged.append(run[0])
        elif run:
            last = run[-1]
            merged.append(
                FlowData(last.conn, last.ts, last.from_client, b"".join(e.data for e in run))
            )
        run.clear()

    for ev in out[start:]:
        if isinstance(ev, FlowData):
            if run and not (
                run[0].conn == ev.conn
                and run[0].from_client == ev.from_client
                and run[0].ts == ev.ts
            ):
                flush()
            run.append(ev)
        else:
            flush()
            merged.append(ev)
    flush()
    out[start:] = merged
