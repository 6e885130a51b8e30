"""End-to-end on the 3-tier and rail-optimised layouts: real namespaces, veths, TBF and the eBPF switch program.

Every host pair pings across a fat-tree k=4 and a small clos3 (so every FIB entry of every tier is used by
real packets), and with rails sharing the spines a cross-rail flow is seen by the datapath's own counters
going leaf → spine → the other rail's leaf, while same-rail traffic stays on one leaf.
"""
from __future__ import annotations

import socket
import subprocess

import pytest

from testbed.fabric import netns

from conftest import make_scenario

pytestmark = pytest.mark.e2e


def _ping_all(lab) -> list[tuple[str, str]]:
    """Ping every other host from each host (one source at a time, its pings in parallel); the pairs that
    got no reply."""
    hosts, failed = lab.topo.hosts, []
    for a in hosts:
        procs = [(b, netns.spawn(lab.fabric.ns[a], ["ping", "-c1", "-W3", "-q", lab.topo.address(b)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)) for b in hosts if b != a]
        failed += [(a, b) for b, p in procs if p.wait() != 0]
    return failed


def _rx(lab, counters, role: str) -> int:
    return sum(counters[p.ifindex].rx_packets for sw in lab.topo.switches for p in lab.topo.ports[sw]
               if p.role == role)


def test_fat_tree_k4_every_host_pair_pings(lab):
    lb = lab(make_scenario(topology={"kind": "fat-tree", "k": 4}))
    topo = lb.topo
    assert (len(topo.hosts), len(topo.switches)) == (16, 20)
    failed = _ping_all(lb)
    assert not failed, f"no reply for {failed}"
    c = lb.datapath.port_counters()
    assert lb.datapath.drop_counters().get("no_route", 0) == 0
    # every leaf port facing a host got its host's 15 echo requests and 15 replies
    assert all(c[p.ifindex].rx_packets >= 30 for sw in topo.switches for p in topo.ports[sw] if p.role == "down")
    # 16 × 12 ordered pairs are in different pods: request + reply cross the core layer
    assert _rx(lb, c, "core") >= 2 * 16 * 12
    assert _rx(lb, c, "spine-up") >= 2 * 16 * 12


def test_clos3_every_host_pair_pings(lab):
    lb = lab(make_scenario(topology={"kind": "clos3", "pods": 3, "leaves_per_pod": 2, "spines_per_pod": 2,
                                     "cores": 2, "planes": 2, "hosts_per_leaf": 1}))
    topo = lb.topo
    assert (len(topo.hosts), len(topo.switches)) == (6, 6 + 6 + 2)
    failed = _ping_all(lb)
    assert not failed, f"no reply for {failed}"
    c = lb.datapath.port_counters()
    assert _rx(lb, c, "core") >= 2 * 6 * 4          # 24 ordered cross-pod pairs
    assert all(sum(c[p.ifindex].rx_packets for p in topo.ports[f"core{i}"]) > 0 for i in range(2))


def _send(lab, src, src_rail, dst, dst_rail, count, sport, dport=9000) -> None:
    """UDP from ``src``'s rail-``src_rail`` address (bound, so its NIC's rule applies) to ``dst``'s address on
    ``dst_rail``."""
    saddr, daddr = lab.topo.address(src, src_rail), lab.topo.address(dst, dst_rail)

    def go():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((saddr, sport))
        for _ in range(count):
            s.sendto(bytes(64), (daddr, dport))
        s.close()
    netns.run_in(lab.fabric.ns[src], go)


def test_rails_sharing_spines_cross_rail_goes_leaf_spine_leaf(lab):
    # SuperPOD style: one leaf per rail holds every host's NIC of that rail; two spines shared by both rails
    lb = lab(make_scenario(topology={"spines": 2, "leaves": 1, "hosts_per_leaf": 2, "rails": 2,
                                     "rails_share_spines": True}))
    topo, dp = lb.topo, lb.datapath
    assert [topo.leaf_of("h0", r) for r in (0, 1)] == ["leaf0", "leaf1"]
    before = dp.port_counters()
    _send(lb, "h0", 0, "h1", 1, 300, sport=41000)          # cross-rail
    _send(lb, "h0", 0, "h1", 0, 200, sport=41001)          # same rail: leaf0 only
    c = dp.port_counters()

    def delta(node, ifname, what):
        ifx = topo.port_named(node, ifname).ifindex
        return getattr(c[ifx], what) - getattr(before[ifx], what)
    # per-flow counters at leaf0: the cross-rail flow had a choice of the two spines and took one uplink
    fp = [f for f in dp.flow_paths() if f.switch == "leaf0" and f.sport == 41000]
    assert len(fp) == 1 and sum(fp[0].packets.values()) == 300
    (uplink, n), = fp[0].packets.items()
    spine = topo.port(uplink).peer_node
    assert topo.port(uplink).role == "up" and n == 300
    # … crossed that spine to rail 1's leaf and reached h1's rail-1 NIC; the other spine saw nothing
    assert delta(spine, "leaf0", "rx_packets") == 300 and delta(spine, "leaf1", "tx_packets") == 300
    other = "spine1" if spine == "spine0" else "spine0"
    assert delta(other, "leaf0", "rx_packets") == 0
    assert delta("leaf1", "h1", "tx_packets") == 300
    # the same-rail flow stayed on leaf0 (no choice to make, so no per-flow entry) and never used the spines
    assert not [f for f in dp.flow_paths() if f.sport == 41001]
    assert delta("leaf0", "h1", "tx_packets") == 200
    assert delta("leaf0", "h0", "rx_packets") == 500
    # and both directions of a cross-rail exchange work (h1 answers from rail 1 through its own rule)
    p = netns.spawn(lb.fabric.ns["h0"], ["ping", "-c1", "-W3", "-q", "-I", topo.address("h0", 0),
                                         topo.address("h1", 1)], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
    assert p.wait() == 0
