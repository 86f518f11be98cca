"""Classic BPF (cBPF) socket filter for the live capture, built by hand.

The filter runs in the kernel on every frame of the interface, before anything
is copied to user space. It accepts Ethernet frames that carry TCP over IPv4 or
IPv6 where the source or destination port is one of the wanted ports, and only
when the segment carries payload or has SYN, FIN or RST set. Pure ACKs (about
half the packets of a streaming response) never reach user space.

Equivalent tcpdump expression (for ``ports=(8000,)``)::

    tcp port 8000 and (
        (ip and ip[6:2] & 0x1fff = 0 and
         (tcp[13] & 7 != 0 or ip[2:2] > ((ip[0] & 0xf) << 2) + ((tcp[12] & 0xf0) >> 2)))
     or (ip6 and (ip6[53] & 7 != 0 or ip6[4:2] > ((ip6[52] & 0xf0) >> 2))))

Limits, on purpose:

* IPv4: any header length (options are skipped with the ``ldxb 4*([14]&0xf)``
  idiom); non-first fragments are rejected (they carry no TCP header).
* IPv6: the fixed header only. The next header must be TCP; packets with
  extension headers (hop-by-hop, routing, fragment, ...) are **not** matched.
  Loopback and ordinary server traffic carry none.
* Untagged Ethernet only (``lo`` and NICs that strip VLAN tags in hardware).
  802.1Q-tagged frames are not matched.

The program is a list of ``(code, jt, jf, k)`` tuples, the layout of
``struct sock_filter``; :func:`pack` turns it into the bytes of that array and
:func:`sock_fprog` into a ``struct sock_fprog`` for ``SO_ATTACH_FILTER``.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# --- opcode pieces (linux/filter.h, linux/bpf_common.h) ----------------------
BPF_LD = 0x00
BPF_LDX = 0x01
BPF_ST = 0x02
BPF_STX = 0x03
BPF_ALU = 0x04
BPF_JMP = 0x05
BPF_RET = 0x06
BPF_MISC = 0x07

BPF_W = 0x00
BPF_H = 0x08
BPF_B = 0x10

BPF_IMM = 0x00
BPF_ABS = 0x20
BPF_IND = 0x40
BPF_MEM = 0x60
BPF_LEN = 0x80
BPF_MSH = 0xA0

BPF_ADD = 0x00
BPF_SUB = 0x10
BPF_MUL = 0x20
BPF_DIV = 0x30
BPF_OR = 0x40
BPF_AND = 0x50
BPF_LSH = 0x60
BPF_RSH = 0x70
BPF_NEG = 0x80
BPF_MOD = 0x90
BPF_XOR = 0xA0

BPF_JA = 0x00
BPF_JEQ = 0x10
BPF_JGT = 0x20
BPF_JGE = 0x30
BPF_JSET = 0x40

BPF_K = 0x00
BPF_X = 0x08
BPF_A = 0x10  # BPF_RET source

BPF_TAX = 0x00
BPF_TXA = 0x80

BPF_MAXINSNS = 4096
BPF_MEMWORDS = 16

#: What the filter returns for an accepted frame: the number of bytes to keep.
SNAPLEN = 262144

#: Most ports one filter matches. Each port costs two instructions per address
#: family, and a conditional jump reaches at most 255 instructions ahead.
MAX_PORTS = 32

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
IPPROTO_TCP = 6
TCP_FIN_SYN_RST = 0x07

Insn = tuple[int, int, int, int]


class FilterError(ValueError):
    """The requested filter cannot be built (bad port, too many ports)."""


@dataclass(frozen=True, slots=True)
class _Jump:
    """A conditional jump whose targets are labels, resolved by :func:`_assemble`."""

    code: int
    k: int
    jt: str
    jf: str


@dataclass(frozen=True, slots=True)
class _Goto:
    """An unconditional jump to a label (resolved by :func:`_assemble`)."""

    label: str


_Item = Insn | _Jump | _Goto | str  # a str is a label marking the next instruction


def _assemble(items: Iterable[_Item]) -> list[Insn]:
    """Resolve labels to the relative offsets of ``struct sock_filter``."""
    items = list(items)
    where: dict[str, int] = {}
    pc = 0
    for item in items:
        if isinstance(item, str):
            if item in where:
                raise FilterError(f"duplicate label {item!r}")
            where[item] = pc
        else:
            pc += 1
    out: list[Insn] = []
    for item in items:
        if isinstance(item, str):
            continue
        here = len(out)
        if isinstance(item, _Jump):
            jt = where[item.jt] - here - 1
            jf = where[item.jf] - here - 1
            if not (0 <= jt <= 255 and 0 <= jf <= 255):
                raise FilterError("filter too large: conditional jump out of range")
            out.append((item.code, jt, jf, item.k))
        elif isinstance(item, _Goto):
            out.append((BPF_JMP | BPF_JA, 0, 0, where[item.label] - here - 1))
        else:
            out.append(item)
    if len(out) > BPF_MAXINSNS:
        raise FilterError(f"filter too large: {len(out)} instructions")
    return out


def normalize_ports(ports: Iterable[int] | None) -> tuple[int, ...] | None:
    """Sorted, de-duplicated ports; ``None`` (all TCP) stays ``None``."""
    if ports is None:
        return None
    out = sorted(set(ports))
    if not out:
        raise FilterError("no ports given (use None to capture all TCP ports)")
    for p in out:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536:
            raise FilterError(f"bad TCP port {p!r}: expected an integer 1-65535")
    if len(out) > MAX_PORTS:
        raise FilterError(f"too many ports ({len(out)}); at most {MAX_PORTS}")
    return tuple(out)


def _port_checks(ports: tuple[int, ...] | None, l4: str, ok: str, drop: str) -> list[_Item]:
    """``ldh [l4+0]`` / ``ldh [l4+2]`` against every port. ``l4`` is "x" (IPv4:
    TCP header at X+14) or "fixed" (IPv6: TCP header at 54)."""
    if ports is None:
        return [_Goto(ok)]
    items: list[_Item] = []
    for n, off in enumerate((0, 2)):
        if l4 == "x":
            items.append((BPF_LD | BPF_H | BPF_IND, 0, 0, 14 + off))
        else:
            items.append((BPF_LD | BPF_H | BPF_ABS, 0, 0, 54 + off))
        for i, p in enumerate(ports):
            last = i == len(ports) - 1
            if not last:
                nxt = f"{l4}-p{n}-{i + 1}"
                items.append(_Jump(BPF_JMP | BPF_JEQ | BPF_K, p, ok, nxt))
                items.append(nxt)
            elif n == 0:
                items.append(_Jump(BPF_JMP | BPF_JEQ | BPF_K, p, ok, f"{l4}-dport"))
                items.append(f"{l4}-dport")
            else:
                items.append(_Jump(BPF_JMP | BPF_JEQ | BPF_K, p, ok, drop))
    return items


def build_filter(ports: Iterable[int] | None = (8000,)) -> list[Insn]:
    """The cBPF program: TCP on the ports, with payload or SYN/FIN/RST.

    ``ports=None`` matches every TCP port. Raises :class:`FilterError` for bad
    or too many ports.
    """
    wanted = normalize_ports(ports)
    prog: list[_Item] = [
        (BPF_LD | BPF_H | BPF_ABS, 0, 0, 12),  # ethertype
        _Jump(BPF_JMP | BPF_JEQ | BPF_K, ETHERTYPE_IPV4, "ip4", "not-ip4"),
        # ---- IPv4 ----
        "ip4",
        (BPF_LD | BPF_B | BPF_ABS, 0, 0, 14 + 9),  # protocol
        _Jump(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_TCP, "ip4-tcp", "drop"),
        "ip4-tcp",
        (BPF_LD | BPF_H | BPF_ABS, 0, 0, 14 + 6),  # flags + fragment offset
        _Jump(BPF_JMP | BPF_JSET | BPF_K, 0x1FFF, "drop", "ip4-first"),
        "ip4-first",
        (BPF_LDX | BPF_B | BPF_MSH, 0, 0, 14),  # X = IHL * 4
        *_port_checks(wanted, "x", "ip4-port", "drop"),
        "ip4-port",
        (BPF_LD | BPF_B | BPF_IND, 0, 0, 14 + 13),  # TCP flags
        _Jump(BPF_JMP | BPF_JSET | BPF_K, TCP_FIN_SYN_RST, "accept", "ip4-len"),
        "ip4-len",
        (BPF_LD | BPF_B | BPF_IND, 0, 0, 14 + 12),  # data offset << 4
        (BPF_ALU | BPF_AND | BPF_K, 0, 0, 0xF0),
        (BPF_ALU | BPF_RSH | BPF_K, 0, 0, 2),  # TCP header length
        (BPF_ALU | BPF_ADD | BPF_X, 0, 0, 0),  # + IP header length
        (BPF_MISC | BPF_TAX, 0, 0, 0),
        (BPF_LD | BPF_H | BPF_ABS, 0, 0, 14 + 2),  # IP total length
        _Jump(BPF_JMP | BPF_JGT | BPF_X, 0, "accept", "drop"),
        # ---- IPv6 (fixed header only) ----
        "not-ip4",
        _Jump(BPF_JMP | BPF_JEQ | BPF_K, ETHERTYPE_IPV6, "ip6", "drop"),
        "ip6",
        (BPF_LD | BPF_B | BPF_ABS, 0, 0, 14 + 6),  # next header
        _Jump(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_TCP, "ip6-tcp", "drop"),
        "ip6-tcp",
        *_port_checks(wanted, "fixed", "ip6-port", "drop"),
        "ip6-port",
        (BPF_LD | BPF_B | BPF_ABS, 0, 0, 54 + 13),  # TCP flags
        _Jump(BPF_JMP | BPF_JSET | BPF_K, TCP_FIN_SYN_RST, "accept", "ip6-len"),
        "ip6-len",
        (BPF_LD | BPF_B | BPF_ABS, 0, 0, 54 + 12),
        (BPF_ALU | BPF_AND | BPF_K, 0, 0, 0xF0),
        (BPF_ALU | BPF_RSH | BPF_K, 0, 0, 2),
        (BPF_MISC | BPF_TAX, 0, 0, 0),  # X = TCP header length
        (BPF_LD | BPF_H | BPF_ABS, 0, 0, 14 + 4),  # IPv6 payload length
        _Jump(BPF_JMP | BPF_JGT | BPF_X, 0, "accept", "drop"),
        # ---- verdicts ----
        "accept",
        (BPF_RET | BPF_K, 0, 0, SNAPLEN),
        "drop",
        (BPF_RET | BPF_K, 0, 0, 0),
    ]
    return _assemble(prog)


def pack(program: Sequence[Insn]) -> bytes:
    """The bytes of a ``struct sock_filter`` array (native byte order)."""
    return b"".join(struct.pack("=HBBI", c, jt, jf, k) for c, jt, jf, k in program)


def sock_fprog(program: Sequence[Insn]) -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    """A ``struct sock_fprog`` for ``setsockopt(SOL_SOCKET, SO_ATTACH_FILTER, ...)``.

    Returns the struct bytes and the buffer holding the instructions, which the
    caller must keep alive until ``setsockopt`` returns (the struct points at it).
    """
    buf = ctypes.create_string_buffer(pack(program))
    return struct.pack("@HP", len(program), ctypes.addressof(buf)), buf


def describe_filter(ports: Iterable[int] | None) -> str:
    """A tcpdump-like one-liner of what :func:`build_filter` matches, for logs."""
    wanted = normalize_ports(ports)
    if wanted is None:
        sel = "tcp"
    elif len(wanted) == 1:
        sel = f"tcp port {wanted[0]}"
    else:
        sel = "tcp port (" + " or ".join(str(p) for p in wanted) + ")"
    return f"{sel} and (payload or syn/fin/rst)"
