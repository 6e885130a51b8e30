"""Sweeps: one scenario × every combination of ``--vary`` values × seeds, run one at a time, resumable.

Each run is a whole ``lifecycle.run`` (its own lab, torn down before the next) in its own directory under the sweep
directory. ``sweep.json`` records the plan, so ``--resume`` can check it continues the same sweep and skip the
runs whose manifest says they completed. Ctrl-C (or SIGTERM) stops after tearing the current run down; the
tables are written for the runs that finished. The statistics are in report/stats.py.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from .errors import TestbedError
from . import report
from . import scenario as scenario_mod
from .report import stats
from .report.columns import COMPARISON_CSV, MANIFEST, SUMMARY_CSV, SWEEP_JSON
from .report.files import ReportError, jsonable, read_manifest, write_csv, write_json
from .scenario import Scenario

OK, FAILED = "ok", "failed"


class SweepError(TestbedError):
    """A sweep that cannot start or continue, phrased for the user (one line)."""


@dataclass(frozen=True)
class PlannedRun:
    index: int
    values: tuple[tuple[str, str], ...]     # the varied keys and their values, as typed after --vary
    seed: int
    name: str                                # the run's directory under the sweep directory
    scen: Scenario

    @property
    def label(self) -> str:
        return " ".join([f"{k}={v}" for k, v in self.values] + [f"seed={self.seed}"])


def parse_varies(varies: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``key.path=v1,v2`` → (key, [v1, v2]); a key given twice or an empty value is refused."""
    axes: list[tuple[str, list[str]]] = []
    for v in varies:
        key, sep, values = v.partition("=")
        key = key.strip()
        vals = [x.strip() for x in values.split(",")]
        if not sep or not key or not values or any(not x for x in vals):
            raise SweepError(f"--vary {v!r}: expected key.path=v1,v2,…")
        if any(key == k for k, _ in axes):
            raise SweepError(f"--vary {key}: given twice; list every value once, e.g. --vary {key}=a,b,c")
        axes.append((key, vals))
    return axes


def _dir_name(index: int, width: int, values, seed: int | None) -> str:
    label = "_".join(f"{k.rsplit('.', 1)[-1]}-{x}" for k, x in values)
    if seed is not None:
        label = f"{label}_seed-{seed}" if label else f"seed-{seed}"
    return f"{index:0{width}d}-{re.sub(r'[^A-Za-z0-9_.-]', '', label)}"


def plan(path: str, sets: Sequence[str], varies: Sequence[str], seeds: int | None) -> list[PlannedRun]:
    """Every run of the sweep, each scenario validated now (a bad value fails before anything is built).

    ``seeds`` N: each combination runs with scenario ``seed`` = base, base+1, …, base+N−1, where base is the
    combination's own ``seed`` (the scenario's, default 1). None: one run per combination, with its seed."""
    axes = parse_varies(varies)
    if seeds is not None and any(k == "seed" for k, _ in axes):
        raise SweepError("--vary seed and --seeds both set the scenario's seed: use one of them")
    if not axes and seeds is None:
        raise SweepError("nothing to sweep: give --vary key.path=v1,v2 and/or --seeds N")
    combos = list(itertools.product(*[[(k, x) for x in vals] for k, vals in axes]))
    n_total = len(combos) * (seeds or 1)
    width = max(2, len(str(n_total - 1)))
    runs: list[PlannedRun] = []
    for combo in combos:
        over = tuple(sets) + tuple(f"{k}={x}" for k, x in combo)
        scen = scenario_mod.load(path, over)
        seed_list = [scen.seed + i for i in range(seeds)] if seeds is not None else [None]
        for s in seed_list:
            if s is not None:
                scen_s = scenario_mod.load(path, over + (f"seed={s}",))
            else:
                scen_s = scen
            runs.append(PlannedRun(len(runs), tuple(combo), scen_s.seed, _dir_name(len(runs), width, combo, s),
                                   scen_s))
    return runs


def _plan_doc(path: str, sets, varies, seeds, runs: list[PlannedRun]) -> dict:
    return {"scenario": str(path), "sets": list(sets), "vary": [list(a) for a in parse_varies(varies)],
            "seeds": seeds,
            "runs": [{"dir": r.name, "values": dict(r.values), "seed": r.seed} for r in runs]}


def run_state(d: Path, run: PlannedRun) -> str:
    """``complete`` (its manifest exists and records no failure), ``failed`` (a manifest with ``failed``),
    ``partial`` (a directory without a manifest: interrupted) or ``absent``. A manifest of another scenario
    than the planned one is refused: the directory belongs to a different sweep."""
    if not d.exists():
        return "absent"
    m = read_manifest(d)
    if m is None:
        return "partial"
    want = json.loads(json.dumps(jsonable(scenario_mod.to_dict(run.scen))))
    if m.get("scenario") != want:
        raise SweepError(f"{d}: holds a run of another scenario than this sweep's {run.label!r}; resume with the "
                         f"same scenario file, --set, --vary and --seeds, or choose another --out")
    return "failed" if m.get("failed") else "complete"


def run_row(run: PlannedRun, d: Path, status: str, error: str | None = None) -> dict:
    """A run's sweep.csv row: its summary.csv row (when it wrote one) + run_dir, the varied values, status."""
    row: dict = {}
    if (d / SUMMARY_CSV).is_file() or (d / MANIFEST).is_file():
        try:
            row = report.sweep_table([d]).iloc[0].to_dict()
        except ReportError:
            if status == OK:
                raise
            # a run that failed before writing its tables: the row says so (status, failed)
    if not row:                                  # failed before writing anything: what the plan knows
        row = {"scenario": run.scen.name, "load_balancing": run.scen.switch.load_balancing,
               "duration_s": run.scen.duration / 1e9, "profile": run.scen.profile}
    row["seed"] = run.seed
    row["run_dir"] = str(d)
    row.update(dict(run.values))
    row["status"] = status
    if status == FAILED and error and not (isinstance(row.get("failed"), str) and row["failed"]):
        row["failed"] = error
    return row


def table(rows: list[dict], keys: Sequence[str]) -> pd.DataFrame:
    """sweep.csv: the summary columns first (results/README.md order), then run_dir, the varied keys, status."""
    cols = report.SUMMARY_COLUMNS + report.SUMMARY_EXTRA_COLUMNS
    if not rows:
        return pd.DataFrame(columns=cols + ["run_dir", *keys, "status"])
    df = pd.DataFrame(rows)
    for c in cols:
        if c not in df.columns:
            df[c] = float("nan")
    tail = ["run_dir", *[k for k in keys if k not in cols], "status"]
    rest = [c for c in df.columns if c not in cols and c not in tail]
    return df[cols + rest + tail].reset_index(drop=True)


@dataclass
class Outcome:
    outdir: Path
    sweep: pd.DataFrame
    comparison: pd.DataFrame
    skipped: int          # already complete (--resume)
    ran: int
    failed: int
    total: int


def write_tables(outdir: Path, rows: list[dict], keys: Sequence[str], include_flagged: bool
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = table(rows, keys)
    report.write_sweep(outdir, df)
    comp = stats.comparison(df, list(keys), include_flagged)
    write_csv(outdir / COMPARISON_CSV, comp)
    return df, comp


class _Interrupts:
    """Remember SIGINT/SIGTERM while the sweep runs. Python raises KeyboardInterrupt (the CLI: Terminated) wherever
    the main thread is, and one raised inside a weakref callback or ``__del__`` is printed and dropped; then the
    run goes on to its end and :meth:`check` raises it there, so the sweep still stops."""

    def __init__(self):
        self.signum: int | None = None
        self._prev: dict = {}

    def __enter__(self) -> "_Interrupts":
        self._hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                prev = signal.getsignal(sig)
                if callable(prev):                 # an ignored or default signal stays as it is
                    self._prev[sig] = prev
                    signal.signal(sig, self._handler)
        return self

    def _unraisable(self, u) -> None:
        if self.signum is not None and not isinstance(u.exc_value, Exception):
            return                                       # our interrupt, dropped by Python: check() raises it
        self._hook(u)

    def _handler(self, signum, frame) -> None:
        self.signum = signum
        self._prev[signum](signum, frame)

    def check(self) -> None:
        if self.signum is not None:
            self._prev[self.signum](self.signum, None)     # raises what the original handler raises
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        sys.unraisablehook = self._hook
        for sig, prev in self._prev.items():
            signal.signal(sig, prev)


def _eta(durations: list[float], remaining: int) -> str:
    if not durations:
        return "?"
    s = int(round(sum(durations) / len(durations) * remaining))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def execute(path: str, sets: Sequence[str], varies: Sequence[str], seeds: int | None, outdir: Path, *,
            runs: list[PlannedRun] | None = None, resume: bool = False, include_flagged: bool = False,
            console=None, run_fn: Callable | None = None, pool=None) -> Outcome:
    """Run the sweep (plan → skip complete runs when resuming → run the rest) and write sweep.json, sweep.csv,
    sweep.png and comparison.csv. ``runs``: the plan, if already made; ``console``: a rich Console for the progress
    bar and the runs' log lines; ``run_fn``: lifecycle.run's signature (the default); ``pool``: runs them elsewhere
    instead, several at once (cluster/sweep.py ClusterPool: ``run_all(todo, outdir, source, log, record,
    check)``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .runs import lifecycle
    run_fn = run_fn or lifecycle.run
    console = console or Console(stderr=True)
    runs = runs if runs is not None else plan(path, sets, varies, seeds)
    keys = [k for k, _ in parse_varies(varies)]
    doc = _plan_doc(path, sets, varies, seeds, runs)
    outdir = Path(outdir)
    plan_file = outdir / SWEEP_JSON
    if resume:
        if not plan_file.is_file():
            raise SweepError(f"{outdir}: no {SWEEP_JSON} here, so no sweep to resume (drop --resume to start one)")
        try:
            old = json.loads(plan_file.read_text())
        except (OSError, ValueError) as e:
            raise SweepError(f"{plan_file}: not readable ({e})") from None
        if old.get("runs") != doc["runs"]:
            raise SweepError(f"{outdir}: the sweep there has other runs ({len(old.get('runs') or [])} planned); "
                             f"resume with the same --vary, --seeds and --set, or choose another --out")
    elif outdir.exists() and any(outdir.iterdir()):
        hint = " (--resume continues the sweep there)" if plan_file.is_file() else ""
        raise SweepError(f"{outdir}: already holds results{hint}; choose another --out")

    def log(msg: str) -> None:
        console.print(msg, markup=False, highlight=False, soft_wrap=True)

    rows: dict[int, dict] = {}
    todo = []
    for r in runs:
        d = outdir / r.name
        st = run_state(d, r) if resume else "absent"
        if st == "complete":
            rows[r.index] = run_row(r, d, OK)
        else:
            todo.append(r)
    if resume:
        log(f"resume: {len(rows)} of {len(runs)} runs complete in {outdir}, {len(todo)} to run")
    outdir.mkdir(parents=True, exist_ok=True)
    write_json(plan_file, doc)

    def finish() -> tuple[pd.DataFrame, pd.DataFrame]:
        return write_tables(outdir, [rows[i] for i in sorted(rows)], keys, include_flagged)

    durations: list[float] = []
    columns = [TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"), TimeElapsedColumn(),
               TextColumn("ETA {task.fields[eta]}"), TextColumn("{task.fields[current]}", markup=False)]
    try:
        with _Interrupts() as interrupts, Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("sweep", total=len(runs), completed=len(rows),
                                     eta="?" if todo else "0:00:00", current="")

            def record(r: PlannedRun, status: str, error: str | None = None, extra: dict | None = None) -> None:
                d = outdir / r.name
                rows[r.index] = dict(run_row(r, d, status, error), **(extra or {}))
                durations.append(time.monotonic() - started.pop(r.index, time.monotonic()))
                progress.update(task, advance=1, eta=_eta(durations, len(runs) - len(rows)))

            started: dict[int, float] = {}
            for r in todo:
                d = outdir / r.name
                if d.exists():                          # an interrupted or failed attempt: start it afresh
                    log(f"resume: re-running {r.name} (its last attempt {run_state(d, r)}); removing it first")
                    shutil.rmtree(d)
            if pool is not None:
                def begin(r: PlannedRun, where: str) -> None:
                    started.setdefault(r.index, time.monotonic())
                    log(f"[{r.index + 1}/{len(runs)}] {r.label} on {where}")
                    progress.update(task, current=r.label)
                pool.run_all(todo, outdir, path, log, begin, record, interrupts.check)
            for r in todo if pool is None else ():
                d = outdir / r.name
                log(f"[{r.index + 1}/{len(runs)}] {r.label}")
                progress.update(task, current=r.label)
                started[r.index] = time.monotonic()
                try:
                    run_fn(r.scen, d, source=path, log=log)
                    record(r, OK)
                except Exception as e:                  # noqa: BLE001 — recorded in sweep.csv; the sweep goes on
                    # an error on the way out of an interrupted run (its teardown raced the interrupt) is the
                    # interrupt: the run is not a failure, and --resume runs it again
                    interrupts.check()
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    log(f"error: run {r.name} failed: {msg}")
                    if os.environ.get("FTB_DEBUG") == "1":
                        log(traceback.format_exc())
                    record(r, FAILED, msg)
                interrupts.check()
            progress.update(task, current="")
    except BaseException as e:                         # Ctrl-C / SIGTERM: the current run is already torn down
        why = "stopped" if isinstance(e, Exception) else "interrupted"
        try:
            finish()
        finally:                                        # said even when a second Ctrl-C lands in finish()
            log(f"{why}: {len(rows)} of {len(runs)} runs finished; {outdir / 'sweep.csv'} and "
                f"{outdir / COMPARISON_CSV} hold them; `--resume` with the same arguments runs the rest")
        raise
    df, comp = finish()
    n_failed = int((df["status"] == FAILED).sum()) if len(df) else 0
    return Outcome(outdir, df, comp, skipped=len(runs) - len(todo), ran=len(todo), failed=n_failed,
                   total=len(runs))


def scale_hint(scen: Scenario) -> str:
    """How to make a CPU-bound sweep trustworthy: the link rates halved, as --set options."""
    def mbit(bps: int) -> str:
        return f"{bps / 2 / 1e6:g}mbit"
    t = scen.topology
    return (f"--set topology.host_link.rate={mbit(t.host_link.rate)} "
            f"--set topology.fabric_link.rate={mbit(t.fabric_link.rate)}")


#: the comparison columns the terminal shows (those present), as mean ± ci95.
SHOWN = ("goodput_mbps", "mean_uplink_util", "uplink_imbalance", "fct_p99_ms", "jct_mean_ms")


def render(res: Outcome) -> str:
    """The comparison as a terminal table: the varied values, the run counts, headline means ± 95 % CI."""
    comp = res.comparison
    if comp.empty:
        return "no run finished"
    keys = list(comp.columns[:comp.columns.get_loc("runs")])
    out = comp[keys + ["runs", "flagged_runs", "failed_runs", "runs_total"]].copy()

    def cell(m, ci):
        if pd.isna(m):
            return ""
        return f"{m:.3g}" if pd.isna(ci) else f"{m:.3g} ± {ci:.2g}"
    for c in SHOWN:
        if f"{c}_mean" in comp.columns:
            out[c] = [cell(m, ci) for m, ci in zip(comp[f"{c}_mean"], comp[f"{c}_ci95"])]
    return out.to_string(index=False)
