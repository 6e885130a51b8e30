"""Credit-based link-level flow control (InfiniBand style, per virtual lane), run inside the flow-control agent.

In InfiniBand a receiver advertises, per lane, how much of its buffer is free; the sender transmits only what it
holds credit for, and credits come back as the receiver's queues drain. Nothing is dropped for lack of buffer,
and — unlike PFC, which must stop a sender that is already sending — no headroom for the bytes in flight.

The emulation meters each sender with its own serialiser. The sending port's TBF leaf under the lane's HTB class
(PortConfig) runs at a near-zero token rate, so its *bucket is the credit*: it sends what its bucket holds, at
the pace of the HTB class above it, then waits. Every ``update_interval`` the agent reads, per link and lane, the
receiver's free buffer for that ingress — the credit buffer minus the bytes of that ingress still queued in the
receiving switch (the switch program's per-ingress accounting, lib/qos.h) — less a margin, in ``block``s. The
credit the sender still holds is never more than that (it was granted out of space that has since filled or is
still free), so an update only adds credit and is skipped while the sender holds most of what it could get.
A TBF change refills the bucket — an absolute limit from that instant, like IB's FCCL — so the bytes the sender
sent between the reading and the change are taken off the grant (the ingress's ``arrived`` counter, read again
just before). What can still pass the limit: what it sends during the netlink call itself and the near-zero
token refill; the margin (two frames + 0.5 ms of the rate) covers them, and the switch program drops whatever
would overflow the ingress's buffer, so a violation shows as a drop.

A switch sender's queue model learns its grant (CTL_VQ_CREDIT: the stream position it may send to and what it
has really sent), so upstream accounting and ECN see a credit-starved queue hold its bytes. A link whose
receiver can grant less than a frame is *stalled*; stalls, stalled time and credit granted are counted per
receiving port (links.csv rx rows; the sender's tx row carries the wait).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..datapath.queue_model import CTL_VQ_CREDIT, ingress_queued
from ..fabric.netlink import TbfBucket
from ..fabric.port import ETH_HLEN, N_PRIO
from ..topology import TIERS

TICK_LIMIT_S = 200.0            # a bucket of B bytes at the meter's rate is B/rate seconds: keep it in a u32 of ticks
MIN_METER_BPS = 8000            # the meter's token rate: refills ≤ 1 byte per ms
MARGIN_S = 0.0005               # the netlink call applying a grant, covered by the margin (p50 ~50 µs)


def meter_rate(buffer: int) -> int:
    """The near-zero token rate of a credit meter whose bucket may hold ``buffer`` bytes (tc keeps the bucket as
    transmission time in a u32 of psched ticks: ≤ ~274 s)."""
    return max(MIN_METER_BPS, -(-buffer * 8 // int(TICK_LIMIT_S)))


def margin_bytes(rate_bps: int, mtu: int) -> int:
    """Credit kept back per link: two frames (the meter's token refill, block rounding, a frame in flight when the
    grant lands) and what the sender can send while a grant is being applied."""
    return 2 * (mtu + ETH_HLEN) + int(rate_bps / 8 * MARGIN_S)


class CreditConfigError(ValueError):
    """A credit buffer that could never grant a frame: refused before anything is built."""


def check_buffers(ports: dict, switch_spec) -> list[str]:
    """Refuse (CreditConfigError) a tier whose credit buffer cannot hold the margin plus one frame at its fastest
    sender — its senders would stall for ever; return a warning per tier whose buffer caps the rate below the
    line rate (a sender can use at most buffer − margin per update interval)."""
    warnings = []
    metered = {c.port.tier for c in ports.values() if c.flow_control == "credit" and c.is_switch_port}
    for tier in [t for t in TIERS if t in metered]:                  # in topology order: leaf first
        tier_ports = [c for c in ports.values() if c.port.tier == tier and c.is_switch_port]
        worst = min(tier_ports, key=lambda c: c.ingress_buffer)
        rate = max(ports[c.port.peer_ifindex].rate_bps for c in tier_ports)
        frame = worst.mtu + ETH_HLEN
        margin = margin_bytes(rate, worst.mtu)
        where = f"switch.tiers.{tier}.credit.buffer" if tier in switch_spec.tiers else "switch.credit.buffer"
        if worst.ingress_buffer < margin + frame:
            raise CreditConfigError(
                f"@{where}: {worst.ingress_buffer} bytes of credit buffer ({tier} switches, {worst.node}/"
                f"{worst.ifname}) cannot hold the emulation's margin at {rate / 1e6:g} Mbit/s ({margin} bytes: "
                f"2 frames + 0.5 ms of the rate) and one frame; set at least {margin + frame} bytes")
        interval = switch_spec.qos(tier).credit.update_interval
        cap = (worst.ingress_buffer - margin) * 8e9 / interval
        if cap < rate:
            warnings.append(f"{where} ({tier}): {worst.ingress_buffer} bytes less the {margin}-byte margin per "
                            f"{interval / 1e6:g} ms update caps a sender at {cap / 1e6:.1f} Mbit/s, below its "
                            f"{rate / 1e6:g} Mbit/s link")
    return warnings


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
    bucket: TbfBucket
    frame: int
    step: int                       # the least credit an update adds (fewer updates, same credit)
    modelled: bool                  # the sender is a switch port (its queue has a model to cap), not a NIC
    limit: int = 0                  # the grant in force (the bucket set at the last update)
    stalled_since: int | None = None
    arrived: int = 0                # the ingress's arrived counter when that grant was set
    stats: dict = field(default_factory=lambda: {"updates": 0, "stalls": 0, "stall_ns": 0, "granted": 0})


class CreditMeter:
    """The credit loop of the flow-control agent: ``tick()`` from its main loop; ``links`` is empty when no tier
    runs credits."""

    def __init__(self, agent, interval_ns: int):
        self.agent, self.o, self.bpf = agent, agent.o, agent.bpf
        self.interval_ns = interval_ns
        self.next_ns = 0
        self.slots = agent.slots
        self.state = self.bpf[b"ingress_state"]
        self.latency_us: list[float] = []                  # reading → change applied, per grant sent
        self.links = self._links()

    def _links(self) -> list[CreditLink]:
        ports, out = self.o.fabric.ports, []
        for down, d in ports.items():
            if d.flow_control != "credit" or not d.is_switch_port:
                continue
            u = ports[d.port.peer_ifindex]
            for prio in d.lossless:
                if prio not in u.classes:
                    raise ValueError(f"credits: {u.node}/{u.ifname} has no class for priority {prio} to meter")
                rate, frame = meter_rate(d.ingress_buffer), u.mtu + ETH_HLEN
                margin = margin_bytes(u.rate_bps, u.mtu)
                link = CreditLink(
                    down=down, up=u.ifindex, prio=prio, buffer=d.ingress_buffer, margin=margin,
                    block=self.o.scen.switch.qos(d.port.tier).credit.block,
                    bucket=TbfBucket(u.ifindex, u.leaf_handle(prio), u.class_id(prio), rate, u.queue_limit(prio)),
                    frame=frame, step=max(frame, (d.ingress_buffer - margin) // 4), modelled=u.is_switch_port)
                link.arrived = self._arrived(link)
                out.append(link)
        return out

    def _ingress(self, link: CreditLink, now: int) -> tuple[int, int]:
        """(bytes of the ingress still queued in the receiving switch, bytes it ever received)."""
        return ingress_queued(self.bpf, self.slots, link.down, link.prio, now), self._arrived(link)

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
        """One credit update of a link. The credit the sender still holds never exceeds what the receiver could
        grant now (it was granted out of space since filled or still free), so an update only ever adds credit,
        and is skipped while the sender holds most of what it could be given."""
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        queued, arrived = self._ingress(link, t0)
        held = link.limit - (arrived - link.arrived)            # credit the sender has not used yet
        credit = grant(link.buffer, queued, link.margin, link.block)
        st = link.stats
        if credit < link.frame:                                 # the receiver's buffer is full: the link stalls
            if link.stalled_since is None:
                link.stalled_since = t0
                st["stalls"] += 1
                self._write_stats(link)
            return
        if link.stalled_since is None and credit < held + link.step:
            return
        # bytes the sender sent since the reading came out of the credit it held then: take them off the grant
        now_arrived = self._arrived(link)
        bucket = credit - (now_arrived - arrived)
        if bucket < link.frame:
            return
        self.agent.netlink(link.up, link.bucket.with_burst(bucket))
        t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if link.modelled:                                       # the sender's queue model: sent so far, and its cap
            self.agent.control(CTL_VQ_CREDIT, link.up * N_PRIO + link.prio, t1, now_arrived, now_arrived + bucket)
        self.latency_us.append((t1 - t0) / 1000)
        st["granted"] += bucket - max(0, held - (now_arrived - arrived))
        st["updates"] += 1
        if link.stalled_since is not None:
            st["stall_ns"] += t1 - link.stalled_since
            link.stalled_since = None
        # A TBF change does not re-arm the watchdog a starved TBF set for its near-zero rate (up to a frame's
        # time at 8 kbit/s, 1.5 s), and a sender blocked on its socket buffer enqueues nothing that would
        # restart HTB: a kick frame does (it goes through the class behind the data, and its receiver drops it).
        self.agent.kick(link.up, link.prio)
        link.limit, link.arrived = bucket, now_arrived
        self._write_stats(link)

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
        return {"links": len(self.links), "grant_latency_us": {"n": len(lat), "p50": pct(0.5), "p99": pct(0.99),
                                                               "max": lat[-1] if lat else None},
                "margin_bytes": sorted({lk.margin for lk in self.links})}


__all__ = ["CreditConfigError", "CreditMeter", "CreditLink", "check_buffers", "grant", "margin_bytes", "meter_rate"]
