"""The built-in RoCEv2 engine (``traffic.engine: roce``): RC queue pairs doing RDMA WRITEs over UDP 4791.

One flow = one RC QP (requester on the flow's source host, responder on its destination). Responder QPN =
0x100 + 2·flow_id, requester QPN = responder + 1. A sized flow is a sequence of RDMA WRITE messages of
``msg_bytes`` (the last one shorter) into a memory region of ``size_bytes``; a duration flow repeats messages of
``msg_bytes`` until the end of the run. Packets carry ``mtu`` payload bytes (the IB path MTU); WRITE FIRST/ONLY
carry a RETH, the last packet of a message asks for an ACK.

Per host (agent process) one ``Endpoint``: a UDP socket bound to :4791 (receives data, ACK/NAK, CNP; IP_RECVTOS
gives the ECN bits) and a raw socket for ACK/NAK/CNP. A requester with one entropy value sends its data packets
on its own UDP socket (``wire.data_socket``: the kernel writes IPv4/UDP headers whose ICRC-covered fields are
fixed — IP id 0 with DF — so the ICRC is still exact; IP_RECVERR makes a full shaped host link back-pressure it
with ENOBUFS/EAGAIN like a NIC queue instead of dropping silently); one with several (``entropy: packet`` and the
path-aware modes) writes whole frames, each with the source port its entropy policy picks, and sends bursts of
them with one sendmmsg (``batch.py``; the same back-pressure).

Reliability (RC):
  receiver gbn  (what RoCE NICs do) the responder accepts only the expected PSN; on a gap it sends one NAK
                (PSN sequence error) carrying the expected PSN and drops out-of-order packets; the requester
                goes back to that PSN and resends everything from it (go-back-N).
  receiver ooo  (DDP / IRN style) the responder places every packet by its PSN (the message layout is known to
                both ends, as DDP placement information would tell it), acknowledges cumulatively and NAKs a
                missing PSN selectively once the highest received PSN is ``reorder_window`` packets past it
                and that happened ``reorder_time`` ago (sprayed paths reorder by the spread of their queueing
                delays, in time more than in packets: a faster sender deepens the reordering in PSNs);
                the requester then resends only that PSN (selective repeat).
  Cumulative ACKs every ``ACK_EVERY`` in-order packets and on every ack-request; retransmit timeout ``rto_s``
  (go back to / resend the oldest unacknowledged PSN).
Congestion control ``cc: dcqcn``: CE-marked arrivals make the responder send a CNP (opcode 0x81) at most once per
QP per CNP interval; the requester's CC (DCQCN's reaction point, a ``SenderCC``: ``cc/dcqcn.py``) sets its
pacing rate from them; the other CCs read ACKs (``cc/``), every one through the requester's one CC slot. ``cc: none``: the
requester sends as fast as the host link takes it (or at the flow's rate).

Test-only knobs (``traffic.roce``): ``drop_prob`` makes the responder discard that fraction of data packets as if
the network lost them (seeded); ``ce_prob`` makes the requester send that fraction of packets already CE-marked.
"""
from __future__ import annotations

import array
import collections
import errno
import hashlib
import random
import socket
import struct
import threading
import time

from isal.isal_zlib import crc32 as fast_crc32     # = zlib.crc32, about twice as fast on 1 KB (tests/transport/test_roce_batch.py)

from . import entropy, wire as w
from .batch import HDR as BATCH_HDR, HDR_RETH as BATCH_HDR_RETH, IP_ID as BATCH_IP_ID, TAIL as BATCH_TAIL
from .batch import HDR_RETH_X as BATCH_HDR_RETH_X, HDR_X as BATCH_HDR_X
from .batch import BatchSender
from .link import resolve
from .cc import NotificationPoint, make_sender_cc
from ..engine_api import DONE, READY, WAIT_TIME, WAIT_WRITE

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
_SACK_BITS = bytes(0x31 if v & GOT else 0x30 for v in range(256))   # per-PSN state → SACK bit character


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


def _raw_socket(sndbuf: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    if sndbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4096, sndbuf))
    s.setblocking(False)
    return s


# ---------------------------------------------------------------- per host

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
        self.ctl = _raw_socket()
        self.lock = threading.RLock()
        self.req: dict[int, "Requester"] = {}
        self.rsp: dict[int, "Responder"] = {}
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

    def send_ctl(self, pkt: bytes, dst: str) -> bool:
        """Send an ACK/NAK/CNP; False when the host's queue refused it. Control packets are best effort (ACKs are
        cumulative and the RTO covers a lost NAK), but each loss is counted by its flow and reported."""
        try:
            self.ctl.sendto(pkt, (dst, 0))
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
            self.ctl.close()


_ENDPOINT: Endpoint | None = None


def endpoint() -> Endpoint:
    global _ENDPOINT
    if _ENDPOINT is None or _ENDPOINT.closed:
        _ENDPOINT = Endpoint()
    return _ENDPOINT


# ---------------------------------------------------------------- responder (receiver of a flow)

class Responder:
    def __init__(self, flow: dict, ep: Endpoint, drain_s: float):
        o = flow.get("opts") or {}
        self.flow = flow
        self.flow_id = flow["flow_id"]
        self.ep = ep
        self.lay = Layout(flow)
        self.size = flow["size_bytes"]
        self.ooo_mode = o.get("receiver", "gbn") == "ooo"
        self.ext = bool(o.get("ext"))              # data packets carry an XTH (transmit time)
        self.xacks = self.ext or self.ooo_mode     # ACKs carry an XACK (SACK bitmap, echoes)
        self.echoes: list = []                     # (entropy, ECHO_* flags) since the last ACK
        self.int_rec = b""                         # HPCC: the INT hop records of the last data packet, not yet echoed
        self.int_stacks = 0                        # data packets that arrived with an INT stack
        self.ts_echo = 0
        self.trims = 0
        self.credit_psn = None                     # EQDS: the receiver's credit limit for this flow
        eq = (o.get("cc_params") or {}).get("eqds") if o.get("cc") in ("eqds", "nscc+eqds") else None
        self.unsolicited = unsolicited_packets(eq, self.lay.mtu) if eq else None
        if eq:
            self.credit_psn = self.unsolicited
            npk = self.lay.npk
            ep.credit_pacer(eq, self.lay.mtu).register(
                self, None if npk is None else max(0, npk - self.unsolicited) * self.lay.mtu)
        self.window = int(o.get("reorder_window", 32))
        self.reorder_s = float(o.get("reorder_time_s", 0.0))
        self.reorder_max_s = max(self.reorder_s, float(o.get("rto_s", 0.01)))
        self.reorder_grown_at = -1.0
        self.spurious = 0
        self.passed: collections.deque = collections.deque()   # (limit, when the highest PSN passed it)
        self.limit_seen = 0
        self.region = bytearray(self.size) if self.size is not None else None
        self.have = bytearray(self.lay.npk) if (self.ooo_mode and self.lay.npk) else bytearray()
        self.epsn = 0
        self.highest = -1
        self.nak_upto = 0
        self.nak_out = False
        self.since_ack = 0
        self.dups_since_ack = 0
        self.bytes = 0
        self.packets = 0
        self.ooo = 0
        self.dup = 0
        self.naks = 0
        self.acks = 0
        self.dropped = 0
        self.ctl_lost = 0                 # ACK/NAK/CNP packets the host could not send
        self.first_rx = self.last_rx = None
        self.complete_at = None
        self.on_complete = None           # called with the responder when its last packet arrives (gating)
        self.deadline = None
        self.drain_s = drain_s
        self.drop_prob = float(o.get("drop_prob") or 0.0)
        self.rng = random.Random(0xD20 + self.flow_id)
        cc = o.get("cc", "none")
        self.np = NotificationPoint(float(o["cnp_interval_s"])) if o.get("cnp", cc == "dcqcn") else None
        self.ce = 0
        self.ctl = w.Template(flow["dst_addr"], flow["src_addr"], req_qpn(self.flow_id),
                              tos=flow.get("dscp", w.DSCP_ROCE) << 2)
        self.dst = flow["src_addr"]
        self.sport = flow["sport"]

    # -- control packets
    def _xack(self, trim: bool) -> bytes:
        """The XACK of the next ACK/NAK: SACK bitmap over the 64 PSNs after the cumulative one, the echoed
        transmit time, the credit limit, the echoes gathered since the last ACK (then cleared), and the INT hop
        records of the last data packet that carried a stack (once)."""
        flags = w.XACK_TRIM if trim else 0
        bitmap = 0
        base = self.epsn + 1
        if self.ooo_mode and self.highest >= base:
            bits = self.have[base:base + w.SACK_BITS].translate(_SACK_BITS)
            bitmap = int(bits[::-1], 2)
            flags |= w.XACK_SACK
        if self.ext:
            flags |= w.XACK_TS
        credit = 0
        if self.credit_psn is not None:
            flags |= w.XACK_CREDIT
            credit = self.credit_psn
        echoes, self.echoes = self.echoes[:w.ECHO_MAX], self.echoes[w.ECHO_MAX:]
        recs, self.int_rec = self.int_rec, b""
        return w.xack_bytes(flags, base, bitmap, self.ts_echo, credit, echoes, recs)

    def _ack(self, nak_psn: int | None = None, trim: bool = False) -> None:
        x = self._xack(trim) if (self.xacks or trim) else b""
        if nak_psn is not None:
            self.naks += 1
            pkt = w.ack_packet(self.ctl, nak_psn, self.sport, self.epsn // self.lay.ppm, nak=True, xack=x)
        else:
            self.acks += 1
            pkt = w.ack_packet(self.ctl, self.epsn - 1, self.sport, self.epsn // self.lay.ppm, xack=x)
        self.since_ack = 0
        if not self.ep.send_ctl(pkt, self.dst):
            self.ctl_lost += 1

    def on_data(self, buf, n: int, op: int, tos: int, now: float, entropy: int = 0, int_recs=None) -> None:
        """A data packet (``buf[:n]``: BTH onwards); ``int_recs``: the hop records of the INT stack it carried."""
        if int_recs is not None:
            self.int_rec = int_recs
            self.int_stacks += 1
        trimmed = buf[4] & w.BTH_TRIMMED
        if not trimmed and self.drop_prob and self.rng.random() < self.drop_prob:
            self.dropped += 1
            return
        ce = (tos & w.ECN_MASK) == w.CE
        if ce:
            self.ce += 1
            if self.np is not None and self.np.on_ce(now) and not self.ep.send_ctl(
                    w.cnp_packet(self.ctl, self.sport), self.dst):
                self.ctl_lost += 1
        pad = (buf[1] >> 4) & 3
        ackreq = buf[8] & 0x80
        idx = w.unwrap((buf[9] << 16) | (buf[10] << 8) | buf[11], self.epsn)
        hl = w.BTH_LEN + (w.RETH_LEN if op in w.RETH_OPS else 0)
        if self.ext:
            self.ts_echo = w.XTH.unpack_from(buf, hl)[0]
            hl += w.XTH_LEN
        if self.xacks:
            self.echoes.append((entropy, (w.ECHO_CE if ce else 0) | (w.ECHO_TRIM if trimmed else 0)))
        plen = n - hl - pad - w.ICRC_LEN
        if self.first_rx is None:
            self.first_rx = now
        npk = self.lay.npk
        if npk is not None and not 0 <= idx < npk:
            self.dup += 1
            return
        if self.unsolicited is not None and idx >= self.unsolicited:
            self.ep.pacer.on_data(self.lay.mtu)      # credited data arrived (or its header): not outstanding
        if trimmed:
            self._trimmed(idx, now)
        elif self.ooo_mode:
            self._ooo(buf, idx, hl, plen, ackreq, now)
        else:
            self._gbn(buf, idx, hl, plen, ackreq, now)

    def _trimmed(self, idx: int, now: float) -> None:
        """A switch trimmed this packet (its payload is gone): NAK it at once, one RTT before a hole would show
        (ooo: that PSN; gbn: the expected PSN, the sender goes back to it)."""
        self.trims += 1
        if self.ooo_mode:
            have = self.have
            if idx >= len(have):
                have.extend(bytes(idx - len(have) + 4096))
            if idx >= self.epsn and not have[idx] & GOT:
                have[idx] = NAKED
                self._ack(nak_psn=idx & w.PSN_MASK, trim=True)
            return
        if idx >= self.epsn:
            self.nak_out = True
            self._ack(nak_psn=self.epsn & w.PSN_MASK, trim=True)

    def _place(self, buf, idx: int, hl: int, plen: int, now: float) -> None:
        self.packets += 1
        self.bytes += plen
        self.last_rx = now
        if self.region is not None:
            off = self.lay.where(idx)[3]
            self.region[off:off + plen] = buf[hl:hl + plen]

    def _done_check(self, now: float) -> None:
        if self.lay.npk is not None and self.epsn >= self.lay.npk and self.complete_at is None:
            self.complete_at = now
            if self.unsolicited is not None:
                self.ep.pacer.stop(self)
            self._ack()
            if self.on_complete is not None:      # whichever thread drained the packet: announce it now
                self.on_complete(self)

    def _gbn(self, buf, idx, hl, plen, ackreq, now) -> None:
        if idx == self.epsn:
            self._place(buf, idx, hl, plen, now)
            self.epsn += 1
            self.nak_out = False
            self.since_ack += 1
            if ackreq or self.since_ack >= ACK_EVERY:
                self._ack()
            self._done_check(now)
        elif idx > self.epsn:
            self.ooo += 1
            if not self.nak_out:
                self.nak_out = True
                self._ack(nak_psn=self.epsn)
        else:
            self.dup += 1
            self.dups_since_ack += 1
            if ackreq or self.dups_since_ack >= ACK_EVERY:
                self.dups_since_ack = 0
                self._ack()

    def _ooo(self, buf, idx, hl, plen, ackreq, now) -> None:
        have = self.have
        if idx >= len(have):
            have.extend(bytes(idx - len(have) + 4096))
        if idx < self.epsn or have[idx] & GOT:
            if have[idx] == NAKED_GOT:
                self._spurious_nak(idx, now)
            self.dup += 1
            self.dups_since_ack += 1
            if ackreq or self.dups_since_ack >= ACK_EVERY:
                self.dups_since_ack = 0
                self._ack()
            return
        have[idx] = NAKED_GOT if have[idx] == NAKED else GOT
        self._place(buf, idx, hl, plen, now)
        if idx != self.epsn:
            self.ooo += 1
        if idx > self.highest:
            self.highest = idx
        advanced = False
        n = len(have)
        while self.epsn < n and have[self.epsn] & GOT:
            self.epsn += 1
            advanced = True
        if advanced or self.xacks:            # with SACKs every arrival is news for the sender
            self.since_ack += 1
        # selective NAK: holes the highest PSN passed by more than the reorder window at least reorder_s ago
        limit = self.highest - self.window
        if limit > self.limit_seen:
            self.passed.append((limit, now))
            self.limit_seen = limit
        ripe = self.nak_upto
        while self.passed and now - self.passed[0][1] >= self.reorder_s:
            ripe = max(ripe, self.passed.popleft()[0])
        if ripe > self.nak_upto:
            for j in range(max(self.epsn, self.nak_upto), ripe):
                if not have[j] & GOT:
                    have[j] = NAKED
                    self._ack(nak_psn=j & w.PSN_MASK)
            self.nak_upto = ripe
        if ackreq or self.since_ack >= ACK_EVERY:
            self._ack()
        self._done_check(now)

    def _spurious_nak(self, idx: int, now: float) -> None:
        """A second copy of a PSN we NAKed: the original was late, not lost (the NAK was spurious, as a D-SACK
        tells TCP). Like RACK's reordering window, double reorder_s — at most once per reorder_s, up to the RTO:
        beyond that the requester's timer retransmits anyway."""
        self.have[idx] = GOT
        self.spurious += 1
        if now - self.reorder_grown_at >= self.reorder_s and self.reorder_s < self.reorder_max_s:
            self.reorder_s = min(self.reorder_max_s, max(2 * self.reorder_s, 1e-4))
            self.reorder_grown_at = now

    # -- the agent's RxFlow interface
    @property
    def complete(self) -> bool:
        return self.complete_at is not None

    def finished(self, now: float) -> bool:
        if self.complete:
            return True
        done = self.deadline is not None and now > self.deadline and (
            self.lay.npk is None or now - max(self.deadline, self.last_rx or 0.0) > self.drain_s)
        if done and self.unsolicited is not None:
            with self.ep.lock:
                self.ep.pacer.stop(self)             # a duration flow's demand ends with the run
        return done

    def result(self) -> dict:
        ok = None
        if self.region is not None:
            ok = self.complete and hashlib.sha256(self.region).digest() == hashlib.sha256(
                flow_data(self.flow, self.size)).digest()
        return dict(bytes=min(self.bytes, self.size) if self.size is not None and self.complete else self.bytes,
                    packets=self.packets, first_rx=self.first_rx,
                    last_rx=self.complete_at or self.last_rx, complete=self.complete, dup=self.dup,
                    reordered=self.ooo, naks_sent=self.naks, acks_sent=self.acks, ce_marks=self.ce,
                    cnps_sent=self.np.cnps if self.np else 0, injected_drops=self.dropped, checksum_ok=ok,
                    ctl_lost=self.ctl_lost, trims_seen=self.trims, int_stacks=self.int_stacks)


# ---------------------------------------------------------------- requester (sender of a flow)

class RttStats:
    """RTT samples from the echoed transmit times: minimum (the base RTT seen), smoothed (EWMA 1/8, as TCP's
    SRTT), and the median of a bounded sample."""
    KEEP = 4096

    INITIAL = 4          # RTO multiple before the first sample (RFC 6298 starts at 1 s): a first window that
                         # queues behind an incast's other first windows is not lost

    def __init__(self, expect: bool = False):
        self.expect = expect                        # samples will come (the flow carries XTH timestamps)
        self.min = self.srtt = None
        self.var = 0.0
        self.n = 0
        self.keep: list = []

    def add(self, r: float) -> None:
        self.n += 1
        self.min = r if self.min is None or r < self.min else self.min
        if self.srtt is None:
            self.srtt, self.var = r, r / 2
        else:
            self.var += (abs(r - self.srtt) - self.var) / 4
            self.srtt += (r - self.srtt) / 8
        if len(self.keep) < self.KEEP:
            self.keep.append(r)
        else:
            self.keep[self.n % self.KEEP] = r

    def rto(self, floor: float) -> float:
        """The retransmit timeout: the configured one, or SRTT + 4·RTTVAR when that is longer (RFC 6298's
        estimator, the configured RTO as its minimum) — a deep queue on one path must not fire it spuriously."""
        if self.srtt is None:
            return floor * (self.INITIAL if self.expect else 1)
        return max(floor, self.srtt + 4 * self.var)

    def stats(self) -> dict:
        if not self.n:
            return {}
        k = sorted(self.keep)
        return dict(rtt_samples=self.n, rtt_min_s=self.min, rtt_p50_s=k[len(k) // 2],
                    rtt_p99_s=k[min(len(k) - 1, int(len(k) * 0.99))])


class CcTrace:
    """The CC's window and rate over time, one sample per ``every`` seconds at most (for cc.csv and the plot),
    and percentiles of the rate over every sample."""
    KEEP = 5000

    def __init__(self, every: float):
        self.every = every
        self.next = 0.0
        self.rows: list = []
        self.rates: list = []

    def sample(self, now: float, cwnd, rate) -> None:
        if now < self.next:
            return
        self.next = now + self.every
        if rate is not None:
            self.rates.append(rate)
        if len(self.rows) < self.KEEP:
            self.rows.append((now, None if cwnd is None or cwnd == float("inf") else cwnd, rate))

    def stats(self) -> dict:
        d: dict = {"cc_trace": self.rows}
        if self.rates:
            r = sorted(self.rates)
            q = (lambda f: r[min(len(r) - 1, int(len(r) * f))])
            d.update(cc_rate_p5=q(0.05), cc_rate_p50=q(0.5), cc_rate_p95=q(0.95))
        return d


class Requester:
    def __init__(self, flow: dict, job: dict):
        o = flow.get("opts") or {}
        self.flow = flow
        self.fid = flow["flow_id"]
        self.ep = endpoint()
        self.ep.users += 1
        self.lay = Layout(flow)
        self.npk = self.lay.npk
        self.dst = flow["dst_addr"]
        self.daddr = (self.dst, w.ROCE_PORT)
        dscp = flow.get("dscp", w.DSCP_ROCE)
        self.tmpl = w.DataTemplate(flow["src_addr"], flow["dst_addr"], rsp_qpn(self.fid))   # TOS: not in the ICRC
        self.selective = o.get("receiver", "gbn") == "ooo"
        mode = o.get("entropy", "qp")
        n_ent = int(o.get("entropy_values") or 1) if mode != "qp" else 1
        self.n_ent = max(1, n_ent)
        decay = o.get("penalty_decay_s")
        self.decay_per_rtt = decay is None and mode == "bitmap"     # a penalty point lasts one smoothed RTT
        self.policy = entropy.make(mode, self.n_ent, float(decay or 0.0025), 0xE7 + self.fid)
        self.track_ent = mode in ("reps", "bitmap")     # remember each PSN's entropy (NAK/timeout penalties)
        self.psn_ent = array.array("H")
        self.ext = bool(o.get("ext"))                   # data packets carry an XTH (transmit time)
        self.sacked = bytearray()                       # selective: PSNs the receiver SACKed
        self.nsacked = 0                                # … of them at or above una
        self.sacks = self.trim_naks = 0
        self.rtt = RttStats(expect=self.ext)
        self.credit_limit = None                        # EQDS: new PSNs below it may go (None: no credit gate)
        self.sport = min(flow["sport"], 65535 - self.n_ent + 1)
        self.batch = max(1, min(int(o.get("batch") or 1), 32))
        self.tos = (dscp << 2) | w.ECT0
        # HPCC: an empty INT stack before every data packet's BTH (every switch adds its record; wire.py)
        hops = int(o.get("int_hops") or 0)
        self.int_stack = w.int_host_stack(hops, self.tos) if hops else b""
        self.int_echoes = 0                              # ACKs that echoed INT hop records
        size = flow["size_bytes"]
        self.data = memoryview(flow_data(flow, size if size is not None else self.lay.msg))
        if self.n_ent > 1:
            if self.int_stack:
                raise ValueError("traffic.roce.entropy: hpcc's INT stack needs one source port per QP (entropy qp)")
            # more than one source port: one raw socket, whole bursts per sendmmsg (batch.py)
            self.bs = BatchSender(flow["src_addr"], flow["dst_addr"], rsp_qpn(self.fid), self.data.obj, BURST,
                                  sndbuf=job.get("sndbuf_each"), prio=flow.get("prio"),
                                  link=resolve(flow["src_addr"], flow["dst_addr"]))
            self.socks = []
            self.sock = self.bs.sock
        else:
            # one UDP socket (the source port is the socket's); see wire.data_socket
            self.bs = None
            self.socks = [w.data_socket(flow["src_addr"], self.sport,
                                        tos=self.tos | (w.INT_DSCP_BIT if self.int_stack else 0),
                                        sndbuf=job.get("sndbuf_each"), gso=self.batch > 1, prio=flow.get("prio"))]
            self.sock = self.socks[0]                # the one to poll for writability
        self.ce_cmsg = [(socket.IPPROTO_IP, IP_TOS, struct.pack(
            "i", (dscp << 2) | w.CE | (w.INT_DSCP_BIT if self.int_stack else 0)))]
        self.rto = float(o.get("rto_s", 0.01))
        line = o.get("line_bps")
        self.poll_s = max(POLL_S, POLL_SHARE * (self.lay.mtu + w.HDR_MAX) * 8 / line) if line else POLL_S
        self.ce_prob = float(o.get("ce_prob") or 0.0)
        self.rng = random.Random(0xCE + self.fid)
        self.deadline = job["t0"] + job["duration_s"]
        self.static_rate = flow.get("rate_bps")
        self.cc_name = o.get("cc", "none")
        self.cc = None                                  # the flow's SenderCC (roce/cc/; None: cc none)
        self.cc_opts = o.get("cc_params") or {}
        if self.cc_name == "dcqcn" and "dcqcn" not in self.cc_opts:
            self.cc_opts = {"dcqcn": o["dcqcn"]}
        self.trace = CcTrace(float(o.get("cc_trace_s") or 0.001)) if self.cc_name != "none" else None
        self.una = self.nxt = self.hi = 0
        self.retxq: collections.deque = collections.deque()
        self.sent = self.retrans = self.timeouts = self.naks = self.acks = 0
        self.bytes = 0
        self.send_start = self.send_end = None
        self.last_progress = 0.0
        self.next_t = 0.0
        self.pace_rate = 0.0                            # the rate next_t was scheduled at
        self.ackreq_at = -1.0                           # when a packet last asked for an ACK
        # a packet asks for an ACK at least this often, and a paced sender looks at its ACKs at least this often:
        # ACKs every 4 packets of a slow paced flow came later than the RTO (spurious timeouts that halved
        # TIMELY's rate again and again), and a sender paced below a packet per RTT read its ACKs only when it
        # woke up to send (stale windows)
        self.ack_every_s = self.rto / 8
        self.error = None
        self.done = False
        self.last_nak = -1
        self.ep.req[req_qpn(self.fid)] = self

    def fileno(self) -> int:
        return self.sock.fileno()

    def begin(self, now: float) -> None:
        self.send_start = now
        self.last_progress = now
        self.next_t = now
        if self.cc_name != "none":
            self.cc = make_sender_cc(self.cc_name, self.cc_opts, now)
            if "eqds" in self.cc_opts and self.cc_name in ("eqds", "nscc+eqds"):
                self.credit_limit = unsolicited_packets(self.cc_opts["eqds"], self.lay.mtu)

    # -- called by Endpoint.drain under the lock
    def on_ack(self, buf, n: int, now: float) -> None:
        syn = buf[12]
        idx = w.unwrap((buf[9] << 16) | (buf[10] << 8) | buf[11], self.una)
        una0, sacked0 = self.una, self.nsacked
        x = w.parse_xack(buf, w.BTH_LEN + w.AETH_LEN, n - w.ICRC_LEN) if n > 20 else None
        flags, rtt, ce, hops = 0, None, False, None
        if x is not None:
            flags, base, bitmap, ts, credit, echoes, recs = x
            if recs:
                hops = w.int_hops(recs)
                self.int_echoes += 1
            if flags & w.XACK_TS:
                rtt = ((int(now * 1e6) - ts) & 0xFFFFFFFF) / 1e6
                if rtt < 10.0:
                    self.rtt.add(rtt)
                    if self.decay_per_rtt:
                        self.policy.decay_s = self.rtt.srtt
                else:
                    rtt = None
            if flags & w.XACK_CREDIT:
                lim = w.unwrap(credit, self.una)
                if self.credit_limit is None or lim > self.credit_limit:
                    self.credit_limit = lim
            pol, s0, n_ent = self.policy, self.sport, self.n_ent
            for e, f in echoes:
                k = e - s0
                if f & w.ECHO_CE:
                    ce = True
                if 0 <= k < n_ent:
                    pol.feedback(k, f & w.ECHO_CE, f & w.ECHO_TRIM, now)
            if flags & w.XACK_SACK and self.selective:
                self._sack(w.unwrap(base, self.una), bitmap)
        if syn & w.NAK_MASK == w.SYN_NAK_SEQ:
            self.naks += 1
            trim = flags & w.XACK_TRIM
            if trim:
                self.trim_naks += 1
            elif self.track_ent and idx < len(self.psn_ent):
                self.policy.nak(self.psn_ent[idx], now)
            if self.cc is not None:
                self.cc.on_loss(now, "trim" if trim else "nak")
            if self.selective:                       # a hole; says nothing about the PSNs before it
                if idx >= self.una:
                    self.retxq.append(idx)
            else:
                if idx > self.una:                   # go-back-N NAK: everything before it arrived
                    self._advance(idx)
                    self.last_progress = now
                if trim or idx != self.last_nak or now - self.last_progress > self.rto / 2:
                    self.last_nak = idx
                    self.nxt = max(idx, self.una)   # go back N
                    self.last_progress = now
        else:
            self.acks += 1
            if idx + 1 > self.una:
                self._advance(idx + 1)
                self.last_progress = now
                if self.nxt < self.una:
                    self.nxt = self.una
        if self.cc is not None:
            acked = (self.una - una0) + (self.nsacked - sacked0)    # newly delivered: cumulative + SACKed
            inflight = (self.hi - self.una - self.nsacked) * self.lay.mtu
            self.cc.on_ack(now, acked_bytes=acked * self.lay.mtu, rtt_s=rtt, ecn=ce, inflight=inflight, hops=hops)
            if self.trace is not None:
                self.trace.sample(now, self.cc.cwnd, self._cc_rate())

    def _advance(self, una: int) -> None:
        """The cumulative ACK moved to ``una``: PSNs SACKed below it leave the SACKed-in-flight count."""
        if self.nsacked:
            k = self.sacked[self.una:una].count(1)
            self.nsacked -= k
        self.una = una

    def _sack(self, base: int, bitmap: int) -> None:
        sk, una, hi = self.sacked, self.una, self.hi
        if bitmap and base + w.SACK_BITS > len(sk):
            sk.extend(bytes(base + w.SACK_BITS - len(sk) + 4096))
        if bitmap:
            self.sacks += 1
        while bitmap:
            low = bitmap & -bitmap
            j = base + low.bit_length() - 1
            bitmap ^= low
            if una <= j < hi and not sk[j]:
                sk[j] = 1
                self.nsacked += 1

    def _cc_rate(self):
        """The CC's sending rate now (bit/s): its own, else its window over the smoothed RTT."""
        c = self.cc
        if c.rate is not None:
            return c.rate
        if c.cwnd != float("inf") and self.rtt.srtt:
            return c.cwnd * 8 / self.rtt.srtt
        return None

    def on_cnp(self, now: float) -> None:
        if self.cc is not None:
            self.cc.on_cnp(now)

    # -- the agent's Sender interface
    def abort(self, reason: str) -> None:
        self.error = self.error or reason
        self._finish(time.time())

    def _finish(self, now: float):
        if not self.done:
            self.done = True
            self.send_end = self.send_end or now
            for sk in self.socks:
                sk.close()
            if self.bs is not None:
                self.bs.close()
            self.ep.release()
        return DONE, None

    def pump(self, now: float):
        ep = self.ep
        ep.drain(64)
        with ep.lock:
            return self._pump(time.time())

    def _pump(self, now: float):
        if self._over(now):
            return self._finish(now)
        self._check_rto(now)
        rate = self._rate(now)
        if rate:
            if self.next_t > now and rate > self.pace_rate:    # faster now: the rest of the wait shrinks
                self.next_t = now + (self.next_t - now) * self.pace_rate / rate
                self.pace_rate = rate
            if self.next_t > now:
                if self.cc is not None:
                    return WAIT_TIME, min(self.next_t, now + self.ack_every_s)
                return WAIT_TIME, self.next_t
            if self.next_t < now - MAX_LAG_S:
                self.next_t = now - MAX_LAG_S
        return self._burst(now, rate)

    def _over(self, now: float) -> bool:
        """Every packet acknowledged (sized flow), or the duration is over."""
        return self.una >= self.npk if self.npk is not None else now >= self.deadline

    def _check_rto(self, now: float) -> None:
        """No progress for an RTO: resend the oldest unacknowledged packet (ooo) or go back to it (gbn). Not while
        retransmissions wait to go out: their timer starts when they leave (:meth:`_commit`, RFC 6298 5.3) — a
        paced flow whose rate a timeout had just cut timed out again and again before its retransmission left,
        and each timeout cut the rate once more (TIMELY fell to its floor)."""
        if (self.hi > self.una and not self.retxq and self.nxt >= self.hi
                and now - self.last_progress > self.rtt.rto(self.rto)):
            self.timeouts += 1
            self.last_progress = now
            if self.track_ent and self.una < len(self.psn_ent):
                self.policy.lost(self.psn_ent[self.una], now)
            if self.cc is not None:
                self.cc.on_loss(now, "timeout")
            if self.selective:                       # every PSN not SACKed, up to one SACK window
                sk = self.sacked
                top = min(self.hi, self.una + w.SACK_BITS)
                self.retxq.extend(j for j in range(self.una, top) if j >= len(sk) or not sk[j])
            else:
                self.nxt = self.una

    def _rate(self, now: float):
        """The sending rate now: the CC's rate (or window over the RTT; its timers advanced to ``now``), or the
        flow's static pacing rate (None = line rate)."""
        cc = self.cc
        if cc is not None:
            cc.advance(now)
            r = self._cc_rate()
            if r is not None:
                return min(r, self.static_rate) if self.static_rate else r
        return self.static_rate

    def _new_psn_limit(self, mtu: int):
        """New PSNs below this may go (None: no limit): the CC's window over the unSACKed PSNs in flight, and the
        EQDS credit limit."""
        limit = None
        if self.cc is not None and self.cc.cwnd != float("inf"):
            limit = self.una + self.nsacked + max(1, int(self.cc.cwnd // mtu))
        if self.credit_limit is not None:
            limit = self.credit_limit if limit is None else min(limit, self.credit_limit)
        return limit

    def _plan(self, now: float, rate):
        """The packets of one burst, in sending order, as both senders build them: retransmissions first (PSNs
        acknowledged or SACKed since they were queued are skipped), then new PSNs below the CC window / EQDS
        credit limit, up to BURST and, when paced, up to the first one not due yet. Each is (PSN index, from the
        retransmission queue, message, index in it, message length, region offset, payload, pad, last of its
        message, BTH PSN word with the ack request, IP bytes). Also returns whether the burst stopped short
        (nothing more may go now) and the ``ackreq_at`` the burst leaves — the caller keeps it only when its
        packets went (a GSO run refused mid-burst keeps the old one, so the retried packets ask again). Ack
        requests: a message's last packet; with the extended transport also the
        last packet the window allows (the receiver ACKs every ACK_EVERY packets, more than a small window
        holds), every 4th, and one per ``ack_every_s`` at least."""
        npk, lay = self.npk, self.lay
        ppm, mtu, lmsg = lay.ppm, lay.mtu, lay.msg
        full_msgs = lay.nmsg - 1 if npk is not None else None
        retxq, una, hi = self.retxq, self.una, self.hi
        nxt, next_t = self.nxt, self.next_t
        sacked = self.sacked if self.nsacked else None
        limit = self._new_psn_limit(mtu)
        ext = self.ext
        # IP 20 + UDP 8 + BTH 12 + ICRC 4 [+ XTH] [+ an INT stack]; + RETH 16 on a message's first packet
        fixed = 44 + (w.XTH_LEN if ext else 0) + len(self.int_stack)
        ack_every = self.ack_every_s
        areq_due = self.ackreq_at + ack_every
        plan: list = []
        stopped = False
        for _ in range(BURST):
            if retxq:
                idx = retxq.popleft()
                if idx < una or idx >= hi or (sacked is not None and idx < len(sacked) and sacked[idx]):
                    continue
                from_q = True
            elif (npk is None or nxt < npk) and (limit is None or nxt < limit):
                idx = nxt
                from_q = False
            else:
                stopped = True
                break
            m, j = divmod(idx, ppm)
            if full_msgs is None:                    # duration flow: the same region, message after message
                ml, base = lmsg, 0
            else:
                ml = lmsg if m < full_msgs else lay.size - full_msgs * lmsg
                base = m * lmsg
            off_in = j * mtu
            ln = ml - off_in
            last = ln <= mtu
            if not last:
                ln = mtu
            pad = -ln & 3
            if last or (ext and (idx & 3 == 3 or (limit is not None and idx + 1 >= limit) or now >= areq_due)):
                psnw = 0x80000000 | (idx & 0xFFFFFF)
                areq_due = now + ack_every
            else:
                psnw = idx & 0xFFFFFF
            ipb = fixed + ln + pad + (16 if j == 0 else 0)
            plan.append((idx, from_q, m, j, ml, base + off_in, ln, pad, last, psnw, ipb))
            if not from_q:
                nxt = idx + 1
            if rate:
                next_t += ipb * 8 / rate
                if next_t > now:
                    stopped = True
                    break
        return plan, stopped, areq_due - ack_every

    def _wait_after(self, now: float, rate, stopped: bool):
        """The pump status after a burst went out: more at once when it was whole, else the pacing time or a
        look at the ACKs."""
        if not stopped:
            return READY, None
        if rate and self.next_t > now:
            return WAIT_TIME, min(self.next_t, now + self.poll_s)
        return WAIT_TIME, now + self.poll_s             # waiting for ACKs (or the RTO)

    def _requeue(self, plan, after: int) -> None:
        """Planned retransmissions that did not go: back into the queue, in their order, behind the ``after``
        ones a failed send put back first (new PSNs need nothing: ``nxt`` moves only for packets that left)."""
        q = self.retxq
        for p in reversed(plan):
            if p[1]:
                q.insert(after, p[0])

    def _burst(self, now: float, rate):
        """One burst (:meth:`_plan`) of a flow with one source port, in GSO runs; returns the pump status."""
        if self.bs is not None:
            return self._burst_batched(now, rate)
        # The hot path (bench/roce_rate.py). Per packet: one struct.pack of BTH[+RETH], two or three crc32 calls
        # continuing from the cached IP/UDP prefix state, ICRC pack. Runs of same-size packets go out as one UDP
        # GSO sendmsg of up to ``batch`` packets (the kernel segments them; IP ids 0, 1, … — wire.data_socket);
        # everything else is per flow.
        plan, stopped, ackreq_at = self._plan(now, rate)
        cc, lay, tmpl, data, daddr = self.cc, self.lay, self.tmpl, self.data, self.daddr
        pre, fix, word1, pkey, sport, sock = tmpl.pre, tmpl.fix, tmpl.word1, tmpl.pkey, self.sport, self.socks[0]
        lmsg = lay.msg
        crc32, pack_bth, pack_bthreth, pack_icrc = fast_crc32, w.BTH.pack, w.BTH_RETH.pack, w.ICRC.pack
        batch = 1 if self.ce_prob else self.batch
        if self.ext:
            ts = int(now * 1e6) & 0xFFFFFFFF
            pack_bth, pack_bthreth = (lambda *a: w.BTH.pack(*a) + w.XTH.pack(ts, 0),
                                      lambda *a: w.BTH_RETH.pack(*a) + w.XTH.pack(ts, 0))
        stack = self.int_stack                        # HPCC: an INT stack before the BTH (not in the ICRC)
        slen = len(stack)
        parts: list = []
        meta: list = []
        g_n, g_ulen = 0, 0
        for i, (idx, from_q, m, j, ml, off, ln, pad, last, psnw, ipb) in enumerate(plan):
            ulen = ipb - 20 - slen                    # UDP header + BTH[+RETH][+XTH] + payload + pad + ICRC
            wlen = ulen + slen                        # … on the wire, with an INT stack
            if g_n and (wlen != g_ulen or g_n == batch):
                st = self._send(sock, parts, meta, g_ulen, daddr, cc, rate, now)
                if st is not None:
                    self._requeue(plan[i:], sum(1 for x in meta if x[1]))
                    return st
                parts, meta, g_n = [], [], 0
            if j == 0:
                hdr = pack_bthreth(w.OP_WRITE_ONLY if last else w.OP_WRITE_FIRST, pad << 4, pkey, word1, psnw,
                                   0x10000000 + m * lmsg, 0x1234, ml)
            else:
                hdr = pack_bth(w.OP_WRITE_LAST if last else w.OP_WRITE_MIDDLE, pad << 4, pkey, word1, psnw)
            key = (sport << 16 | ulen) << 7 | g_n      # IP id = position in the GSO batch
            c = pre.get(key)
            if c is None:
                c = tmpl.prefix(sport, ulen, g_n)
            src = data[off:off + ln]
            c = crc32(src, crc32(hdr, c))
            if slen:
                parts.append(stack)
            if pad:
                pd = PADS[pad]
                parts += (hdr, src, pd, pack_icrc(crc32(pd, c) ^ fix[ulen]))
            else:
                parts += (hdr, src, pack_icrc(c ^ fix[ulen]))
            meta.append((idx, from_q, ln, 0, ipb))
            g_n += 1
            g_ulen = wlen
        self.ackreq_at = ackreq_at
        if g_n:
            st = self._send(sock, parts, meta, g_ulen, daddr, cc, rate, now)
            if st is not None:
                return st
        return self._wait_after(now, rate, stopped)

    def _send(self, sock, parts, meta, ulen, daddr, cc, rate, now):
        """Send one run of ``len(meta)`` packets of UDP length ``ulen`` (one GSO sendmsg when more than one) and
        commit them (PSN state, counters, pacing); on back-pressure put them back and say what to wait for."""
        k = len(meta)
        try:
            if k > 1:
                sock.sendmsg(parts, [(SOL_UDP, UDP_SEGMENT, struct.pack("H", ulen - 8))], 0, daddr)
            elif self.ce_prob and self.rng.random() < self.ce_prob:
                sock.sendmsg(parts, self.ce_cmsg, 0, daddr)
            else:
                sock.sendmsg(parts, (), 0, daddr)
        except OSError as e:
            for idx, from_q, _ln, _k, _w in reversed(meta):
                if from_q:
                    self.retxq.appendleft(idx)
            if isinstance(e, BlockingIOError) or e.errno == errno.ENOBUFS:
                self.sock = sock
                return WAIT_WRITE, None
            if e.errno in SOFT_ERRNOS:                 # a queued ICMP error (IP_RECVERR): not sent, try again
                return READY, None
            self.error = f"send: {e.strerror}"
            return self._finish(now)
        self._commit(meta, cc, rate, now)
        return None

    def _commit(self, meta, cc, rate, now: float) -> None:
        """Account packets that left, ``(idx, from_q, payload, entropy, wire bytes)`` each: PSN state (nxt, hi,
        retransmissions), each PSN's entropy, bytes, DCQCN's byte counter, the pacing schedule. The RTO starts
        now when nothing was outstanding, not at the last ACK (a paced flow idles between packets)."""
        if not meta:
            return
        if self.hi <= self.una:
            self.last_progress = now
        pe = self.psn_ent if self.track_ent else None
        hi, retrans, nbytes, nwire, una = self.hi, 0, 0, 0, self.una
        for idx, from_q, ln, ent, wire in meta:
            if pe is not None:
                if idx >= len(pe):
                    pe.extend([0] * (idx - len(pe) + 4096))
                pe[idx] = ent
            if not from_q:
                self.nxt = idx + 1
            if idx < hi:
                retrans += 1
                if idx == una:                        # the oldest outstanding PSN left again: its timer starts
                    self.last_progress = now
            else:
                hi = idx + 1
            nbytes += ln
            nwire += wire
        self.hi = hi
        self.retrans += retrans
        self.bytes += nbytes
        self.sent += len(meta)
        if cc is not None:
            cc.on_sent(now, nwire)                    # DCQCN's byte counter: = one call per packet
        if rate:
            self.next_t += nwire * 8 / rate
            self.pace_rate = rate

    def _burst_batched(self, now: float, rate):
        """:meth:`_burst` for a flow with several source ports: the burst of :meth:`_plan`, each packet with the
        entropy its policy picks, staged in the BatchSender's arena (whole header per packet, the payload by
        pointer) and sent with one sendmmsg (:meth:`_flush`)."""
        plan, stopped, self.ackreq_at = self._plan(now, rate)
        cc, bs = self.cc, self.bs
        tmpl, pick, sport0, lmsg = bs.tmpl, self.policy.pick, self.sport, self.lay.msg
        pre, fix, word1, pkey, srcb, dstb = tmpl.pre, tmpl.fix, bs.word1, bs.pkey, bs.src, bs.dst
        mv, hdr_off, tail_off, iovq, daddr, cks = bs.mv, bs.hdr_off, bs.tail_off, bs.iovq, bs.data_addr, bs.cks
        crc32, tails, data = fast_crc32, BATCH_TAIL, self.data
        ext = self.ext
        if ext:
            ts = int(now * 1e6) & 0xFFFFFFFF
            pack_h, pack_hr, bth, bthreth, xl = BATCH_HDR_X.pack_into, BATCH_HDR_RETH_X.pack_into, bs.bthx, \
                bs.bthrethx, w.XTH_LEN
        else:
            pack_h, pack_hr, bth, bthreth, xl = BATCH_HDR.pack_into, BATCH_HDR_RETH.pack_into, bs.bth, \
                bs.bthreth, 0
        hl_reth, hl_bth = bs.hl_reth + xl, bs.hl_bth + xl
        tos0, ce_prob, rng = self.tos, self.ce_prob, self.rng
        tos_ce = (tos0 & ~w.ECN_MASK) | w.CE
        meta: list = []
        for i, (idx, from_q, m, j, ml, o, ln, pad, last, psnw, ipb) in enumerate(plan):
            k = pick(now)
            sport = sport0 + k
            tos = tos_ce if ce_prob and rng.random() < ce_prob else tos0
            ulen = ipb - 20                           # UDP 8 + BTH 12 [+ RETH 16] [+ XTH 8] + payload + pad + ICRC 4
            h = hdr_off[i]
            if j == 0:
                op = w.OP_WRITE_ONLY if last else w.OP_WRITE_FIRST
                if ext:
                    pack_hr(mv, h, 0x45, tos, ipb, BATCH_IP_ID, 0x4000, 64, 17, cks[tos << 16 | ipb],
                            srcb, dstb, sport, 4791, ulen, 0, op, pad << 4, pkey, word1, psnw,
                            0x10000000 + m * lmsg, 0x1234, ml, ts, 0)
                else:
                    pack_hr(mv, h, 0x45, tos, ipb, BATCH_IP_ID, 0x4000, 64, 17, cks[tos << 16 | ipb],
                            srcb, dstb, sport, 4791, ulen, 0, op, pad << 4, pkey, word1, psnw,
                            0x10000000 + m * lmsg, 0x1234, ml)
                b = bthreth[i]
                hlen = hl_reth
            else:
                op = w.OP_WRITE_LAST if last else w.OP_WRITE_MIDDLE
                if ext:
                    pack_h(mv, h, 0x45, tos, ipb, BATCH_IP_ID, 0x4000, 64, 17, cks[tos << 16 | ipb],
                           srcb, dstb, sport, 4791, ulen, 0, op, pad << 4, pkey, word1, psnw, ts, 0)
                else:
                    pack_h(mv, h, 0x45, tos, ipb, BATCH_IP_ID, 0x4000, 64, 17, cks[tos << 16 | ipb],
                           srcb, dstb, sport, 4791, ulen, 0, op, pad << 4, pkey, word1, psnw)
                b = bth[i]
                hlen = hl_bth
            key = (sport << 16 | ulen) << 7 | BATCH_IP_ID
            c = pre.get(key)
            if c is None:
                c = tmpl.prefix(sport, ulen, BATCH_IP_ID)
            c = crc32(data[o:o + ln], crc32(b, c))
            if pad:
                c = crc32(PADS[pad], c)
            tails[pad].pack_into(mv, tail_off[i], c ^ fix[ulen])
            q = 6 * i
            iovq[q + 1] = hlen
            iovq[q + 2] = daddr + o
            iovq[q + 3] = ln
            iovq[q + 5] = pad + 4
            meta.append((idx, from_q, ln, k, ipb))
        if meta:
            bs.n = len(meta)
            st = self._flush(meta, cc, rate, now)
            if st is not None:
                return st
        return self._wait_after(now, rate, stopped)

    def _flush(self, meta, cc, rate, now):
        """Send the staged burst (one sendmmsg) and commit what went, as :meth:`_send` does; what did not go —
        a partial send, or all on back-pressure — goes back: retransmissions to the queue, new packets by
        ``nxt`` staying at the first unsent one."""
        try:
            sent = self.bs.flush()
        except OSError as e:
            sent, err = 0, e
        else:
            err = None
        self._commit(meta[:sent], cc, rate, now)
        if sent == len(meta):
            return None
        for idx, from_q, _ln, _k, _w in reversed(meta[sent:]):
            if from_q:
                self.retxq.appendleft(idx)
        if err is None:                                # partial: the next call meets the reason (or sends)
            return READY, None
        if isinstance(err, BlockingIOError) or err.errno == errno.ENOBUFS:
            return WAIT_WRITE, None
        if err.errno in SOFT_ERRNOS:
            return READY, None
        self.error = f"send: {err.strerror}"
        return self._finish(now)

    def stats(self) -> dict:
        cs = self.cc.stats() if self.cc is not None else {}
        d = dict(packets_sent=self.sent, bytes_sent=self.bytes, send_start=self.send_start,
                 send_end=self.send_end, retrans=self.retrans, timeouts=self.timeouts, naks_received=self.naks,
                 acks_received=self.acks, cnps_received=cs.get("dcqcn_cnps", 0),
                 final_rate_bps=cs.get("dcqcn_rate_final"), alpha=cs.get("dcqcn_alpha"), error=self.error,
                 sacks=self.sacks, trim_naks=self.trim_naks, int_echoes=self.int_echoes if self.int_stack else None,
                 **self.policy.stats(), **self.rtt.stats())
        if self.trace is not None:
            d.update(self.trace.stats())
        if self.cc is not None:
            d["cc_state"] = cs
        return d


class RoceEngine:
    name = "roce"
    proto = "rocev2"
    dport = w.ROCE_PORT

    @staticmethod
    def framing(packet_size: int, opts: dict | None) -> tuple[int, int]:
        """(payload bytes per full packet: the IB path MTU, IP-level bytes per packet that are not payload:
        IPv4 + UDP + BTH + ICRC, + the XTH when the packets carry one; a message's RETH, once, is left out)."""
        o = opts or {}
        return int(o["mtu"]), w.IP_LEN + w.UDP_LEN + w.BTH_LEN + w.ICRC_LEN + (w.XTH_LEN if o.get("ext") else 0)

    @staticmethod
    def sender(flow: dict, job: dict):
        return Requester(flow, job)

    @staticmethod
    def receivers(flows: list[dict], job: dict):
        ep = endpoint()
        ep.rx_open = True
        states = []
        for f in flows:
            r = Responder(f, ep, job.get("drain_s", 0.3))
            ep.rsp[rsp_qpn(f["flow_id"])] = r
            states.append(r)
        return [ep], states
