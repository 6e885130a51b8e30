"""Beyond one machine, for real: a local Ray cluster of 2 namespace machines (started once for the module),
distributed sweeps (and a machine dying mid-sweep: its run retried once on the other), and one fabric split over
both machines (pings across the cut, the default scenario against one machine, spray over cut uplinks, a
lossless PFC incast across the cut, a part's actor killed mid-run). The machine-death test is the last: it
leaves one machine."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.fabric import netns

pytestmark = [pytest.mark.e2e]
ROOT = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]
SMALL = ["--set", "duration=1.5s", "--set", "topology.spines=2", "--set", "topology.hosts_per_leaf=2"]


def cli(*args, timeout=300):
    return subprocess.run([*TESTBED, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray", reason="the cluster extra (scripts/test-setup.sh installs it)")
    from testbed.cluster import local
    if local.read_state() is not None:
        pytest.fail("a local cluster is already up: these tests start and remove their own")
    res = cli("cluster", "up", "--local", "2", timeout=180)
    assert res.returncode == 0, res.stderr
    try:
        yield local.read_state()
    finally:
        res = cli("cluster", "down", timeout=120)
        assert res.returncode == 0, res.stderr
        assert not [n for n in netns.list_names() if netns.is_machine(n)]
        assert local.read_state() is None and not local.machine_pids("m0") and not local.machine_pids("m1")


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_cluster_status_lists_both_machines_and_clean_spares_them(cluster):
    res = cli("cluster", "status")
    assert res.returncode == 0, res.stderr
    for name, addr in (("m0", "198.19.255.1"), ("m1", "198.19.255.2")):
        assert name in res.stdout and addr in res.stdout
    assert res.stdout.count("yes") >= 3                  # m0, m1 and the driver node alive
    res = cli("clean")
    assert res.returncode == 0, res.stderr
    assert netns.exists("ftb-m0") and netns.exists("ftb-m1")


def test_distributed_sweep_runs_on_both_machines_and_writes_the_local_tables(cluster, tmp_path):
    out = tmp_path / "sw"
    res = cli("sweep", "scenarios/default.yaml", "--vary", "switch.load_balancing=ecmp,spray", "--out", str(out),
              "--cluster", "auto", *SMALL)
    assert res.returncode == 0, res.stderr
    rows = _rows(out / "sweep.csv")
    assert [r["load_balancing"] for r in rows] == ["ecmp", "spray"]
    assert all(r["status"] == "ok" for r in rows)
    assert {r["node"] for r in rows} == {"m0", "m1"}              # one run per machine at a time, both used
    for r in rows:                                                 # each run's directory came back here
        d = Path(r["run_dir"])
        assert d.parent == out and (d / "manifest.json").is_file() and (d / "links.csv").is_file()
        assert float(r["goodput_mbps"]) > 0
    comp = _rows(out / "comparison.csv")
    assert [c["switch.load_balancing"] for c in comp] == ["ecmp", "spray"]
    assert (out / "report.html").is_file()


def _lab_owned_by(machine: str) -> str | None:
    """The name of a lab whose owner process belongs to the local cluster's ``machine``."""
    from testbed.cluster import local
    from testbed.lab import all_labs
    pids = set(local.machine_pids(machine))
    return next((st["name"] for st in all_labs() if st.get("pid") in pids), None)


def test_zz_machine_dying_mid_sweep_fails_only_its_run_which_is_retried_elsewhere(cluster, tmp_path):
    """Last in the module: machine m1 dies (every process of it SIGKILLed, as a crashed host) while it runs a
    sweep's run; that run is retried once on m0 and the sweep completes, saying so."""
    from testbed.cluster import local
    out = tmp_path / "sw"
    proc = subprocess.Popen([*TESTBED, "sweep", "scenarios/default.yaml", "--vary", "switch.load_balancing=ecmp,spray",
                             "--out", str(out), "--cluster", "auto", *SMALL, "--set", "duration=3s"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        lab = None
        while lab is None and time.monotonic() < end and proc.poll() is None:
            lab = _lab_owned_by("m1")
            time.sleep(0.1)
        assert lab is not None, "no run started on m1"
        assert local.kill_machine("m1") > 0
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    rows = _rows(out / "sweep.csv")
    assert all(r["status"] == "ok" for r in rows)
    assert all(r["node"] == "m0" for r in rows)
    retried = [r for r in rows if r["retried"]]
    assert len(retried) == 1 and "machine m1" in retried[0]["retried"] and "died" in retried[0]["retried"]
    assert "retrying it once on another machine" in stderr
    # the dead machine's run left its lab behind; the retry's runner reaped it (its owner is gone)
    assert not netns.list_names(f"{netns.PREFIX}{lab}-")
