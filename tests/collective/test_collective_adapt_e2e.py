"""Collectives that read the network, end to end (codesign-degraded.yaml): a ring all-reduce over 4 hosts whose
2 QPs per connection hash onto a slow spine link (leaf0–spine1 at 2.5 of 10 Mbit/s) in 2 of its 4
connections. The collective helper reads the running switches' counters at each iteration's start and the
weighted-split policy sends those connections' flows on their other QP: every iteration finishes much sooner
than the static collective's, the hosts' senders really took the decided ports (flows.csv), the decisions are
counted per iteration (collectives.csv adapt_decisions) and what they read is in collective_signals.csv — the
slow link with its capacity. On the same fabric without the slow link the policy is no worse than static."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from testbed import scenario

from conftest import guarded_run, run_had

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEGRADED = ROOT / "scenarios" / "codesign-degraded.yaml"


def _run(tmp_path, name, *sets):
    d, row = guarded_run(scenario.load(DEGRADED, list(sets)), tmp_path / name)
    ops = pd.read_csv(d / "collectives.csv")
    assert len(ops) == 3 and ops["jct_ms"].notna().all(), ops
    return d, row, ops


def test_weighted_split_leaves_the_slow_link_and_shortens_every_iteration(tmp_path):
    d, row, adapted = _run(tmp_path, "adapt")
    _, srow, static = _run(tmp_path, "static", "traffic.collective.adapt=null")
    ratio = (adapted["jct_ms"].sum() * run_had(row)) / (static["jct_ms"].sum() * run_had(srow))
    print(f"\n[codesign-degraded] ring JCT ms adaptive {adapted['jct_ms'].round().tolist()}, static "
          f"{static['jct_ms'].round().tolist()}: ratio {ratio:.2f}")
    assert ratio <= 0.8
    assert (adapted["adapt_decisions"] >= 12).all() and "adapt_decisions" not in static
    fl = pd.read_csv(d / "flows.csv")
    assert (fl["entropy_from"] == "collective").all() and (fl["entropy_changes"] == 0).all()
    assert (fl["entropy"] != fl["sport"]).sum() == 0          # sent from the decided port, no move mid-flow
    sig = pd.read_csv(d / "collective_signals.csv")
    slow = sig[(sig["switch"] == "leaf0") & (sig["peer"] == "spine1")]
    assert set(sig["iteration"]) == {0, 1, 2} and (slow["capacity_bps"] == 2.5e6).all() and len(slow) == 3
    man = pd.read_json(d / "manifest.json", typ="series")
    ca = man["collective_adapt"]
    assert ca["decisions"] == 3 and ca["requests"] == 3 * 4 and ca["static_flows"] == 0


def test_weighted_split_is_no_worse_than_static_on_a_healthy_fabric(tmp_path):
    _, row, adapted = _run(tmp_path, "adapt", "topology.links=[]")
    _, srow, static = _run(tmp_path, "static", "topology.links=[]", "traffic.collective.adapt=null")
    ratio = (adapted["jct_ms"].sum() * run_had(row)) / (static["jct_ms"].sum() * run_had(srow))
    print(f"\n[codesign-degraded, healthy] ring JCT ratio adaptive/static {ratio:.2f}")
    assert ratio <= 1.05
