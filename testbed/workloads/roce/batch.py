"""Batched data-packet sender: many RoCEv2 packets with arbitrary UDP source ports in one ``sendmmsg``.

Why: per-packet entropy (a different source port every packet) cannot use UDP GSO (one socket = one port), and
one ``sendmsg`` per packet from a socket per port costs a Python call and a syscall per packet. Here one raw IPv4
socket (IP_HDRINCL: we write the IPv4 + UDP headers, so any source port, TOS or CE per packet) sends a whole
burst with one ``sendmmsg`` through ctypes.

Memory: one arena allocated once per sender — ``slots`` header slots (IPv4 + UDP + BTH [+ RETH]), tail slots
(pad + ICRC), three iovecs per packet (header slot | the payload, pointed at in the flow's data buffer, no copy |
tail slot) and one mmsghdr per packet, all wired together at set-up. Per packet only the header bytes, the tail
bytes and three lengths/one pointer change (:meth:`BatchSender.put`).

On the wire (vs :class:`wire.Template` packets of the same fields): the IP identification is
:data:`IP_ID` on every packet (non-zero, so the kernel keeps it; DF is set, so the id identifies no fragments —
RFC 6864), which lets the ICRC reuse the per-(port, length) prefix CRCs of :class:`wire.DataTemplate`; the
kernel fills the IP checksum (raw sockets always do). UDP checksum 0, TTL 64, TOS = DSCP << 2 | ECT0 or | CE.

Back-pressure: IP_RECVERR makes a full host qdisc surface as ENOBUFS instead of a silent drop (raw sockets, like
UDP, hide it otherwise); a full send buffer gives EAGAIN. ``sendmmsg`` returns how many packets went before the
first failure; the caller re-queues the rest.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import struct
import zlib

from . import wire as w
from .link import Link
from ...qos_classes import skb_priority

IP_ID = 1
IP_RECVERR = 11
MSG_DONTWAIT = 0x40
HDR_SLOT = 80                      # ≥ Ethernet 14 + IP 20 + UDP 8 + BTH 12 + RETH 16 + XTH 8
ETH_LEN, ETH_P_IP = 14, 0x0800
TAIL_SLOT = 8                      # pad ≤ 3 + ICRC 4
IOV = 16                           # struct iovec: base, len
MMSG = 64                          # struct mmsghdr: msghdr (56) + msg_len (4) + pad
SOCKADDR = 24                      # ≥ struct sockaddr_ll (20), sockaddr_in (16)

# IPv4 + UDP + BTH in one pack (+ RETH): version/IHL, TOS, total length, id, DF, TTL, proto, csum 0, src, dst,
# sport, dport, UDP length, UDP csum 0, opcode, pad<<4, P_Key, resv8a|dest QP, A|PSN [, VA, R_Key, DMA length]
HDR = struct.Struct("!BBHHHBBH4s4sHHHHBBHII")
HDR_RETH = struct.Struct("!BBHHHBBH4s4sHHHHBBHIIQII")
HDR_X = struct.Struct("!BBHHHBBH4s4sHHHHBBHIIII")              # … + XTH (transmit time, 0): ``ext``
HDR_RETH_X = struct.Struct("!BBHHHBBH4s4sHHHHBBHIIQIIII")
TAIL = tuple(struct.Struct(f"<{p}xI") for p in range(4))     # pad zero bytes, then the ICRC (LSB first)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sendmmsg = _libc.sendmmsg
_sendmmsg.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)
_sendmmsg.restype = ctypes.c_int


def raw_socket(sndbuf: int | None = None, prio: int | None = None) -> socket.socket:
    """The raw IPv4 socket of a batched sender (IPPROTO_RAW: IP_HDRINCL implied, it never receives)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)           # ENOBUFS from a full qdisc, not a silent drop
    return _common(s, sndbuf, prio)


def packet_socket(ifname: str, sndbuf: int | None = None, prio: int | None = None) -> socket.socket:
    """An AF_PACKET socket that only sends (protocol 0: no receive hook) on ``ifname``. Its frames go through
    the device's qdisc like IP packets (no PACKET_QDISC_BYPASS), and a qdisc drop comes back as ENOBUFS."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    s.bind((ifname, 0))
    return _common(s, sndbuf, prio)


def _common(s: socket.socket, sndbuf: int | None, prio: int | None) -> socket.socket:
    if prio is not None:          # the host NIC class (SO_PRIORITY → skb priority), as wire.data_socket
        s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, skb_priority(prio))
    if sndbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4096, sndbuf))
    s.setblocking(False)
    return s


def ip_checksum(hdr: bytes) -> int:
    c = sum(struct.unpack("!10H", hdr[:20]))
    c = (c & 0xFFFF) + (c >> 16)
    c = (c & 0xFFFF) + (c >> 16)
    return ~c & 0xFFFF


class _Checksums(dict):
    """tos << 16 | total length → the IPv4 header checksum (every other header field is fixed per sender);
    all 0 on a raw IP socket, where the kernel fills it."""

    def __init__(self, src: bytes, dst: bytes, fill: bool):
        super().__init__()
        self.src, self.dst, self.fill = src, dst, fill

    def __missing__(self, key: int) -> int:
        v = 0
        if self.fill:
            v = ip_checksum(struct.pack("!BBHHHBBH4s4s", 0x45, key >> 16, key & 0xFFFF, IP_ID, 0x4000, w.TTL,
                                        socket.IPPROTO_UDP, 0, self.src, self.dst))
        self[key] = v
        return v


class BatchSender:
    """Up to ``slots`` packets of one flow (src → dst, dest QP) staged in the arena, sent by :meth:`flush`.

    ``link`` (link.resolve): send Ethernet frames on that NIC (AF_PACKET; the IP checksum ours); None: IPv4
    packets on a raw socket. ``data``: the flow's payload buffer (bytes); iovecs point into it."""

    def __init__(self, src: str, dst: str, dqpn: int, data: bytes, slots: int = 32, sndbuf: int | None = None,
                 prio: int | None = None, pkey: int = w.PKEY_DEFAULT, link: Link | None = None):
        self.link = link
        if link is not None:
            self.sock = packet_socket(link.ifname, sndbuf, prio)
            self.eth = ETH_LEN
        else:
            self.sock = raw_socket(sndbuf, prio)
            self.eth = 0
        self.fd = self.sock.fileno()
        self.slots = slots
        self.src, self.dst = socket.inet_aton(src), socket.inet_aton(dst)
        self.tmpl = w.DataTemplate(src, dst, dqpn, pkey)
        self.word1, self.pkey = self.tmpl.word1, pkey
        self.cks = _Checksums(self.src, self.dst, link is not None)
        self.hl_reth = self.eth + w.IP_LEN + w.UDP_LEN + w.BTH_LEN + w.RETH_LEN     # header iovec lengths
        self.hl_bth = self.eth + w.IP_LEN + w.UDP_LEN + w.BTH_LEN
        self._data = data                                      # keep it alive: the iovecs point into it
        self.data_addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value if len(data) else 0
        o_hdr = 0
        o_tail = o_hdr + slots * HDR_SLOT
        o_iov = o_tail + slots * TAIL_SLOT
        o_mmsg = o_iov + slots * 3 * IOV
        o_name = o_mmsg + slots * MMSG
        self.arena = bytearray(o_name + SOCKADDR)
        self._c = (ctypes.c_char * len(self.arena)).from_buffer(self.arena)
        base = ctypes.addressof(self._c)
        self.mmsg_addr = base + o_mmsg
        if link is not None:     # sockaddr_ll: family, protocol (big-endian), ifindex, hatype, pkttype, halen, addr
            struct.pack_into("=H2siHBB8s", self.arena, o_name, socket.AF_PACKET, struct.pack("!H", ETH_P_IP),
                             link.ifindex, 0, 0, 6, link.dst_mac)
            namelen = 20
        else:                    # sockaddr_in: family, port 0, address
            struct.pack_into("=HH4s8x", self.arena, o_name, socket.AF_INET, 0, self.dst)
            namelen = 16
        q = memoryview(self.arena)
        for i in range(slots):
            if link is not None:
                q[i * HDR_SLOT:i * HDR_SLOT + ETH_LEN] = link.dst_mac + link.src_mac + struct.pack("!H", ETH_P_IP)
            iov = o_iov + i * 3 * IOV
            struct.pack_into("=QQQQQQ", q, iov, base + o_hdr + i * HDR_SLOT, 0, 0, 0,
                             base + o_tail + i * TAIL_SLOT, 0)
            # msghdr: name, namelen, iov, iovlen, control, controllen, flags; then msg_len
            struct.pack_into("=QI4xQQQQi4xI4x", q, o_mmsg + i * MMSG, base + o_name, namelen, base + iov, 3,
                             0, 0, 0, 0)
        self.mv = q
        self.hdr_off = [o_hdr + i * HDR_SLOT + self.eth for i in range(slots)]       # where the IPv4 header starts
        self.tail_off = [o_tail + i * TAIL_SLOT for i in range(slots)]
        self.bth = [self.mv[o:o + w.BTH_LEN] for o in (x + 28 for x in self.hdr_off)]
        self.bthreth = [self.mv[o:o + w.BTH_LEN + w.RETH_LEN] for o in (x + 28 for x in self.hdr_off)]
        self.bthx = [self.mv[o:o + w.BTH_LEN + w.XTH_LEN] for o in (x + 28 for x in self.hdr_off)]
        self.bthrethx = [self.mv[o:o + w.BTH_LEN + w.RETH_LEN + w.XTH_LEN] for o in (x + 28 for x in self.hdr_off)]
        # iovec words (uint64) of packet i: [6i+1] header length, [6i+2] payload address, [6i+3] payload length,
        # [6i+5] tail length (the header and tail addresses are fixed)
        self.iovq = self.mv[o_iov:o_mmsg].cast("Q")
        self.n = 0

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        self.sock.close()

    def flush(self) -> int:
        """Send the staged packets with one ``sendmmsg``; returns how many left (the first ones, in order),
        raises OSError when none could (EAGAIN: send buffer full; ENOBUFS: the host qdisc refused it). The
        staged packets are dropped from the arena either way: the caller re-stages what did not go."""
        n, self.n = self.n, 0
        if not n:
            return 0
        r = _sendmmsg(self.fd, self.mmsg_addr, n, MSG_DONTWAIT)
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))          # EAGAIN comes out as BlockingIOError
        return r


def fill(bs: BatchSender, i: int, tos: int, sport: int, ulen: int, opcode: int, pad: int, psnw: int,
         reth: tuple | None, off: int, ln: int) -> None:
    """Stage packet ``i`` (slow path, for tests; :meth:`requester.Requester._burst` inlines the same steps): IPv4/UDP/
    BTH[/RETH] header, payload ``data[off:off+ln]``, pad and ICRC."""
    h = bs.hdr_off[i]
    ip = (0x45, tos, w.IP_LEN + ulen, IP_ID, 0x4000, w.TTL, socket.IPPROTO_UDP, bs.cks[tos << 16 | w.IP_LEN + ulen],
          bs.src, bs.dst,
          sport, w.ROCE_PORT, ulen, 0, opcode, pad << 4, bs.pkey, bs.word1, psnw)
    if reth is not None:
        HDR_RETH.pack_into(bs.mv, h, *ip, *reth)
        b = bs.bthreth[i]
    else:
        HDR.pack_into(bs.mv, h, *ip)
        b = bs.bth[i]
    src = memoryview(bs._data)[off:off + ln]
    c = zlib.crc32(src, zlib.crc32(b, bs.tmpl.prefix(sport, ulen, IP_ID)))
    c = zlib.crc32(bytes(pad), c) ^ bs.tmpl.fix[ulen]
    TAIL[pad].pack_into(bs.mv, bs.tail_off[i], c)
    q = bs.iovq
    q[6 * i + 1] = bs.eth + 28 + len(b)
    q[6 * i + 2] = bs.data_addr + off
    q[6 * i + 3] = ln
    q[6 * i + 5] = pad + 4
    bs.n = max(bs.n, i + 1)


def staged(bs: BatchSender, i: int) -> bytes:
    """Packet ``i`` as the kernel will receive it (header slot + payload + tail; a frame with ``link``), for
    tests."""
    q = bs.iovq
    hl, base, ln, tl = q[6 * i + 1], q[6 * i + 2], q[6 * i + 3], q[6 * i + 5]
    h, t = bs.hdr_off[i] - bs.eth, bs.tail_off[i]
    off = base - bs.data_addr
    return bytes(bs.mv[h:h + hl]) + bytes(bs._data[off:off + ln]) + bytes(bs.mv[t:t + tl])
