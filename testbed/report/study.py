"""What a report is about, read from disk: one run directory, or a sweep directory (sweep.csv, comparison.csv and
its runs' directories), as configurations, each with its runs and its statistics.

A run directory is a study with one configuration of one run. In a sweep a configuration is one combination of
the varied values; its statistics are comparison.csv's row, or (without comparison.csv) plain means computed
here over its runs that were not flagged. Per-run frames are read only when a figure asks for them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from .columns import (COLLECTIVES_CSV, FLOWS_CSV, LINKS_CSV, SUMMARY_COLUMNS, SUMMARY_CSV, SUMMARY_EXTRA_COLUMNS,
                      SWEEP_CSV)
from .files import ReportError, read_csv, read_manifest
from .frames import collectives_frame, flows_frame, links_frame
from .summary import _num

COMPARISON_CSV = "comparison.csv"
#: comparison.csv columns that are counts, not statistics of a summary column.
COUNT_COLUMNS = ("runs", "flagged_runs", "failed_runs", "runs_total")
#: sweep.csv columns that are neither summary columns nor varied keys.
BOOKKEEPING = {"run_dir", "status", "seed", "run_id", "error", "complete", "queue_model_error", "run"}


@dataclass
class Run:
    """One run directory. Frames are read on first use; a missing file reads as None."""
    dir: Path
    summary: dict = field(default_factory=dict)

    @cached_property
    def manifest(self) -> dict | None:
        return read_manifest(self.dir) if self.dir.is_dir() else None

    @property
    def flagged(self) -> bool:
        return str(self.summary.get("cpu_bound")) == "True"

    @property
    def failed(self) -> bool:
        """sweep.csv's status says the run failed (a run directory has no status: it is what it is)."""
        st = self.summary.get("status")
        return isinstance(st, str) and st not in ("", "ok")

    def _csv(self, name: str) -> pd.DataFrame | None:
        p = self.dir / name
        return read_csv(p) if p.is_file() else None

    @cached_property
    def links(self) -> pd.DataFrame | None:
        df = self._csv(LINKS_CSV)
        return links_frame(df) if df is not None else None

    @cached_property
    def flows(self) -> pd.DataFrame | None:
        df = self._csv(FLOWS_CSV)
        return flows_frame(df) if df is not None else None

    @cached_property
    def collectives(self) -> pd.DataFrame | None:
        df = self._csv(COLLECTIVES_CSV)
        return collectives_frame(df) if df is not None else None


@dataclass
class Config:
    label: str
    values: dict[str, Any]
    runs: list[Run]
    #: statistic name (``<col>_mean``, ``<col>_ci95``, runs, flagged_runs, runs_total) → value
    stats: dict[str, Any]

    def mean(self, col: str) -> float:
        return _f(self.stats.get(f"{col}_mean"))

    def ci95(self, col: str) -> float:
        return _f(self.stats.get(f"{col}_ci95"))

    @property
    def counted_runs(self) -> list[Run]:
        """The runs the means count: the completed ones (status not failed) that are not flagged, unless every
        completed run was flagged or the statistics say the flagged ones were kept (``runs`` = ``runs_total`` −
        ``failed_runs``)."""
        done = [r for r in self.runs if not r.failed]
        ok = [r for r in done if not r.flagged]
        failed = _f(self.stats.get("failed_runs"))
        kept = (_f(self.stats.get("runs")) == _f(self.stats.get("runs_total")) - (0 if math.isnan(failed) else failed)
                and len(ok) < len(done))
        return done if kept or not ok else ok

    @property
    def example(self) -> Run | None:
        """The run whose time series the report draws for this configuration: the first counted one."""
        c = self.counted_runs
        return c[0] if c else None


@dataclass
class Study:
    dir: Path
    kind: str                      # "run" | "sweep"
    configs: list[Config]
    keys: list[str]                # varied keys (sweep); [] for a run
    stats_source: str              # where Config.stats came from, said in the report
    scenario: dict | None          # the first run's resolved scenario (manifest)
    sweep: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[Run]:
        return [r for c in self.configs for r in c.runs]


def _f(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _row(df: pd.DataFrame, i: int) -> dict:
    """Row ``i`` as plain Python, each value in its column's type (``df.iloc[i]`` would make an all-number row of
    comparison.csv one float Series: a varied value 1 would read 1.0 there and 1 in sweep.csv)."""
    return {k: _num(df[k].iat[i]) for k in df.columns}


def load(d: str | Path) -> Study:
    """The study in directory ``d``: a sweep if it holds sweep.csv, else a run (links.csv and flows.csv or
    summary.csv). Anything else is a ReportError naming the directory."""
    d = Path(d)
    if not d.is_dir():
        raise ReportError(f"{d}: no such directory")
    if (d / SWEEP_CSV).is_file():
        return _sweep(d)
    if (d / LINKS_CSV).is_file() or (d / SUMMARY_CSV).is_file():
        return _run(d)
    raise ReportError(f"{d}: not a result directory (no {SWEEP_CSV}, {LINKS_CSV} or {SUMMARY_CSV})")


def _run(d: Path) -> Study:
    s = read_csv(d / SUMMARY_CSV) if (d / SUMMARY_CSV).is_file() else pd.DataFrame()
    summary = _row(s, 0) if len(s) else {}
    run = Run(d, summary)
    stats = {f"{k}_mean": v for k, v in summary.items()}
    stats.update(runs=1, flagged_runs=int(run.flagged), runs_total=1)
    label = str(summary.get("load_balancing") or d.name)
    m = run.manifest
    return Study(d, "run", [Config(label, {}, [run], stats)], [], SUMMARY_CSV,
                 m.get("scenario") if isinstance(m, dict) else None)


def _config_columns(sweep: pd.DataFrame, comparison: pd.DataFrame | None) -> list[str]:
    if comparison is not None:
        return [c for c in comparison.columns
                if c not in COUNT_COLUMNS and not c.endswith("_mean") and not c.endswith("_ci95")]
    known = set(SUMMARY_COLUMNS) | set(SUMMARY_EXTRA_COLUMNS) | BOOKKEEPING
    return [c for c in sweep.columns if c not in known]


def _resolve(d: Path, run_dir: Any) -> Path:
    """sweep.csv's run_dir: the directory of that name inside the sweep directory first (where sweeps put their
    runs; it still holds after the sweep directory was moved or copied), else the path as written."""
    p = Path(str(run_dir))
    for cand in (d / p.name, p, d / p):
        if cand.is_dir():
            return cand
    return d / p.name


def _key(values: dict) -> tuple:
    return tuple((k, str(v)) for k, v in values.items())


def _label(values: dict) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in values.items()) or "all runs"


def _sweep(d: Path) -> Study:
    sweep = read_csv(d / SWEEP_CSV)
    if not len(sweep):
        raise ReportError(f"{d / SWEEP_CSV}: no runs")
    comp = read_csv(d / COMPARISON_CSV) if (d / COMPARISON_CSV).is_file() else None
    if comp is not None and not len(comp):
        comp = None
    keys = [k for k in _config_columns(sweep, comp) if k in sweep.columns]
    if not keys and comp is None:      # a sweep.csv without varied columns (older sweeps): the modes that differ
        keys = [k for k in ("load_balancing", "profile") if k in sweep.columns and sweep[k].nunique() > 1]
    notes = []
    missing = [k for k in _config_columns(sweep, comp) if k not in sweep.columns]
    if missing:
        notes.append(f"{COMPARISON_CSV} groups by {', '.join(missing)}, which {SWEEP_CSV} lacks; runs grouped by "
                     f"{', '.join(keys) or 'nothing'}")
    groups: dict[tuple, Config] = {}
    for i in range(len(sweep)):
        row = _row(sweep, i)
        values = {k: row.get(k) for k in keys}
        cfg = groups.setdefault(_key(values), Config(_label(values), values, [], {}))
        rd = row.get("run_dir")
        run = Run(_resolve(d, rd) if rd is not None and not (isinstance(rd, float) and math.isnan(rd))
                  else d / f"run-{i}", row)
        cfg.runs.append(run)
    configs = list(groups.values())
    if comp is not None:
        by = {_key({k: r.get(k) for k in keys}): r for r in (_row(comp, i) for i in range(len(comp)))}
        for c in configs:
            c.stats = by.get(_key(c.values), {})
            if not c.stats:
                notes.append(f"{COMPARISON_CSV} has no row for {c.label}")
        source = COMPARISON_CSV
    else:
        for c in configs:
            c.stats = _means(c)
        source = f"{SWEEP_CSV} (no {COMPARISON_CSV}: plain means of the runs not flagged, no confidence intervals)"
    first = next((r.manifest for c in configs for r in c.runs if r.manifest), None)
    return Study(d, "sweep", configs, keys, source, first.get("scenario") if first else None, sweep, notes)


def _means(c: Config) -> dict:
    runs = [r for r in c.runs if not r.failed]
    ok = [r for r in runs if not r.flagged] or runs
    df = pd.DataFrame([r.summary for r in ok])
    out: dict[str, Any] = {}
    for col in df.columns:
        v = pd.to_numeric(df[col], errors="coerce")
        if v.notna().any() and df[col].dtype != bool:
            out[f"{col}_mean"] = float(v.mean())
    out.update(runs=len(ok), flagged_runs=sum(r.flagged for r in runs), failed_runs=len(c.runs) - len(runs),
               runs_total=len(c.runs))
    return out
