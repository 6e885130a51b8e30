"""RoCEv2 wire format: IPv4 / UDP 4791 / BTH [/ RETH | / AETH] / payload / ICRC.

The ICRC covers the IPv4 header (identification, addresses, lengths), so it depends on what the kernel writes.
Control packets (ACK/NAK/CNP, :class:`Template`) are built whole, IP header included, and sent on a raw socket.
Data packets leave on UDP sockets (:func:`data_socket`) whose kernel-written headers are predictable (IP id 0
with DF, or 0…k−1 within a GSO batch), so :class:`DataTemplate` computes their ICRC from cached prefix CRCs.

ICRC (IBTA Annex A17, RoCEv2): CRC-32 (the Ethernet/zlib polynomial, init ~0, final ~) over
    8 bytes of 0xFF (the masked LRH) + IPv4 header + UDP header + BTH + the rest of the packet,
with the variant fields masked to all ones: IPv4 TOS (DSCP+ECN), TTL and header checksum, UDP checksum and the
BTH byte after the P_Key (resv8a / FECN, BECN). Stored in the last 4 bytes, least significant byte first (as
Linux rxe and scapy.contrib.roce do). The UDP checksum is sent as 0 (allowed for IPv4, what RoCE NICs send).

Trimmed packets (``switch.trim``, ebpf/lib/trim.h): a switch that would drop a data packet cuts it to IP + UDP +
the first 64 bytes of the UDP payload (a 92-byte IP packet: BTH, RETH or whatever header follows, and the head
of the data), fixes the IP length and checksum, sets the UDP length to 72 and its checksum to 0, and sets bit
``BTH_TRIMMED`` (0x20) of BTH byte 4 — the resv8a byte, beside FECN 0x80 / BECN 0x40, masked out of the ICRC. A
data packet with ``bth[4] & BTH_TRIMMED`` is such a header: its payload and ICRC are gone (do not check it).
"""
from __future__ import annotations

import socket
import struct
import zlib

from ...qos_classes import skb_priority
from .cc.base import Hop

ROCE_PORT = 4791

# RC opcodes (transport 000)
OP_WRITE_FIRST = 0x06
OP_WRITE_MIDDLE = 0x07
OP_WRITE_LAST = 0x08
OP_WRITE_ONLY = 0x0A
OP_ACK = 0x11
OP_CNP = 0x81
RETH_OPS = (OP_WRITE_FIRST, OP_WRITE_ONLY)
DATA_OPS = (OP_WRITE_FIRST, OP_WRITE_MIDDLE, OP_WRITE_LAST, OP_WRITE_ONLY)

# AETH syndromes
SYN_ACK = 0x1F              # ACK, credit count 31 = "invalid" (no end-to-end credits)
SYN_NAK_SEQ = 0x60          # NAK, PSN sequence error
NAK_MASK = 0xE0

PKEY_DEFAULT = 0xFFFF
PSN_MASK = 0xFFFFFF
PSN_HALF = 1 << 23

IP = struct.Struct("!BBHHHBBH4s4s")
UDP = struct.Struct("!HHHH")
BTH = struct.Struct("!BBHII")          # opcode, SE|M|pad|tver, P_Key, resv8a|destQP, A|resv7|PSN
BTH_RETH = struct.Struct("!BBHIIQII")  # BTH + RETH in one pack
RETH = struct.Struct("!QII")           # virtual address, R_Key, DMA length
AETH = struct.Struct("!I")             # syndrome << 24 | MSN
ICRC = struct.Struct("<I")
IP_LEN, UDP_LEN, BTH_LEN, RETH_LEN, AETH_LEN, ICRC_LEN = 20, 8, 12, 16, 4, 4
HDR_MAX = IP_LEN + UDP_LEN + BTH_LEN + RETH_LEN
CNP_PAD = 16                           # CNP: 16 reserved bytes after the BTH

ECT0 = 0x02
CE = 0x03
ECN_MASK = 0x03
DSCP_ROCE = 26                         # a common RoCE DSCP (AF31); TOS = DSCP << 2 | ECN
TTL = 64
IB_MTUS = (4096, 2048, 1024, 512, 256)

LRH_SEED = zlib.crc32(b"\xff" * 8)

# Packet trimming (switch.trim, ebpf/lib/trim.h): a switch that would drop a lossy RoCE packet cuts it to the IP +
# UDP headers and the first TRIM_KEEP bytes of the UDP payload, sets BTH_TRIMMED in the BTH's resv8a byte (which
# also holds FECN 0x80 / BECN 0x40 and is masked out of the ICRC) and forwards it on a high priority.
BTH_TRIMMED = 0x20
TRIM_KEEP = 64

# Extended transport (UEC-style, when a flow's CC or entropy policy needs end-to-end feedback). Data packets carry
# an XTH after BTH [+ RETH]: the sender's transmit time in microseconds (mod 2^32), from which the ACK's echo gives
# the RTT, and a reserved word. It fits in TRIM_KEEP, so a trimmed header still carries it.
XTH = struct.Struct("!II")
XTH_LEN = 8
# ACKs then carry an XACK after the AETH: flags, the number of echo records, a selective-ACK bitmap (bit i = PSN
# sack_base + i received; sack_base = the cumulative PSN + 1, which is missing by definition), the echoed transmit
# time of the packet that triggered the ACK, the receiver's credit limit (EQDS: the sender may send PSNs below it),
# then per data packet received since the last ACK its entropy (UDP source port) and whether it was CE-marked or
# trimmed: what path-aware spraying and ECN/delay CC read; then, with XACK_INT, the INT hop records of the last data
# packet (HPCC, below).
XACK = struct.Struct("!BBHIQII")        # flags, n_echo, n_int (hop records), sack_base, bitmap, ts_echo_us, credit_psn
XACK_LEN = 24
ECHO = struct.Struct("!HBB")            # entropy (UDP source port), ECHO_* flags, reserved
ECHO_LEN = 4
ECHO_MAX = 32
XACK_SACK, XACK_TS, XACK_CREDIT, XACK_TRIM = 1, 2, 4, 8   # XACK_TRIM: this NAK is for a trimmed packet
XACK_INT = 16               # INT hop records follow the echoes (their count in the XACK's reserved field)
ECHO_CE, ECHO_TRIM = 1, 2
SACK_BITS = 64

# HPCC (traffic.cc: hpcc): the sender starts an INT-MD stack in every data packet — shim + metadata header with no
# record, between the UDP header and the BTH, DSCP bit 0 set (docs/int.md, "Host stacks") — every switch adds its
# 32-byte hop record, and the receiver takes the stack out and echoes the records, as they arrived (newest first),
# in its next XACK (XACK_INT). The ICRC is that of the packet without the stack (what the receiver is left with).
INT_DSCP_BIT = 0x04         # TOS bit of DSCP value 1: an INT stack follows the UDP header
INT_SHIM_HOST = 0x01        # shim flags: a host stack (the destination host is the sink)
INT_HDR_LEN = 16            # shim (4) + INT-MD metadata header (12)
INT_HOP_LEN = 32
INT_HOP = struct.Struct("!IIIIQII")     # switch, ingress|egress port, hop latency ns, queue id|occupancy, ingress
                                        # timestamp ns, egress tx bytes (low 32 bits), egress link rate kbit/s


def int_host_stack(hops: int, tos: int) -> bytes:
    """The empty INT stack an HPCC sender puts after the UDP header: room for ``hops`` records, the packet's TOS
    before DSCP bit 0 was set (``tos``), the instructions and domain of docs/int.md."""
    shim = struct.pack("!BBBB", 1 << 4, INT_HDR_LEN // 4, INT_SHIM_HOST, tos & 0xFF)
    hdr = struct.pack("!IHHHH", (2 << 28) | (8 << 8) | (hops & 0xFF), 0xF800, 0x4654, 0xC000, 0)
    return shim + hdr


def int_hops(records) -> tuple:
    """The hop records of an XACK (newest first, as the stack holds them) as :class:`cc.Hop` in path order: queue
    occupancy (bytes), tx bytes (mod 2^32), timestamp (ns), link rate (bit/s)."""
    out = []
    for i in range(len(records) // INT_HOP_LEN - 1, -1, -1):
        _sw, _ports, _lat, q, ts, tx, kbps = INT_HOP.unpack_from(records, i * INT_HOP_LEN)
        out.append(Hop(q & 0xFFFFFF, tx, ts, kbps * 1000.0))
    return tuple(out)


def ib_mtu(packet_size: int) -> int:
    """The largest IB path MTU whose packets (IP+UDP+BTH+RETH+payload+ICRC) fit in ``packet_size``."""
    room = packet_size - HDR_MAX - ICRC_LEN
    for m in IB_MTUS:
        if m <= room:
            return m
    raise ValueError(f"packet_size {packet_size} is too small for a RoCEv2 packet with a 256-byte IB MTU "
                     f"(needs ≥ {256 + HDR_MAX + ICRC_LEN})")


def icrc(packet: bytes | bytearray | memoryview) -> int:
    """ICRC of a whole IPv4 packet (its last 4 bytes, the ICRC itself, excluded)."""
    p = bytearray(packet[:IP_LEN + UDP_LEN + BTH_LEN])
    p[1] = 0xFF                               # TOS
    p[8] = 0xFF                               # TTL
    p[10:12] = b"\xff\xff"                    # IP checksum
    p[26:28] = b"\xff\xff"                    # UDP checksum
    p[IP_LEN + UDP_LEN + 4] = 0xFF            # BTH resv8a (FECN/BECN)
    crc = zlib.crc32(p, LRH_SEED)
    return zlib.crc32(memoryview(packet)[IP_LEN + UDP_LEN + BTH_LEN:len(packet) - ICRC_LEN], crc)


def icrc_ok(packet: bytes) -> bool:
    return ICRC.unpack_from(packet, len(packet) - ICRC_LEN)[0] == icrc(packet)


class Template:
    """A reusable header for one QP direction: the real header and its ICRC-masked twin, updated in place
    per packet (only lengths, IP id, source port, opcode, pad, PSN and RETH change)."""

    def __init__(self, src: str, dst: str, dqpn: int, tos: int = (DSCP_ROCE << 2) | ECT0, pkey: int = PKEY_DEFAULT):
        self.hdr = bytearray(HDR_MAX)
        self.mask = bytearray(HDR_MAX)
        self.src, self.dst = socket.inet_aton(src), socket.inet_aton(dst)
        self.tos, self.dqpn, self.pkey = tos, dqpn & PSN_MASK, pkey
        self.ip_id = 0
        IP.pack_into(self.hdr, 0, 0x45, tos, 0, 0, 0x4000, TTL, socket.IPPROTO_UDP, 0, self.src, self.dst)
        IP.pack_into(self.mask, 0, 0x45, 0xFF, 0, 0, 0x4000, 0xFF, socket.IPPROTO_UDP, 0xFFFF, self.src, self.dst)
        self.hmv = memoryview(self.hdr)
        self.mmv = memoryview(self.mask)

    def build(self, opcode: int, psn: int, sport: int, payload_len: int, ackreq: bool = False,
              reth: tuple | None = None, aeth: int | None = None, becn: bool = False) -> tuple[int, int]:
        """Fill the header for a packet with ``payload_len`` payload bytes (before padding); return
        (header length, pad bytes). Call :meth:`finish` with the payload to get the ICRC."""
        pad = -payload_len & 3
        hl = IP_LEN + UDP_LEN + BTH_LEN + (RETH_LEN if reth is not None else 0) + (AETH_LEN if aeth is not None else 0)
        total = hl + payload_len + pad + ICRC_LEN
        self.ip_id = (self.ip_id % 0xFFFF) + 1               # never 0 (the kernel would pick one)
        h, m = self.hdr, self.mask
        for b in (h, m):
            struct.pack_into("!HH", b, 2, total, self.ip_id)
            struct.pack_into("!HHH", b, 20, sport, ROCE_PORT, total - IP_LEN)
        h[26:28] = b"\x00\x00"
        m[26:28] = b"\xff\xff"
        BTH.pack_into(h, 28, opcode, pad << 4, self.pkey, (0x40 << 24 if becn else 0) | self.dqpn,
                      (0x80000000 if ackreq else 0) | (psn & PSN_MASK))
        m[28:40] = h[28:40]
        m[32] = 0xFF
        if reth is not None:
            RETH.pack_into(h, 40, *reth)
            m[40:56] = h[40:56]
        elif aeth is not None:
            AETH.pack_into(h, 40, aeth)
            m[40:44] = h[40:44]
        return hl, pad

    def crc(self, hl: int, *payload) -> bytes:
        c = zlib.crc32(self.mmv[:hl], LRH_SEED)
        for p in payload:
            c = zlib.crc32(p, c)
        return ICRC.pack(c)

    def packet(self, opcode: int, psn: int, sport: int, payload: bytes = b"", **kw) -> bytes:
        """A whole packet as bytes (slow path: ACK/NAK/CNP and tests)."""
        hl, pad = self.build(opcode, psn, sport, len(payload), **kw)
        body = bytes(payload) + bytes(pad)
        return bytes(self.hdr[:hl]) + body + self.crc(hl, body)


SO_NO_CHECK = 11
IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_RECVERR = 10, 2, 11


def data_socket(src: str, sport: int, tos: int = (DSCP_ROCE << 2) | ECT0, sndbuf: int | None = None,
                gso: bool = False, prio: int | None = None) -> socket.socket:
    """A UDP socket for a requester's data packets: the kernel writes the IPv4 + UDP headers (as cheap as a plain
    ``sendto``; a raw IP_HDRINCL socket cost ~20 % more per packet in the kernel, measured). What the kernel
    writes is fixed, so the ICRC can still be computed in advance: DF set (IP_PMTUDISC_DO) on an unconnected
    socket makes Linux use IP identification 0 (``ip_select_ident_segs``: no per-socket id without a connected
    peer, and DF datagrams get id 0); a UDP GSO send of k packets gets ids 0, 1, …, k−1 (``inet_gso_segment``
    counts up from the first; checked on 6.18 over a veth with gso_max_segs 1, as the fabric's host NICs have).
    TOS from IP_TOS (ECT0 by default; a per-packet IP_TOS cmsg can set CE). UDP checksum: 0 (SO_NO_CHECK, as RoCE
    NICs send) unless ``gso`` — the kernel refuses GSO without UDP checksums, so batched packets carry one (on
    veths it stays CHECKSUM_PARTIAL: a capture shows the pseudo-header sum). TTL and both checksums are masked
    out of the ICRC, so the ICRC is the same either way. Bound to ``sport`` (the entropy ECMP hashes;
    SO_REUSEADDR so flows may share a port). ``prio``: the host NIC class (SO_PRIORITY → HTB class
    1:(0x10+prio)) when the NICs obey PFC or credits, so that pauses and credit meters hold the RoCE packets."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if not gso:
        s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    if prio is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, skb_priority(prio))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)          # it never receives
    # Without IP_RECVERR, UDP hides a full qdisc (ENOBUFS becomes "sent"; the packet is lost). With it the sender
    # sees ENOBUFS and retries, lossless like the raw socket was (and a NIC queue is). Side effect: an ICMP
    # error (nobody on :4791) fails the next send once with ECONNREFUSED/EHOSTUNREACH; the requester retries.
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    if sndbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4096, sndbuf))
    s.bind((src, sport))
    s.setblocking(False)
    return s


class _Fix(dict):
    """ulen → the ICRC correction for sending BTH resv8a as 0 while the ICRC covers it masked (0xFF). CRC is
    affine: crc(seed, A) ^ crc(seed, B) = L(A ^ B) for equal lengths, so the correction is the CRC of 0xFF at
    that byte followed by the rest of the covered bytes, minus the CRC of zeros — one constant per length."""

    def __missing__(self, ulen: int) -> int:
        n = ulen - UDP_LEN - ICRC_LEN                  # BTH … pad: the covered bytes after the UDP header
        v = self[ulen] = zlib.crc32(bytes(4) + b"\xff" + bytes(n - 5)) ^ zlib.crc32(bytes(n))
        return v


class DataTemplate:
    """Data-packet builder for a :func:`data_socket`: we write BTH [+ RETH] / payload / pad / ICRC, the kernel
    the IPv4/UDP headers (see :func:`data_socket`). On the wire the same as :class:`Template` packets except the
    IP identification (0, or the position in a GSO batch) and, for batched sends, the UDP checksum.

    ``pre[key]``: CRC state after [8×0xFF LRH][masked IPv4 with id][masked UDP], key = (sport << 16 | udp_len)
    << 7 | ip_id (cached: :meth:`prefix`). ``fix[udp_len]``: xor into the CRC of the real bytes (resv8a 0) to get
    the ICRC (resv8a masked). Pack the BTH with ``word1`` (resv8a 0 | dest QP)."""

    def __init__(self, src: str, dst: str, dqpn: int, pkey: int = PKEY_DEFAULT):
        self.src, self.dst = socket.inet_aton(src), socket.inet_aton(dst)
        self.pkey = pkey
        self.word1 = dqpn & PSN_MASK
        self.pre: dict[int, int] = {}
        self.fix = _Fix()

    def prefix(self, sport: int, udp_len: int, ip_id: int = 0) -> int:
        key = (sport << 16 | udp_len) << 7 | ip_id
        c = self.pre.get(key)
        if c is None:
            h = bytearray(IP_LEN + UDP_LEN)
            IP.pack_into(h, 0, 0x45, 0xFF, IP_LEN + udp_len, ip_id, 0x4000, 0xFF, socket.IPPROTO_UDP, 0xFFFF,
                         self.src, self.dst)
            UDP.pack_into(h, IP_LEN, sport, ROCE_PORT, udp_len, 0xFFFF)
            c = self.pre[key] = zlib.crc32(h, LRH_SEED)
        return c


def ack_packet(t: Template, psn: int, sport: int, msn: int = 0, nak: bool = False, xack: bytes = b"") -> bytes:
    """An ACK (or NAK) of ``psn``; ``xack`` (:func:`xack_bytes`) rides after the AETH when the flow uses the
    extended transport."""
    syn = SYN_NAK_SEQ if nak else SYN_ACK
    return t.packet(OP_ACK, psn, sport, payload=xack, aeth=(syn << 24) | (msn & PSN_MASK))


def xack_bytes(flags: int, sack_base: int, bitmap: int, ts_echo_us: int, credit_psn: int,
               echoes: list[tuple[int, int]], int_records: bytes = b"") -> bytes:
    """An XACK; ``int_records`` (whole 32-byte INT hop records) ride after the echoes with XACK_INT set."""
    if int_records:
        flags |= XACK_INT
    head = XACK.pack(flags, len(echoes), len(int_records) // INT_HOP_LEN, sack_base & PSN_MASK,
                     bitmap & ((1 << SACK_BITS) - 1), ts_echo_us & 0xFFFFFFFF, credit_psn & PSN_MASK)
    return head + b"".join(ECHO.pack(e, f, 0) for e, f in echoes) + int_records


def parse_xack(buf, off: int, end: int):
    """(flags, sack_base, bitmap, ts_echo_us, credit_psn, [(entropy, flags), …], INT records) of the XACK at
    ``off``, or None when the ACK carries none (``end``: where the ICRC starts). INT records: the bytes of the
    hop records (:func:`int_hops` reads them), empty without XACK_INT."""
    if end - off < XACK_LEN:
        return None
    flags, n, nint, base, bitmap, ts, credit = XACK.unpack_from(buf, off)
    off += XACK_LEN
    n = min(n, (end - off) // ECHO_LEN)
    echoes = [ECHO.unpack_from(buf, off + ECHO_LEN * i)[:2] for i in range(n)]
    recs = b""
    if flags & XACK_INT:
        off += ECHO_LEN * n
        recs = bytes(buf[off:off + min(nint, (end - off) // INT_HOP_LEN) * INT_HOP_LEN])
    return flags, base, bitmap, ts, credit, echoes, recs


def cnp_packet(t: Template, sport: int) -> bytes:
    return t.packet(OP_CNP, 0, sport, payload=bytes(CNP_PAD), becn=True)


def parse_bth(buf, off: int = 0) -> tuple[int, int, int, bool, int]:
    """(opcode, pad, dest QP, ack-request, PSN) of the BTH at ``off`` (UDP payload start)."""
    op, flags, _pkey, qp, apsn = BTH.unpack_from(buf, off)
    return op, (flags >> 4) & 3, qp & PSN_MASK, bool(apsn >> 31), apsn & PSN_MASK


def unwrap(psn24: int, ref: int) -> int:
    """Absolute packet index of a 24-bit PSN, the one nearest to ``ref`` (an absolute index)."""
    d = (psn24 - ref) & PSN_MASK
    if d >= PSN_HALF:
        d -= 1 << 24
    return ref + d
