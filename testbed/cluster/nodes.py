"""The Ray side of the cluster: the extra that installs Ray, joining the cluster as a driver, its machines
(the nodes that offer ``ftb_machine``) and pinning work to one of them."""
from __future__ import annotations

import importlib.metadata as md
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

from ..errors import TestbedError

MACHINE_RESOURCE = "ftb_machine"
RAY_NAMESPACE = "fabric-testbed"
#: Results (a run's tar, a part's link samples) come back inline in the task's reply, not through Ray's object
#: transfer between nodes: between two machines of the local cluster that transfer never completed here (a
#: 300 KB object timed out both ways between ftb-m0 and ftb-m1 while plain TCP between them moved 5 MB in
#: 33 ms; cause not found), and a driver reading results once gains nothing from it.
RAY_INLINE_ENV = {"RAY_max_direct_call_object_size": str(512 << 20)}


class ClusterError(TestbedError):
    """A cluster problem, phrased for the user (one line)."""


def extra_requirements() -> list[str]:
    """The ``cluster`` extra's requirements, from the installed package's metadata (one home: pyproject.toml)."""
    try:
        reqs = md.requires("fabric-testbed") or []
    except md.PackageNotFoundError:
        return ["ray", "pymetis"]
    return [r.split(";")[0].strip() for r in reqs if 'extra == "cluster"' in r.replace("'", '"')]


def installed() -> bool:
    try:
        import pymetis  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def ensure_installed(log=print) -> None:
    """Install the ``cluster`` extra (Ray, pymetis) into this Python when it is missing: first use of
    ``testbed cluster``."""
    if installed():
        return
    reqs = extra_requirements()
    log(f"cluster: installing {', '.join(reqs)} (first use; pip)")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *reqs], capture_output=True, text=True,
                         env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore"))
    if res.returncode != 0 or not installed():
        last = (res.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ClusterError(f"could not install the cluster extra ({' '.join(reqs)}): {last}")


def require_ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("Ray is not installed: `testbed cluster up --local N` installs it, or "
                           "`pip install '.[cluster]'`") from None
    return ray


def resolve(address: str) -> str:
    """``--cluster ADDRESS``; ``auto``: the ``RAY_ADDRESS`` environment, else the running local cluster."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    from .state import read_state
    st = read_state()
    if st is None:
        raise ClusterError("--cluster auto: RAY_ADDRESS is not set and no local cluster is up "
                           "(`testbed cluster up --local 2`)")
    return st["address"]


def connect(address: str):
    """Join the cluster as a driver (idempotent within a process); returns the ray module."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # a failed call the driver chose not to wait for (a part's agents stopped because another part failed) is
    # not news: every failure that matters is reported by the driver in one line
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    for k, v in RAY_INLINE_ENV.items():
        os.environ.setdefault(k, v)
    # ray.init installs its own SIGTERM handler (sys.exit) in the driver: it would replace the CLI's (which tears
    # the lab down) and, inherited by a forked child still running Python (pyroute2's netns helpers), turn that
    # child's SIGTERM into a SystemExit that unwinds into the parent's code: keep the handler we had
    main = threading.current_thread() is threading.main_thread()
    prev = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=resolve(address), namespace=RAY_NAMESPACE, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ClusterError(f"cannot join the Ray cluster at {address}: {msg}") from None
    finally:
        if main and prev is not None:
            signal.signal(signal.SIGTERM, prev)
    return ray


@dataclass(frozen=True)
class Machine:
    """A Ray node that takes runs and fabric parts (it offers ``ftb_machine``)."""
    name: str           # the local cluster's m<i>, else the node's address
    node_id: str
    address: str        # the node's IP: the underlay address its VXLAN ends use
    alive: bool


def machines(alive_only: bool = True) -> list[Machine]:
    """The cluster's machines in a stable order (local-cluster order, else by address)."""
    ray = require_ray()
    from .state import names_by_address
    names = names_by_address()
    out = []
    for n in ray.nodes():
        if not n.get("Resources", {}).get(MACHINE_RESOURCE) and n.get("Alive"):
            continue
        if MACHINE_RESOURCE not in n.get("Resources", {}) and not n.get("Alive"):
            # a dead node reports no resources: keep it only when it was one of the local cluster's machines
            if n["NodeManagerAddress"] not in names:
                continue
        if alive_only and not n.get("Alive"):
            continue
        addr = n["NodeManagerAddress"]
        out.append(Machine(names.get(addr, addr), n["NodeID"], addr, bool(n.get("Alive"))))
    # a restarted node appears twice (dead and alive): keep the live one
    best: dict[str, Machine] = {}
    for m in out:
        if m.address not in best or m.alive:
            best[m.address] = m
    return sorted(best.values(), key=lambda m: tuple(int(x) if x.isdigit() else 0 for x in m.address.split(".")))


def pin(machine: Machine) -> dict:
    """Ray options that run a task or actor on exactly this machine (node-affinity scheduling)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(machine.node_id, soft=False)}
