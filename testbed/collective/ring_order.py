"""``ring-order``: the ring all-reduce runs, each iteration, the ring order that the network lets finish soonest.

With ``adapt.rings`` k (3 unset), every all-reduce iteration is laid out over k ring orders — the job's own host
order and k − 1 seeded others (workloads/collectives.py ``ring_orders``), fixed for the job as NCCL's rings
are — each with its own connections and so, under ECMP, its own paths. When the iteration starts the policy
predicts each order's time from the view: the sum over its 2(N−1) steps of the busiest link's bits ÷ its
available rate (``weighted_split.step_time``), and runs the fastest — the job's own order unless another is
predicted at least 5 % faster (``MARGIN``); the flows of the others do not run. A degraded, loaded or queueing link that an order's ring edges cross makes that order
slower; one whose edges stay on their leaves, or hash around the link, wins.
"""
from __future__ import annotations

from .policy import Operation, Policy
from .weighted_split import step_time

MARGIN = 0.05             # another order runs only when predicted at least this much faster


class RingOrder(Policy):
    name = "ring-order"
    picks_rings = True

    @classmethod
    def check(cls, scen) -> None:
        jobs = scen.traffic.job_list()
        if not any(j.pattern == "allreduce" for j in jobs):
            raise ValueError("@traffic.collective.adapt.policy: ring-order picks the ring of all-reduce jobs; this "
                             "traffic has none")

    def decide(self, op: Operation, view) -> dict[int, int | None]:
        variants = op.variants()
        if len(variants) < 2:
            return {}
        cost = {}
        for v, flows in variants.items():
            steps: dict[int, list] = {}
            for f in flows:
                steps.setdefault(f.step, []).append(f)
            cost[v] = sum(step_time(fs, {}, view) for fs in steps.values())
        best = min(cost, key=lambda v: (cost[v], v))
        if cost[0] <= cost[best] * (1 + MARGIN):        # the view is an estimate: keep the job's own order
            best = 0
        return {f.flow_id: None for v, flows in variants.items() if v != best for f in flows}
