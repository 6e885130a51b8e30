"""One object per port that owns its egress configuration: the serialiser, its queues and their limits.

The fabric builder turns it into qdiscs, the datapath into the switch program's queue model (``port_qos``), the
PFC agent into its pause/resume messages, the Soft-RoCE set-up into the shaping of a moved NIC. Each of them
reads the numbers from here and computes none itself, so a qdisc limit and the limit the switch program
enforces cannot disagree.

A port's serialiser is either one TBF root at the link rate (one queue), or — when the scenario uses traffic
classes or PFC — HTB at the link rate with one class per priority (classid 1:(0x10 + prio), selected by
``skb->priority``) and a TBF leaf under each, which the PFC agent pauses by changing that TBF's rate
(docs/architecture.md, 2.7 PFC).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import qos_classes
from ..qos_classes import HTB_CLASS_BASE, HTB_MAJOR
from ..topology import TIERS, Port, Topology

N_PRIO = 8                      # 802.1p priorities
LOSSY_SLACK = 64 * 1024         # a lossy queue's qdisc holds this much above the buffer the switch program enforces
LOSSLESS_FACTOR = 4             # a lossless queue's qdisc holds this many buffers (it must never drop first)
STALL_S = 0.05                  # … plus what its link should have sent in a stall this long: the queue model
                                # drains at the nominal rate while a late timer, softirq or the hypervisor
                                # (steal) holds the real serialiser, so the real queue runs ahead of the model
HOST_LINK_ROLES = ("nic", "down")   # the two ends of a host's link (the rest link switches: the fabric MTU)
MIN_CLASS_RATE = 8000           # bit/s: HTB's guaranteed rate of a class is link rate / classes, at least this
ETH_HLEN = 14


def tbf_burst(rate_bps: int, mtu: int) -> int:
    """Bucket depth: two full frames, or 200 µs at the link rate when that is larger, so the shaper stays
    accurate at high rates without timer storms and close to per-packet at low ones."""
    return max(2 * (mtu + ETH_HLEN), rate_bps // 8 * 200 // 1_000_000)


def netem_limit(rate_bps: int, buffer_bytes: int, delay_ns: int, mtu: int) -> int:
    """Packet limit of the netem delay line under a port's TBF. Grafting netem replaces TBF's byte-limited fifo,
    so the port buffer becomes a packet count: the buffer in full frames, plus what the link holds in flight
    (rate × delay) counted in minimum-size frames so that small packets are never dropped by the delay line.
    The port backlog then includes the in-flight bytes (rate × delay: 625 B at 100 Mbit/s and 50 µs)."""
    in_flight = -(-rate_bps * delay_ns // (8 * 64 * 1_000_000_000))
    return -(-buffer_bytes // (mtu + ETH_HLEN)) + in_flight + 1


def min_headroom(rate_bps: int, mtu: int, reaction_s: float = 1.5e-3) -> int:
    """Bytes that can still arrive on an ingress after Xoff: two frames in flight + the ~15 KB bursts HTB/TBF
    release + rate × the reaction time of the emulated pause (≈1.5 ms budget; measured ≥ 40 KB needed at
    100 Mbit/s and ≥ 200 KB at 1 Gbit/s, docs/architecture.md, 2.7 PFC headroom)."""
    return int(2 * (mtu + ETH_HLEN) + 15 * 1024 + rate_bps / 8 * reaction_s)


@dataclass(frozen=True)
class PortConfig:
    """The egress of one port (switch port or host NIC)."""
    port: Port
    mtu: int
    buffer_bytes: int                 # one queue's buffer: lossy packets beyond it are tail-dropped
    classes: tuple[int, ...]          # priorities with an HTB class; () = a single TBF root
    default_prio: int                 # HTB's default class (traffic the switch program did not classify)
    lossless: tuple[int, ...]         # priorities flow control protects at this port's switch (never tail-dropped
                                      # at the buffer); () when its tier has neither PFC nor credits: lossy then
    flow_control: str | None = None   # "pfc" | "credit" | None: what protects the lossless priorities
    ingress_buffer: int = 0           # bytes one lossless ingress (this port, a priority) may have queued in its
                                      # switch, beyond which its packets are lost: PFC xoff + headroom, credits
                                      # the buffer the port advertises; 0 = no limit (lossy)
    switch_ports: int = 1             # ports of its switch (a credit queue may hold one credit buffer from each)
    shared_pool: int = 0              # its switch's shared buffer minus the reserved headroom (dynamic
                                      # thresholds, docs/architecture.md 2.7b); 0 = a buffer per queue

    # -- identity, delegated to the topology's port
    @property
    def ifindex(self) -> int:
        return self.port.ifindex

    @property
    def ifname(self) -> str:
        return self.port.ifname

    @property
    def node(self) -> str:
        return self.port.node

    @property
    def rate_bps(self) -> int:
        return self.port.rate_bps

    @property
    def delay_ns(self) -> int:
        return self.port.delay_ns

    @property
    def is_switch_port(self) -> bool:
        return self.port.role != "nic"

    # -- the serialiser
    @property
    def burst_bytes(self) -> int:
        return tbf_burst(self.rate_bps, self.mtu)

    @property
    def ps_per_byte(self) -> int:
        """Serialisation time of a byte in picoseconds (the queue model's drain rate)."""
        return max(1, 8 * 10**12 // self.rate_bps)

    def class_rate(self) -> int:
        """HTB's guaranteed rate of each per-priority class (every class may borrow up to the link rate)."""
        return max(MIN_CLASS_RATE, self.rate_bps // max(1, len(self.classes)))

    @staticmethod
    def minor(prio: int) -> int:
        return HTB_CLASS_BASE + prio

    skb_priority = staticmethod(qos_classes.skb_priority)   # SO_PRIORITY selecting the class of a priority

    def leaf_handle(self, prio: int) -> int:
        """Handle of the TBF leaf under the class of ``prio``."""
        return self.minor(prio) << 16

    def class_id(self, prio: int) -> int:
        return HTB_MAJOR | self.minor(prio)

    # -- queue limits
    def queue_limit(self, prio: int | None = None) -> int:
        """Byte limit of the qdisc queue of ``prio`` (None: the single TBF root). A host NIC holds its buffer;
        a switch port's qdisc holds more than the buffer the switch program enforces, so that it never drops
        first: a lossy queue the buffer + 64 KB, a lossless one 4 buffers or what all its switch's ingresses may
        hold (credit buffer, or PFC xoff + headroom, per port), whichever is more (``lossless_limit``); both plus
        ``STALL_S`` at the link rate."""
        if not self.is_switch_port:
            return self.buffer_bytes
        stall = int(self.rate_bps / 8 * STALL_S)
        if prio is not None and prio in self.lossless:
            return self._lossless_bytes() + stall
        return self.buffer_bytes + LOSSY_SLACK + stall

    def _lossless_bytes(self) -> int:
        if self.flow_control == "credit":            # every other ingress may have its credit buffer queued here
            return max(LOSSLESS_FACTOR, self.switch_ports) * self.ingress_buffer
        # PFC: every ingress may hold xoff + headroom here, which can pass 4 buffers (a large headroom for
        # fast links: the egress then dropped what the ingresses were still allowed to send)
        return max(LOSSLESS_FACTOR * self.buffer_bytes, self.switch_ports * self.ingress_buffer)

    @property
    def lossless_limit(self) -> int:
        """Bytes the queue model of a lossless queue may hold before the switch program counts a packet lost;
        its qdisc holds ``STALL_S`` at the link rate more, for the bytes the model has drained but a stalled
        serialiser has not sent."""
        return self._lossless_bytes() if self.lossless and self.is_switch_port else self.buffer_bytes

    @property
    def netem_limit(self) -> int:
        return netem_limit(self.rate_bps, self.buffer_bytes, self.delay_ns, self.mtu)


def nics_have_classes(switch_spec, hosts_pfc: bool) -> bool:
    """Host NICs get one class per priority (and flows pick theirs) when they obey their leaf's flow control —
    PFC with hosts.pfc, credits always — and the fabric has classes at all."""
    return switch_spec.classes_on and (hosts_pfc or switch_spec.qos("leaf").credit.enabled)


def port_configs(topo: Topology, switch_spec, hosts_pfc: bool = False,
                 fabric_mtu: int | None = None, host_mtu: int | None = None) -> dict[int, PortConfig]:
    """ifindex → PortConfig of every port of the topology, from the scenario's ``switch`` section (buffers,
    traffic classes, PFC or credits per tier) and ``hosts.pfc`` (host NICs get classes only when they obey flow
    control: PFC with hosts.pfc, credits always). ``fabric_mtu``: the MTU of links between switches
    (Scenario.fabric_mtu: room for INT stacks); ``host_mtu``: of host links (Scenario.host_mtu: room for HPCC's
    INT stacks; default the topology's)."""
    fabric_mtu = fabric_mtu or topo.spec.mtu
    host_mtu = host_mtu or topo.spec.mtu
    classes_on = switch_spec.classes_on
    switch_prios = tuple(sorted({p for t in topo.tiers for p in switch_spec.qos(t).priorities()}))
    out = {}
    for ports in topo.ports.values():
        for p in ports:
            tier = "leaf" if p.tier == "host" else p.tier        # a NIC follows its leaf's classification
            q = switch_spec.qos(tier)
            tc = q.traffic_classes
            if p.role == "nic":
                buffer = p.buffer_bytes
                classes = tuple(q.priorities()) if nics_have_classes(switch_spec, hosts_pfc) else ()
            else:
                buffer = q.buffer if q.buffer is not None else p.buffer_bytes
                classes = switch_prios if classes_on else ()
            ingress = pool = 0               # a switch port's lossless ingress buffer (NICs: the host's memory)
            if p.role != "nic":
                ingress = {"credit": q.credit.buffer or buffer,
                           "pfc": q.pfc.xoff + q.pfc.headroom}.get(q.flow_control, 0)
                if q.shared_buffer:          # any queue may take up to the whole pool; the program sets the limit
                    pool = q.shared_buffer.size - len(ports) * len(q.lossless) * q.headroom
                    buffer = q.shared_buffer.size
                    ingress = pool + q.headroom if ingress else 0
            mtu = host_mtu if p.role in HOST_LINK_ROLES else fabric_mtu
            out[p.ifindex] = PortConfig(port=p, mtu=mtu, buffer_bytes=buffer, classes=classes,
                                        default_prio=tc.default, lossless=tuple(q.lossless),
                                        flow_control=q.flow_control, ingress_buffer=ingress,
                                        switch_ports=len(ports), shared_pool=pool)
    return out


def headroom_warnings(ports: dict[int, PortConfig], switch_spec) -> list[str]:
    """One line per tier whose PFC headroom is below the computed minimum for its fastest port."""
    out = []
    for tier in TIERS:                      # a tier without ports is skipped below
        q = switch_spec.qos(tier)
        if not (q.pfc.enabled and q.traffic_classes.lossless):
            continue
        tier_ports = [c for c in ports.values() if c.port.tier == tier]
        if not tier_ports:
            continue
        rate = max(c.rate_bps for c in tier_ports)
        need = min_headroom(rate, tier_ports[0].mtu)
        have, key = (q.headroom, "shared_buffer.headroom") if q.shared_buffer else (q.pfc.headroom, "pfc.headroom")
        if have < need:
            out.append(f"switch.{key} ({tier}): {have} bytes is below the computed minimum "
                       f"{need} bytes at {rate // 10**6} Mbit/s (2×frame + 15 KB shaper burst + rate × "
                       f"1.5 ms reaction): an incast may overflow the lossless queues")
    return out
