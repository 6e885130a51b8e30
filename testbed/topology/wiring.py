"""What every layout shares: ports and links made in creation order, with fabric-unique ifindexes and MACs,
each link shaped by its kind's ``host_link`` / ``fabric_link`` unless ``topology.links`` overrides it.

A layout (leafspine, clos) only decides which nodes exist, which pairs are linked and what each switch
forwards; the numbering and the overrides live here so they cannot differ between layouts.
"""
from __future__ import annotations

from .addressing import FIRST_IFINDEX, mac_for
from .model import Link, Node, Port, Topology


class Wiring:
    def __init__(self, spec, nodes: dict[str, Node]):
        self.spec = spec
        self.topo = Topology(spec=spec, nodes=nodes, links=[], ports={n: [] for n in nodes})
        self.topo.switch_ids = {n: i for i, n in enumerate(self.topo.switches)}
        self._next_ifindex = FIRST_IFINDEX
        self._overrides = {frozenset(o.between): o for o in getattr(spec, "links", ())}

    def connect(self, a: str, a_if: str, a_role: str, b: str, b_if: str, b_role: str, tier: str, rail: int,
                a_addr: str | None = None) -> Link:
        """One veth pair; ``a`` is the end nearer the hosts. Both ends get the link's rate, buffer, delay and
        weight (a ``topology.links`` entry for this pair replaces the keys it gives)."""
        ia, ib = self._next_ifindex, self._next_ifindex + 1
        self._next_ifindex += 2
        ls = self.spec.host_link if tier == "host" else self.spec.fabric_link
        rate, buffer, delay, weight = ls.rate, ls.buffer, ls.delay, 1
        o = self._overrides.get(frozenset((a, b)))
        if o is not None:
            rate = o.rate if o.rate is not None else rate
            buffer = o.buffer if o.buffer is not None else buffer
            delay = o.delay if o.delay is not None else delay
            weight = o.weight if o.weight is not None else weight
        nodes = self.topo.nodes
        pa = Port(a, a_if, ia, mac_for(ia), b, b_if, ib, mac_for(ib), a_role, nodes[a].kind, rate, buffer, rail,
                  a_addr, delay, weight)
        pb = Port(b, b_if, ib, mac_for(ib), a, a_if, ia, mac_for(ia), b_role, nodes[b].kind, rate, buffer, rail,
                  delay_ns=delay, weight=weight)
        self.topo.ports[a].append(pa)
        self.topo.ports[b].append(pb)
        link = Link(pa, pb, tier, rate, buffer, weight)
        self.topo.links.append(link)
        return link

    def finish(self) -> Topology:
        topo = self.topo
        topo._by_ifindex = {p.ifindex: p for ports in topo.ports.values() for p in ports}
        return topo
