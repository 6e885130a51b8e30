"""Topologies as pure data: which nodes exist, how they are linked and addressed, what every switch forwards.

``build(spec)`` lays out the topology a ``TopologySpec`` describes (``kind``: ``leaf-spine`` in leafspine.py,
``clos3`` and ``fat-tree`` in clos.py); the result (``model.Topology``) is all the fabric builder, the datapath
and the workloads need. Nothing here touches the kernel.
"""
from __future__ import annotations

from . import clos, leafspine
from .addressing import ADDR_BASE, ADDR_BITS, FIRST_IFINDEX, ip_str, mac_for, max_leaves_per_rail, rail_block_bits
from .model import RT_TABLE_MAIN, ROLES, TIERS, FibEntry, HostRoute, HostRule, Link, Node, Port, Topology

_KINDS = {"leaf-spine": leafspine, "clos3": clos, "fat-tree": clos}


def _kind(spec):
    return _KINDS[spec.kind]


def node_names(spec) -> list[str]:
    """Every node name the spec gives, in topology order (hosts, then switches tier by tier)."""
    return _kind(spec).node_names(spec)


def build(spec) -> Topology:
    """Lay out the topology described by a ``TopologySpec`` (see scenario.py)."""
    return _kind(spec).build(spec)


__all__ = ["ADDR_BASE", "ADDR_BITS", "FIRST_IFINDEX", "RT_TABLE_MAIN", "ROLES", "TIERS", "FibEntry", "HostRoute",
           "HostRule", "Link", "Node", "Port", "Topology", "build", "ip_str", "mac_for", "max_leaves_per_rail",
           "node_names", "rail_block_bits"]
