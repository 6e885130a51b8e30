"""What the report says, in order: the scenario, the summary or comparison table, then every figure (or a note
why it is missing). ``write_report(DIR)`` writes DIR/report.html and DIR/report.md for a run or sweep directory.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import figures
from .page import Block, Heading, Image, Note, Pre, Table, Text, write
from .plots import png_bytes, run_figures
from .study import Study, load

#: summary columns the comparison table shows, when any configuration has a value.
HEADLINE = ["goodput_mbps", "offered_mbps", "mean_uplink_util", "max_uplink_util", "uplink_imbalance", "fct_p50_ms",
            "fct_p99_ms", "slowdown_p50", "slowdown_p99", "jct_mean_ms", "jct_p99_ms", "lost_packets", "drops",
            "ecn_marks", "pause_frames", "paused_s_total", "credit_stall_s_total", "queue_p99_bytes", "retransmits", "cpu_busy_max"]
_UNITS = [("_mbps", "Mbit/s"), ("_ms", "ms"), ("_ns", "ns"), ("_s", "s"), ("_s_total", "s"), ("_bytes", "bytes"),
          ("_util", "fraction"),
          ("_share", "fraction"), ("_frac", "fraction"), ("imbalance", "ratio"), ("packets", "packets"),
          ("drops", "packets"), ("marks", "packets"), ("frames", "frames"), ("cnps", "packets"),
          ("slowdown_p50", "ratio"), ("slowdown_p99", "ratio")]
_RUN_PLOTS = {"uplink_util": "Utilisation over time of every uplink of the source leaves (uplink_util.png).",
              "uplink_bytes": "Bytes sent per uplink of the source leaves, with the imbalance (uplink_bytes.png).",
              "fct_cdf": "CDF of the completed flows' completion times, p50/p99 marked (fct_cdf.png).",
              "int_path_delay": "Each INT path's delay over time, median per 10 ms (int_path_delay.png).",
              "cc": "Congestion control: sending rate and window over time of two flows (cc.png, from cc.csv)."}
#: per-run plots drawn only when their optional input exists (no note otherwise).
_OPTIONAL = {"int_path_delay": "int.csv", "cc": "cc.csv"}


#: scenario-table rows → the scenario key they show (a sweep leaves out the ones it varies).
_ROW_KEYS = {"load balancing": "switch.load_balancing", "congestion control": "traffic.cc", "profile": "profile",
             "duration": "duration", "seed": "seed"}


def unit(col: str) -> str:
    return next((u for suffix, u in _UNITS if col.endswith(suffix)), "")


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _scenario(study: Study) -> list[Block]:
    s = study.scenario
    out: list[Block] = [Heading("Scenario")]
    if not isinstance(s, dict):
        return out + [Note("the scenario: no manifest.json with a resolved scenario in the run directory")]
    topo = s.get("topology") or {}
    sizes = ", ".join(f"{k} {topo[k]}" for k in ("spines", "leaves", "hosts_per_leaf", "rails", "k", "pods", "cores")
                      if topo.get(k) not in (None, 0))
    rows = [["name", s.get("name")], ["topology", f"{topo.get('kind', '')}: {sizes}"],
            ["host link", _link(topo.get("host_link"))], ["fabric link", _link(topo.get("fabric_link"))],
            ["load balancing", _get(s, "switch", "load_balancing")],
            ["traffic", " ".join(str(x) for x in (_get(s, "traffic", "engine"), _get(s, "traffic", "pattern")) if x)],
            ["congestion control", _get(s, "traffic", "cc")], ["profile", s.get("profile")],
            ["duration", _ns(s.get("duration"))], ["seed", s.get("seed")]]
    if study.kind == "sweep":          # what varies is listed below, not as the first run's value
        varied = set(study.keys) | {"seed"}
        rows = [r for r in rows if _ROW_KEYS.get(r[0]) not in varied]
        seeds = sorted({str(r.summary.get("seed")) for r in study.runs})
        rows.append(["seeds", ", ".join(seeds)])
        for k in study.keys:
            rows.append([f"varied: {k}", ", ".join(dict.fromkeys(str(c.values.get(k)) for c in study.configs))])
    m = study.runs[0].manifest if study.runs else None
    if isinstance(m, dict):
        rows += [["source file", m.get("source")], ["kernel", m.get("kernel")], ["started", m.get("start_time")]]
    out.append(Table(["setting", "value"], [r for r in rows if r[1] not in (None, "", "None")],
                     "The first run's resolved scenario, varied keys apart" if study.kind == "sweep" else ""))
    import yaml
    out.append(Pre("the whole resolved scenario (manifest.json scenario)", yaml.safe_dump(s, sort_keys=False)))
    return out


def _link(link: Any) -> str:
    if not isinstance(link, dict):
        return ""
    rate = link.get("rate")
    rate = f"{rate / 1e6:g} Mbit/s" if isinstance(rate, (int, float)) else str(rate)
    buf = link.get("buffer")
    return rate + (f", buffer {buf:,} B" if isinstance(buf, int) else "")


def _ns(v: Any) -> str:
    return f"{v / 1e9:g} s" if isinstance(v, (int, float)) else str(v or "")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _results(study: Study) -> list[Block]:
    out: list[Block] = [Heading("Results")]
    if study.kind == "run":
        run = study.configs[0].runs[0]
        if not run.summary:
            return out + [Note("the summary table: no summary.csv (run `testbed report` on the directory to make it)")]
        rows = [[k, v, unit(k)] for k, v in run.summary.items() if v is not None and v == v and v != ""]
        out.append(Table(["summary.csv column", "value", "unit"], rows,
                         "The run's summary row (results/README.md defines every column); empty columns left out."))
        if run.flagged:
            out.append(Note("this run is cpu_bound: the emulator, not the fabric, was the bottleneck; do not compare "
                            "it with others — scale the link rates down (e.g. --set topology.host_link.rate=…)"))
        m = run.manifest or {}
        for what in ("failed", "degradations"):
            items = m.get(what) or []
            for item in items if isinstance(items, list) else [items]:
                out.append(Note(f"manifest {what}: {item}"))
        return out
    cols = [c for c in HEADLINE if any(_finite(cfg.mean(c)) for cfg in study.configs)]
    rows = []
    for c in cols:                     # one row per metric, one column per configuration
        r: list[Any] = [f"{c} ({unit(c)})" if unit(c) else c]
        for cfg in study.configs:
            m, e = cfg.mean(c), cfg.ci95(c)
            r.append("" if not math.isfinite(m) else f"{m:.4g}" + (f" ± {e:.2g}" if math.isfinite(e) else ""))
        rows.append(r)
    for k, name in (("runs", "runs in the means"), ("flagged_runs", "flagged (cpu_bound)"),
                    ("failed_runs", "failed"), ("runs_total", "runs in total")):
        rows.append([name] + [cfg.stats.get(k) for cfg in study.configs])
    out.append(Table(["summary column"] + [cfg.label for cfg in study.configs], rows,
                     f"Mean ± half-width of the 95 % confidence interval per configuration (source: "
                     f"{study.stats_source})."))
    flagged = sum(r.flagged for r in study.runs)
    if flagged:
        out.append(Note(f"{flagged} of {len(study.runs)} runs were cpu_bound (the emulator was the bottleneck); the "
                        f"means leave them out unless the sweep kept them. Scale the rates down (e.g. --set "
                        f"topology.host_link.rate=… and topology.fabric_link.rate=…) and sweep again."))
    out += [Note(n) for n in study.notes]
    runs_rows = [[cfg.label, r.summary.get("seed"), r.dir.name, r.summary.get("goodput_mbps"),
                  r.summary.get("cpu_bound"), r.summary.get("status", r.summary.get("failed"))]
                 for cfg in study.configs for r in cfg.runs]
    out.append(Table(["configuration", "seed", "run directory", "goodput_mbps", "cpu_bound", "status / failed"],
                     runs_rows, "Every run of the sweep (sweep.csv)."))
    missing = [r.dir.name for r in study.runs if not r.dir.is_dir()]
    if missing:
        out.append(Note(f"run directories not found, their time series are not drawn: {', '.join(missing)}"))
    return out


def build(study: Study) -> list[Block]:
    blocks: list[Block] = []
    if study.kind == "run":
        blocks.append(Text(f"One run: {study.dir}."))
    else:
        blocks.append(Text(f"A sweep: {len(study.runs)} runs in {len(study.configs)} configuration(s), in "
                           f"{study.dir}. Statistics from {study.stats_source}; time series from each "
                           f"configuration's first counted run."))
    blocks += _scenario(study)
    blocks += _results(study)
    sections = [("Topology", figures.topology), ("Link utilisation over time", figures.heatmap),
                ("Uplink utilisation", figures.uplink_utilisation), ("Uplink imbalance", figures.uplink_imbalance),
                ("Flow completion times", figures.fct_cdf), ("FCT slowdown by flow size", figures.slowdown_by_size),
                ("Goodput per host pair", figures.flow_goodput), ("Fairness over time", figures.fairness_over_time),
                ("Queue depth", figures.queue_depth), ("Job completion time", figures.jct),
                ("Losses and flow control", figures.losses), ("Pause and credit-stall time", figures.pause_time)]
    for title, fn in sections:
        blocks.append(Heading(title))
        blocks += fn(study)
    if study.kind == "run":
        run = study.configs[0].runs[0]
        blocks.append(Heading("Per-run plots"))
        if run.links is None or run.flows is None:
            blocks.append(Note("per-run plots: links.csv or flows.csv missing"))
        else:
            from .files import read_csv
            from .frames import cc_frame, int_frame
            int_df = int_frame(read_csv(run.dir / "int.csv")) if (run.dir / "int.csv").is_file() else None
            cc_df = cc_frame(read_csv(run.dir / "cc.csv")) if (run.dir / "cc.csv").is_file() else None
            for name, fig in run_figures(run.links, run.flows, int_df, cc_df).items():
                if fig is None:
                    if name not in _OPTIONAL or (run.dir / _OPTIONAL[name]).is_file():
                        blocks.append(Note(f"{name}.png: no data (no uplink traffic, no completed flow or an "
                                           f"empty {_OPTIONAL.get(name, 'input')})"))
                    continue
                blocks.append(Image(f"run-{name.replace('_', '-')}", png_bytes(fig), _RUN_PLOTS[name]))
    return blocks


def title(study: Study) -> str:
    name = (study.scenario or {}).get("name") if isinstance(study.scenario, dict) else None
    kind = "sweep" if study.kind == "sweep" else "run"
    return f"fabric-testbed {kind} report — {name or study.dir.name} ({study.dir.name})"


def report_unless_skipped(d: str | Path) -> str:
    """DIR's report.html as ``write_report`` writes it, or — for a run or sweep told --no-plots — why none was."""
    from .plots import REPORT_SKIPPED, wanted
    return str(write_report(d)) if wanted() else REPORT_SKIPPED


def write_report(d: str | Path) -> Path:
    """Write DIR/report.html (self-contained) and DIR/report.md (+ DIR/report_files/); returns report.html's path."""
    study = load(d)
    html_path, _ = write(study.dir, title(study), build(study))
    return html_path
