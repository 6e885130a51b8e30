"""PNG plots of one run: uplink utilisation over time, bytes per uplink, FCT CDF, INT path delay.

matplotlib's Agg canvas is used directly (no pyplot, no global backend switch), so this module is safe to import
from the CLI and from tests without a display. A plot without data is skipped (its file is absent).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .columns import PLOT_FILES
from .files import atomic_write
from .frames import flows_frame, links_frame
from .summary import imbalance, traffic_window, uplinks


PLOTS_ENV = "FTB_PLOTS"       # "0": runs draw no PNG and no HTML report (`testbed run --no-plots`)
SKIPPED = "skipped (--no-plots or FTB_PLOTS=0): testbed report DIR draws them"
REPORT_SKIPPED = "not written (--no-plots or FTB_PLOTS=0): testbed report DIR writes it"


def wanted() -> bool:
    """Whether a run draws its plots and report: drawing is most of a short run's writing time (≈ 0.2 s a PNG),
    which a sweep of many runs or a test suite may leave to ``testbed report DIR`` (it draws them from the
    CSVs)."""
    return os.environ.get(PLOTS_ENV, "1") != "0"


def _figure(w: float = 9.0, h: float = 5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    return atomic_write(path, lambda fh: fig.savefig(fh, format="png", metadata={"Software": None}),
                         binary=True)


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (what the HTML report embeds as base64)."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def plots(outdir: str | os.PathLike, links_df: pd.DataFrame, flows_df: pd.DataFrame,
          int_df: pd.DataFrame | None = None, cc_df: pd.DataFrame | None = None) -> list[str]:
    """Write the PNG plots that have data; returns the file names written (skipped plots are absent)."""
    outdir = Path(outdir)
    written: list[str] = []
    for name, fig in run_figures(links_df, flows_df, int_df, cc_df).items():
        if fig is not None:
            _save(fig, outdir / PLOT_FILES[name])
            written.append(PLOT_FILES[name])
    return written


def run_figures(links_df: pd.DataFrame, flows_df: pd.DataFrame, int_df: pd.DataFrame | None = None,
                cc_df: pd.DataFrame | None = None) -> dict[str, object]:
    """Each per-run plot (PLOT_FILES' names) as a matplotlib Figure, or None where it has no data; the HTML
    report embeds the same figures."""
    links_df = links_frame(links_df if links_df is not None else [])
    flows_df = flows_frame(flows_df if flows_df is not None else [])
    figs: dict[str, object] = {name: None for name in PLOT_FILES}
    up = uplinks(links_df, flows_df, traffic_window(flows_df))
    keys = set(zip(up["switch"], up["port"]))

    # (1) uplink utilisation over time, one line per uplink of the leaves that sent traffic
    series = links_df[(links_df["role"] == "up") & (links_df["direction"] == "tx")] if len(links_df) else links_df
    if len(keys) and len(series):
        fig = _figure()
        ax = fig.add_subplot()
        n = 0
        for (sw, port), g in series.groupby(["switch", "port"], sort=True):
            if (sw, port) not in keys:
                continue
            g = g.sort_values("time_s")
            ax.plot(g["time_s"], g["util"] * 100.0, lw=1.2, marker="." if len(g) < 40 else None,
                    label=f"{sw}→{port}")
            n += 1
        ax.axhline(100.0, color="grey", lw=0.8, ls="--")
        ax.set_title("Uplink utilisation of the source leaves over time (tx, leaf → spine)")
        ax.set_xlabel("time since run start (s)")
        ax.set_ylabel("utilisation (% of link rate)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if n <= 16:
            ax.legend(fontsize="small", ncol=2 if n > 8 else 1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figs["uplink_util"] = fig

    # (2) bytes per uplink: ECMP collisions show as tall and empty bars, spraying as an even row
    if len(up) and float(up["tx_bytes"].sum()) > 0:
        fig = _figure(max(6.0, min(24.0, 0.35 * len(up) + 3.0)), 5.0)
        ax = fig.add_subplot()
        leaves = list(dict.fromkeys(up["switch"]))
        colors = {leaf: f"C{i % 10}" for i, leaf in enumerate(leaves)}
        mb = up["tx_bytes"].astype(float) / 1e6
        ax.bar(range(len(up)), mb, color=[colors[s] for s in up["switch"]])
        ax.set_xticks(range(len(up)), [f"{s}→{p}" for s, p in zip(up["switch"], up["port"])],
                      rotation=90 if len(up) > 8 else 0, fontsize="small")
        mean = float(mb.mean())
        ax.axhline(mean, color="black", lw=0.9, ls="--", label=f"mean {mean:.3g} MB")
        imb = imbalance(up)[0]
        ax.set_title(f"Bytes sent per uplink of the source leaves (imbalance, busiest/mean per leaf = {imb:.2f})")
        ax.set_xlabel("leaf uplink (leaf → spine)")
        ax.set_ylabel("bytes sent (MB, 10^6 bytes)")
        ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
        figs["uplink_bytes"] = fig

    # (3) CDF of flow completion times (completed flows only)
    fct_ms = np.sort(flows_df["fct_s"].astype(float).dropna().to_numpy() * 1e3) if len(flows_df) else np.array([])
    if len(fct_ms):
        fig = _figure(7.0, 5.0)
        ax = fig.add_subplot()
        y = np.arange(1, len(fct_ms) + 1) / len(fct_ms)
        ax.step(np.concatenate([[fct_ms[0]], fct_ms]), np.concatenate([[0.0], y]), where="post")
        p50, p99 = np.quantile(fct_ms, [0.5, 0.99])
        ax.axvline(p50, color="C1", ls="--", lw=0.9, label=f"p50 {p50:.3g} ms")
        ax.axvline(p99, color="C3", ls="--", lw=0.9, label=f"p99 {p99:.3g} ms")
        ax.set_title(f"Flow completion time CDF ({len(fct_ms)} of {len(flows_df)} flows completed)")
        ax.set_xlabel("flow completion time (ms)")
        ax.set_ylabel("fraction of completed flows")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
        figs["fct_cdf"] = fig

    # (4) INT: each path's delay over time (median per 10 ms of its reports' path delays)
    if int_df is not None and len(int_df):
        per = int_df.drop_duplicates("report")
        fig = _figure()
        ax = fig.add_subplot()
        paths = list(per.groupby("path", sort=True))
        for path, g in paths[:16]:
            b = (g["time_s"].astype(float) / 0.01).round() * 0.01
            m = g.groupby(b)["path_delay_ns"].median() / 1e3
            ax.plot(m.index, m.to_numpy(), lw=1.1, marker="." if len(m) < 40 else None, label=path)
        ax.set_title(f"INT path delay over time (median per 10 ms; {len(paths)} paths"
                     + (", first 16 shown)" if len(paths) > 16 else ")"))
        ax.set_xlabel("time since run start (s)")
        ax.set_ylabel("path delay: sum of hop latencies (µs)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figs["int_path_delay"] = fig

    # (5) CC: window and rate over time of two flows (the lowest flow ids that have samples)
    if cc_df is not None and len(cc_df):
        fig = _figure(9.0, 6.0)
        ax_r, ax_w = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
        for fid in sorted(cc_df["flow_id"].dropna().unique())[:2]:
            g = cc_df[cc_df["flow_id"] == fid]
            ax_r.plot(g["time_s"], g["rate_bps"] / 1e6, lw=1.0, label=f"flow {int(fid)}")
            if g["cwnd_bytes"].notna().any():
                ax_w.plot(g["time_s"], g["cwnd_bytes"] / 1024, lw=1.0, label=f"flow {int(fid)}")
        ax_r.set_title("congestion control: sending rate and window over time (two flows)")
        ax_r.set_ylabel("rate (Mbit/s)")
        ax_w.set_ylabel("window (KiB)")
        ax_w.set_xlabel("time since run start (s)")
        for ax in (ax_r, ax_w):
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:       # a rate-based CC (eqds) keeps no window
                ax.legend(fontsize="small", loc="upper right")
        figs["cc"] = fig
    return figs
