"""The ideal completion time of a sized flow on an empty fabric (flows.csv ``ideal_fct_s`` and ``slowdown``).

A flow's FCT is measured from its first packet sent to its last byte delivered (results/README.md). On an empty
fabric, store-and-forward, that takes the first frame's serialisation at every hop plus every hop's delay, and
then the rest of its frames at the path's bottleneck rate:

    ideal = Σ_links (first_frame × 8 / rate + delay) + (wire_bytes − first_frame) × 8 / bottleneck

``wire_bytes`` counts every frame of the flow on the wire: its bytes plus, per packet, the engine's headers
(``framing``) and the 14-byte Ethernet header. The path is the widest one routing allows (the largest bottleneck,
then the fewest hops), so the ideal is a lower bound whichever path the load balancer picks. This is the usual
"size ÷ bottleneck rate + base RTT" made exact for what is measured here: one way, headers included.
"""
from __future__ import annotations

import math

from ..topology.fibwalk import Router
from .engines import ENGINES

ETH_HLEN = 14


def path_ports(topo, router: Router, src: str, dst: str, rail: int = 0, dst_rail: int = 0) -> list:
    """The egress ports of the widest path (then the shortest) from ``src`` to ``dst``: the source NIC first."""
    best, key = None, None
    for nodes in router.paths(src, dst, rail, dst_rail):
        ports = []
        for a, b in zip(nodes, nodes[1:]):
            links = [p for p in topo.ports[a] if p.peer_node == b]
            if a == src:
                links = [p for p in links if p.address == topo.address(src, rail)] or links
            ports.append(max(links, key=lambda p: p.rate_bps))
        k = (min(p.rate_bps for p in ports), -len(ports))
        if key is None or k > key:
            best, key = ports, k
    if best is None:
        raise ValueError(f"no path from {src} to {dst}")
    return best


def ideal_fct_s(size: int, payload: int, header: int, ports) -> float:
    """The formula of the module docstring for ``size`` flow bytes carried ``payload`` per packet with ``header``
    IP-level bytes each, over the links leaving ``ports``."""
    packets = max(1, math.ceil(size / payload))
    first = min(size, payload) + header + ETH_HLEN
    wire = size + packets * (header + ETH_HLEN)
    bottleneck = min(p.rate_bps for p in ports)
    return (sum(first * 8 / p.rate_bps + p.delay_ns / 1e9 for p in ports)
            + (wire - first) * 8 / bottleneck)


class IdealFct:
    """Ideal FCTs of a run's flows, paths cached per (src, dst, rails)."""

    def __init__(self, topo, packet_size: int):
        self.topo, self.packet_size = topo, packet_size
        self.router = Router(topo)
        self._paths: dict[tuple, list] = {}

    def __call__(self, flow) -> float | None:
        """The flow's ideal FCT in seconds; None for a flow without a size (it runs for the duration)."""
        if flow.size_bytes is None or flow.engine not in ENGINES:
            return None
        key = (flow.src, flow.dst, flow.rail, flow.to_rail)
        if key not in self._paths:
            self._paths[key] = path_ports(self.topo, self.router, *key)
        payload, header = ENGINES[flow.engine].framing(self.packet_size, flow.opts)
        return ideal_fct_s(flow.size_bytes, payload, header, self._paths[key])
