"""Adaptive entropy, pure: the Adapter moves flows off failed, overloaded and queueing links to the paths the
real hash gives their new ports, holds a moved flow, and leaves a healthy plan alone."""
from __future__ import annotations

from testbed import scenario, topology
from testbed.controller import PathModel, PlanFlow, Planner
from testbed.controller.adaptive import HOLD, Adapter


def _setup(spines=4, hosts_per_leaf=2, rate=None):
    scen = scenario.from_dict({"topology": {"spines": spines, "leaves": 2, "hosts_per_leaf": hosts_per_leaf}})
    topo = topology.build(scen.topology)
    hs = topo.hosts
    n = len(hs) // 2
    flows = [PlanFlow(i, h, topo.address(h), topo.address(hs[n + i]), 5001, rate_bps=rate or 1e7)
             for i, h in enumerate(hs[:n])]
    pl = Planner(PathModel(topo, scen.switch.hash_seed))
    pl.plan(flows)
    return topo, pl, Adapter(pl, {f.key: f for f in flows}), flows


def _rates(topo):
    return {p.ifindex: p.rate_bps for sw in topo.switches for p in topo.ports[sw]}


def _uplink(topo, pl, key):
    """The flow's leaf uplink (the second egress of its path)."""
    return pl.chosen[key][1][1]


def test_a_healthy_plan_is_left_alone():
    topo, pl, ad, _ = _setup()
    before = {k: v[0] for k, v in pl.chosen.items()}
    for _ in range(5):
        assert ad.tick(set(), _rates(topo), {}) == []
    assert {k: v[0] for k, v in pl.chosen.items()} == before


def test_a_flow_on_a_failed_link_is_moved_to_a_live_path_at_once():
    topo, pl, ad, flows = _setup()
    up = _uplink(topo, pl, 0)
    spine_end = topo.port(up).peer_ifindex
    moves = ad.tick({spine_end}, _rates(topo), {})         # the upper end went down (the scheduler's way)
    assert [(k, why) for k, _, why in moves] == [(0, "failure")]
    new_path = pl.model.path(flows[0], moves[0][1])
    assert up not in new_path and spine_end not in new_path
    assert pl.chosen[0][1] == new_path


def test_a_degraded_link_loses_its_flow_and_the_flow_is_held():
    """leaf0's uplink of flow 0 drops to a quarter of the flow's rate: its planned load is 4x the link; a free
    path exists (4 spines, 2 flows per leaf), so flow 0 moves there, and stays there for HOLD ticks."""
    topo, pl, ad, flows = _setup()
    up = _uplink(topo, pl, 0)
    rates = _rates(topo)
    rates[up] = flows[0].rate_bps / 4
    moves = ad.tick(set(), rates, {})
    assert [(k, why) for k, _, why in moves] == [(0, "load")]
    assert up not in pl.chosen[0][1] and pl.shared_links() == 0
    assert all(ad.tick(set(), rates, {}) == [] for _ in range(HOLD + 2))


def test_a_queue_the_plan_does_not_explain_moves_one_flow_when_a_path_has_room():
    topo, pl, ad, _ = _setup()
    up = _uplink(topo, pl, 1)
    moves = ad.tick(set(), _rates(topo), {up: topo.port(up).buffer_bytes})
    assert [(k, why) for k, _, why in moves] == [(1, "queue")]
    assert up not in pl.chosen[1][1]


def test_an_ended_flow_frees_its_links():
    topo, pl, ad, _ = _setup()
    path = pl.chosen[0][1]
    ad.end(0)
    assert 0 not in pl.chosen and not any(0 in pl.users.get(p, ()) for p in path)
