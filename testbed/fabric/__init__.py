"""The fabric: a topology built into the kernel: namespaces, veth pairs, shaping qdiscs, addresses, routes.

One pass per phase, one batched netlink socket per namespace (see netlink.py), nothing looked up: the topology
already fixed every name, ifindex and MAC. Every namespace is ``ftb-<lab>-<node>``; the fabric touches nothing
outside the namespaces it made, and ``teardown()`` (always called by the lab) removes them, which frees the
veths, qdiscs and attached BPF programs with them.
"""
from __future__ import annotations

from . import netns
from .builder import EGRESS_BLOCK, INGRESS_BLOCK, Fabric, FabricError, Tunnel, ns_name
from .offloads import OFFLOAD_FEATURES, ethtool, feature_names, offloads_off_request
from .port import PortConfig, port_configs

__all__ = ["EGRESS_BLOCK", "INGRESS_BLOCK", "OFFLOAD_FEATURES", "Fabric", "FabricError", "PortConfig", "Tunnel",
           "ethtool", "feature_names", "netns", "ns_name", "offloads_off_request", "port_configs"]
