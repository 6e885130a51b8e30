"""SM routing in the datapath, with BPF_PROG_TEST_RUN: the FIB starts empty, what the subnet manager writes
is what forwards (a /32 per destination, one port or several for the load balancer), and single-port groups
keep per-flow path counters (so paths_used works with deterministic routes)."""
import os

import pytest

from conftest import datapath_fixtures

from testbed.routing import algorithms as engines, manager as routing
from testbed.datapath import testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT, TC_ACT_SHOT

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, Raw = scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.Raw

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF, namespaces)")


scen, topo, dp = datapath_fixtures({"topology": {"kind": "fat-tree", "k": 4},
                                    "switch": {"routing": "sm", "sm": {"engine": "ftree"}}}, "smd")


def frame(port, src, dst, sport=20000):
    return (Ether(src=port.peer_mac, dst=port.mac) / IP(src=src, dst=dst) / UDP(sport=sport, dport=5001)
            / Raw(b"x" * 64))


def test_sm_programs_every_switch_and_forwarding_follows_its_tables(dp, topo):
    h0 = topo.port(topo.port_named("h0", "eth0").peer_ifindex)
    dst = topo.address("h9")
    verdict, _ = testrun.run(dp.ingress_fd, bytes(frame(h0, topo.address("h0"), dst)), ifindex=h0.ifindex), None
    assert verdict.verdict == TC_ACT_SHOT and dp.drop_counters()["no_route"] == 1     # nothing programmed yet
    tables = engines.compute("ftree", engines.graph(topo))
    written = routing.write_tables(dp.bpf, topo, {}, tables)
    assert written == len(tables) == 20 * 16
    # walk h0 → h9 hop by hop through the program: each switch sends it out of the port ftree chose
    port, node = h0, "leaf0"
    for _ in range(6):
        r = testrun.run(dp.ingress_fd, bytes(frame(port, topo.address("h0"), dst)), ifindex=port.ifindex)
        assert r.verdict == TC_ACT_REDIRECT
        out = Ether(r.data)
        eg = next(p for p in topo.ports[node] if p.mac == out[Ether].src.lower())
        assert (eg.ifindex,) == tables[(node, dst)] == dp.next_hops(node, dst)
        if eg.peer_node == "h9":
            break
        port, node = topo.port(eg.peer_ifindex), eg.peer_node
    else:
        pytest.fail("h9 not reached in 6 hops")
    # single-port groups keep per-flow counters under SM: one path at the source leaf
    fp = [f for f in dp.flow_paths() if f.switch == "leaf0"]
    assert len(fp) == 1 and fp[0].packets == {tables[("leaf0", dst)][0]: 1}
    # a rewrite changes only what differs; removing a destination deletes its entries
    again = routing.write_tables(dp.bpf, topo, tables, dict(tables))
    assert again == 0
    fewer = {k: v for k, v in tables.items() if k[1] != dst}
    assert routing.write_tables(dp.bpf, topo, tables, fewer) == 20
    assert dp.next_hops("leaf0", dst) == ()
