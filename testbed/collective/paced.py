"""``paced``: an all-to-all's chunks placed as weighted-split places them, and those that still cross a hot link
sent across it one after another, when it has room, instead of all at once.

Per step: each chunk (flow) goes on the queue pair weighted-split picks (``weighted_split.py``: a QP whose path
crosses a slow, loaded or queueing link carries fewer of its connection's chunks). A link is *hot* when its
available rate (view.py) is below ``HOT`` of the fastest link's the step crosses. The chunks crossing a hot link
are ordered largest first and each is held back until the ones before it would have crossed it at its available
rate (the first starts at once); a chunk crossing several hot links waits for the latest of them. Every other
chunk starts at once. So a hot link carries one chunk at a time at its full rate — no queue of chunks that all
finish late together — while the rest of each host's chunks use its NIC meanwhile.
"""
from __future__ import annotations

from .policy import Operation, Policy
from .weighted_split import WeightedSplit

HOT = 0.5                 # a link is hot below this share of the fastest link's available rate in the step


class Paced(Policy):
    name = "paced"

    @classmethod
    def check(cls, scen) -> None:
        if not any(j.pattern == "all-to-all" for j in scen.traffic.job_list()):
            raise ValueError("@traffic.collective.adapt.policy: paced orders the chunks of all-to-all jobs; this "
                             "traffic has none")

    def decide(self, op: Operation, view) -> dict[int, int]:
        return WeightedSplit().decide(op, view)      # one QP per connection: it moves nothing

    def delays(self, op: Operation, view, ports: dict[int, int | None]) -> dict[int, float]:
        out: dict[int, float] = {}
        for flows in op.steps().values():
            paths = {f.flow_id: view.path(f.plan, ports.get(f.flow_id) or f.sport) for f in flows}
            rates = {p: view.available_bps(p) for path in paths.values() for p in path}
            if not rates:
                continue
            fastest = max(rates.values())
            hot = {p for p, r in rates.items() if r < HOT * fastest}
            free: dict[int, float] = {}                    # hot link → when the chunks placed so far have crossed it
            for f in sorted(flows, key=lambda f: (-f.bytes, f.flow_id)):
                on = [p for p in paths[f.flow_id] if p in hot]
                if not on:
                    continue
                start = max(free.get(p, 0.0) for p in on)
                for p in on:
                    free[p] = start + f.bytes * 8 / max(rates[p], 1.0)
                if start > 0:
                    out[f.flow_id] = start
        return out
