"""The ``testbed`` command: run, up, down, status, exec, sweep, validate, report, graph, doctor, clean, bench, image, vm.

Every failure a user can cause (a wrong key, a missing kernel feature, no root, a name in use) ends as one line
``error: …`` on stderr and a non-zero exit, with nothing left in the kernel. FTB_DEBUG=1 shows tracebacks.
"""
from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import click

from . import scenario as scenario_mod

ESSENTIAL = ("root", "bpf", "veth", "clsact", "cls_bpf", "tbf")


class UserError(click.ClickException):
    def show(self, file=None):
        click.echo(f"error: {self.message}", err=True)


def _known_errors() -> tuple[type[BaseException], ...]:
    """What the CLI prints as one line and exits non-zero on: every error of the project, and the system's."""
    from .errors import TestbedError
    return (TestbedError, FileExistsError, PermissionError, ValueError, OSError)


class Terminated(BaseException):
    """SIGTERM/SIGHUP, raised where the main thread is, so every ``finally`` tears down what it built."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_OWNER_PID = os.getpid()


def _on_sigterm(signum, frame):
    if os.getpid() != _OWNER_PID:        # a forked child still running Python (a library's helper): it must die,
        os._exit(128 + signum)           # not unwind into the CLI's code as a second copy of the run
    raise Terminated(signum)


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UserError(f"testbed {what} needs root (network namespaces, tc and eBPF): run it with sudo")


def _load(path: str, sets: tuple[str, ...]):
    return scenario_mod.load(path, sets)


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def _pick_lab(name: str | None) -> str:
    from .lab import all_labs
    labs = all_labs()
    if name:
        if not any(lab["name"] == name for lab in labs):
            raise UserError(f"no lab named '{name}' (see `testbed status`)")
        return name
    if len(labs) == 1:
        return labs[0]["name"]
    if not labs:
        raise UserError("no lab is up (start one with `testbed up SCENARIO`)")
    raise UserError(f"{len(labs)} labs are up ({', '.join(lab['name'] for lab in labs)}): name one with --lab")


set_option = click.option("--set", "sets", multiple=True, metavar="KEY.PATH=VALUE",
                          help="Override any scenario key, e.g. --set switch.load_balancing=spray (repeatable).")
cluster_option = click.option("--cluster", metavar="ADDRESS",
                              help="A Ray cluster (HOST:PORT of its head), or `auto`: the RAY_ADDRESS environment or "
                                   "the running local cluster (`testbed cluster up --local N`).")
no_plots_option = click.option("--no-plots", is_flag=True, callback=lambda c, p, v: v and os.environ.update(
    FTB_PLOTS="0"), help="Draw no PNG plots and no HTML report: `testbed report DIR` draws them from the CSVs.")
metrics_option = click.option("--metrics", metavar="HOST:PORT",
                              help="Serve live Prometheus metrics there while the lab lives, e.g. 127.0.0.1:9464.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fabric-testbed")
def cli():
    """fabric-testbed: AI data-centre fabrics on the real Linux kernel datapath."""


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Result directory (default results/<run-id>).")
@set_option
@metrics_option
@cluster_option
@no_plots_option
def run(scenario, out, sets, metrics, cluster, no_plots):
    """Build the fabric, run the scenario's traffic, sample telemetry, tear down, write CSVs. With --cluster the
    fabric is split over the Ray cluster's machines as the scenario's `placement` says."""
    scen = _load(scenario, sets)
    from .runs import lifecycle
    from .report.document import report_unless_skipped as write_report
    if scen.placement is not None and scen.placement.partitions > 1 and not cluster:
        raise UserError(f"{scenario}: placement.partitions {scen.placement.partitions} splits the fabric over "
                        f"machines: give --cluster ADDRESS (or auto)")
    if not cluster:
        _need_root("run")
    try:
        if cluster:
            from .cluster.run import run as cluster_run
            outdir, row = cluster_run(scen, cluster, out, source=scenario, log=_echo, metrics=metrics)
        else:
            outdir, row = lifecycle.run(scen, out, source=scenario, log=_echo, metrics=metrics)
    except lifecycle.RunFailed as e:
        if e.outdir is not None:
            write_report(e.outdir)             # the report of what was collected, then the one-line error
        raise
    page = write_report(outdir)
    _echo(f"goodput {row.get('goodput_mbps', float('nan')):.1f} Mbit/s of {row.get('offered_mbps', 0):.1f} "
          f"offered; uplink imbalance {row.get('uplink_imbalance', float('nan')):.2f}; "
          f"FCT p99 {row.get('fct_p99_ms', float('nan')):.1f} ms; cpu_bound={row.get('cpu_bound')}")
    click.echo(f"results: {outdir}")
    click.echo(f"report: {page}")


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--name", help="Lab name (lowercase letters/digits, ≤12; default from the scenario).")
@set_option
@metrics_option
@cluster_option
def up(scenario, name, sets, metrics, cluster):
    """Build a lab and leave it running (containerlab style); `testbed down` removes it. With --cluster the fabric
    is split over the Ray cluster's machines as `placement` says (its parts are labs NAMEm0, NAMEm1, …)."""
    from .lab import Lab, reap_stale
    scen = _load(scenario, sets)
    if cluster:
        from .cluster.run import ClusterLab
        if metrics:
            from .telemetry.live import parse_address
            parse_address(metrics)               # a malformed address: one line before anything is built
        name = name or (re.sub(r"[^a-z0-9]", "", scen.name.lower())[:8] or "lab")
        if len(name) > 10:
            raise UserError(f"--name {name!r}: with --cluster at most 10 characters (parts are {name}m0, …)")
        cl = ClusterLab(scen, cluster, log=_echo, name=name).__enter__()
        if metrics:
            try:
                cl.serve_metrics(metrics)
            except BaseException:
                cl.close()
                raise
        click.echo(f"lab '{name}' is up over {len(cl.used)} machine(s): parts "
                   + ", ".join(f"{lab} on {m.name}" for lab, m in zip(cl.labs, cl.used))
                   + f"; `testbed down {name} --cluster {cluster}` removes it")
        if metrics:
            click.echo(f"metrics: http://{metrics}/metrics (every machine's, fetched at each scrape)")
        return
    _need_root("up")
    name = name or (re.sub(r"[^a-z0-9]", "", scen.name.lower())[:12] or "lab")
    reap_stale()
    with Lab(scen, name, kind="up", keep=True, source=scenario, metrics=metrics, log=_echo) as lab:
        topo = lab.topo
        click.echo(f"lab '{name}' is up: {len(topo.hosts)} hosts, {len(topo.switches)} switches "
                   f"({scen.switch.load_balancing}"
                   + (f", SM routing {scen.switch.sm.engine}" if scen.switch.routing == "sm" else "")
                   + f"); try `testbed exec h0 -- ping -c3 "
                   f"{topo.address(topo.hosts[-1])}`")
        if metrics is not None:
            click.echo(f"metrics: http://{metrics}/metrics")
        for note in lab.containers.notes if lab.containers is not None else ():
            _echo(note)


@cli.command()
@click.argument("name", required=False)
@cluster_option
def down(name, cluster):
    """Remove a lab made by `testbed up` (with --cluster: `testbed up --cluster`, every machine's part)."""
    from .lab import remove
    if cluster:
        if not name:
            raise UserError("testbed down --cluster needs the lab's NAME")
        from .cluster.run import down as cluster_down
        n = cluster_down(name, cluster, log=_echo)
        click.echo(f"lab '{name}' removed ({n} part(s))")
        return
    _need_root("down")
    name = _pick_lab(name)
    n = remove(name)
    click.echo(f"lab '{name}' removed ({n} namespaces)")


@cli.command()
@click.argument("name", required=False)
def status(name):
    """Labs that are up; with NAME, its nodes and addresses."""
    from rich.console import Console
    from rich.table import Table

    from . import topology
    from .lab import all_labs, namespaces_of
    labs = all_labs()
    if name:
        st = next((lab for lab in labs if lab["name"] == name), None)
        if not st:
            raise UserError(f"no lab named '{name}'")
        topo = topology.build(scenario_mod.from_dict(st["scenario"]).topology)
        containers = st.get("containers") or {}
        t = Table(title=f"lab {name}")
        for col in ("node", "kind", "namespace", *(("container", "image") if containers else ()), "interfaces"):
            t.add_column(col)
        for n, node in topo.nodes.items():
            ifs = ", ".join(f"{p.ifname}→{p.peer_node}" + (f" {p.address}" if p.address else "")
                            for p in topo.ports[n])
            ctr = containers.get(n)
            shown = ()
            if containers:                     # a name only: the lab is still starting its containers
                shown = (ctr["name"], ctr["image"]) if isinstance(ctr, dict) else (ctr or "-", "")
            t.add_row(n, node.kind, st["nodes"][n], *shown, ifs)
        Console(width=max(120, Console().width) if containers else None).print(t)
        return
    if not labs:
        click.echo("no labs are up")
        return
    t = Table(title="labs")
    for col in ("name", "kind", "pid", "namespaces", "containers", "scenario", "source"):
        t.add_column(col)
    for lab in labs:
        t.add_row(lab["name"], lab["kind"], str(lab.get("pid") or "-"), str(len(namespaces_of(lab["name"]))),
                  str(len(lab.get("containers") or {})), lab["scenario"].get("name", ""), lab.get("source", ""))
    Console().print(t)


@cli.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.option("--lab", "lab_name", help="Lab name (default: the only lab that is up).")
@click.argument("node")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(lab_name, node, cmd):
    """Run CMD inside NODE's namespace (a container host: inside its container): testbed exec h0 -- ping -c1
    198.18.1.1"""
    from .fabric import netns
    from .lab import read_state
    _need_root("exec")
    lab_name = _pick_lab(lab_name)
    st = read_state(lab_name)
    nodes = st["nodes"]
    if node not in nodes:
        raise UserError(f"lab '{lab_name}' has no node '{node}' (nodes: {', '.join(list(nodes)[:8])} …)")
    ctr = (st.get("containers") or {}).get(node)
    try:
        if ctr is None:
            proc = netns.spawn(nodes[node], list(cmd))
        elif isinstance(ctr, dict):
            from .container.hosts import Container
            term = {"TERM": os.environ["TERM"]} if "TERM" in os.environ else {}
            proc = Container.from_dict(ctr).spawn(list(cmd), term)
        else:
            raise UserError(f"lab '{lab_name}' is still starting its containers: try again")
    except FileNotFoundError:
        raise UserError(f"{cmd[0]}: command not found") from None
    sys.exit(proc.wait())


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--vary", "varies", multiple=True, metavar="KEY.PATH=V1,V2,…",
              help="A key and the values to try (repeatable: the runs are every combination).")
@click.option("--seeds", type=click.IntRange(min=1), default=None, metavar="N",
              help="Run every combination N times, with scenario seed base, base+1, …, base+N-1 (base: the "
                   "scenario's seed, default 1).")
@click.option("--out", type=click.Path(file_okay=False), help="Sweep directory (default results/sweep-<time>).")
@click.option("--resume", is_flag=True, help="Continue an interrupted sweep in --out: skip its completed runs.")
@click.option("--include-flagged", is_flag=True,
              help="Keep cpu_bound runs in comparison.csv's means (excluded by default).")
@cluster_option
@set_option
@no_plots_option
def sweep(scenario, varies, seeds, out, resume, include_flagged, cluster, sets, no_plots):
    """Run a scenario for every combination of --vary values (× --seeds); write sweep.csv and comparison.csv.
    With --cluster, each run goes to a free machine of the Ray cluster and its directory comes back here."""
    import datetime as dt

    from rich.console import Console

    from . import report
    from .runs import lifecycle
    from . import sweep as sweep_mod
    if resume and not out:
        raise UserError("--resume needs --out: the directory of the sweep to continue")
    if no_plots and cluster:
        raise UserError("--no-plots: the cluster's machines draw their runs' plots; give it without --cluster")
    runs = sweep_mod.plan(scenario, sets, varies, seeds)          # every scenario validated before root/build
    pool = None
    if cluster:
        if any(r.scen.placement is not None for r in runs):
            raise UserError(f"{scenario}: placement splits one run over several machines; a sweep with --cluster "
                            f"runs each run whole on one machine (drop placement, or run it with `testbed run "
                            f"--cluster`)")
        from .cluster.distributed_sweep import ClusterPool
        pool = ClusterPool(cluster)
    else:
        _need_root("sweep")
    outdir = Path(out) if out else lifecycle.RESULTS_DIR / f"sweep-{dt.datetime.now():%Y%m%d-%H%M%S}"
    res = sweep_mod.execute(scenario, sets, varies, seeds, outdir, runs=runs, resume=resume,
                            include_flagged=include_flagged, console=Console(stderr=True), pool=pool)
    click.echo(sweep_mod.render(res))
    click.echo(f"results: {outdir / 'sweep.csv'}, {outdir / 'comparison.csv'}")
    flagged = int(res.comparison["flagged_runs"].sum()) if len(res.comparison) else 0
    if flagged:
        scen = runs[0].scen
        _echo(f"warning: {flagged} run(s) were cpu_bound (the emulator, not the fabric, was the bottleneck) and "
              + ("are kept in the means (--include-flagged)" if include_flagged else "are left out of the means")
              + f"; scale the link rates down until no run is flagged, e.g. {sweep_mod.scale_hint(scen)}")
    from .report.document import report_unless_skipped
    click.echo(f"report: {report_unless_skipped(outdir)}")
    if res.failed and res.failed == len(res.sweep):
        raise UserError(f"every run failed ({res.failed}), e.g. {res.sweep['failed'].iloc[0]}; see sweep.csv")
    if res.failed:
        _echo(f"warning: {res.failed} of {res.total} runs failed (status=failed in sweep.csv, left out of the "
              f"means): the `failed` column says why")


@cli.command()
@click.option("--quick", is_flag=True, help="Only the references marked quick (a few minutes).")
@click.option("--only", default=None, metavar="NAME,…", help="These references (scenarios/validation/NAME.yaml).")
@click.option("--seeds", type=click.IntRange(min=1), default=None, metavar="N",
              help="Seeds per reference (default: each reference's own `seeds`).")
@click.option("--out", type=click.Path(file_okay=False),
              help="Result directory (default results/validate-<time>).")
@click.option("--dir", "ref_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Read the references from this directory instead of scenarios/validation (your own).")
def validate(quick, only, seeds, out, ref_dir):
    """Run the reference experiments of scenarios/validation/ and compare each with its published value:
    validation.csv and report.html in --out; exits 1 when a reference fails."""
    import datetime as dt

    from .runs import lifecycle
    from .validate import suite
    names = [n.strip() for n in only.split(",") if n.strip()] if only else []
    found = suite.discover(Path(ref_dir)) if ref_dir else suite.discover()
    refs = suite.select(found, quick, names)                           # every reference checked before root
    _need_root("validate")
    outdir = Path(out) if out else lifecycle.RESULTS_DIR / f"validate-{dt.datetime.now():%Y%m%d-%H%M%S}"
    table = suite.run_suite(refs, outdir, seeds, log=_echo)
    for r in table.to_dict("records"):
        ci = "" if r["ci95"] is None or r["ci95"] != r["ci95"] else f" ± {r['ci95']:.3g}"
        measured = "—" if r["measured"] != r["measured"] else f"{r['measured']:.4g}{ci}"
        click.echo(f"{r['verdict']:8} {r['name']}: {r['metric']} {measured} (reference {r['reference']:g}, "
                   f"{r['kind'].replace('_', ' ')}, tolerance {r['tolerance']:g}){'  ' + r['notes'] if r['notes'] else ''}")
    click.echo(f"results: {outdir / suite.VALIDATION_CSV}, {outdir / 'report.html'}")
    failed = table[table["verdict"] == suite.FAIL]
    invalid = table[table["verdict"] == suite.INVALID]
    if len(invalid):
        _echo(f"warning: {len(invalid)} reference(s) invalid (runs flagged by the CPU guard twice): "
              f"{', '.join(invalid['name'])}; run them again on a quieter machine")
    if len(failed):
        raise UserError(f"{len(failed)} of {len(table)} reference(s) failed: {', '.join(failed['name'])}")


@cli.command(name="report")
@click.argument("result_dir", type=click.Path())
def report_(result_dir):
    """Recompute summary.csv and the plots of a run directory, then write report.html and report.md (a sweep
    directory: the report of its sweep.csv / comparison.csv and runs)."""
    from . import report
    os.environ.pop("FTB_PLOTS", None)                       # asked for: drawn whatever the environment says
    if not (Path(result_dir) / report.SWEEP_CSV).is_file():
        row = report.report(result_dir)
        click.echo(", ".join(f"{k}={v}" for k, v in row.items() if k in report.SUMMARY_COLUMNS))
    click.echo(f"report: {report.write_report(result_dir)}")


@cli.command()
@click.argument("source", type=click.Path())
@click.option("--out", type=click.Path(dir_okay=False),
              help="A .png or .svg file [default: DIR/topology.png, or <scenario name>-topology.png here].")
@set_option
def graph(source, out, sets):
    """Draw the topology of a SCENARIO file or a run DIR by tier (hosts, leaves, spines, cores); from a run
    directory every link is coloured by its mean utilisation."""
    from .report import ReportError
    from .report.figures import topology_graph
    from .report.graph import draw, from_topology, save
    from .report.study import Run
    from .topology import build
    if Path(source).is_dir():
        if sets:
            raise UserError("--set applies to a scenario file, not to a run directory")
        run = Run(Path(source))
        fig, how = topology_graph(run, f"{Path(source).name}: links coloured by mean utilisation")
        if fig is None:
            raise ReportError(f"{source}: not a run directory ({how})")
        path = Path(out) if out else Path(source) / "topology.png"
    else:
        scen = _load(source, sets)
        fig = draw(from_topology(build(scen.topology)), None, f"{scen.name}: {scen.topology.kind} topology")
        path = Path(out) if out else Path(f"{scen.name}-topology.png")
    click.echo(f"graph: {save(fig, path)}")


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--engine", type=click.Choice(["minhop", "updn", "ftree"]), default=None,
              help="The SM's routing algorithm (default: the scenario's switch.sm.engine).")
@click.option("--down", "downs", multiple=True, metavar="A-B", help="A link that is down (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the tables as CSV (switch, destination, port, …) and the per-link counts beside it "
                   "(<name>-links.csv).")
@set_option
def routes(scenario, engine, downs, out, sets):
    """The subnet manager's forwarding tables for SCENARIO, computed without building the fabric (what
    dump_lfts shows on InfiniBand), and how many destinations each switch port carries."""
    from pathlib import Path

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from .report.files import write_csv
    from .routing import dump
    from .topology import build
    scen = _load(scenario, sets)
    topo = build(scen.topology)
    engine = engine or scen.switch.sm.engine
    tabs = dump.tables(topo, engine, dump.down_ports(topo, list(downs)), multipath=scen.switch.sm_multipath)
    links = dump.link_rows(topo, tabs)
    table = Table(title=f"{engine}: {len(tabs)} entries, destinations per switch port"
                  + (f" ({', '.join(downs)} down)" if downs else ""))
    for col in ("switch", "port", "peer", "routes"):
        table.add_column(col, justify="right" if col == "routes" else "left")
    for r in links:
        table.add_row(r["switch"], r["port"], r["peer"], str(r["routes"]))
    Console(width=100).print(table)
    busiest = max(links, key=lambda r: r["routes"], default=None)
    if busiest is not None:
        click.echo(f"busiest: {busiest['switch']} → {busiest['peer']} ({busiest['routes']} destinations)")
    if out:
        out = Path(out)
        write_csv(out, pd.DataFrame(dump.route_rows(topo, tabs)))
        links_out = out.with_name(f"{out.stem}-links.csv")
        write_csv(links_out, pd.DataFrame(links))
        click.echo(f"routes: {out}, {links_out}")


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="The schedule file to write: CSV, or JSON when it ends in .json.")
@set_option
def schedule(scenario, out, sets):
    """Write the collective jobs of SCENARIO as a replay schedule (traffic.replay): every transfer, step k + 1 of
    a job waiting for all of step k — replaying it runs the same collective, driven by its dependencies."""
    from .topology import build
    from .workloads import replay
    scen = _load(scenario, sets)
    if not scen.traffic.runs_collectives:
        raise UserError(f"{scenario}: no collective jobs to export (traffic.jobs, or pattern: allreduce)")
    adapt = scen.traffic.collective.adapt
    if adapt is not None and adapt.ring_count > 1:
        raise UserError(f"{scenario}: traffic.collective.adapt lays out {adapt.ring_count} ring orders per "
                        f"all-reduce iteration and picks one as it runs; a schedule replays fixed transfers "
                        f"(export it with --set traffic.collective.adapt=null)")
    transfers = replay.from_collectives(scen.traffic, build(scen.topology), scen.seed)
    replay.write(out, transfers)
    tags = len({t.tag for t in transfers})
    click.echo(f"schedule: {out} ({len(transfers)} transfers in {tags} operation(s))")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json):
    """What this kernel can and cannot do, found by trying each feature."""
    from . import doctor as doc
    caps = doc.probe()
    if as_json:
        import json
        click.echo(json.dumps(doc.as_dict(caps), indent=2))
    else:
        from rich.console import Console
        Console(width=max(120, Console().width)).print(doc.render(caps))
    missing = [c.name for c in caps if c.name in ESSENTIAL and not c.ok]
    if missing:
        raise UserError(f"this machine cannot run the testbed: missing {', '.join(missing)}")


@cli.command()
@click.argument("names", nargs=-1, metavar="[NAME]...")
def clean(names):
    """Remove every leftover of this tool (labs, namespaces and what is in them, containers, cgroups), even after
    a crash; with NAME, only that lab's (`testbed status` and the manifest's `lab` name it) and its machine
    parts (NAMEm0, …)."""
    from .lab import clean_all, clean_named
    _need_root("clean")
    if names:
        labs, spaces, containers = clean_named(list(names))
        click.echo(f"removed {labs} lab(s) named {', '.join(names)}: {spaces} namespace(s) and "
                   + (f"{containers} container(s)" if containers is not None
                      else "no container (no Docker daemon answers: containers not checked)"))
        return
    labs, stray, containers = clean_all()
    click.echo(f"removed {labs} lab(s), {stray} stray namespace(s) and "
               + (f"{containers} stray container(s)" if containers is not None
                  else "no container (no Docker daemon answers: containers not checked)"))


@cli.command()
@click.argument("what", type=click.Choice(["build", "pps", "roce", "reroute", "select", "docker", "cluster", "capacity",
                                          "all"]), default="all")
@click.option("--sizes", default=None,
              help="Build benchmark sizes: leaf-spine host counts, or ft<k> for a fat-tree (e.g. 16,128,ft16) "
                   "[default: 16,128,1024]; reroute: fat-trees only [default: ft4,ft8]; docker: host counts "
                   "[default: 8,32].")
@click.option("--seconds", default=3.0, help="Traffic time per pps / RoCE send-rate measurement.")
@click.option("--rounds", default=3, type=click.IntRange(min=1), help="Alternated rounds (pps, roce, docker); medians.")
@click.option("--repeat", default=1, type=click.IntRange(min=1),
              help="Build benchmark: runs per size, alternating whether the fabric or the floor is built first; "
                   "medians of each run's own ratios to its floor, with their range.")
@click.option("--vs", type=click.Choice(["mininet"]), default=None,
              help="Also build the same sizes with Debian's Mininet in this run (installed if absent) and print "
                   "the ratios.")
@click.option("--mininet-timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds per Mininet measurement (one variant at one size) before it counts as timed out "
                   "[default: 600].")
@click.option("--scenario", "scenario_path", default="scenarios/default.yaml", show_default=True,
              help="capacity: the scenario whose link rates are bisected.")
@click.option("--engine", type=click.Choice(["udp", "tcp", "roce", "iperf3"]), default="udp", show_default=True,
              help="capacity: the testbed side's traffic engine (the baseline always runs iperf3 -u).")
@click.option("--mtu", type=click.IntRange(576, 9000), default=None, help="capacity: topology.mtu for both sides.")
@click.option("--lo", "lo_rate", default="5mbit", show_default=True, help="capacity: the lowest link rate tried.")
@click.option("--hi", "hi_rate", default="320mbit", show_default=True, help="capacity: the highest link rate tried.")
@click.option("--steps", default=4, type=click.IntRange(min=0), show_default=True,
              help="capacity: bisection steps between lo and hi (each one run per side).")
@click.option("--duration", default="3s", show_default=True, help="capacity: each run's duration.")
@set_option
def bench(what, sizes, seconds, rounds, repeat, vs, mininet_timeout, scenario_path, engine, mtu, lo_rate, hi_rate,
          steps, duration, sets):
    """Benchmarks with same-run baselines (see testbed/bench/README.md)."""
    if what == "capacity":
        from . import units
        try:
            lo, hi = units.rate_bps(lo_rate), units.rate_bps(hi_rate)
        except ValueError as e:
            raise UserError(f"--lo/--hi: {e}") from None
        if not 0 < lo < hi:
            raise UserError(f"--lo {lo_rate} must be below --hi {hi_rate}")
        _need_root("bench")
        from .bench.capacity import print_capacity
        print_capacity(Path(scenario_path), engine, mtu, tuple(sets), lo, hi, steps, duration, save=True)
        return
    if sets:
        raise UserError("--set applies to `testbed bench capacity`")
    if vs and what in ("pps", "roce"):
        raise UserError("--vs mininet compares the build benchmark: use `testbed bench build --vs mininet`")
    if mininet_timeout is not None and not vs:
        raise UserError("--mininet-timeout needs --vs mininet")
    if repeat > 1 and what not in ("build", "all"):
        raise UserError(f"--repeat repeats the build benchmark: use `testbed bench build --repeat {repeat}` "
                        f"(pps and roce take --rounds)")
    from . import bench as b
    if what == "cluster":
        _need_root("bench")
        from .bench.cluster import print_cluster
        print_cluster(seconds, rounds)
        return
    if what == "select":
        _need_root("bench")
        from .bench.next_hop import print_select
        print_select(rounds)
        return
    if what == "docker":
        try:
            counts = [x for x in b.parse_sizes(sizes or "8,32") if isinstance(x, int)]
        except ValueError as e:
            raise UserError(f"--sizes {sizes!r}: {e}") from None
        if not counts or len(counts) != len((sizes or "8,32").split(",")):
            raise UserError(f"--sizes {sizes!r}: docker compares leaf-spine host counts, e.g. 8,32")
        _need_root("bench")
        from .bench.docker import print_docker
        print_docker(counts, rounds)
        return
    if what == "reroute":
        ks = []
        for x in (sizes or "ft4,ft8").split(","):
            m = re.fullmatch(r"ft(\d+)", x.strip())
            if not m or int(m[1]) % 2 or not 4 <= int(m[1]) <= 16:
                raise UserError(f"--sizes {sizes!r}: reroute runs on fat-trees, give ft<k> with k even in 4..16, "
                                f"e.g. ft4,ft16")
            ks.append(int(m[1]))
        _need_root("bench")
        from .bench.reroute import print_reroute
        print_reroute(ks)
        return
    sizes = sizes or "16,128,1024"
    try:
        build_sizes = b.parse_sizes(sizes)   # a bad size fails now, not after minutes of measuring the others
    except ValueError as e:
        raise UserError(f"--sizes {sizes!r}: {e}; give host counts or ft<k> separated by commas, "
                        f"e.g. 16,128,1024,ft16") from None
    if vs and any(not isinstance(x, int) for x in build_sizes):
        raise UserError("--vs mininet: the Mininet baseline builds leaf-spine sizes (host counts), not ft<k>")
    _need_root("bench")
    if what in ("build", "all"):
        b.print_build(build_sizes, repeat=repeat, vs=vs, mininet_timeout=mininet_timeout)
    if what in ("pps", "all"):
        b.print_pps(seconds, rounds)
    if what in ("roce", "all"):
        from .bench.roce_rate import print_roce_rate
        print_roce_rate(seconds, rounds)


@cli.group()
def image():
    """The local host image for container hosts (hosts.docker), fabric-testbed/host."""


@image.command(name="build")
@click.option("--force", is_flag=True, help="Rebuild even when the image of the current inputs is there.")
def image_build(force):
    """Make fabric-testbed/host from this machine's Debian packages (no registry): docker import of a root
    filesystem with Python, a shell, coreutils, ping and iproute2 — what the traffic agent and a user need."""
    from .container import image as image_mod
    _need_root("image build")
    b = image_mod.build(force=force, log=_echo)
    if b.cached:
        click.echo(f"image: {b.image} is current (key {b.key}, {b.size_bytes / 1e6:.0f} MB); --force rebuilds it")
    else:
        click.echo(f"image: {b.image} built in {b.seconds:.1f} s from {b.packages} Debian packages (key {b.key}, "
                   f"{b.size_bytes / 1e6:.0f} MB)")


@image.command(name="status")
def image_status():
    """The host image's key for this machine's packages and whether the daemon has it."""
    import json

    from .container import image as image_mod
    _need_root("image status")
    click.echo(json.dumps(image_mod.status(log=_echo), indent=2))


@cli.group()
def cluster():
    """A Ray cluster for sweeps and fabrics over several machines; `--local N` makes one on this machine."""


@cluster.command(name="up")
@click.option("--local", "local_n", type=click.IntRange(min=1, max=32), required=True, metavar="N",
              help="Start N machines on this one: network namespaces ftb-m0… joined by an underlay.")
@click.option("--underlay-rate", default="1gbit", show_default=True,
              help="Rate of each machine's underlay link (units: bit kbit mbit gbit).")
def cluster_up(local_n, underlay_rate):
    """Start a local N-machine Ray cluster (each machine its own namespace, Ray bound to its underlay address)."""
    from . import units
    from .cluster import ensure_installed, local
    try:
        rate = units.rate_bps(underlay_rate)
    except ValueError as e:
        raise UserError(f"--underlay-rate {underlay_rate!r}: {e}") from None
    _need_root("cluster up")
    ensure_installed(_echo)
    st = local.up(local_n, rate, log=_echo)
    click.echo(f"cluster: {local_n} machine(s) up; address {st['address']} (`--cluster auto` finds it)")


@cluster.command(name="down")
def cluster_down():
    """Remove the local cluster: its Ray processes, machines (namespaces), underlay and the labs of its actors."""
    from .cluster import local
    _need_root("cluster down")
    if local.read_state() is None and not any(local.netns.is_machine(n) for n in local.netns.list_names()):
        click.echo("no local cluster is up")
        return
    res = local.down(log=_echo)
    click.echo(f"cluster: removed {res['machines']} machine(s), {res['processes']} process(es), "
               f"{res['labs']} lab(s)")


@cluster.command(name="status")
@cluster_option
def cluster_status(cluster):
    """The cluster's nodes (machine, address, alive, CPUs); the local cluster's namespaces and processes."""
    from rich.console import Console
    from rich.table import Table

    from .cluster import MACHINE_RESOURCE, connect, installed, local
    rows = local.status()
    address = cluster or ("auto" if rows or os.environ.get("RAY_ADDRESS") else None)
    if address is None:
        click.echo("no local cluster is up (`testbed cluster up --local 2`), and no --cluster given")
        return
    if rows:
        t = Table(title="local cluster")
        for col in ("machine", "namespace", "underlay address", "processes"):
            t.add_column(col)
        for r in rows:
            t.add_row(r["name"], r["namespace"] if r["namespace_up"] else f"{r['namespace']} (gone)",
                      r["address"], str(r["processes"]))
        Console().print(t)
    if not installed():
        raise UserError("Ray is not installed (`testbed cluster up --local N` installs it)")
    ray = connect(address)
    names = local.names_by_address()
    t = Table(title=f"Ray nodes ({address})")
    for col in ("node", "address", "alive", "CPUs", MACHINE_RESOURCE):
        t.add_column(col)
    for n in sorted(ray.nodes(), key=lambda n: n["NodeManagerAddress"]):
        res = n.get("Resources", {})
        addr = n["NodeManagerAddress"]
        t.add_row(names.get(addr, "driver" if addr == local.DRIVER_ADDRESS else "-"), addr,
                  "yes" if n.get("Alive") else "DEAD", f"{res.get('CPU', 0):g}", f"{res.get(MACHINE_RESOURCE, 0):g}")
    Console().print(t)


@cli.group()
def vm():
    """Full-kernel lane: a cached Debian VM (QEMU) with rxe, netem, red (see testbed/vm.py)."""


def _vm_call(fn, *a, **kw):
    from .vm import VMError
    try:
        return fn(*a, **kw)
    except VMError as e:
        raise UserError(str(e)) from None


@vm.command(name="build")
@click.option("--force", is_flag=True, help="Rebuild even when an image for these inputs is cached.")
def vm_build(force):
    """debootstrap + vagrant/provision.sh → a cached ext4 image (keyed by the provisioning inputs)."""
    from . import vm as vm_mod
    img = _vm_call(vm_mod.build, force=force)
    click.echo(f"image: {img.dir}")


@vm.command(name="run", context_settings={"ignore_unknown_options": True})
@click.option("--timeout", default=3600.0, help="Seconds before the guest is killed.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def vm_run(timeout, cmd):
    """Boot the image, run CMD as root in the shared project, stream output, return its exit code."""
    from . import vm as vm_mod
    sys.exit(_vm_call(vm_mod.run, list(cmd), timeout=timeout).returncode)


@vm.command(name="test", context_settings={"ignore_unknown_options": True})
@click.option("--timeout", default=3600.0, help="Seconds before the guest is killed.")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def vm_test(timeout, pytest_args):
    """Run the tests marked fullkernel inside the VM (extra arguments go to pytest)."""
    from . import vm as vm_mod
    sys.exit(_vm_call(vm_mod.test, tuple(pytest_args), timeout=timeout).returncode)


@vm.command(name="status")
def vm_status():
    """The image key for the current provisioning inputs and whether it is cached."""
    import json

    from . import vm as vm_mod
    click.echo(json.dumps(vm_mod.status(), indent=2))


def main() -> None:
    global _OWNER_PID
    _OWNER_PID = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sigterm)
    debug = os.environ.get("FTB_DEBUG") == "1"
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("error: interrupted; everything the run built was removed", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("error: interrupted; everything the run built was removed", err=True)
        sys.exit(130)
    except Terminated as t:
        click.echo(f"error: terminated by {signal.Signals(t.signum).name}; everything the run built was removed",
                   err=True)
        sys.exit(128 + t.signum)
    except SystemExit:
        raise
    except Exception as e:            # noqa: BLE001 — one line for the user, traceback on demand
        if debug:
            raise
        known = isinstance(e, _known_errors())
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        click.echo(f"error: {msg}" if known else f"error: {type(e).__name__}: {msg} (FTB_DEBUG=1 for details)",
                   err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
