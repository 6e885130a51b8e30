"""End-to-end static WCMP: real namespaces, shaped links, the eBPF switch. leaf0's uplink to spine0 has
`topology.links` weight 3, the other three weight 1: per packet (and per flowlet over many flows) leaf0's
uplinks carry bytes 3:1:1:1, where ECMP/spray would split them evenly."""
from __future__ import annotations

import pytest

from testbed import workloads

from conftest import guarded_run, make_scenario, run_had

pytestmark = pytest.mark.e2e

WEIGHTS = {"spine0": 3, "spine1": 1, "spine2": 1, "spine3": 1}


def uplink_bytes(lab, granularity, flows=1, rate=24e6):
    link = {"rate": "40mbit", "buffer": "256KB"}
    scen = make_scenario(topology={"spines": 4, "leaves": 2, "hosts_per_leaf": 1, "host_link": link,
                                   "fabric_link": link,
                                   "links": [{"between": ["leaf0", s], "weight": w} for s, w in WEIGHTS.items()]},
                         switch={"load_balancing": "wcmp", "wcmp": {"granularity": granularity},
                                 "flowlet_timeout": "200us"})
    lb = lab(scen)
    t = lb.topo
    fl = [workloads.Flow(i, "h0", "h1", t.address("h0"), t.address("h1"), 30000 + i, 5001, "udp", None,
                         int(rate / flows), 0.0) for i in range(flows)]
    before = lb.datapath.port_counters()
    # small packets, many draws: ~40k packets, so a 1/6 share's sampling error (1σ ≈ 1.1 % of it) sits far
    # inside the 5 % asserted
    res = workloads.run(fl, lambda h: lb.fabric.ns[h], 3.0, 200)
    after = lb.datapath.port_counters()
    ups = {p.peer_node: p.ifindex for p in t.uplinks("leaf0")}
    out = {s: after[i].tx_bytes - before[i].tx_bytes for s, i in ups.items()}
    lb.close(force=True)
    return out, res


@pytest.mark.parametrize("granularity,flows", [("packet", 1), ("flowlet", 16)])
def test_static_wcmp_splits_bytes_by_weight(lab, granularity, flows):
    out, res = uplink_bytes(lab, granularity, flows)
    total = sum(out.values())
    shares = {s: b / total for s, b in out.items()}
    print(f"\n[wcmp {granularity}, {flows} flow(s)] uplink shares {({s: round(v, 3) for s, v in shares.items()})}, "
          f"lost {sum(r.lost for r in res)}")
    assert total > 6_000_000                              # 3 s at 24 Mbit/s ≈ 9 MB
    for s, w in WEIGHTS.items():
        want = w / sum(WEIGHTS.values())
        assert abs(shares[s] - want) <= 0.05 * want, (s, shares[s], want)
    assert sum(r.lost for r in res) == 0


def _asymmetric(tmp_path, name, degrade_at=None, local=False, **switch):
    """scenarios/asymmetric-wcmp.yaml (spine0–leaf1 at 5 of 20 Mbit/s; 16 flows, 48 Mbit/s from leaf0 to leaf1) with
    `switch` overrides — or, with ``degrade_at``, a symmetric fabric whose spine0–leaf1 link drops to 5 Mbit/s
    then, or with ``local`` the slow link at the sending leaf (leaf0–spine0): (summary row, leaf0's uplink byte
    shares, weights.csv rows of leaf0, when the rate change was applied on the run's clock)."""
    import csv
    import json

    from testbed import scenario
    from conftest import ROOT
    doc = scenario.to_dict(scenario.load(ROOT / "scenarios" / "asymmetric-wcmp.yaml"), roundtrip=True)
    doc["switch"].update(switch)
    doc["duration"] = "3s"
    if local:
        doc["topology"]["links"] = [{"between": ["leaf0", "spine0"], "rate": "5mbit"}]
    if degrade_at is not None:
        doc["topology"]["links"] = []
        doc["failures"] = [{"at": degrade_at, "link": ["leaf1", "spine0"], "rate": "5mbit"}]
    d, row = guarded_run(scenario.from_dict(doc), tmp_path / name)
    m = json.loads((d / "manifest.json").read_text())
    applied = m["failures"][0]["applied"] if m.get("failures") else None
    up: dict[str, int] = {}
    with open(d / "links.csv") as f:
        for r in csv.DictReader(f):
            if r["switch"] == "leaf0" and r["direction"] == "tx" and r["role"] == "up":
                up[r["peer"]] = up.get(r["peer"], 0) + int(r["bytes"])
    weights = []
    if (d / "weights.csv").is_file():
        with open(d / "weights.csv") as f:
            weights = [r for r in csv.DictReader(f) if r["switch"] == "leaf0"]
    return row, {s: b / sum(up.values()) for s, b in up.items()}, weights, applied


def test_measured_wcmp_moves_traffic_off_a_slow_path(tmp_path):
    """Spray puts a quarter of every flow on the slow path (it carries 5 of the 12 Mbit/s offered: loss); WCMP
    with weights from INT path delays or from port loads keeps it low, loses (nearly) nothing and delivers more
    than spray and ECMP on the same traffic; so does DLB when the slow link is the sending leaf's own."""
    spray, s_sh, _, _ = _asymmetric(tmp_path, "spray", load_balancing="spray")
    ecmp, _, _, _ = _asymmetric(tmp_path, "ecmp", load_balancing="ecmp")
    out = {source: _asymmetric(tmp_path, source, load_balancing="wcmp",
                               wcmp={"source": source, "granularity": "packet", "interval": "10ms"})[:2]
           for source in ("int", "load")}
    dlb_remote = _asymmetric(tmp_path, "dlb", load_balancing="dlb")[:2]
    out["dlb"] = _asymmetric(tmp_path, "dlb-local", local=True, load_balancing="dlb")[:2]
    print(f"\n[asymmetric] spray goodput {spray['goodput_mbps']:.1f} lost {spray['lost_packets']} slow share "
          f"{s_sh['spine0']:.3f}; ecmp {ecmp['goodput_mbps']:.1f} lost {ecmp['lost_packets']}; " + "; ".join(
              f"{k} {r['goodput_mbps']:.1f} lost {r['lost_packets']} slow share {sh['spine0']:.3f}"
              for k, (r, sh) in out.items())
          + f"; dlb with the slow link at spine0–leaf1 {dlb_remote[1]['spine0']:.3f}")
    assert 0.23 <= s_sh["spine0"] <= 0.27 and spray["lost_packets"] > 1000
    # DLB judges leaf0's own ports: a slow link one hop further is invisible to it (it splits as spray does)
    assert 0.23 <= dlb_remote[1]["spine0"] <= 0.27
    for source, (row, sh) in out.items():
        assert sh["spine0"] <= 0.125, (source, sh)
        assert row["lost_packets"] <= 0.01 * spray["lost_packets"] + 50, (source, row["lost_packets"])
        assert row["goodput_mbps"] >= spray["goodput_mbps"] + 2.0 and row["goodput_mbps"] >= ecmp["goodput_mbps"]


@pytest.mark.parametrize("source", ["int", "load"])
def test_measured_wcmp_reacts_to_a_link_degraded_mid_run_within_a_few_intervals(tmp_path, source):
    """The spine0–leaf1 link drops from 20 to 5 Mbit/s 1 s into the traffic: the controller takes spine0's weight
    at leaf0 from its equal share (1/4) to at most 1/8 within a few 10 ms intervals."""
    row, sh, w, applied = _asymmetric(tmp_path, source, degrade_at="1s", load_balancing="wcmp",
                                      wcmp={"source": source, "granularity": "packet", "interval": "10ms"})
    before = [float(r["weight"]) for r in w if r["next_hop"] == "spine0" and applied - 0.3 < float(r["time_s"]) < applied]
    low = [float(r["time_s"]) for r in w if r["next_hop"] == "spine0" and float(r["time_s"]) > applied
           and float(r["weight"]) <= 0.125]
    react = low[0] - applied if low else None
    print(f"\n[wcmp {source} degraded] spine0 weight before {min(before):.3f}–{max(before):.3f}, ≤ 1/8 after "
          f"{react if react is None else round(react * 1e3, 1)} ms; lost {row['lost_packets']}")
    # near equal before the change: lowest 0.235–0.244 on a quiet machine, 0.208–0.249 over 16 runs beside
    # stress-ng --cpu 1 --cpu-load 50, 0.199994 once in a suite run beside it (the load source's EWMA)
    assert min(before) >= 0.19
    assert react is not None and react <= 0.15, react   # 24–53 ms typical, 101 ms once in 8 runs (load's EWMA)


def test_flowlet_int_wcmp_lifts_a_permutation_above_90_percent(tmp_path):
    """scenarios/int-wcmp-permutation.yaml, the vendors' claim: flowlets + INT-based WCMP use ≥ 0.9 of the
    uplinks over the traffic window where ECMP's collisions leave ~0.73 (0.904–0.919 vs 0.722–0.725, seeds 1–3)."""
    from testbed import scenario
    from conftest import ROOT
    scen = scenario.load(ROOT / "scenarios" / "int-wcmp-permutation.yaml")
    _, wcmp = guarded_run(scen, tmp_path / "wcmp")
    _, ecmp = guarded_run(scen.model_copy(update={"switch": scen.switch.model_copy(update={"load_balancing": "ecmp"})}),
                          tmp_path / "ecmp")
    print(f"\n[int wcmp permutation] util wcmp {wcmp['mean_uplink_util']:.3f} (imbalance "
          f"{wcmp['uplink_imbalance']:.2f}, lost {wcmp['lost_packets']}), ecmp {ecmp['mean_uplink_util']:.3f} "
          f"(imbalance {ecmp['uplink_imbalance']:.2f}); cpu_bound {wcmp['cpu_bound']}/{ecmp['cpu_bound']}")
    # (the CPU guard flagged the WCMP run once in a full-suite run, its utilisation still 0.925; with balanced
    # uplinks few samples are backlogged, so a couple of starved ones pass the guard's 5 %: not asserted)
    # (of the time the hypervisor left the run: the shapers stop while it steals)
    assert wcmp["mean_uplink_util"] >= 0.88 * run_had(wcmp) and ecmp["mean_uplink_util"] <= 0.76
