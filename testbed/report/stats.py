"""Sweep statistics: the mean of repeated runs and its 95 % confidence interval, and comparison.csv.

Pure functions of numbers and frames (no kernel, no files), so every value can be checked by hand. The Student t
quantile is computed here from the closed-form t distribution of integer degrees of freedom (the only ones a
sample of n runs has), which keeps SciPy out of the dependencies for one number.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

#: sweep.csv columns that are not per-run measurements (never averaged).
NOT_MEASURED = ("seed", "run_dir", "status", "cpu_bound", "cpu_worst_core")


def t_abs_cdf(x: float, dof: int) -> float:
    """P(|T| < x) for Student's t with integer ``dof`` ≥ 1 (the classic finite series in θ = atan(x/√dof))."""
    if dof < 1 or int(dof) != dof:
        raise ValueError(f"degrees of freedom must be a positive integer, got {dof!r}")
    if x <= 0:
        return 0.0
    theta = math.atan(x / math.sqrt(dof))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if dof % 2:                                     # odd: (2/π)(θ + sinθ cosθ (1 + 2/3 c² + 2·4/(3·5) c⁴ …))
        total, term = 1.0, 1.0
        for j in range(1, (dof - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        series = s * math.cos(theta) * total if dof > 1 else 0.0
        return min(1.0, 2.0 / math.pi * (theta + series))
    total, term = 1.0, 1.0                          # even: sinθ (1 + 1/2 c² + 1·3/(2·4) c⁴ …)
    for j in range(1, dof // 2):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return min(1.0, s * total)


def t_quantile(p: float, dof: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with integer ``dof``, by bisection of :func:`t_abs_cdf`."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p!r}")
    target = 2.0 * p - 1.0
    lo, hi = 0.0, 1.0
    while t_abs_cdf(hi, dof) < target:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_abs_cdf(mid, dof) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def mean_ci95(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95 % confidence interval of the mean, n) of the finite values.

    Half-width = t(0.975, n−1) · s / √n with s the sample standard deviation (n−1 in the denominator); NaN when
    n < 2 (one run says nothing about the spread). Mean NaN when n = 0."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan, n
    s = float(x.std(ddof=1))
    return mean, t_quantile(0.975, n - 1) * s / math.sqrt(n), n


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index (Σx)² ÷ (n·Σx²) of the values: 1 when all are equal, 1/n when one has everything;
    NaN without values or when all are 0."""
    x = np.asarray(list(values), dtype=float)
    q = float((x ** 2).sum())
    return float(x.sum()) ** 2 / (len(x) * q) if len(x) and q > 0 else math.nan


def _flagged(v) -> bool:
    return v is True or v is np.True_ or (isinstance(v, str) and v == "True")


def measured_columns(df: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    """The columns comparison.csv averages: every column whose non-empty cells are all numbers (booleans and
    the NOT_MEASURED / varied columns excepted), in sweep.csv's order; a column empty in every run is left out."""
    out = []
    for c in df.columns:
        if c in keys or c in NOT_MEASURED:
            continue
        col = df[c]
        if pd.api.types.is_bool_dtype(col):
            continue
        present = col.dropna()
        if present.empty or present.map(lambda v: isinstance(v, (bool, np.bool_))).any():
            continue
        num = pd.to_numeric(present, errors="coerce")
        if num.isna().any():
            continue
        out.append(c)
    return out


def comparison(df: pd.DataFrame, keys: Sequence[str], include_flagged: bool = False) -> pd.DataFrame:
    """comparison.csv: one row per configuration (the values of ``keys``, in first-seen order).

    Columns: the keys; ``runs`` (runs in the means), ``flagged_runs`` (completed runs with cpu_bound true),
    ``failed_runs`` (status failed), ``runs_total``; then ``<col>_mean`` and ``<col>_ci95`` for every measured
    column (see :func:`measured_columns`). A run is in the means when its status is ok and, unless
    ``include_flagged``, it is not flagged; each column's mean and CI use those runs' non-empty values."""
    keys = list(keys)
    cols = measured_columns(df, keys)
    status = df["status"] if "status" in df.columns else pd.Series(["ok"] * len(df), index=df.index)
    flagged = (df["cpu_bound"].map(_flagged) if "cpu_bound" in df.columns
               else pd.Series([False] * len(df), index=df.index))
    ok = status == "ok"
    use = ok if include_flagged else ok & ~flagged
    groups = df.groupby(keys, sort=False, dropna=False) if keys else [((), df)]
    rows = []
    for key, sel in groups:
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(keys, key))
        idx = sel.index
        in_mean = sel[use.loc[idx]]
        row.update(runs=len(in_mean), flagged_runs=int((ok.loc[idx] & flagged.loc[idx]).sum()),
                   failed_runs=int((~ok.loc[idx]).sum()), runs_total=len(sel))
        for c in cols:
            m, ci, _ = mean_ci95(pd.to_numeric(in_mean[c], errors="coerce").tolist())
            row[f"{c}_mean"], row[f"{c}_ci95"] = m, ci
        rows.append(row)
    head = keys + ["runs", "flagged_runs", "failed_runs", "runs_total"]
    return pd.DataFrame(rows, columns=head + [f"{c}_{s}" for c in cols for s in ("mean", "ci95")])
