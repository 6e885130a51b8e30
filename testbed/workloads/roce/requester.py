"""The requester side of an RC queue pair: WRITE messages cut into packets, the burst plan (retransmissions
first, new PSNs within the window, credit or rate), the one CC slot, RTT samples and the CC trace (rc.py)."""
from __future__ import annotations

import array
import collections
import errno
import random
import socket
import struct
import time

from isal.isal_zlib import crc32 as fast_crc32     # = zlib.crc32, about twice as fast on 1 KB (tests/transport/test_roce_batch.py)

from . import entropy, wire as w
from .batch import HDR as BATCH_HDR, HDR_RETH as BATCH_HDR_RETH, IP_ID as BATCH_IP_ID, TAIL as BATCH_TAIL
from .batch import HDR_RETH_X as BATCH_HDR_RETH_X, HDR_X as BATCH_HDR_X
from .batch import BatchSender
from .link import resolve
from .cc import make_sender_cc
from ..engine_api import DONE, READY, WAIT_TIME, WAIT_WRITE, Steerable
from .endpoint import (BURST, IP_TOS, Layout, MAX_LAG_S, PADS, POLL_S, POLL_SHARE, SOFT_ERRNOS, SOL_UDP, UDP_SEGMENT,
                       endpoint, flow_data, req_qpn, rsp_qpn, unsolicited_packets)


class RttStats:
    """RTT samples and the RFC 6298 retransmit timeout: SRTT/RTTVAR (gains 1/8, 1/4), RTO = SRTT + max(G, 4·RTTVAR)
    above a floor, doubled per timeout and reset by a new ACK; also the minimum and the median of a bounded
    sample (flows.csv rtt_*)."""
    KEEP = 4096

    INITIAL = 4          # RTO multiple before the first sample (RFC 6298 starts at 1 s): a first window that
                         # queues behind an incast's other first windows is not lost
    MAX_S = 60.0         # the backed-off RTO's ceiling (RFC 6298 2.5: at least 60 s)

    def __init__(self, expect: bool = False, granularity: float = 0.0):
        self.expect = expect                        # samples will come (the flow carries XTH timestamps)
        self.granularity = granularity              # G: how often the sender looks at its timer
        self.min = self.srtt = None
        self.var = 0.0
        self.n = 0
        self.backoff = 1                            # 2 ** timeouts since the last new ACK
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
        """The retransmit timeout: SRTT + max(G, 4·RTTVAR), at least ``floor`` (the configured RTO, or what the
        fabric's queues can hold), times the back-off — a deep queue on one path must not fire it spuriously."""
        if self.srtt is None:
            base = floor * (self.INITIAL if self.expect else 1)
        else:
            base = max(floor, self.srtt + max(self.granularity, 4 * self.var))
        return min(base * self.backoff, max(self.MAX_S, base)) if self.backoff > 1 else base

    def timed_out(self) -> None:
        """RFC 6298 5.5: back the timer off (doubled, up to MAX_S)."""
        if self.backoff < 1 << 16:
            self.backoff *= 2

    def new_ack(self) -> None:
        """An ACK for new data: the back-off ends."""
        self.backoff = 1

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


class Requester(Steerable):
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
        self.credit_limit = None                        # EQDS: new PSNs below it may go (None: no credit gate)
        self.sport = min(flow["sport"], 65535 - self.n_ent + 1)
        self.batch = max(1, min(int(o.get("batch") or 1), 32))
        self.tos = (dscp << 2) | w.ECT0
        self.sndbuf_each = job.get("sndbuf_each")
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
            self.socks = [self._data_socket(self.sport)]
            self.sock = self.socks[0]                # the one to poll for writability
        self.ce_cmsg = [(socket.IPPROTO_IP, IP_TOS, struct.pack(
            "i", (dscp << 2) | w.CE | (w.INT_DSCP_BIT if self.int_stack else 0)))]
        self.rto = float(o.get("rto_s", 0.01))
        line = o.get("line_bps")
        self.poll_s = max(POLL_S, POLL_SHARE * (self.lay.mtu + w.HDR_MAX) * 8 / line) if line else POLL_S
        # the RTO is estimated (RFC 6298, self.rto its floor) with rto: auto and on the extended transport; a
        # go-back-N flow with a fixed rto keeps it fixed (a NIC's timeout). Without XTH timestamps the samples
        # are this side's own send times (sent_at) of the newest PSN an ACK covers, none sent since a
        # retransmission left (retx_at: Karn — an ACK after a go-back-N resend may answer either copy).
        self.adaptive = self.ext or bool(o.get("rto_auto"))
        self.rtt = RttStats(expect=self.adaptive, granularity=self.poll_s)
        self.sent_at = array.array("d")                 # non-XTH flows: each PSN's first send time
        self.retx_at = 0.0                              # when a retransmission last left
        self.ce_prob = float(o.get("ce_prob") or 0.0)
        self.rng = random.Random(0xCE + self.fid)
        self.job = job
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
        self.ack_every_s = float(o.get("ack_every_s") or self.rto / 8)
        self.error = None
        self.done = False
        self.last_nak = -1
        self.ep.req[req_qpn(self.fid)] = self

    @property
    def deadline(self) -> float:
        """t0 + duration: t0 comes with the agent's start line, after the sender is made (agent.py)."""
        return self.job["t0"] + self.job["duration_s"]

    def _data_socket(self, sport: int):
        return w.data_socket(self.flow["src_addr"], sport, tos=self.tos | (w.INT_DSCP_BIT if self.int_stack else 0),
                             sndbuf=self.sndbuf_each, gso=self.batch > 1, prio=self.flow.get("prio"))

    def fileno(self) -> int:
        return self.sock.fileno()

    def steer(self, sport: int, count: bool = True) -> None:
        """The QP's UDP source port becomes ``sport`` from the next burst on, as a RoCEv2 NIC may change it
        mid-flow. ACKs come to the endpoint's port and the responder knows the QP by its number: only the path
        changes — packets in flight on the old one may arrive after the first of the new (with ``receiver:
        ooo`` nothing is lost to that). A QP spraying over several ports (batched) keeps them."""
        if self.bs is None:
            super().steer(sport, count)

    def _rebind(self, sport: int) -> None:
        new = self._data_socket(sport)
        old, self.socks[0] = self.socks[0], new
        self.sock = new
        old.close()
        self.sport = sport

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
                if not self.ext and idx < len(self.sent_at) and self.sent_at[idx] > self.retx_at:
                    self.rtt.add(now - self.sent_at[idx])  # the ACK this PSN's arrival triggered
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
        """The cumulative ACK moved to ``una``: PSNs SACKed below it leave the SACKed-in-flight count; the RTO's
        back-off ends."""
        self.rtt.new_ack()
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
        if self.next_sport is not None:
            self._move()
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

    def rto_now(self) -> float:
        """The retransmit timeout in force: estimated above ``rto`` (adaptive), else ``rto`` itself."""
        return self.rtt.rto(self.rto) if self.adaptive else self.rto

    def _check_rto(self, now: float) -> None:
        """No progress for an RTO: resend the oldest unacknowledged packet (ooo) or go back to it (gbn). Not while
        retransmissions wait to go out: their timer starts when they leave (:meth:`_commit`, RFC 6298 5.3) — a
        paced flow whose rate a timeout had just cut timed out again and again before its retransmission left,
        and each timeout cut the rate once more (TIMELY fell to its floor)."""
        if (self.hi > self.una and not self.retxq and self.nxt >= self.hi
                and now - self.last_progress > self.rto_now()):
            self.timeouts += 1
            self.last_progress = now
            if self.adaptive:
                self.rtt.timed_out()
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
        st = None if self.ext else self.sent_at
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
                if st is not None:
                    if idx >= len(st):
                        st.frombytes(bytes(8 * (idx - len(st) + 4096)))
                    st[idx] = now
            nbytes += ln
            nwire += wire
        self.hi = hi
        if retrans:
            self.retx_at = now
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
