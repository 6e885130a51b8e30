"""The eBPF switching datapath: one BCC-compiled tc ingress program that serves every switch port.

``Datapath(topo, switch_spec, ports).load()`` compiles ebpf/switch.c, loads its ingress function as a SCHED_CLS
program and fills the maps from the topology; the fabric then attaches ``ingress_fd`` (cls_bpf, direct-action)
on the clsact ingress of every switch port. Because ports have fabric-unique ifindexes, one program and one set
of maps serve all switches: the port map tells which switch a packet arrived at.

Maps (names as in ebpf/lib/maps.h): ``ports`` (array by ifindex → switch id, MACs), ``fib`` (LPM trie keyed by
switch id + IPv4 destination → next-hop group), ``sw_config`` (array by switch id → mode, seed, flowlet
timeout, spray kind, adaptive and DLB parameters), ``rr_next`` (round-robin counters), ``flows`` (LRU by
switch + 5-tuple → flowlet state and packets per next-hop slot), ``port_stats`` (per-CPU array by ifindex),
``drop_reason_counts`` (per-CPU array), ``port_down`` (by ifindex: 1 when the port lost its link; every egress
choice skips it). With ``switch.routing: sm`` the FIB starts empty: the subnet manager (routing/manager.py)
writes a /32 per destination host.
Congestion and flow control (ebpf/lib/qos.h; read from user space through queue_model.py): ``qos_config`` (per
switch: DSCP → priority, lossless and ECN curves, Xoff, trimming: lib/trim.h), ``port_qos`` (per port: drain rate, buffer, limits),
``vq`` (per (port, priority): the queue model, under a spin lock), ``egress_paused`` (when a paused queue
stopped draining), ``ingress_state`` (PFC accounting per ingress, under a spin lock), ``queue_stats`` /
``queue_max`` (per-CPU counters, with the trims of switch.trim), ``pfc_events`` (ring buffer to the PFC agent), ``pfc_stats`` (the agent's
counters). User space changes the model only through the control program ``ftb_ctl`` (``Datapath.control``).
Load balancing ``plugin`` (``Datapath(plugin=LbPlugin(...))``, built by testbed/lb/plugin.py): the plugin's header
is compiled in at ebpf/lb/plugin.h's place and ``plugin_params`` holds its parameters by index.
"""
from __future__ import annotations

from ..errors import DatapathError
from ..fabric.port import N_PRIO
from .forwarding import fill_group
from .names import (ADAPTIVE_MODES, ADAPTIVE_STAGE, AR_GRANULARITY, AR_METRICS, CONTROL_PROGRAM, DROP_REASONS,
                    HOST_PROGRAM, INT_STAGE, INT_STATS, MIN_MAX_NH, MODES, NIC_RELEASE, PORT_EDGE, PORT_VALID,
                    PROGRAM, SPRAY_KINDS, STAGES, WCMP_GRANULARITY)
from .program import Datapath
from .records import FlowPath, PortCounters, QueueCounters
from .source import LbPlugin

__all__ = ["ADAPTIVE_MODES", "ADAPTIVE_STAGE", "AR_GRANULARITY", "AR_METRICS", "CONTROL_PROGRAM", "DROP_REASONS",
           "Datapath", "DatapathError", "FlowPath", "HOST_PROGRAM", "INT_STAGE", "INT_STATS", "LbPlugin", "MIN_MAX_NH",
           "MODES", "NIC_RELEASE", "N_PRIO", "PORT_EDGE", "PORT_VALID", "PROGRAM", "PortCounters", "QueueCounters",
           "SPRAY_KINDS", "STAGES", "WCMP_GRANULARITY", "fill_group"]
