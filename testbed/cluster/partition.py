"""Which machine builds which node of a fabric (``placement``): pure, no Ray, no kernel.

Hosts always stay with their leaf (a host link never crosses machines: the host's NIC release, PFC pause
obedience and offloads are set on the leaf's side of it); with several rails a host ties its leaves together.
So the unit of placement is a *leaf group* (leaves sharing hosts, with those hosts) or a lone spine or core.

- ``auto``: METIS (pymetis) on the graph of those units: edges weighted by link rate (kbit/s), units by their
  expected load — the rates of every port they hold, which is what their CPU forwards at most;
- ``by-leaf``: leaf groups in order, split into ``partitions`` contiguous blocks; spines with their pod's leaves
  (3-tier) or in contiguous blocks (leaf–spine), cores in contiguous blocks;
- ``manual``: ``assign`` gives every switch a machine index; a host left out follows its leaf.

A link whose ends land on two machines is *cut*: each end becomes a VXLAN device (one VNI per link).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import ClusterError

VXLAN_OVERHEAD = 50          # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8 bytes
VNI_BASE = 4096              # VNIs of cut links: a base (a multiple of this) + the link's number among the cut


class PlacementError(ClusterError):
    """A placement that cannot be built; one line naming the key."""


@dataclass(frozen=True)
class CutLink:
    """A link between two machines: ``a`` is the end nearer the hosts, as in the topology."""
    vni: int
    a_node: str
    a_ifname: str
    a_ifindex: int
    a_machine: int
    b_node: str
    b_ifname: str
    b_ifindex: int
    b_machine: int
    rate_bps: int

    def as_dict(self) -> dict:
        return {"vni": self.vni, "a": f"{self.a_node}/{self.a_ifname}", "b": f"{self.b_node}/{self.b_ifname}",
                "a_machine": self.a_machine, "b_machine": self.b_machine, "rate_bps": self.rate_bps}


@dataclass
class Partition:
    parts: int
    of: dict[str, int]                     # node → machine index
    cut: list[CutLink] = field(default_factory=list)
    strategy: str = "auto"

    def nodes(self, machine: int) -> list[str]:
        return [n for n, m in self.of.items() if m == machine]

    def cut_rate_bps(self, machine: int) -> int:
        """What the cut links of one machine may carry out of it at most (one direction)."""
        return sum(c.rate_bps for c in self.cut if machine in (c.a_machine, c.b_machine))


def units(topo) -> list[list[str]]:
    """Placement units: each leaf group (leaves tied by shared hosts, with those hosts), then every spine and
    core alone — in topology order."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for h in topo.hosts:
        for p in topo.ports[h]:
            parent[find(p.peer_node)] = find(h)
    groups: dict[str, list[str]] = {}
    for n, v in topo.nodes.items():
        if v.kind in ("host", "leaf"):
            groups.setdefault(find(n), []).append(n)
    out = sorted(groups.values(), key=lambda g: min(topo.nodes[n].index for n in g if topo.nodes[n].kind == "leaf")
                 if any(topo.nodes[n].kind == "leaf" for n in g) else 0)
    out += [[n] for n, v in topo.nodes.items() if v.kind in ("spine", "core")]
    return out


def load_of(topo, nodes: list[str]) -> int:
    """Expected load of a unit: the summed rates (kbit/s) of every port it holds."""
    return max(1, sum(p.rate_bps for n in nodes for p in topo.ports[n]) // 1000)


def _metis(topo, us: list[list[str]], parts: int) -> list[int]:
    try:
        import pymetis
    except ImportError:
        raise PlacementError("placement.strategy: auto needs pymetis (`pip install '.[cluster]'`, or `testbed "
                             "cluster up` installs it)") from None
    unit_of = {n: i for i, u in enumerate(us) for n in u}
    weights: list[dict[int, int]] = [{} for _ in us]
    for ln in topo.links:
        a, b = unit_of[ln.a.node], unit_of[ln.b.node]
        if a != b:
            w = max(1, ln.rate_bps // 1000)
            weights[a][b] = weights[a].get(b, 0) + w
            weights[b][a] = weights[b].get(a, 0) + w
    xadj, adjncy, eweights = [0], [], []
    for nb in weights:
        for j in sorted(nb):
            adjncy.append(j)
            eweights.append(nb[j])
        xadj.append(len(adjncy))
    vweights = [load_of(topo, u) for u in us]
    _, membership = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights,
                                       eweights=eweights)
    return list(membership)


def _blocks(n: int, parts: int) -> list[int]:
    """Item i of n → block i·parts // n: contiguous, sizes differing by at most one."""
    return [i * parts // n for i in range(n)]


def partition(topo, spec, vni_base: int = VNI_BASE) -> Partition:
    """Place every node of ``topo`` on one of ``spec.partitions`` machines (spec: scenario.PlacementSpec); cut
    link n gets VNI ``vni_base + n``."""
    parts = spec.partitions
    us = units(topo)
    of: dict[str, int] = {}
    if parts == 1:
        of = {n: 0 for n in topo.nodes}
    elif spec.strategy == "auto":
        if len(us) < parts:
            raise PlacementError(f"placement.partitions: {parts} machines, but this fabric has only {len(us)} "
                                 f"placement units (leaf groups with their hosts, spines, cores)")
        for u, m in zip(us, _metis(topo, us, parts)):
            for n in u:
                of[n] = m
    elif spec.strategy == "by-leaf":
        leafy = [u for u in us if topo.nodes[u[0]].kind in ("host", "leaf")]
        if len(leafy) < parts:
            raise PlacementError(f"placement.partitions: {parts} machines, but by-leaf has only {len(leafy)} "
                                 f"leaf groups to place")
        for u, m in zip(leafy, _blocks(len(leafy), parts)):
            for n in u:
                of[n] = m
        spines = [n for n in topo.nodes if topo.nodes[n].kind == "spine"]
        cores = [n for n in topo.nodes if topo.nodes[n].kind == "core"]
        if cores:                       # 3-tier: a spine goes with the leaves of its pod
            pod_machine = {topo.nodes[n].pod: m for n, m in of.items() if topo.nodes[n].kind == "leaf"}
            for s in spines:
                of[s] = pod_machine.get(topo.nodes[s].pod, 0)
            for c, m in zip(cores, _blocks(len(cores), parts)):
                of[c] = m
        else:
            for s, m in zip(spines, _blocks(len(spines), parts)):
                of[s] = m
    else:                               # manual
        for n, m in spec.assign.items():
            of[n] = m
        missing = [s for s in topo.switches if s not in of]
        if missing:
            raise PlacementError(f"placement.assign: {missing[0]} is on no machine (strategy manual places every "
                                 f"switch; {len(missing)} unassigned)")
        for h in topo.hosts:
            leaves = [p.peer_node for p in topo.ports[h]]
            where = {of[x] for x in leaves}
            if len(where) > 1:
                raise PlacementError(f"placement.assign: {h}'s leaves {', '.join(leaves)} are on machines "
                                     f"{sorted(where)}: a host stays with its leaves")
            if h in of and of[h] not in where:
                raise PlacementError(f"placement.assign.{h}: machine {of[h]}, but its leaf {leaves[0]} is on "
                                     f"machine {of[leaves[0]]}: a host stays with its leaf")
            of[h] = where.pop()
    empty = [m for m in range(parts) if m not in set(of.values())]
    if empty:
        raise PlacementError(f"placement: machine {empty[0]} of {parts} got no node ({spec.strategy}); use fewer "
                             f"partitions or strategy manual")
    cut = []
    for ln in topo.links:
        ma, mb = of[ln.a.node], of[ln.b.node]
        if ma != mb:
            cut.append(CutLink(vni_base + len(cut), ln.a.node, ln.a.ifname, ln.a.ifindex, ma, ln.b.node,
                               ln.b.ifname, ln.b.ifindex, mb, ln.rate_bps))
    return Partition(parts, {n: of[n] for n in topo.nodes}, cut, spec.strategy)


def check_underlay(part: Partition, fabric_mtu: int, underlay: list[tuple[int, int | None]]) -> list[str]:
    """Before building: refuse (PlacementError) when a cut link's frames cannot cross a machine's underlay —
    the fabric MTU + 50 bytes of VXLAN exceed its MTU; return warnings for machines whose cut links may carry
    more than their underlay's rate. ``underlay``: per machine (MTU, rate in bit/s or None when unknown)."""
    warnings = []
    for m, (mtu, rate) in enumerate(underlay):
        if not any(m in (c.a_machine, c.b_machine) for c in part.cut):
            continue
        if fabric_mtu + VXLAN_OVERHEAD > mtu:
            raise PlacementError(f"placement: machine {m}'s underlay MTU is {mtu}, but cut links carry "
                                 f"{fabric_mtu}-byte packets + {VXLAN_OVERHEAD} bytes of VXLAN = "
                                 f"{fabric_mtu + VXLAN_OVERHEAD}; raise the underlay MTU or lower topology.mtu")
        need = part.cut_rate_bps(m)
        if rate and need > rate:
            warnings.append(f"placement: the cut links of machine {m} may carry {need / 1e6:g} Mbit/s, more than "
                            f"its underlay's {rate / 1e6:g} Mbit/s: they may be slower than their rate")
    return warnings


__all__ = ["CutLink", "Partition", "PlacementError", "VXLAN_OVERHEAD", "check_underlay", "partition", "units"]
