"""traffic.engine iperf3 end to end: Debian's iperf3 in the host namespaces across the eBPF fabric.

Each test fails if its feature breaks: UDP and TCP flows fill flows.csv with what iperf3 measured (bytes within
the link, UDP loss and jitter, TCP retransmissions) and the switches saw every flow on its path; a server that
dies before its client connects fails the run in one line naming the flow, keeping the other flows' rows;
iperf3 missing is one line naming the Debian package, before anything is built."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from testbed.workloads import iperf3

from conftest import ROOT, guarded_run, killed_run_error, leftovers, make_scenario

pytestmark = pytest.mark.e2e             # iperf3: scripts/test-setup.sh installs it


def doc(protocol: str, duration: str = "3s", **traffic) -> dict:
    """h0 → h1 and h2 → h3, each pair under its own leaf (TCP sees no reordering, no shared link)."""
    link = {"rate": "20mbit", "buffer": "256KB"}
    return {"name": f"iperf3-{protocol}", "duration": duration,
            "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, "host_link": link, "fabric_link": link},
            "traffic": {"engine": "iperf3", "iperf3": {"protocol": protocol}, "pattern": "pairs",
                        "pairs": [["h0", "h1"], ["h2", "h3"]], **traffic}}


@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_iperf3_flows_fill_flows_csv_with_what_iperf3_measured(tmp_path, protocol):
    """Two flows at 10 Mbit/s each (UDP) or as fast as TCP goes: each delivers 80–105 % of its rate (UDP) or of its
    20 Mbit/s link (TCP), on its own server port, its packets seen by the switch on its path; UDP rows carry loss
    and jitter, TCP rows retransmissions."""
    extra = {"rate": "10mbit"} if protocol == "udp" else {}
    d, row = guarded_run(make_scenario(**doc(protocol, **extra)), tmp_path / protocol)
    flows = pd.read_csv(d / "flows.csv")
    print(f"\n[iperf3 {protocol}] " + "; ".join(f"flow {f.flow_id}: {f.goodput_mbps:.2f} Mbit/s, lost {f.lost}, "
                                            f"jitter {f.jitter_ms}, retrans {f.retrans}" for f in flows.itertuples()))
    want = 10.0 if protocol == "udp" else 20.0
    assert list(flows["dport"]) == [iperf3.PORT_BASE, iperf3.PORT_BASE + 1] and set(flows["engine"]) == {"iperf3"}
    assert all(0.8 * want <= g <= 1.05 * want for g in flows["goodput_mbps"]), flows["goodput_mbps"]
    assert flows["error"].isna().all()
    links = pd.read_csv(d / "links.csv")
    for f in flows.itertuples():                  # the leaf saw at least the flow's bytes arrive from its source
        seen = links[(links["port"] == f.src) & (links["direction"] == "rx")]["bytes"].sum()
        assert seen >= f.bytes, (f.src, seen, f.bytes)
    if protocol == "udp":
        assert (flows["lost"] >= 0).all() and (flows["jitter_ms"] >= 0).all() and flows["retrans"].isna().all()
    else:
        assert (flows["retrans"] >= 0).all() and flows["lost"].isna().all() and flows["jitter_ms"].isna().all()
    assert (d / "iperf3" / "client-0.json").is_file() and (d / "iperf3" / "server-1.json").is_file()


def _run_cli(path, out, env=None):
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(path), "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_server_that_dies_fails_the_run_naming_its_flow(tmp_path):
    """Flows start 2 s in; flow 0's server is killed before: the run exits non-zero with one line naming flow 0
    (h0 → h1) and iperf3's own error; flow 1's row is kept with what it delivered; nothing is left running."""
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(doc("tcp", duration="4s", start="2s")))
    proc = _run_cli(path, tmp_path / "r")
    victim, end = None, time.monotonic() + 30
    while victim is None and time.monotonic() < end:
        out = subprocess.run(["pgrep", "-f", f"iperf3 -s -1 -J -B .* -p {iperf3.PORT_BASE}$"], capture_output=True,
                             text=True).stdout.split()
        victim = int(out[0]) if out else None
        time.sleep(0.05)
    assert victim is not None, "flow 0's server never started"
    time.sleep(0.3)
    line, _ = killed_run_error(proc, victim)
    assert line.startswith("error: iperf3: flow 0 (h0 → h1) failed:"), line
    flows = pd.read_csv(tmp_path / "r" / "flows.csv").set_index("flow_id")
    assert flows.loc[1, "bytes"] > 0 and isinstance(flows.loc[0, "error"], str) and flows.loc[0, "bytes"] == 0
    lab = json.loads((tmp_path / "r" / "manifest.json").read_text())["lab"]
    assert leftovers(lab) == {k: [] for k in leftovers(lab)}
    assert not subprocess.run(["pgrep", "-f", f"iperf3 .*-p {iperf3.PORT_BASE}"], capture_output=True).stdout


def test_iperf3_missing_is_one_line_naming_the_package(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(doc("udp")))
    proc = _run_cli(path, tmp_path / "r", env=dict(os.environ, PATH="/nonexistent"))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("error: traffic.engine iperf3: iperf3 is not installed (apt-get "
                                            "install iperf3)"), err
    assert not (tmp_path / "r").exists()
