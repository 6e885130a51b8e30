"""What the controller plans: flows, or the queue pairs of a schedule.

A pattern's flows (pairs, permutation, all-to-all, incast) are each a connection of their own, planned as such.
A schedule's flows (collective jobs, replays) are many short transfers over few long-lived queue pairs: a ring
all-reduce sends every step over the same QP from each host to the next. A RoCE NIC gives a QP one UDP source
port for its life, so the controller plans the QPs — one planned flow per (source, destination, rail, QP), keyed
by its first flow's id, at the NIC's line rate — and every transfer on a QP gets the QP's port. The QPs of one
job are taken to run at once (a ring's are; a pairwise all-to-all's are a superset of each step's), so the plan
keeps them apart where paths of their own exist.

``planned_run`` is the one computation both helpers make: the controller (service.py) answers the hosts from it,
and the collective helper (collective/decider.py) predicts from it the paths its policies weigh. It is
deterministic in the topology, the switches' hashes, the seed and the flows.
"""
from __future__ import annotations

from dataclasses import dataclass

from .planner import PathModel, PlanFlow, Planner


def plan_flow(f, topo, key: int | None = None) -> PlanFlow:
    """A planner's view of a workloads Flow (its rate: the flow's, else its NIC's line rate)."""
    rate = f.rate_bps or topo.port_named(f.src, f"eth{f.rail}").rate_bps
    return PlanFlow(f.flow_id if key is None else key, f.src, f.src_addr, f.dst_addr, f.dport,
                    f.ip_proto, float(rate), rail=f.rail)


@dataclass
class PlannedRun:
    planner: Planner
    known: dict[int, PlanFlow]           # key → what is planned under it
    key_of: dict[int, int]               # flow id → its key (itself, or its QP's first flow)
    scheduled: bool                      # keys are QPs: a flow's end frees nothing

    def port(self, flow_id: int) -> int | None:
        """The source port planned for a flow (None: not a flow of the plan)."""
        got = self.planner.chosen.get(self.key_of.get(flow_id, flow_id))
        return got[0] if got else None


def planned_run(scen, topo, flows) -> PlannedRun:
    """Plan the run's flows (or, for a schedule, its queue pairs) over the switches' real hashes."""
    sw = scen.switch
    planner = Planner(PathModel(topo, sw.hash_seed, sw.hash_fields), seed=scen.seed)
    scheduled = scen.traffic.scheduled
    known: dict[int, PlanFlow] = {}
    key_of: dict[int, int] = {}
    first: dict[tuple, int] = {}
    for f in flows:
        key = first.setdefault((f.src, f.dst, f.rail, f.qp), f.flow_id) if scheduled else f.flow_id
        key_of[f.flow_id] = key
        if key not in known:
            known[key] = plan_flow(f, topo, key)
    planner.plan(list(known.values()))
    return PlannedRun(planner, known, key_of, scheduled)
