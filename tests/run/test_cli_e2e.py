"""The `testbed` command as a user meets it: results contract, labs, bad input, interruption and crashes."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time

import pytest

from testbed import report
from testbed.fabric import netns

from conftest import ROOT, TESTBED, leftovers, processes_named, run_cli, wait_for

pytestmark = pytest.mark.e2e

SMALL = ["--set", "duration=1.5s", "--set", "topology.spines=2", "--set", "topology.hosts_per_leaf=2"]


def _one_line_error(res):
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def _write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_run_writes_the_results_contract(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/default.yaml", "--out", str(out), *SMALL,
                      "--set", "capture=[h0]", "--set", "switch.load_balancing=spray")
    assert res.returncode == 0, res.stderr
    assert f"results: {out}" in res.stdout
    for f in ("manifest.json", "links.csv", "flows.csv", "summary.csv"):
        assert (out / f).exists(), f
    with open(out / "links.csv") as f:
        assert next(csv.reader(f))[:7] == report.LINK_COLUMNS
    with open(out / "flows.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:12] == report.FLOW_COLUMNS
    assert len(rows) == 4 and all(int(r["bytes"]) > 0 for r in rows)
    assert all(int(r["paths_used"]) == 2 for r in rows)          # spray: every cross-leaf flow used both uplinks
    with open(out / "summary.csv") as f:
        (summary,) = list(csv.DictReader(f))
    assert list(summary)[:13] == report.SUMMARY_COLUMNS
    assert summary["load_balancing"] == "spray" and float(summary["goodput_mbps"]) > 0
    assert float(summary["uplink_imbalance"]) < 1.1
    m = json.loads((out / "manifest.json").read_text())
    assert m["scenario"]["switch"]["load_balancing"] == "spray" and m["kernel"] == os.uname().release
    assert m["capabilities"]["capabilities"]["clsact"]["ok"] is True
    assert m["start_time"] < m["end_time"]
    # capture: a pcap per interface of h0, holding the flow's UDP packets
    pcap = out / "pcap" / "h0-eth0.pcap"
    assert pcap.exists()
    from scapy.all import UDP, rdpcap
    pkts = rdpcap(str(pcap))
    assert sum(1 for p in pkts if UDP in p and p[UDP].dport == 5001) > 100
    tshark = subprocess.run(["tshark", "-r", str(pcap), "-Y", "udp.dstport == 5001", "-T", "fields",
                             "-e", "ip.dst"], capture_output=True, text=True)
    assert tshark.returncode == 0 and tshark.stdout.count("198.18.") > 100
    lab = json.loads((out / "manifest.json").read_text())["lab"]
    assert netns.list_names(f"{netns.PREFIX}{lab}-") == []


def test_report_regenerates_summary_and_draws_what_a_no_plots_run_left_out(tmp_path, monkeypatch):
    """`run --no-plots` (even where FTB_PLOTS asks for plots) writes no PNG and no report, and its manifest says
    so; `testbed report` then draws both from the CSVs and recomputes summary.csv as it was."""
    monkeypatch.setenv("FTB_PLOTS", "1")
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/default.yaml", "--out", str(out), "--no-plots", *SMALL)
    assert res.returncode == 0, res.stderr
    assert "report: not written (--no-plots" in res.stdout
    assert not list(out.glob("*.png")) and not (out / "report.html").exists()
    m = json.loads((out / "manifest.json").read_text())
    assert m["plots"].startswith("skipped") and not [f for f in m["files"] if f.endswith(".png")]
    before = (out / "summary.csv").read_text()
    (out / "summary.csv").unlink()
    monkeypatch.setenv("FTB_PLOTS", "0")                   # `report` draws whatever the environment says
    res = run_cli("report", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "summary.csv").read_text() == before
    assert {p.name for p in out.glob("*.png")} >= {"uplink_util.png", "fct_cdf.png"} and (out / "report.html").is_file()
    m = json.loads((out / "manifest.json").read_text())
    assert m["plots"] == "drawn" and "fct_cdf.png" in m["files"]
    _one_line_error(run_cli("report", str(tmp_path / "nothing")))


@pytest.mark.parametrize("text,expect", [
    ("topology: {spines: 0}\n", "topology.spines: must be ≥ 1, got 0"),
    ("topology: {spinez: 2}\n", "topology.spinez: unknown key"),
    ("topology: {host_link: {rate: fast}}\n", "topology.host_link.rate: expected a rate"),
    ("switch: {load_balancing: magic}\n", "switch.load_balancing"),
    ("traffic: {pattern: pairs, pairs: [[h0, h99]]}\n", "traffic.pairs: no node 'h99'"),
    ("topology: [1, 2\n", "not valid YAML"),
    ("switch: {pfc: {enabled: true}}\n", "switch.traffic_classes.lossless: PFC is enabled (leaf switches) but no "
                                          "priority is lossless"),
    ("switch: {tiers: {spine: {pfc: {enabled: true}, traffic_classes: {default: 2}}}}\n",
     "switch.tiers.spine.traffic_classes.lossless: PFC is enabled (spine switches)"),
    ("switch: {pfc: {enabled: true}, traffic_classes: {dscp: {26: 3}, lossless: [3]}}\n",
     "traffic.dscp: PFC protects priorities [3] but the traffic (DSCP 0 → priority 0) is lossy, so PFC would never "
     "pause anything; set traffic.dscp: 26"),
    ("switch: {credit: {enabled: true, buffer: 4KB}, traffic_classes: {dscp: {26: 3}, lossless: [3]}}\n"
     "traffic: {dscp: 26}\n",
     "switch.credit.buffer: 4096 bytes of credit buffer (leaf switches"),
])
def test_bad_scenarios_give_one_clear_line(tmp_path, text, expect):
    before = netns.list_names()
    res = run_cli("run", _write(tmp_path, text))
    line = _one_line_error(res)
    assert expect in line, line
    assert netns.list_names() == before


def test_bad_override_and_missing_file(tmp_path):
    line = _one_line_error(run_cli("run", "scenarios/default.yaml", "--set", "topology.leaves=0"))
    assert "topology.leaves: must be ≥ 1, got 0" in line
    line = _one_line_error(run_cli("run", str(tmp_path / "missing.yaml")))
    assert "cannot read scenario" in line


def test_not_root_is_refused_cleanly(tmp_path):
    def drop():
        os.setgid(65534)
        os.setuid(65534)
    res = subprocess.run(TESTBED + ["run", "scenarios/default.yaml"], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), preexec_fn=drop, timeout=60)
    assert "needs root" in _one_line_error(res)


def test_up_status_exec_down_and_name_collision(tmp_path):
    scen = _write(tmp_path, "topology: {spines: 1, leaves: 2, hosts_per_leaf: 1}\n")
    try:
        res = run_cli("up", scen, "--name", "tcli1")
        assert res.returncode == 0, res.stderr
        assert len(netns.list_names("ftb-tcli1-")) == 5
        line = _one_line_error(run_cli("up", scen, "--name", "tcli1"))
        assert "already running" in line
        assert len(netns.list_names("ftb-tcli1-")) == 5           # the running lab is untouched
        st = run_cli("status")
        assert "tcli1" in st.stdout
        ping = run_cli("exec", "--lab", "tcli1", "h0", "--", "ping", "-c1", "-W2", "198.18.1.1")
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert run_cli("exec", "--lab", "tcli1", "h0", "--", "false").returncode == 1
    finally:
        res = run_cli("down", "tcli1")
    assert res.returncode == 0 and netns.list_names("ftb-tcli1-") == []


def _start_run(tmp_path, name):
    """A `testbed run` of 30 s, once its fabric is up and its traffic runs: (process, result dir, its lab name)."""
    from testbed.lab import all_labs
    out = tmp_path / name
    # like a terminal: Ctrl-C must reach the run even when this test itself runs as a background job (where
    # the shell starts commands with SIGINT ignored, and Python keeps an inherited SIG_IGN)
    proc = subprocess.Popen(TESTBED + ["run", "scenarios/default.yaml", "--out", str(out), "--set", "duration=30s"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    labs = []                                         # this run's lab: the state file naming its pid
    assert wait_for(lambda: labs.extend(st["name"] for st in all_labs() if st.get("pid") == proc.pid) or labs,
                    timeout=30)
    lab = labs[0]
    assert wait_for(lambda: netns.exists(f"{netns.PREFIX}{lab}-spine3"), timeout=30)
    assert wait_for(lambda: _agents_of(lab), timeout=30)      # traffic runs
    time.sleep(0.5)
    return proc, out, lab


def _agents_of(lab: str) -> list[int]:
    """Pids of the traffic agents of ``lab`` (their process names carry the lab's prefix)."""
    return list(processes_named(f"{netns.PREFIX}{lab}-"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_tears_down_and_keeps_earlier_results(tmp_path, sig):
    done = tmp_path / "done"
    assert run_cli("run", "scenarios/default.yaml", "--out", str(done), *SMALL).returncode == 0
    files = sorted(p.name for p in done.iterdir())
    proc, out, lab = _start_run(tmp_path, "interrupted")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in err and "error: " in err
    assert netns.list_names(f"{netns.PREFIX}{lab}-") == []
    assert sorted(p.name for p in done.iterdir()) == files           # completed results intact
    assert not (out / "summary.csv").exists()
    assert _agents_of(lab) == []                                      # no agent process of the run is left


def test_a_crashed_run_is_reaped_by_the_next_run(tmp_path):
    """kill -9 of `testbed run` leaves its lab; the next `testbed run` removes it, its agents included (and so
    does `testbed clean <lab>`: tests/run/test_helper_death_e2e.py)."""
    proc, _, lab = _start_run(tmp_path, "crashed")
    proc.kill()                                      # SIGKILL: no cleanup at all
    proc.wait()
    assert netns.list_names(f"{netns.PREFIX}{lab}-"), "a killed run leaves its namespaces"
    assert _agents_of(lab), "a killed run leaves its agents"
    res = run_cli("run", "scenarios/default.yaml", "--out", str(tmp_path / "next"), *SMALL)
    assert res.returncode == 0, res.stderr
    assert leftovers(lab) == {}


def test_doctor_reports_this_kernel():
    res = run_cli("doctor", "--json")
    assert res.returncode == 0, res.stderr
    caps = json.loads(res.stdout)["capabilities"]
    assert caps["clsact"]["ok"] and caps["cls_bpf"]["ok"] and caps["tbf"]["ok"]
    table = run_cli("doctor")
    for name in ("netem", "rdma_rxe", "bcc"):
        assert name in table.stdout


def test_sweep_joins_summaries(tmp_path):
    res = run_cli("sweep", "scenarios/default.yaml", "--vary", "switch.load_balancing=ecmp,spray",
                      "--out", str(tmp_path / "sw"), *SMALL, timeout=300)
    assert res.returncode == 0, res.stderr
    with open(tmp_path / "sw" / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["load_balancing"] for r in rows] == ["ecmp", "spray"]
