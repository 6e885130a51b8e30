"""YAML scenario → validated, typed model.

Every mistake is reported as one line naming the key path (``topology.spines: must be ≥ 1, got 0``), so a
scenario can be fixed without reading a traceback. ``--set key.path=value`` overrides are applied to the raw
document before validation, so they are checked exactly like the file.
"""
from __future__ import annotations

import builtins
import copy
import re
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (BeforeValidator, Field, PrivateAttr, ValidationError,
                      model_validator)

from . import dilation, profiles, units
from .spec_types import (Delay, NodeName, Rate, Ratio, ScenarioError, Size, Strict, Time, unit as _unit,
                         whole_us as _whole_us)
from .datapath.int_wire import INT_HEADER_BYTES, INT_HOP_BYTES, INT_MAX_HOPS
from .topology.model import TIERS
from .workloads.roce import cc as roce_cc
from .workloads.roce.cc import DcqcnConfig, EqdsConfig, HpccConfig, NsccConfig, SwiftConfig, TimelyConfig


class LinkSpec(Strict):
    rate: Rate = units.rate_bps("100mbit")
    buffer: Size = units.size_bytes("256KB")
    # One-way propagation delay of the link (each direction), e.g. 50us. Emulated with netem under the shaping
    # qdisc, so it needs a kernel with sch_netem (`testbed doctor`: netem) — a distribution kernel or the VM.
    delay: Delay = 0

    @model_validator(mode="after")
    def _delay_in_us(self):
        _whole_us(self.delay)
        return self


class LinkOverrideSpec(Strict):
    """One ``topology.links`` entry: the link between two nodes (both directions) gets these instead of its
    kind's host_link / fabric_link values — a degraded or slower link, an asymmetric fabric."""
    between: tuple[NodeName, NodeName]
    rate: Optional[Rate] = None
    buffer: Optional[Size] = None
    delay: Optional[Delay] = None
    weight: Optional[int] = Field(None, ge=1, le=65535)   # stored on the link and its ports for a later WCMP

    @model_validator(mode="after")
    def _says_something(self):
        _whole_us(self.delay)
        if self.rate is None and self.buffer is None and self.delay is None and self.weight is None:
            raise ValueError("give at least one of rate, buffer, delay, weight for this link")
        return self


#: Keys that only some kinds use, with each kind's defaults (a key another kind uses must stay unset there).
_KIND_KEYS = {
    "leaf-spine": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2},
    "clos3": {"pods": 2, "leaves_per_pod": 2, "spines_per_pod": 2, "cores": 2, "planes": 1, "hosts_per_leaf": 2},
    "fat-tree": {"k": None, "oversubscription": "1:1", "hosts_per_leaf": None},
}
_WHY_NOT = {"fat-tree": "k sets every count of a fat-tree", "clos3": "use pods, leaves_per_pod, spines_per_pod, "
            "cores, planes, hosts_per_leaf", "leaf-spine": "use spines, leaves, hosts_per_leaf"}


class TopologySpec(Strict):
    kind: Literal["leaf-spine", "clos3", "fat-tree"] = "leaf-spine"
    # leaf-spine (spines and leaves per rail)
    spines: Optional[int] = Field(None, ge=1, le=64)
    leaves: Optional[int] = Field(None, ge=1, le=256)
    hosts_per_leaf: Optional[int] = Field(None, ge=1, le=253)      # every kind; fat-tree: k/2
    rails: int = Field(1, ge=1, le=8)
    rails_share_spines: bool = False      # rails' leaves share one spine layer (SuperPOD); default: planes
    # fat-tree
    k: Optional[int] = Field(None, ge=4, le=16)
    oversubscription: Optional[Ratio] = None    # a:b hosts to uplinks per leaf; removes uplinks (clos.py)
    # clos3
    pods: Optional[int] = Field(None, ge=1, le=64)
    leaves_per_pod: Optional[int] = Field(None, ge=1, le=64)
    spines_per_pod: Optional[int] = Field(None, ge=1, le=64)
    cores: Optional[int] = Field(None, ge=1, le=256)
    planes: Optional[int] = Field(None, ge=1, le=64)       # core planes; spine a of a pod → plane a mod planes
    mtu: int = Field(1500, ge=576, le=9000)
    host_link: LinkSpec = LinkSpec()
    fabric_link: LinkSpec = LinkSpec()
    links: list[LinkOverrideSpec] = []
    offloads: bool = False

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data):
        """Fill the defaults of the keys this kind uses, so that the resolved scenario shows them and the keys
        of other kinds stay None (and are refused when given)."""
        if not isinstance(data, dict):
            return data
        own = _KIND_KEYS.get(data.get("kind", "leaf-spine"))
        if own is None:
            return data                   # an unknown kind: the field says so
        data = dict(data)
        for key, value in own.items():
            if data.get(key) is None:
                data[key] = value
        k = data.get("k")
        if "k" in own and data.get("hosts_per_leaf") is None and isinstance(k, int) and not isinstance(k, bool):
            data["hosts_per_leaf"] = k // 2
        return data

    @model_validator(mode="after")
    def _fits_kind(self):
        own = _KIND_KEYS[self.kind]
        for key in ("spines", "leaves", "k", "oversubscription", "pods", "leaves_per_pod", "spines_per_pod",
                    "cores", "planes"):
            if key not in own and getattr(self, key) is not None:
                raise ValueError(f"{key}: not a key of kind {self.kind} ({_WHY_NOT[self.kind]})")
        if self.kind != "leaf-spine" and self.rails != 1:
            raise ValueError(f"rails: multi-rail hosts are a leaf-spine layout (kind {self.kind} gives each host "
                             f"one NIC), got {self.rails}")
        if self.rails_share_spines and self.kind != "leaf-spine":
            raise ValueError(f"rails_share_spines: rails are a leaf-spine layout, got kind {self.kind}")
        if self.rails_share_spines and self.rails < 2:
            raise ValueError("rails_share_spines: needs rails ≥ 2 (one rail has no other rail to share spines "
                             f"with), got rails: {self.rails}")
        if self.kind == "leaf-spine":
            from .topology import max_leaves_per_rail
            limit = max_leaves_per_rail(self.rails)
            if self.leaves > limit:
                raise ValueError(f"leaves: at most {limit} leaves per rail fit the address plan with "
                                 f"{self.rails} rail(s), got {self.leaves}")
        elif self.kind == "fat-tree":
            self._fat_tree()
        else:
            self._clos3()
        self._links_exist()
        return self

    def _fat_tree(self) -> None:
        from .topology.clos import fat_tree_uplinks
        k = self.k
        if k is None:
            raise ValueError("k: kind fat-tree needs k (even, 4–16: k pods, k³/4 hosts)")
        if k % 2:
            raise ValueError(f"k: must be even, got {k}")
        if self.hosts_per_leaf != k // 2:
            raise ValueError(f"hosts_per_leaf: a fat-tree of k = {k} has k/2 = {k // 2} hosts per leaf (leave the "
                             f"key out), got {self.hosts_per_leaf}")
        up = fat_tree_uplinks(k, self.oversubscription_ratio)
        if up < 1:
            raise ValueError(f"oversubscription: {self.oversubscription} leaves no uplink (k/2 = {k // 2} uplinks "
                             f"per leaf ÷ {self.oversubscription_ratio} = {up})")
        if up.denominator != 1:
            raise ValueError(f"oversubscription: {self.oversubscription} does not leave a whole number of uplinks "
                             f"(k/2 = {k // 2} ÷ {self.oversubscription_ratio} = {up}); use a ratio that divides "
                             f"{k // 2}, e.g. {k // 2}:1")

    def _clos3(self) -> None:
        from .topology.clos import MAX_SLASH24, shape
        if self.planes > self.spines_per_pod or self.spines_per_pod % self.planes:
            raise ValueError(f"planes: must divide spines_per_pod ({self.spines_per_pod}), got {self.planes}")
        if self.cores % self.planes:
            raise ValueError(f"cores: must be a multiple of planes ({self.planes}), got {self.cores}")
        sh = shape(self)
        if sh.slash24s > MAX_SLASH24:
            raise ValueError(f"pods: {self.pods} pods × {1 << sh.leaf_bits} leaf /24s (leaves_per_pod rounded up "
                             f"to a power of two) do not fit 198.18.0.0/15 ({MAX_SLASH24} /24s), got {self.pods}")

    def _links_exist(self) -> None:
        """Every ``links`` entry names two nodes of this topology that a link joins, once."""
        if not self.links:
            return
        from .topology import build, node_names
        names = set(node_names(self))
        seen: dict[frozenset, int] = {}
        linked = None
        for i, o in enumerate(self.links):
            a, b = o.between
            where = f"@topology.links.{i}.between"
            for n in (a, b):
                if n not in names:
                    raise ValueError(f"{where}: no node {n!r} in this topology")
            if a == b:
                raise ValueError(f"{where}: a link joins two different nodes, got [{a}, {b}]")
            pair = frozenset((a, b))
            if pair in seen:
                raise ValueError(f"{where}: {a}–{b} is already overridden by topology.links.{seen[pair]}")
            seen[pair] = i
            if linked is None:
                linked = {frozenset((ln.a.node, ln.b.node)) for ln in build(self).links}
            if pair not in linked:
                raise ValueError(f"{where}: {a} and {b} are not linked")

    @property
    def oversubscription_ratio(self) -> Fraction:
        a, _, b = (self.oversubscription or "1:1").partition(":")
        return Fraction(int(a), int(b))

    @property
    def tiers(self) -> tuple[str, ...]:
        """The switch tiers this kind has (the keys switch.tiers may use)."""
        return TIERS[:2] if self.kind == "leaf-spine" else TIERS

    @property
    def path_switches(self) -> int:
        """Switches on the longest host-to-host path (up every tier and down again)."""
        return 2 * len(self.tiers) - 1

    @property
    def hosts(self) -> int:
        if self.kind == "leaf-spine":
            return self.leaves * self.hosts_per_leaf
        from .topology.clos import shape
        s = shape(self)
        return s.pods * s.leaves * s.hosts


Priority = Annotated[int, Field(ge=0, le=7)]
ROCE_DSCP = 26                  # AF31: the DSCP RoCE NICs mark by default


class TrafficClassSpec(Strict):
    """DSCP → priority (0..7) and which priorities are lossless (PFC protects them; they are never tail-dropped
    by the switch program). DSCPs not listed map to ``default``."""
    dscp: dict[Annotated[int, Field(ge=0, le=63)], Priority] = {}
    default: Priority = 0
    lossless: list[Priority] = []


class EcnSpec(Strict):
    """RED/DCQCN marking curve of one egress queue: P(mark) = 0 below kmin, linear up to pmax at kmax, 1 above."""
    kmin: Size
    kmax: Size
    pmax: float = Field(0.1, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _order(self):
        if self.kmax < self.kmin:
            raise ValueError(f"kmax: must be ≥ kmin ({self.kmin} bytes), got {self.kmax}")
        return self


class PfcSpec(Strict):
    """PFC of the lossless priorities: Xoff/Xon thresholds on the bytes that arrived on one ingress port (per
    priority) and are still queued in the switch, headroom per ingress port for what arrives after Xoff."""
    enabled: bool = False
    xoff: Size = units.size_bytes("32KB")
    xon: Size = units.size_bytes("16KB")
    headroom: Size = units.size_bytes("48KB")

    @model_validator(mode="after")
    def _order(self):
        if self.xon > self.xoff:
            raise ValueError(f"xon: must be ≤ xoff ({self.xoff} bytes), got {self.xon}")
        return self


class CreditSpec(Strict):
    """Credit-based link-level flow control of the lossless priorities, as InfiniBand does per virtual lane: the
    receiving port grants the sender its free buffer (in `block`s), the sender transmits only what it was
    granted, grants are renewed every `update_interval` as the receiver's queues drain. Lossless by
    construction, with no round-trip headroom (testbed/control/credits.py)."""
    enabled: bool = False
    block: Size = 64                                  # credit granularity (bytes)
    update_interval: Annotated[int, *_unit(units.time_ns), Field(ge=100_000)] = units.time_ns("1ms")
    buffer: Optional[Size] = None                     # receive buffer per ingress and lane; None = the queue buffer


class SharedBufferSpec(Strict):
    """One buffer shared by all queues of a switch, with dynamic thresholds (Broadcom-style MMU, as the HPCC
    simulator models it): a queue may hold at most alpha × the free shared space, PFC Xoff of a lossless ingress
    follows the same rule, and `headroom` is reserved per lossless ingress (port, priority) for what arrives
    after Xoff. The shared pool is `size` minus those reservations."""
    size: Size
    alpha: float = Field(1.0, gt=0.0, le=64.0)
    headroom: Optional[Size] = None                   # per lossless ingress; None = switch.pfc.headroom
    xon_offset: Size = units.size_bytes("3KB")        # Xon once the ingress is this far below the threshold


class TrimSpec(Strict):
    """Packet trimming (as UEC switches do): a RoCEv2 packet of a lossy priority that would overflow its egress
    queue, or find it deeper than `threshold`, is cut to its headers (IP + UDP + 64 bytes: BTH and the transport
    header), flagged (BTH byte 4, bit 0x20) and sent on `priority`, so its receiver learns of the loss at once
    instead of after a timeout (ebpf/lib/trim.h)."""
    enabled: bool = False
    threshold: Optional[Size] = None                  # queue depth that trims; None = the port's buffer
    priority: Priority = 7                            # where trimmed headers go (a lossy priority of their own)


EcnMap = Union[EcnSpec, dict[Priority, EcnSpec], None]


class QosSpec(Strict):
    """Buffers, traffic classes, ECN and PFC of one tier's switches (what `switch.tiers.<tier>` overrides)."""
    buffer: Optional[Size] = None               # per port; None = the link's `buffer`
    traffic_classes: Optional[TrafficClassSpec] = None
    ecn: EcnMap = None                          # one curve for every priority, or {priority: curve}
    pfc: Optional[PfcSpec] = None
    credit: Optional[CreditSpec] = None
    shared_buffer: Optional[SharedBufferSpec] = None
    trim: Optional[TrimSpec] = None


class AdaptiveSpec(Strict):
    """Adaptive routing (``load_balancing: adaptive``): take the least loaded allowed egress port."""
    granularity: Literal["packet", "flowlet"] = "packet"    # choose per packet (reorders) or per flowlet
    metric: Literal["queue", "load", "queue+load"] = "queue"   # queued bytes, recent tx bytes, or their sum
    flowlet_timeout: Optional[Time] = None                  # granularity flowlet; None = switch.flowlet_timeout
    load_window: Annotated[int, *_unit(units.time_ns), Field(gt=0)] = units.time_ns("20ms")   # the load metric's memory:
                                                    # many packets long (1 ms at 40 Mbit/s held 3: noise)


class WcmpSpec(Strict):
    """Weighted-cost multipath (``load_balancing: wcmp``): each next-hop group becomes a table of `slots` entries
    in which every member appears in proportion to its weight, as switch ASICs replicate members; a flow (hash),
    a flowlet or a packet draws one entry. `source: static` takes the weights from `topology.links[].weight`;
    `int` and `load`: the WCMP controller (testbed/control/wcmp.py) sets each source leaf's weights every
    `interval` from the INT path delays or the ports' tx rates."""
    source: Literal["static", "int", "load"] = "static"
    granularity: Literal["flow", "flowlet", "packet"] = "flowlet"
    slots: int = Field(64, ge=2, le=255)
    interval: Annotated[int, *_unit(units.time_ns), Field(ge=1_000_000)] = units.time_ns("10ms")


class DlbSpec(Strict):
    """Dynamic load balancing (``load_balancing: dlb``, Broadcom style): every egress port has a quality band
    0 (best) .. bands − 1 from its quantised recent load (a fraction of `load_window`) and its quantised queue
    depth (drain time as a fraction of its buffer's), combined as a mean weighted by `load_weight` and
    `queue_weight`; a flow idle longer than `inactivity` starts a new flowlet on a port of the best band, and
    keeps that port while its gaps stay shorter (unless the port loses its link)."""
    inactivity: Time = units.time_ns("100us")
    load_weight: int = Field(1, ge=0, le=1000)
    queue_weight: int = Field(1, ge=0, le=1000)
    bands: int = Field(8, ge=2, le=16)
    load_window: Annotated[int, *_unit(units.time_ns), Field(gt=0)] = units.time_ns("20ms")   # the load's memory

    @model_validator(mode="after")
    def _weights(self):
        if self.load_weight == 0 and self.queue_weight == 0:
            raise ValueError("load_weight and queue_weight are both 0: nothing ranks the ports "
                             "(give one a weight ≥ 1)")
        return self


class SmSpec(Strict):
    """Subnet-manager routing (``switch.routing: sm``): the routing engine and how often the SM sweeps the
    fabric's link state (testbed/control/routing.py)."""
    engine: Literal["minhop", "updn", "ftree"] = "minhop"
    sweep_interval: Annotated[int, *_unit(units.time_ns), Field(ge=1_000_000)] = \
        units.time_ns("10ms")


class SwitchSpec(Strict):
    load_balancing: Literal["ecmp", "flowlet", "spray", "adaptive", "wcmp", "dlb"] = "ecmp"
    # distributed: every switch's own ECMP groups (topology FIB), local fast failover, routes recomputed when a
    # link changes; sm: a subnet manager computes per-destination tables (switch.sm) and sweeps link state
    routing: Literal["distributed", "sm"] = "distributed"
    sm: SmSpec = SmSpec()
    flowlet_timeout: Time = units.time_ns("500us")
    spray: Literal["random", "round_robin"] = "random"
    adaptive: AdaptiveSpec = AdaptiveSpec()
    wcmp: WcmpSpec = WcmpSpec()
    dlb: DlbSpec = DlbSpec()
    hash_seed: int = Field(1, ge=0, lt=2**32)
    # what the ECMP/WCMP/failover hash covers; roce_qp adds the BTH destination QP of RoCEv2 packets
    hash_fields: list[Literal["src_ip", "dst_ip", "sport", "dport", "proto", "roce_qp"]] = \
        ["src_ip", "dst_ip", "sport", "dport", "proto"]
    buffer: Optional[Size] = None
    traffic_classes: TrafficClassSpec = TrafficClassSpec()
    ecn: EcnMap = None
    pfc: PfcSpec = PfcSpec()
    credit: CreditSpec = CreditSpec()
    shared_buffer: Optional[SharedBufferSpec] = None    # None: every (port, priority) has its own `buffer`
    trim: TrimSpec = TrimSpec()
    tiers: dict[Literal[TIERS], QosSpec] = {}

    @model_validator(mode="after")
    def _hash_fields(self):
        if not self.hash_fields:
            raise ValueError("hash_fields: the hash needs at least one field (e.g. [src_ip, dst_ip])")
        if len(set(self.hash_fields)) != len(self.hash_fields):
            raise ValueError(f"hash_fields: a field is listed twice ({', '.join(self.hash_fields)})")
        return self

    @property
    def sm_multipath(self) -> bool:
        """Under SM routing, whether a destination gets every port the engine allows (for the load balancer to
        pick among: flowlet, spray, adaptive) or the engine's one deterministic port (ecmp: no choice, as a
        LID's linear forwarding table entry)."""
        return self.load_balancing != "ecmp"

    def qos(self, tier: str) -> "ResolvedQos":
        """The effective settings of a tier's switches: the tier's override where it sets a key, else these."""
        o = self.tiers.get(tier, QosSpec())
        ecn = o.ecn if o.ecn is not None else self.ecn
        if isinstance(ecn, EcnSpec):
            ecn = {p: ecn for p in range(8)}
        return ResolvedQos(buffer=o.buffer if o.buffer is not None else self.buffer,
                           traffic_classes=o.traffic_classes or self.traffic_classes,
                           ecn=dict(ecn or {}), pfc=o.pfc or self.pfc, credit=o.credit or self.credit,
                           shared_buffer=o.shared_buffer or self.shared_buffer, trim=o.trim or self.trim)

    @property
    def classes_on(self) -> bool:
        """True when any tier uses more than one priority, PFC or credits: ports then get HTB + one class per
        priority (flow control pauses or meters one class)."""
        for t in TIERS:                 # a tier the topology lacks is refused in Scenario, so all may be read
            q = self.qos(t)
            if q.flow_control or q.traffic_classes.dscp or q.traffic_classes.default or q.trim.enabled:
                return True
        return False

    @property
    def credit_on(self) -> bool:
        return any(self.qos(t).credit.enabled for t in TIERS)

    @property
    def shared_buffer_on(self) -> bool:
        return any(self.qos(t).shared_buffer for t in TIERS)

    def trim_priority(self, tiers) -> Optional[int]:
        """The priority trimmed headers travel on (every switch of ``tiers`` classifies them to it), or None when
        no tier trims. One for the fabric: Scenario refuses tiers that disagree."""
        return next((self.qos(t).trim.priority for t in tiers if self.qos(t).trim.enabled), None)


class ResolvedQos(Strict):
    buffer: Optional[int]
    traffic_classes: TrafficClassSpec
    ecn: dict[int, EcnSpec]
    pfc: PfcSpec
    credit: CreditSpec
    shared_buffer: Optional[SharedBufferSpec] = None
    trim: TrimSpec = TrimSpec()

    @property
    def headroom(self) -> int:
        """Bytes reserved per lossless ingress out of a shared buffer (0 when nothing is lossless)."""
        sb = self.shared_buffer
        if not (sb and self.lossless):
            return 0
        return sb.headroom if sb.headroom is not None else self.pfc.headroom

    @property
    def flow_control(self) -> Optional[str]:
        """What keeps the lossless priorities lossless: "pfc", "credit" or None (then they are lossy)."""
        return "pfc" if self.pfc.enabled else "credit" if self.credit.enabled else None

    @property
    def lossless(self) -> list[int]:
        """The priorities flow control protects (`traffic_classes.lossless` where PFC or credits are on)."""
        return list(self.traffic_classes.lossless) if self.flow_control else []

    def priorities(self) -> list[int]:
        tc = self.traffic_classes
        trim = [self.trim.priority] if self.trim.enabled else []      # trimmed headers' queue and class
        return sorted({tc.default, *tc.dscp.values(), *tc.lossless, *trim})


def _image_name(v):
    """A Docker image reference as the local daemon knows it (repository[:tag] or an image id)."""
    if not isinstance(v, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                                                 r"|sha256:[0-9a-f]{64}", v):
        raise ValueError(f"not a Docker image name (lowercase repository[:tag], e.g. fabric-testbed/host or "
                         f"debian:bookworm), got {v!r}")
    return v


ImageName = Annotated[str, BeforeValidator(_image_name)]


class DockerHostsSpec(Strict):
    """``hosts.docker``: every host is a container of ``image`` (``per_host`` names other images for some hosts),
    started without a network of its own; the fabric moves the host's NICs into it (testbed/container/)."""
    image: ImageName = "fabric-testbed/host"
    per_host: dict[NodeName, ImageName] = {}

    def image_of(self, host: str) -> str:
        return self.per_host.get(host, self.image)


class HostsSpec(Strict):
    pfc: bool = False            # host NICs obey PFC pause frames (per priority) from their leaf
    docker: Optional[DockerHostsSpec] = None    # hosts are Docker containers (default: network namespaces)


class IncastSpec(Strict):
    receiver: NodeName = "h0"
    senders: Union[list[NodeName], int, None] = None   # names, a count (first N others), or all others


class RoceSpec(Strict):
    """Options of the built-in RoCEv2 engine (``traffic.engine: roce``)."""
    entropy: Literal["qp", "packet", "reps", "bitmap"] = "qp"   # qp: one UDP source port per QP; packet: cycle
                                                    # per packet; reps/bitmap: path-aware (roce/entropy.py)
    entropy_values: Optional[int] = Field(None, ge=1, le=4096)   # source ports a flow sprays over (None: 8 for
                                                    # packet, 256 for reps/bitmap)
    penalty_decay: Optional[Annotated[int, *_unit(units.time_ns), Field(ge=1000)]] = None   # bitmap: one
                                                    # penalty point decays per this long (None: one smoothed RTT)
    message_size: Optional[Size] = None             # RDMA WRITE size; None = the whole flow (1MB for duration flows)
    mtu: Optional[Literal[256, 512, 1024, 2048, 4096]] = None   # IB path MTU; None = largest fitting packet_size
    rto: Union[Literal["auto"], Annotated[int, *_unit(units.time_ns), Field(ge=100_000)]] = units.time_ns("10ms")
                                                    # auto: twice the longest queueing a packet can meet on its
                                                    # path (flows.queueing_bound_s), at least 10 ms
    reorder_window: int = Field(32, ge=1, le=1 << 20)   # ooo receiver: NAK a hole this many PSNs behind …
    reorder_time: Optional[Annotated[int, *_unit(units.time_ns), Field(ge=0)]] = None   # … and this long after
                                                    # (None = rto / 4): sprayed paths reorder by queueing-delay spread
    drop_prob: float = Field(0.0, ge=0.0, le=0.5)   # test-only: receiver discards this fraction of data packets
    ce_prob: float = Field(0.0, ge=0.0, le=1.0)     # test-only: sender CE-marks this fraction of packets
    batch: int = Field(8, ge=1, le=32)              # same-size packets per UDP GSO sendmsg (entropy qp only);
                                                    # 1 = one sendmsg per packet with UDP checksum 0

    @property
    def values(self) -> int:
        """Entropy values a flow uses: 1 for qp, else entropy_values or its mode's default."""
        if self.entropy == "qp":
            return 1
        return self.entropy_values or (8 if self.entropy == "packet" else 256)


class RxeSpec(Strict):
    """``traffic.engine: rxe`` (Soft-RoCE + perftest, where the kernel has rdma_rxe): which perftest runs per flow
    and its message size."""
    test: Literal["write_bw", "send_bw"] = "write_bw"      # ib_write_bw | ib_send_bw
    msg_bytes: Size = 65536


class JobSpec(Strict):
    """One collective job: ``iterations`` × (the collective, then ``gap`` of compute)."""
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    pattern: Literal["allreduce", "all-to-all", "incast", "permutation"]
    hosts: Optional[list[NodeName]] = None     # None = every host; incast: the first one receives
    bytes: Size                                # allreduce: buffer per rank; all-to-all: per pair; incast: per
                                               # sender; permutation: per flow
    iterations: int = Field(1, ge=1, le=10000)
    gap: Time = 0
    algorithm: Optional[Literal["direct", "pairwise"]] = None   # all-to-all: every pair at once (direct, the
                                               # default) or N−1 shifted steps (pairwise exchange)

    @model_validator(mode="after")
    def _enough_hosts(self):
        if self.hosts is not None and len(set(self.hosts)) < 2:
            raise ValueError("hosts: a collective needs at least 2 distinct hosts")
        if self.algorithm is not None and self.pattern != "all-to-all":
            raise ValueError(f"algorithm: chooses how an all-to-all is scheduled, not a {self.pattern}")
        return self


class TrafficSpec(Strict):
    engine: Literal["udp", "tcp", "roce", "rxe"] = "udp"
    pattern: Literal["pairs", "permutation", "all-to-all", "incast", "allreduce", "poisson"] = "permutation"
    receiver: Literal["gbn", "ooo"] = "gbn"      # RoCE: go-back-N (as NICs do) or reordering-tolerant
    cc: str = "none"        # RoCE CC: none | a registered name (built-ins and plugins: workloads/roce/cc/registry.py)
    cc_params: Optional[dict[str, Any]] = None   # the selected CC's parameters, checked by its own model
    roce: RoceSpec = RoceSpec()
    # each built-in CC's parameters (its module's model); cc_params is the alternative spelling for the selected one
    dcqcn: DcqcnConfig = DcqcnConfig()
    nscc: NsccConfig = NsccConfig()
    swift: SwiftConfig = SwiftConfig()
    timely: TimelyConfig = TimelyConfig()
    hpcc: HpccConfig = HpccConfig()
    eqds: EqdsConfig = EqdsConfig()
    rxe: RxeSpec = RxeSpec()
    jobs: list[JobSpec] = []                     # collectives; when given, `pattern` and `pairs` are not used
    pairs: list[tuple[NodeName, NodeName]] = []
    incast: IncastSpec = IncastSpec()
    flows_per_pair: int = Field(1, ge=1, le=1024)
    qps_per_connection: int = Field(1, ge=1, le=64)   # collectives/replay: each transfer over this many QPs
    flow_size: Optional[Size] = None          # bytes per flow; None = send for `duration`
    rate: Optional[Rate] = None               # per flow; None = host link rate (back-pressured)
    start: Time = 0
    sport: Union[Literal["random", "sequential"], Annotated[int, Field(ge=1, le=65535)]] = "random"
    sport_base: int = Field(20000, ge=1024, le=65000)
    dport: int = Field(5001, ge=1, le=65000)
    packet_size: Optional[int] = Field(None, ge=64, le=9000)   # IP packet size; None = MTU
    dscp: int = Field(0, ge=0, le=63)         # DSCP of every flow's packets (IP_TOS)
    rail_shift: int = Field(0, ge=0, le=7)    # flow on rail r goes to the destination's NIC on rail r + shift
    ecn: Literal["none", "ect0", "ect1"] = "none"   # ECN codepoint UDP senders put on their packets
    load: Optional[float] = Field(None, gt=0, le=1)   # poisson: each host's offered load, share of its link rate
    size_dist: Optional[str] = None           # poisson: websearch | hadoop | alistorage | a CDF file (sizes.py)
    arrival_window: Optional[Time] = None     # poisson: flows arrive this long after `start`; None = half the rest
    replay: Optional[str] = None              # a schedule file (workloads/replay.py); then pattern/jobs unused
    _cc_config: Any = PrivateAttr(None)

    @model_validator(mode="after")
    def _cc(self):
        """``cc`` names a registered CC; ``cc_params`` is validated by that CC's own model (one line naming
        ``traffic.cc_params.<key>``) and, for a built-in, is not given beside its ``traffic.<cc>`` section."""
        if self.cc == "none":
            if self.cc_params:
                raise ValueError("cc_params: parameters given but traffic.cc is 'none'")
            return self
        try:
            cc = roce_cc.get_cc(self.cc)
        except roce_cc.UnknownCC as e:
            raise ValueError(f"@traffic.cc: {e}") from None
        if self.cc_params is None:
            if len(cc.sections) == 1:
                self._cc_config = getattr(self, cc.sections[0])
            elif cc.sections:
                self._cc_config = cc.params_model(**{s: getattr(self, s) for s in cc.sections})
            else:
                self._cc_config = cc.params_model()
            return self
        for sec in cc.sections:
            if getattr(self, sec).model_fields_set:
                raise ValueError(f"cc_params: traffic.{sec} is given too: give {self.cc}'s parameters once")
        try:
            self._cc_config = cc.params_model.model_validate(self.cc_params)
        except ValidationError as e:
            raise ValueError(f"@traffic.cc_params.{_first_error(e)}") from None
        return self

    @property
    def cc_config(self):
        """The selected CC's parameters (its own model): ``cc_params``, or its ``traffic.<cc>`` section."""
        return self._cc_config

    @model_validator(mode="after")
    def _qps(self):
        if self.qps_per_connection > 1 and not (self.jobs or self.replay or self.pattern == "allreduce"):
            raise ValueError("qps_per_connection: splits the transfers of collective jobs and replayed schedules; "
                             "pattern flows use flows_per_pair")
        return self

    @model_validator(mode="after")
    def _replay(self):
        if self.replay is None:
            return self
        if self.jobs:
            raise ValueError("replay: give either a schedule to replay or collective jobs, not both")
        if self.flow_size is not None:
            raise ValueError("flow_size: a replayed schedule gives each transfer's bytes")
        if self.engine == "rxe":
            raise ValueError("engine: a replayed schedule runs on the built-in engines (roce, udp, tcp)")
        if self.rail_shift:
            raise ValueError("rail_shift: a replayed transfer is striped over the rails, as collectives are")
        from .workloads.replay import ReplayError, read
        try:
            read(self.replay)
        except ReplayError as e:
            raise ValueError(f"replay: {e}") from None
        return self

    @model_validator(mode="after")
    def _poisson(self):
        given = [k for k in ("load", "size_dist", "arrival_window") if getattr(self, k) is not None]
        if self.pattern != "poisson":
            if given:
                raise ValueError(f"{given[0]}: applies to pattern 'poisson' only (pattern is {self.pattern!r})")
            return self
        if self.load is None or self.size_dist is None:
            raise ValueError("load: pattern 'poisson' needs load (e.g. 0.5) and size_dist "
                             "(websearch | hadoop | alistorage | FILE)")
        if self.flow_size is not None:
            raise ValueError("flow_size: pattern 'poisson' draws each flow's size from size_dist")
        if self.engine == "rxe":
            raise ValueError("engine: pattern 'poisson' runs on the built-in engines (udp, tcp, roce)")
        from .workloads.sizes import SizeDistError, resolve
        try:
            resolve(self.size_dist)
        except SizeDistError as e:
            raise ValueError(str(e)) from None
        if self.arrival_window is not None and self.arrival_window <= 0:
            raise ValueError("arrival_window: must be > 0")
        return self

    @model_validator(mode="after")
    def _pairs_needed(self):
        if self.pattern == "pairs" and not self.pairs and not self.jobs:
            raise ValueError("pairs: pattern 'pairs' needs a list like [[h0, h1]]")
        if self.pattern == "allreduce" and not self.jobs and self.flow_size is None:
            raise ValueError("flow_size: pattern 'allreduce' needs the buffer size per rank in flow_size")
        if self.engine == "rxe" and self.collective:
            raise ValueError("engine: collectives run on the built-in engines (roce, udp, tcp), not on rxe/perftest")
        if (self.receiver != "gbn" or self.cc != "none") and self.engine not in ("roce",):
            raise ValueError(f"engine: receiver/cc apply to the RoCE engine (engine: roce), got {self.engine!r}")
        for fam in ("nscc", "swift", "timely", "hpcc", "eqds"):      # parameters of a CC that does not run
            given = any(v is not None for v in getattr(self, fam).model_dump().values())
            if given and fam not in self.cc.split("+"):
                raise ValueError(f"{fam}: parameters given but traffic.cc is {self.cc!r}")
        return self

    @property
    def collective(self) -> bool:
        return (bool(self.jobs) or self.pattern == "allreduce") and self.replay is None

    @property
    def scheduled(self) -> bool:
        """Runs as one dependency-driven schedule (workloads/replay.py): a replay or collective jobs."""
        return self.replay is not None or self.collective

    @property
    def wire_dscp(self) -> int:
        """The DSCP the flows' packets carry: ``dscp``, except that RoCE defaults to 26 (AF31, what RoCE NICs
        use) when ``dscp`` is not given."""
        if self.engine in ("roce", "rxe") and "dscp" not in self.model_fields_set:
            return ROCE_DSCP
        return self.dscp

    def job_list(self) -> list[JobSpec]:
        if self.jobs:
            return list(self.jobs)
        return [JobSpec(pattern="allreduce", bytes=self.flow_size)]


class FailureSpec(Strict):
    """One ``failures`` entry: at ``at`` (after the traffic's t0, the instant flows start) a link or a switch
    goes down or up, or a link's rate changes (both directions)."""
    at: Time
    link: Optional[tuple[NodeName, NodeName]] = None
    node: Optional[NodeName] = None
    state: Optional[Literal["down", "up"]] = None
    rate: Optional[Rate] = None

    @model_validator(mode="after")
    def _one_target_one_change(self):
        if (self.link is None) == (self.node is None):
            raise ValueError("link: give either link: [a, b] or node: <switch>, not both or neither")
        if (self.state is None) == (self.rate is None):
            raise ValueError("state: give either state: down|up or rate: <new rate>, not both or neither")
        if self.node is not None and self.rate is not None:
            raise ValueError("rate: applies to a link (a switch has no rate of its own); use link: [a, b]")
        return self

    @property
    def target(self) -> str:
        return "-".join(self.link) if self.link else self.node

    @property
    def change(self) -> str:
        return self.state if self.state else f"rate {self.rate}bit"




class IntSpec(Strict):
    """In-band network telemetry (INT-MD over UDP, docs/int.md): the first switch marks every `sample`-th UDP
    packet of a flow, every switch pushes its hop record, the last switch strips the stack and exports it.
    Links between switches carry `fabric_mtu` (default: the topology's MTU plus the largest stack), so a
    full-sized packet always has room; a packet that would exceed it is not instrumented (counted)."""
    enabled: bool = False
    sample: int = Field(1, ge=1, le=1_000_000)
    max_hops: int = Field(INT_MAX_HOPS, ge=1, le=INT_MAX_HOPS)
    fabric_mtu: Optional[int] = Field(None, ge=576, le=9216)

    def room(self) -> int:
        """Bytes the largest stack adds to a packet."""
        return INT_HEADER_BYTES + self.max_hops * INT_HOP_BYTES


class TelemetrySpec(Strict):
    # builtins.int: the field `int` below shadows the name in this class's (deferred) annotations
    interval: Annotated[builtins.int, *_unit(units.time_ns), Field(ge=10_000_000)] = units.time_ns("100ms")
    int: IntSpec = IntSpec()


class PlacementSpec(Strict):
    """One fabric split over the machines of a Ray cluster (``testbed run|up --cluster``; testbed/cluster/):
    ``partitions`` machines, chosen by ``strategy`` — ``auto`` (METIS: links weighted by rate, nodes by expected
    load, every leaf kept with its hosts), ``by-leaf`` (whole leaf groups) or ``manual`` (``assign``: node →
    machine index 0..partitions−1; a host left out follows its leaf)."""
    partitions: int = Field(2, ge=1, le=64)
    strategy: Literal["auto", "by-leaf", "manual"] = "auto"
    assign: dict[NodeName, Annotated[int, Field(ge=0)]] = {}

    @model_validator(mode="after")
    def _assign_with_manual(self):
        if self.strategy == "manual" and not self.assign:
            raise ValueError("@placement.assign: strategy manual needs assign: {node: machine index, …}")
        if self.strategy != "manual" and self.assign:
            raise ValueError(f"@placement.assign: only with strategy: manual (strategy is {self.strategy})")
        for n, m in self.assign.items():
            if m >= self.partitions:
                raise ValueError(f"@placement.assign.{n}: machine {m} out of range: partitions is {self.partitions} "
                                 f"(machines 0..{self.partitions - 1})")
        return self


class Scenario(Strict):
    name: str = Field("scenario", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    # a fabric architecture's defaults merged under the scenario before validation (testbed/profiles.py)
    profile: Optional[Literal[profiles.NAMES]] = None
    seed: int = Field(1, ge=0)
    duration: Annotated[int, *_unit(units.time_ns), Field(gt=0)] = units.time_ns("5s")
    topology: TopologySpec = TopologySpec()
    switch: SwitchSpec = SwitchSpec()
    hosts: HostsSpec = HostsSpec()
    traffic: TrafficSpec = TrafficSpec()
    telemetry: TelemetrySpec = TelemetrySpec()
    capture: list[NodeName] = []
    failures: list[FailureSpec] = []
    # the scenario is in real units, emulated N times slower (testbed/dilation.py); auto: N from the CPU budget
    time_dilation: Union[Annotated[int, Field(ge=1, le=1_000_000)], Literal["auto"], None] = None
    placement: Optional[PlacementSpec] = None    # one fabric over several machines (with --cluster)
    _profile_keys: tuple[str, ...] = PrivateAttr(default=())
    _dilation: int = PrivateAttr(default=1)
    _real_doc: Optional[dict] = PrivateAttr(default=None)
    _dilated_keys: tuple[str, ...] = PrivateAttr(default=())

    @property
    def dilation(self) -> int:
        """N of a dilated scenario (this one holds the emulated values; ``time_dilation`` is unset in it), else 1."""
        return self._dilation

    @property
    def real_doc(self) -> Optional[dict]:
        """A dilated scenario as written, in real units (None when not dilated)."""
        return self._real_doc

    @property
    def dilated_keys(self) -> tuple[str, ...]:
        """The dotted keys time dilation scaled."""
        return self._dilated_keys

    @property
    def profile_keys(self) -> tuple[str, ...]:
        """The dotted keys ``profile`` filled (the scenario and its overrides left them unset), for the
        manifest; empty without a profile or when built by ``model_validate`` directly."""
        return self._profile_keys

    @model_validator(mode="after")
    def _names_exist(self):
        from .topology import node_names
        names = set(node_names(self.topology))
        where = [("capture", n) for n in self.capture]
        where += [("traffic.pairs", n) for pair in self.traffic.pairs for n in pair]
        where.append(("traffic.incast.receiver", self.traffic.incast.receiver))
        if isinstance(self.traffic.incast.senders, list):
            where += [("traffic.incast.senders", n) for n in self.traffic.incast.senders]
        for i, job in enumerate(self.traffic.jobs):
            where += [(f"traffic.jobs.{i}.hosts", n) for n in job.hosts or []]
        if self.hosts.docker is not None:
            where += [("hosts.docker.per_host", n) for n in self.hosts.docker.per_host]
        if self.placement is not None:
            where += [(f"placement.assign.{n}", n) for n in self.placement.assign]
        if self.traffic.replay is not None:
            from .workloads.replay import check, read
            check(read(self.traffic.replay), {n for n in names if n.startswith("h")},
                  f"@traffic.replay: {self.traffic.replay}")
        for path, n in where:
            if n not in names:
                raise ValueError(f"@{path}: no node {n!r} in this topology "
                                 f"({self.topology.hosts} hosts h0..h{self.topology.hosts - 1})")
        for tier in self.switch.tiers:
            if tier not in self.topology.tiers:
                raise ValueError(f"@switch.tiers.{tier}: this topology has no {tier} switches "
                                 f"(kind {self.topology.kind}: {', '.join(self.topology.tiers)})")
        self._rail_shift_crosses()
        self._pfc_does_something()
        self._shared_buffer_fits()
        self._int_fits()
        self._trim_can_trim()
        self._wcmp_source_fits()
        self._failures_fit()
        self._docker_hosts_fit()
        for a, b in self.traffic.pairs:
            if a == b:
                raise ValueError(f"@traffic.pairs: a flow from {a} to itself never crosses the fabric")
            if not (a.startswith("h") and b.startswith("h")):
                raise ValueError(f"@traffic.pairs: flows run between hosts, got [{a}, {b}]")
        return self

    def _docker_hosts_fit(self) -> None:
        """Container hosts are hosts, and their NICs must stay in the container's namespace."""
        d = self.hosts.docker
        if d is None:
            return
        for n in d.per_host:
            if not n.startswith("h"):
                raise ValueError(f"@hosts.docker.per_host.{n}: {n} is a switch; only hosts are containers")
        if self.traffic.engine == "rxe":
            raise ValueError("@hosts.docker: not with traffic.engine rxe (Soft-RoCE moves the host NICs into the "
                             "initial namespace, out of the containers); use udp, tcp or roce")

    def _rail_shift_crosses(self) -> None:
        """Cross-rail flows need a path between rails, and a shift that is a whole number of rails is none."""
        shift, topo = self.traffic.rail_shift, self.topology
        if not shift:
            return
        if self.traffic.jobs:
            raise ValueError("@traffic.rail_shift: applies to pattern flows; collective jobs run on rail 0")
        if shift % topo.rails == 0:
            raise ValueError(f"@traffic.rail_shift: {shift} is a multiple of topology.rails ({topo.rails}): every "
                             f"flow would stay on its own rail")
        if not topo.rails_share_spines:
            raise ValueError(f"@traffic.rail_shift: cross-rail flows need topology.rails_share_spines: true "
                             f"(separate rail planes are not connected), got {shift}")

    def _shared_buffer_fits(self) -> None:
        """A shared buffer must leave a pool after every lossless ingress's headroom, and credits advertise a
        fixed per-ingress buffer, which a shared pool does not have."""
        sw = self.switch
        if not sw.shared_buffer_on:
            return
        from .topology import build
        topo = build(self.topology)
        for tier in self.topology.tiers:
            q = sw.qos(tier)
            sb = q.shared_buffer
            if sb is None:
                continue
            o = sw.tiers.get(tier)
            where = f"switch.tiers.{tier}.shared_buffer" if o and o.shared_buffer is not None else "switch.shared_buffer"
            if q.credit.enabled:
                raise ValueError(f"@{where}: credit flow control grants a fixed buffer per ingress; a shared buffer "
                                 f"with dynamic thresholds is supported with PFC or lossy queues only")
            ports = max(len(topo.ports[s]) for s in topo.switches if topo.nodes[s].kind == tier)
            reserved = ports * len(q.lossless) * q.headroom
            if sb.size <= reserved + 2 * (self.topology.mtu + 14):
                raise ValueError(f"@{where}.size: {sb.size} bytes leave no shared pool after the headroom reserved "
                                 f"for {ports} ports × {len(q.lossless)} lossless priorities × {q.headroom} bytes "
                                 f"= {reserved} bytes ({tier} switches); raise size or lower headroom")

    def _failures_fit(self) -> None:
        """Every failure names switches or linked nodes of this topology and happens while the traffic runs."""
        if not self.failures:
            return
        from .topology import build, node_names
        names = set(node_names(self.topology))
        linked = None
        if self.traffic.engine == "rxe":
            raise ValueError("@failures: not with traffic.engine rxe (perftest keeps its own clock); use udp, tcp "
                             "or roce")
        for i, f in enumerate(self.failures):
            where = f"failures.{i}"
            if f.at >= self.duration:
                raise ValueError(f"@{where}.at: {f.at / 1e9:g} s is not within the run's duration "
                                 f"({self.duration / 1e9:g} s after the traffic starts)")
            for n in (f.link or (f.node,)):
                if n not in names:
                    raise ValueError(f"@{where}.{'link' if f.link else 'node'}: no node {n!r} in this topology")
            if f.node is not None and f.node.startswith("h"):
                raise ValueError(f"@{where}.node: {f.node} is a host; a node failure takes a switch down "
                                 f"(use link: [{f.node}, <its leaf>] for a host's link)")
            if f.link is not None:
                a, b = f.link
                if a == b:
                    raise ValueError(f"@{where}.link: a link joins two different nodes, got [{a}, {b}]")
                if linked is None:
                    linked = {frozenset((ln.a.node, ln.b.node)) for ln in build(self.topology).links}
                if frozenset((a, b)) not in linked:
                    raise ValueError(f"@{where}.link: {a} and {b} are not linked")
            if f.rate is not None and self.switch.classes_on:
                raise ValueError(f"@{where}.rate: a rate change re-shapes a single-queue port; ports with traffic "
                                 f"classes (switch.traffic_classes / pfc) are not supported")

    @property
    def packet_size(self) -> int:
        """The IP packet size the traffic engines send: `traffic.packet_size`, or the topology's MTU."""
        return self.traffic.packet_size or self.topology.mtu

    @property
    def fabric_mtu(self) -> int:
        """The MTU of links between switches: the topology's, plus room for the largest INT stack when INT is on
        (as fabrics run 9216 under hosts' 9000), unless `telemetry.int.fabric_mtu` says otherwise; at least the
        host links' (`host_mtu`)."""
        i = self.telemetry.int
        if not i.enabled:
            return self.host_mtu
        return max(self.host_mtu, i.fabric_mtu if i.fabric_mtu is not None else self.topology.mtu + i.room())

    @property
    def host_int_hops(self) -> int:
        """Hop records the INT stack of an HPCC flow's data packet gathers (its sender starts the stack, every
        switch of the path adds a record, the receiver echoes them): the switches of the longest path; 0 unless
        `traffic.cc` is hpcc."""
        return self.topology.path_switches if self.traffic.cc == "hpcc" else 0

    @property
    def host_mtu(self) -> int:
        """The MTU of host links: the topology's, plus room for an HPCC flow's INT stack (`host_int_hops`), whose
        bytes travel to the receiving host as real bytes on the links (as HPCC's INT does)."""
        h = self.host_int_hops
        return self.topology.mtu + (INT_HEADER_BYTES + h * INT_HOP_BYTES if h else 0)

    def _wcmp_source_fits(self) -> None:
        """Measured WCMP weights need what they are measured from, and routes the controller may weigh."""
        sw = self.switch
        if sw.load_balancing != "wcmp" or sw.wcmp.source == "static":
            return
        if sw.wcmp.source == "int" and not self.telemetry.int.enabled:
            raise ValueError("@switch.wcmp.source: int weighs paths by their INT delays: set "
                             "telemetry.int.enabled: true (or use source: load)")
        if sw.routing == "sm":
            raise ValueError(f"@switch.wcmp.source: {sw.wcmp.source} weights are set by the WCMP controller on "
                             f"distributed routing's groups; switch.routing: sm programs one port per destination")

    def _int_fits(self) -> None:
        """INT marks the packets that carry a stack with DSCP bit 0 (value 1): traffic that uses odd DSCPs would
        be mistaken for it, and a fabric MTU below the hosts' would drop their full-sized packets. HPCC's stacks
        (host stacks) read consecutive records of one path, so its flows keep one entropy value."""
        i = self.telemetry.int
        hpcc = self.traffic.cc == "hpcc"
        if not i.enabled and not hpcc:
            return
        why = "INT marks" if i.enabled else "traffic.cc hpcc carries INT stacks and marks"
        if hpcc and self.traffic.roce.entropy != "qp":
            raise ValueError(f"@traffic.roce.entropy: hpcc computes each hop's rate from consecutive INT records "
                             f"of one path; entropy {self.traffic.roce.entropy!r} sends a flow's packets over "
                             f"several paths (use qp)")
        if i.enabled and i.fabric_mtu is not None and i.fabric_mtu < self.topology.mtu:
            raise ValueError(f"@telemetry.int.fabric_mtu: {i.fabric_mtu} is below topology.mtu "
                             f"({self.topology.mtu}): links between switches would drop full-sized packets")
        odd = sorted({d for t in self.topology.tiers for d in self.switch.qos(t).traffic_classes.dscp if d & 1})
        if odd:
            raise ValueError(f"@switch.traffic_classes.dscp: {why} instrumented packets with DSCP bit 0, so "
                             f"odd DSCP values ({', '.join(map(str, odd))}) cannot be classified; use even ones")
        if self.traffic.wire_dscp & 1:
            raise ValueError(f"@traffic.dscp: {why} instrumented packets with DSCP bit 0; "
                             f"{self.traffic.wire_dscp} is odd, use an even DSCP")

    def _trim_can_trim(self) -> None:
        """Trimming cuts RoCEv2 data packets of a lossy priority to their BTH: refuse a configuration under which
        it never could (other engines, the traffic lossless or on the trim priority itself), tiers that send
        trimmed headers to different priorities, and INT, whose stack would sit where the BTH is cut."""
        sw, t = self.switch, self.traffic
        on = {tier: sw.qos(tier) for tier in self.topology.tiers if sw.qos(tier).trim.enabled}
        if not on:
            return

        def where(tier: str, key: str) -> str:
            o = sw.tiers.get(tier)
            return f"switch.tiers.{tier}.trim.{key}" if o and o.trim is not None else f"switch.trim.{key}"
        first = next(iter(on))
        prio = on[first].trim.priority
        for tier, q in on.items():
            if q.trim.priority != prio:
                raise ValueError(f"@{where(tier, 'priority')}: trimmed headers go to one priority fabric-wide "
                                 f"(every hop classifies them to it); the {first} switches use {prio}, the {tier} "
                                 f"switches {q.trim.priority}")
            if q.trim.priority in q.lossless:
                raise ValueError(f"@{where(tier, 'priority')}: priority {q.trim.priority} is lossless at the {tier} "
                                 f"switches; trimmed headers need a lossy priority of their own")
        if self.telemetry.int.enabled:
            raise ValueError(f"@{where(first, 'enabled')}: not with telemetry.int.enabled: the INT stack sits "
                             f"between the UDP header and the BTH, where a trim cuts; turn one of them off")
        if t.cc == "hpcc":
            raise ValueError(f"@{where(first, 'enabled')}: not with traffic.cc hpcc: its INT stack sits between "
                             f"the UDP header and the BTH, where a trim cuts; turn trimming off")
        if t.engine != "roce":
            raise ValueError(f"@{where(first, 'enabled')}: trims the built-in RoCE engine's packets (UDP 4791, "
                             f"traffic.engine: roce), whose receiver reads a trimmed header; traffic.engine "
                             f"{t.engine} would have nothing trimmed (or, rxe, cannot use it)")
        d = t.wire_dscp
        for tier, q in on.items():
            tc = q.traffic_classes
            p = tc.dscp.get(d, tc.default)
            if p == q.trim.priority:
                raise ValueError(f"@{where(tier, 'priority')}: the traffic (DSCP {d}) is on priority {p} itself at "
                                 f"the {tier} switches, the queue trimmed headers would join; choose another")
        if all(t_q.traffic_classes.dscp.get(d, t_q.traffic_classes.default) in t_q.lossless for t_q in on.values()):
            q = on[first]
            raise ValueError(f"@{where(first, 'enabled')}: the traffic (DSCP {d} → priority "
                             f"{q.traffic_classes.dscp.get(d, q.traffic_classes.default)}) is lossless wherever "
                             f"trimming is on, so nothing would ever be trimmed; trim a lossy priority")

    def _pfc_does_something(self) -> None:
        """Flow control (PFC or credits) that could never act is a mistake, not a configuration: refuse it with
        the fix. And one tier cannot run both on its lossless priorities."""
        sw, t = self.switch, self.traffic
        on = {tier: sw.qos(tier) for tier in self.topology.tiers if sw.qos(tier).flow_control}
        for tier, q in on.items():
            o = sw.tiers.get(tier)
            if q.pfc.enabled and q.credit.enabled:
                where = f"switch.tiers.{tier}" if o and o.credit is not None else "switch"
                raise ValueError(f"@{where}.credit.enabled: credit-based flow control and PFC would both govern the "
                                 f"lossless priorities of the {tier} switches; enable one of them")
            fc, never = _fc_words(q)
            if not q.traffic_classes.lossless:
                where = f"switch.tiers.{tier}" if o and o.traffic_classes is not None else "switch"
                raise ValueError(f"@{where}.traffic_classes.lossless: {fc} is enabled ({tier} switches) but no "
                                 f"priority is lossless, so it would {never}; make one lossless and send on "
                                 f"it, e.g. {where}.traffic_classes: {{dscp: {{26: 3}}, lossless: [3]}} with "
                                 f"traffic.dscp: 26")
        credit = [tier for tier in self.topology.tiers if sw.qos(tier).credit.enabled]
        if credit:
            maps = {tier: (sw.qos(tier).traffic_classes.dscp, sw.qos(tier).traffic_classes.default)
                    for tier in self.topology.tiers}
            first = self.topology.tiers[0]
            for tier, m in maps.items():
                if m != maps[first]:
                    raise ValueError(f"@switch.tiers.{tier}.traffic_classes: with credit flow control every tier "
                                     f"must map DSCPs to the same priorities as the {first} switches (a receiver "
                                     f"meters the sender's class of its own priority)")
        if on and t.engine != "rxe":
            d = t.wire_dscp
            if all(q.traffic_classes.dscp.get(d, q.traffic_classes.default) not in q.traffic_classes.lossless
                   for q in on.values()):
                q = next(iter(on.values()))
                fc, never = _fc_words(q)
                prio = q.traffic_classes.dscp.get(d, q.traffic_classes.default)
                want = next((k for k, v in q.traffic_classes.dscp.items() if v in q.traffic_classes.lossless), None)
                fix = f"set traffic.dscp: {want}" if want is not None else "map a DSCP to a lossless priority"
                raise ValueError(f"@traffic.dscp: {fc} protects priorities {q.traffic_classes.lossless} but the "
                                 f"traffic (DSCP {d} → priority {prio}) is lossy, so {fc} would {never}; {fix}")


def _fc_words(q: ResolvedQos) -> tuple[str, str]:
    return ("PFC", "never pause anything") if q.pfc.enabled else ("credit flow control", "never meter anything")


# ---------------------------------------------------------------- loading and overrides

_BASE60 = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")


class _Loader(yaml.SafeLoader):
    """Safe YAML without YAML 1.1's base-60 numbers: ``oversubscription: 2:1`` is the text 2:1, not 121."""

    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and implicit[0] and _BASE60.match(value):
            return "tag:yaml.org,2002:str"
        return super().resolve(kind, value, implicit)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def _fmt_error(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[", "union[")))
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if msg.startswith("@"):                      # a model validator naming its own key path
        path, _, msg = msg[1:].partition(": ")
        loc = path
    elif ": " in msg and err["type"] == "value_error" and msg.split(": ", 1)[0].isidentifier():
        sub, _, msg = msg.partition(": ")      # "leaves: ..." raised by a model validator
        loc = f"{loc}.{sub}" if loc else sub
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        sym = {"greater_than_equal": "≥", "less_than_equal": "≤", "greater_than": ">", "less_than": "<"}
        bound = next(iter(err.get("ctx", {}).values()), "?")
        msg = f"must be {sym[err['type']]} {bound}"
    if ("input" in err and err["type"] != "extra_forbidden" and ", got " not in msg
            and not isinstance(err["input"], (dict, list))):
        msg += f", got {err['input']!r}"
    return f"{loc or '<scenario>'}: {msg}"


def set_path(doc: dict, dotted: str, value: Any) -> None:
    """Apply one ``key.path=value`` override to a raw scenario document."""
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(f"{dotted}: {k} is not a section")
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {text!r}: expected key.path=value")
    try:
        value = _yaml(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _first_error(e: ValidationError) -> str:
    errors = e.errors()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _fmt_error(errors[0]) + more


def _show(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _profile_blame(doc: dict, filled: list[str], first: str) -> str:
    """Which keys the profile filled caused the refusal: the refused key itself when the profile filled it, and
    every filled key without which the scenario is valid (e.g. the credits infiniband enables next to an explicit
    switch.pfc.enabled: true)."""
    loc = first.split(": ", 1)[0]
    blamed = []
    for key in filled:
        if key != loc:
            try:
                Scenario.model_validate(profiles.without(doc, key))
            except ValidationError:
                continue
        blamed.append(key)
    if not blamed:
        return ""
    got = "; ".join(f"{k}: {_show(_get(doc, k))}" for k in blamed)
    return (f" ({got} {'was' if len(blamed) == 1 else 'were'} set by profile {doc['profile']}; set "
            f"{'it' if len(blamed) == 1 else 'them'} explicitly to change that)")


def _get(doc: dict, dotted: str) -> Any:
    for k in dotted.split("."):
        doc = doc[k]
    return doc


def from_dict(doc: Any, overrides: tuple[str, ...] = ()) -> Scenario:
    """Validate a raw scenario mapping: overrides applied first, then the profile's defaults merged under the
    result (so ``--set profile=…`` selects the profile and explicit keys still win), then the model."""
    doc = copy.deepcopy(doc) if doc is not None else {}
    if not isinstance(doc, dict):
        raise ScenarioError("<scenario>: the file must be a mapping of keys (topology:, switch:, traffic: …)")
    for text in overrides:
        set_path(doc, *parse_override(text))
    doc, filled = profiles.apply(doc)
    if doc.get("time_dilation") is not None:
        return _emulated(doc, filled)
    try:
        scen = Scenario.model_validate(doc)
    except ValidationError as e:
        first = _first_error(e)
        raise ScenarioError(first + (_profile_blame(doc, filled, first) if filled else "")) from None
    scen._profile_keys = tuple(filled)
    return scen


def _emulated(doc: dict, filled) -> Scenario:
    """A dilated scenario (``time_dilation``): what it states in real units scaled by N (dilation.py), then
    validated — the checks apply to what is emulated. ``real`` keeps the mapping as written."""
    import os
    td = doc["time_dilation"]
    try:
        if td == "auto":
            n = dilation.auto_factor(doc, os.cpu_count() or 1, TopologySpec)
        elif isinstance(td, int) and not isinstance(td, bool) and 1 <= td <= 1_000_000:
            n = td
        else:
            raise ScenarioError(f"time_dilation: a whole number 1..1000000 or auto, got {td!r}")
        scaled, keys = dilation.dilate({k: v for k, v in doc.items() if k != "time_dilation"}, Scenario, n,
                                       frozenset(filled))
        emu = Scenario.model_validate(scaled)
    except ValidationError as e:                  # (a ValueError too: caught first)
        raise ScenarioError(f"{_first_error(e)} (with time_dilation {n}: the emulated value)") from None
    except ValueError as e:                       # DilationError, a quantity that does not parse
        raise ScenarioError(str(e)) from None
    emu._profile_keys, emu._dilation, emu._real_doc, emu._dilated_keys = tuple(filled), n, doc, tuple(keys)
    return emu


def load(path: str | Path, overrides: tuple[str, ...] = ()) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read scenario ({e.strerror})") from None
    try:
        doc = _yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ScenarioError(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    tr = ((doc or {}).get("traffic") or {}) if isinstance(doc, dict) else {}
    for key in ("size_dist", "replay"):                # a CDF or schedule file beside the scenario
        ref = tr.get(key) if isinstance(tr, dict) else None
        if isinstance(ref, str) and not Path(ref).is_absolute() and (path.parent / ref).is_file():
            doc["traffic"][key] = str((path.parent / ref).resolve())
    try:
        scen = from_dict(doc, overrides)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None
    if "name" not in (doc or {}):
        scen = scen.model_copy(update={"name": path.stem[:40]})
    return scen


def to_dict(scen: Scenario, roundtrip: bool = False) -> dict:
    """The scenario as resolved (every default filled in), for the manifest (quantities as integers: bit/s,
    bytes, ns); ``roundtrip``: quantities with their units, so ``from_dict`` reads back the same scenario."""
    return scen.model_dump(mode="json", context={"roundtrip": roundtrip})
