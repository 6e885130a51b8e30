"""Sweep statistics and bookkeeping without a kernel: the t quantile against printed tables, mean and 95 % CI
by hand, comparison.csv's columns and exclusions, the plan (seeds, directory names, refusals), and the
resume/failure logic of `execute` driven by a run function that writes real result directories."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from testbed import report as rp
from testbed import scenario as scenario_mod
from testbed import sweep
from testbed.report import stats

from conftest import ROOT
from test_report import CPU, EVEN, UNEVEN, make_flows, make_links

SCEN = str(ROOT / "scenarios" / "default.yaml")


# --- Student t and the confidence interval ---------------------------------------------------------------

@pytest.mark.parametrize("dof, t", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (5, 2.5706),
                                    (9, 2.2622), (10, 2.2281), (29, 2.0452), (120, 1.9799)])
def test_t_quantile_matches_the_printed_table(dof, t):
    assert stats.t_quantile(0.975, dof) == pytest.approx(t, abs=5e-5)


def test_t_quantile_other_levels_and_refusals():
    assert stats.t_quantile(0.95, 4) == pytest.approx(2.1318, abs=5e-5)
    assert stats.t_quantile(0.995, 2) == pytest.approx(9.9248, abs=5e-5)
    assert stats.t_abs_cdf(0.0, 3) == 0.0
    with pytest.raises(ValueError):
        stats.t_quantile(0.4, 3)
    with pytest.raises(ValueError):
        stats.t_abs_cdf(1.0, 0)


def test_mean_ci95_by_hand():
    # 1, 2, 3: mean 2, s = 1, half-width t(0.975, 2) · 1/√3 = 4.302653 / 1.732051 = 2.4841
    m, ci, n = stats.mean_ci95([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3) and ci == pytest.approx(2.48414, abs=1e-5)
    # NaN is skipped (n counts values), one value has no interval, none has no mean
    m, ci, n = stats.mean_ci95([5.0, float("nan"), None])
    assert (m, n) == (5.0, 1) and math.isnan(ci)
    m, ci, n = stats.mean_ci95([])
    assert math.isnan(m) and math.isnan(ci) and n == 0
    assert stats.mean_ci95([4.0, 4.0])[:2] == (4.0, 0.0)


# --- comparison.csv -------------------------------------------------------------------------------------

def _sweep_frame():
    return pd.DataFrame([
        # lb ecmp: goodput 1, 2, 3 ok; 100 flagged; 50 failed
        dict(run_id="a", load_balancing="ecmp", seed=1, goodput_mbps=1.0, fct_p99_ms=10.0, cpu_bound=False,
             status="ok", run_dir="d0", failed=np.nan, **{"switch.load_balancing": "ecmp"}),
        dict(run_id="b", load_balancing="ecmp", seed=2, goodput_mbps=2.0, fct_p99_ms=np.nan, cpu_bound=False,
             status="ok", run_dir="d1", failed=np.nan, **{"switch.load_balancing": "ecmp"}),
        dict(run_id="c", load_balancing="ecmp", seed=3, goodput_mbps=3.0, fct_p99_ms=30.0, cpu_bound=False,
             status="ok", run_dir="d2", failed=np.nan, **{"switch.load_balancing": "ecmp"}),
        dict(run_id="d", load_balancing="ecmp", seed=4, goodput_mbps=100.0, fct_p99_ms=1.0, cpu_bound=True,
             status="ok", run_dir="d3", failed=np.nan, **{"switch.load_balancing": "ecmp"}),
        dict(run_id="e", load_balancing="ecmp", seed=5, goodput_mbps=50.0, fct_p99_ms=1.0, cpu_bound=False,
             status="failed", run_dir="d4", failed="agent died", **{"switch.load_balancing": "ecmp"}),
        # lb spray: one run
        dict(run_id="f", load_balancing="spray", seed=1, goodput_mbps=7.0, fct_p99_ms=5.0, cpu_bound=False,
             status="ok", run_dir="d5", failed=np.nan, **{"switch.load_balancing": "spray"}),
    ])


def test_comparison_columns_and_values():
    comp = stats.comparison(_sweep_frame(), ["switch.load_balancing"])
    assert list(comp.columns) == ["switch.load_balancing", "runs", "flagged_runs", "failed_runs", "runs_total",
                                  "goodput_mbps_mean", "goodput_mbps_ci95", "fct_p99_ms_mean", "fct_p99_ms_ci95"]
    ecmp, spray = comp.iloc[0], comp.iloc[1]
    assert ecmp["switch.load_balancing"] == "ecmp" and spray["switch.load_balancing"] == "spray"
    assert (ecmp["runs"], ecmp["flagged_runs"], ecmp["failed_runs"], ecmp["runs_total"]) == (3, 1, 1, 5)
    assert ecmp["goodput_mbps_mean"] == 2.0 and ecmp["goodput_mbps_ci95"] == pytest.approx(2.48414, abs=1e-5)
    # fct_p99_ms: 10 and 30 (the middle run has none): mean 20, s = 14.142, t(0.975, 1) · s/√2 = 127.062
    assert ecmp["fct_p99_ms_mean"] == 20.0 and ecmp["fct_p99_ms_ci95"] == pytest.approx(127.062, abs=1e-3)
    assert (spray["runs"], spray["goodput_mbps_mean"]) == (1, 7.0) and math.isnan(spray["goodput_mbps_ci95"])


def test_comparison_include_flagged_keeps_cpu_bound_runs_never_failed_ones():
    comp = stats.comparison(_sweep_frame(), ["switch.load_balancing"], include_flagged=True)
    ecmp = comp.iloc[0]
    assert (ecmp["runs"], ecmp["flagged_runs"], ecmp["failed_runs"]) == (4, 1, 1)
    assert ecmp["goodput_mbps_mean"] == pytest.approx((1 + 2 + 3 + 100) / 4)


def test_comparison_without_keys_is_one_row_and_string_flags_count():
    df = _sweep_frame().drop(columns="switch.load_balancing")
    df["cpu_bound"] = df["cpu_bound"].map(str)                       # as read back from a CSV of mixed rows
    comp = stats.comparison(df, [])
    assert len(comp) == 1 and comp.iloc[0]["runs_total"] == 6 and comp.iloc[0]["flagged_runs"] == 1
    assert comp.iloc[0]["goodput_mbps_mean"] == pytest.approx((1 + 2 + 3 + 7) / 4)


def test_measured_columns_leave_out_labels_flags_and_empty_columns():
    df = _sweep_frame()
    df["cpu_worst_core"] = 1
    df["empty"] = np.nan
    df["note"] = ["x", "1", "2", "3", "4", "5"]
    assert stats.measured_columns(df, ["switch.load_balancing"]) == ["goodput_mbps", "fct_p99_ms"]


# --- the plan -------------------------------------------------------------------------------------------

def test_plan_names_seeds_and_keeps_the_old_names_without_seeds():
    runs = sweep.plan(SCEN, ("seed=10",), ["switch.load_balancing=ecmp,spray", "topology.spines=2,4"], 2)
    assert len(runs) == 8
    assert [r.name for r in runs[:3]] == ["00-load_balancing-ecmp_spines-2_seed-10",
                                         "01-load_balancing-ecmp_spines-2_seed-11",
                                         "02-load_balancing-ecmp_spines-4_seed-10"]
    assert [r.seed for r in runs] == [10, 11] * 4 and [r.scen.seed for r in runs] == [10, 11] * 4
    assert runs[-1].scen.switch.load_balancing == "spray" and runs[-1].scen.topology.spines == 4
    assert runs[-1].values == (("switch.load_balancing", "spray"), ("topology.spines", "4"))
    old = sweep.plan(SCEN, (), ["profile=infiniband,rocev2"], None)
    assert [r.name for r in old] == ["00-profile-infiniband", "01-profile-rocev2"] and old[0].seed == 1
    only_seeds = sweep.plan(SCEN, (), [], 3)
    assert [r.name for r in only_seeds] == ["00-seed-1", "01-seed-2", "02-seed-3"]


@pytest.mark.parametrize("varies, seeds, msg", [
    ([], None, "nothing to sweep"),
    (["seed=1,2"], 2, "--vary seed and --seeds"),
    (["switch.load_balancing"], None, "expected key.path=v1,v2"),
    (["switch.load_balancing=ecmp,"], None, "expected key.path=v1,v2"),
    (["topology.spines=2", "topology.spines=4"], None, "given twice"),
])
def test_plan_refuses(varies, seeds, msg):
    with pytest.raises(sweep.SweepError, match=msg):
        sweep.plan(SCEN, (), varies, seeds)


def test_plan_validates_every_value_before_running():
    with pytest.raises(scenario_mod.ScenarioError, match="switch.load_balancing"):
        sweep.plan(SCEN, (), ["switch.load_balancing=ecmp,bogus"], 2)


# --- execute: resume, failures (a run function writing real result directories) ------------------------

class FakeRuns:
    """runner.run's signature: writes a result directory with report.write_run (spray: even uplinks, ecmp:
    uneven); configurations in ``fail`` raise RunFailed after writing (as the runner does), those in ``boom``
    raise before writing anything."""

    def __init__(self, fail=(), boom=(), flag=()):
        self.fail, self.boom, self.flag, self.calls = set(fail), set(boom), set(flag), []

    def __call__(self, scen, d, source="", log=print):
        from testbed.runner import RunFailed
        lb = scen.switch.load_balancing
        self.calls.append((lb, scen.seed))
        if lb in self.boom:
            raise RuntimeError("exploded before writing")
        failed = "PFC agent died" if lb in self.fail else None
        meta = dict(run_id=f"{lb}-{scen.seed}", scenario=scen.name, load_balancing=lb, seed=scen.seed,
                    duration_s=2.0, offered_mbps=400.0, failed=failed)
        manifest = {"scenario": scenario_mod.to_dict(scen), "seed": scen.seed, "failed": [failed] if failed else None}
        cpu = dict(CPU, cpu_bound=lb in self.flag)
        row = rp.write_run(d, manifest, make_links(EVEN if lb == "spray" else UNEVEN),
                           make_flows([0.01 * scen.seed]), cpu, meta)
        if failed:
            raise RunFailed(f"{failed} (results collected so far: {d})")
        return d, row


def _execute(out, runs, **kw):
    return sweep.execute(SCEN, (), ["switch.load_balancing=ecmp,spray"], 2, out, run_fn=runs,
                         console=Console(stderr=True, quiet=True), **kw)


def test_execute_writes_the_tables_and_resume_skips_complete_runs(tmp_path):
    out = tmp_path / "sw"
    first = FakeRuns(fail={"spray"})
    res = _execute(out, first)
    assert first.calls == [("ecmp", 1), ("ecmp", 2), ("spray", 1), ("spray", 2)]
    assert (res.total, res.ran, res.skipped, res.failed) == (4, 4, 0, 2)
    df = pd.read_csv(out / "sweep.csv")
    assert list(df.columns[:13]) == rp.SUMMARY_COLUMNS
    assert list(df.columns[-3:]) == ["run_dir", "switch.load_balancing", "status"]
    assert df["status"].tolist() == ["ok", "ok", "failed", "failed"] and df["seed"].tolist() == [1, 2, 1, 2]
    assert df["failed"].tolist()[2] == "PFC agent died"
    assert df["run_dir"].tolist() == [str(out / r.name) for r in sweep.plan(SCEN, (), ["switch.load_balancing=ecmp,spray"], 2)]
    comp = pd.read_csv(out / "comparison.csv")
    assert comp["switch.load_balancing"].tolist() == ["ecmp", "spray"]
    assert comp["runs"].tolist() == [2, 0] and comp["failed_runs"].tolist() == [0, 2]
    assert comp["uplink_imbalance_mean"].iloc[0] == pytest.approx(df["uplink_imbalance"].iloc[:2].mean())
    assert json.loads((out / "sweep.json").read_text())["seeds"] == 2
    # resume: the complete ecmp runs are skipped; the failed spray runs run again (their old directory removed)
    marker = out / "00-load_balancing-ecmp_seed-1" / "keep"
    marker.write_text("untouched")
    second = FakeRuns()
    res = _execute(out, second, resume=True)
    assert second.calls == [("spray", 1), ("spray", 2)] and (res.skipped, res.ran, res.failed) == (2, 2, 0)
    assert marker.read_text() == "untouched"
    assert pd.read_csv(out / "sweep.csv")["status"].tolist() == ["ok"] * 4
    # nothing left to do
    third = FakeRuns()
    assert _execute(out, third, resume=True).ran == 0 and third.calls == []


def test_execute_refuses_a_used_directory_and_a_different_sweep(tmp_path):
    out = tmp_path / "sw"
    _execute(out, FakeRuns())
    with pytest.raises(sweep.SweepError, match="--resume continues"):
        _execute(out, FakeRuns())
    with pytest.raises(sweep.SweepError, match="other runs"):
        sweep.execute(SCEN, (), ["switch.load_balancing=ecmp,flowlet"], 2, out, run_fn=FakeRuns(), resume=True,
                      console=Console(quiet=True))
    with pytest.raises(sweep.SweepError, match="another scenario"):       # same runs, other --set
        sweep.execute(SCEN, ("duration=1s",), ["switch.load_balancing=ecmp,spray"], 2, out, run_fn=FakeRuns(),
                      resume=True, console=Console(quiet=True))
    with pytest.raises(sweep.SweepError, match="no sweep.json"):
        _execute(tmp_path / "empty", FakeRuns(), resume=True)


def test_execute_records_a_run_that_failed_before_writing_and_flags(tmp_path):
    res = _execute(tmp_path / "sw", FakeRuns(boom={"ecmp"}, flag={"spray"}))
    df = res.sweep
    assert df["status"].tolist() == ["failed", "failed", "ok", "ok"]
    assert df["failed"].iloc[0] == "exploded before writing" and df["load_balancing"].iloc[0] == "ecmp"
    assert res.comparison["flagged_runs"].tolist() == [0, 2] and res.comparison["runs"].tolist() == [0, 0]
    incl = stats.comparison(df, ["switch.load_balancing"], include_flagged=True)
    assert incl["runs"].tolist() == [0, 2]


def test_interrupt_keeps_the_finished_runs(tmp_path):
    out = tmp_path / "sw"
    runs = FakeRuns()

    def interrupted(scen, d, source="", log=print):
        if len(runs.calls) == 2:
            raise KeyboardInterrupt
        return runs(scen, d, source, log)
    with pytest.raises(KeyboardInterrupt):
        _execute(out, interrupted)
    df = pd.read_csv(out / "sweep.csv")
    assert df["seed"].tolist() == [1, 2] and (out / "comparison.csv").is_file()
    assert pd.read_csv(out / "comparison.csv")["runs"].tolist() == [2]


@pytest.fixture
def python_sigint():
    """SIGINT as Python sets it up (KeyboardInterrupt): a shell starts background jobs with SIGINT ignored."""
    import signal
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, prev)


@pytest.mark.usefixtures("python_sigint")
def test_an_interrupt_python_dropped_still_stops_the_sweep_after_the_run(tmp_path, capsys):
    """SIGINT handled inside a __del__ (as in a weakref callback while a lab is built): Python prints and drops
    the KeyboardInterrupt; the sweep notices at the run's end, keeps that run and stops."""
    import os
    import signal
    out = tmp_path / "sw"
    runs = FakeRuns()

    class Dropper:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))                        # the handler runs here, inside __del__

    def dropped(scen, d, source="", log=print):
        res = runs(scen, d, source, log)
        if len(runs.calls) == 2:
            Dropper()
        return res
    with pytest.raises(KeyboardInterrupt):
        _execute(out, dropped)
    assert len(runs.calls) == 2
    assert pd.read_csv(out / "sweep.csv")["seed"].tolist() == [1, 2]
    assert "Exception ignored" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("python_sigint")
def test_an_error_out_of_an_interrupted_run_is_the_interrupt_not_a_failure(tmp_path):
    """A teardown that raced the interrupt raises OSError instead of KeyboardInterrupt: the sweep stops and does
    not record the run as failed (a resume runs it again)."""
    import os
    import signal
    out = tmp_path / "sw"
    runs = FakeRuns()

    class Dropper:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))

    def racy(scen, d, source="", log=print):
        if len(runs.calls) == 1:
            runs.calls.append("racy")
            Dropper()
            raise OSError(16, "Device or resource busy")
        return runs(scen, d, source, log)
    with pytest.raises(KeyboardInterrupt):
        _execute(out, racy)
    df = pd.read_csv(out / "sweep.csv")
    assert df["status"].tolist() == ["ok"] and df["seed"].tolist() == [1]
