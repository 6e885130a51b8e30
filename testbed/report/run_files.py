"""A run's result files written from what the run hands over, read back and summarised again, and the
sweep tables that join several runs (the files' contract: results/README.md)."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from .columns import (CC_CSV, COLLECTIVE_SIGNALS_CSV, COLLECTIVES_CSV, CONTROLLER_CSV, FAILURES_CSV, FLOWS_CSV, INT_CSV, INT_PATHS_CSV, LINKS_CSV, MANIFEST,
                      MANIFEST_INPUTS, META_KEYS, RESULT_FILES, SM_CSV, SUMMARY_COLUMNS, SUMMARY_CSV,
                      SUMMARY_EXTRA_COLUMNS, SWEEP_CSV, SWEEP_PNG, WEIGHTS_CSV)
from ..dilation import COLLECTIVE_REAL, FLOW_REAL, LINK_REAL, real_columns
from .files import ReportError, read_csv, read_manifest, write_csv, write_json
from .frames import (cc_frame, collective_signals_frame, collectives_frame, controller_frame, failures_frame, flows_frame, int_frame, int_paths_frame,
                     links_frame, ordered, sm_frame, weights_frame)
from .plots import SKIPPED, _figure, _save, plots, wanted
from .summary import _num, summarize


def write_report(d: str | os.PathLike) -> Path:
    """DIR/report.html and DIR/report.md of a run or sweep directory (document.py; imported on use, so importing
    this package stays as light as before)."""
    from .document import write_report as write
    return write(d)


def _summary_frame(row: Mapping[str, Any]) -> pd.DataFrame:
    return ordered(pd.DataFrame([dict(row)]), SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS)


def _present(outdir: Path) -> list[str]:
    return [f for f in RESULT_FILES if (outdir / f).is_file()]


def write_run(outdir: str | os.PathLike, manifest: Mapping[str, Any], links: Iterable[Mapping[str, Any]],
              flows: Iterable[Mapping[str, Any]], cpu: Mapping[str, Any] | None,
              meta: Mapping[str, Any], collectives: Iterable[Mapping[str, Any]] | None = None,
              failures: Iterable[Mapping[str, Any]] | None = None,
              sm: Iterable[Mapping[str, Any]] | None = None,
              int_rows: Iterable[Mapping[str, Any]] | None = None,
              weights: Iterable[Mapping[str, Any]] | None = None,
              cc: Iterable[Mapping[str, Any]] | None = None,
              controller: Iterable[Mapping[str, Any]] | None = None,
              collective_signals: Iterable[Mapping[str, Any]] | None = None) -> dict:
    """Write a run's result directory (created if needed) and return its summary row.

    Order: links.csv, flows.csv, [collectives.csv, failures.csv, sm.csv], summary.csv, plots (unless
    plots.wanted() says no: the manifest's ``plots`` says which), then manifest.json (with `files` and the
    summary inputs under `report_inputs`), so a manifest always describes files that exist.
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    links_df = links_frame(links)
    flows_df = flows_frame(flows)
    n = int((meta or {}).get("time_dilation") or 1)
    if n > 1:
        real_columns(links_df, n, LINK_REAL)
        real_columns(flows_df, n, FLOW_REAL)
    write_csv(outdir / LINKS_CSV, links_df)
    write_csv(outdir / FLOWS_CSV, flows_df)
    coll_df = None
    if collectives is not None:
        coll_df = collectives_frame(collectives)
        if n > 1:
            real_columns(coll_df, n, COLLECTIVE_REAL)
        write_csv(outdir / COLLECTIVES_CSV, coll_df)
    fail_df = None
    if failures is not None:
        fail_df = failures_frame(failures)
        write_csv(outdir / FAILURES_CSV, fail_df)
    if sm is not None:
        write_csv(outdir / SM_CSV, sm_frame(sm))
    if weights is not None:
        write_csv(outdir / WEIGHTS_CSV, weights_frame(weights))
    if controller is not None:
        write_csv(outdir / CONTROLLER_CSV, controller_frame(controller))
    if collective_signals is not None:
        write_csv(outdir / COLLECTIVE_SIGNALS_CSV, collective_signals_frame(collective_signals))
    cc_df = None
    if cc is not None:
        cc_df = cc_frame(cc)
        write_csv(outdir / CC_CSV, cc_df)
    int_df = None
    if int_rows is not None:
        int_df = int_frame(int_rows)
        write_csv(outdir / INT_CSV, int_df)
        write_csv(outdir / INT_PATHS_CSV, int_paths_frame(int_df))
    row = summarize(links_df, flows_df, cpu, meta, coll_df, fail_df, int_df)
    write_csv(outdir / SUMMARY_CSV, _summary_frame(row))
    drawn = wanted()
    if drawn:
        plots(outdir, links_df, flows_df, int_df, cc_df)
    m = dict(manifest or {})
    m["plots"] = "drawn" if drawn else SKIPPED
    m[MANIFEST_INPUTS] = {"meta": dict(meta or {}), "cpu": dict(cpu or {})}
    m["files"] = sorted(set(_present(outdir)) | {MANIFEST})
    write_json(outdir / MANIFEST, m)
    return row


def _inputs(d: Path, manifest: dict | None) -> tuple[dict, dict]:
    """(meta, cpu) for the summary: from the manifest's report_inputs, else the old summary.csv, else top-level."""
    if manifest and isinstance(manifest.get(MANIFEST_INPUTS), dict):
        inp = manifest[MANIFEST_INPUTS]
        return dict(inp.get("meta") or {}), dict(inp.get("cpu") or {})
    if (d / SUMMARY_CSV).is_file():
        old = read_csv(d / SUMMARY_CSV)
        if len(old):
            r = {k: _num(v) for k, v in old.iloc[0].items()}
            meta = {k: r.get(k) for k in META_KEYS}
            cpu = {"cpu_bound": r.get("cpu_bound"), "cpu_busy_mean": r.get("cpu_busy_mean"),
                   "cpu_busy_max": r.get("cpu_busy_max")}
            return meta, {k: v for k, v in cpu.items() if v is not None and not _isnan(v)}
    if manifest:
        meta = {k: manifest.get(k) for k in META_KEYS}
        cpu = manifest.get("cpu") if isinstance(manifest.get("cpu"), dict) else {}
        return meta, dict(cpu)
    raise ReportError(f"{d}: not a result directory (no {MANIFEST} or {SUMMARY_CSV} to take the run metadata from)")


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _load(d: str | os.PathLike) -> tuple[Path, dict | None, pd.DataFrame, pd.DataFrame, dict, dict]:
    d = Path(d)
    if not d.is_dir():
        raise ReportError(f"{d}: no such directory")
    missing = [f for f in (LINKS_CSV, FLOWS_CSV) if not (d / f).is_file()]
    if missing:
        raise ReportError(f"{d}: not a result directory (missing {', '.join(missing)})")
    manifest = read_manifest(d)
    links_df = links_frame(read_csv(d / LINKS_CSV))
    flows_df = flows_frame(read_csv(d / FLOWS_CSV))
    meta, cpu = _inputs(d, manifest)
    return d, manifest, links_df, flows_df, meta, cpu


def report(outdir: str | os.PathLike) -> dict:
    """Recompute summary.csv and the plots of an existing result directory from its files; returns the row."""
    d, manifest, links_df, flows_df, meta, cpu = _load(outdir)
    coll_df = collectives_frame(read_csv(d / COLLECTIVES_CSV)) if (d / COLLECTIVES_CSV).is_file() else None
    fail_df = failures_frame(read_csv(d / FAILURES_CSV)) if (d / FAILURES_CSV).is_file() else None
    int_df = int_frame(read_csv(d / INT_CSV)) if (d / INT_CSV).is_file() else None
    cc_df = cc_frame(read_csv(d / CC_CSV)) if (d / CC_CSV).is_file() else None
    row = summarize(links_df, flows_df, cpu, meta, coll_df, fail_df, int_df)
    write_csv(d / SUMMARY_CSV, _summary_frame(row))
    if int_df is not None:
        write_csv(d / INT_PATHS_CSV, int_paths_frame(int_df))
    plots(d, links_df, flows_df, int_df, cc_df)
    if manifest is not None:
        manifest["plots"] = "drawn"
        manifest["files"] = sorted(set(_present(d)) | {MANIFEST})
        write_json(d / MANIFEST, manifest)
    return row




# --- sweeps ---------------------------------------------------------------------------------------------

def sweep_table(dirs: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row per run directory (its summary.csv; recomputed in memory if absent), plus a `run_dir` column."""
    rows = []
    for d in dirs:
        d = Path(d)
        if (d / SUMMARY_CSV).is_file():
            s = read_csv(d / SUMMARY_CSV)
            if len(s) != 1:
                raise ReportError(f"{d / SUMMARY_CSV}: expected exactly one row, found {len(s)}")
            row = {k: _num(v) for k, v in s.iloc[0].items()}
        else:
            _, _, links_df, flows_df, meta, cpu = _load(d)
            fail_df = failures_frame(read_csv(d / FAILURES_CSV)) if (d / FAILURES_CSV).is_file() else None
            row = summarize(links_df, flows_df, cpu, meta, failures_df=fail_df)
        row["run_dir"] = str(d)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS + ["run_dir"])
    df = pd.DataFrame(rows)
    for c in SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    return ordered(df, SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS).reset_index(drop=True)


def write_sweep(outdir: str | os.PathLike, df: pd.DataFrame) -> list[str]:
    """Write sweep.csv and sweep.png (goodput and uplink imbalance per run); returns the file names written."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    write_csv(outdir / SWEEP_CSV, df)
    written = [SWEEP_CSV]
    if len(df) and {"goodput_mbps", "uplink_imbalance"} <= set(df.columns):
        labels = []
        for i, r in df.reset_index(drop=True).iterrows():
            rid = r.get("run_id")
            rid = str(rid) if rid is not None and not _isnan(rid) else f"run {i}"
            lb = r.get("load_balancing")
            labels.append(f"{rid}\n{lb}" if isinstance(lb, str) and lb else rid)
        x = np.arange(len(df))
        fig = _figure(max(7.0, min(24.0, 0.6 * len(df) + 4.0)), 7.0)
        ax1, ax2 = fig.subplots(2, 1, sharex=True)
        cb = df["cpu_bound"] if "cpu_bound" in df.columns else pd.Series([False] * len(df))
        colors = ["C3" if str(v) == "True" else "C0" for v in cb]
        ax1.bar(x, pd.to_numeric(df["goodput_mbps"], errors="coerce"), color=colors)
        ax1.set_ylabel("goodput (Mbit/s)")
        ax1.set_title("Goodput and uplink imbalance by run (red = CPU-bound run, not trustworthy)")
        ax1.grid(True, axis="y", alpha=0.3)
        ax2.bar(x, pd.to_numeric(df["uplink_imbalance"], errors="coerce"), color=colors)
        ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax2.set_ylabel("uplink imbalance (max/mean bytes, 1 = even)")
        ax2.set_xlabel("run")
        ax2.set_xticks(x, labels, rotation=90 if len(df) > 6 else 0, fontsize="small")
        ax2.grid(True, axis="y", alpha=0.3)
        _save(fig, outdir / SWEEP_PNG)
        written.append(SWEEP_PNG)
    return written
