"""Entropy planning: which UDP/TCP source port puts each flow on a path of its own, computed from every switch's
real ECMP hash — pure (no kernel, no sockets), so that it can be tested on any shape.

A fabric controller knows what a NIC does not: the topology, every switch's next-hop groups, hash function,
seed and hash fields. With that it predicts, for any candidate source port, the exact path ECMP will give a
flow (``PathModel.path``: the same longest-prefix match as ``topology.fibwalk``, the same hash and slot choice as
``ebpf/lib/hash.h`` through ``datapath.hashing``), and picks ports so that the planned flows share as few links as
the topology allows — ECMP without collisions and without the reordering of spraying.

``Planner.assign`` takes a flow (its 5-tuple but the source port, and its rate) and returns a port: the
candidates' distinct paths are found by trying ports (a seeded sequence per flow), and the flow takes the path
whose busiest link would be least loaded relative to its rate (then: fewest links shared with other flows, then
the least total load). ``Planner.plan`` assigns a set of flows at once, largest first, then repairs: a flow on a
shared link is moved to a free path, possibly moving one other flow out of the way (an augmenting step), until no
move helps; then a seeded local search (min-conflicts with a little random walk) re-places one flow at a time
while some flow shares a link it could avoid. On leaf–spine and fat-tree permutations this finds the
contention-free assignment whenever one exists among the candidate paths (k=4 fat-tree: 20 random permutations
of 20; the repairs alone left 3–4 shared links on 12). ``release`` frees a flow's links.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..datapath import hashing
from ..topology.fibwalk import Router

PORT_RANGE = (49152, 65535)          # the ephemeral range the candidates are drawn from
TRIES = 256                          # candidate ports tried per flow to find its distinct paths


@dataclass(frozen=True)
class PlanFlow:
    """A flow to place: everything its ECMP hash reads except the source port, and its rate (the load it adds
    to each link of its path; 1 when unknown: flows are then counted)."""
    key: int
    src: str
    saddr: str
    daddr: str
    dport: int
    proto: int = 17
    rate_bps: float = 1.0
    dqp: int = 0                     # RoCE: the destination QP (hash_fields roce_qp)
    rail: int = 0


class PathModel:
    """ECMP's path for a 5-tuple, predicted switch by switch (a path = the egress ifindexes it leaves by, the
    source host's NIC first)."""

    def __init__(self, topo, hash_seed: int, hash_fields=(), down: frozenset = frozenset()):
        self.topo, self.router = topo, Router(topo)
        self.seed = {sw: hashing.switch_seed(hash_seed, topo.switch_ids[sw]) for sw in topo.switches}
        self.fields = hashing.hash_mask(hash_fields)
        self.down = down                 # ifindexes whose link is down: groups skip them (fast failover)
        self.rates: dict[int, float] = {}   # ifindex → its rate now, where it differs from the topology's

    def path(self, f: PlanFlow, sport: int) -> tuple[int, ...]:
        nic = self.topo.port_named(f.src, f"eth{f.rail}")
        out, node = [nic.ifindex], nic.peer_node
        for _ in range(16):
            group = self.router.group(node, f.daddr)
            if not group:
                raise ValueError(f"{node}: no route to {f.daddr}")
            live = [p for p in group if p not in self.down] or list(group)
            h = hashing.pkt_hash(self.seed[node], self.fields, f.saddr, f.daddr, sport, f.dport, f.proto, f.dqp)
            port = live[hashing.pick(h, len(live))] if len(live) == len(group) else \
                group[hashing.failover_index(h, group, self.down) or 0]
            out.append(port)
            peer = self.topo.port(port).peer_node
            if self.topo.nodes[peer].kind == "host":
                return tuple(out)
            node = peer
        raise ValueError(f"{f.src} → {f.daddr}: no host within 16 hops")

    def capacity(self, ifindex: int) -> float:
        """The port's rate now (bit/s): a failure's rate change, else the link's."""
        return float(self.rates.get(ifindex) or self.topo.port(ifindex).rate_bps)


@dataclass
class Planner:
    """Source ports for flows, planned over ``model``'s paths (module docstring)."""
    model: PathModel
    tries: int = TRIES
    seed: int = 0
    load: dict[int, float] = field(default_factory=dict)          # egress ifindex → planned bits/s
    users: dict[int, set] = field(default_factory=dict)           # egress ifindex → flows planned over it
    chosen: dict[int, tuple[int, tuple[int, ...], PlanFlow]] = field(default_factory=dict)   # key → port, path
    _memo: dict = field(default_factory=dict, repr=False)         # (key, down ports) → candidates

    def candidates(self, f: PlanFlow) -> dict[tuple[int, ...], int]:
        """Distinct path → the first port (of a seeded sequence) that gives it, under the model's down ports.
        Remembered per flow and set of down ports. With ports down, only the ports of the flow's paths on the
        healthy fabric are walked again (a handful, not ``tries``): fast failover moves a port whose path crossed
        a down link onto another of those paths, so they still reach every path there is — what lets the
        adaptive controller re-plan within its interval."""
        down = self.model.down
        got = self._memo.get((f.key, down))
        if got is None:
            healthy = self._memo.get((f.key, frozenset())) if down else None
            got = {}
            if healthy is not None:
                for sp in healthy.values():
                    got.setdefault(self.model.path(f, sp), sp)
            else:
                rng = random.Random((self.seed << 32) ^ f.key)
                lo, hi = PORT_RANGE
                for _ in range(self.tries):
                    sp = rng.randint(lo, hi)
                    got.setdefault(self.model.path(f, sp), sp)
            self._memo[(f.key, down)] = got
        return got

    def _cost(self, f: PlanFlow, path: tuple[int, ...]) -> tuple[float, int, float]:
        util = [(self.load.get(p, 0.0) + f.rate_bps) / self.model.capacity(p) for p in path]
        shared = sum(1 for p in path if self.users.get(p))
        return max(util), shared, sum(util)

    def take(self, f: PlanFlow, sport: int, path: tuple[int, ...]) -> None:
        """Put ``f`` on ``path`` (reached from ``sport``), adding its rate to each link."""
        for p in path:
            self.load[p] = self.load.get(p, 0.0) + f.rate_bps
            self.users.setdefault(p, set()).add(f.key)
        self.chosen[f.key] = (sport, path, f)

    def release(self, key: int) -> None:
        """Free a flow's links (it ended, or is being moved)."""
        got = self.chosen.pop(key, None)
        if got is None:
            return
        _, path, f = got
        for p in path:
            self.load[p] -= f.rate_bps
            self.users[p].discard(key)

    def assign(self, f: PlanFlow, cands: dict | None = None) -> int:
        """Place one flow on its best path now; returns its source port."""
        self.release(f.key)
        cands = cands or self.candidates(f)
        path = min(cands, key=lambda p: (self._cost(f, p), cands[p]))
        self.take(f, cands[path], path)
        return cands[path]

    def shared_links(self) -> int:
        """Links carrying more than one planned flow."""
        return sum(1 for u in self.users.values() if len(u) > 1)

    def plan(self, flows: list[PlanFlow], rounds: int = 8) -> dict[int, int]:
        """Place every flow (largest first), repair shared links, then search locally while avoidable sharing
        is left (module docstring); key → source port."""
        cands = {f.key: self.candidates(f) for f in flows}
        for f in sorted(flows, key=lambda f: (-f.rate_bps, f.key)):
            self.assign(f, cands[f.key])
        for _ in range(rounds):
            if not self._repair(cands):
                break
        self._search(cands)
        return {k: v[0] for k, v in self.chosen.items()}

    def _search(self, cands: dict, steps_per_flow: int = 1000, noise: float = 0.1, cap: int = 20_000) -> None:
        """Min-conflicts: while a flow shares a link that not all of its candidate paths cross, re-place one such
        flow (chosen at random) on its least-cost path, ties broken at random — or, with probability ``noise``,
        on any of its paths (a random walk out of local minima), for at most ``steps_per_flow`` steps a flow and
        ``cap`` in all (sharing may be unavoidable: more flows than paths). Keeps the best assignment seen
        (the lowest busiest-link utilisation — a slow link is worse than sharing a fast one —, then the fewest
        shared links); seeded, so a plan is reproducible."""
        fixed = {k: frozenset.intersection(*map(frozenset, c)) for k, c in cands.items() if c}
        avoidable = lambda: [k for k, (_, path, _) in self.chosen.items()          # noqa: E731
                             if any(len(self.users[p]) > 1 for p in path if p not in fixed[k])]
        score = lambda: (round(self._worst(), 9), self.shared_links())            # noqa: E731
        best, best_score = dict(self.chosen), score()
        rng = random.Random(self.seed ^ 0x5EA7C4)
        for _ in range(min(cap, steps_per_flow * len(self.chosen))):
            hot = avoidable()
            if not hot:
                break
            key = rng.choice(sorted(hot))
            _, _, f = self.chosen[key]
            self.release(key)
            paths = list(cands[key])
            path = rng.choice(paths) if rng.random() < noise else \
                min(paths, key=lambda p: (self._cost(f, p), rng.random()))
            self.take(f, cands[key][path], path)
            if (now := score()) < best_score:
                best, best_score = dict(self.chosen), now
        if score() > best_score:
            for key in list(self.chosen):
                self.release(key)
            for key, (sport, path, f) in best.items():
                self.take(f, sport, path)

    def _worst(self) -> float:
        """The busiest link's planned utilisation."""
        return max((self.load[p] / self.model.capacity(p) for p, u in self.users.items() if u), default=0.0)

    def _free(self, path: tuple[int, ...], ignore: int | None = None) -> bool:
        return all(not (self.users.get(p, set()) - {ignore}) for p in path)

    def _repair(self, cands: dict) -> bool:
        """One pass over the flows on shared links: move each to a path of free links, or move one flow that
        blocks such a path to a free path of its own and take its place. True if anything moved."""
        moved = False
        for key in sorted(self.chosen):
            sport, path, f = self.chosen[key]
            if all(len(self.users.get(p, ())) <= 1 for p in path):
                continue
            self.release(key)
            free = [p for p in cands[key] if self._free(p)]
            if free:
                self.take(f, cands[key][free[0]], free[0])
                moved = True
                continue
            if self._augment(f, cands):
                moved = True
                continue
            self.take(f, sport, path)
        return moved

    def _augment(self, f: PlanFlow, cands: dict) -> bool:
        """Take a path blocked by exactly one other flow that can itself move to a free path."""
        for path, sport in cands[f.key].items():
            blockers = {u for p in path for u in self.users.get(p, ())}
            if len(blockers) != 1:
                continue
            (other,) = blockers
            o_sport, o_path, o = self.chosen[other]
            self.release(other)
            alt = [p for p in cands[other] if p != o_path and self._free(p) and not set(p) & set(path)]
            if alt:
                self.take(f, sport, path)
                self.take(o, cands[other][alt[0]], alt[0])
                return True
            self.take(o, o_sport, o_path)
        return False
