"""The responder side of an RC queue pair: PSN checks (go-back-N or reordering-tolerant), cumulative ACKs,
NAKs, CNPs for CE-marked arrivals, and the data placed into the memory region (rc.py)."""
from __future__ import annotations

import collections
import hashlib
import random


from . import wire as w
from .cc import NotificationPoint
from .endpoint import (ACK_EVERY, Endpoint, GOT, Layout, NAKED, NAKED_GOT, SACK_BITS, flow_data, req_qpn,
                       unsolicited_packets)


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
        self.spurious_retx = 0            # copies of PSNs already accepted: a retransmission whose first copy arrived
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
        self.prio = flow.get("prio")      # the host NIC class of the flow, for its control packets too

    # -- control packets
    def _xack(self, trim: bool) -> bytes:
        """The XACK of the next ACK/NAK: SACK bitmap over the 64 PSNs after the cumulative one, the echoed
        transmit time, the credit limit, the echoes gathered since the last ACK (then cleared), and the INT hop
        records of the last data packet that carried a stack (once)."""
        flags = w.XACK_TRIM if trim else 0
        bitmap = 0
        base = self.epsn + 1
        if self.ooo_mode and self.highest >= base:
            bits = self.have[base:base + w.SACK_BITS].translate(SACK_BITS)
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
        if not self.ep.send_ctl(pkt, self.dst, self.prio):
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
                    w.cnp_packet(self.ctl, self.sport), self.dst, self.prio):
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
            else:                                # a trimmed copy of a PSN accepted before: sent in vain
                self.spurious_retx += 1
            return
        if idx < self.epsn:
            self.spurious_retx += 1
        else:
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
            self.spurious_retx += 1
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
            self.spurious_retx += 1
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

    def skip(self, now: float) -> None:
        """The flow will not run (a collective policy skipped it): complete now, announced at the receive thread's
        next check together with the operation's other skipped flows (one datagram per gate, not one each). No
        packet of it comes, so only the credit pacer (EQDS) needs the endpoint's lock."""
        if self.complete_at is not None:
            return
        self.complete_at = now
        if self.unsolicited is not None:
            with self.ep.lock:
                self.ep.pacer.stop(self)              # no credits for a flow that will not come

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
                    ctl_lost=self.ctl_lost, trims_seen=self.trims, int_stacks=self.int_stacks,
                    spurious_retransmits=self.spurious_retx)
