"""The built-in RoCEv2 engine (``traffic.engine: roce``): RC queue pairs doing RDMA WRITEs over UDP 4791.

One flow = one RC QP (requester on the flow's source host, responder on its destination). Responder QPN =
0x100 + 2·flow_id, requester QPN = responder + 1. A sized flow is a sequence of RDMA WRITE messages of
``msg_bytes`` (the last one shorter) into a memory region of ``size_bytes``; a duration flow repeats messages of
``msg_bytes`` until the end of the run. Packets carry ``mtu`` payload bytes (the IB path MTU); WRITE FIRST/ONLY
carry a RETH, the last packet of a message asks for an ACK.

Per host (agent process) one ``Endpoint``: a UDP socket bound to :4791 (receives data, ACK/NAK, CNP; IP_RECVTOS
gives the ECN bits) and a raw socket for ACK/NAK/CNP. Each requester sends its data packets on its own UDP
socket(s), one per entropy value (``wire.data_socket``: the kernel writes IPv4/UDP headers whose ICRC-covered
fields are fixed — IP id 0 with DF — so the ICRC is still exact; IP_RECVERR makes a full shaped host link
back-pressure it with ENOBUFS/EAGAIN like a NIC queue instead of dropping silently).

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
QP per CNP interval; the requester's ReactionPoint sets its pacing rate (see ``dcqcn.py``). ``cc: none``: the
requester sends as fast as the host link takes it (or at the flow's rate).

Test-only knobs (``traffic.roce``): ``drop_prob`` makes the responder discard that fraction of data packets as if
the network lost them (seeded); ``ce_prob`` makes the requester send that fraction of packets already CE-marked.
"""
from __future__ import annotations

import collections
import errno
import hashlib
import random
import socket
import struct
import threading
import zlib
import time

from . import wire as w
from .dcqcn import DcqcnParams, NotificationPoint, ReactionPoint
from ..engine_api import DONE, READY, WAIT_TIME, WAIT_WRITE

ACK_EVERY = 8
BURST = 32
POLL_S = 0.0005
MAX_LAG_S = 0.002
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
IP_TOS = socket.IP_TOS
PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
RCVBUF = 8 << 20
SO_RCVBUFFORCE = 33
SOL_UDP, UDP_SEGMENT = 17, 103
SOFT_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)


GOT, NAKED, NAKED_GOT = 1, 2, 3      # ooo receiver's per-PSN bits: received, NAKed (0: missing)


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
        s.bind(("0.0.0.0", w.ROCE_PORT))
        s.setblocking(False)
        self.ctl = _raw_socket()
        self.lock = threading.RLock()
        self.req: dict[int, "Requester"] = {}
        self.rsp: dict[int, "Responder"] = {}
        self.buf = bytearray(10000)
        self.bufs = [self.buf]
        self.anc = socket.CMSG_SPACE(4)
        self.unknown = 0
        self.rx_open = False
        self.users = 0

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
                    n, ad, _fl, _addr = recv(bufs, anc)
                except BlockingIOError:
                    return
                except OSError:
                    continue
                if n < w.BTH_LEN + w.ICRC_LEN:
                    self.unknown += 1
                    continue
                tos = ad[0][2][0] if ad else 0
                op = buf[0]
                qpn = (buf[5] << 16) | (buf[6] << 8) | buf[7]
                now = clock()
                if op == w.OP_ACK:
                    q = req.get(qpn)
                    if q is None:
                        self.unknown += 1
                    else:
                        q.on_ack(buf, now)
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
                        r.on_data(buf, n, op, tos, now)

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
        self.deadline = None
        self.drain_s = drain_s
        self.drop_prob = float(o.get("drop_prob") or 0.0)
        self.rng = random.Random(0xD20 + self.flow_id)
        cc = o.get("cc", "none")
        self.np = NotificationPoint(float(o["cnp_interval_s"])) if cc == "dcqcn" else None
        self.ce = 0
        self.ctl = w.Template(flow["dst_addr"], flow["src_addr"], req_qpn(self.flow_id),
                              tos=flow.get("dscp", w.DSCP_ROCE) << 2)
        self.dst = flow["src_addr"]
        self.sport = flow["sport"]

    # -- control packets
    def _ack(self, nak_psn: int | None = None) -> None:
        if nak_psn is not None:
            self.naks += 1
            pkt = w.ack_packet(self.ctl, nak_psn, self.sport, self.epsn // self.lay.ppm, nak=True)
        else:
            self.acks += 1
            pkt = w.ack_packet(self.ctl, self.epsn - 1, self.sport, self.epsn // self.lay.ppm)
        self.since_ack = 0
        if not self.ep.send_ctl(pkt, self.dst):
            self.ctl_lost += 1

    def on_data(self, buf, n: int, op: int, tos: int, now: float) -> None:
        if self.drop_prob and self.rng.random() < self.drop_prob:
            self.dropped += 1
            return
        if (tos & w.ECN_MASK) == w.CE:
            self.ce += 1
            if self.np is not None and self.np.on_ce(now) and not self.ep.send_ctl(
                    w.cnp_packet(self.ctl, self.sport), self.dst):
                self.ctl_lost += 1
        pad = (buf[1] >> 4) & 3
        ackreq = buf[8] & 0x80
        idx = w.unwrap((buf[9] << 16) | (buf[10] << 8) | buf[11], self.epsn)
        hl = w.BTH_LEN + (w.RETH_LEN if op in w.RETH_OPS else 0)
        plen = n - hl - pad - w.ICRC_LEN
        if self.first_rx is None:
            self.first_rx = now
        npk = self.lay.npk
        if npk is not None and not 0 <= idx < npk + 0:
            if idx < 0 or idx >= npk:
                self.dup += 1
                return
        if self.ooo_mode:
            self._ooo(buf, idx, hl, plen, ackreq, now)
        else:
            self._gbn(buf, idx, hl, plen, ackreq, now)

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
            self._ack()

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
        if advanced:
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
        return self.deadline is not None and now > self.deadline and (
            self.lay.npk is None or now - max(self.deadline, self.last_rx or 0.0) > self.drain_s)

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
                    ctl_lost=self.ctl_lost)


# ---------------------------------------------------------------- requester (sender of a flow)

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
        n_ent = int(o.get("entropy_values") or 1) if o.get("entropy") == "packet" else 1
        self.n_ent = max(1, n_ent)
        self.sport = min(flow["sport"], 65535 - self.n_ent + 1)
        # one UDP socket per entropy value (the source port is the socket's); see wire.data_socket
        self.batch = max(1, min(int(o.get("batch") or 1), 32))
        self.socks = [w.data_socket(flow["src_addr"], self.sport + k, tos=(dscp << 2) | w.ECT0,
                                    sndbuf=job.get("sndbuf_each"), gso=self.batch > 1 and self.n_ent == 1,
                                    prio=flow.get("prio"))
                      for k in range(self.n_ent)]
        self.sock = self.socks[0]                    # the one to poll for writability (the last that blocked)
        self.ce_cmsg = [(socket.IPPROTO_IP, IP_TOS, struct.pack("i", (dscp << 2) | w.CE))]
        self.rto = float(o.get("rto_s", 0.01))
        self.ce_prob = float(o.get("ce_prob") or 0.0)
        self.rng = random.Random(0xCE + self.fid)
        size = flow["size_bytes"]
        self.data = memoryview(flow_data(flow, size if size is not None else self.lay.msg))
        self.deadline = job["t0"] + job["duration_s"]
        self.static_rate = flow.get("rate_bps")
        self.cc = o.get("cc", "none")
        self.params = DcqcnParams(**o["dcqcn"]) if self.cc == "dcqcn" else None
        self.rp = None
        self.una = self.nxt = self.hi = 0
        self.retxq: collections.deque = collections.deque()
        self.sent = self.retrans = self.timeouts = self.naks = self.acks = 0
        self.bytes = 0
        self.send_start = self.send_end = None
        self.last_progress = 0.0
        self.next_t = 0.0
        self.error = None
        self.done = False
        self.last_nak = -1
        self.ep.req[req_qpn(self.fid)] = self
        self.rate_samples: list = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def begin(self, now: float) -> None:
        self.send_start = now
        self.last_progress = now
        self.next_t = now
        if self.params is not None:
            self.rp = ReactionPoint(self.params, now)

    # -- called by Endpoint.drain under the lock
    def on_ack(self, buf, now: float) -> None:
        syn = buf[12]
        idx = w.unwrap((buf[9] << 16) | (buf[10] << 8) | buf[11], self.una)
        if syn & w.NAK_MASK == w.SYN_NAK_SEQ:
            self.naks += 1
            if self.selective:                       # a hole; says nothing about the PSNs before it
                if idx >= self.una:
                    self.retxq.append(idx)
                return
            if idx > self.una:                       # go-back-N NAK: everything before it arrived
                self.una = idx
                self.last_progress = now
            if idx != self.last_nak or now - self.last_progress > self.rto / 2:
                self.last_nak = idx
                self.nxt = max(idx, self.una)       # go back N
                self.last_progress = now
        else:
            self.acks += 1
            if idx + 1 > self.una:
                self.una = idx + 1
                self.last_progress = now
                if self.nxt < self.una:
                    self.nxt = self.una

    def on_cnp(self, now: float) -> None:
        if self.rp is not None:
            self.rp.on_cnp(now)

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
            if self.next_t > now:
                return WAIT_TIME, self.next_t
            if self.next_t < now - MAX_LAG_S:
                self.next_t = now - MAX_LAG_S
        return self._burst(now, rate)

    def _over(self, now: float) -> bool:
        """Every packet acknowledged (sized flow), or the duration is over."""
        return self.una >= self.npk if self.npk is not None else now >= self.deadline

    def _check_rto(self, now: float) -> None:
        """No progress for an RTO: resend the oldest unacknowledged packet (ooo) or go back to it (gbn)."""
        if self.hi > self.una and now - self.last_progress > self.rto:
            self.timeouts += 1
            self.last_progress = now
            if self.selective:
                self.retxq.append(self.una)
            else:
                self.nxt = self.una

    def _rate(self, now: float):
        """The sending rate now: DCQCN's reaction point, or the flow's static pacing rate (None = line rate)."""
        if self.rp is not None:
            self.rp.advance(now)
            return self.rp.rate
        return self.static_rate

    def _burst(self, now: float, rate):
        """Up to BURST packets: retransmissions first, then new ones, in GSO runs; returns the pump status."""
        rp, npk = self.rp, self.npk
        # The hot path (bench/roce_rate.py). Per packet: one struct.pack of BTH[+RETH], two or three crc32 calls
        # continuing from the cached IP/UDP prefix state, ICRC pack. Runs of same-size packets to one socket go
        # out as one UDP GSO sendmsg of up to ``batch`` packets (the kernel segments them; IP ids 0, 1, … —
        # wire.data_socket); everything else is per flow.
        lay, tmpl, data, daddr = self.lay, self.tmpl, self.data, self.daddr
        pre, fix, word1, pkey = tmpl.pre, tmpl.fix, tmpl.word1, tmpl.pkey
        socks, n_ent, sport0, ppm, mtu, lmsg = self.socks, self.n_ent, self.sport, lay.ppm, lay.mtu, lay.msg
        full_msgs = lay.nmsg - 1 if npk is not None else None
        crc32, pack_bth, pack_bthreth, pack_icrc = zlib.crc32, w.BTH.pack, w.BTH_RETH.pack, w.ICRC.pack
        ce_prob = self.ce_prob
        batch = self.batch if (n_ent == 1 and not ce_prob) else 1
        retxq, una, hi = self.retxq, self.una, self.hi
        nxt, next_t = self.nxt, self.next_t
        parts: list = []
        meta: list = []
        g_n, g_ulen, g_sock = 0, 0, None
        broke = False
        for _ in range(BURST):
            if retxq:
                idx = retxq.popleft()
                if idx < una or idx >= hi:
                    continue
                from_q = True
            elif npk is None or nxt < npk:
                idx = nxt
                from_q = False
            else:
                broke = True
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
            hl = 28 if j == 0 else 12
            ulen = 12 + hl + ln + pad                 # UDP header + BTH[+RETH] + payload + pad + ICRC (8+4)
            sport = sport0 + idx % n_ent if n_ent > 1 else sport0
            sock = socks[idx % n_ent] if n_ent > 1 else socks[0]
            if g_n and (ulen != g_ulen or sock is not g_sock or g_n == batch):
                st = self._send(g_sock, parts, meta, g_ulen, daddr, rp, rate, now)
                if st is not None:
                    return st
                parts, meta, g_n = [], [], 0
            psnw = (0x80000000 if last else 0) | (idx & 0xFFFFFF)
            if j == 0:
                hdr = pack_bthreth(w.OP_WRITE_ONLY if last else w.OP_WRITE_FIRST, pad << 4, pkey, word1, psnw,
                                   0x10000000 + m * lmsg, 0x1234, ml)
            else:
                hdr = pack_bth(w.OP_WRITE_LAST if last else w.OP_WRITE_MIDDLE, pad << 4, pkey, word1, psnw)
            key = (sport << 16 | ulen) << 7 | g_n      # IP id = position in the GSO batch
            c = pre.get(key)
            if c is None:
                c = tmpl.prefix(sport, ulen, g_n)
            src = data[base + off_in:base + off_in + ln]
            c = crc32(src, crc32(hdr, c))
            if pad:
                pd = PADS[pad]
                parts += (hdr, src, pd, pack_icrc(crc32(pd, c) ^ fix[ulen]))
            else:
                parts += (hdr, src, pack_icrc(c ^ fix[ulen]))
            meta.append((idx, from_q, ln))
            g_n += 1
            g_ulen, g_sock = ulen, sock
            if not from_q:
                nxt = idx + 1
            if rate:
                next_t += (20 + ulen) * 8 / rate
                if next_t > now:
                    broke = True
                    break
        if g_n:
            st = self._send(g_sock, parts, meta, g_ulen, daddr, rp, rate, now)
            if st is not None:
                return st
        if not broke:                                 # a whole burst went out: more may be ready
            return READY, None
        if rate and self.next_t > now:
            return WAIT_TIME, min(self.next_t, now + POLL_S)
        return WAIT_TIME, now + POLL_S             # waiting for ACKs (or the RTO)

    def _send(self, sock, parts, meta, ulen, daddr, rp, rate, now):
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
            for idx, from_q, _ln in reversed(meta):
                if from_q:
                    self.retxq.appendleft(idx)
            if isinstance(e, BlockingIOError) or e.errno == errno.ENOBUFS:
                self.sock = sock
                return WAIT_WRITE, None
            if e.errno in SOFT_ERRNOS:                 # a queued ICMP error (IP_RECVERR): not sent, try again
                return READY, None
            self.error = f"send: {e.strerror}"
            return self._finish(now)
        wire = 20 + ulen
        for idx, from_q, ln in meta:
            if not from_q:
                self.nxt = idx + 1
            if idx < self.hi:
                self.retrans += 1
            else:
                self.hi = idx + 1
            self.bytes += ln
            if rp is not None:
                rp.on_bytes(wire, now)
            if rate:
                self.next_t += wire * 8 / rate
        self.sent += k
        return None

    def stats(self) -> dict:
        rp = self.rp
        return dict(packets_sent=self.sent, bytes_sent=self.bytes, send_start=self.send_start,
                    send_end=self.send_end, retrans=self.retrans, timeouts=self.timeouts, naks_received=self.naks,
                    acks_received=self.acks, cnps_received=rp.cnps if rp else 0,
                    final_rate_bps=rp.rate if rp else None, alpha=rp.alpha if rp else None, error=self.error)


class RoceEngine:
    name = "roce"
    proto = "rocev2"
    dport = w.ROCE_PORT

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
