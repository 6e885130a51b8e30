"""Credit-based link-level flow control (InfiniBand style, per virtual lane), run inside the flow-control agent.

In InfiniBand a receiver advertises, per lane, how much of its buffer is free; the sender transmits only what it
holds credit for, and credits come back as the receiver's queues drain. Nothing is dropped for lack of buffer,
and — unlike PFC, which must stop a sender that is already sending — no headroom for the bytes in flight.

The emulation meters each sender with its own serialiser. The sending port's TBF leaf under the lane's HTB class
(PortConfig) runs at a near-zero token rate, so its *bucket is the credit*: it sends what its bucket holds, at
the pace of the HTB class above it, then waits. Every ``update_interval`` the agent reads, per link and lane, the
receiver's free buffer for that ingress — the credit buffer minus the bytes of that ingress still queued in the
receiving switch (the switch program's per-ingress accounting, lib/ingress_acct.h) — less a margin, in ``block``s,
and turns it into an absolute limit as InfiniBand does: FCCL = the bytes the ingress ever received + that credit,
the stream position the sender may send up to. The sender's side of the stream is FCTBS, the bytes its TBF leaf
has sent (less the agent's kick frames), so bytes still on their way count as sent.

A TBF change refills the bucket rather than adding to it, so a grant is applied in two steps: *close* the old
grant (bucket one frame), read FCTBS, then open FCCL − FCTBS. Whatever the old bucket let out while
the agent was late is in FCTBS by then, so the limit holds however long the agent is delayed (one change that
replaced the bucket directly let the bytes sent during a late netlink call come on top of the new bucket: 24
packets overflowed a 32 KB ingress once in a million under CPU load). The margin (two frames)
covers the frame the close lets the port keep, the kick frames and the near-zero token refill; the switch program drops
whatever would overflow the ingress's buffer, so a violation shows as a drop.

A switch sender's queue model learns its grant (CTL_VQ_CREDIT: the stream position it may send to and what it
has really sent), so upstream accounting and ECN see a credit-starved queue hold its bytes. A link whose
receiver can grant less than a frame is *stalled*; stalls, stalled time and credit granted are counted per
receiving port (links.csv rx rows; the sender's tx row carries the wait).

A link cut between two machines (testbed/cluster) has its receiver and its sender in two agents. The receiver's
agent then sends the grant over the link itself, as InfiniBand's flow-control packets travel: a MAC control frame
(``credit_frame``) with an absolute limit, FCCL = bytes received so far + credit — the stream position the sender
may send up to. The switch program posts the frame to the sender's agent (EVT_CREDIT_RX), which sets the meter
to FCCL − the bytes its port has sent (FCTBS: its TBF leaf's dequeued bytes, less the kick frames the agent sent
through it). Bytes still on the wire between the machines count as sent, so the limit holds exactly as on a
local link; a lost frame only delays credit (every later grant is absolute, and an unchanged one is repeated
every REFRESH intervals).
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

from ..errors import TestbedError
from ..datapath.queue_model import CTL_INGRESS_RECOUNT, CTL_VQ_CREDIT, control
from ..fabric.netlink import TbfBucket
from ..fabric.port import ETH_HLEN, N_PRIO
from ..topology import TIERS
from .mac_control import CREDIT_OPCODE, ETH_P_MACCTL, KICK_LEN, PFC_DST

TICK_LIMIT_S = 200.0            # a bucket of B bytes at the meter's rate is B/rate seconds: keep it in a u32 of ticks
MIN_METER_BPS = 8000            # the meter's token rate: refills ≤ 1 byte per ms
REFRESH = 16                    # a remote link's unchanged grant is sent again after this many intervals


def meter_rate(buffer: int) -> int:
    """The near-zero token rate of a credit meter whose bucket may hold ``buffer`` bytes (tc keeps the bucket as
    transmission time in a u32 of psched ticks: ≤ ~274 s)."""
    return max(MIN_METER_BPS, -(-buffer * 8 // int(TICK_LIMIT_S)))


def margin_bytes(mtu: int) -> int:
    """Credit kept back per link: two frames — the one a grant's close lets the sender keep (``_apply``), and one
    for the kick frames and the meter's near-zero token refill. The agent's delay needs none: a grant is exact
    however late it is applied."""
    return 2 * (mtu + ETH_HLEN)


class CreditConfigError(TestbedError, ValueError):
    """A credit buffer that could never grant a frame: refused before anything is built."""


def check_buffers(ports: dict, switch_spec) -> list[str]:
    """Refuse (CreditConfigError) a tier whose credit buffer cannot hold the margin plus two frames (a grant raises
    a sender's limit by two frames at least) — its senders would stall for ever; return a warning per tier whose buffer caps the rate below the
    line rate (a sender can use at most buffer − margin per update interval)."""
    warnings = []
    metered = {c.port.tier for c in ports.values() if c.flow_control == "credit" and c.is_switch_port}
    for tier in [t for t in TIERS if t in metered]:                  # in topology order: leaf first
        tier_ports = [c for c in ports.values() if c.port.tier == tier and c.is_switch_port]
        worst = min(tier_ports, key=lambda c: c.ingress_buffer)
        rate = max(ports[c.port.peer_ifindex].rate_bps for c in tier_ports)
        frame = worst.mtu + ETH_HLEN
        margin = margin_bytes(worst.mtu)
        where = f"switch.tiers.{tier}.credit.buffer" if tier in switch_spec.tiers else "switch.credit.buffer"
        if worst.ingress_buffer < margin + 2 * frame:
            raise CreditConfigError(
                f"@{where}: {worst.ingress_buffer} bytes of credit buffer ({tier} switches, {worst.node}/"
                f"{worst.ifname}) cannot hold the emulation's margin ({margin} bytes: 2 frames) and the two frames a "
                f"grant opens at least; set at least {margin + 2 * frame} bytes")
        interval = switch_spec.qos(tier).credit.update_interval
        cap = (worst.ingress_buffer - margin) * 8e9 / interval
        if cap < rate:
            warnings.append(f"{where} ({tier}): {worst.ingress_buffer} bytes less the {margin}-byte margin per "
                            f"{interval / 1e6:g} ms update caps a sender at {cap / 1e6:.1f} Mbit/s, below its "
                            f"{rate / 1e6:g} Mbit/s link")
    return warnings


def credit_frame(src_mac: bytes, prio: int, limit: int, stalled: bool = False, stall_us: int = 0) -> bytes:
    """A grant over a link between two machines: opcode, flags (1: the link is stalled now) and priority, the
    µs it has been stalled before (the sender's machine reports its wait from them) and FCCL, big-endian,
    padded to the minimum frame."""
    body = struct.pack("!HHIQ", CREDIT_OPCODE, (int(stalled) << 8) | prio, min(stall_us, 0xFFFFFFFF), limit)
    return PFC_DST + src_mac + struct.pack("!H", ETH_P_MACCTL) + body + bytes(46 - len(body))


def grant(buffer: int, queued: int, margin: int, block: int) -> int:
    """The credit a receiver advertises: its free buffer for the ingress, less the margin, in whole blocks."""
    return max(0, buffer - queued - margin) // block * block


@dataclass
class CreditLink:
    """One link and lane under credits: the receiver's ingress (``down``, prio) meters the sender's port (``up``)."""
    down: int                       # ifindex of the receiving switch port
    up: int                         # ifindex of the sending port (a switch port or a host NIC)
    prio: int
    buffer: int                     # the receive buffer advertised for this ingress and lane
    margin: int
    block: int
    bucket: TbfBucket | None        # None: the sender is on another machine (remote)
    frame: int
    step: int                       # the least credit an update adds (fewer updates, same credit)
    modelled: bool                  # the sender is a switch port (its queue has a model to cap), not a NIC
    limit: int = 0                  # the FCCL in force: the stream position (bytes) the sender may send up to
    stalled_since: int | None = None
    src_mac: bytes = b""            # remote: the receiving port's MAC, source of its credit frames
    sent_at: int = 0                # remote: when the last credit frame went out (ns)
    stats: dict = field(default_factory=lambda: {"updates": 0, "stalls": 0, "stall_ns": 0, "granted": 0})

    @property
    def remote(self) -> bool:
        return self.bucket is None


@dataclass
class RemoteSender:
    """A local sending port whose receiver is on another machine: its meter follows the credit frames that
    arrive on it (``CreditMeter.on_grant``)."""
    port: int
    prio: int
    peer: int                       # the receiving port (on the other machine)
    bucket: TbfBucket
    frame: int
    buffer: int                     # the receiver's credit buffer: no grant opens more
    limit: int = 0                  # the FCCL in force


class CreditMeter:
    """The credit loop of the flow-control agent: ``tick()`` from its main loop; ``links`` is empty when no tier
    runs credits."""

    def __init__(self, agent, interval_ns: int):
        self.agent, self.o, self.bpf = agent, agent.o, agent.bpf
        self.interval_ns = interval_ns
        self.next_ns = 0
        self.state = self.bpf[b"ingress_state"]
        self.latency_us: list[float] = []                  # reading → change applied, per grant sent
        self.remote_us: list[float] = []                   # credit frame received → meter set (remote senders)
        self.links = self._links()
        self.senders = self._remote_senders()

    def _links(self) -> list[CreditLink]:
        """Every receiving switch port and lossless lane under credits on this machine. Its sender may be on
        another machine (a link cut by testbed/cluster: ``fabric.ports`` holds every port of the fabric, the
        part's topology only this machine's nodes); such a sender gets its grants in credit frames."""
        ports, here, out = self.o.fabric.ports, self.o.topo.nodes, []
        for down, d in ports.items():
            if d.flow_control != "credit" or not d.is_switch_port or d.node not in here:
                continue
            u = ports[d.port.peer_ifindex]
            for prio in d.lossless:
                if prio not in u.classes:
                    raise ValueError(f"credits: {u.node}/{u.ifname} has no class for priority {prio} to meter")
                margin = margin_bytes(u.mtu)
                link = CreditLink(
                    down=down, up=u.ifindex, prio=prio, buffer=d.ingress_buffer, margin=margin,
                    block=self.o.scen.switch.qos(d.port.tier).credit.block,
                    bucket=self._bucket(u, prio, d.ingress_buffer) if u.node in here else None,
                    frame=u.mtu + ETH_HLEN, step=max(2 * (u.mtu + ETH_HLEN), (d.ingress_buffer - margin) // 4),
                    modelled=u.is_switch_port, src_mac=bytes.fromhex(d.port.mac.replace(":", "")))
                out.append(link)
        return out

    def _remote_senders(self) -> dict[tuple[int, int], RemoteSender]:
        """(port, prio) → meter of every sending port on this machine whose receiver is on another one."""
        ports, here, out = self.o.fabric.ports, self.o.topo.nodes, {}
        for d in ports.values():
            if d.flow_control != "credit" or not d.is_switch_port or d.node in here:
                continue
            u = ports[d.port.peer_ifindex]
            if u.node in here:
                for prio in d.lossless:
                    out[(u.ifindex, prio)] = RemoteSender(u.ifindex, prio, d.ifindex,
                                                          self._bucket(u, prio, d.ingress_buffer), u.mtu + ETH_HLEN,
                                                          d.ingress_buffer)
        return out

    @staticmethod
    def _bucket(u, prio: int, buffer: int) -> TbfBucket:
        """The pre-encoded change of ``u``'s meter for ``prio`` (a receiver of credit buffer ``buffer``)."""
        return TbfBucket(u.ifindex, u.leaf_handle(prio), u.class_id(prio), meter_rate(buffer), u.queue_limit(prio))

    def _ingress(self, link: CreditLink) -> tuple[int, int] | None:
        """(bytes of the ingress still queued in the receiving switch, bytes it ever received); None if the switch
        program refused the recount (recorded as an error). ``arrived`` is read first: a packet charged between
        the two readings is counted as queued and not as received, which only lowers the grant. The recount
        commits the drain in the switch program (CTL_INGRESS_RECOUNT): a figure computed beside it, read-only,
        could be undone by a resync that later moved an egress queue's model back, and the grant sized on it
        overflowed the ingress by that drift (30 packets once in 1.2 M)."""
        arrived = self._arrived(link)
        queued = control(self.agent.ctl_fd, CTL_INGRESS_RECOUNT, link.down * N_PRIO + link.prio)
        if queued < 0:
            self.agent.errors.append(f"ingress recount of port {link.down} priority {link.prio}: {queued}")
            return None
        return queued, arrived

    def _arrived(self, link: CreditLink) -> int:
        return int(self.state[self.state.Key(link.down * N_PRIO + link.prio)].arrived)

    def tick(self) -> None:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if now < self.next_ns:
            return
        self.next_ns = now + self.interval_ns
        for link in self.links:
            self._update(link)

    def _update(self, link: CreditLink) -> None:
        """One credit update of a link: the new FCCL is what the ingress received so far plus the credit it can
        grant now. The credit the sender still holds never exceeds that (it was granted out of space since filled
        or still free), so an update only ever raises the limit, and is skipped while it would raise it by less
        than a step."""
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        reading = self._ingress(link)
        if reading is None:
            return
        queued, arrived = reading
        credit = grant(link.buffer, queued, link.margin, link.block)
        st = link.stats
        if credit < link.frame:                                 # the receiver's buffer is full: the link stalls
            if link.stalled_since is None:
                link.stalled_since = t0
                st["stalls"] += 1
                self._write_stats(link)
                if link.remote:                                 # the sender's machine reports the wait
                    self._send_frame(link, t0, link.limit)
            elif link.remote and t0 - link.sent_at >= REFRESH * self.interval_ns:
                self._send_frame(link, t0, link.limit)
            return
        limit = max(arrived + credit, link.limit)
        if link.remote:
            self._grant_remote(link, t0, limit)
            return
        if link.stalled_since is None and limit < link.limit + link.step:
            return
        t1 = self._apply(link.up, link.prio, link.bucket, link.frame, limit, link.limit, credit, link.modelled)
        if t1 is None:
            return
        self.latency_us.append((t1 - t0) / 1000)
        st["granted"] += limit - link.limit
        st["updates"] += 1
        if link.stalled_since is not None:
            st["stall_ns"] += t1 - link.stalled_since
            link.stalled_since = None
        link.limit = limit
        self._write_stats(link)

    def _apply(self, port: int, prio: int, bucket: TbfBucket, frame: int, limit: int, current: int, credit: int,
               modelled: bool) -> int | None:
        """Raise (port, prio)'s limit from ``current`` to stream position ``limit`` (FCCL), however late this
        agent is: close the grant in force (a bucket of one frame: TBF drops a frame its bucket cannot hold), read
        what the port has sent (FCTBS), then open the rest. A raise of less than two frames waits for a larger
        one: the close's frame must fit under the new limit and leave at least a frame to open, or closes without
        an open would let a frame out each. So the port never passes the newest limit by more than the one frame
        the close let it keep (the margin's first frame). Returns when the open was applied (CLOCK_MONOTONIC ns);
        None when nothing was applied."""
        if limit < current + 2 * frame:
            return None
        self.agent.netlink(port, bucket.with_burst(frame))
        sent = self._sent(port, prio)
        if sent is None:
            return None
        # sent ≤ current + frame ≤ limit − frame, and limit − sent ≤ the credit read (bytes on their way count as
        # sent) — unless bytes reached the ingress without passing the meter: a host's packets on the lossless
        # DSCP from a socket of another priority (its HTB default class). Never more than the credit, then.
        opened = max(frame, min(limit - sent, credit))
        self.agent.netlink(port, bucket.with_burst(opened))
        applied = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if modelled:                                            # the sender's queue model: sent so far, and its cap
            self.agent.control(CTL_VQ_CREDIT, port * N_PRIO + prio, applied, sent, limit)
        # A TBF change does not re-arm the watchdog a starved TBF set for its near-zero rate (up to a frame's
        # time at 8 kbit/s, 1.5 s), and a sender blocked on its socket buffer enqueues nothing that would
        # restart HTB: a kick frame does (it goes through the class behind the data, and its receiver drops it).
        self.agent.kick(port, prio)
        return applied

    def _grant_remote(self, link: CreditLink, t0: int, limit: int) -> None:
        """Send the sender on the other machine its new limit (FCCL) in a credit frame over the link, when it
        adds a step of credit, ends a stall, or the last frame is REFRESH intervals old (it may have been lost)."""
        if (link.stalled_since is None and limit < link.limit + link.step
                and t0 - link.sent_at < REFRESH * self.interval_ns):
            return
        st = link.stats
        if link.stalled_since is not None:
            st["stall_ns"] += t0 - link.stalled_since
            link.stalled_since = None
        if not self._send_frame(link, t0, limit):
            return
        t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self.latency_us.append((t1 - t0) / 1000)
        st["granted"] += limit - link.limit
        st["updates"] += 1
        link.limit = limit
        self._write_stats(link)

    def _send_frame(self, link: CreditLink, t0: int, limit: int) -> bool:
        """A credit frame out of the receiving port: the limit, and whether and how long the link has stalled."""
        stalled = link.stalled_since is not None
        try:
            self.agent.o.pkt[link.down].send(credit_frame(link.src_mac, link.prio, limit, stalled,
                                                          link.stats["stall_ns"] // 1000))
        except OSError as e:
            self.agent.errors.append(f"credit frame on port {link.down}: {e}")
            return False
        link.sent_at = t0
        return True

    def on_grant(self, port: int, prio: int, limit: int, stalled: bool, stall_us: int, ts: int) -> None:
        """A credit frame arrived on ``port`` (EVT_CREDIT_RX): set its meter to what the limit leaves of the
        bytes it has sent. A limit no higher than the one in force is a repeat, a stall notice or a late frame.
        The receiver's stall state goes into this machine's ``credit_stats`` entry of the receiving port (on the
        other machine), which the sampler reads as this port's ``credit_wait_s``; an ongoing stall is timed
        from the notice's arrival."""
        rs = self.senders.get((port, prio))
        if rs is None:
            self.agent.errors.append(f"credit frame for port {port} priority {prio}, which sends to no receiver on "
                                     f"another machine under credits")
            return
        self._mirror(rs, stalled, stall_us, ts)
        applied = self._apply(port, prio, rs.bucket, rs.frame, limit, rs.limit, rs.buffer, True)
        if applied is not None:
            rs.limit = limit
            self.remote_us.append((applied - ts) / 1000)

    def _mirror(self, rs: "RemoteSender", stalled: bool, stall_us: int, ts: int) -> None:
        t = self.bpf[b"credit_stats"]
        k = t.Key(rs.peer * N_PRIO + rs.prio)
        v = t[k]
        if stalled and not v.since:
            v.stalls += 1
        v.since = (v.since or ts) if stalled else 0
        v.stall_ns = stall_us * 1000
        t[k] = v

    def _sent(self, port: int, prio: int) -> int | None:
        """FCTBS: the bytes of ``prio`` that ``port`` has sent — its TBF leaf's dequeued bytes less the kick
        frames the agent put through it (the receiving switch drops those uncounted)."""
        st = self.agent.read_qdisc(port, prio, required=True)
        if st is None:
            return None
        return st.bytes - self.agent.kicked.get((port, prio), 0) * KICK_LEN

    def _write_stats(self, link: CreditLink) -> None:
        t = self.bpf[b"credit_stats"]
        k = t.Key(link.down * N_PRIO + link.prio)
        v = t[k]
        st = link.stats
        v.stalls, v.stall_ns, v.updates, v.granted = st["stalls"], st["stall_ns"], st["updates"], st["granted"]
        v.since = link.stalled_since or 0
        t[k] = v

    def finish(self) -> dict:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        for link in self.links:
            if link.stalled_since is not None:
                link.stats["stall_ns"] += now - link.stalled_since
                link.stalled_since = None
            self._write_stats(link)
        lat = sorted(self.latency_us)
        pct = (lambda q: lat[min(len(lat) - 1, int(q * (len(lat) - 1)))]) if lat else (lambda q: None)
        rem = sorted(self.remote_us)
        return {"links": len(self.links), "grant_latency_us": {"n": len(lat), "p50": pct(0.5), "p99": pct(0.99),
                                                               "max": lat[-1] if lat else None},
                "margin_bytes": sorted({lk.margin for lk in self.links}),
                "remote_links": sum(lk.remote for lk in self.links),
                "remote_apply_us": {"n": len(rem), "p50": rem[len(rem) // 2] if rem else None,
                                    "max": rem[-1] if rem else None}}


__all__ = ["CreditConfigError", "CreditMeter", "CreditLink", "RemoteSender", "check_buffers", "credit_frame", "grant",
           "margin_bytes", "meter_rate"]
