"""Leaf–spine (multi-rail) fabrics: names, links, addresses, host routes and switch FIBs.

Everything the kernel needs is decided here, so that building the fabric is one batched pass with nothing to
look up: every port gets an interface name, an ifindex that is unique across the whole fabric (so one BPF
program shared by every switch can tell switch and port apart by ``skb->ifindex`` alone) and a fixed MAC.

Naming, numbered from 0 in topology order:
  hosts ``h0..``  leaf by leaf (hosts of host group u are h{u*hosts_per_leaf} …);
  leaves ``leaf0..`` rail-major: leaf{r*leaves + u} is host group u's leaf on rail r;
  spines ``spine0..`` rail-major: spine{r*spines + s}; rails are separate planes — or, with
  ``rails_share_spines``, one layer ``spine0..spine{spines-1}`` that every rail's leaves connect to (NVIDIA
  SuperPOD style: same-rail traffic stays on its rail's leaves, cross-rail traffic goes leaf→spine→leaf).
Interfaces are named after the peer node (a leaf's port to spine1 is ``spine1``); a host's NIC on rail r is
``eth{r}``.

Addresses come from 198.18.0.0/15 (RFC 2544, reserved for network benchmarking). Rail r owns an equal,
aligned block of it; host group u on rail r owns the /24 at offset u*256 in that block; a host is .(slot+1),
its leaf gateway .254. Hosts hold /32 addresses and reach everything through their leaf (a permanent
neighbour entry for the gateway, so there is no ARP in the fabric). With shared spines a host also routes by
source address (one table per NIC), so a socket bound to its rail-r address leaves on NIC r whatever rail the
destination is on.
"""
from __future__ import annotations

from .addressing import ADDR_BASE, ADDR_BITS, ip_str, rail_block_bits
from .model import FibEntry, HostRoute, HostRule, Node, Topology
from .wiring import Wiring

NIC_TABLE_BASE = 100        # rails_share_spines: NIC r's routing table
NIC_RULE_PRIORITY = 1000    # after the local table (0), before main (32766)


def _shared(spec) -> bool:
    return bool(getattr(spec, "rails_share_spines", False))


def spine_count(spec) -> int:
    return spec.spines if _shared(spec) else spec.spines * spec.rails


def node_names(spec) -> list[str]:
    hosts = spec.leaves * spec.hosts_per_leaf
    return ([f"h{i}" for i in range(hosts)] + [f"leaf{i}" for i in range(spec.leaves * spec.rails)]
            + [f"spine{i}" for i in range(spine_count(spec))])


def build(spec) -> Topology:
    """Lay out the leaf–spine described by a ``TopologySpec`` (see scenario.py)."""
    L, S, H, R = spec.leaves, spec.spines, spec.hosts_per_leaf, spec.rails
    shared = _shared(spec)
    block_bits = rail_block_bits(R)
    nodes: dict[str, Node] = {}
    for h in range(L * H):
        nodes[f"h{h}"] = Node(f"h{h}", "host", h, None, h // H)
    for r in range(R):
        for u in range(L):
            i = r * L + u
            nodes[f"leaf{i}"] = Node(f"leaf{i}", "leaf", i, r, u)
    for i in range(spine_count(spec)):
        nodes[f"spine{i}"] = Node(f"spine{i}", "spine", i, None if shared else i // S, None)

    w = Wiring(spec, nodes)
    topo = w.topo

    def subnet(r: int, u: int) -> int:
        return ADDR_BASE + (r << (32 - block_bits)) + (u << 8)

    for r in range(R):
        for u in range(L):
            leaf = f"leaf{r * L + u}"
            net = subnet(r, u)
            for slot in range(H):
                host = f"h{u * H + slot}"
                addr = ip_str(net + slot + 1)
                link = w.connect(host, f"eth{r}", "nic", leaf, host, "down", "host", r, addr)
                dst = "0.0.0.0/0" if R == 1 else f"{ip_str(ADDR_BASE + (r << (32 - block_bits)))}/{block_bits}"
                gw = ip_str(net + 254)
                topo.routes.append(HostRoute(host, dst, gw, f"eth{r}", link.a.ifindex, addr, link.b.mac))
                if shared and R > 1:
                    table = NIC_TABLE_BASE + r
                    topo.routes.append(HostRoute(host, f"{ip_str(ADDR_BASE)}/{32 - ADDR_BITS}", gw, f"eth{r}",
                                                 link.a.ifindex, addr, link.b.mac, table))
                    topo.rules.append(HostRule(host, addr, table, NIC_RULE_PRIORITY))
                topo.fib.append(FibEntry(leaf, addr, 32, (link.b.ifindex,)))
            for s in range(S):
                spine = f"spine{s if shared else r * S + s}"
                link = w.connect(leaf, spine, "up", spine, leaf, "spine", "fabric", r)
                topo.fib.append(FibEntry(spine, ip_str(net), 24, (link.b.ifindex,)))
            ups = tuple(p.ifindex for p in topo.uplinks(leaf))
            topo.fib.append(FibEntry(leaf, "0.0.0.0", 0, ups))
            topo.fib.append(FibEntry(leaf, ip_str(net), 24, ()))   # unknown local address: drop, no loop
    return w.finish()
