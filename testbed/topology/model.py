"""The fabric as data: nodes, ports, links, host routes and switch FIB entries (no kernel calls).

Every port carries what the kernel and the datapath need — interface name, a fabric-unique ifindex (one BPF
program shared by every switch tells switch and port apart by ``skb->ifindex`` alone), a fixed MAC, its tier
and its link's rate, buffer and delay — so building the fabric is one batched pass with nothing to look up.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

#: Switch tiers from the hosts up, named after their nodes: leaf (edge), spine (aggregation in a 3-tier
#: fabric), core. The one list every per-tier setting (``switch.tiers``) and loop over tiers comes from.
TIERS = ("leaf", "spine", "core")
#: Port roles. "up" stays "an edge switch's uplink" in every topology: the report's uplink metrics and the
#: per-flow paths are measured there; a 3-tier fabric's spine→core ports get their own role.
ROLES = {"nic": "host → its leaf", "down": "leaf → host", "up": "leaf → spine", "spine": "spine → leaf",
         "spine-up": "spine → core", "core": "core → spine"}
RT_TABLE_MAIN = 254


@dataclass(frozen=True)
class Node:
    name: str
    kind: str              # "host" | "leaf" | "spine" | "core"
    index: int             # the number in the name
    rail: int | None       # switches: their plane (None: shared by every rail); hosts: None (on every rail)
    group: int | None      # hosts and leaves: host group = the edge switch (leaf-spine: leaf position within
                           # a rail; 3-tier: the leaf's number); spines and cores: None
    pod: int | None = None  # 3-tier fabrics: the pod of hosts, leaves and spines; None elsewhere

    @property
    def is_switch(self) -> bool:
        return self.kind != "host"


@dataclass(frozen=True)
class Port:
    node: str
    ifname: str
    ifindex: int
    mac: str
    peer_node: str
    peer_ifname: str
    peer_ifindex: int
    peer_mac: str
    role: str              # "nic" (host), "down" (leaf→host), "up" (leaf→spine), "spine" (spine→leaf),
                           # "spine-up" (spine→core), "core" (core→spine); see ROLES
    tier: str              # the kind of the node it belongs to: "host" | "leaf" | "spine" | "core"
    rate_bps: int
    buffer_bytes: int
    rail: int
    address: str | None = None   # hosts only: the NIC's /32
    delay_ns: int = 0            # propagation delay of the link leaving this port (netem under the shaper)
    weight: int = 1              # topology.links weight (WCMP's static weights)


@dataclass(frozen=True)
class Link:
    """One veth pair; ``a`` is the end closer to the hosts."""
    a: Port
    b: Port
    tier: str              # "host" | "fabric"
    rate_bps: int
    buffer_bytes: int
    weight: int = 1        # topology.links weight, also on both ports (WCMP)


@dataclass(frozen=True)
class HostRoute:
    node: str
    dst: str               # "0.0.0.0/0" or a rail block
    gateway: str
    ifname: str
    ifindex: int
    prefsrc: str
    gateway_mac: str       # permanent neighbour entry
    table: int = RT_TABLE_MAIN   # routing table (a NIC's own table with rails_share_spines, see HostRule)


@dataclass(frozen=True)
class HostRule:
    """Source-address policy routing: packets from ``src`` use ``table``. With rails sharing the spines a flow
    may go from NIC r to another rail's address; the rule keeps it on the NIC its socket is bound to."""
    node: str
    src: str
    table: int
    priority: int


@dataclass(frozen=True)
class FibEntry:
    """Switch forwarding: destinations in ``prefix/plen`` leave through one of ``ports`` (ifindexes)."""
    switch: str
    prefix: str
    plen: int
    ports: tuple[int, ...]

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.prefix}/{self.plen}")


@dataclass
class Topology:
    spec: object
    nodes: dict[str, Node]
    links: list[Link]
    ports: dict[str, list[Port]] = field(default_factory=dict)      # node → its ports, in creation order
    routes: list[HostRoute] = field(default_factory=list)
    rules: list[HostRule] = field(default_factory=list)
    fib: list[FibEntry] = field(default_factory=list)
    switch_ids: dict[str, int] = field(default_factory=dict)        # switch → small integer id for BPF maps

    @property
    def hosts(self) -> list[str]:
        return [n for n, v in self.nodes.items() if v.kind == "host"]

    @property
    def switches(self) -> list[str]:
        return [n for n, v in self.nodes.items() if v.is_switch]

    def port(self, ifindex: int) -> Port:
        return self._by_ifindex[ifindex]

    def port_named(self, node: str, ifname: str) -> Port:
        return next(p for p in self.ports[node] if p.ifname == ifname)

    def address(self, host: str, rail: int = 0) -> str:
        return self.port_named(host, f"eth{rail}").address

    @property
    def tiers(self) -> tuple[str, ...]:
        """The switch tiers this topology has, hosts upwards (a subset of TIERS)."""
        kinds = {v.kind for v in self.nodes.values()}
        return tuple(t for t in TIERS if t in kinds)

    def uplinks(self, leaf: str) -> list[Port]:
        """An edge (leaf) switch's ports towards the next tier up: what ECMP spreads over and the report counts."""
        return [p for p in self.ports[leaf] if p.role == "up"]

    def leaf_of(self, host: str, rail: int = 0) -> str:
        return self.port_named(host, f"eth{rail}").peer_node

    def restrict(self, nodes) -> "Topology":
        """The part of this fabric one machine builds (testbed/cluster/): only ``nodes`` with their ports, host
        routes and FIB entries, and only the links between two of them — a link to a node outside becomes a
        VXLAN port of the same name, ifindex and MAC there. Switch ids stay the fabric's, and every port of
        the whole fabric can still be looked up (``port``): the peer of a cut port lives on another machine."""
        keep = set(nodes)
        part = Topology(self.spec, {n: v for n, v in self.nodes.items() if n in keep},
                        [ln for ln in self.links if ln.a.node in keep and ln.b.node in keep],
                        {n: ps for n, ps in self.ports.items() if n in keep},
                        [r for r in self.routes if r.node in keep], [r for r in self.rules if r.node in keep],
                        [e for e in self.fib if e.switch in keep], dict(self.switch_ids))
        part._by_ifindex = self._by_ifindex
        return part

    def __post_init__(self):
        self._by_ifindex = {}
