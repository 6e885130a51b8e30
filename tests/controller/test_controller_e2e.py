"""The fabric controller end to end (controller.entropy plan): real agents ask it over its socket, real switches
hash the ports it gave.

Each test fails if its feature breaks: on the ECMP collision case (8 hosts per leaf, 8 spines) planned entropy
puts every flow on an uplink of its own (uplink imbalance ≤ 1.05 where ECMP's own ports give 2.0) with no
reordering, every flow's port the controller's; a controller that does not answer in time leaves every host its
own port, and the manifest and the run's log say so."""
from __future__ import annotations

import json
import subprocess
import time

import pandas as pd
import pytest
import yaml

from testbed import scenario

from conftest import ROOT, TESTBED, guarded_run

pytestmark = pytest.mark.e2e


def collisions(**extra) -> dict:
    doc = yaml.safe_load((ROOT / "scenarios" / "ecmp-collisions.yaml").read_text())
    doc["topology"].update(spines=8, hosts_per_leaf=8)
    doc.update(extra)
    return doc


def test_planned_entropy_puts_every_elephant_on_an_uplink_of_its_own(tmp_path):
    """16 elephants (8 each way) on 8 uplinks per leaf: ECMP's ports (seed 1) stack two on one uplink
    (imbalance 2.0); the controller's share nothing (planned_shared_links 0), the uplinks carry equal bytes
    (imbalance ≤ 1.05), no packet arrives out of order, and every flow was sent from the port it was given."""
    _, ecmp = guarded_run(scenario.from_dict(collisions()), tmp_path / "ecmp")
    d, row = guarded_run(scenario.from_dict(collisions(controller={"entropy": "plan"})), tmp_path / "plan")
    flows = pd.read_csv(d / "flows.csv")
    decisions = pd.read_csv(d / "controller.csv")
    man = json.loads((d / "manifest.json").read_text())["controller"]
    print(f"\n[controller plan] imbalance ECMP {ecmp['uplink_imbalance']:.2f}, planned {row['uplink_imbalance']:.3f}; "
          f"{man}")
    assert ecmp["uplink_imbalance"] >= 1.5
    assert row["uplink_imbalance"] <= 1.05 and row["planned_shared_links"] == 0 and row["controller_replans"] == 0
    assert man["fallbacks"] == 0 and man["requests"] == 16 and man["planned_flows"] == 16
    assert set(flows["entropy_from"]) == {"controller"} and (flows["entropy"] == flows["sport"]).all()
    assert (flows["reordered"] == 0).all() and (flows["paths_used"] == 1).all() and (flows["entropy_changes"] == 0).all()
    assert sorted(decisions["flow"]) == list(range(16)) and set(decisions["reason"]) == {"start"}
    assert dict(zip(decisions["flow"], decisions["new"])) == dict(zip(flows["flow_id"], flows["sport"]))


def test_hosts_that_get_no_answer_keep_their_own_ports_and_the_run_says_so(tmp_path):
    """The controller's socket file is moved away as soon as it exists (before any host asks): the hosts reach no
    controller, every flow keeps the port its host chose, the run completes, and the manifest and the run's log
    count the 16 fallbacks."""
    from testbed.controller.service import socket_path
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(collisions(controller={"entropy": "plan", "timeout": "20ms"})))
    out = tmp_path / "r"
    before = set(socket_path("x").parent.glob("*-ctl.sock")) if socket_path("x").parent.exists() else set()
    proc = subprocess.Popen(TESTBED + ["run", str(path), "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    moved, end = None, time.monotonic() + 60
    while moved is None and time.monotonic() < end and proc.poll() is None:
        for sock in set(socket_path("x").parent.glob("*-ctl.sock")) - before:
            moved = sock.rename(tmp_path / "ctl.sock")
        time.sleep(0.005)
    assert moved is not None, "the fabric controller's socket never appeared"
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    flows = pd.read_csv(out / "flows.csv")
    man = json.loads((out / "manifest.json").read_text())
    assert set(flows["entropy_from"]) == {"own"} and man["controller"]["fallbacks"] == 16
    assert man["controller"]["requests"] == 0
    assert any(d.startswith("controller: 16 flow(s) got no answer") for d in man["degradations"])
    assert "controller: 16 flow(s) got no answer" in err
