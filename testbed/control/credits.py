"""Credit-based link-level flow control (InfiniBand style, per virtual lane), run inside the flow-control agent.

In InfiniBand a receiver advertises, per lane, how much of its buffer is free; the sender transmits only what it
holds credit for, and credits come back as the receiver's queues drain. Nothing is ever dropped for lack of
buffer, and — unlike PFC, which must stop a sender that is already sending — no headroom for the bytes in flight
is needed.

The emulation meters each sender with its own serialiser. The sending port's TBF leaf under the lane's HTB class
(PortConfig) runs at a near-zero token rate, so its *bucket is the credit*: a TBF sends what its bucket holds, at
the pace of the HTB class above it, then stops. Every ``update_interval`` the agent reads, per link and lane, how
much of the receiver's buffer for that ingress is free — the credit buffer minus the bytes of that ingress still
queued in the receiving switch (the switch program's per-ingress accounting, lib/qos.h) — rounds it down to
``block``s, keeps a margin, and sets the sender's bucket to it (a TBF change refills the bucket: an absolute credit
limit, like IB's FCCL, not an increment). What can get past the limit: the bytes the sender sends between the
reading and the change (≈ 50 µs × rate), the near-zero token refill, and the one frame a stalled sender's
one-frame bucket lets out; the margin covers them (``margin_bytes``, measured in the tests). A sender with less
than a frame of credit is *stalled*; stalls, stalled time and credits granted are counted per ingress.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..datapath.queue_model import ingress_queued
from ..fabric.netlink import TbfBucket
from ..fabric.port import ETH_HLEN, N_PRIO

TICK_LIMIT_S = 200.0            # a bucket of B bytes at the meter's rate is B/rate seconds: keep it in a u32 of ticks
MIN_METER_BPS = 8000            # the meter's token rate: refills ≤ 1 byte per ms
MARGIN_S = 0.0005               # the reading-to-change window the margin covers (the change takes ~50 µs)


def meter_rate(buffer: int) -> int:
    """The near-zero token rate of a credit meter whose bucket may hold ``buffer`` bytes (tc keeps the bucket as
    transmission time in a u32 of psched ticks: ≤ ~274 s)."""
    return max(MIN_METER_BPS, -(-buffer * 8 // int(TICK_LIMIT_S)))


def margin_bytes(rate_bps: int, mtu: int) -> int:
    """Credit kept back per link: one frame the stalled bucket lets out, one frame of rounding, and what the sender
    can send while a grant is being applied."""
    return 2 * (mtu + ETH_HLEN) + int(rate_bps / 8 * MARGIN_S)


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
    limit: int = 0                  # the grant in force (the bucket set at the last update)
    stalled_since: int | None = None
    arrived: int = 0                # the ingress's arrived counter at the last update
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
                rate = meter_rate(d.ingress_buffer)
                out.append(CreditLink(
                    down=down, up=u.ifindex, prio=prio, buffer=d.ingress_buffer,
                    margin=margin_bytes(u.rate_bps, u.mtu), block=self.o.scen.switch.qos(d.port.tier).credit.block,
                    bucket=TbfBucket(u.ifindex, u.leaf_handle(prio), u.class_id(prio), rate, u.queue_limit(prio)),
                    frame=u.mtu + ETH_HLEN))
        return out

    def _ingress(self, link: CreditLink, now: int) -> tuple[int, int]:
        """(bytes of the ingress still queued in the receiving switch, bytes it ever received)."""
        st = self.state[self.state.Key(link.down * N_PRIO + link.prio)]
        return ingress_queued(self.bpf, self.slots, link.down, link.prio, now), int(st.arrived)

    def tick(self) -> None:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if now < self.next_ns:
            return
        self.next_ns = now + self.interval_ns
        for link in self.links:
            self._update(link, now)

    def _update(self, link: CreditLink, now: int) -> None:
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        queued, arrived = self._ingress(link, t0)
        used = arrived - link.arrived
        credit = grant(link.buffer, queued, link.margin, link.block)
        st, stalled = link.stats, link.stalled_since is not None
        if credit < link.frame:                             # less than a frame of credit: the sender stalls
            link.arrived = arrived
            if stalled:                                     # re-sending the one-frame bucket would leak a frame
                return
            self._apply(link, link.frame, used, t0)             # the smallest bucket TBF accepts (lets one frame out)
            t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            link.stalled_since = t1
            st["stalls"] += 1
            self.agent.freeze(link.up, link.prio, t1)       # the sender's queue model stops draining
        else:
            if not stalled and credit == link.limit and used == 0:   # idle link, unchanged credit: nothing to do
                return
            exhausted = stalled or used + link.frame > link.limit
            self._apply(link, credit, used, t0)
            t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            if stalled:
                st["stall_ns"] += t1 - link.stalled_since
                link.stalled_since = None
                self.agent.thaw(link.up, link.prio, t1)
            if exhausted:                                   # its TBF waits for a far-off refill: restart it now
                self.agent.kick(link.up, link.prio)
            link.arrived = arrived
        self._write_stats(link)

    def _apply(self, link: CreditLink, bucket: int, used: int, t0: int) -> None:
        """Set the sender's bucket (its credit limit from now on) and count what it adds to the credit left;
        ``t0``: when the receiver's buffer was read."""
        self.agent.netlink(link.up, link.bucket.with_burst(bucket))
        self.latency_us.append((time.clock_gettime_ns(time.CLOCK_MONOTONIC) - t0) / 1000)
        st = link.stats
        st["granted"] += max(0, bucket - max(0, link.limit - used)) if st["updates"] else bucket
        st["updates"] += 1
        link.limit = bucket

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


__all__ = ["CreditMeter", "CreditLink", "grant", "margin_bytes", "meter_rate"]
