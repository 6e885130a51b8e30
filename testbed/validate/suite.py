"""Run the reference experiments and judge each: the suite behind ``testbed validate``.

A reference runs its scenario once per seed (and its baseline configuration with the same seeds, when it has
one), each run a whole ``lifecycle.run`` in ``<out>/<name>/seed-<k>`` (``…/baseline-seed-<k>``). A run the CPU
guard flags is run once more; a seed still flagged is left out and makes the verdict ``invalid``. The metric's
mean over the remaining seeds, with its 95 % interval, is compared with the reference's band (spec.py).
validation.csv gets one row per reference, written again after each, so an interrupted suite keeps what it
finished.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import yaml

from ..errors import TestbedError
from ..report import stats
from ..report.files import write_csv
from .metrics import METRICS, MetricError
from .spec import ReferenceSpec, parse

VALIDATION_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "validation"
VALIDATION_CSV = "validation.csv"
COLUMNS = ["name", "source", "metric", "kind", "reference", "measured", "ci95", "seeds", "tolerance", "low",
           "high", "verdict", "notes"]
PASS, FAIL, INVALID = "pass", "fail", "invalid"


class ValidateError(TestbedError):
    """A validation suite that cannot start, phrased for the user (one line)."""


@dataclass(frozen=True)
class Reference:
    name: str                 # the scenario file's stem
    path: Path
    spec: ReferenceSpec


@dataclass
class Outcome:
    """One reference's runs: the metric per seed (None: flagged or no value) and what to say about them."""
    ref: Reference
    values: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    flagged: int = 0
    failed: int = 0


def load(path: Path) -> Reference:
    """A validation scenario's reference (the scenario itself is loaded when it runs)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValidateError(f"{path}: not readable as YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise ValidateError(f"{path}: not a scenario (a mapping)")
    return Reference(path.stem, path, parse(doc.get("reference"), str(path)))


def discover(root: Path = VALIDATION_DIR) -> list[Reference]:
    refs = [load(p) for p in sorted(Path(root).glob("*.yaml"))]
    if not refs:
        raise ValidateError(f"{root}: no reference scenario (*.yaml) here")
    return refs


def select(refs: list[Reference], quick: bool, only: Sequence[str]) -> list[Reference]:
    """``only`` (names) if given, else every reference (``quick``: those marked quick); an unknown name is an
    error naming the known ones."""
    if only:
        known = {r.name: r for r in refs}
        bad = [n for n in only if n not in known]
        if bad:
            raise ValidateError(f"--only: no reference {bad[0]!r}; known: {', '.join(sorted(known))}")
        return [known[n] for n in only]
    chosen = [r for r in refs if r.spec.quick or not quick]
    if not chosen:
        raise ValidateError("no reference to run" + (" marked quick" if quick else ""))
    return chosen


def _run_seed(ref: Reference, sets: Sequence[str], seed: int, d: Path, run_fn, log) -> tuple[float | None, str]:
    """(metric value or None, why None: '' | 'flagged' | a one-line error); a flagged run is run once more."""
    from .. import api
    from .. import scenario as scenario_mod
    scen = scenario_mod.load(ref.path, tuple(sets) + (f"seed={seed}",))
    for attempt in (1, 2):
        if d.exists():
            shutil.rmtree(d)
        try:
            _outdir, row = run_fn(scen, d, source=str(ref.path), log=log)
        except Exception as e:                      # noqa: BLE001 — a failed run is the reference's failure
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return None, f"seed {seed}: run failed: {msg}"
        if not row.get("cpu_bound"):
            break
        if attempt == 1:
            log(f"{ref.name} seed {seed}: flagged by the CPU guard ({row.get('cpu_bound_reason')}); running it again")
    else:
        return None, "flagged"
    try:
        return float(METRICS[ref.spec.metric](api.Result(d, row))), ""
    except MetricError as e:
        return None, f"seed {seed}: {e}"


def run_reference(ref: Reference, seeds: int, outdir: Path, run_fn: Callable, log) -> Outcome:
    out = Outcome(ref)
    spec = ref.spec
    for k in range(seeds):
        seed = 1 + k
        v, why = _run_seed(ref, (), seed, outdir / ref.name / f"seed-{seed}", run_fn, log)
        b, bwhy = (1.0, "")
        if v is not None and spec.baseline:
            b, bwhy = _run_seed(ref, spec.baseline, seed, outdir / ref.name / f"baseline-seed-{seed}", run_fn, log)
            if bwhy:
                bwhy = f"baseline {bwhy}" if bwhy != "flagged" else bwhy
        for w in (why, bwhy):
            if w == "flagged":
                out.flagged += 1
            elif w:
                out.failed += 1
                out.notes.append(w)
        if not why and not bwhy:
            out.values[seed] = v / b if spec.baseline else v
            log(f"{ref.name} seed {seed}: {spec.metric} {out.values[seed]:.4g}")
    return out


def row(o: Outcome) -> dict:
    spec = o.ref.spec
    mean, ci, n = stats.mean_ci95(o.values.values())
    lo, hi = spec.bounds()
    notes = list(o.notes)
    if o.flagged:
        notes.append(f"{o.flagged} run(s) flagged by the CPU guard twice: left out")
    if o.failed:
        verdict = FAIL
    elif o.flagged:                                 # too few valid runs to judge, or some left out
        verdict = INVALID
    elif n == 0:
        verdict = FAIL
    else:
        verdict = spec.verdict(mean)
    if spec.differs:
        notes.append(f"differs: {spec.differs}")
    return {"name": o.ref.name, "source": spec.source, "metric": spec.metric, "kind": spec.kind,
            "reference": spec.value, "measured": mean, "ci95": ci, "seeds": n, "tolerance": spec.tolerance,
            "low": lo if math.isfinite(lo) else None, "high": hi if math.isfinite(hi) else None,
            "verdict": verdict, "notes": "; ".join(notes)}


def run_suite(refs: list[Reference], outdir: Path, seeds: int | None = None, run_fn: Callable | None = None,
              log: Callable[[str], None] = print) -> pd.DataFrame:
    """Run every reference; validation.csv and the report page in ``outdir``; the table."""
    from ..runs import lifecycle
    from .render import write_page
    run_fn = run_fn or lifecycle.run
    outdir = Path(outdir)
    if outdir.exists() and any(outdir.iterdir()):
        raise ValidateError(f"{outdir}: already holds results; choose another --out")
    outdir.mkdir(parents=True, exist_ok=True)
    rows, outcomes = [], []
    try:
        for i, ref in enumerate(refs):
            n = seeds or ref.spec.seeds
            log(f"[{i + 1}/{len(refs)}] {ref.name}: {n} seed(s){' + baseline' if ref.spec.baseline else ''}")
            o = run_reference(ref, n, outdir, run_fn, log)
            outcomes.append(o)
            rows.append(row(o))
            write_csv(outdir / VALIDATION_CSV, pd.DataFrame(rows, columns=COLUMNS))
    finally:
        if outcomes:
            write_page(outdir, outcomes, pd.DataFrame(rows, columns=COLUMNS))
    return pd.DataFrame(rows, columns=COLUMNS)
