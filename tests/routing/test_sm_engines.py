"""The routing engines as pure functions over a topology (no kernel): every host reaches every host without a
loop, up*/down* never turns down→up, ftree spreads destinations evenly and gives a shift permutation on a
fat-tree disjoint paths, and the distributed side's groups are the topology FIB's until a link fails."""
from collections import Counter

import pytest

from testbed import scenario, topology
from testbed.routing import algorithms as E
from testbed.topology.fibwalk import Router

SHAPES = {
    "fat-tree-k4": {"kind": "fat-tree", "k": 4},
    "fat-tree-k8": {"kind": "fat-tree", "k": 8},
    "leaf-spine": {"spines": 4, "leaves": 3, "hosts_per_leaf": 4},
    "clos3": {"kind": "clos3", "pods": 3, "leaves_per_pod": 2, "spines_per_pod": 2, "cores": 4, "planes": 2,
              "hosts_per_leaf": 2},
    "rails": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, "rails": 2},
}


def build(doc):
    return topology.build(scenario.from_dict({"topology": doc}).topology)


def all_pairs(topo, g, tables):
    """Every (src, dst) host pair's paths; every NIC of the destination on the source's rail."""
    out = {}
    for a in topo.hosts:
        for b in topo.hosts:
            if a == b:
                continue
            for nic in (p for p in topo.ports[a] if p.role == "nic"):
                addr = topo.address(b, nic.rail)
                out[(a, b, nic.rail)] = E.walk(g, tables, nic.peer_node, addr)
    return out


@pytest.mark.parametrize("engine", E.ENGINES)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_host_reaches_every_host_without_a_loop(shape, engine):
    topo = build(SHAPES[shape])
    g = E.graph(topo)
    for multipath in (False, True):
        tables = E.compute(engine, g, multipath=multipath)
        paths = all_pairs(topo, g, tables)          # walk() raises on a loop, a hole or a wrong delivery
        assert all(paths.values())
        if not multipath or engine == "ftree":
            assert all(len(v) == 1 for v in tables.values()), "one port per destination"


def _turns_down_then_up(g, path):
    moves = [g.is_up_move(a, b) for a, b in zip(path, path[1:])]
    return any(not m1 and m2 for m1, m2 in zip(moves, moves[1:]))


@pytest.mark.parametrize("down", [(), ("leaf0", "spine0"), ("spine0", "core0"), ("leaf1", "spine1")])
@pytest.mark.parametrize("shape", ["fat-tree-k4", "clos3", "leaf-spine"])
def test_updn_never_turns_from_down_to_up(shape, down):
    topo = build(SHAPES[shape])
    dead = set()
    if down:
        a, b = down
        if b not in topo.nodes:
            pytest.skip(f"{shape} has no {b}")
        p = next(p for p in topo.ports[a] if p.peer_node == b)
        dead = {p.ifindex}
    g = E.graph(topo, dead)
    tables = E.compute("updn", g, multipath=True)
    for paths in all_pairs(topo, g, tables).values():
        for path in paths:
            assert not _turns_down_then_up(g, path), path
            if dead:
                assert down not in zip(path, path[1:]) and down[::-1] not in zip(path, path[1:])


@pytest.mark.parametrize("shape", ["fat-tree-k4", "fat-tree-k8", "leaf-spine", "clos3"])
def test_ftree_spreads_destinations_evenly_over_every_switchs_up_ports(shape):
    topo = build(SHAPES[shape])
    g = E.graph(topo)
    tables = E.compute("ftree", g)
    for s in g.adj:
        ups = [p for p, _, _ in g.ups(s)]
        if len(ups) < 2:
            continue
        per_port = Counter(tables[(s, a)][0] for a in g.dests if tables[(s, a)][0] in ups)
        counts = [per_port[p] for p in ups]
        assert max(counts) - min(counts) <= 1, f"{s}: destinations per up port {counts}"
        assert sum(counts) > 0


def test_ftree_gives_a_shift_permutation_on_a_fat_tree_disjoint_paths():
    topo = build(SHAPES["fat-tree-k4"])
    g = E.graph(topo)
    tables = E.compute("ftree", g)
    hosts = topo.hosts
    for shift in range(1, len(hosts)):
        use = Counter()
        for i, h in enumerate(hosts):
            (path,) = E.walk(g, tables, topo.leaf_of(h), topo.address(hosts[(i + shift) % len(hosts)]))
            use.update(zip(path, path[1:]))
        assert max(use.values()) == 1, f"shift {shift}: {use.most_common(2)}"


@pytest.mark.parametrize("engine", E.ENGINES)
def test_engines_route_around_a_dead_link_and_a_dead_switch(engine):
    topo = build(SHAPES["fat-tree-k4"])
    leaf_up = next(p for p in topo.ports["leaf0"] if p.peer_node == "spine0")
    spine2 = {p.ifindex for p in topo.ports["spine2"]}
    for dead in ({leaf_up.ifindex}, spine2):
        g = E.graph(topo, dead)
        tables = E.compute(engine, g)
        dead_nodes = {topo.port(i).node for i in dead} if dead == spine2 else set()
        for (a, b, _), paths in all_pairs(topo, g, tables).items():
            for path in paths:
                if dead != spine2:
                    assert ("leaf0", "spine0") not in zip(path, path[1:])
                assert not dead_nodes & set(path), path
        peers = {topo.port(i).peer_ifindex for i in dead}
        assert all(not (dead | peers) & set(ports) for ports in tables.values())


def test_minhop_keeps_the_routes_a_failure_does_not_touch():
    topo = build(SHAPES["fat-tree-k4"])
    before = E.compute("minhop", E.graph(topo))
    dead = next(p for p in topo.ports["spine0"] if p.peer_node == "core0")
    after = E.compute("minhop", E.graph(topo, {dead.ifindex}), prev=before)
    g = E.graph(topo)
    moved = {k for k in before if before[k] != after.get(k)}
    assert moved and len(moved) < len(before) // 10
    for s, addr in moved:                 # only routes whose old path crossed the dead link moved
        (path,) = E.walk(g, before, s, addr)
        assert {("spine0", "core0"), ("core0", "spine0")} & set(zip(path, path[1:])), (s, addr, path)


@pytest.mark.parametrize("multipath", [False, True])
@pytest.mark.parametrize("engine", E.ENGINES)
@pytest.mark.parametrize("shape", ["fat-tree-k4", "fat-tree-k8"])
def test_after_a_link_comes_back_the_tables_are_the_healthy_fabrics(shape, engine, multipath):
    """Down keeps what is still valid; up recomputes from scratch (as OpenSM), so the restored uplink carries
    its share again: leaf0's uplink to spine0 routes as many destinations as before the failure."""
    topo = build(SHAPES[shape])
    link = next(ln for ln in topo.links if {ln.a.node, ln.b.node} == {"leaf0", "spine0"})
    dead = frozenset({link.a.ifindex, link.b.ifindex})
    healthy = E.compute(engine, E.graph(topo), multipath=multipath)
    failed = E.reroute(engine, E.graph(topo, dead), healthy, came_up=False, multipath=multipath)
    assert all(not dead & set(ports) for ports in failed.values())
    back = E.reroute(engine, E.graph(topo), failed, came_up=True, multipath=multipath)
    assert back == healthy
    uplink = link.a.ifindex if link.a.node == "leaf0" else link.b.ifindex
    carried = sum(1 for ports in back.values() if ports[0] == uplink)
    assert carried == sum(1 for ports in healthy.values() if ports[0] == uplink) > 0


def test_keeping_the_old_choices_after_a_return_would_leave_the_link_idle():
    """Why the return recomputes: minhop fed its failed-state tables keeps every destination off the restored
    uplink (the counter ties are broken by the old choice), so that link would carry nothing."""
    topo = build(SHAPES["fat-tree-k4"])
    link = next(ln for ln in topo.links if {ln.a.node, ln.b.node} == {"leaf0", "spine0"})
    healthy = E.compute("minhop", E.graph(topo))
    failed = E.compute("minhop", E.graph(topo, {link.a.ifindex, link.b.ifindex}), prev=healthy)
    sticky = E.compute("minhop", E.graph(topo), prev=failed)
    uplink = link.a.ifindex if link.a.node == "leaf0" else link.b.ifindex
    assert sum(1 for ports in sticky.values() if ports[0] == uplink) == 0
    assert sticky != healthy


def test_distributed_groups_are_the_fibs_until_a_link_fails():
    topo = build({"spines": 4, "leaves": 3, "hosts_per_leaf": 2})
    router = Router(topo)
    pref = E.leaf_prefixes(topo)
    groups = E.prefix_groups(E.graph(topo))
    for (s, leaf), ports in groups.items():
        net, _ = pref[leaf][0]
        assert ports == frozenset(router.group(s, net)), (s, leaf)
    dead = next(p for p in topo.ports["leaf0"] if p.peer_node == "spine1")
    after = E.prefix_groups(E.graph(topo, {dead.ifindex}))
    spine1_to_leaf0 = topo.port(dead.peer_ifindex)
    assert after[("spine1", "leaf0")] == frozenset()                      # withdrawn: no valley-free path
    for leaf in ("leaf1", "leaf2"):
        to_spine1 = next(p.ifindex for p in topo.ports[leaf] if p.peer_node == "spine1")
        assert to_spine1 not in after[(leaf, "leaf0")] and len(after[(leaf, "leaf0")]) == 3
        assert to_spine1 in after[(leaf, "leaf2" if leaf == "leaf1" else "leaf1")]
    assert dead.ifindex not in after[("leaf0", "leaf1")]
    assert spine1_to_leaf0.ifindex not in after[("spine1", "leaf0")]
