"""HTB class numbering of a port's per-priority classes, and the ``skb->priority`` that selects one.

Kept dependency-free at the package top level (not under ``testbed.fabric``, whose ``__init__`` imports pyroute2)
so the traffic agent (``python -m testbed.workloads.agent``, started once per host per run) can set SO_PRIORITY
without paying for the fabric's imports. testbed/fabric/port.py builds its qdisc handles from these numbers.

Mirrored in C by ebpf/lib/common.h (HTB_MAJOR, HTB_CLASS_BASE: what the switch program writes to
``skb->priority``); change both together.
"""
from __future__ import annotations

HTB_CLASS_BASE = 0x10           # classid 1:(HTB_CLASS_BASE + prio)
HTB_MAJOR = 0x10000             # handle 1: of the HTB root
HTB_ROOT_CLASS = 0x10001        # 1:1, at the link rate, parent of the per-priority classes


def skb_priority(prio: int) -> int:
    """``skb->priority`` / SO_PRIORITY value that selects the HTB class of ``prio`` (classid 1:(0x10 + prio))."""
    return HTB_MAJOR | (HTB_CLASS_BASE + prio)
