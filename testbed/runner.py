"""One experiment end to end: scenario → fabric → datapath → workload → telemetry → report.

Everything the run built is removed before ``run`` returns, whatever happens (the Lab context manager);
results are written only after teardown succeeded or failed, and into a fresh directory, so a failing run never
damages the results of completed ones.
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import secrets
import time
from pathlib import Path
from typing import Callable

from . import __version__, report, telemetry, workloads
from .fabric import netns
from .fabric.capture import Captures
from .lab import Lab, reap_stale
from .scenario import Scenario, to_dict

RESULTS_DIR = Path("results")


def new_run_id(scen: Scenario) -> str:
    return f"{scen.name}-{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _versions() -> dict:
    out = {"fabric-testbed": __version__, "python": platform.python_version()}
    for mod in ("pyroute2", "pydantic", "pandas", "scapy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:             # noqa: BLE001 — a version string is best effort
            pass
    try:
        import bcc
        out["bcc"] = getattr(bcc, "__version__", "?")
    except Exception:                 # noqa: BLE001
        pass
    return out


def set_host_classes(scen: Scenario, flows) -> None:
    """hosts.pfc: each flow's socket selects its host NIC class (the leaf's DSCP → priority map)."""
    if not (scen.hosts.pfc and scen.switch.classes_on):
        return
    tc = scen.switch.qos("leaf").traffic_classes
    for f in flows:
        f.prio = tc.dscp.get(f.dscp, tc.default)


def run(scen: Scenario, out: str | Path | None = None, source: str = "",
        log: Callable[[str], None] = lambda s: None) -> tuple[Path, dict]:
    """Run the scenario; return (result directory, summary row)."""
    from . import doctor

    run_id = new_run_id(scen)
    outdir = Path(out) if out else RESULTS_DIR / run_id
    if outdir.exists() and any(outdir.iterdir()):
        raise FileExistsError(f"{outdir}: already holds results; choose another --out")
    if scen.traffic.engine == "rxe":
        from .workloads import rxe
        rxe.require()                         # one clear line where the kernel has no rdma_rxe, before building
    reap_stale()
    caps = doctor.as_dict(doctor.probe(with_bcc=False))
    lab_name = "r" + secrets.token_hex(4)
    duration_s = scen.duration / 1e9
    started = time.time()
    with Lab(scen, lab_name, source=source) as lab:
        topo = lab.topo
        log(f"fabric up: {len(topo.hosts)} hosts, {len(topo.switches)} switches, {len(topo.links)} links "
            f"({sum(lab.fabric.timings.values()):.2f} s); datapath {scen.switch.load_balancing}")
        coll_rows = None
        flows = ([] if scen.traffic.collective else workloads.plan(scen.traffic, topo, scen.seed, duration_s))
        set_host_classes(scen, flows)
        for w in lab.warnings:
            log(f"warning: {w}")
        if scen.traffic.engine == "tcp" and scen.traffic.ecn != "none":
            for h in topo.hosts:
                netns.write_sysctl(lab.fabric.ns[h], "net.ipv4.tcp_ecn", 1)
        host_rate = scen.topology.host_link.rate
        packet_size = scen.traffic.packet_size or scen.topology.mtu
        sampler = telemetry.LinkSampler(topo, lab.datapath, scen.telemetry.interval / 1e9, lab.fabric)
        captures = Captures(lab.fabric, list(scen.capture), outdir)
        captures.start()
        sampler.start()
        try:
            what = (f"{len(scen.traffic.job_list())} collective job(s)" if scen.traffic.collective else
                    f"{len(flows)} {scen.traffic.engine} flows, pattern {scen.traffic.pattern}")
            log(f"traffic: {what} ({scen.traffic.engine}), "
                f"up to {duration_s:g} s")
            sndbuf = min(workloads.DEFAULT_SNDBUF, scen.topology.host_link.buffer * 3 // 4)
            if scen.traffic.collective:
                from .workloads import collectives
                flows, pairs, coll_rows = collectives.run_jobs(scen.traffic, topo, scen.seed,
                                                               lambda h: lab.fabric.ns[h], duration_s, packet_size,
                                                               sndbuf_bytes=sndbuf, log=log)
                results = [r for r, _ in pairs]
                steps = [s for _, s in pairs]
            elif scen.traffic.engine == "rxe":
                from .workloads import rxe
                results = rxe.run_flows(lab, flows, duration_s, scen.traffic.rxe.test, scen.traffic.rxe.msg_bytes,
                                        log_dir=outdir / "perftest")
            else:
                results = workloads.run(flows, lambda h: lab.fabric.ns[h], duration_s, packet_size,
                                        sndbuf_bytes=sndbuf)
        finally:
            sampler.stop()
            pcaps = captures.stop()
        used = telemetry.paths_used(topo, lab.datapath.flow_paths(), flows)
        drops = lab.datapath.drop_counters()
        resyncs = lab.datapath.resyncs
        timings = dict(lab.fabric.timings)
    ended = time.time()
    from .control.pfc import summarize_reactions
    resyncs += (lab.pfc_results or {}).get("drift_resyncs", 0)
    qos = {"queue_model_error": sampler.model_error(), "queue_model_resyncs": resyncs,
           "headroom_warnings": lab.warnings,
           "pfc_agent": summarize_reactions(lab.pfc_results) if lab.pfc_results else None,
           "pfc_agent_errors": (lab.pfc_results or {}).get("errors", [])}

    flow_rows = []
    for f, r in zip(flows, results):
        row = r.to_dict()
        row["paths_used"] = used.get(f.flow_id, 0)
        row["src_leaf"] = topo.leaf_of(f.src, f.rail)
        if coll_rows is not None:
            st = steps[len(flow_rows)]
            row.update(job=st.job, iteration=st.iteration, step=st.index)
        flow_rows.append(row)
    manifest = {
        "run_id": run_id, "scenario": to_dict(scen), "source": source, "seed": scen.seed,
        "versions": _versions(), "kernel": platform.release(), "capabilities": caps,
        "start_time": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(),
        "end_time": dt.datetime.fromtimestamp(ended, dt.timezone.utc).isoformat(),
        "lab": lab_name, "build_timings_s": timings, "datapath_drops": drops, "pcap": pcaps,
        "hostname": platform.node(), "cpus": os.cpu_count(), "qos": qos,
    }
    meta = {"run_id": run_id, "scenario": scen.name, "load_balancing": scen.switch.load_balancing,
            "seed": scen.seed, "duration_s": duration_s,
            "offered_mbps": workloads.offered_mbps(flows, host_rate, duration_s),
            "queue_model_error": qos["queue_model_error"]["mean"]}
    row = report.write_run(outdir, manifest, sampler.rows, flow_rows, sampler.cpu.result(), meta,
                           collectives=coll_rows)
    return outdir, row
