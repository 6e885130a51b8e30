"""Live Prometheus metrics (telemetry/live.py) scraped over loopback from a real lab: the counters move with the
traffic by exactly what was sent, the exporter lives and ends with the lab, and bad addresses are refused in one
line with nothing built."""
from __future__ import annotations

import re
import socket
import urllib.error

import pytest

from testbed.fabric import netns

from conftest import free_port, make_scenario, run_cli, scrape, scrape_while_running, udp_send, wait_for

pytestmark = pytest.mark.e2e

PAYLOAD = 972                     # UDP payload: 1000 IP bytes, 1014-byte frames at the switch


def pick(samples: dict, name: str, **labels) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    got = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def test_counters_move_by_exactly_the_traffic_sent(lab):
    """200 datagrams h0 → h2 (1,014-byte frames) on a 2-spine fabric: leaf0's flow counters read exactly 200
    packets and 202,800 bytes, leaf0's port from h0 received at least that much more between two scrapes, and
    the flow appears at every switch it crossed (tracked on single-port routes too); a same-leaf flow h0 → h1 is
    counted at its leaf. Depth gauges and drop/ECN/pause counters are served for every queue."""
    address = f"127.0.0.1:{free_port()}"
    lb = lab(make_scenario(topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                                     "host_link": {"rate": "40mbit", "buffer": "256KB"},
                                     "fabric_link": {"rate": "40mbit", "buffer": "256KB"}}))
    lb.metrics = address
    from testbed.telemetry.live import MetricsExporter
    lb.exporter = MetricsExporter(lb.name, lb.datapath, lb.topo, address)
    lb.exporter.start()
    before = scrape(address)
    rx0 = pick(before, "ftb_port_rx_bytes_total", switch="leaf0", peer="h0")
    udp_send(lb, "h0", "h2", 200, 41000, size=PAYLOAD)
    udp_send(lb, "h0", "h1", 50, 41001, size=PAYLOAD)
    flow = {"src": "h0", "dst": "h2", "sport": "41000", "dport": "9000", "proto": "udp"}
    assert wait_for(lambda: pick(scrape(address), "ftb_flow_packets_total", switch="leaf1", **flow) == 200,
                    timeout=5.0)
    after = scrape(address)
    assert pick(after, "ftb_flow_packets_total", switch="leaf0", **flow) == 200
    assert pick(after, "ftb_flow_bytes_total", switch="leaf0", **flow) == 200 * (PAYLOAD + 28 + 14)
    spines = [v for (n, ls), v in after.items() if n == "ftb_flow_packets_total"
              and dict(ls).get("src") == "h0" and dict(ls).get("sport") == "41000"
              and dict(ls)["switch"].startswith("spine")]
    assert sum(spines) == 200                                    # one spine or both (ECMP pins it to one)
    assert pick(after, "ftb_flow_packets_total", switch="leaf0", src="h0", dst="h1", sport="41001") == 50
    assert pick(after, "ftb_port_rx_bytes_total", switch="leaf0", peer="h0") - rx0 >= 250 * (PAYLOAD + 42)
    for name in ("ftb_queue_depth_bytes", "ftb_queue_drops_total", "ftb_queue_ecn_marks_total",
                 "ftb_pause_frames_total", "ftb_paused_seconds_total"):
        assert pick(after, name, switch="spine1", peer="leaf1", priority="0") >= 0
    results = lb.exporter.stop()
    lb.exporter = None
    assert results["scrapes"] >= 3 and results["address"] == address
    with pytest.raises(urllib.error.URLError):
        scrape(address)                                          # it ended with its lab


def test_up_serves_metrics_until_down_and_refuses_bad_addresses(tmp_path):
    """`testbed up --metrics` serves while the lab lives (a ping moves leaf0's counters) and `testbed down` ends
    the exporter; a malformed address or one in use is one line, exit non-zero, nothing left behind."""
    scen = tmp_path / "s.yaml"
    scen.write_text("name: metrics\ntopology: {spines: 1, leaves: 2, hosts_per_leaf: 1}\n")
    address = f"127.0.0.1:{free_port()}"
    bad = run_cli("up", str(scen), "--name", "tmet1", "--metrics", "localhost:x")
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error: --metrics 'localhost:x'"), bad.stderr
    assert not netns.list_names(f"{netns.PREFIX}tmet1-")
    try:
        res = run_cli("up", str(scen), "--name", "tmet1", "--metrics", address)
        assert res.returncode == 0, res.stderr
        assert f"metrics: http://{address}/metrics" in res.stdout
        before = pick(scrape(address), "ftb_port_rx_packets_total", switch="leaf0", peer="h0")
        target = re.search(r"ping -c3 (\S+)`", res.stdout).group(1)       # h1, behind leaf1
        ping = run_cli("exec", "--lab", "tmet1", "h0", "--", "ping", "-c", "3", "-i", "0.2", target)
        assert ping.returncode == 0, ping.stderr
        assert pick(scrape(address), "ftb_port_rx_packets_total", switch="leaf0", peer="h0") >= before + 3
        with socket.socket() as held:                                 # a port in use: refused in one line
            held.bind(("127.0.0.1", 0))
            held.listen()
            busy = f"127.0.0.1:{held.getsockname()[1]}"
            res2 = run_cli("up", str(scen), "--name", "tmet2", "--metrics", busy)
            lines = [ln for ln in res2.stderr.splitlines() if ln.strip()]
            assert res2.returncode != 0 and len(lines) == 1 and f"cannot listen on {busy}" in lines[0], res2.stderr
            assert not netns.list_names(f"{netns.PREFIX}tmet2-")
    finally:
        down = run_cli("down", "tmet1")
    assert down.returncode == 0, down.stderr
    assert wait_for(lambda: _refused(address), timeout=5.0)


def _refused(address: str) -> bool:
    try:
        scrape(address)
    except OSError:                  # refused, or reset while it shuts down
        return True
    return False


def test_run_serves_metrics_while_its_traffic_flows(tmp_path):
    """`testbed run --metrics`: scraped while the traffic runs, the fabric's tx bytes grow from one scrape to the
    next; the manifest records the exporter's address and scrape count; the exporter ends with the run."""
    import json

    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    scrapes, _ = scrape_while_running(["run", "scenarios/default.yaml", "--out", str(out), "--metrics", address,
                                       "--set", "duration=3s", "--set", "topology.spines=2",
                                       "--set", "topology.hosts_per_leaf=2"], address, timeout=60)
    totals = [sum(v for (n, _), v in s.items() if n == "ftb_port_tx_bytes_total") for s in scrapes]
    assert len(totals) >= 3 and any(b > a for a, b in zip(totals, totals[1:])), totals
    m = json.loads((out / "manifest.json").read_text())
    assert m["metrics"]["address"] == address and m["metrics"]["scrapes"] >= len(totals)
    assert _refused(address)
