"""How many paths each flow took: the distinct uplinks its packets crossed at its source leaf.

The switch program counts, per (switch, 5-tuple), the packets sent through each next hop of the group it chose
from (``Datapath.flow_paths``). A flow is every 5-tuple it sends with — several when RoCE sprays by source
port (``Flow.source_ports``) — so its paths are the union of the egress ports of all of them.
"""
from __future__ import annotations

from ..topology import Topology


def paths_used(topo: Topology, flow_paths, flows, moved: dict[int, set[int]] | None = None) -> dict[int, int]:
    """flow_id → number of distinct uplinks its packets crossed at its source leaf (0 for same-leaf flows).
    ``moved``: flow_id → the source ports the fabric controller gave it (instead of its own)."""
    egress: dict[tuple, set[int]] = {}
    for fp in flow_paths:
        used = {ifx for ifx, n in fp.packets.items() if n > 0}
        egress.setdefault((fp.switch, fp.saddr, fp.daddr, fp.sport, fp.dport, fp.proto), set()).update(used)
    out = {}
    for f in flows:
        leaf = topo.leaf_of(f.src, f.rail)
        if topo.leaf_of(f.dst, f.to_rail) == leaf:
            out[f.flow_id] = 0                 # never leaves its leaf
            continue
        ports: set[int] = set()
        for sport in (moved or {}).get(f.flow_id) or f.source_ports():
            ports |= egress.get((leaf, f.src_addr, f.dst_addr, sport, f.dport, f.ip_proto), set())
        out[f.flow_id] = len(ports)
    return out
