"""One sweep, two architectures: `testbed sweep scenarios/ib-vs-roce.yaml --vary profile=infiniband,rocev2` runs the
same RoCE incast on an InfiniBand-style fabric (SM routing, adaptive routing, credits, ooo receiver) and on a
RoCEv2 fabric (ECMP, PFC, ECN, DCQCN), and each row shows its own mechanisms at work and not the other's."""
from __future__ import annotations

import csv
import json

import pandas as pd
import pytest

from testbed import runner, scenario

from conftest import ROOT, run_cli, run_had
import cpu_guard
from retx_check import assert_few_spurious

pytestmark = pytest.mark.e2e


def test_sweep_compares_infiniband_and_rocev2_on_the_same_traffic(tmp_path):
    out = tmp_path / "sweep"
    res = run_cli("sweep", str(ROOT / "scenarios" / "ib-vs-roce.yaml"), "--vary", "profile=infiniband,rocev2",
                  "--out", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    with open(out / "sweep.csv") as f:
        rows = {r["profile"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"infiniband", "rocev2"}
    ib, ro = rows["infiniband"], rows["rocev2"]
    m = {p: json.loads((out / d / "manifest.json").read_text())
         for p, d in (("infiniband", "00-profile-infiniband"), ("rocev2", "01-profile-rocev2"))}
    cols = ("goodput_mbps", "fct_p99_ms", "drops", "credit_stalls", "credit_stall_s_total", "pause_frames",
            "ecn_marks", "cnps", "retransmits", "cpu_steal_mean")
    num = {p: {k: float(r[k]) if r[k] else float("nan") for k in cols} | {"cpu_bound": r["cpu_bound"]}
           for p, r in rows.items()}
    print("\n[ib-vs-roce] " + "; ".join(
        f"{p}: goodput {n['goodput_mbps']:.1f} Mbit/s, fct p99 {n['fct_p99_ms']:.0f} ms, drops {n['drops']:.0f}, "
        f"credit_stalls {n['credit_stalls']:.0f}, pause_frames {n['pause_frames']:.0f}, ecn_marks "
        f"{n['ecn_marks']:.0f}, cnps {n['cnps']:.0f}, retransmits {n['retransmits']:.0f}, cpu_bound {n['cpu_bound']}"
        for p, n in num.items()))
    # the same traffic (5 flows of 1 MB), lossless under both architectures
    assert ib["flows"] == ro["flows"] == "5"
    assert num["infiniband"]["drops"] == num["rocev2"]["drops"] == 0
    # infiniband: SM routing (minhop), adaptive + ooo, credits granted and stalled; no PFC / ECN / DCQCN.
    # Measured (6 sweeps): all 5 flows at line rate (FCT p99 1.12-1.17 s; 5 MB at 40 Mbit/s is 1.05 s),
    # credit_stalls 1-4, credits granted 12.3-12.5 MB, retransmits 164-221.
    mi = m["infiniband"]
    assert mi["profile"] == "infiniband" and "switch.credit.enabled" in mi["profile_keys"]
    assert mi["routing"]["mode"] == "sm" and mi["routing"]["engine"] == "minhop"
    assert mi["scenario"]["switch"]["load_balancing"] == "adaptive" and mi["scenario"]["traffic"]["receiver"] == "ooo"
    # (a time: of the time the hypervisor left the run, its shapers stop while it steals)
    assert ib["flows_completed"] == "5" and num["infiniband"]["fct_p99_ms"] < 1300 / run_had(num["infiniband"])
    # credits are granted (below) and nothing is dropped (above); whether a sender ever ran dry is marginal on
    # this incast (0–4 stalls per run, 0 in two CI runs), so it is not asserted: test_credit_e2e forces stalls
    with open(out / "00-profile-infiniband" / "links.csv") as f:
        assert sum(float(r["credits_granted"] or 0) for r in csv.DictReader(f)) > 10e6
    assert num["infiniband"]["pause_frames"] == num["infiniband"]["ecn_marks"] == num["infiniband"]["cnps"] == 0
    # rocev2: PFC paused, the switches marked, DCQCN receivers sent CNPs; no credits, distributed ECMP.
    # Measured (8 sweeps): pause_frames 174-202, ecn_marks 708-961, cnps 29-33, 0 retransmits (the profile's
    # rto: auto, 419 ms here, sits above the path's queueing; with the engine's old 10 ms default go-back-N resent
    # 5,200-7,400 packets that were only late, and 2-5 flows finished within the 4 s), FCT p99 3.0-3.9 s: DCQCN
    # cuts the incast's senders and recovers on its scaled timers, against the credits' lossless line rate.
    mr = m["rocev2"]
    assert mr["profile"] == "rocev2" and "switch.pfc.enabled" in mr["profile_keys"]
    assert mr["scenario"]["switch"]["routing"] == "distributed" and mr["scenario"]["traffic"]["cc"] == "dcqcn"
    assert mr["routing"] is None or mr["routing"]["mode"] == "distributed"
    assert num["rocev2"]["pause_frames"] >= 100 and num["rocev2"]["ecn_marks"] >= 500 and num["rocev2"]["cnps"] >= 15
    assert num["rocev2"]["credit_stalls"] == 0
    assert mr["scenario"]["traffic"]["roce"]["rto"] == "auto" and num["rocev2"]["retransmits"] == 0
    assert ro["flows_completed"] == "5"
    assert num["infiniband"]["fct_p99_ms"] < 0.5 * num["rocev2"]["fct_p99_ms"]
    # rocev2, lossless: ≤ 1 % of the packets resent in vain (measured 0 of 5,120), on a run the CPU guard calls
    # valid (a flagged one is run again on its own, tests/cpu_guard.py). infiniband's share is printed here and
    # asserted by tests/transport/test_rto_e2e.py, on its own runs: the guard flags it often (SM, credit meter and
    # the ooo receiver in Python on 2 cores), which must not cost this comparison its verdict.
    ib_flows = pd.read_csv(out / "00-profile-infiniband" / "flows.csv")
    print(f"\n[ib-vs-roce infiniband] spurious retransmits {int(ib_flows['spurious_retransmits'].sum())} of "
          f"{int(ib_flows['packets_sent'].sum())} sent (cpu_bound {ib['cpu_bound']})")
    swept = (pd.read_csv(out / "01-profile-rocev2" / "flows.csv"), {**ro, **num["rocev2"]})

    def attempt(k):
        if k == 0:
            return swept
        dd, row = runner.run(scenario.load(ROOT / "scenarios" / "ib-vs-roce.yaml", ["profile=rocev2"]),
                             tmp_path / f"again-rocev2-{k}")
        return pd.read_csv(dd / "flows.csv"), row
    flows, row = cpu_guard.valid(attempt, "ib-vs-roce rocev2")
    assert float(row["drops"]) == 0
    assert_few_spurious(flows, row, "ib-vs-roce rocev2")
