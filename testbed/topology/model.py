"""The fabric as data: nodes, ports, links, host routes and switch FIB entries (no kernel calls).

Every port carries what the kernel and the datapath need — interface name, a fabric-unique ifindex (one BPF
program shared by every switch tells switch and port apart by ``skb->ifindex`` alone), a fixed MAC, its tier
and its link's rate, buffer and delay — so building the fabric is one batched pass with nothing to look up.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Node:
    name: str
    kind: str              # "host" | "leaf" | "spine"
    index: int             # the number in the name
    rail: int | None       # switches: their plane; hosts: None (they sit on every rail)
    group: int | None      # hosts and leaves: host group (leaf position within a rail); spines: None

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
    role: str              # "nic" (host), "down" (leaf→host), "up" (leaf→spine), "spine" (spine→leaf)
    tier: str              # the kind of the node it belongs to: "host" | "leaf" | "spine"
    rate_bps: int
    buffer_bytes: int
    rail: int
    address: str | None = None   # hosts only: the NIC's /32
    delay_ns: int = 0            # propagation delay of the link leaving this port (netem under the shaper)


@dataclass(frozen=True)
class Link:
    """One veth pair; ``a`` is the end closer to the hosts."""
    a: Port
    b: Port
    tier: str              # "host" | "fabric"
    rate_bps: int
    buffer_bytes: int


@dataclass(frozen=True)
class HostRoute:
    node: str
    dst: str               # "0.0.0.0/0" or a rail block
    gateway: str
    ifname: str
    ifindex: int
    prefsrc: str
    gateway_mac: str       # permanent neighbour entry


@dataclass(frozen=True)
class FibEntry:
    """Switch forwarding: destinations in ``prefix/plen`` leave through one of ``ports`` (ifindexes)."""
    switch: str
    prefix: str
    plen: int
    ports: tuple[int, ...]


@dataclass
class Topology:
    spec: object
    nodes: dict[str, Node]
    links: list[Link]
    ports: dict[str, list[Port]] = field(default_factory=dict)      # node → its ports, in creation order
    routes: list[HostRoute] = field(default_factory=list)
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

    def uplinks(self, leaf: str) -> list[Port]:
        return [p for p in self.ports[leaf] if p.role == "up"]

    def leaf_of(self, host: str, rail: int = 0) -> str:
        return self.port_named(host, f"eth{rail}").peer_node

    def __post_init__(self):
        self._by_ifindex = {}
