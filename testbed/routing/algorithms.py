"""Routing engines: forwarding computed from the links that are up, as pure functions (no kernel, no maps).

The subnet manager (routing.py, ``switch.routing: sm``) runs one of ``minhop``, ``updn`` and ``ftree`` after
every sweep that saw a link change; the distributed side (``routing: distributed``) uses ``prefix_groups``,
the ECMP groups a routing protocol converges to. The algorithms follow the facts of OpenSM's engines
(osm_ucast_mgr.c / osm_switch.c for minhop, osm_ucast_updn.c, osm_ucast_ftree.c); the code is this project's:

- **minhop**: shortest paths; at each switch a destination goes out of the min-hop port that carries the fewest
  destinations so far (a per-port counter, destinations taken in address order), ties by port order. After ports
  go down, a port that still is a min-hop port keeps its destinations (fewer entries move); after a port comes
  back up, everything is computed afresh (``reroute``), as OpenSM does.
- **updn**: up*/down*: switches are ranked by tier (the top tier — cores, or spines of a 2-tier fabric — are
  the roots, rank 0); a move to a lower rank is *up* (equal ranks: towards the smaller switch id). A path never
  turns from down to up. A switch that has a downward path to the destination uses it (so a packet that
  already went down never has to turn up), otherwise the up ports of the shortest legal paths; the choice
  among them is minhop's counter.
- **ftree**: per destination (leaf by leaf, host by host), one upward *main path* from the destination's leaf
  to the top: at each switch the up port whose main paths are fewest (ties: the upper switch that carries
  fewest main paths of its class — switches with the same upper neighbours — then port order). Every switch
  below a main-path switch routes up towards it; switches the main path does not reach (secondary paths) get
  the up*/down* route, balanced over their up ports by the same per-port counter. On a fat-tree this gives
  each destination one upward port per switch, and consecutive destinations different ports, so a shift
  permutation shares no link.

Tables map (switch, destination address) → a tuple of egress ifindexes: the engine's choice first, then (with
``multipath``) the other ports the engine allows, which the datapath's load balancer may use instead.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from ..topology.model import TIERS, Topology

INF = 1 << 30
ENGINES = ("minhop", "updn", "ftree")

Tables = dict[tuple[str, str], tuple[int, ...]]


@dataclass
class Graph:
    """The switches and the live links between them. ``adj[s]``: (port, peer switch, peer port) in s's port
    order; ``dests``: destination address → (its leaf, the leaf's port towards the host), live host links
    only."""
    topo: Topology
    adj: dict[str, list[tuple[int, str, int]]]
    dests: dict[str, tuple[str, int]]
    rank: dict[str, int]
    sid: dict[str, int]
    down: frozenset = field(default_factory=frozenset)

    @property
    def switches(self) -> list[str]:
        return list(self.adj)

    def is_up_move(self, s: str, n: str) -> bool:
        """s → n goes up: towards a lower rank, or an equal rank and a smaller switch id."""
        rs, rn = self.rank[s], self.rank[n]
        return rn < rs or (rn == rs and self.sid[n] < self.sid[s])

    def ups(self, s: str) -> list[tuple[int, str, int]]:
        return [e for e in self.adj[s] if self.is_up_move(s, e[1])]

    def downs(self, s: str) -> list[tuple[int, str, int]]:
        return [e for e in self.adj[s] if not self.is_up_move(s, e[1])]


def graph(topo: Topology, down=frozenset()) -> Graph:
    """The fabric as the SM sees it: a link counts when neither of its switch ports is in ``down``."""
    down = frozenset(down)
    top = max((TIERS.index(t) for t in topo.tiers), default=0)
    adj: dict[str, list[tuple[int, str, int]]] = {}
    dests: dict[str, tuple[str, int]] = {}
    for sw in topo.switches:
        out = []
        for p in topo.ports[sw]:
            if p.ifindex in down or p.peer_ifindex in down:
                continue
            if topo.nodes[p.peer_node].is_switch:
                out.append((p.ifindex, p.peer_node, p.peer_ifindex))
            elif p.role == "down":
                nic = topo.port(p.peer_ifindex)
                dests[nic.address] = (sw, p.ifindex)
        adj[sw] = out
    rank = {sw: top - TIERS.index(topo.nodes[sw].kind) for sw in topo.switches}
    order = {a: i for i, a in enumerate(_addresses(topo))}
    dests = dict(sorted(dests.items(), key=lambda kv: order[kv[0]]))
    return Graph(topo, adj, dests, rank, dict(topo.switch_ids), down)


def _addresses(topo: Topology) -> list[str]:
    """Every host NIC address, hosts in topology order (leaf by leaf), NICs by rail."""
    return [p.address for h in topo.hosts for p in topo.ports[h] if p.address]


# ---------------------------------------------------------------- distances

def _bfs(g: Graph, dest: str) -> dict[str, int]:
    """Hops from every switch to switch ``dest`` over live links (plain shortest paths)."""
    dist = {dest: 0}
    q = deque([dest])
    while q:
        n = q.popleft()
        for _, m, _ in g.adj[n]:
            if m not in dist:
                dist[m] = dist[n] + 1
                q.append(m)
    return dist


def _updn(g: Graph, dest: str) -> tuple[dict[str, int], dict[str, int]]:
    """(down, act): ``down[s]`` = hops from s to ``dest`` using down moves only; ``act[s]`` = the length of
    the up*/down* route s takes (its downward path if it has one, else one up move plus the best upper
    switch's route). Missing keys: no legal path."""
    down = {dest: 0}
    q = deque([dest])
    while q:
        n = q.popleft()
        for _, m, _ in g.adj[n]:
            if m not in down and g.is_up_move(n, m):      # m → n is a down move
                down[m] = down[n] + 1
                q.append(m)
    act: dict[str, int] = {}
    for s in sorted(g.adj, key=lambda s: (g.rank[s], g.sid[s])):   # upper switches first
        if s in down:
            act[s] = down[s]
        else:
            best = min((act[m] for _, m, _ in g.ups(s) if m in act), default=None)
            if best is not None:
                act[s] = best + 1
    return down, act


def updn_candidates(g: Graph, dest: str) -> dict[str, list[tuple[int, str]]]:
    """Per switch (≠ dest) that can reach switch ``dest``: the (port, next switch) of its shortest legal
    up*/down* routes, in port order."""
    down, act = _updn(g, dest)
    out: dict[str, list[tuple[int, str]]] = {}
    for s in g.adj:
        if s == dest or s not in act:
            continue
        if s in down:
            c = [(p, m) for p, m, _ in g.downs(s) if down.get(m) == down[s] - 1]
        else:
            c = [(p, m) for p, m, _ in g.ups(s) if act.get(m) == act[s] - 1]
        if c:
            out[s] = c
    return out


def minhop_candidates(g: Graph, dest: str) -> dict[str, list[tuple[int, str]]]:
    dist = _bfs(g, dest)
    return {s: [(p, m) for p, m, _ in g.adj[s] if dist.get(m, INF) == dist[s] - 1]
            for s in g.adj if s != dest and s in dist}


# ---------------------------------------------------------------- engines

def _counter_tables(g: Graph, candidates, multipath: bool, prev: Tables | None) -> Tables:
    """minhop's port selection over per-destination candidate ports: per switch, destinations in address
    order, the candidate with the fewest destinations so far (keeping a previous choice that is still a
    candidate)."""
    per_leaf = {}
    tables: Tables = {}
    load: dict[str, Counter] = {s: Counter() for s in g.adj}
    for addr, (leaf, hport) in g.dests.items():
        if leaf not in per_leaf:
            per_leaf[leaf] = candidates(g, leaf)
        tables[(leaf, addr)] = (hport,)
        for s, cand in per_leaf[leaf].items():
            ports = [p for p, _ in cand]
            old = prev.get((s, addr)) if prev else None
            if old and old[0] in ports:
                pick = old[0]
            else:
                pick = min(ports, key=lambda p: (load[s][p], ports.index(p)))
            load[s][pick] += 1
            tables[(s, addr)] = (pick,) + (tuple(p for p in ports if p != pick) if multipath else ())
    return tables


def minhop(g: Graph, multipath: bool = False, prev: Tables | None = None) -> Tables:
    return _counter_tables(g, minhop_candidates, multipath, prev)


def updn(g: Graph, multipath: bool = False, prev: Tables | None = None) -> Tables:
    return _counter_tables(g, updn_candidates, multipath, prev)


def ftree(g: Graph, multipath: bool = False, prev: Tables | None = None) -> Tables:
    """Fat-tree routing (see the module docstring). ``multipath`` and ``prev`` are ignored: every destination
    gets exactly one port per switch, chosen afresh (the balance is over all destinations)."""
    cnt_down: Counter = Counter()         # per up port: main paths that go up through it
    main: Counter = Counter()             # per upper switch: main paths it carries down
    cls_main: Counter = Counter()         # … per class of upper switch (switches with the same upper neighbours)
    cnt_up: Counter = Counter()           # per up port: destinations routed up through it (any path)
    cls = {s: (frozenset(m for _, m, _ in g.ups(s)) or frozenset([s])) for s in g.adj}
    routes: dict[str, dict[str, tuple[int, int]]] = {}     # addr → switch → (port, hops)
    tables: Tables = {}

    def go_down(x: str, came_from: str | None, addr: str, r: dict) -> None:
        """Every switch below x (but the one the main path came from) routes up towards x, unless it already
        has a route at least as short."""
        for _, child, cport in g.downs(x):
            if child == came_from:
                continue
            h = r[x][1] + 1
            if child in r and r[child][1] <= h:
                continue
            if child in r and g.is_up_move(child, g.topo.port(r[child][0]).peer_node):
                cnt_up[r[child][0]] -= 1
            r[child] = (cport, h)
            cnt_up[cport] += 1
            go_down(child, None, addr, r)

    for addr, (leaf, hport) in g.dests.items():
        r = {leaf: (hport, 0)}
        x, came = leaf, None
        while True:
            go_down(x, came, addr, r)
            ups = g.ups(x)
            if not ups:
                break
            order = {e[0]: i for i, e in enumerate(ups)}
            port, upper, uport = min(ups, key=lambda e: (cnt_down[e[0]], cls_main[cls[e[1]]], main[e[1]],
                                                         order[e[0]]))
            cnt_down[port] += 1
            main[upper] += 1
            cls_main[cls[upper]] += 1
            h = r[x][1] + 1
            if upper not in r or h < r[upper][1]:
                r[upper] = (uport, h)
            came, x = x, upper
        routes[addr] = r
    # secondary paths: switches the main path did not reach take the up*/down* route, balanced by cnt_up
    per_leaf: dict[str, tuple[dict, dict]] = {}
    for addr, (leaf, _) in g.dests.items():
        r = routes[addr]
        if leaf not in per_leaf:
            per_leaf[leaf] = _updn(g, leaf)
        down, act = per_leaf[leaf]
        for s in sorted((s for s in g.adj if s not in r and s in act), key=lambda s: act[s]):
            if s in down:
                cand = [p for p, m, _ in g.downs(s) if down.get(m) == down[s] - 1]
                pick = cand[0]
            else:
                cand = [p for p, m, _ in g.ups(s) if act.get(m) == act[s] - 1]
                pick = min(cand, key=lambda p: (cnt_up[p], cand.index(p)))
                cnt_up[pick] += 1
            r[s] = (pick, act[s])
        for s, (p, _) in r.items():
            tables[(s, addr)] = (p,)
    return tables


ENGINE_FUNCS = {"minhop": minhop, "updn": updn, "ftree": ftree}


def compute(engine: str, g: Graph, multipath: bool = False, prev: Tables | None = None) -> Tables:
    return ENGINE_FUNCS[engine](g, multipath=multipath, prev=prev)


def reroute(engine: str, g: Graph, tables: Tables, came_up: bool, multipath: bool = False) -> Tables:
    """The tables after a change of link state, as OpenSM computes them: when a port came back up every route
    is computed afresh (the existing tables are ignored), so the fabric routes exactly as one that never
    failed — a restored link carries its share again; when ports only went down, the choices that are still
    valid stay (fewer entries move)."""
    return compute(engine, g, multipath=multipath, prev=None if came_up else (tables or None))


# ---------------------------------------------------------------- the distributed side

def leaf_prefixes(topo: Topology) -> dict[str, list[tuple[str, int]]]:
    """leaf → the prefixes it owns (its hosts' subnets: the empty-group entries a leaf has for its own /24)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for e in topo.fib:
        if not e.ports and topo.nodes[e.switch].kind == "leaf":
            out.setdefault(e.switch, []).append((e.prefix, e.plen))
    return out


def prefix_groups(g: Graph, leaves=None) -> dict[tuple[str, str], frozenset[int]]:
    """(switch, destination leaf) → the egress ports of every shortest up*/down* route to it over the live
    links: the ECMP group a routing protocol (BGP in a Clos, valley-free) converges to once it has learnt the
    failure. A switch without a legal route to the leaf maps to an empty set."""
    out = {}
    for leaf in (leaves if leaves is not None else [s for s in g.adj if g.topo.nodes[s].kind == "leaf"]):
        cand = updn_candidates(g, leaf)
        for s in g.adj:
            if s != leaf:
                out[(s, leaf)] = frozenset(p for p, _ in cand.get(s, ()))
    return out


# ---------------------------------------------------------------- checks (tests, and anyone adding an engine)

def walk(g: Graph, tables: Tables, src_leaf: str, addr: str, limit: int = 32) -> list[list[str]]:
    """Every switch path a packet for ``addr`` may take from ``src_leaf`` following ``tables`` (each port
    of a group); raises ValueError on a loop, a missing entry or a dead end."""
    paths = []

    def step(s: str, path: list[str]) -> None:
        if len(path) > limit or s in path[:-1]:
            raise ValueError(f"loop towards {addr}: {' → '.join(path)}")
        ports = tables.get((s, addr))
        if not ports:
            raise ValueError(f"{s}: no route for {addr} (path {' → '.join(path)})")
        for p in ports:
            port = g.topo.port(p)
            if not g.topo.nodes[port.peer_node].is_switch:
                if port.peer_node != g.topo.port(port.peer_ifindex).node or \
                        g.topo.port(port.peer_ifindex).address != addr:
                    raise ValueError(f"{s}: {addr} delivered to {port.peer_node}")
                paths.append(path)
            else:
                step(port.peer_node, path + [port.peer_node])
    step(src_leaf, [src_leaf])
    return paths
