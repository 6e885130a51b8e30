"""The figures a reference is compared on, each computed from one run's result files (api.Result).

Every metric is defined exactly in docs/validation.md, with the same words as its docstring here; one that
cannot be computed on a run (a flow did not complete, no uplink carried traffic) raises MetricError, which the
suite writes in the reference's notes. A researcher adds one with ``@metric("name")`` in this module.
"""
from __future__ import annotations

from typing import Callable

import pandas as pd

METRICS: dict[str, Callable] = {}


class MetricError(Exception):
    """The metric has no value on this run; the message says why (one line)."""


def metric(name: str):
    def add(fn):
        METRICS[name] = fn
        return fn
    return add


def _sized(res) -> pd.DataFrame:
    """The run's sized flows, every one of them completed (else MetricError)."""
    fl = res.flows
    if fl is None or fl.empty:
        raise MetricError("the run has no flows.csv rows")
    sized = fl[fl["ideal_fct_s"].notna()]
    if sized.empty:
        raise MetricError("no sized flow (flow_size unset: every flow ran for the duration)")
    left = int(sized["fct_s"].isna().sum())
    if left:
        raise MetricError(f"{left} of {len(sized)} sized flows did not complete")
    return sized


@metric("uplink_load_max")
def uplink_load_max(res) -> float:
    """Balls in bins: for each edge switch whose uplinks sent anything, the bytes its busiest uplink sent ÷ the
    mean over its uplinks (links.csv ``role`` up, ``direction`` tx, summed over the run); the mean of that over
    those switches. With n equal flows hashed onto n uplinks it is the number of flows on the busiest one."""
    ln = res.links
    if ln is None or ln.empty:
        raise MetricError("the run has no links.csv rows")
    up = ln[(ln["role"] == "up") & (ln["direction"] == "tx")]
    per_port = up.groupby(["switch", "port"])["bytes"].sum()
    loads = []
    for _sw, ports in per_port.groupby(level="switch"):
        if ports.sum() > 0:
            loads.append(float(ports.max() / ports.mean()))
    if not loads:
        raise MetricError("no uplink sent a byte")
    return sum(loads) / len(loads)


@metric("slowdown_max")
def slowdown_max(res) -> float:
    """The tail of the flows' completion times as a multiple of the ideal: the largest flows.csv ``slowdown``
    (``fct_s ÷ ideal_fct_s``) over the sized flows, all of which must complete. With equal flows: the tail FCT
    over one flow's FCT on an empty fabric (uet-htsim's ``tailFCT`` ÷ the same ideal)."""
    return float(_sized(res)["slowdown"].max())


@metric("fct_max_s")
def fct_max_s(res) -> float:
    """The tail completion time in seconds: the largest ``fct_s`` over the sized flows, all of which must
    complete (compared as a ratio to a baseline configuration's)."""
    return float(_sized(res)["fct_s"].max())


@metric("incast_over_ideal")
def incast_over_ideal(res) -> float:
    """An incast's completion over its ideal: (the last sized flow's ``end_s`` − the first one's ``start_s``) ÷
    Σ ``ideal_fct_s`` over those flows — the time they would take crossing the receiver's link one after
    another, each on an empty fabric (which counts one base delay per flow instead of one in all: below 1 ‰
    at the rates here)."""
    s = _sized(res)
    return float((s["end_s"].max() - s["start_s"].min()) / s["ideal_fct_s"].sum())


@metric("jain_goodput")
def jain_goodput(res) -> float:
    """Jain's fairness index (Σx)² ÷ (n·Σx²) over the flows' flows.csv ``goodput_mbps``: 1 when every flow got
    the same, 1/n when one got everything."""
    from ..report.stats import jain
    fl = res.flows
    if fl is None or fl.empty:
        raise MetricError("the run has no flows.csv rows")
    return float(jain(fl["goodput_mbps"].fillna(0.0)))
