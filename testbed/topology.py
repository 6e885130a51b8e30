"""Leaf–spine (multi-rail) graph and addressing plan — pure data, no kernel calls.

Everything the kernel needs is decided here, so that building the fabric is one batched pass with nothing to
look up: every port gets an interface name, an ifindex that is unique across the whole fabric (so one BPF
program shared by every switch can tell switch and port apart by ``skb->ifindex`` alone) and a fixed MAC.

Naming, numbered from 0 in topology order:
  hosts ``h0..``  leaf by leaf (hosts of host group u are h{u*hosts_per_leaf} …);
  leaves ``leaf0..`` rail-major: leaf{r*leaves + u} is host group u's leaf on rail r;
  spines ``spine0..`` rail-major: spine{r*spines + s}; rails are separate planes.
Interfaces are named after the peer node (a leaf's port to spine1 is ``spine1``); a host's NIC on rail r is
``eth{r}``.

Addresses come from 198.18.0.0/15 (RFC 2544, reserved for network benchmarking). Rail r owns an equal,
aligned block of it; host group u on rail r owns the /24 at offset u*256 in that block; a host is .(slot+1),
its leaf gateway .254. Hosts hold /32 addresses and reach everything through their leaf (a permanent
neighbour entry for the gateway, so there is no ARP in the fabric).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

ADDR_BASE = int(ipaddress.IPv4Address("198.18.0.0"))
ADDR_BITS = 17                      # 198.18.0.0/15
FIRST_IFINDEX = 100                 # leave room for lo and anything the kernel creates itself


def rail_block_bits(rails: int) -> int:
    """Prefix length of one rail's block: rails share the /15 in equal power-of-two blocks."""
    return 32 - ADDR_BITS + (rails - 1).bit_length()


def max_leaves_per_rail(rails: int) -> int:
    return 1 << (32 - rail_block_bits(rails) - 8)


def node_names(spec) -> list[str]:
    hosts = spec.leaves * spec.hosts_per_leaf
    return ([f"h{i}" for i in range(hosts)] + [f"leaf{i}" for i in range(spec.leaves * spec.rails)]
            + [f"spine{i}" for i in range(spec.spines * spec.rails)])


def mac_for(ifindex: int) -> str:
    """Locally administered, derived from the fabric-unique ifindex."""
    return "02:fb:%02x:%02x:%02x:%02x" % ((ifindex >> 24) & 255, (ifindex >> 16) & 255,
                                          (ifindex >> 8) & 255, ifindex & 255)


def ip_str(addr: int) -> str:
    return str(ipaddress.IPv4Address(addr))


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


def build(spec) -> Topology:
    """Lay out the leaf–spine described by a ``TopologySpec`` (see scenario.py)."""
    L, S, H, R = spec.leaves, spec.spines, spec.hosts_per_leaf, spec.rails
    block_bits = rail_block_bits(R)
    nodes: dict[str, Node] = {}
    for h in range(L * H):
        nodes[f"h{h}"] = Node(f"h{h}", "host", h, None, h // H)
    for r in range(R):
        for u in range(L):
            i = r * L + u
            nodes[f"leaf{i}"] = Node(f"leaf{i}", "leaf", i, r, u)
    for r in range(R):
        for s in range(S):
            i = r * S + s
            nodes[f"spine{i}"] = Node(f"spine{i}", "spine", i, r, None)

    topo = Topology(spec=spec, nodes=nodes, links=[], ports={n: [] for n in nodes})
    topo.switch_ids = {n: i for i, n in enumerate(topo.switches)}
    next_ifindex = FIRST_IFINDEX

    def subnet(r: int, u: int) -> int:
        return ADDR_BASE + (r << (32 - block_bits)) + (u << 8)

    def connect(a: str, a_if: str, a_role: str, b: str, b_if: str, b_role: str, tier: str, rail: int,
                a_addr: str | None = None) -> Link:
        nonlocal next_ifindex
        ia, ib = next_ifindex, next_ifindex + 1
        next_ifindex += 2
        ls = spec.host_link if tier == "host" else spec.fabric_link
        pa = Port(a, a_if, ia, mac_for(ia), b, b_if, ib, mac_for(ib), a_role, ls.rate, ls.buffer, rail, a_addr,
                  ls.delay)
        pb = Port(b, b_if, ib, mac_for(ib), a, a_if, ia, mac_for(ia), b_role, ls.rate, ls.buffer, rail,
                  delay_ns=ls.delay)
        topo.ports[a].append(pa)
        topo.ports[b].append(pb)
        link = Link(pa, pb, tier, ls.rate, ls.buffer)
        topo.links.append(link)
        return link

    for r in range(R):
        for u in range(L):
            leaf = f"leaf{r * L + u}"
            net = subnet(r, u)
            for slot in range(H):
                host = f"h{u * H + slot}"
                addr = ip_str(net + slot + 1)
                link = connect(host, f"eth{r}", "nic", leaf, host, "down", "host", r, addr)
                dst = "0.0.0.0/0" if R == 1 else f"{ip_str(ADDR_BASE + (r << (32 - block_bits)))}/{block_bits}"
                topo.routes.append(HostRoute(host, dst, ip_str(net + 254), f"eth{r}", link.a.ifindex,
                                             addr, link.b.mac))
                topo.fib.append(FibEntry(leaf, addr, 32, (link.b.ifindex,)))
            for s in range(S):
                spine = f"spine{r * S + s}"
                link = connect(leaf, spine, "up", spine, leaf, "spine", "fabric", r)
                topo.fib.append(FibEntry(spine, ip_str(net), 24, (link.b.ifindex,)))
            ups = tuple(p.ifindex for p in topo.uplinks(leaf))
            topo.fib.append(FibEntry(leaf, "0.0.0.0", 0, ups))
            topo.fib.append(FibEntry(leaf, ip_str(net), 24, ()))   # unknown local address: drop, no loop

    topo._by_ifindex = {p.ifindex: p for ports in topo.ports.values() for p in ports}
    return topo
