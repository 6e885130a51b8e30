"""Cross-field checks of the failure schedule against the topology and the traffic.

Each function takes the whole scenario and raises ValueError("@key.path: why") for the scenario loader to
turn into one line."""
from __future__ import annotations

from ..topology import build, node_names


def failures_fit(scen) -> None:
    """Every failure names switches or linked nodes of this topology and happens while the traffic runs."""
    if not scen.failures:
        return

    names = set(node_names(scen.topology))
    linked = None
    if scen.traffic.engine == "rxe":
        raise ValueError("@failures: not with traffic.engine rxe (perftest keeps its own clock); use udp, tcp "
                         "or roce")
    for i, f in enumerate(scen.failures):
        where = f"failures.{i}"
        if f.at >= scen.duration:
            raise ValueError(f"@{where}.at: {f.at / 1e9:g} s is not within the run's duration "
                             f"({scen.duration / 1e9:g} s after the traffic starts)")
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
                linked = {frozenset((ln.a.node, ln.b.node)) for ln in build(scen.topology).links}
            if frozenset((a, b)) not in linked:
                raise ValueError(f"@{where}.link: {a} and {b} are not linked")
        if f.rate is not None and scen.switch.classes_on:
            raise ValueError(f"@{where}.rate: a rate change re-shapes a single-queue port; ports with traffic "
                             f"classes (switch.traffic_classes / pfc) are not supported")
