"""Leaf–spine (multi-rail) fabrics: names, links, addresses, host routes and switch FIBs.

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

from .addressing import ADDR_BASE, FIRST_IFINDEX, ip_str, mac_for, rail_block_bits
from .model import FibEntry, HostRoute, Link, Node, Port, Topology


def node_names(spec) -> list[str]:
    hosts = spec.leaves * spec.hosts_per_leaf
    return ([f"h{i}" for i in range(hosts)] + [f"leaf{i}" for i in range(spec.leaves * spec.rails)]
            + [f"spine{i}" for i in range(spec.spines * spec.rails)])


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
        pa = Port(a, a_if, ia, mac_for(ia), b, b_if, ib, mac_for(ib), a_role, nodes[a].kind, ls.rate, ls.buffer,
                  rail, a_addr, ls.delay)
        pb = Port(b, b_if, ib, mac_for(ib), a, a_if, ia, mac_for(ia), b_role, nodes[b].kind, ls.rate, ls.buffer,
                  rail, delay_ns=ls.delay)
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
