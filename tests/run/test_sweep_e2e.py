"""`testbed sweep` for real: 2 load-balancing modes × 2 seeds of a short scenario, interrupted with SIGINT after
the first run, then resumed — the finished run is kept (not re-run), the rest run, and the tables hold all four."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from testbed.fabric import netns
from testbed.lab import all_labs
from testbed.report import stats

from conftest import ROOT, TESTBED, run_cli, wait_for

pytestmark = pytest.mark.e2e

ARGS = ["sweep", "scenarios/default.yaml", "--vary", "switch.load_balancing=ecmp,spray", "--seeds", "2",
        "--set", "duration=1.5s", "--set", "topology.spines=2", "--set", "topology.hosts_per_leaf=2"]
NAMES = ["00-load_balancing-ecmp_seed-1", "01-load_balancing-ecmp_seed-2", "02-load_balancing-spray_seed-1",
         "03-load_balancing-spray_seed-2"]


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def test_sweep_with_seeds_survives_ctrl_c_and_resumes(tmp_path):
    out = tmp_path / "sw"
    # SIGINT as a terminal's Ctrl-C would deliver it (the shell may start us with SIGINT ignored)
    proc = subprocess.Popen(TESTBED + ARGS + ["--out", str(out)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert wait_for(lambda: (out / NAMES[0] / "manifest.json").is_file(), timeout=90), "first run never ended"
        labs: list[str] = []                          # the second run's lab: the state file naming our pid
        assert wait_for(lambda: labs.extend(st["name"] for st in all_labs() if st.get("pid") == proc.pid) or labs,
                        timeout=30)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    # the second run stops at once, or — when Python dropped the KeyboardInterrupt (raised inside a weakref
    # callback while the lab was being built: "Exception ignored") — at its end; either way the sweep stops there
    done = 1 if "interrupted: 1 of 4 runs finished" in err else 2
    assert f"interrupted: {done} of 4 runs finished" in err and "Traceback" not in err, err
    assert not netns.list_names(f"{netns.PREFIX}{labs[0]}-"), "the interrupted run left its namespaces"
    part = pd.read_csv(out / "sweep.csv")
    assert part["run_dir"].tolist() == [str(out / n) for n in NAMES[:done]] and part["status"].tolist() == ["ok"] * done
    assert not (out / NAMES[2]).exists()
    comp = pd.read_csv(out / "comparison.csv")
    assert comp["switch.load_balancing"].tolist() == ["ecmp"] and comp["runs_total"].tolist() == [done]
    assert math.isnan(comp["goodput_mbps_ci95"].iloc[0]) == (done == 1)     # one run: no interval
    first_id = _manifest(out / NAMES[0])["run_id"]
    (out / NAMES[0] / "marker").write_text("from the first attempt")

    res = run_cli(*ARGS, "--out", str(out), "--resume", timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"resume: {done} of 4 runs complete" in res.stderr
    assert _manifest(out / NAMES[0])["run_id"] == first_id                 # kept, not run again
    assert (out / NAMES[0] / "marker").read_text() == "from the first attempt"
    df = pd.read_csv(out / "sweep.csv")
    assert df["run_dir"].tolist() == [str(out / n) for n in NAMES]
    assert df["status"].tolist() == ["ok"] * 4 and df["seed"].tolist() == [1, 2, 1, 2]
    assert df["switch.load_balancing"].tolist() == df["load_balancing"].tolist() == ["ecmp", "ecmp", "spray", "spray"]
    for n, seed, lb in zip(NAMES, [1, 2, 1, 2], ["ecmp", "ecmp", "spray", "spray"]):
        m = _manifest(out / n)
        assert m["seed"] == seed and m["scenario"]["switch"]["load_balancing"] == lb and m["failed"] is None
    # the seed reaches the traffic: other random source ports
    sports = [pd.read_csv(out / n / "flows.csv")["sport"].tolist() for n in NAMES[:2]]
    assert sports[0] != sports[1]
    comp = pd.read_csv(out / "comparison.csv")
    assert comp["switch.load_balancing"].tolist() == ["ecmp", "spray"]
    assert comp["runs_total"].tolist() == [2, 2] and comp["failed_runs"].tolist() == [0, 0]
    assert (comp["runs"] + comp["flagged_runs"]).tolist() == [2, 2]
    for i, lb in enumerate(["ecmp", "spray"]):                             # the statistics, by hand
        ok = df[(df["load_balancing"] == lb) & (df["cpu_bound"] != True)]   # noqa: E712
        g = ok["goodput_mbps"]
        assert comp["runs"].iloc[i] == len(g)
        if len(g) == 0:                                                     # both runs flagged: no mean
            assert math.isnan(comp["goodput_mbps_mean"].iloc[i])
            continue
        assert comp["goodput_mbps_mean"].iloc[i] == pytest.approx(g.mean())
        if len(g) == 2:
            assert comp["goodput_mbps_ci95"].iloc[i] == pytest.approx(
                stats.t_quantile(0.975, 1) * g.std(ddof=1) / math.sqrt(2))
    # the two modes differ as they should: spraying spreads the uplinks evenly
    spray = df[df["load_balancing"] == "spray"]["uplink_imbalance"]
    print(f"\n[sweep] stopped after {done} run(s); imbalance {df['uplink_imbalance'].round(3).tolist()}, goodput "
          f"{df['goodput_mbps'].round(1).tolist()}, cpu_bound {df['cpu_bound'].tolist()}")
    assert (spray < 1.1).all(), spray.tolist()
    assert "ecmp" in res.stdout and "spray" in res.stdout and "comparison.csv" in res.stdout
    # a busy machine flags runs now and then: the sweep then says how to scale the rates down (20 → 10 Mbit/s)
    flagged = int((df["cpu_bound"] == True).sum())                       # noqa: E712
    assert (f"warning: {flagged} run(s) were cpu_bound" in res.stderr) == (flagged > 0)
    if flagged:
        assert "--set topology.host_link.rate=10mbit --set topology.fabric_link.rate=10mbit" in res.stderr

    again = run_cli(*ARGS, "--out", str(out), "--resume", timeout=120)
    assert again.returncode == 0 and "resume: 4 of 4 runs complete" in again.stderr, again.stderr
    assert [_manifest(out / n)["run_id"] for n in NAMES] == df["run_id"].tolist()


@pytest.mark.skipif(os.path.exists("/sys/module/rdma_rxe"), reason="rdma_rxe present: rxe runs would not fail")
def test_failed_runs_are_recorded_and_only_a_sweep_of_failures_is_an_error(tmp_path):
    out = tmp_path / "sw"
    res = run_cli("sweep", "scenarios/default.yaml", "--vary", "traffic.engine=rxe,udp", "--seeds", "2",
                  "--out", str(out), "--set", "duration=1s", "--set", "topology.spines=2",
                  "--set", "topology.hosts_per_leaf=2", timeout=300)
    # some runs failed, not all: recorded, the sweep goes on and ends well
    assert res.returncode == 0, res.stderr
    assert "warning: 2 of 4 runs failed" in res.stderr
    df = pd.read_csv(out / "sweep.csv")
    assert df["status"].tolist() == ["failed", "failed", "ok", "ok"]
    assert df["failed"].iloc[0].startswith("traffic.engine rxe") and pd.isna(df["failed"].iloc[2])
    comp = pd.read_csv(out / "comparison.csv")
    assert (comp["runs"] + comp["flagged_runs"]).tolist() == [0, 2] and comp["failed_runs"].tolist() == [2, 0]
    assert pd.isna(comp["goodput_mbps_mean"].iloc[0]) and comp["goodput_mbps_mean"].iloc[1] > 0
    # every run failing is an error (after the tables are written)
    res = run_cli("sweep", "scenarios/default.yaml", "--vary", "traffic.engine=rxe", "--seeds", "2",
                  "--out", str(tmp_path / "all"), timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith("error: every run failed (2)")
    assert pd.read_csv(tmp_path / "all" / "sweep.csv")["status"].tolist() == ["failed", "failed"]
