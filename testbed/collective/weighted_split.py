"""``weighted-split``: each queue pair of a connection carries a share of the operation that follows what its
path can take now.

With ``traffic.qps_per_connection`` Q, every transfer is split over Q queue pairs, each with its own source port
and so, under ECMP, its own path. A static collective gives each QP 1/Q. Here, step by step, the flows of the
step (largest first) each go to the QP of their connection whose path would finish them soonest: the one
minimising max over its links of (bytes already placed on the link in this step + the flow's bytes) ÷ the link's
available rate (view.py) — ties keep the flow on its own QP. A QP whose path crosses a slow, loaded, queueing or
marking link thus gets fewer of the connection's flows, down to none; on a healthy idle fabric every flow stays
where it was (or leaves a link two connections' QPs collide on). A step whose placement the view does not
predict to finish sooner than the static one (``step_time``) is sent static.
"""
from __future__ import annotations

from .policy import Operation, Policy


class WeightedSplit(Policy):
    name = "weighted-split"

    @classmethod
    def check(cls, scen) -> None:
        if scen.traffic.qps_per_connection < 2:
            raise ValueError("@traffic.collective.adapt.policy: weighted-split shares each transfer among its "
                             "queue pairs; with traffic.qps_per_connection 1 there is nothing to share (give 2 or "
                             "more)")

    def decide(self, op: Operation, view) -> dict[int, int]:
        out: dict[int, int] = {}
        qps = op.qp_ports()
        for flows in op.steps().values():
            placed: dict[int, float] = {}
            chosen: dict[int, int] = {}
            own = {f.flow_id: f.sport for f in flows}
            for f in sorted(flows, key=lambda f: (-f.bytes, f.flow_id)):
                best = None
                for sp in qps[f.conn]:
                    path = view.path(f.plan, sp)
                    t = max((placed.get(p, 0.0) + f.bytes * 8) / max(view.available_bps(p), 1.0) for p in path)
                    cost = (t, sp != f.sport)
                    if best is None or cost < best[0]:
                        best = (cost, sp, path)
                _, sp, path = best
                for p in path:
                    placed[p] = placed.get(p, 0.0) + f.bytes * 8
                chosen[f.flow_id] = sp
            if step_time(flows, chosen, view) < step_time(flows, {}, view):   # never worse than static
                out.update({k: v for k, v in chosen.items() if v != own[k]})
        return out


def step_time(flows, ports: dict[int, int], view) -> float:
    """The step's time as the view sees it: the busiest link's bits ÷ its available rate, each flow sent from
    ``ports`` (flow id → source port; a flow not in it from its own QP's)."""
    bits: dict[int, float] = {}
    for f in flows:
        for p in view.path(f.plan, ports.get(f.flow_id, f.sport)):
            bits[p] = bits.get(p, 0.0) + f.bytes * 8
    return max((b / max(view.available_bps(p), 1.0) for p, b in bits.items()), default=0.0)
