"""A lab: one scenario's fabric + datapath living in the kernel, with a state file that outlives crashes.

The state file (``/run/fabric-testbed/labs/<name>.json``) is written *before* anything is created, so a run
that dies half-way can always be cleaned: ``testbed run`` reaps labs of kind ``run`` whose process is gone,
``testbed clean`` removes every namespace with the tool's prefix and every container labelled ``fabric-testbed``
(container hosts, ``hosts.docker``). A name already in use is refused.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import topology
from .fabric import netns
from .errors import HelperFailed, TestbedError
from .procname import proc_gone, proc_start
from .fabric import Fabric, FabricError
from .fabric.port import headroom_warnings, port_configs
from .scenario import Scenario, to_dict

LABS_DIR = Path(netns.STATE_DIR) / "labs"
NAME_RE = re.compile(r"^[a-z0-9]{1,12}$")


class LabError(TestbedError):
    pass


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise LabError(f"lab name {name!r}: use 1–12 lowercase letters or digits")
    return name


def state_path(name: str) -> Path:
    return LABS_DIR / f"{name}.json"


def read_state(name: str) -> dict | None:
    try:
        return json.loads(state_path(name).read_text())
    except (OSError, ValueError):
        return None


def all_labs() -> list[dict]:
    out = []
    for p in sorted(LABS_DIR.glob("*.json")) if LABS_DIR.exists() else []:
        st = read_state(p.stem)
        if st:
            out.append(st)
    return out


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def namespaces_of(name: str) -> list[str]:
    return netns.list_names(f"{netns.PREFIX}{name}-")


HELPER_STOP_S = 5.0           # a helper that has not ended this long after SIGTERM is SIGKILLed
PROGRAMS_FREED_S = 10.0       # how long removing a lab waits for the kernel to free its BPF programs


def _end_helpers(st: dict) -> None:
    """End the helper processes a lab's state names (the PFC agent of a `testbed up` lab outlives the command
    that started it; a helper forked just before its owner was killed) — only when pid and start time still
    match, so a reused pid is never signalled. SIGTERM, then SIGKILL after HELPER_STOP_S; returns once they are
    gone, so that nothing of theirs (BPF programs and maps they hold, sockets in the lab's namespaces) outlives
    the removal."""
    def alive():
        return [h for h in st.get("helpers", []) if not proc_gone(h["pid"], h.get("start"))]
    for sig, wait in ((signal.SIGTERM, HELPER_STOP_S), (signal.SIGKILL, HELPER_STOP_S)):
        left = alive()
        for h in left:
            with contextlib.suppress(ProcessLookupError):   # it may end by itself meanwhile
                os.kill(h["pid"], sig)
        end = time.monotonic() + wait
        while left and time.monotonic() < end:
            time.sleep(0.02)
            left = alive()
        if not left:
            return


def _kill_inside(names: list[str], timeout_s: float = HELPER_STOP_S) -> None:
    """SIGKILL every process still inside these namespaces (traffic agents of a run whose owner was killed: they
    would keep the deleted namespaces and their interfaces alive) and wait until they are gone."""
    pids = {pid: proc_start(pid) for pid in netns.pids_in(names)}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + timeout_s
    while not all(proc_gone(p, s) for p, s in pids.items()) and time.monotonic() < end:
        time.sleep(0.01)


def remove(name: str) -> int:
    """Remove a lab: its helper processes, the processes left inside its namespaces, its namespaces (and so
    everything in them), its containers, its CPU-accounting cgroup and its state file (kept when the containers
    could not be removed, so that it can be tried again). Returns how many namespaces it had."""
    return _remove(name)[0]


def _remove(name: str, ask_docker: bool = False) -> tuple[int, int | None]:
    """remove(); (namespaces, containers removed — None when Docker was not there to ask). ``ask_docker``: look
    for containers labelled with the lab even when its state file names none (`testbed clean NAME`)."""
    from .telemetry.cpu import remove_group
    st = read_state(name)
    if st:
        _end_helpers(st)
    names = namespaces_of(name)
    _kill_inside(names)
    netns.delete(names)
    if st and st.get("programs"):      # the kernel frees the namespaces, and the filters holding them, later
        from .datapath.objects import wait_freed
        wait_freed(st["programs"], PROGRAMS_FREED_S)
    ctrs: int | None = 0
    if (st and st.get("containers")) or ask_docker:
        from .container.daemon import DockerError
        from .container.hosts import remove_lab
        try:
            ctrs = remove_lab(name)
        except DockerError:
            if st and st.get("containers"):
                raise
            ctrs = None
    remove_group(name)
    # the fabric controller's and the collective helper's channels, and their hosts' ends
    for sock in [*LABS_DIR.glob(f"{name}-ctl*.sock"), *LABS_DIR.glob(f"{name}-ccl*.sock")]:
        sock.unlink(missing_ok=True)
    state_path(name).unlink(missing_ok=True)
    return len(names), ctrs


def reap_stale() -> list[str]:
    """Labs of finished or crashed ``run`` processes: their owner is gone, nothing else will remove them. A lab
    whose containers cannot be removed now (Docker is not running) keeps its state file, and so stays listed by
    `testbed status`, for `testbed clean` to remove later."""
    from .container.daemon import DockerError
    gone = []
    for st in all_labs():
        if st.get("kind") == "run" and not _alive(st.get("pid")):
            try:
                remove(st["name"])
            except DockerError:
                continue
            gone.append(st["name"])
    return gone


def clean_all() -> tuple[int, int, int | None]:
    """Every lab, namespace and container of this tool except those of ``testbed run`` processes still running
    (they are not leftovers and remove themselves): crashed runs, `up` labs, stray namespaces and containers
    without a state file; never the local cluster's machines (``ftb-m<i>``: ``testbed cluster down`` removes
    them). Returns (labs, stray namespaces, stray containers — None when Docker is not there to ask)."""
    from .container.daemon import DockerError
    from .container.hosts import remove_leftovers
    live = {st["name"] for st in all_labs() if st.get("kind") == "run" and _alive(st.get("pid"))}
    labs = [st for st in all_labs() if st["name"] not in live]
    failed = []
    for st in labs:
        try:
            remove(st["name"])
        except DockerError as e:               # the others are still removed; then one line says what is left
            failed.append(f"lab {st['name']}: {e}")
    leftovers = [n for n in netns.list_names() if not netns.is_machine(n)
                 and not any(n.startswith(f"{netns.PREFIX}{name}-") for name in live)]
    _kill_inside(leftovers)
    netns.delete(leftovers)
    from .telemetry.cpu import group_names, remove_group
    for name in group_names():                 # cgroups of killed runs whose state file is gone
        if name not in live and not any(re.fullmatch(rf"{re.escape(name)}m\d+", n) for n in live):  # a split
            remove_group(name)                                                 # run's parts share theirs
    if failed:
        raise DockerError(f"{failed[0]}" + (f" (and {len(failed) - 1} more lab(s))" if len(failed) > 1 else "")
                          + "; everything else was removed")
    return len(labs), len(leftovers), remove_leftovers(live)


def clean_named(names: list[str]) -> tuple[int, int, int | None]:
    """`testbed clean NAME…`: remove these labs only — each one's helpers, the processes in its namespaces, its
    namespaces (``ftb-NAME-*``, with a state file or without), its containers, its cgroup and its state file — and
    the machine parts of a lab over several machines (``NAMEm0``, ``NAMEm1``, … on this machine). A lab of a
    ``testbed run`` that is still running is refused (it removes itself). Returns (labs with something removed,
    namespaces, containers — None when Docker is not there to ask)."""
    from .telemetry.cpu import group_names
    targets: list[str] = []
    for name in names:
        check_name(name)
        parts = re.compile(rf"^{re.escape(name)}m\d+$")
        known = ({st["name"] for st in all_labs()} | set(group_names())
                 | {n[len(netns.PREFIX):].split("-", 1)[0] for n in netns.list_names() if "-" in n[len(netns.PREFIX):]})
        targets += [name] + sorted(n for n in known if parts.match(n))
    for name in targets:
        st = read_state(name)
        if st and st.get("kind") == "run" and _alive(st.get("pid")):
            raise LabError(f"lab '{name}' belongs to `testbed run` (pid {st['pid']}), still running: it removes "
                           f"itself when it ends (stop it with Ctrl-C)")
    labs = spaces = 0
    containers: int | None = 0
    for name in dict.fromkeys(targets):
        had = read_state(name) is not None or name in group_names()
        n, c = _remove(name, ask_docker=True)
        spaces += n
        containers = None if containers is None or c is None else containers + c
        labs += bool(had or n or c)
    return labs, spaces, containers


class Lab:
    """Context manager: build on enter; tear down on exit unless ``keep`` (``testbed up``)."""

    def __init__(self, scen: Scenario, name: str, kind: str = "run", keep: bool = False, source: str = "",
                 metrics: str | None = None, log: Callable[[str], None] = lambda s: None, nodes=None,
                 tunnels: dict | None = None, underlay: str | None = None, key: bytes | None = None):
        """``metrics``: HOST:PORT to serve live Prometheus metrics on while the lab lives (telemetry/live.py).
        ``log``: progress lines (installing or starting Docker, building the host image). ``nodes``: build only
        these nodes — one machine's part of a fabric over several (testbed/cluster/); its ports whose link
        leaves the part are ``tunnels`` (ifindex → fabric.Tunnel); ``underlay``: the machine's address, where its
        routing agent hears the other machines' (routing/manager.py)."""
        self.scen, self.name, self.kind, self.keep, self.source = scen, check_name(name), kind, keep, source
        self.metrics = metrics
        whole = topology.build(scen.topology)
        self.ports = port_configs(whole, scen.switch, scen.hosts.pfc,  # every port's egress, built once
                                  scen.fabric_mtu, scen.host_mtu)
        self.whole = whole                     # the whole fabric; ``topo`` is what this lab builds of it
        self.underlay, self.key = underlay, key     # key: the run's, sealing what the helpers tell other machines
        self.topo = whole if nodes is None else whole.restrict(nodes)
        hooked = self.topo.switches + (self.topo.hosts if self.pfc_on and scen.hosts.pfc else [])
        self.fabric = Fabric(self.topo, name, self.ports, tunnels, hooked)  # clsact where eBPF programs will go
        self.datapath = None
        self.helpers: dict = {}                # key → the running helper process (HELPERS)
        self.results: dict[str, dict] = {}     # key → what a stopped helper measured
        if metrics is not None:                # a malformed address is refused before anything is built
            from .telemetry.live import parse_address
            parse_address(metrics)
        self.failures: list[str] = []           # helpers that failed (one line each), for the run to report
        self.warnings = headroom_warnings(self.ports, scen.switch)
        if scen.switch.credit_on:                 # refused here, before anything is built
            from .qos.credits import check_buffers
            self.warnings += check_buffers(self.ports, scen.switch)
        self.containers = None                 # hosts.docker: the hosts' containers (container/hosts.py)
        if scen.hosts.docker is not None:      # Docker that cannot run is refused here, before anything is built
            from .container.hosts import ContainerHosts
            from .workloads.gating import gates_dir
            self.containers = ContainerHosts(name, {h: scen.hosts.docker.image_of(h) for h in self.topo.hosts},
                                             log, start_daemon=nodes is None, shared_dirs=(gates_dir(),))

    def __enter__(self) -> "Lab":
        LABS_DIR.mkdir(parents=True, exist_ok=True)
        existing = read_state(self.name)
        if existing or namespaces_of(self.name):
            if existing and existing.get("kind") == "run" and not _alive(existing.get("pid")):
                remove(self.name)             # a crashed run of the same name: clean it, go on
            else:
                who = ""
                if existing and existing.get("kind") == "run":
                    who = f" (by `testbed run`, pid {existing.get('pid')})"
                elif existing:
                    who = " (made by `testbed up`)"
                raise LabError(f"lab '{self.name}' is already running{who}: "
                               f"`testbed down {self.name}` first, or pick another name")
        state = {"name": self.name, "kind": self.kind, "pid": os.getpid() if self.kind == "run" else None,
                 "created": time.time(), "source": self.source, "scenario": to_dict(self.scen, roundtrip=True),
                 "nodes": {n: self.fabric.ns[n] for n in self.topo.nodes}}
        if self.containers is not None:        # before they exist: a crash while starting them leaves a trace
            state["containers"] = dict(self.containers.names)
        self._state = state
        self._write_state()
        try:
            from concurrent.futures import ThreadPoolExecutor
            from concurrent.futures import wait as wait_futures

            from .datapath import Datapath
            from .lb.plugin import for_datapath
            self.datapath = Datapath(self.topo, self.scen.switch, self.ports, self.scen.telemetry.int,
                                     host_stacks=self.scen.host_int_hops > 0,
                                     plugin=for_datapath(self.scen.switch))
            # BCC compiles in C without the GIL: overlap it with the kernel building the fabric
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcc")
            compiled = None
            try:
                compiled = pool.submit(self.datapath.load)
                adopt = None
                if self.containers is not None:    # their network namespaces become the hosts'
                    adopt = self.containers.start()
                    self.fabric.timings.update(self.containers.timings)
                    self._state["containers"] = {h: c.to_dict() for h, c in self.containers.containers.items()}
                    self._write_state()
                self.fabric.build(adopt)
            finally:
                # Ctrl-C while BCC compiles: let it finish before tearing down — it holds fd 2 (quiet_stderr:
                # what the teardown and the CLI print meanwhile would be lost) and closing the datapath under it
                # can crash BCC. If the join itself is interrupted, wait on the future (a Thread.join once
                # interrupted does not wait again).
                try:
                    pool.shutdown(wait=True)
                except BaseException:
                    if compiled is not None:
                        wait_futures([compiled])
                    raise
            compiled.result()
            self._state["programs"] = self.datapath.program_ids()    # remove() waits until they are freed
            self._write_state()
            self.fabric.attach_ingress(self.datapath.ingress_fd, self.datapath.ingress_name)
            self.fabric.attach_nic_release(self.datapath.nic_release_fd)
            if self.pfc_on and self.scen.hosts.pfc:
                self.fabric.attach_host_ingress(self.datapath.host_ingress_fd, "ftb_host_ingress")
            self._state["helpers"] = []
            for spec in HELPERS:
                if spec.needed(self):
                    self._start(spec)
        except BaseException:
            self.close(force=True)
            raise
        return self

    def serve_metrics(self, address: str | tuple[str, int]) -> tuple[str, int]:
        """Start the live metrics exporter (telemetry/live.py) at ``address``; returns where it listens."""
        return self._start(EXPORTER, address).endpoint

    def _start(self, spec: "HelperSpec", *args):
        """Fork one helper and record it in the state file (pid + start time), so a crashed run's helpers are
        ended."""
        h = spec.make(self, *args)
        h.detach = self.keep
        h.on_fork = self.recorder(spec.label(h))
        self.helpers[spec.key] = h
        h.start()
        return h

    def recorder(self, name: str) -> Callable[[int], None]:
        """A helper's ``on_fork``: its pid and start time go to the state file the moment it is forked, before it
        is ready (an SM programs every table first), so a helper whose owner is killed meanwhile is still ended
        by `testbed clean`. The run's own helpers (the WCMP controller) are recorded the same way."""
        def record(pid: int) -> None:
            self._state.setdefault("helpers", []).append({"name": name, "pid": pid, "start": proc_start(pid)})
            self._write_state()
        return record

    @property
    def routing_on(self) -> bool:
        """A routing agent runs: the subnet manager (switch.routing: sm), or the link-state watcher that a run
        with failures needs for local failover and rerouting."""
        return self.scen.switch.routing == "sm" or bool(self.scen.failures)

    def failures_go(self, t0: float) -> None:
        """The traffic's t0 is chosen: start the failure scheduler's clock."""
        if "scheduler" in self.helpers:
            self.helpers["scheduler"].go(t0)

    @property
    def pfc_on(self) -> bool:
        """Some tier's switches run PFC (on a lossless priority)."""
        sw = self.scen.switch
        return any(sw.qos(t).pfc.enabled and sw.qos(t).traffic_classes.lossless for t in self.topo.tiers)

    def _write_state(self) -> None:
        tmp = state_path(self.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state))
        os.replace(tmp, state_path(self.name))

    def check(self) -> None:
        """Raise HelperFailed if a helper process of the lab (PFC agent, routing agent, failure scheduler, metrics
        exporter) or a host's container has died."""
        for spec in HELPERS:
            if spec.key in self.helpers:
                self.helpers[spec.key].check()
        if self.containers is not None:
            self.containers.check()

    def __exit__(self, *exc) -> None:
        self.close(force=exc[0] is not None)

    def close(self, force: bool = False) -> None:
        """Stop the helpers, then tear everything down, whatever fails on the way; a helper that failed is
        recorded in ``failures`` (one line each) for the run to report."""
        if self.keep and not force:
            return
        try:
            for spec in reversed(HELPERS):       # the failures first, the reaction (PFC) last
                h = self.helpers.pop(spec.key, None)
                if h is None:
                    continue
                try:
                    self.results[spec.key] = h.stop()
                except HelperFailed as e:
                    self.failures.append(str(e))
        finally:
            try:
                self.fabric.teardown()
                if self.containers is not None:
                    self.containers.remove()
            finally:
                if self.datapath is not None:
                    self.datapath.close()
                    self.datapath = None
                state_path(self.name).unlink(missing_ok=True)


@dataclass(frozen=True)
class HelperSpec:
    """One helper process a lab may fork. The lab starts the ones its scenario needs in the order of HELPERS,
    checks them in that order and stops them in the reverse one (the failure scheduler before the routing agent
    that reacts to it, the PFC agent last); ``key`` names it in ``Lab.helpers`` and ``Lab.results``."""
    key: str
    needed: Callable[["Lab"], bool]
    make: Callable[..., object]               # (lab, *args) → a ForkedHelper, not started yet
    label: Callable[[object], str]            # its name in the state file


def _pfc_agent(lab: Lab):
    from .qos.pfc import PfcAgent
    return PfcAgent(lab.datapath, lab.fabric, lab.scen)


def _routing_agent(lab: Lab):
    from .routing.manager import RoutingAgent    # start() returns once every port is read (SM: every table set)
    return RoutingAgent(lab.datapath, lab.fabric, lab.scen, lab.whole, lab.underlay, key=lab.key)


def _failure_scheduler(lab: Lab):
    from .routing.failures import FailureScheduler
    return FailureScheduler(lab.datapath, lab.fabric, lab.scen, lab.whole)


def _metrics_exporter(lab: Lab, address=None):
    from .telemetry.live import MetricsExporter
    return MetricsExporter(lab.name, lab.datapath, lab.topo, address if address is not None else lab.metrics,
                           key=lab.key)


EXPORTER = HelperSpec("exporter", lambda lab: lab.metrics is not None, _metrics_exporter,
                      lambda h: "metrics-exporter")
HELPERS = (
    HelperSpec("pfc", lambda lab: lab.pfc_on or lab.scen.switch.credit_on,   # it runs PFC and credits
               _pfc_agent, lambda h: h.label.lower().replace(" ", "-")),   # pfc-agent, credit-agent, …
    HelperSpec("routing", lambda lab: lab.routing_on, _routing_agent,
               lambda h: "subnet-manager" if h.sm else "link-state-watcher"),
    HelperSpec("scheduler", lambda lab: bool(lab.scen.failures), _failure_scheduler,
               lambda h: "failure-scheduler"),
    EXPORTER,
)


__all__ = ["HELPERS", "HelperSpec", "Lab", "LabError", "FabricError", "all_labs", "clean_all", "clean_named",
           "reap_stale", "remove",
           "read_state"]
