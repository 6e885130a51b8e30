"""Collectives that read the network, pure: the signals two counter readings give (hand-computed), a view's
available rates, the weighted-split policy over the fabric's real hashes, the host's decision channel, the
schedule's operations and the scenario's one-line refusals."""
from __future__ import annotations

import os
import socket
import time

import pytest

from testbed import scenario, topology
from testbed.workloads import collective_channel as channel
from testbed.collective.policy import Operation, OpFlow, get_policy
from testbed.collective.decider import scheduled_operations, wire_ratio
from testbed.collective.view import LinkSignals, NetworkView, PortReading, signals_between
from testbed.collective.weighted_split import WeightedSplit
from testbed.controller import PathModel, PlanFlow
from testbed.spec_types import ScenarioError

DEGRADED = "scenarios/codesign-degraded.yaml"


def _reading(at, tx, packets, depth_sum, ect, marks, cap=10e6, buf=100_000):
    return PortReading(at, tx, packets, depth_sum, ect, marks, cap, buf)


def test_signals_over_a_span_by_hand():
    """0.5 s at 10 Mbit/s: 250,000 bytes sent (2 Mbit) of which 1 Mbit the operation's own → util
    (2e6 − 1e6) / (10e6 × 0.5) = 0.2; 100 packets saw 20,000 bytes each of a 100,000-byte buffer → queue 0.2;
    20 of 80 ECN-capable packets marked → ecn 0.25."""
    s = signals_between(_reading(10.0, 1000, 5, 500, 10, 1), _reading(10.5, 251_000, 105, 2_000_500, 90, 21),
                        own_bits=1e6)
    assert s == LinkSignals(10e6, pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.25))
    assert signals_between(_reading(0, 0, 0, 0, 0, 0), _reading(1, 0, 0, 0, 0, 0)) == LinkSignals(10e6)
    assert signals_between(_reading(0, 0, 0, 0, 0, 0), _reading(1, 0, 0, 0, 0, 0), down=True).capacity_bps == 0
    # the operation's own bits larger than what the port sent (headers estimated high): no negative load
    assert signals_between(_reading(0, 0, 0, 0, 0, 0), _reading(1, 100, 0, 0, 0, 0), own_bits=1e6).util == 0


def _fabric(path=DEGRADED, sets=()):
    scen = scenario.load(path, list(sets))
    topo = topology.build(scen.topology)
    return scen, topo, PathModel(topo, scen.switch.hash_seed, scen.switch.hash_fields)


def _view(topo, model, signals=("util", "queue"), **override):
    links = {p.ifindex: LinkSignals(float(p.rate_bps)) for sw in topo.switches for p in topo.ports[sw]}
    links.update(override)
    return NetworkView(model, links, signals)


def test_available_rate_is_capacity_times_each_asked_signal():
    _, topo, model = _fabric()
    up = topo.uplinks("leaf1")[0].ifindex
    v = _view(topo, model, ("util", "queue"), **{})
    v.links[up] = LinkSignals(10e6, util=0.25, queue=0.5, ecn=0.5)
    assert v.available_bps(up) == pytest.approx(10e6 * 0.75 * 0.5)          # ecn not asked for: ignored
    v.links[up] = LinkSignals(10e6, util=1.0)
    assert v.available_bps(up) == pytest.approx(1e6)                         # a signal takes at most 90 %
    nic = topo.port_named("h0", "eth0")
    assert v.available_bps(nic.ifindex) == nic.rate_bps                      # no counter: its line rate
    assert v.path_bps([nic.ifindex, up]) == pytest.approx(1e6)


def _slow(topo):
    return {p.ifindex for n in ("leaf0", "spine1") for p in topo.ports[n] if {p.node, p.peer_node} == {"leaf0", "spine1"}}


def test_weighted_split_takes_the_flows_off_the_slow_link_of_codesign_degraded():
    """seed 3: the ring's h0→h2 and h1→h3 each have one of their 2 QPs up leaf0–spine1 (2.5 of 10 Mbit/s);
    the policy sends every flow of those connections on the other QP, and no flow on the slow link."""
    scen, topo, model = _fabric()
    _, ops = scheduled_operations(scen, topo)
    assert sorted(ops) == ["ring.0", "ring.1", "ring.2"]
    op, view, slow = ops["ring.0"], _view(topo, model), _slow(topo)
    assert len(op.flows) == 2 * 3 * 4 * 2                   # 2(N−1) steps × 4 ring edges × 2 QPs
    on_slow = [f for f in op.flows if set(view.path(f.plan, f.sport)) & slow]
    assert {f.conn[:2] for f in on_slow} == {("h0", "h2"), ("h1", "h3")} and len(on_slow) == 12
    moved = WeightedSplit().decide(op, view)
    assert not [f for f in op.flows if set(view.path(f.plan, moved.get(f.flow_id, f.sport))) & slow]
    qps = op.qp_ports()
    assert all(sp in qps[f.conn] and sp != f.sport for f in op.flows if (sp := moved.get(f.flow_id)))
    assert {f.flow_id for f in on_slow} <= set(moved)


def test_weighted_split_leaves_a_fabric_without_collisions_alone():
    """Two connections whose QPs' paths share nothing but their own NICs: nothing to gain, nothing moved."""
    scen, topo, model = _fabric(sets=["topology.links=[]"])
    view = _view(topo, model)
    hs = topo.hosts
    flows, conns = [], {}
    for c, (a, b) in enumerate([(hs[0], hs[2]), (hs[1], hs[3])]):
        plan = PlanFlow(c, a, topo.address(a), topo.address(b), 4791)
        ports, paths, sp = [], set(), 50000 + 100 * c
        while len(ports) < 2:                  # 2 QPs on 2 distinct uplinks that the other connection leaves free
            up = view.path(plan, sp)[1]
            if up not in paths and up not in {u for cs in conns.values() for u in cs}:
                ports.append(sp)
                paths.add(up)
            sp += 1
        conns[c] = paths
        flows += [OpFlow(10 * c + q, 0, 32768, p, plan, (a, b, 0)) for q, p in enumerate(ports)]
    op = Operation("j.0", "j", 0, "allreduce", flows)
    assert WeightedSplit().decide(op, view) == {}


def test_weighted_split_is_registered_and_refuses_one_qp():
    assert get_policy("weighted-split") is WeightedSplit
    with pytest.raises(ScenarioError, match=r"adapt.policy: weighted-split .* traffic.qps_per_connection 1"):
        scenario.load(DEGRADED, ["traffic.qps_per_connection=1"])


@pytest.mark.parametrize("sets,match", [
    (["traffic.collective.adapt.policy=ring-nope"], r"traffic.collective.adapt.policy: unknown collective policy"),
    (["traffic.collective.adapt.signals=[util,util]"], r"traffic.collective.adapt.signals: a signal is named twice"),
    (["traffic.collective.adapt.signals=[ecn]"], r"traffic.collective.adapt.signals: ecn is read from the switches"),
    (["traffic.collective.adapt.signals=[int]"], r"traffic.collective.adapt.signals: int is read from the INT reports"),
    (["traffic.collective.adapt.signals=[]"], r"traffic.collective.adapt.signals"),
    (["switch.load_balancing=spray"], r"traffic.collective.adapt.policy: .* switch.load_balancing spray"),
    (["switch.routing=sm"], r"traffic.collective.adapt.policy: under switch.routing sm"),
    (["traffic.engine=tcp"], r"traffic.collective.adapt: the udp and roce engines"),
    (["traffic.roce.entropy=packet"], r"traffic.collective.adapt: a policy gives each QP one source port"),
    (["traffic.jobs=[]", "traffic.pattern=permutation", "traffic.qps_per_connection=1"],
     r"traffic.collective.adapt: decides the operations"),
    (["controller.entropy=adaptive"], r"controller.entropy: a collective.s or replay.s queue pairs are planned"),
    (["traffic.collective.adapt.interval=0"], r"traffic.collective.adapt.interval"),
])
def test_bad_adapt_keys_are_one_line_errors(sets, match):
    with pytest.raises(ScenarioError, match=match) as e:
        scenario.load(DEGRADED, sets)
    assert "\n" not in str(e.value)


def test_flows_of_adapted_operations_name_them_and_keep_their_qp_ports():
    scen, topo, _ = _fabric()
    flows, ops = scheduled_operations(scen, topo)
    assert {f.adapt for f in flows} == set(ops)
    for op in ops.values():                             # every step of every iteration uses the same 2 QP ports
        assert all(len(p) == 2 for p in op.qp_ports().values())
    assert ops["ring.0"].qp_ports() == ops["ring.2"].qp_ports()
    static, _ = scheduled_operations(scenario.load(DEGRADED, ["traffic.collective.adapt=null"]), topo)
    assert static == []


def test_the_controller_plans_the_rings_queue_pairs_off_the_slow_link():
    """controller.entropy plan on codesign-degraded: the 8 QPs (4 ring edges × 2) are planned once each, every
    transfer on a QP gets its port, none crosses leaf0–spine1 (2.5 of 10 Mbit/s: 4× the utilisation of sharing
    a fast uplink), and the collective helper sees the same ports (one plan, computed by both helpers)."""
    from testbed.controller.connections import planned_run
    from testbed.workloads.replay import schedule_flows
    scen, topo, model = _fabric(sets=["controller.entropy=plan"])
    flows = schedule_flows(scen.traffic, topo, scen.seed)
    run = planned_run(scen, topo, flows)
    assert run.scheduled and len(run.known) == 8 and len(run.planner.chosen) == 8
    slow = _slow(topo)
    by_qp: dict = {}
    for f in flows:
        by_qp.setdefault((f.src, f.dst, f.rail, f.qp), set()).add(run.port(f.flow_id))
        assert not set(model.path(run.known[run.key_of[f.flow_id]], run.port(f.flow_id))) & slow
    assert len(by_qp) == 8 and all(len(p) == 1 for p in by_qp.values())
    _, ops = scheduled_operations(scen, topo)
    assert all(f.sport == run.port(f.flow_id) for op in ops.values() for f in op.flows)


def test_wire_ratio_counts_every_packets_headers():
    scen, topo, _ = _fabric()
    flows, _ = scheduled_operations(scen, topo)
    assert wire_ratio(flows[0], scen.packet_size) == pytest.approx((1024 + 14 + 28 + 12 + 4) / 1024)


class _Sender:
    def __init__(self, fid, variant=0):
        self.flow = {"flow_id": fid, "variant": variant}


def _helper(tmp_path):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "ccl.sock")
    srv.bind(path)
    return srv, path


def test_the_host_asks_once_per_operation_and_starts_what_waited(tmp_path):
    srv, path = _helper(tmp_path)
    d = channel.Decisions(path, 1.0, "h1")
    try:
        a, b = _Sender(1), _Sender(2)
        d.park("ring.0", a)
        d.park("ring.0", b)
        data, addr = srv.recvfrom(4096)
        assert srv.getblocking() and d.next_timeout() is not None
        assert b'"key": "ring.0"' in data and b'"host": "h1"' in data
        srv.settimeout(0.05)
        with pytest.raises(socket.timeout):
            srv.recvfrom(4096)                               # asked once
        srv.sendto(channel.answer("ring.0", {7: 50001}), addr)
        time.sleep(0.05)
        assert d.read() == [("ring.0", [a, b])] and d.known["ring.0"] == {7: 50001}
        assert not d.parked and d.next_timeout() is None
    finally:
        d.close()
        srv.close()
    assert not os.path.exists(d.me)


def test_no_answer_in_time_sends_the_operation_static(tmp_path):
    """Static: every flow on its own QP, and only the job's own ring order — the flows of the others laid out,
    sent or received here, are skipped."""
    st = {5: _State(), 6: _State(), 7: _State()}
    d = channel.Decisions(str(tmp_path / "nobody.sock"), 0.01, "h0",     # no helper: the send fails
                          receivers={5: ("ring.1", 0, st[5]), 6: ("ring.1", 2, st[6]), 7: ("ring.2", 1, st[7])})
    try:
        x, y = _Sender(1), _Sender(2, variant=1)
        d.park("ring.1", x)
        d.park("ring.1", y)
        assert d.expired(time.time() + 1) == [("ring.1", [x, y])]
        assert d.known["ring.1"] == {} and d.undecided == {"ring.1"} and d.skip == {2, 6}
        assert st[6].at is None                               # ended once the operation's flows have started
        d.end_skipped()
        assert st[6].at is not None and st[5].at is None and st[7].at is None
    finally:
        d.close()


def test_weighted_split_is_never_worse_than_static_as_the_view_sees_it():
    """Any rates on any links (hypothesis): every step's decided placement is predicted to take at most the
    static step's time, and every flow goes on one of its own connection's QPs."""
    from hypothesis import given, settings, strategies as st
    from testbed.collective.weighted_split import step_time
    scen, topo, model = _fabric()
    _, ops = scheduled_operations(scen, topo)
    op = ops["ring.0"]
    ports = sorted(p.ifindex for sw in topo.switches for p in topo.ports[sw])

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.sampled_from([0.5e6, 2.5e6, 5e6, 10e6, 20e6]), min_size=len(ports), max_size=len(ports)))
    def check(rates):
        view = NetworkView(model, {p: LinkSignals(r) for p, r in zip(ports, rates)}, ("util",))
        moved = WeightedSplit().decide(op, view)
        qps = op.qp_ports()
        assert all(moved[f.flow_id] in qps[f.conn] for f in op.flows if f.flow_id in moved)
        for flows in op.steps().values():
            assert step_time(flows, moved, view) <= step_time(flows, {}, view) * (1 + 1e-9)
    check()


def test_ring_orders_are_distinct_rings_the_jobs_own_first():
    import random
    from testbed.workloads.collectives import ring_orders
    hosts = ["h0", "h2", "h1", "h3"]
    orders = ring_orders(hosts, 5, random.Random(1))
    assert orders[0] == hosts and len(orders) == 3            # 4 hosts make (4 − 1)! / 2 = 3 distinct rings

    def edges(o):
        return {frozenset((o[i], o[(i + 1) % len(o)])) for i in range(len(o))}
    assert len({frozenset(edges(o)) for o in orders}) == 3   # none is another read backwards or rotated
    assert ring_orders(hosts, 1, random.Random(1)) == [hosts]


def test_ring_order_lays_out_every_order_and_runs_the_one_the_view_finishes_first():
    """codesign-degraded (seed 3) with ring-order: each iteration lays out 3 rings × 6 steps × 4 edges × 2 QPs;
    the job's own order sends 2 QPs up the slow link in every step, order 1 none: order 1 runs, the others'
    flows are skipped. On the healthy fabric all orders tie and the job's own runs."""
    from testbed.collective.ring_order import RingOrder
    scen, topo, model = _fabric(sets=["traffic.collective.adapt.policy=ring-order"])
    _, ops = scheduled_operations(scen, topo)
    op = ops["ring.1"]
    assert len(op.flows) == 3 * 6 * 4 * 2 and sorted(op.variants()) == [0, 1, 2]
    assert len({f.flow_id for f in op.flows}) == len(op.flows)
    d = RingOrder().decide(op, _view(topo, model))
    assert set(d.values()) == {None} and {f.variant for f in op.flows if f.flow_id not in d} == {1}
    healthy = _fabric(sets=["traffic.collective.adapt.policy=ring-order", "topology.links=[]"])
    assert RingOrder().decide(op, _view(healthy[1], healthy[2])) == {f.flow_id: None for f in op.flows if f.variant}


def test_static_and_ring_order_keep_each_qps_port():
    """A QP's port comes from the seed and the QP alone: the static policy's flows, the job's own ring under
    ring-order and weighted-split's own QPs all use the same ports, so runs compare like with like."""
    ports = {}
    for policy in ("static", "ring-order", "weighted-split"):
        scen, topo, _ = _fabric(sets=[f"traffic.collective.adapt.policy={policy}"])
        _, ops = scheduled_operations(scen, topo)
        ports[policy] = {f.conn: f.sport for f in ops["ring.0"].flows if f.variant == 0 and f.step == 0}
    assert ports["static"] == ports["ring-order"] == ports["weighted-split"]


@pytest.mark.parametrize("sets,match", [
    (["traffic.collective.adapt.rings=3"], r"adapt.rings: policy weighted-split sends the job's own ring"),
    (["traffic.collective.adapt.policy=ring-order", "traffic.collective.adapt.rings=1"],
     r"adapt.rings: ring-order picks among ring orders: give 2 or more"),
    (["traffic.collective.adapt.policy=ring-order", "traffic.jobs=[{pattern: all-to-all, bytes: 64KB}]"],
     r"adapt.policy: ring-order picks the ring of all-reduce jobs"),
])
def test_ring_keys_refused_in_one_line(sets, match):
    with pytest.raises(ScenarioError, match=match):
        scenario.load(DEGRADED, sets)


def test_int_signal_without_int_reports_is_refused_in_one_line():
    match = r"traffic\.collective\.adapt\.signals: int is read from the INT reports, and telemetry\.int is not enabled"
    with pytest.raises(ScenarioError, match=match):
        scenario.load(DEGRADED, ["traffic.collective.adapt.signals=[util, int]"])
    s = scenario.load(DEGRADED, ["traffic.collective.adapt.signals=[int]", "telemetry.int.enabled=true"])
    assert s.traffic.collective.adapt.signals == ["int"]


def test_int_depths_by_hand():
    """Two reports cross port 7 (egress) with 10,000 and 30,000 bytes queued, one crosses port 8 with none:
    port 7's share of a 100,000-byte buffer is (10,000 + 30,000) / 2 / 100,000 = 0.2; port 8's 0; a port no
    report crossed 0; after a reading (reset) all 0. The share reaches the view as the ``int`` signal."""
    from testbed.collective.view import IntDepths
    from testbed.inband.collector import Hop, Report

    def rep(*hops):
        return Report(0, "a", "b", 1, 2, 17, False, 100, tuple(Hop(1, 1, e, 0, 0, q, 0, 0, 0) for e, q in hops))
    d = IntDepths()
    d.add([rep((7, 10_000), (8, 0)), rep((7, 30_000))])
    assert d.share(7, 100_000) == pytest.approx(0.2) and d.share(8, 100_000) == 0 and d.share(9, 100_000) == 0
    assert d.share(7, 0) == 0
    s = signals_between(_reading(0, 0, 0, 0, 0, 0), _reading(1, 0, 0, 0, 0, 0), int_share=d.share(7, 100_000))
    assert s.int == pytest.approx(0.2)
    d.reset()
    assert d.share(7, 100_000) == 0


class _State:
    def __init__(self):
        self.at = None

    def skip(self, now):
        self.at = now


def test_a_skip_in_the_answer_ends_the_hosts_receive_states(tmp_path):
    srv, path = _helper(tmp_path)
    st = {5: _State(), 6: _State()}
    d = channel.Decisions(path, 1.0, "h2", receivers={k: ("ring.0", 1, v) for k, v in st.items()})
    try:
        x = _Sender(9, variant=1)
        d.park("ring.0", x)
        _, addr = srv.recvfrom(4096)
        srv.sendto(channel.answer("ring.0", {}, [5, 9]), addr)
        time.sleep(0.05)
        assert d.read() == [("ring.0", [x])] and d.skip == {5, 9}
        d.end_skipped()
        assert st[5].at is not None and st[6].at is None
    finally:
        d.close()
        srv.close()


def test_paced_holds_back_the_chunks_that_cross_a_hot_link_one_after_another():
    """Four chunks of one step, one QP each: three cross the slow leaf0→spine1 link (2.5 of 10 Mbit/s: hot,
    below half the fastest), one does not. Largest first: the 64 KB chunk at once, a 32 KB one after
    64 KiB × 8 / 2.5 Mbit/s = 0.2097 s, the other 32 KB one after 0.2097 + 0.1049 = 0.3146 s; the fourth at once."""
    from testbed.collective.paced import Paced
    scen, topo, model = _fabric()
    view, slow = _view(topo, model), _slow(topo)
    a, b = "h0", "h2"
    plan = PlanFlow(0, a, topo.address(a), topo.address(b), 4791)
    crossing, clear, sp = [], None, 50000
    while len(crossing) < 3 or clear is None:
        if set(view.path(plan, sp)) & slow:
            crossing.append(sp)
        elif clear is None:
            clear = sp
        sp += 1
    sizes = [65536, 32768, 32768]
    flows = [OpFlow(i, 0, n, p, plan, (a, b, i)) for i, (n, p) in enumerate(zip(sizes, crossing[:3]))]
    flows.append(OpFlow(3, 0, 65536, clear, plan, (a, b, 3)))
    op = Operation("a2a.0", "a2a", 0, "all-to-all", flows)
    assert Paced().decide(op, view) == {}                     # one QP per connection: nothing to place
    got = Paced().delays(op, view, {})
    assert set(got) == {1, 2}
    assert got[1] == pytest.approx(65536 * 8 / 2.5e6) and got[2] == pytest.approx((65536 + 32768) * 8 / 2.5e6)
    healthy = _view(*_fabric(sets=["topology.links=[]"])[1:])
    assert Paced().delays(op, healthy, {}) == {}              # no hot link: nothing held back


def test_paced_is_registered_and_refuses_traffic_without_all_to_all():
    from testbed.collective.paced import Paced
    assert get_policy("paced") is Paced
    with pytest.raises(ScenarioError, match=r"adapt.policy: paced orders the chunks of all-to-all jobs"):
        scenario.load(DEGRADED, ["traffic.collective.adapt.policy=paced"])
    s = scenario.load(DEGRADED, ["traffic.collective.adapt.policy=paced",
                                 "traffic.jobs=[{name: a2a, pattern: all-to-all, bytes: 64KB}]"])
    assert s.traffic.collective.adapt.policy == "paced"


def test_an_answer_with_delays_holds_those_flows_back(tmp_path):
    srv, path = _helper(tmp_path)
    d = channel.Decisions(str(path), 1.0, "h0")
    d.park("a2a.0", "x")
    _, addr = srv.recvfrom(4096)
    srv.sendto(channel.answer("a2a.0", {7: 50001}, [], {7: 0.25, 8: 0.5}), addr)
    time.sleep(0.05)
    assert d.read() == [("a2a.0", ["x"])] and d.delay == {7: 0.25, 8: 0.5} and d.known["a2a.0"] == {7: 50001}
    d.close()
    srv.close()
