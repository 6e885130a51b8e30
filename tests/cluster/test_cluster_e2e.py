"""Beyond one machine, for real: a local Ray cluster of 2 namespace machines (started once for the module),
distributed sweeps (and a machine dying mid-sweep: its run retried once on the other), and one fabric split over
both machines (pings across the cut, the default scenario against one machine, spray over cut uplinks, a
lossless PFC incast across the cut, a part's actor killed mid-run, INT, captures and a collective across the
cut, a local and a cluster run of one scenario writing the same files, columns and manifest keys, and forged,
replayed and altered control messages injected from the underlay: dropped and counted). The machine-death test is the last: it leaves one machine."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cpu_guard
from testbed.fabric import netns

pytestmark = [pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "testbed.cli"]
SMALL = ["--set", "duration=1.5s", "--set", "topology.spines=2", "--set", "topology.hosts_per_leaf=2"]


def cli(*args, timeout=300):
    return subprocess.run([*TESTBED, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


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


@pytest.mark.plots
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


# ---------------------------------------------------------------- one fabric over both machines

def _run(tmp_path, name, *args, timeout=300):
    out = tmp_path / name
    res = cli("run", *args, "--out", str(out), timeout=timeout)
    return res, out


def _valid_run(tmp_path, name, *args):
    """A run the CPU guard calls valid (tests/cpu_guard.py), for figures compared between runs."""
    def once(k):
        res, out = _run(tmp_path, name if k == 0 else f"{name}-rerun{k}", *args)
        assert res.returncode == 0, res.stderr
        return res, out
    return cpu_guard.valid(once, name, row_of=lambda got: _rows(got[1] / "summary.csv")[0])


def _part_labs() -> list[dict]:
    """The state files of the split runs' parts on this machine (labs named c<4 hex>m<i>)."""
    import re

    from testbed.lab import all_labs
    return [st for st in all_labs() if re.fullmatch(r"c[0-9a-f]{4}m\d+", st["name"])]


def _sum_by_port(out: Path, switch: str, direction: str = "tx") -> dict[str, int]:
    acc: dict[str, int] = {}
    for r in _rows(out / "links.csv"):
        if r["switch"] == switch and r["direction"] == direction:
            acc[r["port"]] = acc.get(r["port"], 0) + int(float(r["bytes"]))
    return acc


def test_every_host_pair_pings_across_the_cut(cluster):
    import ray

    from testbed import scenario
    from testbed.cluster.run import ClusterLab
    scen = scenario.load("scenarios/default.yaml", ("placement.partitions=2",))
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with ClusterLab(scen, "auto") as cl:
            # joining Ray as a driver keeps this process's SIGTERM handler (Ray's own would make a forked child
            # that gets SIGTERM unwind into this process's code)
            assert signal.getsignal(signal.SIGTERM) is handler
            assert len(cl.part.cut) == 4
            hosts = cl.topo.hosts
            crossing = 0
            procs = []
            for a in hosts:
                for b in hosts:
                    if a != b:
                        crossing += cl.part.of[a] != cl.part.of[b]
                        procs.append(((a, b), netns.spawn(cl.ns_of(a), ["ping", "-c1", "-W3", "-q",
                                                                         cl.topo.address(b)],
                                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
            failed = [pair for pair, p in procs if p.wait() != 0]
            assert crossing == 32 and failed == []
            # every cut port is a VXLAN device in its switch's namespace, with the topology's name and ifindex
            c = cl.part.cut[0]
            link = subprocess.run(["ip", "-n", cl.ns_of(c.a_node), "-d", "-o", "link", "show", c.a_ifname],
                                  capture_output=True, text=True).stdout
            assert f"{c.a_ifindex}: {c.a_ifname}" in link and f"vxlan id {c.vni}" in link
        labs = cl.labs
    finally:
        ray.shutdown()
    assert not [n for lab in labs for n in netns.list_names(f"{netns.PREFIX}{lab}-")]


def test_default_scenario_over_two_machines_matches_one_machine(cluster, tmp_path):
    res1, one = _valid_run(tmp_path, "one", "scenarios/default.yaml")
    res2, two = _valid_run(tmp_path, "two", "scenarios/default.yaml", "--cluster", "auto", "--set",
                           "placement.partitions=2")
    a, b = _rows(one / "summary.csv")[0], _rows(two / "summary.csv")[0]
    for k in ("goodput_mbps", "uplink_imbalance"):
        assert abs(float(b[k]) - float(a[k])) <= 0.10 * float(a[k]), (k, a[k], b[k])
    m = json.loads((two / "manifest.json").read_text())
    cl = m["cluster"]
    assert [n["machine"] for n in cl["nodes"]] == ["m0", "m1"] and len(cl["cut_links"]) == 4
    assert cl["partition"]["h0"] == cl["partition"]["leaf0"] != cl["partition"]["leaf1"]
    switches = {r["switch"] for r in _rows(two / "links.csv")}   # telemetry from both machines, merged
    assert switches == {"leaf0", "leaf1", "spine0", "spine1", "spine2", "spine3"}
    print(f"goodput {a['goodput_mbps']} vs {b['goodput_mbps']} Mbit/s; imbalance {a['uplink_imbalance']} vs "
          f"{b['uplink_imbalance']}")


def test_spray_splits_one_flow_evenly_over_uplinks_that_cross_the_cut(cluster, tmp_path):
    res, out = _run(tmp_path, "spray", "scenarios/default.yaml", "--cluster", "auto",
                    "--set", "placement.partitions=2", "--set", "switch.load_balancing=spray",
                    "--set", "switch.spray=round_robin", "--set", "traffic.pattern=pairs", "--set", "traffic.pairs=[[h0, h4]]",
                    "--set", "duration=2s")
    assert res.returncode == 0, res.stderr
    cut = {c["a"] for c in json.loads((out / "manifest.json").read_text())["cluster"]["cut_links"]}
    ups = _sum_by_port(out, "leaf0")
    ups = {p: n for p, n in ups.items() if p.startswith("spine")}
    assert len(ups) == 4 and any(f"leaf0/{p}" in cut for p in ups) and any(f"leaf0/{p}" not in cut for p in ups)
    total = sum(ups.values())
    for p, n in ups.items():
        assert abs(n / total - 0.25) <= 0.25 * 0.05, (p, n / total, ups)


def test_pfc_incast_across_the_cut_stays_lossless(cluster, tmp_path):
    # the receiver's leaf and the spine on m0, the senders' leaves on m1: pauses cross the cut (spine0 → leaf1/2)
    res, out = _run(tmp_path, "pfc", "scenarios/incast-pfc.yaml", "--cluster", "auto",
                    "--set", "placement.strategy=manual",
                    "--set", "placement.assign={leaf0: 0, spine0: 0, leaf1: 1, leaf2: 1}", "--set", "duration=2s")
    assert res.returncode == 0, res.stderr
    rows = _rows(out / "links.csv")
    assert sum(int(float(r["drops"])) for r in rows) == 0
    paused_cut = sum(int(float(r["pause_rx"])) for r in rows if r["switch"] in ("leaf1", "leaf2")
                     and r["port"] == "spine0")
    assert paused_cut > 0                              # PFC frames crossed the VXLAN links
    flows = _rows(out / "flows.csv")
    assert len(flows) == 8 and all(int(float(f["lost"])) == 0 for f in flows)


def test_credit_incast_across_the_cut_stays_lossless(cluster, tmp_path):
    """incast-credit with the receiver's leaf and the spine on m0, the senders' leaves on m1: the spine grants
    leaf1's and leaf2's uplinks their credit in credit frames over the VXLAN links (FCCL), the leaves' agents
    set their meters from them. Nothing is dropped or lost, the spine's ingresses from the cut ran out of credit
    (stalls: the grants did hold the senders back), and leaf1's uplink waited for them."""
    res, out = _run(tmp_path, "credit", "scenarios/incast-credit.yaml", "--cluster", "auto",
                    "--set", "placement.strategy=manual",
                    "--set", "placement.assign={leaf0: 0, spine0: 0, leaf1: 1, leaf2: 1}")
    assert res.returncode == 0, res.stderr
    rows = _rows(out / "links.csv")
    def total(sw, port, col, direction):
        return sum(float(r[col]) for r in rows if r["switch"] == sw and r["port"] == port
                   and r["direction"] == direction)
    stalls = {p: total("spine0", p, "credit_stalls", "rx") for p in ("leaf1", "leaf2")}
    granted = {p: total("spine0", p, "credits_granted", "rx") for p in ("leaf1", "leaf2")}
    wait = total("leaf1", "spine0", "credit_wait_s", "tx")
    print(f"\n[credit across the cut] spine0 stalls {stalls}, granted {granted} B, leaf1 uplink waited {wait:.2f} s")
    assert sum(int(float(r["drops"])) for r in rows) == 0
    assert all(v > 0 for v in stalls.values()) and all(v > 0 for v in granted.values())
    assert wait > 0.1
    flows = _rows(out / "flows.csv")
    assert len(flows) == 8 and all(int(float(f["lost"])) == 0 for f in flows)


def test_up_and_down_over_the_cluster(cluster):
    res = cli("up", "scenarios/default.yaml", "--cluster", "auto", "--name", "cup", "--set", "placement.partitions=2")
    assert res.returncode == 0, res.stderr
    try:
        assert "cupm0 on m0" in res.stdout and "cupm1 on m1" in res.stdout
        # h0's part is on m0, h7's on m1: the ping crosses the cut
        ping = cli("exec", "--lab", "cupm0", "h0", "--", "ping", "-c1", "-W3", "198.18.1.4")
        assert ping.returncode == 0, ping.stdout + ping.stderr
    finally:
        res = cli("down", "cup", "--cluster", "auto")
    assert res.returncode == 0 and "2 part(s)" in res.stdout, res.stderr
    assert not netns.list_names("ftb-cupm0-") and not netns.list_names("ftb-cupm1-")


# ---------------------------------------------------------------- datapath features across the cut

def _header(path: Path) -> list[str]:
    with open(path) as f:
        return next(csv.reader(f))


def test_int_records_hops_of_both_machines_into_one_int_csv(cluster, tmp_path):
    """The INT incast with leaf0 + spine0 on m0 and leaf1 + spine1 on m1: every report's stack was pushed by
    switches of both machines (leaf0 → spine0 → leaf1 crosses the cut after the spine, leaf0 → spine1 → leaf1
    before it) and exported by leaf1's sink on m1; int.csv has a single machine's columns."""
    from testbed.report.columns import INT_COLUMNS, INT_PATH_COLUMNS
    res, out = _run(tmp_path, "int", "scenarios/int-incast.yaml", "--cluster", "auto",
                    "--set", "placement.strategy=manual",
                    "--set", "placement.assign={leaf0: 0, spine0: 0, leaf1: 1, spine1: 1}", "--set", "duration=1.5s")
    assert res.returncode == 0, res.stderr
    assert _header(out / "int.csv") == INT_COLUMNS and _header(out / "int_paths.csv") == INT_PATH_COLUMNS
    rows = _rows(out / "int.csv")
    m = json.loads((out / "manifest.json").read_text())
    where = m["cluster"]["partition"]
    assert {r["path"] for r in rows} == {"leaf0>spine0>leaf1", "leaf0>spine1>leaf1"}
    assert {where[r["switch"]] for r in rows} == {"m0", "m1"}
    reports: dict[str, list[dict]] = {}
    for r in rows:
        reports.setdefault(r["report"], []).append(r)
    assert len(reports) > 100 and all(len(hops) == 3 for hops in reports.values())
    flows = {r["flow_id"] for r in rows}
    assert len(flows) == 3 and "" not in flows                  # every report is matched to its flow
    for hops in list(reports.values())[::20]:                  # each hop's time on its own machine's clock
        t = [float(h["hop_time_s"]) for h in sorted(hops, key=lambda h: int(h["hop"]))]
        assert t == sorted(t) and float(hops[0]["time_s"]) >= t[-1] - 1e-6, hops
    steady = [r for r in rows if r["hop"] == "2" and float(r["time_s"]) > 0.5]
    full = sorted(int(r["queue_bytes"]) for r in steady)[len(steady) // 2]
    print(f"INT across the cut: {len(reports)} reports, {dict(m['int'])}; leaf1→h3 queue median {full} B")
    assert full >= 0.95 * 64 * 1024                              # leaf1's port to h3 stands full, as on one machine
    assert m["int"]["exported"] == len(reports) and m["int"]["export_lost"] == 0 and m["int"]["failed"] == 0
    assert m["int"]["sourced"] >= m["int"]["exported"] > 0


def _key_paths(a, b, at: str = "") -> list[str]:
    """Where two manifests' key sets differ: every key path present in one and not the other, looking into
    mappings both sides have (and the first element of lists of mappings); values may differ."""
    if isinstance(a, list) and isinstance(b, list) and a and b:
        return _key_paths(a[0], b[0], f"{at}[0]")
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return []
    out = [f"{at}.{k} only {'locally' if k in a else 'over the cluster'}" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        out += _key_paths(a[k], b[k], f"{at}.{k}")
    return out


def test_a_local_and_a_cluster_run_write_the_same_files_columns_and_manifest_keys(cluster, tmp_path):
    """One run lifecycle over two back ends: the same dilated INT scenario on this machine and over both
    machines writes the same result files, the same columns in each CSV (a dilated run's real-unit twins
    included) and manifest.json with the same keys at every level; only the cluster section is the cluster's."""
    sets = ["--set", "time_dilation=10", "--set", "duration=0.15s", "--set", "telemetry.interval=10ms"]
    res, one = _run(tmp_path, "one", "scenarios/int-incast.yaml", *sets, "--set", "placement.partitions=1")
    assert res.returncode == 0, res.stderr
    res, two = _run(tmp_path, "two", "scenarios/int-incast.yaml", *sets, "--cluster", "auto",
                    "--set", "placement.partitions=2")
    assert res.returncode == 0, res.stderr
    files = {p.relative_to(one).as_posix() for p in one.rglob("*") if p.is_file()}
    assert files == {p.relative_to(two).as_posix() for p in two.rglob("*") if p.is_file()}
    assert {"links.csv", "flows.csv", "summary.csv", "int.csv", "manifest.json"} <= files
    for name in sorted(f for f in files if f.endswith(".csv")):
        assert _header(one / name) == _header(two / name), name
    assert "fct_real_s" in _header(two / "flows.csv") and "rate_real_bps" in _header(two / "links.csv")
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (one, two))
    assert b.pop("cluster")["nodes"] and "cluster" not in a
    # build phases are what was built (the cut links' VXLAN devices add "tunnels"): keys that are data
    assert set(a.pop("build_timings_s")) | {"tunnels"} == set(b.pop("build_timings_s"))
    assert _key_paths(a, b) == []
    assert a["time_dilation"]["factor"] == b["time_dilation"]["factor"] == 10
    assert b["int"]["exported"] > 0 and b["int"]["host_stacks"] is False


def _udp_payload(pcap: Path, src: str, dport: int) -> int:
    from scapy.all import IP, UDP, rdpcap
    return sum(len(p[UDP].payload) for p in rdpcap(str(pcap)) if UDP in p and p[IP].src == src
               and p[UDP].dport == dport)


def test_capture_on_each_machine_comes_back_into_the_run_directory(cluster, tmp_path):
    """h0 on one machine sends to h4 on the other; both are captured, each by its own machine: the run directory
    holds both pcaps (as on one machine), each with the flow's packets — the receiver's all it delivered."""
    res, out = _run(tmp_path, "cap", "scenarios/default.yaml", "--cluster", "auto", "--set", "placement.partitions=2",
                    "--set", "traffic.pattern=pairs", "--set", "traffic.pairs=[[h0, h4]]", "--set", "capture=[h0, h4]",
                    "--set", "duration=1.5s")
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["cluster"]["partition"]["h0"] != m["cluster"]["partition"]["h4"]
    assert m["pcap"] == ["pcap/h0-eth0.pcap", "pcap/h4-eth0.pcap"]
    assert sorted(p.name for p in (out / "pcap").iterdir()) == ["h0-eth0.pcap", "h4-eth0.pcap"]
    (flow,) = _rows(out / "flows.csv")
    from testbed import scenario, topology
    src = topology.build(scenario.load("scenarios/default.yaml").topology).address("h0")
    delivered, dport = int(flow["bytes"]), int(flow["dport"])
    got = {h: _udp_payload(out / "pcap" / f"{h}-eth0.pcap", src, dport) for h in ("h0", "h4")}
    print(f"delivered {delivered} B; captured {got}")
    assert delivered > 1_000_000
    assert delivered <= got["h4"] <= 1.01 * delivered and got["h0"] >= got["h4"], (delivered, got)


def test_pause_frames_a_captured_switch_sends_over_the_cut_are_in_its_pcap(cluster, tmp_path):
    """PFC across the cut (spine0 on m0 pauses leaf1 and leaf2 on m1): the pause frames spine0 sends bypass its
    own capture tap, so m1 records them where they arrive and the driver merges them into spine0's pcaps."""
    res, out = _run(tmp_path, "cappfc", "scenarios/incast-pfc.yaml", "--cluster", "auto",
                    "--set", "placement.strategy=manual",
                    "--set", "placement.assign={leaf0: 0, spine0: 0, leaf1: 1, leaf2: 1}", "--set", "duration=1.5s",
                    "--set", "capture=[spine0]")
    assert res.returncode == 0, res.stderr
    files = sorted(p.name for p in (out / "pcap").iterdir())
    assert files == ["spine0-leaf0.pcap", "spine0-leaf1.pcap", "spine0-leaf2.pcap"]     # nothing left to merge
    sent = {r["port"]: 0 for r in _rows(out / "links.csv") if r["switch"] == "spine0"}
    for r in _rows(out / "links.csv"):
        if r["switch"] == "spine0" and r["direction"] == "rx":
            sent[r["port"]] += int(float(r["pause_tx"]))
    for port in ("leaf1", "leaf2"):
        tshark = subprocess.run(["tshark", "-r", str(out / "pcap" / f"spine0-{port}.pcap"), "-Y",
                                 "macc.opcode == 0x0101", "-T", "fields", "-e", "eth.dst"],
                                capture_output=True, text=True, timeout=60)
        frames = tshark.stdout.split()
        print(f"spine0/{port}: {len(frames)} pause frames in the pcap, pause_tx {sent[port]}")
        assert sent[port] > 0 and len(frames) == sent[port], (port, frames[:3], sent[port], tshark.stderr)


def test_ring_allreduce_across_the_cut_completes_step_by_step(cluster, tmp_path):
    """The ring all-reduce over 8 hosts, leaf0's on one machine and leaf1's on the other: its gates (each step
    waits for the previous one's transfers to arrive) are announced across the cut through the relays; every
    step starts after the last transfer of the one before and the collective completes, with one machine's
    collectives.csv columns."""
    from testbed.report.columns import COLLECTIVE_COLUMNS
    res, out = _run(tmp_path, "ring", "scenarios/allreduce-ring.yaml", "--cluster", "auto",
                    "--set", "placement.partitions=2", "--set", "duration=8s")
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "manifest.json").read_text())
    where = m["cluster"]["partition"]
    assert {where[f"h{i}"] for i in range(4)} != {where[f"h{i}"] for i in range(4, 8)}
    assert _header(out / "collectives.csv")[:len(COLLECTIVE_COLUMNS)] == COLLECTIVE_COLUMNS
    (op,) = _rows(out / "collectives.csv")
    assert op["op"] == "allreduce" and op["end_s"] != "" and float(op["jct_ms"]) > 0
    flows = _rows(out / "flows.csv")
    assert len(flows) == 14 * 8 and all(f["end_s"] != "" for f in flows)
    assert sum(where[f["src"]] != where[f["dst"]] for f in flows) == 14 * 2          # h3 → h4 and h7 → h0
    steps: dict[int, list[dict]] = {}
    for f in flows:
        steps.setdefault(int(f["step"]), []).append(f)
    for k in range(1, 14):
        begun = min(float(f["start_s"]) for f in steps[k])
        ended = max(float(f["end_s"]) for f in steps[k - 1])
        assert begun >= ended - 0.002, (k, begun, ended)
    print(f"ring all-reduce across the cut: JCT {float(op['jct_ms']):.0f} ms")


def _lab_owned_by(machine: str) -> str | None:
    """The name of a lab whose owner process belongs to the local cluster's ``machine``."""
    from testbed.cluster import local
    from testbed.lab import all_labs
    pids = set(local.machine_pids(machine))
    return next((st["name"] for st in all_labs() if st.get("pid") in pids), None)


PKT_RATE = 4_000_000 / 8 / 1500              # link-failure.yaml: each flow's 4 Mbit/s in 1,500-byte packets


def _link_failure(tmp_path, name: str, assign: str, *sets: str):
    """link-failure.yaml over both machines as ``assign`` places its switches: (failures.csv, flows.csv, the
    manifest's routing), the reaction printed."""
    import pandas as pd
    res, out = _run(tmp_path, name, "scenarios/link-failure.yaml", "--cluster", "auto", "--set",
                    "placement.strategy=manual", "--set", f"placement.assign={assign}", *sets)
    assert res.returncode == 0, res.stderr
    fail, flows = pd.read_csv(out / "failures.csv"), pd.read_csv(out / "flows.csv")
    routing = json.loads((out / "manifest.json").read_text())["routing"]
    print(f"\n[{name} across machines] detected_ms {[round(x * 1e3, 2) for x in fail['detected_s']]} "
          f"rerouted_ms {[round(x * 1e3, 2) for x in fail['rerouted_s']]} lost {list(fail['lost_packets'])}; "
          f"floods taken {routing['floods_taken']}, entries sent to other machines {routing.get('remote_entries')}; "
          f"flows lost {flows['lost'].tolist()}")
    return out, fail, flows, routing


def test_a_link_failure_on_one_machine_reroutes_the_other_through_flooded_link_state(cluster, tmp_path):
    """link-failure (leaf0–spine1 down at 1 s, up at 2 s) with leaf0, spine0 and spine1 on m0, leaf1 and the
    other spines on m1, flows sprayed over every spine. The failed link is all on m0: leaf1's switch on m1 hears
    of it only from m0's link-state watcher (flooded over the underlay). Until it reroutes, what leaf1 sprays
    to spine1 for leaf0 is lost (spine1 withdrew leaf0); had it never heard, those flows would lose a quarter
    of their packets for a second. Every event is detected and rerouted on both machines within milliseconds,
    and each flow loses at most what it sent into the dead path meanwhile."""
    _, fail, flows, routing = _link_failure(tmp_path, "distributed",
                                            "{leaf0: 0, spine0: 0, spine1: 0, leaf1: 1, spine2: 1, spine3: 1}",
                                            "--set", "switch.load_balancing=spray")
    assert len(fail) == 2 and fail["time_s"].notna().all()
    assert routing["floods_taken"] >= 2                      # m1 heard of the link going down and coming up
    assert routing["rejected"] == {"forged": 0, "replayed": 0}   # every flood was sealed by the run's key
    assert {c["machine"] for c in routing["changes"] if c["kind"] == "reroute"} == {"m0", "m1"}
    assert fail["detected_s"].notna().all() and (fail["rerouted_s"] < 0.05).all(), fail["rerouted_s"].tolist()
    down = fail[fail["change"] == "down"].iloc[0]
    assert down["lost_packets"] <= 8 * PKT_RATE * down["rerouted_s"] + 16, down.to_dict()
    assert (flows["lost"] <= PKT_RATE * down["rerouted_s"] + 8).all(), flows["lost"].tolist()
    assert flows["lost"].sum() == fail["lost_packets"].sum()


def test_the_subnet_manager_on_one_machine_programs_and_reroutes_the_other(cluster, tmp_path):
    """link-failure under SM routing (ftree, a sweep every 10 ms) with leaf0, its hosts and spine1 on m1, the
    rest on m0, where the SM runs: the SM programs m1's switches over the underlay before the traffic (every
    flow delivers its rate: there are no other routes), learns of the leaf0–spine1 link going down from m1's
    flooding at its next sweep, and sends m1 its new tables. Each event is rerouted within a sweep interval (plus
    the exchange), and the flows lose only what they sent into the dead port meanwhile."""
    import pandas as pd
    out, fail, flows, routing = _link_failure(tmp_path, "sm",
                                              "{leaf0: 1, spine1: 1, leaf1: 0, spine0: 0, spine2: 0, spine3: 0}",
                                              "--set", "switch.routing=sm")
    sm = pd.read_csv(out / "sm.csv")
    assert routing["mode"] == "sm" and routing["remote_entries"] > 0
    assert routing["rejected"] == {"forged": 0, "replayed": 0}   # tables, acknowledgements, floods: all sealed
    assert list(sm["kind"]) == ["initial", "sweep", "sweep"]
    assert len(fail) == 2 and fail["detected_s"].notna().all() and fail["rerouted_s"].notna().all()
    assert (fail["rerouted_s"] < 0.010 + 0.05).all(), fail["rerouted_s"].tolist()
    down = fail[fail["change"] == "down"].iloc[0]
    assert down["lost_packets"] <= 8 * PKT_RATE * down["rerouted_s"] + 8, down.to_dict()
    assert (flows["lost"] <= 1.2 * PKT_RATE * down["rerouted_s"] + 4).all(), flows["lost"].tolist()
    assert (flows["goodput_mbps"] > 0.9 * 4.0).all(), flows["goodput_mbps"].tolist()


def test_run_over_two_machines_serves_both_machines_metrics_at_one_endpoint(cluster, tmp_path):
    """`testbed run --cluster --metrics`: scraped while the traffic runs, the driver's one endpoint serves the
    switches of both machines under the run's lab name, both machines up, and the fabric's tx bytes grow from
    one scrape to the next; the manifest records the scrapes and that no machine missed one."""
    from conftest import free_port, scrape_while_running
    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "metrics"
    scrapes, _ = scrape_while_running(["run", "scenarios/default.yaml", "--cluster", "auto", "--out", str(out),
                                       "--metrics", address, "--set", "placement.partitions=2",
                                       "--set", "duration=3s"], address)
    m = json.loads((out / "manifest.json").read_text())
    on = {n: p for n, p in m["cluster"]["partition"].items() if n.startswith(("leaf", "spine"))}
    assert set(on.values()) == {"m0", "m1"}
    served = [s for s in scrapes if any(n == "ftb_port_tx_bytes_total" for n, _ in s)]
    assert len(served) >= 3, len(scrapes)
    last = [(n, dict(ls), v) for (n, ls), v in served[-1].items()]
    assert {ls["switch"] for n, ls, _ in last if n == "ftb_port_tx_bytes_total"} == set(on)
    assert {ls["lab"] for _, ls, _ in last} == {m["lab"]}
    assert {ls["machine"]: v for n, ls, v in last if n == "ftb_machine_up"} == {"m0": 1.0, "m1": 1.0}
    totals = [sum(v for (n, _), v in s.items() if n == "ftb_port_tx_bytes_total") for s in served]
    assert any(b > a for a, b in zip(totals, totals[1:])), totals
    assert m["metrics"]["scrapes"] >= len(served) and m["metrics"]["missed"] == {"m0": 0, "m1": 0}


def test_up_over_the_cluster_serves_metrics_until_down(cluster):
    """`testbed up --cluster --metrics`: the endpoint outlives the command (a detached actor on the driver's
    machine) and serves both machines' switches; `testbed down --cluster` ends it with the parts."""
    from conftest import free_port, scrape, wait_for
    address = f"127.0.0.1:{free_port()}"
    res = cli("up", "scenarios/default.yaml", "--cluster", "auto", "--name", "cmet", "--metrics", address,
              "--set", "placement.partitions=2", "--set", "topology.spines=2", "--set", "topology.hosts_per_leaf=2")
    try:
        assert res.returncode == 0, res.stderr
        assert f"metrics: http://{address}/metrics" in res.stdout
        got = scrape(address)
        up = {dict(ls)["machine"]: v for (n, ls), v in got.items() if n == "ftb_machine_up"}
        switches = {dict(ls)["switch"] for (n, ls), _ in got.items() if n == "ftb_port_tx_bytes_total"}
        assert up == {"m0": 1.0, "m1": 1.0} and switches == {"leaf0", "leaf1", "spine0", "spine1"}
        assert {dict(ls)["lab"] for (n, ls), _ in got.items()} == {"cmet"}
    finally:
        down = cli("down", "cmet", "--cluster", "auto")
    assert down.returncode == 0, down.stderr

    def refused() -> bool:
        try:
            scrape(address)
        except OSError:
            return True
        return False
    assert wait_for(refused, timeout=10.0)


# ---------------------------------------------------------------- sealed control channels under attack

def _bound_sockets(pid: int) -> dict[str, list[tuple[str, int]]]:
    """The listening TCP and the bound UDP sockets that process ``pid`` holds (its own descriptors, looked up
    in its network namespace's tables): {"tcp": [(address, port)], "udp": [...]}."""
    import socket
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    out: dict[str, list[tuple[str, int]]] = {"tcp": [], "udp": []}
    for proto, state in (("tcp", "0A"), ("udp", "07")):           # LISTEN; UDP's "closed" = bound, unconnected
        for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == state and f[9] in inodes:
                ip, port = f[1].split(":")
                out[proto].append((socket.inet_ntoa(bytes.fromhex(ip)[::-1]), int(port, 16)))
    return out


class _Sniffer:
    """tcpdump on the root namespace's end of a machine's underlay link: the UDP datagrams from ``src`` to ``dst``
    (the VXLAN links' aside), each as (IP packet, destination port, UDP payload) the moment it passes."""

    def __init__(self, iface: str, src: str, dst: str):
        import threading
        self.proc = subprocess.Popen(["tcpdump", "-i", iface, "-n", "-U", "-s", "0", "-w", "-",
                                      f"udp and src host {src} and dst host {dst} and not port 4789"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.got: list[tuple[bytes, int, bytes]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        import struct
        f = self.proc.stdout
        if len(f.read(24)) < 24:                                    # the pcap file header (Ethernet frames)
            return
        while len(rec := f.read(16)) == 16:
            caplen = struct.unpack("=IIII", rec)[2]
            ip = f.read(caplen)[14:]
            ihl, total = (ip[0] & 0xF) * 4, struct.unpack("!H", ip[2:4])[0]
            ip = ip[:total]
            self.got.append((ip, struct.unpack("!H", ip[ihl + 2:ihl + 4])[0], ip[ihl + 8:]))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.thread.join(5)


def _on_the_wire(ip: bytes) -> bytes:
    """A captured IPv4/UDP packet as it is on a wire: its UDP checksum filled in (a veth leaves it to an offload
    that never happens, and the receiver of a packet sent again through a raw socket would drop it)."""
    import struct
    ihl = (ip[0] & 0xF) * 4
    udp = bytearray(ip[ihl:])
    udp[6:8] = b"\0\0"
    data = ip[12:20] + struct.pack("!BBH", 0, 17, len(udp)) + bytes(udp) + b"\0" * (len(udp) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    udp[6:8] = struct.pack("!H", (~total & 0xFFFF) or 0xFFFF)
    return ip[:ihl] + bytes(udp)


class _MetricsMitm:
    """A man in the middle of the driver's fetches from one machine's exporter: a DNAT rule in the nat OUTPUT
    chain of the root namespace, where the driver runs, sends its connections to the exporter to this proxy (whose
    own connections carry a mark the rule skips). The proxy hands the first reply on as it came, flips a digit
    of a sample's value in the second's body, and serves the first reply again for the third request."""

    MARK = 0x4654
    ACTS = ("pass", "alter", "replay")

    def __init__(self, exporter: tuple[str, int]):
        import socket
        import threading

        from testbed.cluster import local
        self.exporter = exporter
        self.server = socket.create_server((local.DRIVER_ADDRESS, 0))
        self.server.settimeout(30)
        at = "%s:%d" % self.server.getsockname()
        self.rule = ["OUTPUT", "-d", f"{exporter[0]}/32", "-p", "tcp", "--dport", str(exporter[1]), "-m", "mark",
                     "!", "--mark", hex(self.MARK), "-m", "comment", "--comment", "ftb e2e: metrics MITM",
                     "-j", "DNAT", "--to-destination", at]
        self.done: list[str] = []
        self.altered: tuple[bytes, bytes] | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        subprocess.run(["iptables", "-t", "nat", "-I", *self.rule], check=True, capture_output=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        import socket
        subprocess.run(["iptables", "-t", "nat", "-D", *self.rule], check=True, capture_output=True)
        if self.thread.is_alive():                                     # fewer fetches came: end its accept
            self.thread.join(2)
            with contextlib.suppress(OSError):
                self.server.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)
        self.server.close()

    def _fetch(self, request: bytes) -> bytes:
        import socket
        with socket.socket() as up:
            up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.MARK)
            up.settimeout(10)
            up.connect(self.exporter)
            up.sendall(request)
            reply = b""
            while chunk := up.recv(1 << 16):
                reply += chunk
        return reply

    def _alter(self, reply: bytes) -> bytes:
        """One digit of the first ftb_port_tx_bytes_total sample's value changed: the reply stays well-formed."""
        head, sep, body = reply.partition(b"\r\n\r\n")
        at = body.index(b"\nftb_port_tx_bytes_total{") + 1
        end = body.index(b"\n", at)
        value_at = body.rindex(b" ", at, end) + 1
        i = next(j for j in range(value_at, end) if body[j:j + 1].isdigit())
        new = str((int(body[i:i + 1]) + 1) % 10).encode()
        self.altered = (body[at:end], body[at:i] + new + body[i + 1:end])
        return head + sep + body[:i] + new + body[i + 1:]

    def _serve(self) -> None:
        first = None
        for act in self.ACTS:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(1 << 16)
                if act == "replay":
                    reply = first                                  # stale: sealed for another request
                else:
                    reply = self._fetch(request)
                    if act == "pass":
                        first = reply
                    else:
                        reply = self._alter(reply)
                conn.sendall(reply)
            self.done.append(act)


@pytest.mark.slow
def test_forged_tables_a_replayed_flood_and_altered_metrics_are_dropped_and_counted_and_the_fabric_routes(
        cluster, tmp_path):
    """One run under SM routing over both machines (link-failure: leaf0–spine1 down at 1 s and up at 2 s, the
    link and its switches on m1, the SM on m0; live metrics at a bare port) while this process attacks its
    control channels from the underlay, as anyone on it could:

    - **forged tables** to m1's SM agent (its table port found from its process's sockets): every destination of
      leaf0 and spine1 sent into the failing link, as a well-formed JSON line without a MAC, one sealed under
      another key, and one cut short by a reset — none answered, none written;
    - **a replayed flood**: m1's flood saying leaf0–spine1 is down, captured off the underlay while it was,
      sent again to the SM once m1 has flooded it up — from this process's own socket and as the very packet
      (its source address m1's);
    - **altered metrics**: a proxy in the driver's path to m1's exporter (a DNAT rule) passes one reply, alters a
      digit of the next and serves the first again for a third scrape — m1 reads as down in those two.

    The run completes; the fabric routed as it does unattacked (the SM's sweeps are exactly those of the two
    real events; every flow delivers its rate, losing only what it sent into the dead port); the manifest
    counts exactly what was injected; the metrics endpoint of a bare port listens on 127.0.0.1 only."""
    import socket
    import struct

    import pandas as pd
    from conftest import free_port, scrape, wait_for
    from testbed import scenario, topology
    from testbed.auth import Channel, new_key
    from testbed.cluster import local
    m0, m1 = local.machine_address(0), local.machine_address(1)
    port = free_port()
    out = tmp_path / "attacked"
    sniffer = _Sniffer(local.machine_ns(1), m1, m0)             # m1's datagrams to m0 (the floods, VXLAN aside)
    t_start = time.monotonic()
    proc = subprocess.Popen([*TESTBED, "run", "scenarios/link-failure.yaml", "--cluster", "auto", "--out", str(out),
                             "--metrics", str(port), "--set", "switch.routing=sm", "--set", "duration=4s",
                             "--set", "placement.strategy=manual", "--set",
                             "placement.assign={leaf0: 1, spine1: 1, leaf1: 0, spine0: 0, spine2: 0, spine3: 0}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def helpers() -> dict[str, dict[str, int]]:
            return {st["name"][-2:]: {h["name"]: h["pid"] for h in st.get("helpers", [])} for st in _part_labs()}
        # the parts built, the SM has programmed m1 (the exporters start after that), the driver serves metrics
        assert wait_for(lambda: proc.poll() is None and all(
            "metrics-exporter" in h for h in helpers().values()) and len(helpers()) == 2, 120, 0.1), \
            "the parts were not built"
        hs = helpers()
        sm_flood = next(a for a in _bound_sockets(hs["m0"]["subnet-manager"])["udp"] if a[0] == m0)
        (tables,) = _bound_sockets(hs["m1"]["subnet-manager"])["tcp"]
        (exporter,) = _bound_sockets(hs["m1"]["metrics-exporter"])["tcp"]
        assert wait_for(lambda: ("127.0.0.1", port) in _bound_sockets(proc.pid)["tcp"], 30, 0.1)
        assert not [a for a in _bound_sockets(proc.pid)["tcp"] if a[1] == port and a[0] != "127.0.0.1"]
        assert tables[0] == exporter[0] == m1

        # (a) forged tables: every destination at m1's switches into the leaf0–spine1 link
        topo = topology.build(scenario.load("scenarios/link-failure.yaml").topology)
        dead = {p.node: p.ifindex for sw in ("leaf0", "spine1") for p in topo.ports[sw]
                if {p.node, p.peer_node} == {"leaf0", "spine1"}}
        forged = json.dumps({"put": [[sw, topo.address(h), [dead[sw]]] for sw in dead for h in topo.hosts],
                             "del": []}).encode()
        for line in (forged + b"\n", Channel(new_key(), "tables").seal(forged) + b"\n"):
            with socket.create_connection(tables, timeout=5) as c:
                c.sendall(line)
                c.settimeout(0.5)
                with pytest.raises(socket.timeout):                   # never answered
                    c.recv(4096)
        with socket.create_connection(tables, timeout=5) as c:         # half a line, then a reset
            c.sendall(Channel(new_key(), "tables").seal(forged)[:200])
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        # (c) altered metrics: m1 up, then dropped twice (altered, replayed), up again without the proxy
        def m1_up() -> float:
            got = scrape(f"127.0.0.1:{port}")
            up = {dict(ls)["machine"]: v for (n, ls), v in got.items() if n == "ftb_machine_up"}
            assert up["m0"] == 1.0, up
            return up["m1"]
        with _MetricsMitm(exporter) as mitm:
            seen = [m1_up() for _ in mitm.ACTS]
        seen.append(m1_up())
        assert mitm.done == list(mitm.ACTS) and seen == [1.0, 0.0, 0.0, 1.0], (mitm.done, seen)

        # (b) the replayed flood: m1's last flood saying the link is down, once m1 has flooded it up again
        def floods() -> list[tuple[bytes, bytes, dict]]:
            return [(ip, data, json.loads(data.partition(b" ")[2])) for ip, dport, data in list(sniffer.got)
                    if dport == sm_flood[1]]
        assert wait_for(lambda: any(f["down"] for *_, f in floods()) and not floods()[-1][2]["down"], 60, 0.02), \
            [f for *_, f in floods()]
        most = max(len(f["down"]) for *_, f in floods())       # (the ports go down and up one by one)
        ip, data, claim = next(f for f in reversed(floods()) if len(f[2]["down"]) == most)
        assert set(claim["down"]) == {dead["leaf0"], dead["spine1"]}
        t_replay = time.monotonic() - t_start
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:     # from this process's own socket
            s.sendto(data, sm_flood)
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as s:    # the very packet
            s.sendto(_on_the_wire(ip), (m0, 0))
        assert proc.poll() is None, "the run ended before the replay"
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        sniffer.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - t_start
    assert proc.returncode == 0, stderr
    m = json.loads((out / "manifest.json").read_text())
    routing, metrics = m["routing"], m["metrics"]
    sm, fail, flows = (pd.read_csv(out / f) for f in ("sm.csv", "failures.csv", "flows.csv"))
    print(f"\n[attacked] run {took:.1f} s, replay at {t_replay:.1f} s; routing.rejected {routing['rejected']}, "
          f"metrics.rejected {metrics['rejected']}, missed {metrics['missed']}; sm.csv {list(sm['kind'])}; "
          f"rerouted_ms {[round(x * 1e3, 2) for x in fail['rerouted_s']]}; flows lost {flows['lost'].tolist()}; "
          f"altered {mitm.altered}")
    assert routing["rejected"] == {"forged": 3, "replayed": 2}      # 2 forged tables + 1 cut short; 2 replays
    assert metrics["rejected"] == {"forged": 2, "replayed": 0}      # a stale reply's nonce is another's: forged
    assert metrics["missed"] == {"m0": 0, "m1": 2} and metrics["address"] == str(port)
    assert any("m1's reply to 2 of" in d and "did not verify" in d for d in m["degradations"]), m["degradations"]
    # routed as unattacked: only the real events' sweeps — the link's two ends down, then up, each end once (in
    # two sweeps, or three or four when one end's flood from m1 missed the sweep that took the other: seen
    # beside the FTB_STRESS hog), each within a sweep interval plus the exchange; every packet lost was lost to
    # them (what a flow sent meanwhile into the dead port or the rewritten tables), every flow delivered its
    # rate — forged tables would have black-holed whole flows
    sweeps = sm[sm["kind"] == "sweep"]
    ends = [f"{sw}/{topo.port(dead[sw]).ifname}" for sw in ("leaf0", "spine1")]
    assert list(sm["kind"])[0] == "initial" and 2 <= len(sweeps) <= 4 and len(routing["changes"]) == len(sm)
    changes = sorted(t for p in sweeps["ports"] for t in p.split())
    assert changes == sorted(f"{e}:{s}" for e in ends for s in ("down", "up")), list(sweeps["ports"])
    assert len(fail) == 2 and fail["rerouted_s"].notna().all() and (fail["rerouted_s"] < 0.010 + 0.05).all()
    assert len(flows) == 8 and flows["lost"].sum() == fail["lost_packets"].sum()
    assert (flows["lost"] <= 1.2 * PKT_RATE * fail["rerouted_s"].max() + 4).all()
    assert (flows["goodput_mbps"] > 0.9 * 4.0).all(), flows["goodput_mbps"].tolist()


def test_container_hosts_on_both_machines_carry_a_permutation_and_are_removed(cluster, tmp_path):
    """hosts.docker over 2 machines: each machine's part starts its own hosts' containers (named after its part's
    lab) and runs their traffic agents inside them (the agents' mount and network namespaces are their
    containers'); the permutation crosses the cut and every flow delivers, the manifest names every host's
    container, and no container of the run is left afterwards."""
    from conftest import processes_named, wait_for
    from testbed.container.daemon import DockerError, client
    try:
        docker = client(log=print)
    except DockerError as e:
        pytest.skip(f"Docker cannot run here: {e}")
    out = tmp_path / "docker"
    proc = subprocess.Popen([*TESTBED, "run", "scenarios/default.yaml", "--cluster", "auto", "--out", str(out),
                             "--set", "placement.partitions=2", "--set", "hosts.docker.image=fabric-testbed/host",
                             "--set", "duration=3s", "--set", "topology.spines=2", "--set", "topology.hosts_per_leaf=2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    inside: dict[str, bool] = {}
    try:
        def agents() -> dict[int, tuple[str, str]]:
            """pid → (part lab, host) of the run's traffic agents."""
            return {pid: tuple(comm[len("ftb-"):].rsplit("-", 1)) for pid, comm in processes_named("ftb-c").items()
                    if comm.rsplit("-", 1)[-1].startswith("h")}
        seen: dict = {}
        assert wait_for(lambda: seen.update(agents()) or len({h for _, h in seen.values()}) == 4, 90, 0.02)
        for pid, (lab, host) in seen.items():
            try:
                ctr = docker.containers.get(f"ftb-{lab}-{host}").attrs["State"]["Pid"]
                inside[host] = all(os.readlink(f"/proc/{pid}/ns/{k}") == os.readlink(f"/proc/{ctr}/ns/{k}")
                                   for k in ("mnt", "net"))
            except FileNotFoundError:        # nsenter's parent half, or an agent that just ended
                continue
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert inside == {"h0": True, "h1": True, "h2": True, "h3": True}, inside
    m = json.loads((out / "manifest.json").read_text())
    labs = {n["machine"]: n["lab"] for n in m["cluster"]["nodes"]}
    hosts, on = m["docker"]["hosts"], m["cluster"]["partition"]
    assert sorted(hosts) == ["h0", "h1", "h2", "h3"] and {on[h] for h in hosts} == {"m0", "m1"}
    for h, d in hosts.items():
        assert d["agent"] == "container" and d["container"] == f"ftb-{labs[on[h]]}-{h}"
    flows = _rows(out / "flows.csv")                  # UDP at line rate: ECMP collisions lose packets, as always
    crossing = [f for f in flows if on[f["src"]] != on[f["dst"]]]
    assert len(flows) == 4 and crossing and all(int(f["bytes"]) > 0 for f in flows)
    assert [c.name for lab in labs.values()
            for c in docker.containers.list(all=True, filters={"label": f"fabric-testbed={lab}"})] == []


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
