"""Failures and SM routing on real fabrics (namespaces, veths, TBF, the eBPF switch program, the routing agent
and the failure scheduler as forked processes).

- ftree on a shift permutation over a fat-tree k=4 puts exactly one flow on every edge uplink (the datapath's
  per-flow path counters); ECMP on the same flows collides for most hash seeds.
- A link goes down and up twice in the middle of paced UDP traffic: under distributed routing (local fast
  failover + reroute of the other leaves) and under SM routing (a sweep every 10 ms, and every 100 ms) every
  flow recovers, the packets lost are about what the flows sent into the dead link until the reroute, and the
  SM's reroute time grows with its sweep interval.
"""
from __future__ import annotations

import math
from collections import Counter

import pandas as pd
import pytest

from testbed import runner, scenario

from conftest import guarded_run, make_scenario, udp_send

pytestmark = pytest.mark.e2e

RATE_BPS = 4_000_000                      # per flow: 8 flows never congest a 20 Mbit/s uplink, even all on one
PKT_RATE = RATE_BPS / 8 / 1500            # ≈ 333 packets/s
# Event times 0.6 s + k·0.6275 s: their phases against a sweep of 100 ms fall 27.5 ms apart, against one of
# 10 ms 2.5 ms apart, so whatever the SM's own phase, the events meet it spread over one interval (with times
# on a round grid every event would meet the sweep at the same point, always just before or just after it).
EVENTS = [{"at": f"{0.6 + k * 0.6275:.4f}s", "link": ["leaf0", "spine1"], "state": "down" if k % 2 == 0 else "up"}
          for k in range(4)]


def _doc(switch: dict) -> dict:
    return {"name": "linkdown", "seed": 3, "duration": "3s",
            "topology": {"spines": 4, "leaves": 2, "hosts_per_leaf": 4,
                         "host_link": {"rate": "20mbit", "buffer": "64KB"},
                         "fabric_link": {"rate": "20mbit", "buffer": "64KB"}},
            "switch": switch, "traffic": {"engine": "udp", "pattern": "permutation", "rate": "4mbit"},
            "failures": EVENTS, "telemetry": {"interval": "100ms"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs of the same traffic and failures: distributed, SM every 10 ms, SM every 100 ms."""
    out = {}
    for name, switch in [("distributed", {}),
                         ("sm10", {"routing": "sm", "sm": {"engine": "ftree", "sweep_interval": "10ms"}}),
                         ("sm100", {"routing": "sm", "sm": {"engine": "ftree", "sweep_interval": "100ms"}})]:
        d, row = guarded_run(scenario.from_dict(_doc(switch)), tmp_path_factory.mktemp(name) / "run")
        fail = pd.read_csv(d / "failures.csv")
        flows = pd.read_csv(d / "flows.csv")
        print(f"[{name}] rerouted_ms {[round(x * 1e3, 2) for x in fail['rerouted_s']]} "
              f"detected_ms {[round(x * 1e3, 2) for x in fail['detected_s']]} lost {list(fail['lost_packets'])} "
              f"flows lost {int(flows['lost'].sum())} summary lost {row['failure_lost_packets']} "
              f"reroute_ms_max {row['reroute_ms_max']:.2f}")
        out[name] = (d, row, fail, flows)
    return out


@pytest.mark.parametrize("name", ["distributed", "sm10", "sm100"])
def test_traffic_recovers_from_a_link_going_down_with_bounded_loss(runs, name):
    d, row, fail, flows = runs[name]
    assert len(fail) == 4 and fail["time_s"].notna().all(), "every event applied"
    # applied on time: at is counted from the traffic's t0 (the flows' start)
    t0 = flows["start_s"].min()
    assert (fail["time_s"] - t0 - fail["at_s"]).abs().max() < 0.05
    assert fail["detected_s"].notna().all() and fail["rerouted_s"].notna().all()
    assert (fail["detected_s"] <= fail["rerouted_s"]).all()
    interval = {"distributed": 0.0, "sm10": 0.010, "sm100": 0.100}[name]
    assert fail["rerouted_s"].max() < interval + 0.05, fail["rerouted_s"].tolist()
    if name == "distributed":           # a notification, not a sweep: well under a millisecond or a few
        assert fail["detected_s"].max() < 0.01
    # loss: what the flows crossing the link sent until the reroute (at most all 8 flows: each leaf's 4 flows
    # may hash onto the one uplink, and 4 more come down through it), plus a queue's worth in flight
    for _, ev in fail[fail["change"] == "down"].iterrows():
        bound = 8 * PKT_RATE * ev["rerouted_s"] + 8
        assert ev["lost_packets"] <= bound, (ev["lost_packets"], bound)
    if name != "distributed":
        # ftree gives each of the link's directions exactly one flow (4 hosts per leaf over 4 spines): until the
        # sweep, those 2 flows lose what they send — measured loss within a few packets of rate × outage
        for _, ev in fail[fail["change"] == "down"].iterrows():
            expect = 2 * PKT_RATE * ev["rerouted_s"]
            assert abs(ev["lost_packets"] - expect) <= 0.3 * expect + 6, (ev["lost_packets"], expect)
    assert fail.loc[fail["change"] == "up", "lost_packets"].max() <= 2      # bringing a link up loses nothing
    assert row["failure_lost_packets"] == fail["lost_packets"].sum()
    assert math.isclose(row["reroute_ms_max"], fail["rerouted_s"].max() * 1e3)
    # … and every flow recovered: nothing else was lost, every flow delivered what it sent bar that
    assert flows["lost"].sum() == fail["lost_packets"].sum()
    # (a flow left on a dead path would lose a third of the run; one rerouted loses what it sent meanwhile)
    outage = fail.loc[fail["change"] == "down", "rerouted_s"].sum()
    assert (flows["lost"] <= 1.2 * PKT_RATE * outage + 4).all(), (flows["lost"].tolist(), outage)
    assert (flows["goodput_mbps"] > 0.9 * RATE_BPS / 1e6).all(), flows["goodput_mbps"].tolist()


def dead_link_queue_packets(d, at_s: float) -> float:
    """Full frames the two queues of the failing link (leaf0 → spine1, spine1 → leaf0) held at most in the
    telemetry interval around ``at_s`` (links.csv queue_bytes_max): what going down throws away."""
    links = pd.read_csv(d / "links.csv")
    tx = links[(links["direction"] == "tx") & (((links["switch"] == "leaf0") & (links["peer"] == "spine1"))
                                               | ((links["switch"] == "spine1") & (links["peer"] == "leaf0")))]
    around = tx[(tx["time_s"] - tx["interval_s"] <= at_s + 0.1) & (tx["time_s"] >= at_s - 0.1)]
    return around.groupby("switch")["queue_bytes_max"].max().sum() / 1514


def test_sm_loses_packets_until_its_sweep_and_distributed_hardly_any(runs):
    """SM routing has one port per destination: until the sweep re-routes, a dead port's packets are lost;
    the distributed side's leaf fails over at the notification, so it loses what the dead link held, ≤ 8
    packets in flight per event and what the flows sent until the reroute (a local run lost 6 against a
    bound of 25.9; a CI run lost 24 where the old fixed bound was 16). (The two down events meet a 100 ms
    sweep 55 ms apart in phase, so together they wait at least 45 ms for it.)"""
    lost = {n: runs[n][2].query("change == 'down'")["lost_packets"].sum() for n in runs}
    assert lost["sm100"] > lost["distributed"]
    d, _, fail, _ = runs["distributed"]
    bound = 0.0
    for _, ev in fail[fail["change"] == "down"].iterrows():
        bound += 8 + dead_link_queue_packets(d, ev["time_s"]) + 8 * PKT_RATE * ev["rerouted_s"]
    print(f"[distributed] lost {lost['distributed']}, bound {bound:.1f}")
    assert lost["distributed"] <= bound


def test_sm_reroute_time_grows_with_its_sweep_interval(runs):
    short = runs["sm10"][2]["rerouted_s"]
    long = runs["sm100"][2]["rerouted_s"]
    assert long.mean() > short.mean()
    # a change waits for the next sweep: on average half an interval, plus reading, computing and writing
    assert long.mean() / short.mean() >= 2.5, (long.tolist(), short.tolist())
    assert short.max() < 0.010 + 0.03 and long.max() < 0.100 + 0.03
    assert (runs["sm10"][2]["detected_s"] < 0.010 + 0.02).all()
    sm = pd.read_csv(runs["sm10"][0] / "sm.csv")
    assert sm["kind"].iloc[0] == "initial" and sm["entries"].iloc[0] == 6 * 8    # a /32 per switch and host
    # a sweep that saw one end of the link already rerouted (a link is down when either end is); one that then
    # saw the other end may have nothing left to write
    assert sm.loc[sm["kind"] == "sweep", "entries"].sum() > 0


def _flows_per_port(lab, flows, roles=("up", "spine-up")) -> Counter:
    """(switch, egress port) → flows that crossed it, from the datapath's per-flow path counters."""
    topo = lab.topo
    mine = {(topo.address(s), topo.address(d), sp) for s, d, sp in flows}
    out = Counter()
    for fp in lab.datapath.flow_paths():
        if (fp.saddr, fp.daddr, fp.sport) not in mine:
            continue
        for ifx, n in fp.packets.items():
            if n and topo.port(ifx).role in roles:
                out[(fp.switch, ifx)] += 1
    return out


def test_ftree_gives_a_shift_permutation_one_flow_per_uplink_and_ecmp_collides(lab):
    k4 = {"kind": "fat-tree", "k": 4, "host_link": {"rate": "20mbit"}, "fabric_link": {"rate": "20mbit"}}
    hosts = [f"h{i}" for i in range(16)]
    flows = [(h, hosts[(i + 4) % 16], 30000 + i) for i, h in enumerate(hosts)]     # to the same slot one pod over

    sm = lab(make_scenario(topology=k4, switch={"routing": "sm", "sm": {"engine": "ftree"}}))
    for s, d, sp in flows:
        udp_send(sm, s, d, 20, sport=sp)
    per = _flows_per_port(sm, flows)
    uplinks = [(leaf, p.ifindex) for leaf in sm.topo.switches if leaf.startswith("leaf")
               for p in sm.topo.uplinks(leaf)]
    assert [per[u] for u in uplinks] == [1] * 16, "every edge uplink carries exactly one flow"
    assert max(per.values()) == 1, "and no spine→core link more than one"
    assert sm.datapath.drop_counters()["no_route"] == 0

    ecmp = lab(make_scenario(topology=k4))
    collided = []
    for seed in range(1, 6):
        ecmp.datapath.set_mode(scenario.SwitchSpec(hash_seed=seed))
        ecmp.datapath.clear_flows()
        for s, d, sp in flows:
            udp_send(ecmp, s, d, 20, sport=sp)
        per = _flows_per_port(ecmp, flows, roles=("up",))
        collided.append(max(per.values()))
    print(f"[ftree vs ecmp] busiest uplink per hash seed (ECMP): {collided}; ftree: 1")
    assert sum(c > 1 for c in collided) >= 4, collided


def test_a_restored_uplink_carries_its_destinations_again_under_sm_minhop(tmp_path):
    """leaf0–spine0 goes down and comes back: the SM recomputes from scratch on the return (as OpenSM), so the
    destinations minhop routes over that uplink in the healthy fabric are routed over it again. Kept on their
    failed-state ports instead, the restored link would carry nothing (tests/routing/test_sm_engines.py)."""
    from testbed import topology
    from testbed.routing import algorithms
    k4 = {"kind": "fat-tree", "k": 4, "host_link": {"rate": "20mbit"}, "fabric_link": {"rate": "20mbit"}}
    topo = topology.build(scenario.from_dict({"topology": k4}).topology)
    healthy = algorithms.compute("minhop", algorithms.graph(topo))
    uplink = next(p for p in topo.ports["leaf0"] if p.peer_node == "spine0")
    remote = [h for h in topo.hosts if h not in ("h0", "h1")
              and healthy[("leaf0", topo.address(h))][0] == uplink.ifindex]
    assert len(remote) == 7                          # half of leaf0's 14 remote destinations
    pairs = [["h0" if i % 2 else "h1", h] for i, h in enumerate(remote[:4])]
    doc = {"name": "smreturn", "duration": "2s", "topology": k4,
           "switch": {"routing": "sm", "sm": {"engine": "minhop", "sweep_interval": "10ms"}},
           "traffic": {"engine": "udp", "pattern": "pairs", "pairs": pairs, "rate": "2mbit"},
           "failures": [{"at": "0.3s", "link": ["leaf0", "spine0"], "state": "down"},
                        {"at": "0.8s", "link": ["leaf0", "spine0"], "state": "up"}],
           "telemetry": {"interval": "100ms"}}
    d, _row = runner.run(scenario.from_dict(doc), tmp_path / "run")
    fail = pd.read_csv(d / "failures.csv")
    up = fail[fail["change"] == "up"].iloc[0]
    back, t0 = float(up["time_s"]), float(up["time_s"] - up["at_s"])    # the return, the traffic's start
    links = pd.read_csv(d / "links.csv")
    port = links[(links["switch"] == "leaf0") & (links["peer"] == "spine0") & (links["direction"] == "tx")]
    after = port[(port["time_s"] > back + 0.2) & (port["time_s"] <= t0 + 1.9)]
    seconds = float(after["interval_s"].sum())
    sent = float(after["bytes"].sum())
    print(f"[sm return] leaf0→spine0 after the return: {sent * 8 / seconds / 1e6:.2f} Mbit/s over {seconds:.2f} s "
          f"(4 flows × 2 Mbit/s routed there when healthy)")
    assert seconds > 0.5
    assert sent * 8 / seconds > 0.8 * 4 * 2e6      # the four flows are back on the restored uplink
