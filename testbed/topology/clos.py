"""Three-tier Clos fabrics: ``clos3`` (pods of leaves and spines under a core layer) and ``fat-tree`` (the
k-ary fat-tree, a clos3 with every shape fixed by k).

Shape: ``pods`` pods, each ``leaves`` edge switches (``leaf*``) with ``hosts`` hosts each and ``spines``
aggregation switches (``spine*``); every leaf links to every spine of its pod. The ``cores`` core switches
(``core*``) are split into ``planes`` equal planes; spine position a of every pod links to every core of plane
a mod planes (planes = 1: every spine to every core; planes = spines: the fat-tree wiring, core c to spine
position c // (cores / planes) of each pod).

fat-tree k: k pods, k/2 leaves of k/2 hosts, k/2 spines per pod, (k/2)² cores in k/2 planes: k³/4 hosts,
5k²/4 switches. ``oversubscription`` a:b keeps u = (k/2)·b/a uplinks per leaf, to spine positions 0..u-1 of
its pod; the spines no leaf reaches — and the cores of their planes — are not built, so a pod has u spines
and there are u·k/2 cores. The leaf tier is then a:b oversubscribed (k/2 hosts, u uplinks; what the report's
uplink metrics measure) and every path stays valley-free: any leaf reaches any spine position of any pod.

Names, numbered from 0 in topology order: hosts ``h{l*hosts + s}`` of leaf l, leaves ``leaf{p*leaves + e}``,
spines ``spine{p*spines + a}``, cores ``core{c}``. Interfaces are named after the peer node; a host's NIC is
``eth0``.

Addresses (198.18.0.0/15): leaf e of pod p owns the /24 at (p·2^b + e)·256, b = bits of leaves − 1, so pod p
owns one aligned block of 2^b /24s. FIBs: a leaf has a /32 per host, an empty group for its /24 and a default
over its uplinks; a spine has its pod's /24s, an empty group for the pod block (an unknown address in the pod
is dropped, not bounced off a core) and a default over its core ports; a core has one entry per pod block over
its ports to that pod.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .addressing import ADDR_BASE, ADDR_BITS, ip_str
from .model import FibEntry, HostRoute, Node, Topology
from .wiring import Wiring


@dataclass(frozen=True)
class Shape:
    pods: int
    leaves: int          # per pod
    spines: int          # per pod
    cores: int
    planes: int
    hosts: int           # per leaf

    @property
    def leaf_bits(self) -> int:
        return (self.leaves - 1).bit_length()

    @property
    def pod_plen(self) -> int:
        return 24 - self.leaf_bits

    @property
    def slash24s(self) -> int:
        """/24 blocks the address plan spends (pods × leaves rounded up to a power of two)."""
        return self.pods << self.leaf_bits

    @property
    def cores_per_plane(self) -> int:
        return self.cores // self.planes


MAX_SLASH24 = 1 << (ADDR_BITS - 8)           # /24s in 198.18.0.0/15


def fat_tree_uplinks(k: int, oversubscription: Fraction) -> Fraction:
    """Uplinks a fat-tree leaf keeps at a:b oversubscription (not necessarily whole: the caller checks)."""
    return Fraction(k // 2) / oversubscription


def shape(spec) -> Shape:
    if spec.kind == "fat-tree":
        half = spec.k // 2
        u = int(fat_tree_uplinks(spec.k, spec.oversubscription_ratio))
        return Shape(pods=spec.k, leaves=half, spines=u, cores=u * half, planes=u, hosts=half)
    return Shape(spec.pods, spec.leaves_per_pod, spec.spines_per_pod, spec.cores, spec.planes, spec.hosts_per_leaf)


def node_names(spec) -> list[str]:
    s = shape(spec)
    leaves = s.pods * s.leaves
    return ([f"h{i}" for i in range(leaves * s.hosts)] + [f"leaf{i}" for i in range(leaves)]
            + [f"spine{i}" for i in range(s.pods * s.spines)] + [f"core{i}" for i in range(s.cores)])


def build(spec) -> Topology:
    """Lay out the clos3 / fat-tree described by a ``TopologySpec`` (see scenario.py)."""
    s = shape(spec)
    nodes: dict[str, Node] = {}
    for p in range(s.pods):
        for e in range(s.leaves):
            leaf = p * s.leaves + e
            for slot in range(s.hosts):
                h = leaf * s.hosts + slot
                nodes[f"h{h}"] = Node(f"h{h}", "host", h, None, leaf, p)
    for p in range(s.pods):
        for e in range(s.leaves):
            i = p * s.leaves + e
            nodes[f"leaf{i}"] = Node(f"leaf{i}", "leaf", i, 0, i, p)
    for p in range(s.pods):
        for a in range(s.spines):
            i = p * s.spines + a
            nodes[f"spine{i}"] = Node(f"spine{i}", "spine", i, 0, None, p)
    for c in range(s.cores):
        nodes[f"core{c}"] = Node(f"core{c}", "core", c, 0, None, None)

    w = Wiring(spec, nodes)
    topo = w.topo
    fib = topo.fib

    def pod_net(p: int) -> int:
        return ADDR_BASE + (p << (8 + s.leaf_bits))

    for p in range(s.pods):
        spines = [f"spine{p * s.spines + a}" for a in range(s.spines)]
        for e in range(s.leaves):
            li = p * s.leaves + e
            leaf, net = f"leaf{li}", pod_net(p) + (e << 8)
            for slot in range(s.hosts):
                host = f"h{li * s.hosts + slot}"
                addr = ip_str(net + slot + 1)
                link = w.connect(host, "eth0", "nic", leaf, host, "down", "host", 0, addr)
                topo.routes.append(HostRoute(host, "0.0.0.0/0", ip_str(net + 254), "eth0", link.a.ifindex, addr,
                                             link.b.mac))
                fib.append(FibEntry(leaf, addr, 32, (link.b.ifindex,)))
            for spine in spines:
                link = w.connect(leaf, spine, "up", spine, leaf, "spine", "fabric", 0)
                fib.append(FibEntry(spine, ip_str(net), 24, (link.b.ifindex,)))
            fib.append(FibEntry(leaf, "0.0.0.0", 0, tuple(p.ifindex for p in topo.uplinks(leaf))))
            fib.append(FibEntry(leaf, ip_str(net), 24, ()))         # unknown local address: drop, no loop
    per_plane = s.cores_per_plane
    down: dict[tuple[str, int], list[int]] = {}                    # (core, pod) → its ports to that pod
    for p in range(s.pods):
        for a in range(s.spines):
            spine = f"spine{p * s.spines + a}"
            plane = a % s.planes
            for c in range(plane * per_plane, (plane + 1) * per_plane):
                core = f"core{c}"
                link = w.connect(spine, core, "spine-up", core, spine, "core", "fabric", 0)
                down.setdefault((core, p), []).append(link.b.ifindex)
            ups = tuple(q.ifindex for q in topo.ports[spine] if q.role == "spine-up")
            fib.append(FibEntry(spine, "0.0.0.0", 0, ups))
            if s.pod_plen < 24:          # (one leaf per pod: its /24 is the pod block)
                fib.append(FibEntry(spine, ip_str(pod_net(p)), s.pod_plen, ()))   # unknown pod address: drop
    for (core, p), ports in down.items():
        fib.append(FibEntry(core, ip_str(pod_net(p)), s.pod_plen, tuple(ports)))
    return w.finish()
