"""PNG plots of one run: uplink utilisation over time, bytes per uplink, FCT CDF.

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


def _figure(w: float = 9.0, h: float = 5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    return atomic_write(path, lambda fh: fig.savefig(fh, format="png", metadata={"Software": None}),
                         binary=True)


def plots(outdir: str | os.PathLike, links_df: pd.DataFrame, flows_df: pd.DataFrame,
          int_df: pd.DataFrame | None = None) -> list[str]:
    """Write the PNG plots that have data; returns the file names written (skipped plots are absent)."""
    outdir = Path(outdir)
    links_df = links_frame(links_df if links_df is not None else [])
    flows_df = flows_frame(flows_df if flows_df is not None else [])
    written: list[str] = []
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
        _save(fig, outdir / PLOT_FILES["uplink_util"])
        written.append(PLOT_FILES["uplink_util"])

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
        _save(fig, outdir / PLOT_FILES["uplink_bytes"])
        written.append(PLOT_FILES["uplink_bytes"])

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
        _save(fig, outdir / PLOT_FILES["fct_cdf"])
        written.append(PLOT_FILES["fct_cdf"])

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
        _save(fig, outdir / PLOT_FILES["int_path_delay"])
        written.append(PLOT_FILES["int_path_delay"])
    return written
