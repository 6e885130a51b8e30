"""The planner's paths against the real switch program (BPF_PROG_TEST_RUN on crafted packets): on a k=4
fat-tree, every hop of every planned flow of a permutation leaves by the port the planner predicted."""
from __future__ import annotations

import pytest

from testbed.controller import PathModel, PlanFlow, Planner
from testbed.datapath import testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT

from conftest import datapath_fixtures

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, Raw = scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.Raw

scen, topo, dp = datapath_fixtures({"topology": {"kind": "fat-tree", "k": 4}}, "pln")


def test_every_hop_of_a_planned_flow_is_the_predicted_one(dp, topo, scen):
    hs = topo.hosts
    flows = [PlanFlow(i, h, topo.address(h), topo.address(hs[(i + 4) % len(hs)]), 5001)
             for i, h in enumerate(hs)]
    planner = Planner(PathModel(topo, scen.switch.hash_seed))
    ports = planner.plan(flows)
    hops = 0
    for f in flows:
        _, path, _ = planner.chosen[f.key]
        for here, there in zip(path, path[1:]):            # the port a packet arrives on, the one it should leave by
            arrive = topo.port(topo.port(here).peer_ifindex)
            pkt = (Ether(src=arrive.peer_mac, dst=arrive.mac) / IP(src=f.saddr, dst=f.daddr, ttl=64)
                   / UDP(sport=ports[f.key], dport=f.dport) / Raw(b"x" * 64))
            r = testrun.run(dp.ingress_fd, bytes(pkt), ifindex=arrive.ifindex)
            assert r.verdict == TC_ACT_REDIRECT
            left = next(p for sw in topo.switches for p in topo.ports[sw] if p.mac == Ether(r.data).src.lower())
            assert left.ifindex == there, (f, arrive.node)
            hops += 1
    assert hops == 16 * 5 and planner.shared_links() == 0      # every flow crosses to the next pod: 5 switch hops
