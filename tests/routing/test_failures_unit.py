"""failures.csv from hand-made inputs (no kernel): detection and reroute from the routing agent's records, loss
from the receivers' gaps counted once, throughput dips from their timelines; the summary's columns from it."""
import math

import pytest

from testbed import scenario, topology
from testbed.routing import failures as F
from testbed.routing.manager import parse_links, link_dump_message
from testbed.report import failures_frame
from testbed.report.summary import failure_figures

ORIGIN = 1000.0                      # the run's time zero (epoch seconds)


@pytest.fixture
def scen():
    return scenario.from_dict({
        "duration": "3s", "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 1,
                                       "fabric_link": {"rate": "10mbit", "buffer": "50KB"}},
        "failures": [{"at": "1s", "link": ["leaf0", "spine1"], "state": "down"},
                     {"at": "2s", "link": ["leaf0", "spine1"], "state": "up"},
                     {"at": "2.5s", "link": ["leaf1", "spine0"], "rate": "5mbit"},
                     {"at": "2.9s", "node": "spine0", "state": "down"}]})


def test_rows_are_computed_as_defined(scen):
    topo = topology.build(scen.topology)
    up = next(p for p in topo.ports["leaf0"] if p.peer_node == "spine1")
    down = topo.port(up.peer_ifindex)
    t_ev = ORIGIN + 1.5                                   # event 0 applied 1.5 s into the run
    applied = [{"index": 0, "applied": t_ev}, {"index": 1, "applied": ORIGIN + 2.5},
               {"index": 2, "applied": ORIGIN + 3.0}]     # event 3 never applied
    changes = [{"kind": "initial", "t_detect": ORIGIN - 1, "t_done": ORIGIN - 1, "ports": []},
               {"kind": "reroute", "t_detect": t_ev + 0.0002, "t_done": t_ev + 0.0007,
                "ports": [[down.ifindex, False]]},
               {"kind": "reroute", "t_detect": t_ev + 0.0009, "t_done": t_ev + 0.0012, "ports": [[up.ifindex, False]]},
               {"kind": "reroute", "t_detect": ORIGIN + 2.5001, "t_done": ORIGIN + 2.5003,
                "ports": [[down.ifindex, True], [up.ifindex, True]]}]
    bins = [1250] * 300                                  # 1 Mbit/s in 10 ms bins from the traffic's t0 …
    t0 = ORIGIN + 0.5
    for i in range(100, 106):                             # … nothing from 1.5 to 1.56 s
        bins[i] = 0
    timelines = {
        0: {"t0": t0, "bin_s": 0.01, "bins": bins,
            "gaps": [(t_ev - 0.001, t_ev + 0.002, 3),     # in event 0's window
                     (ORIGIN + 1.0, ORIGIN + 1.01, 2),    # before it (the window opens 40 ms early: 50 KB at 10 Mbit/s)
                     (ORIGIN + 3.1, ORIGIN + 3.11, 1)]},  # after the rate change: inside its 250 ms window
        1: {"t0": t0, "bin_s": 0.01, "bins": [1250] * 300, "gaps": []},
    }
    rows = F.rows(scen, topo, applied, {"changes": changes}, timelines, ORIGIN)
    r0, r1, r2, r3 = rows
    assert r0["time_s"] == pytest.approx(1.5) and r0["at_s"] == 1.0 and r0["target"] == "leaf0-spine1"
    assert r0["detected_s"] == pytest.approx(0.0002)      # the first record with one of its ports
    assert r0["rerouted_s"] == pytest.approx(0.0007)      # one end down: the link is down for routing
    assert r0["lost_packets"] == 3
    assert r0["affected_flows"] == 1 and r0["dip_max"] == pytest.approx(1.0) and r0["flow_dips"] == "0:1.000"
    assert r1["detected_s"] == pytest.approx(0.0001) and r1["rerouted_s"] == pytest.approx(0.0003)
    assert r1["lost_packets"] == 0 and r1["affected_flows"] == 0 and r1["flow_dips"] == ""
    assert math.isnan(r2["detected_s"]) and math.isnan(r2["rerouted_s"]) and r2["change"] == "rate 5000000bit"
    assert r2["lost_packets"] == 1 and r2["flow_dips"] == "0:0.000"   # lost a packet: affected, even without a dip
    assert math.isnan(r3["time_s"]) and math.isnan(r3["lost_packets"]) and r3["kind"] == "node"
    df = failures_frame(rows)
    assert failure_figures(df) == (4, pytest.approx(0.7))
    assert [math.isnan(x) for x in failure_figures(None)] == [True, True]


def test_a_long_gap_is_counted_once_for_the_first_event_it_overlaps(scen):
    topo = topology.build(scen.topology)
    applied = [{"index": 0, "applied": ORIGIN + 1.5}, {"index": 1, "applied": ORIGIN + 2.0}]
    tl = {7: {"t0": ORIGIN, "bin_s": 0.01, "bins": [], "gaps": [(ORIGIN + 1.5, ORIGIN + 2.0, 150)]}}
    rows = F.rows(scen, topo, applied, {"changes": []}, tl, ORIGIN)
    assert (rows[0]["lost_packets"], rows[1]["lost_packets"]) == (150, 0)
    assert math.isnan(rows[0]["rerouted_s"])             # no routing record: not rerouted
    # a link comes up for routing only once both ends are up
    topo_up = [next(p for p in topo.ports["leaf0"] if p.peer_node == "spine1")]
    a, b = topo_up[0].ifindex, topo_up[0].peer_ifindex
    ch = [{"kind": "sweep", "t_detect": ORIGIN + 2.01, "t_done": ORIGIN + 2.011, "ports": [[a, True]]},
          {"kind": "sweep", "t_detect": ORIGIN + 2.02, "t_done": ORIGIN + 2.021, "ports": [[b, True]]}]
    rows = F.rows(scen, topo, applied, {"changes": ch}, {}, ORIGIN)
    assert rows[1]["detected_s"] == pytest.approx(0.01) and rows[1]["rerouted_s"] == pytest.approx(0.021)
    assert math.isnan(rows[1]["lost_packets"])          # no UDP timelines: loss not measured


def test_link_messages_parse_by_their_header_flags():
    import struct
    def link(ifindex, flags, mtype=16):
        return struct.pack("IHHII", 32, mtype, 0, 1, 0) + struct.pack("BBHiII", 0, 0, 0, ifindex, flags, 0)
    done = struct.pack("IHHII", 20, 3, 0, 1, 0) + bytes(4)
    data = link(5, 0x1 | 0x10000) + link(6, 0x1) + link(7, 0x10000) + link(8, 0x10001, mtype=17) + done
    assert parse_links(data) == ([(5, True), (6, False), (7, False), (8, False)], True)
    assert len(link_dump_message()) == 32
    assert F.setlink_message(9, False)[16:] == struct.pack("BBHiII", 0, 0, 0, 9, 0, 1)


def _port(topo, node, peer):
    return next(p for p in topo.ports[node] if p.peer_node == peer)


def test_on_several_machines_each_sets_its_own_end_of_a_cut_link(scen):
    """One machine: a link event sets the upper end, a node event every port of the switch. Over several: a cut
    link's local end on each machine (a VXLAN device has no carrier to lose), nothing where neither end is."""
    topo = topology.build(scen.topology)
    link, node = scen.failures[0], scen.failures[3]                # leaf0–spine1 down; spine0 down
    every = set(topo.nodes)
    assert F.state_ports(topo, link, every) == [_port(topo, "spine1", "leaf0")]
    assert F.state_ports(topo, node, every) == list(topo.ports["spine0"])
    m0 = {"leaf0", "h0", "spine0"}                                 # spine1 on the other machine
    assert F.state_ports(topo, link, m0) == [_port(topo, "leaf0", "spine1")]
    assert F.state_ports(topo, link, {"leaf1", "h1", "spine1"}) == [_port(topo, "spine1", "leaf0")]
    assert F.state_ports(topo, link, {"leaf1", "h1"}) == []
    assert F.state_ports(topo, node, m0) == list(topo.ports["spine0"])
    assert F.state_ports(topo, node, {"leaf1", "h1", "spine1"}) == [_port(topo, "leaf1", "spine0")]


def test_reaction_over_several_agents_is_the_first_to_detect_and_the_last_to_reroute(scen):
    topo = topology.build(scen.topology)
    a, b = _port(topo, "leaf0", "spine1"), _port(topo, "spine1", "leaf0")
    links = [(a.ifindex, b.ifindex)]
    t = ORIGIN + 1.0
    m0 = [{"kind": "reroute", "t_detect": t + 0.001, "t_done": t + 0.002, "ports": [[a.ifindex, False]]}]
    m1 = [{"kind": "reroute", "t_detect": t + 0.003, "t_done": t + 0.005, "ports": [[a.ifindex, False]]}]
    detected, rerouted = F.reaction(t, links, False, [m0, m1])
    assert detected == pytest.approx(0.001) and rerouted == pytest.approx(0.005)
    detected, rerouted = F.reaction(t, links, False, [m0, []])     # one machine never heard of it
    assert detected == pytest.approx(0.001) and math.isnan(rerouted)
