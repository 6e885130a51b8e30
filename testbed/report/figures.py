"""The report's comparison figures, each as page blocks: an Image, or a Note saying why it is not shown.

Every figure is per configuration (a run directory is one configuration of one run). Statistics (means, 95 %
confidence intervals) come from the study (comparison.csv); time series are drawn from each configuration's
example run (its first counted run); distributions (FCT) pool every counted run of the configuration.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .graph import draw, edge_utilisation, from_links, from_topology, port_utilisation
from .page import Block, Image, Note
from . import stats
from .plots import _figure, png_bytes
from .study import Config, Study
from .summary import traffic_window, uplinks

#: configurations drawn one figure each (heatmaps, queues, topology) at most; the rest are named in a note.
MAX_PER_CONFIG = 8
#: ports in the queue-depth plot / pause plot.
BUSIEST_PORTS = 6
PAUSE_PORTS = 20
_TIER = {"leaf": 0, "spine": 1, "core": 2}


def _tier_key(switch: str) -> tuple:
    base = switch.rstrip("0123456789")
    num = switch[len(base):]
    return (_TIER.get(base, 3), base, int(num) if num else 0)


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in s).strip("-")[:60] or "x"


def _img(name: str, fig, caption: str) -> Image:
    return Image(_slug(name), png_bytes(fig), caption)


def _capped(study: Study) -> tuple[list[Config], list[Block]]:
    cfgs = study.configs[:MAX_PER_CONFIG]
    rest = study.configs[MAX_PER_CONFIG:]
    notes = [Note(f"{len(rest)} more configuration(s) not drawn ({', '.join(c.label for c in rest)}): "
                  f"see their run directories' reports")] if rest else []
    return cfgs, notes


def _run_label(study: Study, cfg: Config) -> str:
    ex = cfg.example
    if study.kind == "run" or ex is None:
        return cfg.label
    return f"{cfg.label} (run {ex.dir.name})"


# --- per-link utilisation heatmap ------------------------------------------------------------------------

def heatmap(study: Study) -> list[Block]:
    cfgs, out = _capped(study)
    for cfg in cfgs:
        run = cfg.example
        links = run.links if run else None
        if links is None or not len(links):
            out.append(Note(f"utilisation heatmap of {cfg.label}: no links.csv samples"))
            continue
        tx = links[(links["direction"] == "tx") & links["util"].notna()]
        if not len(tx):
            out.append(Note(f"utilisation heatmap of {cfg.label}: no tx sample with a utilisation"))
            continue
        iv = float(tx["interval_s"].median()) or 0.1
        b = (tx["time_s"].astype(float) / iv).round().astype(int)
        grid = tx.assign(bin=b).pivot_table(index=["switch", "port"], columns="bin", values="util", aggfunc="mean")
        order = sorted(grid.index, key=lambda k: (_tier_key(k[0]), k[1]))
        grid = grid.reindex(order)
        cols = np.arange(int(grid.columns.min()), int(grid.columns.max()) + 1)
        grid = grid.reindex(columns=cols)
        n = len(grid)
        fig = _figure(10.0, min(22.0, max(3.5, 1.6 + 0.17 * n)))
        ax = fig.add_subplot()
        extent = (float(cols[0] - 0.5) * iv, float(cols[-1] + 0.5) * iv, n - 0.5, -0.5)
        im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", interpolation="nearest", cmap="viridis",
                       vmin=0.0, vmax=1.0, extent=extent)
        if n <= 90:
            ax.set_yticks(range(n), [f"{s}→{p}" for s, p in grid.index], fontsize=6 if n > 40 else 8)
        else:
            ax.set_yticks([])
        t0, t1 = traffic_window(run.flows) if run.flows is not None else (math.nan, math.nan)
        for t in (t0, t1):
            if not math.isnan(t):
                ax.axvline(t, color="white", ls="--", lw=0.9)
        cb = fig.colorbar(im, ax=ax, extend="max")
        cb.set_label("egress utilisation (fraction of link rate)")
        ax.set_title(f"Per-port egress utilisation over time\n{_run_label(study, cfg)}")
        ax.set_xlabel(f"time since run start (s; one column per {iv * 1e3:.3g} ms sample)")
        ax.set_ylabel(f"switch → port ({n} ports)")
        out.append(_img(f"heatmap-{cfg.label}", fig,
                        f"Each row is one switch port's egress (links.csv tx rows), each column one telemetry "
                        f"sample; colour = bytes sent × 8 / (rate × interval). Dashed lines: the traffic window. "
                        f"Configuration: {_run_label(study, cfg)}."))
    return out


# --- uplink utilisation per configuration, CI error bars ---------------------------------------------------

def _grouped_bars(ax, groups: list[str], series: list[tuple[str, list[float], list[float]]]) -> tuple[bool, list]:
    """One group of bars per label in ``groups``, one bar per (legend label, means, ci95s) in ``series``; error
    bars where the CI is known. Returns (any CI drawn, each series' bar x positions)."""
    x = np.arange(len(groups))
    w = 0.8 / max(1, len(series))
    any_ci, positions = False, []
    for j, (label, means, cis) in enumerate(series):
        m, e = np.array(means, dtype=float), np.array(cis, dtype=float)
        any_ci |= bool(np.isfinite(e).any())
        xs = x + (j - (len(series) - 1) / 2) * w
        ax.bar(xs, np.nan_to_num(m), w, color=f"C{j % 10}", label=label)
        k = np.isfinite(e) & np.isfinite(m)          # error bars only where the CI is known
        if k.any():
            ax.errorbar(xs[k], m[k], yerr=e[k], fmt="none", ecolor="black", capsize=4, lw=1.0)
        positions.append(xs)
    ax.set_xticks(x, groups, rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center",
                  fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    return any_ci, positions


def _bars(study: Study, cols: list[tuple[str, str]], ylabel: str, title: str):
    """Grouped bars: one group per configuration, one bar per (column, legend label); error bars = ci95."""
    cfgs = study.configs
    fig = _figure(max(5.0, min(24.0, 3.0 + 0.9 * len(cfgs) * len(cols))), 5.0)
    ax = fig.add_subplot()
    any_ci, _ = _grouped_bars(ax, [c.label for c in cfgs],
                              [(label, [c.mean(col) for c in cfgs], [c.ci95(col) for c in cfgs])
                               for col, label in cols])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    return fig, any_ci


def _run_dots(ax, xs, values: list[list[float]], label: str | None = "one run", spread: float = 0.2) -> None:
    """Each counted run's value as a dot over its bar (xs[i]: the bar of values[i]), so the spread behind a mean
    stays visible; the dots of one bar are set side by side over ``spread`` (x units) so equal values show."""
    first = True
    for x, vals in zip(xs, values):
        v = [y for y in vals if math.isfinite(y)]
        if v:
            dx = np.linspace(-spread / 2, spread / 2, len(v)) if len(v) > 1 else [0.0]
            ax.plot(x + np.asarray(dx), v, "o", ms=3.5, color="black", alpha=0.55, label=label if first else None)
            first = False


def _ci_words(study: Study, any_ci: bool) -> str:
    if any_ci:
        return "Error bars: 95 % confidence interval of the mean over the configuration's counted runs."
    if study.kind == "run":
        return "One run: no confidence interval."
    return "No confidence intervals (one run per configuration, or no comparison.csv)."


def uplink_utilisation(study: Study) -> list[Block]:
    cols = [("mean_uplink_util", "mean over the uplinks"), ("max_uplink_util", "busiest uplink")]
    if not any(math.isfinite(c.mean(col)) for c in study.configs for col, _ in cols):
        return [Note("uplink utilisation per configuration: no run has mean_uplink_util (no flow crossed a leaf "
                     "uplink)")]
    fig, any_ci = _bars(study, cols, "utilisation over the traffic window (fraction of link rate)",
                        "Leaf uplink utilisation per configuration")
    ax = fig.axes[0]
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    out: list[Block] = [_img("uplink-util-per-config", fig,
                             "Mean and maximum over the source leaves' uplinks of each uplink's utilisation over "
                             f"the traffic window (summary.csv mean_uplink_util, max_uplink_util; source: "
                             f"{study.stats_source}). {_ci_words(study, any_ci)}")]
    if study.kind == "run":
        run = study.configs[0].runs[0]
        if run.links is not None and run.flows is not None:
            up = uplinks(run.links, run.flows, traffic_window(run.flows))
            if len(up) and up["util"].notna().any():
                fig = _figure(max(6.0, min(24.0, 0.35 * len(up) + 3.0)), 4.5)
                ax = fig.add_subplot()
                ax.bar(range(len(up)), up["util"].astype(float), color="C0")
                ax.set_xticks(range(len(up)), [f"{s}→{p}" for s, p in zip(up["switch"], up["port"])],
                              rotation=90 if len(up) > 8 else 0, fontsize="small")
                ax.axhline(1.0, color="grey", lw=0.8, ls="--")
                ax.set_ylabel("utilisation over the traffic window")
                ax.set_title("Utilisation of each counted uplink (leaf → spine)")
                ax.grid(True, axis="y", alpha=0.3)
                out.append(_img("uplink-util-per-uplink", fig, "Each counted uplink's tx bytes in the traffic "
                                "window × 8 / (rate × window): the values mean_uplink_util averages."))
    return out


def _summary_values(cfg: Config, col: str) -> list[float]:
    """``col`` of each counted run's summary row (sweep.csv / summary.csv), NaN where empty."""
    out = []
    for r in cfg.counted_runs:
        try:
            out.append(float(r.summary.get(col)))
        except (TypeError, ValueError):
            out.append(math.nan)
    return out


def uplink_imbalance(study: Study) -> list[Block]:
    col = "uplink_imbalance"
    if not any(math.isfinite(c.mean(col)) for c in study.configs):
        return [Note("uplink imbalance per configuration: no run has uplink_imbalance (no uplink carried bytes)")]
    cfgs = study.configs
    fig = _figure(max(6.5, min(24.0, 3.0 + 1.2 * len(cfgs))), 5.0)
    ax = fig.add_subplot()
    any_ci, (xs,) = _grouped_bars(ax, [c.label for c in cfgs],
                                  [("mean over the runs", [c.mean(col) for c in cfgs], [c.ci95(col) for c in cfgs])])
    _run_dots(ax, xs, [_summary_values(c, col) for c in cfgs], spread=0.4)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("busiest uplink's bytes ÷ the mean uplink's (1 = even)")
    ax.set_title("Uplink imbalance per configuration\n(the busiest uplink's load; n flows on n uplinks: its flows)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return [_img("uplink-imbalance-per-config", fig,
                 "summary.csv uplink_imbalance: per source leaf the busiest uplink's tx bytes ÷ the mean of its "
                 "uplinks', averaged over the leaves weighted by their bytes (with n flows on n uplinks faster than "
                 f"the hosts: the most flows on one uplink). Bars: means (source: {study.stats_source}); dots: each "
                 f"counted run. {_ci_words(study, any_ci)}")]


# --- FCT CDF per configuration ---------------------------------------------------------------------------

def fct_cdf(study: Study) -> list[Block]:
    fig = _figure(8.0, 5.0)
    ax = fig.add_subplot()
    drawn, allv = 0, []
    for i, cfg in enumerate(study.configs):
        vals = [r.flows["fct_s"].astype(float).dropna().to_numpy() * 1e3 for r in cfg.counted_runs
                if r.flows is not None and len(r.flows)]
        v = np.sort(np.concatenate(vals)) if vals else np.array([])
        total = sum(len(r.flows) for r in cfg.counted_runs if r.flows is not None)
        if not len(v):
            continue
        y = np.arange(1, len(v) + 1) / len(v)
        p99 = float(np.quantile(v, 0.99))
        ax.step(np.concatenate([[v[0]], v]), np.concatenate([[0.0], y]), where="post", color=f"C{i % 10}",
                label=f"{cfg.label}: {len(v)} of {total} flows, p99 {p99:.3g} ms")
        drawn += 1
        allv.append(v)
    if not drawn:
        return [Note("FCT CDF: no flow completed in any counted run (flows.csv fct_s empty)")]
    a = np.concatenate(allv)
    if a.min() > 0 and a.max() / a.min() > 50:
        ax.set_xscale("log")
    ax.set_title("Flow completion time CDF per configuration")
    ax.set_xlabel("flow completion time (ms)" + (", log scale" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel("fraction of completed flows")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return [_img("fct-cdf-per-config", fig, "Completed flows only (flows.csv fct_s), pooled over each "
                 "configuration's counted runs; a flow that never completed is counted in the legend's total, "
                 "not in the curve.")]


# --- queue depth over time, busiest ports -----------------------------------------------------------------

#: flow-size buckets of the slowdown figure: [lower, upper) bytes and their label
SIZE_BUCKETS = [(0, 10_000, "< 10 KB"), (10_000, 100_000, "10–100 KB"), (100_000, 1_000_000, "100 KB–1 MB"),
                (1_000_000, 10_000_000, "1–10 MB"), (10_000_000, math.inf, "≥ 10 MB")]


def slowdown_buckets(flows: pd.DataFrame) -> list[tuple[str, int, float, float]]:
    """(bucket label, completed flows, slowdown p50, p99) for every non-empty size bucket (flows.csv
    ``size_bytes`` and ``slowdown``)."""
    if flows is None or not len(flows) or "slowdown" not in flows or "size_bytes" not in flows:
        return []
    f = flows[["size_bytes", "slowdown"]].astype(float).dropna()
    out = []
    for lo, hi, label in SIZE_BUCKETS:
        s = f.loc[(f["size_bytes"] >= lo) & (f["size_bytes"] < hi), "slowdown"]
        if len(s):
            out.append((label, len(s), float(s.quantile(0.5)), float(s.quantile(0.99))))
    return out


def slowdown_by_size(study: Study) -> list[Block]:
    """FCT slowdown p50 and p99 per flow-size bucket, one line pair per configuration (the figure of the
    datacenter congestion-control literature)."""
    per_cfg = []
    for cfg in study.configs:
        frames = [r.flows for r in cfg.counted_runs if r.flows is not None and len(r.flows)]
        b = slowdown_buckets(pd.concat(frames)) if frames else []
        if b:
            per_cfg.append((cfg, b))
    if not per_cfg:
        return [Note("FCT slowdown: no completed sized flow (flows.csv slowdown empty)")]
    labels = [lb for _, _, lb in SIZE_BUCKETS if any(lb == x[0] for _, b in per_cfg for x in b)]
    fig = _figure(8.0, 5.0)
    ax = fig.add_subplot()
    for i, (cfg, b) in enumerate(per_cfg):
        at = {x[0]: x for x in b}
        xs = [k for k, lb in enumerate(labels) if lb in at]
        n = sum(x[1] for x in b)
        ax.plot(xs, [at[labels[k]][2] for k in xs], "o-", color=f"C{i % 10}", label=f"{cfg.label}: p50 ({n} flows)")
        ax.plot(xs, [at[labels[k]][3] for k in xs], "s--", color=f"C{i % 10}", label=f"{cfg.label}: p99")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yscale("log")
    ax.set_xlabel("flow size")
    ax.set_ylabel("FCT slowdown (FCT ÷ ideal FCT), log scale")
    ax.set_title("FCT slowdown by flow size per configuration")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return [_img("slowdown-by-size", fig, "Completed sized flows only, pooled over each configuration's counted "
                 "runs; slowdown = fct_s ÷ ideal_fct_s (flows.csv; the ideal is the empty-fabric time, "
                 "results/README.md).")]


def queue_depth(study: Study) -> list[Block]:
    cfgs, out = _capped(study)
    for cfg in cfgs:
        run = cfg.example
        links = run.links if run else None
        if links is None or "queue_bytes_max" not in links.columns:
            out.append(Note(f"queue depth of {cfg.label}: links.csv has no queue_bytes_max"))
            continue
        tx = links[links["direction"] == "tx"]
        peak = tx.groupby(["switch", "port"])["queue_bytes_max"].max().sort_values(ascending=False)
        peak = peak[peak > 0]
        if not len(peak):
            out.append(Note(f"queue depth of {cfg.label}: no queue built (queue_bytes_max 0 on every port)"))
            continue
        fig = _figure(9.0, 4.8)
        ax = fig.add_subplot()
        for i, (sw, port) in enumerate(peak.index[:BUSIEST_PORTS]):
            g = tx[(tx["switch"] == sw) & (tx["port"] == port)].sort_values("time_s")
            ax.plot(g["time_s"], g["queue_bytes_max"].astype(float) / 1e3, lw=1.2, color=f"C{i}",
                    marker="." if len(g) < 40 else None, label=f"{sw}→{port} (peak {peak[(sw, port)] / 1e3:.3g} KB)")
        ax.set_title(f"Egress queue depth over time, {min(BUSIEST_PORTS, len(peak))} busiest ports\n"
                     f"{_run_label(study, cfg)}")
        ax.set_xlabel("time since run start (s)")
        ax.set_ylabel("largest queue seen in the sample (KB, 10^3 bytes)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        out.append(_img(f"queue-{cfg.label}", fig, "links.csv queue_bytes_max of the tx rows: the deepest egress "
                        "queue an arriving packet saw in each sample; the ports with the highest peak are drawn."))
    return out


# --- JCT per configuration --------------------------------------------------------------------------------

def jct(study: Study) -> list[Block]:
    if study.kind == "run":
        coll = study.configs[0].runs[0].collectives
        if coll is None or not len(coll) or not coll["jct_ms"].notna().any():
            return [Note("JCT: no collectives.csv with a completed operation (the traffic ran no collective job)")]
        fig = _figure(max(6.0, min(24.0, 0.3 * len(coll) + 4.0)), 4.8)
        ax = fig.add_subplot()
        for i, (job, g) in enumerate(coll.groupby("job", sort=False)):
            j = g["jct_ms"].astype(float)
            ax.plot(g["iteration"], j, marker="o", ls="-", color=f"C{i % 10}",
                    label=f"{job} ({g['op'].iloc[0]}): mean {j.mean():.3g} ms")
        from matplotlib.ticker import MaxNLocator
        ax.set_title("Job completion time per iteration")
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("JCT (ms)")
        ax.set_ylim(0, float(coll["jct_ms"].max()) * 1.15)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        return [_img("jct-per-iteration", fig, "collectives.csv jct_ms: each operation's sum over its steps of "
                     "(last flow end − first flow start); an operation that did not complete is absent.")]
    if not any(math.isfinite(c.mean("jct_mean_ms")) for c in study.configs):
        return [Note("JCT per configuration: no run has jct_mean_ms (no collective job completed)")]
    fig, any_ci = _bars(study, [("jct_mean_ms", "mean JCT"), ("jct_p99_ms", "p99 JCT")], "job completion time (ms)",
                        "Job completion time per configuration")
    return [_img("jct-per-config", fig, f"summary.csv jct_mean_ms and jct_p99_ms (over collectives.csv's "
                 f"operations of a run), averaged over the configuration's runs (source: {study.stats_source}). "
                 f"{_ci_words(study, any_ci)}")] + jct_per_job(study)


def job_jct(coll: pd.DataFrame | None) -> dict[str, float]:
    """Mean jct_ms of each job's completed operations in one run's collectives.csv (job → ms)."""
    if coll is None or not len(coll):
        return {}
    out = {}
    for job, g in coll.groupby("job", sort=False):
        v = pd.to_numeric(g["jct_ms"], errors="coerce").dropna()
        if len(v):
            out[str(job)] = float(v.mean())
    return out


def jct_per_job(study: Study) -> list[Block]:
    """Sweeps whose runs have several jobs (e.g. an all-to-all beside a ring all-reduce): each job's JCT per
    configuration, as summary.csv's jct_mean_ms mixes the jobs."""
    per = [(cfg, [job_jct(r.collectives) for r in cfg.counted_runs]) for cfg in study.configs]
    jobs = list(dict.fromkeys(j for _, runs in per for r in runs for j in r))
    if len(jobs) < 2:
        return []
    cfgs = [c for c, _ in per]
    fig = _figure(max(6.0, min(24.0, 3.0 + 0.9 * len(cfgs) * len(jobs))), 5.0)
    ax = fig.add_subplot()
    series, dots = [], []
    for job in jobs:
        vals = [[r.get(job, math.nan) for r in runs] for _, runs in per]
        stat = [stats.mean_ci95(v)[:2] for v in vals]
        series.append((f"job {job}", [m for m, _ in stat], [e for _, e in stat]))
        dots.append(vals)
    any_ci, positions = _grouped_bars(ax, [c.label for c in cfgs], series)
    for xs, vals in zip(positions, dots):
        _run_dots(ax, xs, vals, label="one run" if xs is positions[0] else None, spread=0.4 / len(series))
    ax.set_ylabel("mean JCT of the job's operations (ms)")
    ax.set_title("Job completion time per job and configuration")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return [_img("jct-per-job", fig, "collectives.csv jct_ms: each run's mean over a job's completed operations; "
                 "bars: the mean over the configuration's counted runs, dots: each run. "
                 f"{_ci_words(study, any_ci)}")]


# --- per-flow goodput and fairness ----------------------------------------------------------------------------

#: host pairs drawn in the goodput figure / destination hosts in the fairness-over-time figure, at most
MAX_PAIRS = 16
MAX_RECEIVERS = 8


def pair_goodput(flows: pd.DataFrame) -> pd.Series:
    """goodput_mbps per host pair (src → dst) of one run: the finished flows' goodput, summed over a pair's flows
    (its QPs, or flows_per_pair); flows without goodput_mbps (not finished) are left out."""
    if flows is None or not len(flows):
        return pd.Series(dtype=float)
    g = flows.assign(goodput=pd.to_numeric(flows["goodput_mbps"], errors="coerce")).dropna(subset=["goodput"])
    if not len(g):
        return pd.Series(dtype=float)
    return g.groupby([g["src"].astype(str) + "→" + g["dst"].astype(str)], sort=False)["goodput"].sum()


def flow_goodput(study: Study) -> list[Block]:
    per: list[tuple[Config, list[pd.Series]]] = []
    for cfg in study.configs:
        runs = [pair_goodput(r.flows) for r in cfg.counted_runs if r.flows is not None]
        per.append((cfg, [p for p in runs if len(p)]))
    pairs = list(dict.fromkeys(k for _, runs in per for p in runs for k in p.index))
    if not pairs:
        return [Note("goodput per host pair: no finished flow with goodput_mbps in any counted run")]
    if len(pairs) > MAX_PAIRS:
        return [Note(f"goodput per host pair: {len(pairs)} host pairs, more than {MAX_PAIRS} to draw one bar each "
                     f"(the FCT CDF pools the flows)")]
    fig = _figure(max(6.0, min(24.0, 3.0 + 0.5 * len(pairs) * max(1, len(per)) ** 0.5)), 5.0)
    ax = fig.add_subplot()
    series, dots = [], []
    for cfg, runs in per:
        vals = [[float(p.get(k, math.nan)) for p in runs] for k in pairs]
        jains = [stats.jain(p.to_numpy()) for p in runs if len(p) >= 2]
        stat = [stats.mean_ci95(v)[:2] for v in vals]
        fair = f", Jain {np.mean(jains):.3f}" if jains else ""
        series.append((f"{cfg.label}{fair}", [m for m, _ in stat], [e for _, e in stat]))
        dots.append(vals)
    any_ci, positions = _grouped_bars(ax, pairs, series)
    for xs, vals in zip(positions, dots):
        _run_dots(ax, xs, vals, label="one run" if xs is positions[0] else None, spread=0.4 / len(series))
    ax.set_ylabel("goodput (Mbit/s)")
    ax.set_xlabel("host pair (source → destination)")
    ax.set_title("Goodput per host pair and configuration")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return [_img("goodput-per-pair", fig,
                 "flows.csv goodput_mbps of the finished flows, summed per host pair in each run; bars: the mean "
                 "over the configuration's counted runs (error bars: its 95 % confidence interval when there are "
                 "several), dots: each run. Legend: Jain's fairness index (Σx)² ÷ (n·Σx²) over a run's host pairs, "
                 "averaged over the runs (1 = equal shares, 1/n = one pair takes all).")]


def receiver_rates(links: pd.DataFrame, receivers: list[str]) -> pd.DataFrame:
    """Rate delivered to each receiving host per telemetry sample (Mbit/s): the ``tx`` bytes of every switch port
    whose peer is that host × 8 / interval_s. Index: sample end time (s); one column per host."""
    tx = links[(links["direction"] == "tx") & links["peer"].isin(receivers)]
    if not len(tx):
        return pd.DataFrame(columns=receivers, dtype=float)
    iv = float(tx["interval_s"].median()) or 0.1
    b = (tx["time_s"].astype(float) / iv).round().astype(int)
    grid = tx.assign(bin=b).pivot_table(index="bin", columns="peer", values="bytes", aggfunc="sum").fillna(0.0)
    grid = grid.reindex(columns=receivers, fill_value=0.0)
    grid.index = grid.index.astype(float) * iv
    return grid.astype(float) * 8 / iv / 1e6


def jain_over_time(rates: pd.DataFrame) -> pd.Series:
    """Jain's index across the columns of each row; NaN where nothing was delivered."""
    x = rates.to_numpy(dtype=float)
    s, q = x.sum(axis=1), (x ** 2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        j = np.where(q > 0, s ** 2 / (x.shape[1] * q), np.nan)
    return pd.Series(j, index=rates.index)


def fairness_over_time(study: Study) -> list[Block]:
    cfgs, notes = _capped(study)
    drawn = []
    for cfg in cfgs:
        run = cfg.example
        if run is None or run.links is None or run.flows is None or not len(run.flows):
            notes.append(Note(f"fairness over time of {cfg.label}: links.csv or flows.csv missing or empty"))
            continue
        dst = run.flows["dst"].astype(str)
        if dst.nunique() < 2 or dst.duplicated().any() or dst.nunique() > MAX_RECEIVERS:
            notes.append(Note(f"fairness over time of {cfg.label}: drawn for 2–{MAX_RECEIVERS} flows that each have "
                              f"their own destination host ({len(dst)} flows to {dst.nunique()} hosts here)"))
            continue
        rates = receiver_rates(run.links, list(dst))
        if not len(rates) or not (rates.to_numpy() > 0).any():
            notes.append(Note(f"fairness over time of {cfg.label}: no bytes to the destination hosts in links.csv"))
            continue
        drawn.append((cfg, run, rates))
    if not drawn:
        return notes
    fig = _figure(9.0, 6.5)
    ax_j = fig.add_subplot(2, 1, 1)
    ax_r = fig.add_subplot(2, 1, 2, sharex=ax_j)
    styles = ["-", "--", ":", "-."]
    for i, (cfg, run, rates) in enumerate(drawn):
        j = jain_over_time(rates)
        lab = _run_label(study, cfg)
        ax_j.plot(j.index, j.to_numpy(), color=f"C{i % 10}", lw=1.3, marker="." if len(j) < 60 else None,
                  label=f"{lab}: median {np.nanmedian(j.to_numpy()):.3f}")
        src = dict(zip(run.flows["dst"].astype(str), run.flows["src"].astype(str)))
        for k, host in enumerate(rates.columns):
            ax_r.plot(rates.index, rates[host].to_numpy(), color=f"C{i % 10}", ls=styles[k % len(styles)], lw=1.1,
                      label=f"{cfg.label}: {src[host]}→{host}")
    n = len(drawn[0][2].columns)
    ax_j.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax_j.set_ylim(0, 1.05)
    ax_j.set_ylabel("Jain's index across the flows")
    ax_j.set_title("Fairness over time: Jain's index and each flow's delivered rate")
    ax_r.set_ylabel("delivered rate (Mbit/s, frames)")
    ax_r.set_xlabel("time since run start (s)")
    ax_r.set_ylim(bottom=0)
    for ax in (ax_j, ax_r):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return notes + [_img("fairness-over-time", fig,
                         "Per telemetry sample: each flow's delivered rate = the tx bytes of the switch port(s) to its "
                         "destination host × 8 ÷ interval_s (links.csv; whole frames, retransmissions included), "
                         f"and Jain's index (Σx)² ÷ (n·Σx²) over those rates (n = {n}: 1 = equal shares, 1/n = one "
                         "flow takes all; no value where nothing was delivered). Each configuration's example run; "
                         "drawn when every flow has its own destination host.")]


# --- losses, retransmissions and flow control per configuration -----------------------------------------------

#: summary.csv columns of the losses figure: (column, panel title); a panel is drawn when a configuration's
#: mean is non-zero.
LOSS_COLUMNS = [("drops", "switch drops (packets)"), ("lost_packets", "UDP packets lost (packets)"),
                ("retransmits", "retransmitted packets"), ("trims", "trimmed packets"),
                ("ecn_marks", "ECN marks (packets)"), ("cnps", "CNPs (packets)"),
                ("pause_frames", "PFC pause frames"), ("paused_s_total", "PFC paused time (s, all ports)"),
                ("credit_stall_s_total", "credit-stall time (s, all links)")]


def loss_columns(study: Study) -> list[tuple[str, str]]:
    """The LOSS_COLUMNS that some configuration's mean has non-zero: the losses figure's panels."""
    return [(c, t) for c, t in LOSS_COLUMNS
            if any(math.isfinite(cfg.mean(c)) and cfg.mean(c) != 0 for cfg in study.configs)]


def losses(study: Study) -> list[Block]:
    cols = loss_columns(study)
    if not cols:
        return [Note("losses and flow control: every configuration reads 0 (or nothing) for "
                     + ", ".join(c for c, _ in LOSS_COLUMNS))]
    cfgs = study.configs
    ncol = min(3, len(cols))
    nrow = math.ceil(len(cols) / ncol)
    fig = _figure(max(6.0, min(18.0, ncol * (1.6 + 0.7 * len(cfgs)))), 2.9 * nrow + 0.6)
    any_ci = False
    for i, (col, what) in enumerate(cols):
        ax = fig.add_subplot(nrow, ncol, i + 1)
        m = [c.mean(col) for c in cfgs]
        e = [c.ci95(col) for c in cfgs]
        x = np.arange(len(cfgs))
        ax.bar(x, np.nan_to_num(np.array(m, dtype=float)), 0.7, color=[f"C{k % 10}" for k in range(len(cfgs))])
        k = np.isfinite(e) & np.isfinite(m)
        if k.any():
            ax.errorbar(x[k], np.array(m)[k], yerr=np.array(e)[k], fmt="none", ecolor="black", capsize=3, lw=1.0)
            any_ci = True
        _run_dots(ax, x, [_summary_values(c, col) for c in cfgs], label=None, spread=0.35)
        ax.set_xticks(x, [c.label for c in cfgs], rotation=30 if len(cfgs) > 2 else 0,
                      ha="right" if len(cfgs) > 2 else "center", fontsize="x-small")
        ax.set_title(f"{what}\n({col})", fontsize="small")
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Losses, retransmissions and flow control per configuration")
    return [_img("losses-per-config", fig,
                 "summary.csv counters (results/README.md), one panel each that is non-zero somewhere: the "
                 f"configuration's mean (source: {study.stats_source}); dots: each counted run. "
                 f"{_ci_words(study, any_ci)}")]


# --- pause / credit-stall time per port -------------------------------------------------------------------

def _per_port(cfg: Config, col: str, direction: str) -> pd.Series:
    """Mean over the configuration's counted runs of each port's total `col` (seconds)."""
    per = []
    for r in cfg.counted_runs:
        if r.links is None or col not in r.links.columns:
            continue
        rows = r.links[r.links["direction"] == direction]
        per.append(rows.groupby(["switch", "port"])[col].sum())
    if not per:
        return pd.Series(dtype=float)
    return pd.concat(per, axis=1).fillna(0.0).mean(axis=1)


def pause_time(study: Study) -> list[Block]:
    kinds = [("paused_s", "tx", "PFC pause", "PFC: time the port's egress was paused"),
             ("credit_stall_s", "rx", "Credit stall", "credits: time the link's sender had no credit")]
    out: list[Block] = []
    for col, direction, short, what in kinds:
        per = {cfg.label: _per_port(cfg, col, direction) for cfg in study.configs}
        total = pd.concat(per.values(), axis=1).fillna(0.0).sum(axis=1) if per else pd.Series(dtype=float)
        total = total[total > 0].sort_values(ascending=False)
        if not len(total):
            out.append(Note(f"{short} time per port: 0 in every run ({col} is 0 or absent: "
                            f"{'PFC' if col == 'paused_s' else 'credit flow control'} off or never triggered)"))
            continue
        ports = list(total.index[:PAUSE_PORTS])
        x = np.arange(len(ports))
        w = 0.8 / max(1, len(per))
        fig = _figure(max(7.0, min(24.0, 3.0 + 0.45 * len(ports) * max(1, len(per)) ** 0.5)), 5.0)
        ax = fig.add_subplot()
        for i, (label, s) in enumerate(per.items()):
            vals = [float(s.get(p, 0.0)) for p in ports]
            ax.bar(x + (i - (len(per) - 1) / 2) * w, vals, w, color=f"C{i % 10}", label=label)
        ax.set_xticks(x, [f"{s}→{p}" for s, p in ports], rotation=90 if len(ports) > 6 else 0, fontsize="small")
        ax.set_ylabel(f"{col} summed over the run (s)")
        ax.set_title(f"{what}, per port" + (f" ({PAUSE_PORTS} largest of {len(total)})" if len(total) > PAUSE_PORTS
                                            else ""))
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small")
        out.append(_img(f"{col}-per-port", fig, f"links.csv {col} of the {direction} rows summed over each run, "
                        "averaged over the configuration's counted runs; priorities add up (a port paused 1 s on "
                        "two priorities reads 2 s)."))
    return out


# --- topology coloured by utilisation ---------------------------------------------------------------------

def topology_graph(run, title: str):
    """(figure, how the graph was obtained) for one run: from its manifest's scenario, else from links.csv."""
    from .. import scenario as scenario_mod
    from ..topology import build as build_topology

    m = run.manifest if run is not None else None
    g, how = None, ""
    if isinstance(m, dict) and isinstance(m.get("scenario"), dict):
        try:
            g = from_topology(build_topology(scenario_mod.from_dict(m["scenario"]).topology))
        except scenario_mod.ScenarioError as e:
            how = f" (manifest scenario not readable by this version: {str(e).splitlines()[0]}; drawn from links.csv)"
    if g is None:
        if run is None or run.links is None or not len(run.links):
            return None, "no manifest scenario and no links.csv"
        g = from_links(run.links)
        how = how or " (drawn from links.csv: no scenario in the manifest)"
    util = edge_utilisation(g, port_utilisation(run.links, run.flows)) if run.links is not None else None
    return draw(g, util, title), how


def topology(study: Study) -> list[Block]:
    cfgs, out = _capped(study)
    for cfg in cfgs:
        fig, how = topology_graph(cfg.example, f"Topology coloured by link utilisation\n{_run_label(study, cfg)}")
        if fig is None:
            out.append(Note(f"topology of {cfg.label}: {how}"))
            continue
        out.append(_img(f"topology-{cfg.label}", fig, "Hosts at the bottom, then leaves, spines, cores. A link's "
                        "colour: the mean utilisation over the traffic window of its busier direction" + how + "."))
    return out
