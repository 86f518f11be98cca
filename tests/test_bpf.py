"""The hand-built classic BPF filter, run by a small cBPF interpreter (no kernel),
cross-checked against libpcap's compiler and the kernel's own verifier."""

from __future__ import annotations

import ctypes
import socket
import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP, IPOption_NOP, IPOption_RR
from scapy.layers.inet6 import IPv6, IPv6ExtHdrHopByHop
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Packet, Raw

from sniffer.capture import bpf
from sniffer.capture.bpf import FilterError, build_filter, describe_filter, pack, sock_fprog

# ---------------------------------------------------------------------------
# A classic BPF interpreter (the semantics of the kernel's sk_run_filter)
# ---------------------------------------------------------------------------

M32 = 0xFFFFFFFF


class BpfFault(Exception):
    """The program did something the kernel verifier would have rejected."""


# An interpreter: one branch per BPF instruction class (C901).
def run_bpf(prog: Sequence[tuple[int, int, int, int]], pkt: bytes) -> int:  # noqa: C901
    """Run ``prog`` on ``pkt``; return the accepted length (0 = drop).

    Out-of-bounds packet loads and division by zero end the program with 0, as
    in the kernel.
    """
    a = x = 0
    mem = [0] * bpf.BPF_MEMWORDS
    pc = 0
    steps = 0

    def load(off: int, size: int) -> int | None:
        if off < 0 or off + size > len(pkt):
            return None
        return int.from_bytes(pkt[off : off + size], "big")

    while True:
        if not 0 <= pc < len(prog):
            raise BpfFault(f"pc {pc} outside program")
        steps += 1
        if steps > len(prog):
            raise BpfFault("backward jump / loop")
        code, jt, jf, k = prog[pc]
        pc += 1
        cls = code & 0x07
        if cls in (bpf.BPF_LD, bpf.BPF_LDX):
            size = {bpf.BPF_W: 4, bpf.BPF_H: 2, bpf.BPF_B: 1}[code & 0x18]
            mode = code & 0xE0
            if mode == bpf.BPF_IMM:
                val: int | None = k
            elif mode == bpf.BPF_ABS:
                val = load(k, size)
            elif mode == bpf.BPF_IND:
                val = load(x + k, size)
            elif mode == bpf.BPF_MEM:
                val = mem[k]
            elif mode == bpf.BPF_LEN:
                val = len(pkt)
            elif mode == bpf.BPF_MSH:
                b = load(k, 1)
                val = None if b is None else 4 * (b & 0xF)
            else:
                raise BpfFault(f"bad load mode {code:#x}")
            if val is None:
                return 0
            if cls == bpf.BPF_LD:
                if mode == bpf.BPF_MSH:
                    raise BpfFault("MSH is an ldx mode")
                a = val
            else:
                x = val
        elif cls == bpf.BPF_ST:
            mem[k] = a
        elif cls == bpf.BPF_STX:
            mem[k] = x
        elif cls == bpf.BPF_ALU:
            op = code & 0xF0
            src = x if code & bpf.BPF_X else k
            if op == bpf.BPF_NEG:
                a = -a & M32
                continue
            if op in (bpf.BPF_DIV, bpf.BPF_MOD) and src == 0:
                return 0
            a = _alu(op, a, src)
        elif cls == bpf.BPF_JMP:
            op = code & 0xF0
            if op == bpf.BPF_JA:
                pc += k
                continue
            src = x if code & bpf.BPF_X else k
            cond = {
                bpf.BPF_JEQ: a == src,
                bpf.BPF_JGT: a > src,
                bpf.BPF_JGE: a >= src,
                bpf.BPF_JSET: bool(a & src),
            }[op]
            pc += jt if cond else jf
        elif cls == bpf.BPF_RET:
            return a if code & 0x18 == bpf.BPF_A else k
        elif cls == bpf.BPF_MISC:
            if code & 0xF8 == bpf.BPF_TXA:
                a = x
            else:
                x = a
        else:  # pragma: no cover - all eight classes handled
            raise BpfFault(f"bad class {code:#x}")


def _alu(op: int, a: int, src: int) -> int:
    if op == bpf.BPF_ADD:
        r = a + src
    elif op == bpf.BPF_SUB:
        r = a - src
    elif op == bpf.BPF_MUL:
        r = a * src
    elif op == bpf.BPF_DIV:
        r = a // src
    elif op == bpf.BPF_MOD:
        r = a % src
    elif op == bpf.BPF_OR:
        r = a | src
    elif op == bpf.BPF_AND:
        r = a & src
    elif op == bpf.BPF_XOR:
        r = a ^ src
    elif op == bpf.BPF_LSH:
        r = a << (src & 31)
    elif op == bpf.BPF_RSH:
        r = a >> (src & 31)
    else:
        raise BpfFault(f"bad ALU op {op:#x}")
    return r & M32


def accepts(prog: Sequence[tuple[int, int, int, int]], frame: Packet | bytes) -> bool:
    return run_bpf(prog, bytes(frame)) > 0


# ---------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------

ETH = Ether(src="00:00:00:00:00:00", dst="00:00:00:00:00:00")
TS_OPTS = [("NOP", None), ("NOP", None), ("Timestamp", (1, 2))]


def v4(sport: int = 40000, dport: int = 8000, flags: str = "A", payload: bytes = b"") -> Packet:
    return (
        ETH
        / IP(src="127.0.0.1", dst="127.0.0.1")
        / TCP(sport=sport, dport=dport, flags=flags, options=TS_OPTS)
        / Raw(payload)
    )


def v6(sport: int = 40000, dport: int = 8000, flags: str = "A", payload: bytes = b"") -> Packet:
    return (
        ETH
        / IPv6(src="::1", dst="::1")
        / TCP(sport=sport, dport=dport, flags=flags, options=TS_OPTS)
        / Raw(payload)
    )


P8000 = build_filter((8000,))

CASES: list[tuple[str, Packet | bytes, bool]] = [
    ("v4 payload to port", v4(payload=b"GET / HTTP/1.1\r\n"), True),
    ("v4 payload from port", v4(sport=8000, dport=41234, payload=b"data: x\n\n"), True),
    ("v4 one byte payload", v4(payload=b"x"), True),
    ("v4 pure ACK with timestamps", v4(), False),
    ("v4 pure ACK, no options", ETH / IP() / TCP(dport=8000, flags="A"), False),
    ("v4 pure ACK padded to 60", bytes(ETH / IP() / TCP(dport=8000, flags="A")) + b"\0" * 6, False),
    ("v4 SYN", v4(flags="S"), True),
    ("v4 SYN-ACK", v4(sport=8000, dport=40000, flags="SA"), True),
    ("v4 FIN", v4(flags="FA"), True),
    ("v4 RST", v4(flags="R"), True),
    ("v4 PSH no payload", v4(flags="PA"), False),
    ("v4 other port with payload", v4(sport=40000, dport=8001, payload=b"hello"), False),
    ("v4 other port SYN", v4(sport=40000, dport=9000, flags="S"), False),
    ("v4 UDP to port", ETH / IP() / UDP(sport=40000, dport=8000) / Raw(b"hello"), False),
    (
        "v4 options, payload",
        ETH / IP(options=[IPOption_RR()]) / TCP(dport=8000, flags="PA") / Raw(b"abc"),
        True,
    ),
    (
        "v4 options (40 bytes), pure ACK",
        ETH / IP(options=[IPOption_NOP()] * 40) / TCP(dport=8000, flags="A", options=TS_OPTS),
        False,
    ),
    (
        "v4 options (40 bytes), payload",
        ETH / IP(options=[IPOption_NOP()] * 40) / TCP(dport=8000, flags="A") / Raw(b"z"),
        True,
    ),
    ("v6 payload", v6(payload=b"hello"), True),
    ("v6 payload from port", v6(sport=8000, dport=50000, payload=b"data: {}\n\n"), True),
    ("v6 pure ACK", v6(), False),
    ("v6 SYN", v6(flags="S"), True),
    ("v6 FIN", v6(flags="FA"), True),
    ("v6 RST", v6(flags="RA"), True),
    ("v6 other port", v6(dport=8443, payload=b"hello"), False),
    ("v6 UDP", ETH / IPv6() / UDP(dport=8000) / Raw(b"x"), False),
    (
        "v6 hop-by-hop extension header (documented: not matched)",
        ETH / IPv6() / IPv6ExtHdrHopByHop() / TCP(dport=8000, flags="PA") / Raw(b"x"),
        False,
    ),
    ("ARP", ETH / ARP(), False),
    (
        "802.1Q tagged (not matched)",
        ETH / Dot1Q(vlan=5) / IP() / TCP(dport=8000) / Raw(b"x"),
        False,
    ),
    ("truncated frame", bytes(v4(payload=b"x"))[:30], False),
    ("empty frame", b"", False),
]


def _fragment(offset8: int, mf: bool) -> bytes:
    """An IPv4 fragment whose first bytes look like a TCP header to port 8000."""
    fake_tcp = bytes(TCP(sport=8000, dport=8000, flags="S")) + b"payload"
    ip = IP(src="127.0.0.1", dst="127.0.0.1", proto=6, frag=offset8, flags="MF" if mf else 0)
    return bytes(ETH / ip / Raw(fake_tcp))


CASES += [
    ("v4 non-first fragment", _fragment(100, mf=True), False),
    ("v4 last fragment", _fragment(3, mf=False), False),
    ("v4 first fragment with MF", _fragment(0, mf=True), True),
]


@pytest.mark.parametrize(("name", "frame", "expected"), CASES, ids=[c[0] for c in CASES])
def test_verdicts(name: str, frame: Packet | bytes, expected: bool) -> None:
    assert accepts(P8000, frame) is expected


def test_accept_keeps_whole_frame() -> None:
    assert run_bpf(P8000, bytes(v4(payload=b"x" * 1000))) == bpf.SNAPLEN


def test_all_ports_when_none() -> None:
    prog = build_filter(None)
    assert accepts(prog, v4(dport=1, payload=b"x"))
    assert accepts(prog, v6(sport=65535, dport=2, flags="S"))
    assert not accepts(prog, v4(dport=1))  # pure ACK still dropped
    assert not accepts(prog, v6(dport=1))
    assert not accepts(prog, ETH / IP() / UDP(dport=1) / Raw(b"x"))


def test_several_ports() -> None:
    ports = [8000, 8080, 11434, 443, 30000]
    prog = build_filter(ports)
    for p in ports:
        assert accepts(prog, v4(dport=p, payload=b"x"))
        assert accepts(prog, v4(sport=p, dport=55555, payload=b"x"))
        assert accepts(prog, v6(sport=p, dport=55555, flags="S"))
        assert not accepts(prog, v6(sport=p, dport=55555))
    for p in (80, 8001, 7999, 11435):
        assert not accepts(prog, v4(sport=50000, dport=p, payload=b"x"))
        assert not accepts(prog, v6(sport=50000, dport=p, flags="S"))


def test_max_ports_assemble() -> None:
    ports = list(range(20000, 20000 + bpf.MAX_PORTS))
    prog = build_filter(ports)
    assert accepts(prog, v4(dport=ports[-1], payload=b"x"))
    assert accepts(prog, v6(sport=ports[0], flags="F"))
    assert not accepts(prog, v4(dport=ports[-1] + 1, payload=b"x"))


@pytest.mark.parametrize(
    "ports", [[], [0], [65536], [-1], [80.0], [True], list(range(1, bpf.MAX_PORTS + 2))]
)
def test_bad_ports(ports: list[object]) -> None:
    with pytest.raises(FilterError):
        build_filter(ports)  # type: ignore[arg-type]


def test_describe_filter() -> None:
    assert describe_filter([8000]) == "tcp port 8000 and (payload or syn/fin/rst)"
    assert describe_filter([8001, 8000, 8001]) == (
        "tcp port (8000 or 8001) and (payload or syn/fin/rst)"
    )
    assert describe_filter(None) == "tcp and (payload or syn/fin/rst)"


def test_pack_layout() -> None:
    prog = build_filter((8000, 9000))
    raw = pack(prog)
    assert len(raw) == 8 * len(prog)
    assert list(struct.iter_unpack("=HBBI", raw)) == prog
    fprog, buf = sock_fprog(prog)
    n, ptr = struct.unpack("@HP", fprog)
    assert n == len(prog)
    assert ptr == ctypes.addressof(buf)
    assert bytes(buf)[: len(raw)] == raw


@pytest.mark.parametrize("ports", [None, (8000,), tuple(range(9000, 9000 + bpf.MAX_PORTS))])
def test_kernel_verifier_accepts(ports: tuple[int, ...] | None) -> None:
    """The kernel checks a classic filter when it is attached (no privilege needed
    for a UDP socket); an invalid program would fail with EINVAL."""
    fprog, _buf = sock_fprog(build_filter(ports))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, 26, fprog)  # SO_ATTACH_FILTER


def test_kernel_verifier_rejects_garbage() -> None:
    """Sanity check of the previous test: the kernel does reject a bad program."""
    fprog, _buf = sock_fprog([(bpf.BPF_JMP | bpf.BPF_JA, 0, 0, 5)])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(OSError):
        s.setsockopt(socket.SOL_SOCKET, 26, fprog)


# ---------------------------------------------------------------------------
# Cross-check with libpcap's compiler on random frames
# ---------------------------------------------------------------------------

PCAP_EXPR = (
    "tcp port {port} and ("
    "(ip and ip[6:2] & 0x1fff = 0 and (tcp[13] & 7 != 0 or "
    "ip[2:2] > ((ip[0] & 0xf) << 2) + ((tcp[12] & 0xf0) >> 2)))"
    " or (ip6 and (ip6[53] & 7 != 0 or ip6[4:2] > ((ip6[52] & 0xf0) >> 2))))"
)


def _pcap_program(port: int) -> list[tuple[int, int, int, int]] | None:
    try:
        from scapy.arch.common import compile_filter

        prog = compile_filter(PCAP_EXPR.format(port=port), linktype=1)
    except Exception:
        return None
    ins = prog.bf_insns
    return [(ins[i].code, ins[i].jt, ins[i].jf, ins[i].k) for i in range(prog.bf_len)]


PCAP_8000 = _pcap_program(8000)
needs_libpcap = pytest.mark.skipif(PCAP_8000 is None, reason="libpcap compile_filter unavailable")


@needs_libpcap
@pytest.mark.parametrize(("name", "frame", "expected"), CASES, ids=[c[0] for c in CASES])
def test_libpcap_agrees_on_cases(name: str, frame: Packet | bytes, expected: bool) -> None:
    if "extension header" in name:
        pytest.skip("libpcap walks IPv6 extension headers; ours does not (documented)")
    assert PCAP_8000 is not None
    assert accepts(PCAP_8000, frame) is expected


flag_bits = st.integers(0, 0x3F)
tcp_opts = st.sampled_from([[], TS_OPTS, [("MSS", 1460)], [("NOP", None)] * 12])
ip_opts = st.sampled_from([[], [IPOption_NOP()] * 4, [IPOption_RR()], [IPOption_NOP()] * 40])
ports_st = st.sampled_from([8000, 8001, 80, 7999, 40000, 65535])


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    sport, dport = draw(ports_st), draw(ports_st)
    tcp = TCP(sport=sport, dport=dport, flags=draw(flag_bits), options=draw(tcp_opts))
    payload = Raw(b"p" * draw(st.sampled_from([0, 0, 1, 2, 100, 1400])))
    if draw(st.booleans()):
        frag = draw(st.sampled_from([0, 0, 0, 1, 185]))
        ip: Packet = IP(options=draw(ip_opts), frag=frag, flags=draw(st.sampled_from([0, 1, 2])))
    else:
        ip = IPv6()
    frame = bytes(ETH / ip / tcp / payload)
    pad = draw(st.sampled_from([0, 0, 6, 20]))
    return frame + b"\0" * pad


@needs_libpcap
@settings(max_examples=400, deadline=None)
@given(frames())
def test_libpcap_agrees_on_random_frames(frame: bytes) -> None:
    assert PCAP_8000 is not None
    assert (run_bpf(P8000, frame) > 0) == (run_bpf(PCAP_8000, frame) > 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_faults(frame: bytes) -> None:
    """Any byte string runs to a verdict (no loop, no jump outside the program)."""
    run_bpf(P8000, frame)
    run_bpf(build_filter(None), frame)
