"""Beyond one machine, on Ray: sweeps whose runs go to free machines, and one fabric split over several machines.

Ray does what a hand-rolled SSH loop would: cluster membership, placing an actor on a chosen node, moving results
back and noticing a dead node. A *machine* is a Ray node that offers the custom resource ``ftb_machine`` (one
run or one fabric part at a time needs the machine's cores); the driver (``testbed run|sweep|up --cluster``)
runs on a Ray node of its own or on one of the machines. Modules: ``nodes`` (joining Ray, the machines, pinning work to one), ``local`` (a cluster of network-namespace
machines on this one, for tests and benchmarks), ``distributed_sweep`` (distributed sweeps), ``partition`` (which machine
builds which node: pure), ``part`` (the actor that builds one machine's part of a fabric), ``run`` (the driver of
a fabric over several machines).

Ray and pymetis are the ``cluster`` extra of pyproject.toml: installed by ``scripts/test-setup.sh`` and on first
use of ``testbed cluster``, never by the quick start.
"""
from __future__ import annotations

from .nodes import (MACHINE_RESOURCE, RAY_INLINE_ENV, RAY_NAMESPACE, ClusterError, Machine, connect, ensure_installed,
                    extra_requirements, installed, machines, pin, require_ray, resolve)

__all__ = ["ClusterError", "MACHINE_RESOURCE", "RAY_INLINE_ENV", "RAY_NAMESPACE", "Machine", "connect",
           "ensure_installed", "extra_requirements", "installed", "machines", "pin", "require_ray", "resolve"]
