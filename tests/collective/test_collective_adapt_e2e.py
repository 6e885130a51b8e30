"""Collectives that read the network, end to end (codesign-degraded.yaml): a ring all-reduce over 4 hosts, 2 QPs
per connection, on a fabric whose leaf0–spine1 link runs at 2.5 of 10 Mbit/s; with seed 3 two of the ring's
connections (h0→h2, h1→h3) each hash one QP up that link. The hosts ask the collective helper at each
iteration's start; it reads the running switches' counters and its policy decides:

- ``weighted-split`` sends those connections' flows on their other QP;
- ``ring-order`` runs another of the 3 ring orders laid out (one whose ring edges avoid the link);
- with ``controller.entropy: plan`` the fabric controller gives the ring's 8 QPs ports whose paths avoid the
  link (its rate is in the plan's costs): the static ring needs no decision.

Each is compared with the ``static`` policy — the same schedule, QPs, ports and helper round trip, no decision:
every iteration finishes sooner, the hosts' senders really took the decided ports or ring (flows.csv,
collectives.csv ``adapt_decisions`` and ``adapt_ring``), and what the decisions read is in
collective_signals.csv. On the same fabric without the slow link both are no worse than static. Seen here over
7 runs: the static ring 3.98 s for 3 iterations (two QPs share the slow link up: 1.25 Mbit/s each; healthy
1.00 s), weighted-split 0.25×, ring-order 0.25–0.26× (the issue's goal: ≤ 0.8×); healthy weighted-split 1.00×,
ring-order 0.99–1.01× over 10 runs beside the CPU hog (it lays out 3 rings and runs the job's own; goal ≤ 1.05×)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from testbed import scenario

from conftest import guarded_run, run_had

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEGRADED = ROOT / "scenarios" / "codesign-degraded.yaml"
INT_SLOW, INT_HEALTHY = 0.09, 0.03   # seen over 6 runs: the slow link 0.104–0.107, the others ≤ 0.012


def _run(tmp_path, name, policy, *sets):
    d, row = guarded_run(scenario.load(DEGRADED, [f"traffic.collective.adapt.policy={policy}", *sets]),
                         tmp_path / name)
    ops = pd.read_csv(d / "collectives.csv")
    assert len(ops) == 3 and ops["jct_ms"].notna().all(), ops
    return d, ops["jct_ms"].sum() * run_had(row), ops


def test_policies_leave_the_slow_link_and_shorten_every_iteration(tmp_path):
    _, static, sops = _run(tmp_path, "static", "static")
    assert (sops["adapt_decisions"] == 0).all() and (sops["adapt_ring"] == 0).all()
    d, ws, ops = _run(tmp_path, "weighted-split", "weighted-split")
    dr, ro, rops = _run(tmp_path, "ring-order", "ring-order")
    print(f"\n[codesign-degraded] ring JCT over 3 iterations: static {static:.0f} ms, weighted-split "
          f"{ws / static:.2f}×, ring-order {ro / static:.2f}×")
    assert ws <= 0.35 * static and ro <= 0.35 * static

    assert (ops["adapt_decisions"] == 12).all()               # 2 connections × 6 steps, 1 flow each
    fl = pd.read_csv(d / "flows.csv")
    assert (fl["entropy_from"] == "collective").all() and (fl["entropy_changes"] == 0).all()
    moved = fl[(fl["src"].isin(["h0", "h1"])) & (fl["dst"].isin(["h2", "h3"]))]
    assert moved.groupby(["src", "dst"])["entropy"].nunique().eq(1).all()   # one QP's path carries them all
    sig = pd.read_csv(d / "collective_signals.csv")
    slow = sig[(sig["switch"] == "leaf0") & (sig["peer"] == "spine1")]
    assert set(sig["iteration"]) == {0, 1, 2} and len(slow) == 3 and (slow["capacity_bps"] == 2.5e6).all()
    ca = json.loads((d / "manifest.json").read_text())["collective_adapt"]
    assert ca["decisions"] == 3 and ca["requests"] == 3 * 4 and ca["static_flows"] == 0

    # the fabric controller plans the ring's 8 QPs off the slow link: the static ring needs no decision
    dc, ctl, cops = _run(tmp_path, "static-controller", "static", "controller.entropy=plan")
    print(f"[codesign-degraded] static ring with controller.entropy plan: {ctl / static:.2f}× static")
    assert ctl <= 0.35 * static and (cops["adapt_decisions"] == 0).all()
    cfl = pd.read_csv(dc / "flows.csv")
    planned = pd.read_csv(dc / "controller.csv").set_index("flow")["new"]      # what the controller answered
    assert cfl["complete"].all() and (cfl["entropy"] == cfl["flow_id"].map(planned)).all()
    assert cfl.groupby(["src", "dst"])["entropy"].nunique().le(2).all()     # 2 QPs per connection, one port each
    cm = json.loads((dc / "manifest.json").read_text())["controller"]
    assert cm["planned_flows"] == 8 and cm["fallbacks"] == 0 and cm["unknown_flows"] == 0

    assert (rops["adapt_ring"] == 1).all() and (rops["adapt_decisions"] == 6 * 4 * 2).all()
    rfl = pd.read_csv(dr / "flows.csv")
    man = json.loads((dr / "manifest.json").read_text())["collective_adapt"]
    ring = man["ring_orders"]["ring"][1]                       # only order 1's flows ran: 4 edges × 2 QPs
    edges = {(ring[i], ring[(i + 1) % 4]) for i in range(4)}
    assert set(zip(rfl["src"], rfl["dst"])) == edges and len(rfl) == 3 * 6 * 4 * 2 and rfl["complete"].all()


def test_policies_are_no_worse_than_static_on_a_healthy_fabric(tmp_path):
    _, static, _ = _run(tmp_path, "static", "static", "topology.links=[]")
    _, ws, _ = _run(tmp_path, "weighted-split", "weighted-split", "topology.links=[]")
    _, ro, rops = _run(tmp_path, "ring-order", "ring-order", "topology.links=[]")
    print(f"\n[codesign-degraded, healthy] ring JCT: static {static:.0f} ms, weighted-split {ws / static:.2f}×, "
          f"ring-order {ro / static:.2f}×")
    assert ws <= 1.05 * static and ro <= 1.05 * static and (rops["adapt_ring"] == 0).all()


def test_the_int_signal_reads_the_queue_the_packets_met_on_the_slow_link(tmp_path):
    """Signal ``int`` with telemetry.int: the static ring keeps two QPs on the slow link (leaf0→spine1), whose
    queue fills; the INT hop records of the packets crossing it reach the helper, and from iteration 1 on
    collective_signals.csv reads that port's ``int`` well above every healthy link's. The manifest counts the
    reports the helper read."""
    d, _, _ = _run(tmp_path, "int", "static", "traffic.collective.adapt.signals=[int]", "telemetry.int.enabled=true")
    sig = pd.read_csv(d / "collective_signals.csv")
    later = sig[sig["iteration"] > 0]
    slow = later[(later["switch"] == "leaf0") & (later["peer"] == "spine1")]
    rest = later[~((later["switch"] == "leaf0") & (later["peer"] == "spine1"))]
    print(f"\n[int signal] slow link int {slow['int'].round(3).tolist()}, others max {rest['int'].max():.3f}")
    assert len(slow) == 2 and (slow["int"] > INT_SLOW).all() and rest["int"].max() < INT_HEALTHY
    ca = json.loads((d / "manifest.json").read_text())["collective_adapt"]
    assert ca["int_reports"] > 0 and ca["signals"] == ["int"]


A2A = "traffic.jobs=[{name: a2a, pattern: all-to-all, bytes: 64KB, iterations: 3}]"


def test_all_to_all_policies_leave_the_slow_link_and_shorten_the_job(tmp_path):
    """The all-to-all of codesign-degraded.yaml (every ordered pair, 64 KB, 2 QPs each, 3 iterations): static
    keeps the QPs that hash up the slow link; weighted-split moves their chunks to the other QP; paced does the
    same and sends the chunks still crossing a hot link across it one after another (held back, counted in the
    manifest). The issue's goal: ≤ 0.85× static. Seen here: static 1.39 s, weighted-split 0.60×, paced 0.62×."""
    _, static, _ = _run(tmp_path, "static", "static", A2A)
    _, ws, wops = _run(tmp_path, "weighted-split", "weighted-split", A2A)
    dp, paced, pops = _run(tmp_path, "paced", "paced", A2A)
    print(f"\n[codesign-degraded all-to-all] JCT over 3 iterations: static {static:.0f} ms, weighted-split "
          f"{ws / static:.2f}×, paced {paced / static:.2f}×")
    assert ws <= 0.85 * static and paced <= 0.85 * static
    assert (wops["adapt_decisions"] > 0).all() and (pops["adapt_decisions"] > 0).all()
    ca = json.loads((dp / "manifest.json").read_text())["collective_adapt"]
    assert ca["policy"] == "paced" and ca["paced_flows"] > 0 and ca["static_flows"] == 0
