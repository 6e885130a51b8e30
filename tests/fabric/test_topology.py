"""Pure topology logic (no kernel): node and link counts from the formulas, names, addresses, ifindexes, FIBs
walked for every host pair, oversubscription, rails sharing spines, per-link overrides, and the scenario keys
that describe them (one-line errors)."""
from __future__ import annotations

import ipaddress
import itertools
from collections import Counter

import pytest

from testbed import scenario, topology
from testbed.fabric.port import headroom_warnings, port_configs
from testbed.scenario import ScenarioError
from testbed.topology.fibwalk import Router, RoutingError
from testbed.workloads.flows import plan

FABRIC = ipaddress.ip_network("198.18.0.0/15")


def topo_of(**t):
    return topology.build(scenario.from_dict({"topology": t}).topology)


def kinds(topo) -> Counter:
    return Counter(n.kind for n in topo.nodes.values())


def error(doc: dict, *overrides) -> str:
    with pytest.raises(ScenarioError) as e:
        scenario.from_dict(doc, overrides)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def check_invariants(topo) -> None:
    """What every layout must give the fabric builder and the datapath."""
    ports = [p for ps in topo.ports.values() for p in ps]
    ifx = [p.ifindex for p in ports]
    assert len(ifx) == len(set(ifx)) and min(ifx) >= topology.FIRST_IFINDEX
    assert len({p.mac for p in ports}) == len(ports)
    addrs = [p.address for p in ports if p.address]
    assert len(addrs) == len(set(addrs)) == sum(len(topo.ports[h]) for h in topo.hosts)
    assert all(ipaddress.ip_address(a) in FABRIC for a in addrs)
    for e in topo.fib:
        assert ipaddress.ip_network(f"{e.prefix}/{e.plen}") and (e.plen == 0 or
                                                               ipaddress.ip_address(e.prefix) in FABRIC)
        mine = {p.ifindex for p in topo.ports[e.switch]}
        assert set(e.ports) <= mine, f"{e} uses ports of another switch"
    seen = Counter((e.switch, e.prefix, e.plen) for e in topo.fib)
    assert max(seen.values()) == 1, "two FIB entries for one prefix of one switch"
    for p in ports:                                   # named after the peer, and the peer points back
        peer = topo.port(p.peer_ifindex)
        assert peer.peer_ifindex == p.ifindex and peer.node == p.peer_node
        if topo.nodes[p.node].kind != "host":
            assert p.ifname == p.peer_node
    for kind, prefix in (("host", "h"), ("leaf", "leaf"), ("spine", "spine"), ("core", "core")):
        names = [n for n, v in topo.nodes.items() if v.kind == kind]
        assert names == [f"{prefix}{i}" for i in range(len(names))], f"{kind}s not numbered from 0 in order"
    order = [v.kind for v in topo.nodes.values()]
    assert order == sorted(order, key=["host", "leaf", "spine", "core"].index)


def all_pairs_reach(topo, rails=((0, 0),)) -> dict[tuple[str, str], int]:
    """Walk the FIBs from every host to every other host over every ECMP branch; paths per pair."""
    r = Router(topo)
    out = {}
    for src, dst in itertools.permutations(topo.hosts, 2):
        for sr, dr in rails:
            out[(src, dst, sr, dr)] = len(r.paths(src, dst, sr, dr))
    return out


# ---------------------------------------------------------------- fat-tree

@pytest.mark.parametrize("k", [4, 6, 8, 16])
def test_fat_tree_counts_follow_the_formulas(k):
    t = topo_of(kind="fat-tree", k=k)
    assert kinds(t) == {"host": k**3 // 4, "leaf": k * k // 2, "spine": k * k // 2, "core": (k // 2) ** 2}
    assert len(t.switches) == 5 * k * k // 4
    assert len(t.links) == 3 * k**3 // 4
    assert all(len(t.ports[sw]) == k for sw in t.switches)          # every switch has radix k
    assert all(len(t.uplinks(leaf)) == k // 2 for leaf in t.switches if leaf.startswith("leaf"))
    check_invariants(t)
    if k == 16:
        assert (len(t.hosts), len(t.switches)) == (1024, 320)


def test_fat_tree_k4_every_pair_reaches_over_every_branch():
    t = topo_of(kind="fat-tree", k=4)
    paths = all_pairs_reach(t)
    for (src, dst, _, _), n in paths.items():
        s, d = t.nodes[src], t.nodes[dst]
        if s.group == d.group:
            assert n == 1                       # same leaf
        elif s.pod == d.pod:
            assert n == 2                       # k/2 spines of the pod
        else:
            assert n == 4                       # (k/2)² cores
    # a cross-pod path: leaf → spine → core → spine → leaf, and the core is in the spine's plane
    p = Router(t).paths("h0", "h15")
    assert all([t.nodes[n].kind for n in path] == ["host", "leaf", "spine", "core", "spine", "leaf", "host"]
               for path in p)
    assert {(path[2], path[3]) for path in p} == {("spine0", "core0"), ("spine0", "core1"), ("spine1", "core2"),
                                                   ("spine1", "core3")}


def test_fat_tree_k16_reaches_every_host_from_every_switch():
    t = topo_of(kind="fat-tree", k=16)
    r = Router(t)
    for h in t.hosts:
        a = int(ipaddress.IPv4Address(t.address(h)))
        for sw in t.switches:
            assert r.reaches(sw, a) >= 1
    assert r.reaches("leaf0", int(ipaddress.IPv4Address(t.address("h1023")))) == 64


def test_fat_tree_roles_names_and_pod_blocks():
    t = topo_of(kind="fat-tree", k=4)
    assert [p.ifname for p in t.ports["leaf0"]] == ["h0", "h1", "spine0", "spine1"]
    assert [p.ifname for p in t.ports["spine0"]] == ["leaf0", "leaf1", "core0", "core1"]
    assert [p.ifname for p in t.ports["core0"]] == ["spine0", "spine2", "spine4", "spine6"]
    roles = Counter(p.role for ps in t.ports.values() for p in ps)
    assert roles == {"nic": 16, "down": 16, "up": 16, "spine": 16, "spine-up": 16, "core": 16}
    assert {p.role for p in t.uplinks("leaf3")} == {"up"} and {p.peer_node for p in t.uplinks("leaf3")} == \
        {"spine2", "spine3"}
    assert [t.nodes[f"h{i}"].pod for i in (0, 3, 4, 15)] == [0, 0, 1, 3]
    assert t.tiers == ("leaf", "spine", "core")
    # leaf e of pod p owns 198.18.(p·2 + e).0/24; a pod owns a /23; a core has one entry per pod
    assert t.address("h0") == "198.18.0.1" and t.address("h3") == "198.18.1.2" and t.address("h15") == "198.18.7.2"
    core = sorted((e.prefix, e.plen, len(e.ports)) for e in t.fib if e.switch == "core0")
    assert core == [("198.18.0.0", 23, 1), ("198.18.2.0", 23, 1), ("198.18.4.0", 23, 1), ("198.18.6.0", 23, 1)]
    spine = sorted((e.prefix, e.plen, len(e.ports)) for e in t.fib if e.switch == "spine2")
    assert spine == [("0.0.0.0", 0, 2), ("198.18.2.0", 23, 0), ("198.18.2.0", 24, 1), ("198.18.3.0", 24, 1)]
    assert [r.dst for r in t.routes if r.node == "h5"] == ["0.0.0.0/0"]


@pytest.mark.parametrize("k,ratio,uplinks", [(4, "2:1", 1), (8, "2:1", 2), (8, "4:1", 1), (8, "4:3", 3),
                                             (16, "8:1", 1), (16, 2, 4)])
def test_oversubscription_removes_uplinks(k, ratio, uplinks):
    t = topo_of(kind="fat-tree", k=k, oversubscription=ratio)
    half = k // 2
    assert kinds(t) == {"host": k**3 // 4, "leaf": k * half, "spine": k * uplinks, "core": uplinks * half}
    leaves = [n for n in t.switches if n.startswith("leaf")]
    assert all(len(t.uplinks(leaf)) == uplinks and len(t.ports[leaf]) == half + uplinks for leaf in leaves)
    # spines and cores stay non-blocking: k/2 down, k/2 up; a core reaches every pod once
    assert all(len(t.ports[s]) == k for s in t.switches if not s.startswith("leaf"))
    check_invariants(t)
    r = Router(t)
    assert len(r.paths("h0", t.hosts[-1])) == uplinks * half


def test_fat_tree_oversubscribed_k8_every_pair_reaches():
    t = topo_of(kind="fat-tree", k=8, oversubscription="2:1")
    paths = all_pairs_reach(t)
    assert min(paths.values()) == 1 and max(paths.values()) == 8


# ---------------------------------------------------------------- clos3

CLOS = [
    dict(pods=2, leaves_per_pod=2, spines_per_pod=2, cores=2, planes=1, hosts_per_leaf=2),
    dict(pods=3, leaves_per_pod=3, spines_per_pod=4, cores=4, planes=2, hosts_per_leaf=2),
    dict(pods=2, leaves_per_pod=1, spines_per_pod=2, cores=4, planes=2, hosts_per_leaf=3),
    dict(pods=4, leaves_per_pod=5, spines_per_pod=3, cores=6, planes=3, hosts_per_leaf=1),
    dict(pods=1, leaves_per_pod=4, spines_per_pod=2, cores=1, planes=1, hosts_per_leaf=2),
]


@pytest.mark.parametrize("shape", CLOS)
def test_clos3_counts_and_every_pair_reaches(shape):
    t = topo_of(kind="clos3", **shape)
    P, L, S, C, Q, H = (shape[k] for k in ("pods", "leaves_per_pod", "spines_per_pod", "cores", "planes",
                                          "hosts_per_leaf"))
    assert kinds(t) == {"host": P * L * H, "leaf": P * L, "spine": P * S, "core": C}
    assert len(t.links) == P * L * H + P * L * S + P * S * (C // Q)
    assert all(len(t.uplinks(f"leaf{i}")) == S for i in range(P * L))
    assert all(len(t.ports[f"core{c}"]) == P * S // Q for c in range(C))
    assert all(sum(p.role == "spine-up" for p in t.ports[f"spine{i}"]) == C // Q for i in range(P * S))
    check_invariants(t)
    paths = all_pairs_reach(t)
    for (src, dst, _, _), n in paths.items():
        s, d = t.nodes[src], t.nodes[dst]
        expect = 1 if s.group == d.group else S if s.pod == d.pod else S * (C // Q) * (S // Q)
        assert n == expect, (src, dst)


def test_clos3_defaults_and_hosts():
    s = scenario.from_dict({"topology": {"kind": "clos3"}}).topology
    assert (s.pods, s.leaves_per_pod, s.spines_per_pod, s.cores, s.planes, s.hosts_per_leaf) == (2, 2, 2, 2, 1, 2)
    assert s.hosts == 8 and s.spines is None and s.k is None
    assert len(topology.node_names(s)) == 8 + 4 + 4 + 2


# ---------------------------------------------------------------- leaf-spine and rails

def test_leaf_spine_layout_is_what_it_was():
    t = topo_of(spines=2, leaves=2, hosts_per_leaf=2)
    assert t.tiers == ("leaf", "spine")
    assert [(p.node, p.ifname, p.ifindex) for p in t.ports["leaf0"]] == [
        ("leaf0", "h0", 101), ("leaf0", "h1", 103), ("leaf0", "spine0", 104), ("leaf0", "spine1", 106)]
    assert sorted((e.switch, e.prefix, e.plen) for e in t.fib if e.switch == "spine1") == [
        ("spine1", "198.18.0.0", 24), ("spine1", "198.18.1.0", 24)]
    assert t.rules == [] and {r.table for r in t.routes} == {254}
    assert all(p.weight == 1 for ps in t.ports.values() for p in ps)
    check_invariants(t)
    t = topo_of(spines=2, leaves=3, hosts_per_leaf=2, rails=2)
    assert [n for n in t.nodes if n.startswith("spine")] == ["spine0", "spine1", "spine2", "spine3"]
    assert {p.peer_node for p in t.uplinks("leaf3")} == {"spine2", "spine3"}     # rail 1's own plane
    check_invariants(t)
    paths = all_pairs_reach(t, rails=((0, 0), (1, 1)))
    assert set(paths.values()) == {1, 2}
    with pytest.raises(RoutingError, match="no route"):         # separate planes: no way across rails
        Router(t).paths("h0", "h2", 0, 1)


def test_rails_share_spines_wiring_and_cross_rail_paths():
    t = topo_of(spines=2, leaves=2, hosts_per_leaf=2, rails=3, rails_share_spines=True)
    assert kinds(t) == {"host": 4, "leaf": 6, "spine": 2}
    for s in ("spine0", "spine1"):
        assert [p.ifname for p in t.ports[s]] == [f"leaf{i}" for i in range(6)]
        assert t.nodes[s].rail is None
    assert all({p.peer_node for p in t.uplinks(f"leaf{i}")} == {"spine0", "spine1"} for i in range(6))
    check_invariants(t)
    rails = [(a, b) for a in range(3) for b in range(3)]
    paths = all_pairs_reach(t, rails=rails)
    r = Router(t)
    for (src, dst, sr, dr), n in paths.items():
        same_leaf = t.leaf_of(src, sr) == t.leaf_of(dst, dr)
        assert n == (1 if same_leaf else 2)
    # same rail, same host group: one leaf; cross-rail: leaf → spine → the other rail's leaf
    assert r.paths("h0", "h1", 1, 1) == [("h0", "leaf2", "h1")]
    assert r.paths("h0", "h1", 0, 2) == [("h0", "leaf0", "spine0", "leaf4", "h1"),
                                          ("h0", "leaf0", "spine1", "leaf4", "h1")]
    # each NIC routes by source address into its own table, so a bound socket leaves on its own rail
    rules = [(x.node, x.src, x.table) for x in t.rules if x.node == "h0"]
    assert rules == [("h0", t.address("h0", r_), 100 + r_) for r_ in range(3)]
    nic_routes = [(x.dst, x.ifname, x.table) for x in t.routes if x.node == "h0" and x.table != 254]
    assert nic_routes == [("198.18.0.0/15", f"eth{r_}", 100 + r_) for r_ in range(3)]


# ---------------------------------------------------------------- per-link overrides

def test_link_overrides_reach_exactly_the_two_ports():
    t = topo_of(kind="fat-tree", k=4, links=[
        {"between": ["spine1", "leaf0"], "rate": "10mbit", "buffer": "64KB", "delay": "20us", "weight": 3},
        {"between": ["h2", "leaf1"], "rate": "5mbit"}])
    changed = {}
    for ps in t.ports.values():
        for p in ps:
            if (p.rate_bps, p.buffer_bytes, p.delay_ns, p.weight) != (100_000_000, 256 * 1024, 0, 1):
                changed[(p.node, p.ifname)] = (p.rate_bps, p.buffer_bytes, p.delay_ns, p.weight)
    assert changed == {("leaf0", "spine1"): (10_000_000, 64 * 1024, 20_000, 3),
                       ("spine1", "leaf0"): (10_000_000, 64 * 1024, 20_000, 3),
                       ("h2", "eth0"): (5_000_000, 256 * 1024, 0, 1),
                       ("leaf1", "h2"): (5_000_000, 256 * 1024, 0, 1)}
    link = next(ln for ln in t.links if {ln.a.node, ln.b.node} == {"leaf0", "spine1"})
    assert (link.rate_bps, link.buffer_bytes, link.weight) == (10_000_000, 64 * 1024, 3)
    ls = topo_of(spines=2, leaves=2, links=[{"between": ["leaf1", "spine0"], "rate": "1mbit"}])
    assert ls.port_named("spine0", "leaf1").rate_bps == ls.port_named("leaf1", "spine0").rate_bps == 1_000_000
    assert ls.port_named("spine0", "leaf0").rate_bps == 100_000_000


# ---------------------------------------------------------------- scenario keys

@pytest.mark.parametrize("topo,expect", [
    ({"kind": "fat-tree", "k": 5}, "topology.k: must be even, got 5"),
    ({"kind": "fat-tree", "k": 18}, "topology.k: must be ≤ 16, got 18"),
    ({"kind": "fat-tree"}, "topology.k: kind fat-tree needs k"),
    ({"kind": "fat-tree", "k": 4, "spines": 2}, "topology.spines: not a key of kind fat-tree"),
    ({"kind": "fat-tree", "k": 4, "hosts_per_leaf": 4}, "topology.hosts_per_leaf: a fat-tree of k = 4 has k/2 = 2"),
    ({"kind": "fat-tree", "k": 4, "oversubscription": "4:1"}, "topology.oversubscription: 4:1 leaves no uplink"),
    ({"kind": "fat-tree", "k": 8, "oversubscription": "3:1"},
     "topology.oversubscription: 3:1 does not leave a whole number of uplinks"),
    ({"kind": "fat-tree", "k": 8, "oversubscription": "1:2"}, "topology.oversubscription: must be at least 1:1"),
    ({"kind": "fat-tree", "k": 8, "oversubscription": "fast"}, "topology.oversubscription: expected a ratio"),
    ({"kind": "fat-tree", "k": 4, "rails": 2}, "topology.rails: multi-rail hosts are a leaf-spine layout"),
    ({"kind": "clos3", "k": 4}, "topology.k: not a key of kind clos3"),
    ({"kind": "clos3", "spines_per_pod": 4, "planes": 3}, "topology.planes: must divide spines_per_pod (4), got 3"),
    ({"kind": "clos3", "spines_per_pod": 4, "planes": 2, "cores": 3},
     "topology.cores: must be a multiple of planes (2), got 3"),
    ({"kind": "clos3", "pods": 64, "leaves_per_pod": 16}, "topology.pods: 64 pods × 16 leaf /24s"),
    ({"pods": 2}, "topology.pods: not a key of kind leaf-spine"),
    ({"rails_share_spines": True}, "topology.rails_share_spines: needs rails ≥ 2"),
    ({"kind": "fat-tree", "k": 4, "links": [{"between": ["leaf0", "spine9"], "rate": "1mbit"}]},
     "topology.links.0.between: no node 'spine9' in this topology"),
    ({"kind": "fat-tree", "k": 4, "links": [{"between": ["leaf0", "leaf1"], "rate": "1mbit"}]},
     "topology.links.0.between: leaf0 and leaf1 are not linked"),
    ({"kind": "fat-tree", "k": 4, "links": [{"between": ["leaf0", "spine0"], "rate": "1mbit"},
                                            {"between": ["spine0", "leaf0"], "buffer": "8KB"}]},
     "topology.links.1.between: spine0–leaf0 is already overridden by topology.links.0"),
    ({"links": [{"between": ["leaf0", "spine0"]}]}, "topology.links.0: give at least one of rate, buffer"),
    ({"links": [{"between": ["leaf0", "leaf0"], "rate": "1mbit"}]}, "topology.links.0.between: a link joins two"),
    ({"links": [{"between": ["leaf0", "spine0"], "rate": "slow"}]}, "topology.links.0.rate: expected a rate"),
    ({"links": [{"between": ["leaf0", "spine0"], "weight": 0}]}, "topology.links.0.weight: must be ≥ 1, got 0"),
])
def test_bad_topology_keys_are_one_line_naming_the_key(topo, expect):
    assert expect in error({"topology": topo})


def test_other_sections_check_the_topology_they_run_on():
    assert "switch.tiers.core: this topology has no core switches" in error(
        {"switch": {"tiers": {"core": {"buffer": "1MB"}}}})
    assert "traffic.rail_shift: cross-rail flows need topology.rails_share_spines" in error(
        {"topology": {"rails": 2}, "traffic": {"rail_shift": 1}})
    assert "traffic.rail_shift: 2 is a multiple of topology.rails (2)" in error(
        {"topology": {"rails": 2, "rails_share_spines": True}, "traffic": {"rail_shift": 2}})
    assert "traffic.pairs: no node 'h16' in this topology (16 hosts h0..h15)" in error(
        {"topology": {"kind": "fat-tree", "k": 4}, "traffic": {"pattern": "pairs", "pairs": [["h0", "h16"]]}})
    scenario.from_dict({"topology": {"kind": "fat-tree", "k": 4}, "capture": ["core3"],
                        "switch": {"tiers": {"core": {"buffer": "1MB"}}}})


def test_ratio_reads_unquoted_from_yaml_and_from_set(tmp_path):
    f = tmp_path / "ft.yaml"
    f.write_text("topology: {kind: fat-tree, k: 8, oversubscription: 2:1}\n")
    assert scenario.load(f).topology.oversubscription == "2:1"
    s = scenario.load(f, ("topology.oversubscription=4:1",))
    assert s.topology.oversubscription == "4:1" and s.topology.hosts == 128
    # the resolved topology (manifest, lab state file: `testbed status` rebuilds from it) validates again
    assert scenario.from_dict(scenario.to_dict(s)).topology == s.topology
    for doc in ({}, {"topology": {"kind": "clos3"}}, {"topology": {"rails": 2, "rails_share_spines": True}}):
        t = scenario.from_dict(doc).topology
        assert scenario.from_dict({"topology": scenario.to_dict(scenario.from_dict(doc))["topology"]}).topology == t


def test_core_tier_gets_its_own_qos():
    scen = scenario.from_dict({"topology": {"kind": "fat-tree", "k": 4},
                               "switch": {"buffer": "128KB", "tiers": {"core": {"buffer": "1MB"},
                                                                       "spine": {"buffer": "512KB"}},
                                          "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                                          "pfc": {"enabled": True, "headroom": "1KB"}},
                               "traffic": {"dscp": 26}})
    t = topology.build(scen.topology)
    cfg = port_configs(t, scen.switch)
    by_tier = {tier: {c.buffer_bytes for c in cfg.values() if c.port.tier == tier} for tier in t.tiers}
    assert by_tier == {"leaf": {128 * 1024}, "spine": {512 * 1024}, "core": {1024 * 1024}}
    assert all(c.classes == (0, 3) for c in cfg.values() if c.port.tier == "core")
    warned = headroom_warnings(cfg, scen.switch)
    assert [w.split(")")[0] for w in warned] == [f"switch.pfc.headroom ({x}" for x in ("leaf", "spine", "core")]


# ---------------------------------------------------------------- traffic on the new topologies

def test_permutation_on_a_fat_tree_never_stays_on_a_leaf():
    scen = scenario.from_dict({"topology": {"kind": "fat-tree", "k": 4}})
    t = topology.build(scen.topology)
    for seed in range(5):
        flows = plan(scen.traffic, t, seed, 1.0)
        assert sorted(f.src for f in flows) == sorted(t.hosts)
        assert sorted(f.dst for f in flows) == sorted(t.hosts)
        assert all(t.leaf_of(f.src) != t.leaf_of(f.dst) for f in flows)


def test_rail_shift_sends_to_the_next_rails_nic():
    scen = scenario.from_dict({"topology": {"spines": 2, "leaves": 1, "hosts_per_leaf": 2, "rails": 4,
                                            "rails_share_spines": True},
                               "traffic": {"pattern": "pairs", "pairs": [["h0", "h1"]], "flows_per_pair": 4,
                                           "rail_shift": 1}})
    t = topology.build(scen.topology)
    flows = plan(scen.traffic, t, 1, 1.0)
    assert [(f.rail, f.to_rail) for f in flows] == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert [f.dst_addr for f in flows] == [t.address("h1", r) for r in (1, 2, 3, 0)]
    assert [f.src_addr for f in flows] == [t.address("h0", r) for r in (0, 1, 2, 3)]
    from testbed.telemetry.paths import paths_used
    from testbed.datapath import FlowPath
    leaf0 = t.leaf_of("h0", 0)
    up = t.uplinks(leaf0)[1].ifindex
    fp = [FlowPath(leaf0, flows[0].src_addr, flows[0].dst_addr, flows[0].sport, flows[0].dport, 17, {up: 5})]
    assert paths_used(t, fp, flows[:1]) == {0: 1}    # a cross-rail flow leaves its leaf even within one group
