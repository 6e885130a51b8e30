"""The subnet manager's forwarding tables computed without building a fabric, as InfiniBand users read them with
``dump_lfts``/``ibroute``: one row per (switch, destination) with its egress port, and how many destinations
each switch port carries. The same functions as the running SM (``algorithms.graph`` + ``compute``), so what
``testbed routes`` prints is what a run with ``switch.routing: sm`` programs."""
from __future__ import annotations

from collections import Counter

from ..errors import TestbedError
from ..topology.model import Topology
from . import algorithms


class RoutesError(TestbedError):
    """A ``--down`` link that the topology does not have (one line)."""


def down_ports(topo: Topology, links: list[str]) -> frozenset[int]:
    """Both ends' ifindexes of every ``A-B`` link (switches or a host and its leaf)."""
    pairs = {frozenset((ln.a.node, ln.b.node)): ln for ln in topo.links}
    out: set[int] = set()
    for text in links:
        a, sep, b = text.partition("-")
        if not sep or not a or not b:
            raise RoutesError(f"--down {text}: give a link as A-B, e.g. leaf0-spine0")
        ln = pairs.get(frozenset((a, b)))
        if ln is None:
            raise RoutesError(f"--down {text}: {a} and {b} are not linked in this topology")
        out |= {ln.a.ifindex, ln.b.ifindex}
    return frozenset(out)


def tables(topo: Topology, engine: str, down: frozenset[int] = frozenset(),
           multipath: bool = False) -> algorithms.Tables:
    """The SM's tables for the fabric with the ports ``down`` (computed afresh, as after any change)."""
    return algorithms.compute(engine, algorithms.graph(topo, down), multipath=multipath)


def route_rows(topo: Topology, tabs: algorithms.Tables) -> list[dict]:
    """``switch, destination, port`` (the egress interface, named after its peer), then the destination host,
    the peer the port leads to, its ifindex and the other ports a load balancer may use (multipath)."""
    host_of = {p.address: h for h in topo.hosts for p in topo.ports[h] if p.address}
    rows = []
    for (sw, addr), ports in sorted(tabs.items(), key=lambda kv: (topo.switch_ids[kv[0][0]], kv[0][1])):
        p = topo.port(ports[0])
        rows.append({"switch": sw, "destination": addr, "port": p.ifname, "host": host_of.get(addr),
                     "peer": p.peer_node, "ifindex": p.ifindex,
                     "alternates": " ".join(topo.port(i).ifname for i in ports[1:])})
    return rows


def link_rows(topo: Topology, tabs: algorithms.Tables) -> list[dict]:
    """Every switch port to another switch, with the destinations it is the SM's choice for (``routes``)."""
    load = Counter(ports[0] for ports in tabs.values())
    return [{"switch": sw, "port": p.ifname, "peer": p.peer_node, "role": p.role, "routes": load[p.ifindex]}
            for sw in topo.switches for p in topo.ports[sw] if topo.nodes[p.peer_node].is_switch]
