"""Adaptive entropy: every interval, the controller looks at what the fabric measured and moves flows that sit
on failed, overloaded or queueing links to better paths — pure logic over a ``Planner`` (no kernel), fed by the
service with the datapath's readings.

Each ``tick`` gets the switch ports the datapath treats as down, every switch port's drain rate now (a failure's
rate change lowers it) and the queue model's depth per port, and returns the moves as (flow, new source port,
reason), the reasons in this order:

- ``failure`` — a flow whose path crosses a down link (either end down) is re-planned at once, over the paths
  that avoid every down link; and when the set of down ports changes, every flow's path is recomputed (a port
  that comes back changes where the switches' fast failover sends the flows that hashed onto it).
- ``load`` — a link whose rate dropped (a failure's rate change) below its planned load (the flows planned
  over it, at their rates) is overloaded; its flows, largest first, move to the path whose busiest link would
  be least loaded, when that is at least ``GAIN`` better than where they are. (A link the plan itself fills
  beyond its rate — hosts faster than the fabric — has no better path: the plan already chose the least
  loaded.)
- ``queue`` — a link whose queue model holds more than ``QUEUE_SHARE`` of its buffer although the plan does not
  overload it (traffic the controller was not told of, a rate it did not know) counts as full for the next
  decision: one of its flows moves if a path with room exists.

A moved flow stays put for ``HOLD`` intervals (no flapping), and at most one flow leaves each hot link per tick
(the link's other flows may be fine once one has gone).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .planner import PlanFlow, Planner

GAIN = 0.1              # a move must cut the flow's worst link utilisation by this share
QUEUE_SHARE = 0.5       # a queue holding more than this share of its port's buffer is hot
HOLD = 3                # intervals a moved flow stays on its new path


@dataclass
class Adapter:
    planner: Planner
    flows: dict[int, PlanFlow]                       # the active planned flows, by key
    tick_no: int = 0
    held: dict[int, int] = field(default_factory=dict)   # key → tick until which it stays
    down: frozenset = frozenset()
    cands: dict[int, dict] = field(default_factory=dict)   # key → its candidate paths under ``down`` (cached)
    changed: bool = False                            # the last tick saw ports go down, come back or change rate

    def end(self, key: int) -> None:
        """The flow ended: its links are free."""
        self.flows.pop(key, None)
        self.planner.release(key)

    def tick(self, down: set[int], rates: dict[int, float], queues: dict[int, int]) -> list[tuple[int, int, str]]:
        self.tick_no += 1
        model = self.planner.model
        down = frozenset(down)
        self.changed = down != self.down or rates != model.rates     # the fabric changed since the last tick
        model.rates = dict(rates)
        moves: list[tuple[int, int, str]] = []
        if down != self.down:
            self.down = model.down = down
            self.cands.clear()
            moves += self._after_failure()
        moves += self._relieve(queues)
        return moves

    # -- failures
    def _candidates(self, f: PlanFlow) -> dict[tuple[int, ...], int]:
        """The flow's paths that cross no down link (all of them if every one does)."""
        if f.key not in self.cands:
            every = self.planner.candidates(f)
            self.cands[f.key] = {p: s for p, s in every.items() if not self._dead(p)} or every
        return self.cands[f.key]

    def _dead(self, path: tuple[int, ...]) -> bool:
        topo = self.planner.model.topo
        return any(p in self.down or topo.port(p).peer_ifindex in self.down for p in path)

    def _after_failure(self) -> list[tuple[int, int, str]]:
        pl, out = self.planner, []
        for key in sorted(self.flows):
            sport, path, f = pl.chosen[key]
            now = pl.model.path(f, sport)
            if now == path and not self._dead(now):
                continue
            pl.release(key)
            new = pl.assign(f, self._candidates(f))
            self.held[key] = self.tick_no + HOLD
            if new != sport:
                out.append((key, new, "failure"))
        return out

    # -- load and queues
    def _util(self, path: tuple[int, ...], extra: dict[int, float], add: float = 0.0) -> float:
        """The path's busiest link's utilisation: its planned load, plus ``extra`` (queueing links counted full)
        and ``add`` (a flow being tried there)."""
        pl = self.planner
        return max((pl.load.get(p, 0.0) + extra.get(p, 0.0) + add) / pl.model.capacity(p) for p in path)

    def _relieve(self, queues: dict[int, int]) -> list[tuple[int, int, str]]:
        pl, topo = self.planner, self.planner.model.topo
        cap = pl.model.capacity
        over = {p for p, u in pl.users.items()
                if u and cap(p) < 0.99 * topo.port(p).rate_bps and pl.load.get(p, 0.0) > cap(p) * 1.01}
        queued = {p for p, q in queues.items() if pl.users.get(p) and p not in over
                  and q > QUEUE_SHARE * topo.port(p).buffer_bytes}
        # a queueing link counts as full: what it would take to fill it on top of its plan
        extra = {p: max(0.0, cap(p) - pl.load.get(p, 0.0)) for p in queued}
        out = []
        for hot, reason in [(p, "load") for p in sorted(over)] + [(p, "queue") for p in sorted(queued)]:
            users = sorted(pl.users.get(hot, ()), key=lambda k: (-self.flows[k].rate_bps if k in self.flows else 0, k))
            for key in users:
                if key not in self.flows or self.held.get(key, 0) > self.tick_no:
                    continue
                sport, path, f = pl.chosen[key]
                worst = self._util(path, extra)
                pl.release(key)
                cands = self._candidates(f)
                best = min(cands, key=lambda p: (self._util(p, extra, f.rate_bps), cands[p]))
                if best != path and self._util(best, extra, f.rate_bps) < worst * (1 - GAIN):
                    pl.take(f, cands[best], best)
                    self.held[key] = self.tick_no + HOLD
                    out.append((key, cands[best], reason))
                    break                                   # one flow off each hot link per tick
                pl.take(f, sport, path)
        return out
