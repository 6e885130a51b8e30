"""Workloads: flow planning (pure) and the agents on real namespaces (e2e, root)."""
from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from testbed import scenario, topology
from testbed.fabric import netns
from testbed.workloads import ENGINES, Flow, WorkloadError, offered_mbps, plan, run
from testbed.workloads.engine_api import Pacer
from testbed.workloads.udp import HDR, udp_packet_count

import cpu_guard
from testbed.workloads.flows import derangement


def scen(**traffic):
    topo = traffic.pop("topology", {})
    return scenario.from_dict({"topology": topo, "traffic": traffic})


def planned(seed=1, duration_s=5.0, **traffic):
    s = scen(**traffic)
    return plan(s.traffic, topology.build(s.topology), seed, duration_s), topology.build(s.topology)


# ---------------------------------------------------------------- plan(): patterns

def test_pairs_listed_in_order_with_flows_per_pair():
    flows, topo = planned(pattern="pairs", pairs=[["h0", "h3"], ["h2", "h1"]], flows_per_pair=3)
    assert [(f.src, f.dst) for f in flows] == [("h0", "h3")] * 3 + [("h2", "h1")] * 3
    assert [f.flow_id for f in flows] == list(range(6))
    f = flows[0]
    assert f.src_addr == topo.address("h0") and f.dst_addr == topo.address("h3")
    assert f.proto == "udp" and f.engine == "udp" and f.dport == 5001


def test_permutation_is_a_cross_leaf_derangement():
    for seed in range(20):
        flows, topo = planned(seed=seed, pattern="permutation",
                              topology={"leaves": 4, "hosts_per_leaf": 4})
        srcs = [f.src for f in flows]
        dsts = [f.dst for f in flows]
        assert sorted(srcs) == sorted(topo.hosts) and sorted(dsts) == sorted(topo.hosts)
        for f in flows:
            assert f.src != f.dst
            assert topo.leaf_of(f.src) != topo.leaf_of(f.dst)


def test_permutation_seeded_and_varies():
    a, _ = planned(seed=7, pattern="permutation", topology={"leaves": 4, "hosts_per_leaf": 4})
    b, _ = planned(seed=7, pattern="permutation", topology={"leaves": 4, "hosts_per_leaf": 4})
    c, _ = planned(seed=8, pattern="permutation", topology={"leaves": 4, "hosts_per_leaf": 4})
    assert a == b
    assert [(f.src, f.dst) for f in a] != [(f.src, f.dst) for f in c]


def test_permutation_one_leaf_is_still_a_derangement():
    flows, topo = planned(pattern="permutation", topology={"leaves": 1, "hosts_per_leaf": 5})
    assert all(f.src != f.dst for f in flows)
    assert sorted(f.dst for f in flows) == sorted(topo.hosts)


def test_derangement_large_and_uneven_groups():
    import random
    hosts = [f"h{i}" for i in range(512)]
    group = {h: i // 16 for i, h in enumerate(hosts)}
    perm = derangement(hosts, random.Random(3), group)
    assert sorted(perm.values()) == sorted(hosts)
    assert all(group[s] != group[d] for s, d in perm.items())
    # a group with more than half the hosts: crossing is impossible for some, still a derangement
    group = {h: (0 if i < 300 else 1) for i, h in enumerate(hosts)}
    perm = derangement(hosts, random.Random(3), group)
    assert sorted(perm.values()) == sorted(hosts) and all(s != d for s, d in perm.items())
    with pytest.raises(ValueError):
        derangement(["h0"], random.Random(1))


def test_all_to_all_every_ordered_pair():
    flows, topo = planned(pattern="all-to-all", flows_per_pair=2)
    n = len(topo.hosts)
    assert len(flows) == n * (n - 1) * 2
    assert Counter((f.src, f.dst) for f in flows) == {(a, b): 2 for a in topo.hosts for b in topo.hosts if a != b}


@pytest.mark.parametrize("senders,expect", [
    (None, ["h1", "h2", "h3", "h4", "h5", "h6", "h7"]),
    (3, ["h0", "h1", "h3"]),
    (["h5", "h6"], ["h5", "h6"]),
])
def test_incast_variants(senders, expect):
    flows, _ = planned(pattern="incast", incast={"receiver": "h2" if senders == 3 else "h0", "senders": senders},
                       topology={"leaves": 2, "hosts_per_leaf": 4})
    assert [f.src for f in flows] == expect
    assert {f.dst for f in flows} == {"h2" if senders == 3 else "h0"}


def test_incast_too_many_senders():
    with pytest.raises(ValueError, match="senders"):
        planned(pattern="incast", incast={"receiver": "h0", "senders": 4})


# ---------------------------------------------------------------- plan(): ports, rails, sizes

def test_random_sports_distinct_seeded_in_range():
    a, _ = planned(seed=5, pattern="all-to-all", flows_per_pair=8, sport_base=40000)
    b, _ = planned(seed=5, pattern="all-to-all", flows_per_pair=8, sport_base=40000)
    ports = [f.sport for f in a]
    assert len(set(ports)) == len(ports)
    assert all(40000 <= p <= 65535 for p in ports)
    assert ports == [f.sport for f in b]
    assert {f.dport for f in a} == {5001}


def test_sequential_sports():
    flows, _ = planned(pattern="all-to-all", sport="sequential", sport_base=30000)
    assert [f.sport for f in flows] == [30000 + i for i in range(len(flows))]
    assert {f.dport for f in flows} == {5001}


def test_fixed_sport_spreads_dport_per_flow_of_a_pair():
    flows, _ = planned(pattern="all-to-all", sport=4000, flows_per_pair=3, dport=6000)
    assert {f.sport for f in flows} == {4000}
    tuples = [(f.src_addr, f.dst_addr, f.sport, f.dport) for f in flows]
    assert len(set(tuples)) == len(tuples)                     # still distinct 5-tuples
    assert {f.dport for f in flows} == {6000, 6001, 6002}


def test_random_sports_exhausted():
    with pytest.raises(ValueError, match="distinct ports"):
        planned(pattern="all-to-all", flows_per_pair=1024, sport_base=65000)


def test_rails_round_robin_per_pair():
    flows, topo = planned(pattern="pairs", pairs=[["h0", "h3"]], flows_per_pair=5, topology={"rails": 2})
    assert [f.rail for f in flows] == [0, 1, 0, 1, 0]
    for f in flows:
        assert f.src_addr == topo.address("h0", f.rail) and f.dst_addr == topo.address("h3", f.rail)
    assert flows[0].src_addr != flows[1].src_addr


def test_sizes_rates_start_engine():
    flows, _ = planned(pattern="pairs", pairs=[["h0", "h1"]], flow_size="1MB", rate="20mbit", start="250ms",
                       engine="tcp")
    f = flows[0]
    assert (f.size_bytes, f.rate_bps, f.start_s, f.proto, f.engine) == (1 << 20, 20_000_000, 0.25, "tcp", "tcp")
    assert Flow.from_dict(f.to_dict()) == f
    with pytest.raises(ValueError, match="start"):
        planned(duration_s=0.2, pattern="pairs", pairs=[["h0", "h1"]], start="250ms")


def test_engine_registry():
    assert set(ENGINES) >= {"udp", "tcp", "roce"}
    for name, e in ENGINES.items():
        assert e.name == name and e.proto in ("udp", "tcp", "rocev2")


def test_offered_load():
    flows, _ = planned(pattern="pairs", pairs=[["h0", "h1"], ["h0", "h2"], ["h1", "h2"]], rate="30mbit")
    # h0 offers 2 × 30 = 60, h1 30 (under 100 Mbit/s links)
    assert offered_mbps(flows, 100_000_000, 5.0) == pytest.approx(90.0)
    flows, _ = planned(pattern="pairs", pairs=[["h0", "h1"], ["h0", "h2"]])
    assert offered_mbps(flows, 100_000_000, 5.0) == pytest.approx(100.0)      # one NIC caps h0
    flows, _ = planned(pattern="pairs", pairs=[["h0", "h1"]], flow_size=1_250_000)
    assert offered_mbps(flows, 100_000_000, 5.0) == pytest.approx(2.0)        # 10 Mbit over 5 s


def test_udp_split_and_pacer():
    assert udp_packet_count(1472, 1472) == 1 and udp_packet_count(1473, 1472) == 2
    assert HDR.size == 20
    p = Pacer(8_000_000, 100.0)                   # 1 MB/s
    assert p.allowance(100.001) == pytest.approx(1000)
    p.sent += 5000
    assert p.allowance(100.002) < 0 and p.wake(0) == pytest.approx(100.005)
    assert p.allowance(200.0) == pytest.approx(20_000)    # lag capped at 20 ms of credit


# ---------------------------------------------------------------- end to end on namespaces

root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces)")


def _link(ns_a, ns_b, if_a, if_b, addr_a, addr_b, tbf_mbit=None, limit=256 * 1024):
    from pyroute2 import IPRoute
    with IPRoute() as ip:
        ip.link("add", ifname=if_a, kind="veth", peer={"ifname": if_b})
        ip.link("set", index=ip.link_lookup(ifname=if_a)[0], net_ns_fd=netns.path(ns_a))
        ip.link("set", index=ip.link_lookup(ifname=if_b)[0], net_ns_fd=netns.path(ns_b))

    def inside(ifn, addr, shape):
        with IPRoute() as n:
            idx = n.link_lookup(ifname=ifn)[0]
            n.link("set", index=n.link_lookup(ifname="lo")[0], state="up")
            n.link("set", index=idx, state="up")
            n.addr("add", index=idx, address=addr, prefixlen=24)
            if shape:
                n.tc("add", "tbf", index=idx, handle="1:", rate=f"{shape}mbit", burst=15000, limit=limit)
    for ns, ifn, addr, shape in ((ns_a, if_a, addr_a, tbf_mbit), (ns_b, if_b, addr_b, None)):
        netns.run_in(ns, inside, ifn, addr, shape)


@pytest.fixture(scope="module")
def lab():
    """a — b plain veth (10.91.1.0/24); c → a shaped at 50 Mbit/s on c's end (10.91.2.0/24)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces)")
    pid = os.getpid()
    names = {x: f"ftb-wl{pid}-{x}" for x in "abc"}
    netns.create(names.values())
    try:
        _link(names["a"], names["b"], f"wl{pid}ab", f"wl{pid}ba", "10.91.1.1", "10.91.1.2")
        _link(names["c"], names["a"], f"wl{pid}ca", f"wl{pid}ac", "10.91.2.3", "10.91.2.1", tbf_mbit=50)
        yield names
    finally:
        netns.delete(names.values())


def _children() -> list[int]:
    """This process's children but the FTB_STRESS hog."""
    me = str(os.getpid())
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(int(d))
            except (OSError, IndexError):
                pass
    return [p for p in out if p != cpu_guard.HOG.pid()]


def F(i, src, dst, proto="udp", size=None, rate=None, sport=None, dport=5001, start=0.0):
    addr = {("a", "b"): ("10.91.1.1", "10.91.1.2"), ("b", "a"): ("10.91.1.2", "10.91.1.1"),
            ("c", "a"): ("10.91.2.3", "10.91.2.1")}[(src, dst)]
    return Flow(i, src, dst, addr[0], addr[1], sport or 30000 + i, dport, proto, size, rate, start)


@root
@pytest.mark.e2e
def test_sized_udp_and_tcp_exact(lab):
    flows = [F(0, "a", "b", "udp", size=3_000_000), F(1, "a", "b", "tcp", size=3_000_000, dport=5002),
             F(2, "b", "a", "udp", size=100_001, dport=5003), F(3, "b", "a", "tcp", size=777, dport=5004)]
    t = time.time()
    res = run(flows, lab.__getitem__, duration_s=5.0, packet_size=1500)
    assert time.time() - t < 4.0                  # sized flows end the run early
    for r in res:
        assert r.error is None, r
        assert r.bytes == r.size_bytes and r.complete
        assert r.fct_s is not None and 0 < r.fct_s < 3
        assert r.goodput_mbps > 0
    u = res[0]
    assert u.lost == 0 and u.packets_sent == u.packets_received == udp_packet_count(3_000_000, 1472)
    assert res[2].packets_received == udp_packet_count(100_001, 1472)
    assert res[1].retrans is not None
    assert not _children()


@root
@pytest.mark.e2e
def test_paced_udp_rate(lab):
    res = run([F(0, "a", "b", rate=20_000_000)], lab.__getitem__, duration_s=2.0, packet_size=1000)
    r = res[0]
    assert r.lost == 0 and r.fct_s is not None and r.complete is None
    ip_mbps = r.packets_received * 1000 * 8 / (r.end_s - r.start_s) / 1e6
    assert ip_mbps == pytest.approx(20.0, rel=0.05)
    assert r.end_s == pytest.approx(2.0, abs=0.1)


@root
@pytest.mark.e2e
def test_blast_is_back_pressured_by_shaped_link(lab):
    # two blasting UDP flows and a paced one share c's 50 Mbit/s TBF (limit 256 KB): the sockets block, no loss
    flows = [F(0, "c", "a"), F(1, "c", "a", dport=5002), F(2, "c", "a", rate=5_000_000, dport=5002)]
    res = run(flows, lab.__getitem__, duration_s=2.0, packet_size=1500)
    total_ip = sum(r.packets_received for r in res) * 1500 * 8 / 2.0 / 1e6
    assert 46 < total_ip < 52
    for r in res:
        assert r.lost == 0 and r.error is None
    assert res[2].goodput_mbps == pytest.approx(5.0 * 1472 / 1500, rel=0.1)


@root
@pytest.mark.e2e
def test_duration_tcp_and_start_offset(lab):
    flows = [F(0, "a", "b", "tcp", dport=5002), F(1, "c", "a", "tcp", start=0.5, dport=5003)]
    res = run(flows, lab.__getitem__, duration_s=1.5, packet_size=1500)
    a, c = res
    assert a.error is None and c.error is None
    assert a.bytes > 1_000_000 and a.fct_s == pytest.approx(1.5, abs=0.2)
    assert c.start_s == pytest.approx(0.5, abs=0.1)
    assert 30 < c.goodput_mbps < 52                     # the 50 Mbit/s TBF
    assert c.lost is None and c.packets_sent is None


@root
@pytest.mark.e2e
def test_agent_failure_is_one_line_and_reaped(lab):
    bad = Flow(0, "a", "b", "10.99.99.99", "10.91.1.2", 30000, 5001, "udp", 1000, None, 0.0)
    with pytest.raises(WorkloadError) as e:
        run([bad], lab.__getitem__, duration_s=1.0, packet_size=1500)
    msg = str(e.value)
    assert "\n" not in msg and "on a" in msg and "cannot bind" in msg
    assert not _children()


@root
@pytest.mark.e2e
def test_missing_namespace(lab):
    with pytest.raises(WorkloadError, match="cannot start"):
        run([F(0, "a", "b", size=1000)], lambda h: "ftb-wl-nonexistent", duration_s=1.0, packet_size=1500)
    assert not _children()


@root
@pytest.mark.e2e
def test_host_qdisc_overflow_is_counted_as_loss(lab):
    # without a shared send-buffer budget four blasting sockets overflow c's 256 KB TBF: the sender's packets
    # are dropped at its own qdisc, and the result says so (sent = received + lost), without waiting for grace
    flows = [F(i, "c", "a", dport=5001 + i % 2) for i in range(4)]
    t = time.time()
    res = run(flows, lab.__getitem__, duration_s=1.0, packet_size=1500, sndbuf_bytes=None, grace_s=5.0)
    assert time.time() - t < 3.5
    assert sum(r.lost for r in res) > 0
    for r in res:
        assert r.packets_sent == r.packets_received + r.lost


@root
@pytest.mark.e2e
def test_interrupt_kills_every_agent(lab):
    import signal

    def boom(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, 0.8)
    try:
        with pytest.raises(KeyboardInterrupt):
            run([F(0, "a", "b"), F(1, "b", "a", "tcp")], lab.__getitem__, duration_s=5.0, packet_size=1500)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not _children()
