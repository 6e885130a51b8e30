"""A host's RoCE endpoint: the UDP socket on :4791 and the raw socket for ACK/NAK/CNP, the queue-pair numbers,
the message layout both ends know, and the engine's constants (rc.py says how the pieces fit)."""
from __future__ import annotations

import errno
import random
import socket
import struct
import threading
import time


from ...qos_classes import skb_priority
from . import wire as w


ACK_EVERY = 8
BURST = 32
POLL_S = 0.0005              # how often a sender waiting for ACKs looks for them, at least …
POLL_SHARE = 0.25            # … or this share of one packet's time on the host link, when that is longer (slow
                             # links: 16 agents polling every 0.5 ms kept 2 cores busy at 1 Mbit/s)
MAX_LAG_S = 0.002
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
IP_TOS = socket.IP_TOS
SO_TIMESTAMPNS = 35                 # = SCM_TIMESTAMPNS (asm-generic/socket.h; Python's socket module lacks it)
TIMESPEC = struct.Struct("qq")
PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
RCVBUF = 8 << 20
SO_RCVBUFFORCE = 33
SOL_UDP, UDP_SEGMENT = 17, 103
SOFT_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)
GOT, NAKED, NAKED_GOT = 1, 2, 3      # ooo receiver's per-PSN bits: received, NAKed (0: missing)
SACK_BITS = bytes(0x31 if v & GOT else 0x30 for v in range(256))   # per-PSN state → SACK bit character


def unsolicited_packets(eqds: dict, mtu: int) -> int:
    """EQDS: the packets a sender may send before any credit (its unsolicited window, at least one)."""
    return max(1, -(-int(eqds["unsolicited_bytes"]) // mtu))


def rsp_qpn(fid: int) -> int:
    return 0x100 + 2 * fid


def req_qpn(fid: int) -> int:
    return 0x101 + 2 * fid


def flow_data(flow: dict, n: int) -> bytes:
    """The bytes a flow writes (the receiver regenerates them to check the transfer)."""
    return random.Random(0x5EED ^ flow["flow_id"]).randbytes(n)


class Layout:
    """Packet index ↔ (message, offset) for a flow; both ends compute it from the flow alone."""

    def __init__(self, flow: dict):
        o = flow.get("opts") or {}
        self.mtu = int(o.get("mtu", 1024))
        self.size = flow["size_bytes"]
        self.msg = int(o.get("msg_bytes") or self.size or 1 << 20)
        if self.size is not None:
            self.msg = min(self.msg, self.size)
        self.ppm = -(-self.msg // self.mtu)
        if self.size is None:
            self.npk = None
            self.nmsg = None
        else:
            self.nmsg = -(-self.size // self.msg)
            last = self.size - (self.nmsg - 1) * self.msg
            self.npk = (self.nmsg - 1) * self.ppm + -(-last // self.mtu)

    def msg_len(self, m: int) -> int:
        if self.size is None or m < self.nmsg - 1:
            return self.msg
        return self.size - (self.nmsg - 1) * self.msg

    def where(self, idx: int) -> tuple[int, int, int, int, int]:
        """(message, index in message, packets in message, byte offset in the region, payload length)."""
        m, j = divmod(idx, self.ppm)
        ml = self.msg_len(m)
        off_in = j * self.mtu
        n_in = -(-ml // self.mtu)
        return m, j, n_in, (m * self.msg if self.size is not None else 0) + off_in, min(self.mtu, ml - off_in)


def raw_socket(sndbuf: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    if sndbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4096, sndbuf))
    s.setblocking(False)
    return s


class Endpoint:
    """The host's RoCE 'NIC': receive socket on 4791, dispatch by destination QP; shared by the sender loop
    (main thread) and the receive thread, under one lock."""
    closed = False

    def __init__(self):
        s = self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        s.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        # the kernel's receive time of every packet: an ACK's RTT sample is its arrival, not when a Python thread
        # got to it (a sender-only agent drains ACKs when it wakes up to send; Swift uses NIC timestamps)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.bind(("0.0.0.0", w.ROCE_PORT))
        s.setblocking(False)
        self.ctl: dict[int | None, socket.socket] = {None: raw_socket()}   # host NIC class → control socket
        self.lock = threading.RLock()
        self.req: dict = {}                        # QPN → its Requester (requester.py)
        self.rsp: dict = {}                        # QPN → its Responder (responder.py)
        self.buf = bytearray(10000)
        self.bufs = [self.buf]
        self.anc = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(TIMESPEC.size)
        self.unknown = 0
        self.rx_open = False
        self.users = 0
        self.pacer = None                          # EQDS: one credit pacer for the host's link (cc.CreditPacer)

    def credit_pacer(self, eqds: dict, mtu: int):
        """The host's EQDS pacer (made by the first responder that needs it), granting ``mtu``-byte quanta."""
        if self.pacer is None:
            from .cc import CreditPacer
            self.pacer = CreditPacer(eqds["line_rate_bps"], credit_bytes=mtu, overcommit=eqds["overcommit"],
                                     max_outstanding=eqds.get("max_outstanding") or None)
        return self.pacer

    def next_wake(self):
        """When the credit pacer's next grant is due (None: no pacer, or nothing to grant)."""
        return self.pacer.next_time() if self.pacer is not None else None

    def on_timer(self, now: float) -> None:
        """Issue the due credit: each grant raises its responder's credit limit, which leaves in an ACK."""
        with self.lock:
            dirty = {}
            granted = self.pacer.granted
            while (g := self.pacer.next_grant(now)) is not None:
                r = g[0]
                r.credit_psn = r.unsolicited + granted[r] // r.lay.mtu   # whole packets of all credit so far
                dirty[r] = True
            for r in dirty:
                r._ack()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send_ctl(self, pkt: bytes, dst: str, prio: int | None = None) -> bool:
        """Send an ACK/NAK/CNP in host NIC class ``prio`` (its flow's: control packets carry the flow's DSCP, so a
        switch queues them in its class, and under credits they must pass the host's meter of that class); False
        when the host's queue refused it. Control packets are best effort (ACKs are cumulative and the RTO covers
        a lost NAK), but each loss is counted by its flow and reported."""
        sock = self.ctl.get(prio)
        if sock is None:
            sock = self.ctl[prio] = raw_socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, skb_priority(prio))
        try:
            sock.sendto(pkt, (dst, 0))
        except OSError:                    # EAGAIN/ENOBUFS: the host link's queue is full
            return False
        return True

    def on_readable(self, now: float):
        self.drain(256)
        return None

    def drain(self, limit: int) -> None:
        if self.closed:
            return
        with self.lock:
            recv, buf, bufs, anc = self.sock.recvmsg_into, self.buf, self.bufs, self.anc
            rsp, req = self.rsp, self.req
            clock = time.time
            for _ in range(limit):
                try:
                    n, ad, _fl, addr = recv(bufs, anc)
                except BlockingIOError:
                    return
                except OSError:
                    continue
                if n < w.BTH_LEN + w.ICRC_LEN:
                    self.unknown += 1
                    continue
                tos, t_rx = 0, None
                for lvl, _typ, data in ad:
                    if lvl == socket.SOL_SOCKET:
                        sec, nsec = TIMESPEC.unpack(data)
                        t_rx = sec + nsec * 1e-9
                    else:
                        tos = data[0]
                recs = None
                if tos & w.INT_DSCP_BIT:             # an HPCC data packet's INT stack: take it out, keep the records
                    ln = buf[1] * 4
                    if buf[0] >> 4 != 1 or ln < w.INT_HDR_LEN or ln + w.BTH_LEN + w.ICRC_LEN > n:
                        self.unknown += 1
                        continue
                    recs = bytes(buf[w.INT_HDR_LEN:ln])
                    n -= ln
                    buf[:n] = buf[ln:ln + n]
                op = buf[0]
                qpn = (buf[5] << 16) | (buf[6] << 8) | buf[7]
                now = clock()
                if op == w.OP_ACK:
                    q = req.get(qpn)
                    if q is None:
                        self.unknown += 1
                    else:
                        q.on_ack(buf, n, now if t_rx is None or t_rx > now else t_rx)
                elif op == w.OP_CNP:
                    q = req.get(qpn)
                    if q is None:
                        self.unknown += 1
                    else:
                        q.on_cnp(now)
                else:
                    r = rsp.get(qpn)
                    if r is None or op not in w.DATA_OPS:
                        self.unknown += 1
                    else:
                        r.on_data(buf, n, op, tos, now, addr[1], recs)

    def close(self) -> None:                 # the receive thread is done with it
        self.rx_open = False
        self._maybe_close()

    def release(self) -> None:               # a requester is done with it
        self.users -= 1
        self._maybe_close()

    def _maybe_close(self) -> None:
        if not self.rx_open and self.users <= 0 and not self.closed:
            self.closed = True
            self.sock.close()
            for sock in self.ctl.values():
                sock.close()


_ENDPOINT: Endpoint | None = None


def endpoint() -> Endpoint:
    global _ENDPOINT
    if _ENDPOINT is None or _ENDPOINT.closed:
        _ENDPOINT = Endpoint()
    return _ENDPOINT
