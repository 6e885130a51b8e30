"""One experiment end to end, the same on every back end: scenario → fabric up → time zero → telemetry →
traffic → collect → results (manifest last) → fabric down.

Everything the run built is removed before ``run`` returns, whatever happens (``Backend.down`` on every path).
The run has one clock: time zero is when the link sampler starts, and links.csv, flows.csv and collectives.csv
times are seconds since it. Nothing fails silently: a helper that dies (the PFC agent, the telemetry sampler, a
machine's part) or a traffic agent that fails stops the run, the results collected so far are still written
(manifest ``failed`` says what happened) and ``run`` raises RunFailed with one line; a degradation (no
SCHED_FIFO, a failed counter read, a late sample) goes to the manifest's ``degradations`` and the log. The
manifest and every CSV are built here alone, from what the back end reports (backend.Collected).
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import report, workloads
from ..errors import HelperFailed, TestbedError
from ..fabric.port import nics_have_classes
from ..scenario import Scenario, to_dict
from ..telemetry import paths_used
from ..version import __version__
from ..workloads import WorkloadError
from ..workloads.flows import rto_warning
from .backend import Backend, Collected

RESULTS_DIR = Path("results")
TIMELINE_BIN_S = 0.01          # runs with failures: receivers count bytes per 10 ms (failures.csv's dips)


class RunFailed(TestbedError):
    """The run stopped early; the message is one line (what failed, where the partial results are)."""

    def __init__(self, msg: str, outdir: Path | None = None):
        super().__init__(msg)
        self.outdir = outdir       # the partial results, when they were written


def new_run_id(scen: Scenario) -> str:
    return f"{scen.name}-{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _versions() -> dict:
    import importlib.metadata as md
    out = {"fabric-testbed": __version__, "python": platform.python_version()}
    for dist in ("pyroute2", "pydantic", "pandas", "scapy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    try:
        import bcc
        out["bcc"] = getattr(bcc, "__version__", None)
    except ImportError:
        out["bcc"] = None
    return out


def host_prio(scen: Scenario, dscp: int) -> int | None:
    """The host NIC class a flow marked ``dscp`` takes (the leaf's DSCP → priority map) when NICs have classes
    (they obey PFC or credits); None: the NIC's single queue."""
    if not nics_have_classes(scen.switch, scen.hosts.pfc):
        return None
    tc = scen.switch.qos("leaf").traffic_classes
    return tc.dscp.get(dscp, tc.default)


def set_host_classes(scen: Scenario, flows) -> None:
    """Each flow's socket selects its host NIC class (see host_prio)."""
    for f in flows:
        f.prio = host_prio(scen, f.dscp)


@dataclass
class Traffic:
    """What the traffic phase produced: flows with their results (in the same order), collective rows."""
    flows: list = field(default_factory=list)
    results: list = field(default_factory=list)
    transfers: list | None = None          # collectives/replay: each flow's transfer (None: background)
    origins: dict = field(default_factory=dict)   # collectives: transfer id → its job step (replay.Origin)
    collectives: list | None = None
    info: dict = field(default_factory=dict)


def _traffic(scen: Scenario, be: Backend, origin: float, check: Callable[[], None], outdir: Path,
             log: Callable[[str], None], out: Traffic) -> Traffic:
    """Plan and run the scenario's traffic in the back end's namespaces; fills ``out`` as it goes (what a
    failure leaves is still reported)."""
    topo, tr = be.topo, scen.traffic
    duration_s = scen.duration / 1e9
    kw = dict(be.traffic_kw(), sndbuf_bytes=min(workloads.DEFAULT_SNDBUF, scen.topology.host_link.buffer * 3 // 4),
              check=check, on_t0=be.failures_go if scen.failures else None,
              timeline_bin_s=TIMELINE_BIN_S if scen.failures else None)
    if tr.scheduled:
        return scheduled_traffic(scen, topo, be.ns_of, origin, outdir, log, **kw)
    if tr.engine == "mpi":
        m = tr.mpi
        log(f"traffic: Open MPI {m.benchmark} over {m.transport}, {len(m.sizes)} size(s) × {m.iterations} "
            f"iterations, up to {duration_s:g} s")
        out.collectives, out.info["mpi"] = be.mpi_run(origin, duration_s, outdir / "mpi", check)
        return out
    out.flows = workloads.plan(tr, topo, scen.seed, duration_s)
    set_host_classes(scen, out.flows)
    log(f"traffic: {len(out.flows)} {tr.engine} flows, pattern {tr.pattern}, up to {duration_s:g} s")
    if tr.engine == "rxe":
        out.results = be.rxe_flows(out.flows, duration_s, out.info, outdir)
        shift = out.info.get("t0", origin) - origin            # perftest times are relative to its own t0
        for r in out.results:
            r.start_s = None if r.start_s is None else r.start_s + shift
            r.end_s = None if r.end_s is None else r.end_s + shift
        return out
    if tr.engine == "iperf3":
        out.results, failed = be.iperf3_flows(out.flows, origin, duration_s, outdir / "iperf3", check)
        if failed:
            raise WorkloadError(failed)
        return out
    out.results = workloads.run(out.flows, be.ns_of, duration_s, scen.packet_size, info=out.info, origin=origin,
                                **kw)
    for f, r in zip(out.flows, out.results):     # the fabric controller may have given a flow another port
        f.sport = r.sport
    return out


def scheduled_traffic(scen: Scenario, topo, ns_of, origin: float, outdir: Path, log: Callable[[str], None],
                      **run_kw) -> Traffic:
    """Collectives or a replay (``traffic.scheduled``), with the pattern's background flows when it is poisson;
    ``run_kw`` goes to workloads.run (a fabric over several machines passes its ``agent_set``)."""
    from ..workloads import replay
    tr, out = scen.traffic, Traffic()
    duration_s = scen.duration / 1e9
    if tr.replay is not None:
        transfers = replay.dilated(replay.read(tr.replay), scen.dilation)
        outdir.mkdir(parents=True, exist_ok=True)            # the schedule travels with its results
        shutil.copyfile(tr.replay, outdir / f"schedule{Path(tr.replay).suffix or '.csv'}")
        what = f"replay of {len(transfers)} transfers"
    else:
        transfers = replay.from_collectives(tr, topo, scen.seed, out.origins)
        what = f"{len(tr.job_list())} collective job(s), {len(transfers)} transfers"
    bg = tr.pattern == "poisson"
    log(f"traffic: {what}{' + poisson background' if bg else ''} ({tr.engine}), up to {duration_s:g} s")
    played = replay.play(transfers, tr, topo, scen.seed, ns_of, duration_s, scen.packet_size,
                         prio=host_prio(scen, tr.wire_dscp), origins=out.origins, background=bg, info=out.info,
                         origin=origin, **run_kw)
    out.flows, out.transfers, out.results, out.collectives = played.flows, played.owner, played.results, played.rows
    return out


def flow_rows(topo, traffic: Traffic, used: dict[int, int], packet_size: int) -> list[dict]:
    """flows.csv: every flow's result with its paths, ideal FCT and slowdown, leaves and job step."""
    from ..workloads.fct import IdealFct
    ideal_of = IdealFct(topo, packet_size)
    rows = []
    for i, (f, r) in enumerate(zip(traffic.flows, traffic.results)):
        row = r.to_dict()
        row["paths_used"] = used.get(f.flow_id, 0)
        if f.size_bytes is not None:
            ideal = ideal_of(f)
            row["ideal_fct_s"] = ideal
            row["slowdown"] = r.fct_s / ideal if ideal and r.fct_s is not None and r.complete else None
        row["src_leaf"] = topo.leaf_of(f.src, f.rail)
        row["dst_leaf"] = topo.leaf_of(f.dst, f.to_rail)
        row["dst_rail"] = f.to_rail
        if traffic.transfers is not None:
            t = traffic.transfers[i]
            o = traffic.origins.get(t.id) if t is not None else None
            if o is not None:
                row.update(job=o.job, iteration=o.iteration, step=o.step)
            else:
                row["transfer"], row["tag"] = (t.id, t.tag) if t is not None else (None, "background")
        rows.append(row)
    return rows


def cc_rows(traffic) -> list[dict] | None:
    """cc.csv rows: every flow's CC trace (None when no flow ran a congestion control)."""
    traces = (traffic.info or {}).get("cc_traces")
    if not traces:
        return None
    return [{"flow_id": fid, "time_s": t, "cwnd_bytes": w, "rate_bps": r}
            for fid, rows in sorted(traces.items()) for t, w, r in rows]


def routing_degradations(scen, rt: dict, fs: dict) -> list[str]:
    """What the routing agent(s) and failure scheduler(s) could not do (their results, merged over machines)."""
    out = []
    if rt.get("error_count"):
        out.append(f"routing agent: {rt['error_count']} failed sweep(s) or flooding(s), e.g. {rt['errors'][0]}")
    if rt.get("late_sweeps"):
        out.append(f"subnet manager: {rt['late_sweeps']} sweep(s) started late (the SM fell behind its interval)")
    if rt.get("changes_dropped"):
        out.append(f"routing agent: {rt['changes_dropped']} change record(s) beyond the first 500 not kept")
    out += fs.get("degradations", [])
    if fs.get("error_count"):
        out.append(f"failure scheduler: {fs['error_count']} failed action(s), e.g. {fs['errors'][0]}")
    if scen.failures and fs and len(fs.get("applied", [])) < len(scen.failures):
        out.append(f"failure scheduler: {len(scen.failures) - len(fs.get('applied', []))} event(s) not "
                   f"applied (the traffic ended first)")
    return out


def int_degradations(stats: dict | None, scen) -> list[str]:
    """What INT could not do: reports lost for a full ring buffer, packets it could not instrument, HPCC's host
    stacks that never reached a receiver (its flows would have run on their initial window)."""
    out = []
    if stats and scen.host_int_hops and not stats["delivered"]:
        out.append("INT: no HPCC data packet reached its receiver with an INT stack: traffic.cc hpcc had no hop "
                   "records to compute its window from")
    if stats and stats["export_lost"]:
        out.append(f"INT: {stats['export_lost']} report(s) lost (the ring buffer was full; int.csv lacks them)")
    if stats and stats["failed"]:
        out.append(f"INT: {stats['failed']} packet(s) the switch program could not instrument or strip")
    return out


def degradations(scen, topo, got: Collected, traffic: Traffic) -> list[str]:
    """Everything that made the run less exact without stopping it, in one list."""
    out = list(got.degradations)
    pfc = got.helpers.get("pfc") or {}
    out += pfc.get("degradations", [])
    if pfc.get("error_count"):
        out.append(f"PFC agent: {pfc['error_count']} failed action(s), e.g. {pfc['errors'][0]}")
    out += routing_degradations(scen, got.helpers.get("routing") or {}, got.helpers.get("scheduler") or {})
    out += traffic.info.get("agent_problems", [])
    out += (traffic.info.get("mpi") or {}).get("degradations", [])
    own = own_port_flows(traffic)
    if own:
        out.append(f"controller: {len(own)} flow(s) got no answer from the fabric controller within "
                   f"{scen.controller.timeout / 1e6:g} ms and kept their own source port (e.g. flow {own[0]})")
    static = [r.flow_id for r in traffic.results if getattr(r, "entropy_from", None) == "static"]
    if static:
        out.append(f"collective helper: {len(static)} flow(s) got no decision within "
                   f"{scen.traffic.collective.adapt.timeout / 1e6:g} ms and were sent as the static collective "
                   f"(e.g. flow {static[0]})")
    if (rto := rto_warning(scen.traffic, topo)) is not None:
        out.append(rto)
    return out + int_degradations(got.int_stats, scen)


def routing_section(rt: dict, origin: float) -> dict | None:
    """The routing agent's report for the manifest, times on the run's clock."""
    if not rt:
        return None

    def rel(t):
        return None if t is None else t - origin
    changes = [dict(c, t_detect=rel(c["t_detect"]), t_done=rel(c["t_done"]), t_event=rel(c.get("t_event")))
               for c in rt.get("changes", [])]
    return {"mode": rt.get("mode"), "engine": rt.get("engine"), "sweep_interval_s": rt.get("sweep_interval_s"),
            "sweeps": rt.get("sweeps"), "late_sweeps": rt.get("late_sweeps"), "sweep_s": rt.get("sweep_s"),
            "entries": rt.get("entries"), "changes": changes,
            "local": [dict(e, t=rel(e["t"])) for e in rt.get("local", [])], "errors": rt.get("errors", []),
            "floods_sent": rt.get("floods_sent"), "floods_taken": rt.get("floods_taken"),
            "rejected": rt.get("rejected"),
            "remote_entries": rt.get("remote_entries")}


def sm_rows(topo, rt: dict, origin: float) -> list[dict] | None:
    """sm.csv: the SM's initial programming and every sweep that changed its tables."""
    if rt.get("mode") != "sm":
        return None
    rows = []
    for n, c in enumerate(rt.get("changes", [])):
        ports = " ".join(f"{topo.port(i).node}/{topo.port(i).ifname}:{'up' if up else 'down'}"
                         for i, up in c["ports"]) if c["kind"] != "initial" else f"{c['port_count']} ports"
        t_ev = c.get("t_event")
        rows.append({"sweep": n, "time_s": c["t_detect"] - origin, "kind": c["kind"], "ports": ports,
                     "detect_s": (c["t_detect"] - t_ev) if (t_ev is not None and c["kind"] != "initial") else None,
                     "compute_s": c["compute_s"], "entries": c["entries"], "install_s": c["install_s"],
                     "held_s": c["t_done"] - c["t_detect"], "switches": c["switches"]})
    return rows


def own_port_flows(traffic: Traffic) -> list[int]:
    """The flows whose host got no answer from the fabric controller in time (they kept their own port)."""
    return sorted(r.flow_id for r in traffic.results if getattr(r, "entropy_from", None) == "own")


def controller_section(scen, got: Collected, traffic: Traffic) -> dict | None:
    """The fabric controller's account (controller.entropy plan): what it planned and answered, and the flows
    whose host got no answer in time (they kept their own port)."""
    if scen.controller.entropy == "off":
        return None
    res = {k: v for k, v in (got.controller or {}).items() if k != "rows"}
    own = own_port_flows(traffic)
    return dict(res, entropy=scen.controller.entropy, fallbacks=len(own), fallback_flows=own[:50])


def collective_section(scen, got: Collected, traffic: Traffic) -> dict | None:
    """The collective helper's account (traffic.collective.adapt): its policy and signals, what it was asked
    and decided, and the flows sent as the static collective because no decision came in time."""
    a = scen.traffic.collective.adapt
    if a is None:
        return None
    res = {k: v for k, v in (got.collective or {}).items() if k not in ("rows", "signals")}
    static = sorted(r.flow_id for r in traffic.results if getattr(r, "entropy_from", None) == "static")
    return dict(res, policy=a.policy, signals=list(a.signals), static_flows=len(static), static_flow_ids=static[:50])


def with_adapt_decisions(rows: list[dict] | None, got: Collected) -> list[dict] | None:
    """collectives.csv rows with ``adapt_decisions`` (the flows of that operation its policy sent otherwise than
    the static collective: on another QP's path, or in another ring order; 0: decided, nothing changed; empty:
    never decided) and ``adapt_ring`` (the ring order it ran, 0 = the job's own)."""
    if rows is None or got.collective is None:
        return rows
    by_key = {r["key"]: r for r in got.collective.get("rows", [])}
    out = []
    for r in rows:
        d = by_key.get(f"{r['job']}.{r['iteration']}", {})
        out.append(dict(r, adapt_decisions=d.get("moved"), adapt_ring=d.get("variant")))
    return out


def controller_ports(ctl: dict | None) -> dict[int, set[int]]:
    """flow_id → every source port the fabric controller gave the flow (controller.csv's ``new``)."""
    out: dict[int, set[int]] = {}
    for r in (ctl or {}).get("rows") or []:
        out.setdefault(int(r["flow"]), set()).add(int(r["new"]))
    return out


def controller_reaction_ms(applied: list[dict], replanned_at: list[float] | None) -> float | None:
    """The slowest of the adaptive controller's reactions to the failures (ms): from each failure's application
    (the scheduler's clock) to the first tick that saw the ports change and re-planned. None without failures;
    NaN when a failure was never seen."""
    if not applied:
        return None
    seen = sorted(replanned_at or [])
    worst = 0.0
    for a in applied:
        after = [t for t in seen if t >= a["applied"]]
        if not after:
            return float("nan")
        worst = max(worst, (after[0] - a["applied"]) * 1e3)
    return worst


def manifest(scen, run_id: str, source: str, caps: dict, started: float, ended: float, be: Backend,
             got: Collected, traffic: Traffic, failures: list[str], degraded: list[str], origin: float) -> dict:
    """manifest.json: the same keys from every back end (its own sections added: ``cluster``)."""
    from ..qos.pfc import summarize_reactions
    pfc = got.helpers.get("pfc") or {}
    qos = {"queue_model_error": got.model_error,
           "queue_model_resyncs": got.resyncs + pfc.get("drift_resyncs", 0),
           "headroom_warnings": be.warnings, "pfc_agent": summarize_reactions(pfc) if pfc else None,
           "pfc_agent_errors": pfc.get("errors", [])}
    applied = (got.helpers.get("scheduler") or {}).get("applied", [])
    out = {
        "run_id": run_id, "scenario": to_dict(scen), "source": source, "seed": scen.seed,
        "profile": scen.profile, "profile_keys": list(scen.profile_keys),
        "versions": _versions(), "kernel": platform.release(), "capabilities": caps,
        "start_time": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(),
        "end_time": dt.datetime.fromtimestamp(ended, dt.timezone.utc).isoformat(),
        "lab": be.name, "origin": origin, "build_timings_s": got.timings, "datapath_drops": got.drops, "pcap": got.pcaps,
        "hostname": platform.node(), "cpus": os.cpu_count(), "qos": qos,
        "failed": failures or None, "degradations": degraded, "telemetry": got.health,
        "unknown_packets": traffic.info.get("unknown_packets", {}),
        "routing": routing_section(got.helpers.get("routing") or {}, origin),
        "failures": [dict(a, applied=a["applied"] - origin) for a in applied] if scen.failures else None,
        "time_dilation": ({"factor": scen.dilation, "auto": scen.real_doc.get("time_dilation") == "auto",
                           "budget": scen.auto_budget,
                           "scaled_keys": list(scen.dilated_keys), "scenario_real": scen.real_doc}
                          if scen.real_doc is not None else None),
        "int": (dict(got.int_stats, fabric_mtu=scen.fabric_mtu, host_stacks=scen.host_int_hops > 0,
                     host_mtu=scen.host_mtu) if got.int_stats is not None else None),
        "wcmp_controller": got.wcmp_controller, "metrics": got.metrics or None, "docker": got.docker,
        "mpi": traffic.info.get("mpi"),
        "controller": controller_section(scen, got, traffic),
        "collective_adapt": collective_section(scen, got, traffic),
    }
    out.update(got.sections)
    return out


def run(scen: Scenario, out: str | Path | None = None, source: str = "",
        log: Callable[[str], None] = lambda s: None, metrics: str | None = None,
        backend: Callable[[], Backend] | None = None) -> tuple[Path, dict]:
    """Run the scenario; return (result directory, summary row). Raises RunFailed (after writing what it has)
    when a helper or traffic agent failed. ``metrics``: HOST:PORT to serve live Prometheus metrics on (this
    machine's back end). ``backend``: makes the back end (default: this machine, local.LocalBackend)."""
    from .local_backend import LocalBackend

    run_id = new_run_id(scen)
    outdir = Path(out) if out else RESULTS_DIR / run_id
    if outdir.exists() and any(outdir.iterdir()):
        raise FileExistsError(f"{outdir}: already holds results; choose another --out")
    be = backend() if backend is not None else LocalBackend(scen, source, metrics)
    caps = be.capabilities()
    started = time.time()
    failures: list[str] = []
    traffic = Traffic()
    got: Collected | None = None
    be.up(log)
    try:
        be.capture(outdir)
        origin = time.time()                    # the run's time zero: the sampler's first reading
        be.start(origin, outdir, log)
        try:
            traffic = _traffic(scen, be, origin, be.check, outdir, log, traffic)
        except (HelperFailed, WorkloadError) as e:
            failures.append(str(e))
        finally:
            be.stop()
        got = be.collect(traffic.flows)
    finally:
        down_failures = be.down(got)
        failures += [e for e in down_failures if e not in failures]     # a helper seen dead: said once
    failures += [e for e in got.errors if e not in failures]
    ended = time.time()
    if not traffic.results:               # the traffic failed before results: one empty result per flow
        from ..workloads.results import flow_result
        traffic.results = [flow_result(f, origin, {}, {}) for f in traffic.flows]
    topo = be.topo
    degraded = degradations(scen, topo, got, traffic)
    for d in degraded:
        log(f"degraded: {d}")
    man = manifest(scen, run_id, source, caps, started, ended, be, got, traffic, failures, degraded, origin)
    fail_rows = None
    if scen.failures:
        from ..routing.failures import rows as failure_rows
        fail_rows = failure_rows(scen, topo, (got.helpers.get("scheduler") or {}).get("applied", []),
                                 got.helpers.get("routing") or {}, traffic.info.get("timelines") or {}, origin)
    meta = {"run_id": run_id, "scenario": scen.name, "load_balancing": scen.switch.load_balancing,
            "seed": scen.seed, "duration_s": scen.duration / 1e9,
            "offered_mbps": workloads.offered_mbps(traffic.flows, scen.topology.host_link.rate,
                                                   scen.duration / 1e9),
            "queue_model_error": man["qos"]["queue_model_error"]["mean"],
            "failed": failures[0] if failures else None, "profile": scen.profile}
    if scen.controller.entropy != "off":
        rows = (got.controller or {}).get("rows") or []
        meta["controller_replans"] = sum(1 for r in rows if r.get("reason") != "start")
        meta["planned_shared_links"] = (got.controller or {}).get("planned_shared_links")
        if scen.controller.entropy == "adaptive" and scen.failures:
            meta["controller_reaction_ms_max"] = controller_reaction_ms(
                (got.helpers.get("scheduler") or {}).get("applied", []), (got.controller or {}).get("replanned_at"))
    if "mpi" in traffic.info:
        meta["tcp_retransmits"] = traffic.info["mpi"]["tcp_retransmits"]    # the ranks' hosts' TCP resends
    if scen.dilation > 1:
        meta["time_dilation"] = scen.dilation       # results gain real-unit columns (dilation.py)
    used = paths_used(topo, got.flow_paths, traffic.flows, controller_ports(got.controller))
    pfc_agent = man["qos"]["pfc_agent"]
    cpu = dict(got.cpu, pfc_late=pfc_agent["late"]) if pfc_agent else got.cpu   # the guard judges it too
    row = report.write_run(outdir, man, got.rows, flow_rows(topo, traffic, used, scen.packet_size), cpu, meta,
                           collectives=with_adapt_decisions(traffic.collectives, got), failures=fail_rows,
                           sm=sm_rows(topo, got.helpers.get("routing") or {}, origin), int_rows=got.int_rows,
                           weights=got.weights, cc=cc_rows(traffic),
                           controller=((got.controller or {}).get("rows") or []) if scen.controller.entropy != "off"
                           else None,
                           collective_signals=(got.collective or {}).get("signals", [])
                           if scen.traffic.collective.adapt is not None else None)
    if failures:
        raise RunFailed(f"{failures[0]} (results collected so far: {outdir})", outdir)
    return outdir, row

