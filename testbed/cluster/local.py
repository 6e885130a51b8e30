"""A Ray cluster of N "machines" on this one, so that everything multi-machine is testable here.

Machine i is the network namespace ``ftb-m<i>`` holding its underlay interface ``ul0`` (198.19.255.<i+1>/24,
MTU 9000, TBF at the underlay rate), joined to the others through the bridge ``ftb-ul`` in the root namespace,
which holds 198.19.255.254: the underlay is reachable from the root namespace, where the driver (``testbed
run|sweep``) runs. Machine 0 runs the Ray head, the others join it, each Ray node bound to its underlay address
and offering one ``ftb_machine``; the root namespace runs a Ray node without CPUs or machines of its own so that
a driver there can join (Ray wants a local node). Every Ray process of a machine lives in the pids cgroup
``ftb-cluster/<name>`` (and in its namespace), which is how ``down`` reaps them all — never by process name.
The state file ``/run/fabric-testbed/cluster.json`` names it all; ``testbed clean`` leaves the cluster alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..fabric import netns
from . import MACHINE_RESOURCE, RAY_INLINE_ENV, ClusterError
from .state import STATE, names_by_address, read_state

BRIDGE = "ftb-ul"
UNDERLAY = "198.19.255"            # /24 (RFC 2544's benchmarking range, next to the fabric's 198.18.0.0/15)
DRIVER_ADDRESS = f"{UNDERLAY}.254"
UNDERLAY_IF = "ul0"
UNDERLAY_MTU = 9000
HEAD_PORT = 6379
TEMP_DIR = "/tmp/ftb-ray"
OBJECT_STORE_BYTES = 100 * 1024 * 1024
START_TIMEOUT_S = 120.0
CGROUP_NAME = "ftb-cluster"
#: Ray notices a dead node within ~3 s instead of its default ~15 s (a node dying mid-sweep); results travel
#: inline in task replies (cluster.RAY_INLINE_ENV)
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "1000",
           "RAY_health_check_failure_threshold": "3", "RAY_health_check_timeout_ms": "1000", **RAY_INLINE_ENV}


def machine_ns(i: int) -> str:
    return f"{netns.MACHINE_PREFIX}{i}"


def machine_address(i: int) -> str:
    return f"{UNDERLAY}.{i + 1}"


def _write_state(st: dict) -> None:
    STATE.parent.mkdir(parents=True, exist_ok=True)
    tmp = STATE.with_suffix(".tmp")
    tmp.write_text(json.dumps(st, indent=1))
    os.replace(tmp, STATE)


def cgroup_root() -> Path:
    """Where the cluster's per-machine process groups live: the cgroup-v1 ``pids`` hierarchy, else cgroup v2."""
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fstype, opts = line.split()[:4]
        if fstype == "cgroup" and "pids" in opts.split(","):
            return Path(mnt) / CGROUP_NAME
    for line in Path("/proc/mounts").read_text().splitlines():
        if line.split()[2] == "cgroup2":
            return Path(line.split()[1]) / CGROUP_NAME
    raise ClusterError("no cgroup hierarchy to hold the cluster's processes (neither cgroup-v1 pids nor cgroup2)")


def machine_pids(name: str) -> list[int]:
    """Every process of a machine (or of ``driver``): its Ray node, workers, actors and what they started."""
    try:
        return [int(x) for x in (cgroup_root() / name / "cgroup.procs").read_text().split()]
    except (OSError, ClusterError):
        return []


def _ray_bin() -> str:
    return os.path.join(os.path.dirname(sys.executable), "ray")


def _start_node(name: str, ns: str | None, argv: list[str]) -> None:
    """``ray start`` inside machine ``ns`` (None: the root namespace), in the machine's cgroup, so that every
    process it leaves running is found again."""
    group = cgroup_root() / name
    group.mkdir(parents=True, exist_ok=True)
    procs = str(group / "cgroup.procs")

    def pre():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
        if ns is not None:
            netns.enter(ns)

    env = dict(os.environ, **RAY_ENV)
    env.pop("RAY_ADDRESS", None)
    try:
        res = subprocess.run([_ray_bin(), *argv], preexec_fn=pre, env=env, capture_output=True, text=True,
                             timeout=START_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"cluster: `ray start` of {name} did not finish in {START_TIMEOUT_S:g} s") from None
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
        raise ClusterError(f"cluster: `ray start` of {name} failed: {lines[-1] if lines else res.returncode}")


def _underlay(n: int, rate_bps: int) -> None:
    """The machines' namespaces, their underlay links and the root namespace's bridge, shaped to ``rate_bps``."""
    from pyroute2 import IPRoute

    names = [machine_ns(i) for i in range(n)]
    netns.create(names)
    burst = max(2 * (UNDERLAY_MTU + 14), rate_bps // 8 // 5000)        # two jumbo frames or 200 µs
    limit = max(1 << 20, rate_bps // 8 // 50)                          # 20 ms of queue
    with IPRoute() as ipr:
        ipr.link("add", ifname=BRIDGE, kind="bridge", mtu=UNDERLAY_MTU)
        br = ipr.link_lookup(ifname=BRIDGE)[0]
        ipr.addr("add", index=br, address=DRIVER_ADDRESS, prefixlen=24)
        ipr.link("set", index=br, state="up")
        for i, ns in enumerate(names):
            ipr.link("add", ifname=ns, kind="veth", mtu=UNDERLAY_MTU,
                     peer={"ifname": UNDERLAY_IF, "net_ns_fd": ns, "mtu": UNDERLAY_MTU})
            idx = ipr.link_lookup(ifname=ns)[0]
            ipr.link("set", index=idx, master=br, state="up")
            ipr.tc("add", "tbf", idx, rate=f"{rate_bps}bit", burst=burst, limit=limit)

    def inside(i: int) -> None:
        with IPRoute() as ipr:
            lo = ipr.link_lookup(ifname="lo")[0]
            ipr.link("set", index=lo, state="up")
            ul = ipr.link_lookup(ifname=UNDERLAY_IF)[0]
            ipr.addr("add", index=ul, address=machine_address(i), prefixlen=24)
            ipr.link("set", index=ul, state="up")
            ipr.tc("add", "tbf", ul, rate=f"{rate_bps}bit", burst=burst, limit=limit)
    for i, ns in enumerate(names):
        netns.run_in(ns, inside, i)


def up(n: int, rate_bps: int, log=print) -> dict:
    """Start an ``n``-machine local cluster; on any failure remove what was made and raise ClusterError."""
    if n < 1:
        raise ClusterError(f"cluster up --local {n}: give at least 1 machine")
    if read_state() is not None or any(netns.is_machine(x) for x in netns.list_names()):
        raise ClusterError("a local cluster is already up (`testbed cluster status`); `testbed cluster down` first")
    cpus = os.cpu_count() or 1
    st = {"address": f"{machine_address(0)}:{HEAD_PORT}", "underlay_rate_bps": rate_bps,
          "underlay_mtu": UNDERLAY_MTU, "created": time.time(), "temp_dir": TEMP_DIR,
          "cgroup": str(cgroup_root()),
          "machines": [{"name": f"m{i}", "namespace": machine_ns(i), "address": machine_address(i),
                        "interface": UNDERLAY_IF} for i in range(n)],
          "driver": {"name": "driver", "address": DRIVER_ADDRESS}}
    _write_state(st)                       # first: a failure half-way is cleaned by down()
    t = time.monotonic()
    try:
        _underlay(n, rate_bps)
        common = [f"--num-cpus={cpus}", f"--resources={json.dumps({MACHINE_RESOURCE: 1})}",
                  f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]
        _start_node("m0", machine_ns(0), ["start", "--head", f"--node-ip-address={machine_address(0)}",
                                          f"--port={HEAD_PORT}", "--include-dashboard=false",
                                          f"--temp-dir={TEMP_DIR}", *common])
        log(f"cluster: m0 up (Ray head {st['address']}, {time.monotonic() - t:.1f} s)")
        for i in range(1, n):
            _start_node(f"m{i}", machine_ns(i), ["start", f"--address={st['address']}",
                                                  f"--node-ip-address={machine_address(i)}", *common])
            log(f"cluster: m{i} up ({time.monotonic() - t:.1f} s)")
        _start_node("driver", None, ["start", f"--address={st['address']}", f"--node-ip-address={DRIVER_ADDRESS}",
                                     "--num-cpus=0", f"--object-store-memory={OBJECT_STORE_BYTES}",
                                     "--disable-usage-stats"])
        _wait_machines(st["address"], n)
    except BaseException:
        down()
        raise
    log(f"cluster: {n} machine(s) up in {time.monotonic() - t:.1f} s; driver node {DRIVER_ADDRESS}")
    return st


def _wait_machines(address: str, n: int) -> None:
    """Ray lists every machine alive (a node registers with the head a moment after ``ray start`` returns)."""
    from . import connect, machines    # the package's Ray connection; it never imports this module
    ray = connect(address)
    end = time.monotonic() + 30
    try:
        while True:
            found = machines()
            if len(found) >= n:
                return
            if time.monotonic() > end:
                raise ClusterError(f"cluster: {len(found)} of {n} machines registered with the Ray head after 30 s")
            time.sleep(0.2)
    finally:
        ray.shutdown()


def _reap(names: list[str], timeout_s: float = 3.0) -> int:
    """End every process of these cgroups (SIGTERM, then SIGKILL after ``timeout_s``) and remove the groups;
    returns how many there were."""
    count = sum(len(machine_pids(n)) for n in names)
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, timeout_s)):
        for name in names:
            for pid in machine_pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        end = time.monotonic() + wait
        while any(machine_pids(n) for n in names) and time.monotonic() < end:
            time.sleep(0.05)
    for name in names:
        left = machine_pids(name)
        if left:
            raise ClusterError(f"cluster: {len(left)} process(es) of {name} would not end (e.g. pid {left[0]})")
        group = cgroup_root() / name
        if group.exists():
            group.rmdir()
    return count


def kill_machine(name: str) -> int:
    """SIGKILL every process of one machine at once (its Ray node dies as a crashed machine's would): for tests
    of a node dying mid-run. Its namespace and underlay stay, as a dead machine's cables would."""
    pids = machine_pids(name)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def down(log=print) -> dict:
    """Remove the local cluster: every Ray process (by cgroup), the labs their actors left, the machines'
    namespaces, the bridge, the state file. Also cleans what a half-made cluster left without a state file."""
    from ..lab import reap_stale
    st = read_state() or {}
    names = [m["name"] for m in st.get("machines", [])] + ["driver"]
    with contextlib.suppress(ClusterError, FileNotFoundError):
        names += [p.name for p in cgroup_root().iterdir() if p.is_dir() and p.name not in names]
    procs = _reap(list(dict.fromkeys(names)))
    labs = reap_stale()                     # labs of actors that were just ended
    machines = [x for x in netns.list_names() if netns.is_machine(x)]
    for pid in netns.pids_in(machines):     # nothing of the cluster may keep a machine's namespace alive
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    netns.delete(machines)
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=BRIDGE)
        if idx:
            ipr.link("del", index=idx[0])
    with contextlib.suppress(ClusterError):
        root = cgroup_root()
        if root.exists() and not any(p.is_dir() for p in root.iterdir()):
            root.rmdir()
    STATE.unlink(missing_ok=True)
    shutil.rmtree(st.get("temp_dir", TEMP_DIR), ignore_errors=True)     # Ray's logs and session files
    return {"machines": len(machines), "processes": procs, "labs": len(labs)}


def status() -> list[dict]:
    """One row per machine of the local cluster (and its driver node): namespace, address, processes."""
    st = read_state()
    if st is None:
        return []
    rows = [{"name": m["name"], "namespace": m["namespace"], "address": m["address"],
             "processes": len(machine_pids(m["name"])), "namespace_up": netns.exists(m["namespace"])}
            for m in st["machines"]]
    rows.append({"name": "driver", "namespace": "(root)", "address": st["driver"]["address"],
                 "processes": len(machine_pids("driver")), "namespace_up": True})
    return rows


__all__ = ["down", "kill_machine", "machine_address", "machine_ns", "machine_pids", "names_by_address",
           "read_state", "status", "up"]
