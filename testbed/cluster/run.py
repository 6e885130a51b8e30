"""The driver of one fabric over several machines (``testbed run --cluster``).

Partition the topology (partition.py), pin one actor per machine (part.py), refuse an underlay that cannot carry
the cut links (fabric MTU + 50 bytes of VXLAN) and warn when their rate exceeds it, build every part at once,
run the traffic with each machine's own agents (workloads.run with ``RemoteAgents``: t0, jobs and results as in
a local run), then merge every machine's link samples, per-flow paths, drop counters and helper results into one
``Collected`` (ClusterBackend, the run lifecycle's back end: runs/backend.py), from which runs/lifecycle.py
writes the same files, columns and manifest keys as a local run, plus the manifest's ``cluster`` section (nodes,
partition, cut links). Every part is torn down on every path; an actor or machine that dies fails the run with
one line naming it, the other machines tear their parts down, and a cleanup task removes what the dead actor
left on its machine (if the machine still lives: else ``testbed clean`` there does).
"""
from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Callable

from ..auth import new_key
from ..errors import HelperFailed
from ..runs.backend import Backend, Collected
from . import ClusterError, Machine, connect, machines, pin
from .partition import VNI_BASE, PlacementError, check_underlay, partition

CLOSE_TIMEOUT_S = 60.0


class PartFailed(HelperFailed):
    """A machine's part failed or its actor died; the message names the machine (one line)."""


def unsupported(scen) -> str | None:
    """What a fabric over several machines cannot do yet (None: nothing): the WCMP controller (it reads every
    switch at once) and Soft-RoCE; each named with why in one line. (Credits cross the cut in credit frames:
    qos/credits.py; failures are scheduled on every machine, the routing agents flood link state and the
    subnet manager sends the other machines their tables: routing/manager.py.)"""
    sw, tr = scen.switch, scen.traffic
    checks = [(sw.load_balancing == "wcmp" and sw.wcmp.source != "static",
               f"switch.wcmp.source: {sw.wcmp.source} (the WCMP controller reads every switch)"),
              (tr.engine == "rxe", "traffic.engine: rxe (the driver runs perftest in every host's namespace itself; "
                                   "they are on other machines)")]
    return next((what for bad, what in checks if bad), None)


def _line(e: BaseException) -> str:
    text = str(getattr(e, "cause", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _death_message(cause) -> str:
    """Why the GCS says an actor died: its DeathCause is a protobuf message (ActorDeathCause), whose ``.get``
    does not exist — reading it as a mapping raised AttributeError when the driver noticed the death first."""
    ctx = getattr(cause, "actor_died_error_context", None)
    return getattr(ctx, "error_message", "") or ""


class Parts:
    """The actors of one run, one per machine, and the calls to all of them (failures named by machine)."""

    def __init__(self, ray, used: list[Machine], labs: list[str], detached: bool = False):
        """``detached``: the actors outlive the driver (``testbed up --cluster``; ``testbed down`` ends them)."""
        from .part import Part
        self.ray, self.machines, self.labs = ray, used, labs
        actor = ray.remote(Part)
        extra = {"lifetime": "detached"} if detached else {}
        self.actors = [actor.options(num_cpus=0, max_concurrency=8, max_restarts=0, name=f"ftb-{lab}", **extra,
                                     **pin(m)).remote() for m, lab in zip(used, labs)]
        self.dead: dict[int, str] = {}           # machine index → why its actor is gone

    def name(self, i: int) -> str:
        m = self.machines[i]
        return f"machine {m.name} ({m.address})"

    def get(self, i: int, ref, timeout: float | None = None):
        """One actor call's result; a dead actor or a failed call raises PartFailed naming the machine."""
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
        try:
            return self.ray.get(ref, timeout=timeout)
        except RayTaskError as e:
            raise PartFailed(f"{self.name(i)}: {_line(e)}") from None
        except RayActorError as e:
            why = f"its actor died ({type(e).__name__})"
            self.dead[i] = why
            raise PartFailed(f"{self.name(i)}: {why}") from None
        except GetTimeoutError:
            raise PartFailed(f"{self.name(i)}: no answer in {timeout:g} s") from None

    def check_alive(self) -> None:
        """Raise PartFailed when the GCS reports an actor dead. A call pending on an actor whose process was
        SIGKILLed was not failed by Ray here (a driver waited on it forever), so the driver asks while it waits."""
        from ray._private import state
        for i, a in enumerate(self.actors):
            if i in self.dead:
                continue
            info = state.actors(actor_id=a._actor_id.hex())
            if info and info.get("State") == "DEAD":
                cause = _death_message(info.get("DeathCause"))
                why = f"its actor died{f' ({cause.strip().splitlines()[0][:120]})' if cause.strip() else ''}"
                self.dead[i] = why
                raise PartFailed(f"{self.name(i)}: {why}")

    def all(self, method: str, *args, each: Callable[[int], tuple] | None = None) -> list:
        """Call ``method`` on every actor at once; the first failure (in machine order) raises."""
        refs = [getattr(a, method).remote(*(each(i) if each else args)) for i, a in enumerate(self.actors)]
        return [self.get(i, r) for i, r in enumerate(refs)]

    def close(self, log: Callable[[str], None]) -> list[str]:
        """Tear every part down (in parallel); then remove what a dead actor left on its machine, and end the
        actors. Returns the problems (one line each)."""
        from ray.exceptions import RayError
        problems = []
        refs = {i: a.close.remote() for i, a in enumerate(self.actors) if i not in self.dead}
        for i, ref in refs.items():
            try:
                self.get(i, ref, CLOSE_TIMEOUT_S)
            except PartFailed as e:
                problems.append(str(e))
        from .part import cleanup
        alive = {m.node_id for m in machines()}
        task = self.ray.remote(num_cpus=0, max_retries=0)(cleanup)
        for i in self.dead:
            m = self.machines[i]
            if m.node_id not in alive:
                problems.append(f"{self.name(i)} is gone: `testbed clean` there removes its part (lab {self.labs[i]})")
                continue
            try:
                n = self.ray.get(task.options(**pin(m)).remote(self.labs[i]), timeout=CLOSE_TIMEOUT_S)
                log(f"cluster: removed the part the dead actor left on {m.name} ({n} namespaces)")
            except RayError as e:
                problems.append(f"{self.name(i)}: cleaning the dead actor's part failed: {_line(e)}")
        for a in self.actors:
            self.ray.kill(a)
        return problems


class RemoteAgents:
    """workloads.agent_set.AgentSet's interface over the machines: each machine's actor runs the agents of its own
    hosts; jobs and results travel through Ray."""

    start_latency_s = 0.1        # a Ray call to every machine's actor carries the start lines

    def __init__(self, parts: Parts, machine_of: dict[str, int], hosts: list[str]):
        self.parts, self.machine_of = parts, machine_of
        self.by_machine: dict[int, list[str]] = {}
        for h in hosts:
            self.by_machine.setdefault(machine_of[h], []).append(h)
        self.problems: list[str] = []

    def _each(self, method: str, args_of: Callable[[int], tuple]) -> list:
        a = self.parts.actors
        refs = {i: getattr(a[i], method).remote(*args_of(i)) for i in self.by_machine}
        return [self.parts.get(i, r) for i, r in refs.items()]

    def __enter__(self) -> "RemoteAgents":
        try:
            self._each("agents_start", lambda i: (self.by_machine[i],))
        except BaseException:
            self.__exit__()
            raise
        return self

    def wait_ready(self, deadline: float, started: float) -> None:
        self._each("agents_ready", lambda i: (deadline, started))

    def hand_jobs(self, jobs: dict[str, dict]) -> None:
        """Gated flows: each machine's agents get gate paths under its own gate directory, and every machine a
        relay to the others' (cluster/gate_relay.py)."""
        paths = [p for j in jobs.values() for p in ([j["gate"]] if "gate" in j else [])
                 + [p for ps in j.get("notify", {}).values() for p in ps]]
        if not paths:
            self._each("agents_jobs", lambda i: ({h: jobs[h] for h in self.by_machine[i]},))
            return
        from .gate_relay import localize
        gates = os.path.dirname(paths[0])
        endpoints = dict(zip(self.by_machine, self._each("gates_open", lambda i: (gates, i))))

        def job_of(i: int) -> tuple:
            mine = {h: localize(jobs[h], gates, i) for h in self.by_machine[i]}
            told = {os.path.basename(p) for j in jobs.values() if j["host"] in mine
                    for ps in j.get("notify", {}).values() for p in ps}
            return mine, {h: endpoints[self.machine_of[h]] for h in told if self.machine_of[h] != i}
        self._each("agents_jobs", job_of)

    def wait_bound(self, deadline: float) -> None:
        self._each("agents_bound", lambda i: (deadline,))

    def start(self, t0: float) -> None:
        self._each("agents_go", lambda i: (t0,))

    def collect(self, deadline: float, timeout_s: float, check: Callable[[], None] | None = None) -> dict:
        """Every machine's agents' results; the first machine that fails (its agents, a helper, its actor)
        raises at once, naming it."""
        ray, a = self.parts.ray, self.parts.actors
        refs = {a[i].agents_collect.remote(deadline, timeout_s): i for i in self.by_machine}
        out: dict = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in ready:
                out.update(self.parts.get(refs[ref], ref))
            self.parts.check_alive()
            if check is not None:
                check()
        return out

    def __exit__(self, *exc) -> None:
        for i in self.by_machine:
            if i in self.parts.dead:
                continue
            try:
                self.problems += self.parts.get(i, self.parts.actors[i].agents_close.remote(), CLOSE_TIMEOUT_S)
            except PartFailed as e:
                self.problems.append(str(e))


def _merge_int(ints: dict[int, dict], topo, machine_of: dict[str, int], flows) -> tuple[list[dict], dict]:
    """INT from every machine's sinks as one run's: int.csv rows (reports in time order, each hop's time on the
    clock of the machine its switch is on) and the counters added."""
    from ..inband.collector import decode, report_rows, run_clock
    clocks = {i: run_clock(x["mono0_ns"], x["wall0"], x["origin"]) for i, x in ints.items()}
    machine_of_id = {sid: machine_of[n] for n, sid in topo.switch_ids.items()}
    reports = sorted(((decode(b), clocks[i]) for i, x in ints.items() for b in x["raw"]),
                     key=lambda rc: rc[1](rc[0].ts_ns))
    fallback = next(iter(clocks.values()))
    rows = report_rows(reports, topo, flows, hop_clock=lambda h: clocks.get(machine_of_id.get(h.switch_id), fallback))
    counters: dict[str, int] = {}
    for x in ints.values():
        for k, v in x["counters"].items():
            counters[k] = counters.get(k, 0) + v
    return rows, counters


def _write_pcaps(outdir: Path, finals) -> list[str]:
    """Every machine's capture files into ``outdir/pcap`` as one machine writes them: the PFC frames a node sent
    over a cut link (captured on the far machine) merged into its file. Returns their paths (the manifest's)."""
    from ..fabric.capture import merge_pending
    files = {name: data for f in finals for name, data in f["pcaps"].items()}
    if not files:
        return []
    d = outdir / "pcap"
    d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
        (d / name).chmod(0o644)
    merge_pending(d)
    return sorted(f"pcap/{name}" for name in files if not name.startswith("."))


def _merge_routing(finals: dict[int, dict], used) -> tuple[dict, dict]:
    """The routing agents' and failure schedulers' results of every machine as one run's: each agent's change
    records (failures.csv takes the first agent to see a change and the last to reroute; under SM routing the
    SM's, whose sweeps program every machine), and per event the earliest of the machines that changed something
    for it, until the last of them was done."""
    rts = {i: f["routing"] for i, f in finals.items() if f.get("routing")}
    rt: dict = {}
    if rts:
        tag = {i: used[i].name for i in rts}
        sm = next((r for r in rts.values() if r.get("role") == "subnet manager"), None)
        rt = dict(sm) if sm is not None else {"mode": "distributed", "engine": None, "sweep_interval_s": None,
                                              "sweeps": 0, "late_sweeps": 0, "sweep_s": None}
        deciding = {i: r for i, r in rts.items() if sm is None or r is sm}
        rt.update({"changes": sorted((dict(c, machine=tag[i]) for i, r in deciding.items() for c in r["changes"]),
                                     key=lambda c: c["t_detect"]),
                   "agents": [r["changes"] for r in deciding.values()],
                   "local": sorted((dict(e, machine=tag[i]) for i, r in rts.items() for e in r["local"]),
                                   key=lambda e: e["t"]),
                   "errors": [f"{tag[i]}: {e}" for i, r in rts.items() for e in r["errors"]]})
        for k in ("changes_dropped", "error_count", "floods_sent", "floods_taken"):
            rt[k] = sum(r.get(k, 0) for r in rts.values())
        rt["rejected"] = {k: sum((r.get("rejected") or {}).get(k, 0) for r in rts.values())
                          for k in ("forged", "replayed")}
        if sm is None:
            rt["entries"] = sum(r.get("entries", 0) for r in rts.values())
    fss = {i: f["scheduler"] for i, f in finals.items() if f.get("scheduler")}
    fs: dict = {}
    if fss:
        by_event: dict[int, list[dict]] = {}
        for r in fss.values():
            for a in r["applied"]:
                by_event.setdefault(a["index"], []).append(a)
        applied = []
        for i, recs in sorted(by_event.items()):
            acting = [a for a in recs if a["requests"]] or recs
            first = min(acting, key=lambda a: a["applied"])
            applied.append(dict(first, took_s=max(a["applied"] + a["took_s"] for a in acting) - first["applied"],
                                requests=sum(a["requests"] for a in acting)))
        fs = {"t0": next(iter(fss.values()))["t0"], "applied": applied,
              "errors": [f"{used[i].name}: {e}" for i, r in fss.items() for e in r["errors"]],
              "error_count": sum(r["error_count"] for r in fss.values()),
              "degradations": [f"{used[i].name}: {d}" for i, r in fss.items() for d in r["degradations"]]}
    return rt, fs


def _merge_pfc(results: list[dict]) -> dict:
    """The PFC agents' results of every machine as one agent's: lists joined, counts added."""
    out: dict = {}
    for r in results:
        for k, v in r.items():
            if isinstance(v, list):
                out.setdefault(k, []).extend(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
            elif k == "late" and k in out:        # late pauses: counted on every machine, the worst kept
                worst = max(out[k], v, key=lambda x: x["leaked_max"])
                out[k] = dict(worst, events=out[k]["events"] + v["events"])
            elif k not in out:
                out[k] = v
    return out


class ClusterLab:
    """A fabric built over the cluster's machines (context manager; exit tears every part down): partition,
    one pinned actor per machine, the underlay checked, every part built at once."""

    def __init__(self, scen, address: str, log: Callable[[str], None] = lambda s: None, name: str | None = None):
        """``name``: a lab that stays up (``testbed up --cluster``): its parts are labs ``<name>m<i>`` of kind
        ``up`` built by detached actors; None: a run's (``c<4 hex>``, torn down on exit)."""
        from .. import topology
        from ..scenario import PlacementSpec
        what = unsupported(scen)
        if what:
            raise PlacementError(f"placement: {what} is not supported over several machines yet; run it on one")
        self.scen, self.address, self.log = scen, address, log
        self.ray = connect(address)
        self.spec = scen.placement or PlacementSpec(partitions=1)
        ms = machines()
        if self.spec.partitions > len(ms):
            raise PlacementError(f"placement.partitions: {self.spec.partitions} machines, but the cluster has "
                                 f"{len(ms)} ({', '.join(m.name for m in ms) or 'none'})")
        self.topo = topology.build(scen.topology)
        # a VNI base of its own per fabric: a torn-down lab's VXLAN devices live on until the kernel has destroyed
        # its namespaces, and a new device with the same VNI on the same underlay is refused (EEXIST)
        self.part = partition(self.topo, self.spec, VNI_BASE * (1 + secrets.randbelow(4094)))
        self.used = ms[:self.spec.partitions]
        base = name or "c" + secrets.token_hex(2)  # a run's part: c<4 hex>m<i> ("ftb-<lab>-pfc" ≤ 15 characters)
        self.name, self.keep = base, name is not None
        self.labs = [f"{base}m{i}" for i in range(len(self.used))]
        self.key = new_key()                       # seals every control message between the parts (auth.py)
        self.parts: Parts | None = None
        self.probes: list[dict] = []
        self.warnings: list[str] = []
        self.build_s = 0.0
        self.docker: dict | None = None            # container hosts: every machine's (the manifest's ``docker``)
        if scen.hosts.docker is not None:
            self._docker_ready()

    def _docker_ready(self) -> None:
        """Container hosts: on the local cluster every machine's part uses this machine's Docker daemon, which a
        part never starts itself (its actor runs inside a machine namespace): start it here if need be and build
        the host image once, before the parts race to. On real machines each part checks its own daemon."""
        from . import local
        if local.read_state() is None:
            return
        from ..container.hosts import ContainerHosts
        docker = self.scen.hosts.docker
        ContainerHosts(self.name, {h: docker.image_of(h) for h in self.topo.hosts}, self.log)

    def ns_of(self, node: str) -> str:
        return f"ftb-{self.labs[self.part.of[node]]}-{node}"

    def __enter__(self) -> "ClusterLab":
        self.parts = parts = Parts(self.ray, self.used, self.labs, detached=self.keep)
        try:
            self.probes = probes = parts.all("probe")
            for i, p in enumerate(probes):
                if not p["root"]:
                    raise PlacementError(f"{parts.name(i)}: its Ray node does not run as root; start it as root "
                                         f"(`sudo ray start …`): a part creates namespaces")
            self.warnings = check_underlay(self.part, self.scen.fabric_mtu, [(p["mtu"], p["rate_bps"]) for p in probes])
            for w in self.warnings:
                self.log(f"warning: {w}")
            tunnels: list[dict] = [{} for _ in self.used]
            for c in self.part.cut:
                a, b = probes[c.a_machine]["address"], probes[c.b_machine]["address"]
                tunnels[c.a_machine][c.a_ifindex] = (c.vni, a, b)
                tunnels[c.b_machine][c.b_ifindex] = (c.vni, b, a)
            t = time.perf_counter()
            kind = "up" if self.keep else "run"
            builds = parts.all("build", each=lambda i: (self.scen, self.labs[i], self.part.nodes(i), tunnels[i],
                                                        kind, self.key))
            self.build_s = time.perf_counter() - t
            for b in builds:
                self.warnings += [w for w in b["warnings"] if w not in self.warnings]
                if b["docker"] is not None:
                    self.docker = self.docker or {"hosts": {}, "notes": []}
                    self.docker["hosts"].update(b["docker"]["hosts"])
                    self.docker["notes"] += [n for n in b["docker"]["notes"] if n not in self.docker["notes"]]
            agents = [b["routing"] for b in builds]
            if all(agents) and len(agents) > 1:      # the routing agents learn of each other (the first: the SM)
                parts.all("routing_peers", each=lambda i: ([e for j, e in enumerate(agents) if j != i], i == 0))
        except BaseException:
            self.close()
            raise
        topo = self.topo
        self.log(f"fabric up over {len(self.used)} machine(s) ({', '.join(m.name for m in self.used)}): "
                 f"{len(topo.hosts)} hosts, {len(topo.switches)} switches, {len(topo.links)} links, "
                 f"{len(self.part.cut)} cut (VXLAN) ({self.build_s:.2f} s); datapath {self.scen.switch.load_balancing}")
        return self

    def close(self) -> list[str]:
        """Tear every part down; returns the problems (one line each). Idempotent."""
        parts, self.parts = self.parts, None
        return parts.close(self.log) if parts is not None else []

    def metrics_start(self) -> dict[str, tuple[str, int]]:
        """Every part's live metrics exporter, on its machine's underlay address: machine name → endpoint."""
        return {m.name: tuple(e) for m, e in zip(self.used, self.parts.all("metrics_start"))}

    def serve_metrics(self, address: str) -> None:
        """``testbed up --cluster --metrics``: every part's exporter, and the federating endpoint at ``address``
        in a detached actor on this (the driver's) machine — it outlives the command; ``down`` ends it."""
        from ray.exceptions import RayError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from ..telemetry.live import MetricsFailed
        from .part import underlay_of
        # the Ray node of this network namespace (the driver may be attached to another machine's raylet: on the
        # local cluster, the head's in ftb-m0), where HOST:PORT means what the user meant
        node = next((n["NodeID"] for n in self.ray.nodes()
                     if n.get("Alive") and underlay_of(n["NodeManagerAddress"])[0] is not None), None)
        if node is None:
            raise MetricsFailed("metrics: no Ray node runs on this machine to hold the endpoint (`ray start "
                                "--address …` here first)")
        machines = self.metrics_start()
        here = NodeAffinitySchedulingStrategy(node, soft=False)
        actor = self.ray.remote(Federation).options(name=f"ftb-{self.name}-met", lifetime="detached", num_cpus=0,
                                                     max_restarts=0, scheduling_strategy=here).remote()
        try:
            self.ray.get(actor.serve.remote(self.name, address, machines, self.key))
        except RayError as e:
            self.ray.kill(actor)
            raise MetricsFailed(_line(e)) from None

    def __exit__(self, *exc) -> None:
        for p in self.close():
            self.log(f"warning: {p}")

    def manifest_section(self) -> dict:
        """The manifest's ``cluster``: nodes (machines), partition (node → machine), cut links."""
        used, part = self.used, self.part
        return {"address": self.address, "strategy": part.strategy, "build_s": self.build_s,
                "nodes": [{"machine": m.name, "address": m.address, "node_id": m.node_id, "lab": self.labs[i],
                           "nodes": len(part.nodes(i)), "underlay_mtu": self.probes[i]["mtu"],
                           "underlay_rate_bps": self.probes[i]["rate_bps"]} for i, m in enumerate(used)],
                "partition": {n: used[m].name for n, m in part.of.items()},
                "cut_links": [dict(c.as_dict(), a_machine=used[c.a_machine].name, b_machine=used[c.b_machine].name)
                              for c in part.cut]}


class Federation:
    """The Ray actor holding a ``testbed up --cluster`` lab's metrics endpoint (telemetry/live.py)."""

    def __init__(self):
        self.fed = None

    def serve(self, lab: str, address: str, machines: dict, key: bytes) -> None:
        from ..telemetry.live import FabricFederation
        self.fed = FabricFederation(lab, address, key=key)
        self.fed.serve(machines)

    def close(self) -> dict:
        return self.fed.close() if self.fed is not None else {}


def down(name: str, address: str, log: Callable[[str], None] = lambda s: None) -> int:
    """Tear down a lab made by ``testbed up --cluster``: every part's actor closes its part and ends. Returns how
    many parts there were."""
    ray = connect(address)
    from ray.exceptions import RayError
    n = 0
    for i in range(64):
        try:
            actor = ray.get_actor(f"ftb-{name}m{i}")
        except ValueError:
            break
        try:
            ray.get(actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
        except RayError as e:
            log(f"warning: part {name}m{i}: {_line(e)}; `testbed clean` on its machine removes it")
        ray.kill(actor)
        n += 1
    try:                                          # its metrics endpoint (`up --cluster --metrics`), if any
        fed = ray.get_actor(f"ftb-{name}-met")
    except ValueError:
        fed = None
    if fed is not None:
        try:
            ray.get(fed.close.remote(), timeout=CLOSE_TIMEOUT_S)
        except RayError as e:
            log(f"warning: the metrics endpoint of '{name}': {_line(e)}")
        ray.kill(fed)
    if not n:
        raise ClusterError(f"no lab '{name}' on the cluster at {address} (`testbed up --cluster` makes one)")
    return n


class ClusterBackend(Backend):
    """The run lifecycle's back end over the cluster's machines (runs/backend.py): a ClusterLab whose parts
    sample, capture and run their own hosts' agents (part.py); ``collect`` merges what every machine measured
    into one run's, and the driver serves every machine's live metrics as one lab's (``metrics``)."""

    def __init__(self, scen, address: str, log: Callable[[str], None] = lambda s: None, metrics: str | None = None):
        self.scen, self.log = scen, log
        self.cl = ClusterLab(scen, address, log)
        self.name, self.topo = self.cl.name, self.cl.topo
        self.federation = None
        if metrics is not None:                # listens now: an address in use is refused before anything is built
            from ..telemetry.live import FabricFederation
            self.federation = FabricFederation(self.cl.name, metrics, key=self.cl.key)
        self.metrics_at = metrics
        self.served: dict | None = None
        self.outdir: Path | None = None

    @property
    def warnings(self) -> list[str]:
        return self.cl.warnings

    def up(self, log: Callable[[str], None]) -> None:
        try:
            self.cl.__enter__()
            if self.federation is not None:
                self.federation.serve(self.cl.metrics_start())
                log(f"metrics: http://{self.metrics_at}/metrics (every machine's, fetched at each scrape)")
        except BaseException:
            self.down(None)
            raise

    def ns_of(self, node: str) -> str:
        return self.cl.ns_of(node)

    def start(self, origin: float, outdir: Path, log: Callable[[str], None]) -> None:
        self.cl.parts.all("start", origin)

    def traffic_kw(self) -> dict:
        parts, of = self.cl.parts, self.cl.part.of
        return {"agent_set": lambda hosts, _ns, _containers: RemoteAgents(parts, of, hosts)}

    def failures_go(self, t0: float) -> None:
        self.cl.parts.all("failures_go", t0)

    def stop(self) -> None:
        if self.federation is not None:          # before the parts end: a scrape then would find them gone
            self.served = self.federation.close()

    def collect(self, flows) -> Collected:
        """Every part's last sample, paths, counters and helper results (``finish`` also tears it down), merged."""
        from ..telemetry.links import model_error
        parts, used, got = self.cl.parts, self.cl.used, Collected()
        finals: dict[int, dict] = {}
        for i, a in enumerate(parts.actors):
            if i in parts.dead:
                continue
            try:
                finals[i] = parts.get(i, a.finish.remote())
            except PartFailed as e:
                got.errors.append(str(e))
        for i, f in finals.items():
            got.errors += [f"{used[i].name}: {x}" for x in f["failures"]]
            if f["error"]:
                got.errors.append(f"{used[i].name}: {f['error']}")
        got.rows = [r for f in finals.values() for r in f["rows"]]
        got.flow_paths = [p for f in finals.values() for p in f["flow_paths"]]
        for f in finals.values():
            for k, v in f["drops"].items():
                got.drops[k] = got.drops.get(k, 0) + v
        cgroups = all(f["cpu"].get("cpu_accounting") == "cgroup" for f in finals.values())  # one per machine
        got.cpu = {"cpu_accounting": "cgroup" if cgroups else "core-total",
                   "cpu_samples": sorted((s for f in finals.values() for s in f["cpu"]["cpu_samples"]),
                                         key=lambda s: s[0]),
                   "cpu_steal": sorted((s for f in finals.values() for s in f["cpu"]["cpu_steal"]),
                                       key=lambda s: s[0])}
        got.degradations = [f"{used[i].name}: {d}" for i, f in finals.items() for d in f["degradations"]]
        got.degradations += [f"{used[i].name}: telemetry: {f['late_samples']} sample(s) taken late"
                             for i, f in finals.items() if f["late_samples"]]
        ints = {i: f["int"] for i, f in finals.items() if f.get("int") is not None}
        if ints:
            got.int_rows, got.int_stats = _merge_int(ints, self.topo, self.cl.part.of, flows)
            got.errors += [f"{used[i].name}: {x['error']}" for i, x in ints.items() if x["error"]]
        routing, scheduler = _merge_routing(finals, used)
        got.helpers = {"pfc": _merge_pfc([f["pfc"] for f in finals.values()]), "routing": routing,
                       "scheduler": scheduler}
        got.model_error = model_error([s for f in finals.values() for s in f["model_samples"]])
        got.health = {"samples": sum(f["health"]["samples"] for f in finals.values()),
                      "late_samples": sum(f["health"]["late_samples"] for f in finals.values()),
                      "failed_qdisc_dumps": sum(f["health"]["failed_qdisc_dumps"] for f in finals.values()),
                      "error": next((f["health"]["error"] for f in finals.values() if f["health"]["error"]), None)}
        got.resyncs = sum(f["resyncs"] for f in finals.values())
        # the parts were built at once: a phase took as long as its slowest machine (each one's: ``cluster``)
        for f in finals.values():
            for k, v in f["timings"].items():
                got.timings[k] = max(got.timings.get(k, 0.0), v)
        got.pcaps = _write_pcaps(self.outdir, finals.values())
        got.docker = self.cl.docker
        sections = self.cl.manifest_section()
        for i, node in enumerate(sections["nodes"]):
            node["build_timings_s"] = finals[i]["timings"] if i in finals else None
        got.sections = {"cluster": sections}
        return got

    def capture(self, outdir: Path) -> None:
        self.outdir = outdir                     # each part captures on its machine; collect brings the files here

    def down(self, got: Collected | None) -> list[str]:
        try:
            problems = self.cl.close()
        finally:
            if self.federation is not None:      # also when the parts were never built
                self.served = self.federation.close()
        if got is not None:
            got.metrics = self.served
            if self.federation is not None:
                got.degradations += self.federation.degradations()
        return problems


def run(scen, address: str, out: str | Path | None = None, source: str = "",
        log: Callable[[str], None] = lambda s: None, metrics: str | None = None) -> tuple[Path, dict]:
    """Run ``scen`` with its fabric split over the cluster's machines (``placement``; none: one machine): the one
    run lifecycle (runs/lifecycle.py) over ClusterBackend; returns and raises as on one machine. ``metrics``:
    HOST:PORT where the driver serves every machine's live metrics as one lab's (telemetry/live.py)."""
    from ..runs import lifecycle
    return lifecycle.run(scen, out, source, log, backend=lambda: ClusterBackend(scen, address, log, metrics))


__all__ = ["ClusterBackend", "ClusterError", "ClusterLab", "PartFailed", "down", "run", "unsupported"]
