"""Cross-field checks of ``traffic.collective.adapt`` against the switches and the traffic.

Each raises ValueError("@key.path: why") for the scenario loader to turn into one line."""
from __future__ import annotations

KEY = "@traffic.collective.adapt"


def adapt_fits(scen) -> None:
    """A policy picks each flow's path by its source port: that needs collective jobs, ECMP's per-flow hash, an
    engine whose senders can take the port it picks, hosts that reach the helper's socket, and the counters
    each signal is read from."""
    a = scen.traffic.collective.adapt
    if a is None:
        return
    tr = scen.traffic
    if not tr.runs_collectives:
        raise ValueError(f"{KEY}: decides the operations of collective jobs (traffic.jobs or pattern allreduce); "
                         f"this traffic has none" + (" (a replayed schedule is not adapted)" if tr.replay else ""))
    lb = scen.switch.load_balancing
    if lb != "ecmp":
        raise ValueError(f"{KEY}.policy: picks paths by ECMP's per-flow hash of the source port; with "
                         f"switch.load_balancing {lb} the port picks no path (use ecmp)")
    if scen.switch.routing == "sm":
        raise ValueError(f"{KEY}.policy: under switch.routing sm every destination has one port: the source port "
                         f"picks no path")
    if tr.engine not in ("udp", "roce"):
        raise ValueError(f"{KEY}: the udp and roce engines' senders take the port a policy picks; engine "
                         f"{tr.engine} does not")
    if tr.engine == "roce" and tr.roce.entropy != "qp":
        raise ValueError(f"{KEY}: a policy gives each QP one source port; traffic.roce.entropy {tr.roce.entropy} "
                         f"sprays its packets over several")
    if scen.hosts.docker is not None or scen.placement is not None:
        raise ValueError(f"{KEY}: the hosts reach the collective helper through a socket file of this machine: "
                         f"not from containers nor over several machines")
    if "ecn" in a.signals and not _marks(scen):
        raise ValueError(f"{KEY}.signals: ecn is read from the switches' CE marks, and no switch tier marks "
                         f"(switch.ecn) or no flow is ECN-capable")
    if "int" in a.signals and not scen.telemetry.int.enabled:
        raise ValueError(f"{KEY}.signals: int is read from the INT reports, and telemetry.int is not enabled "
                         f"(set telemetry.int.enabled: true)")
    from .policy import get_policy
    get_policy(a.policy).check(scen)


def _marks(scen) -> bool:
    capable = scen.traffic.engine == "roce" or scen.traffic.ecn != "none"
    return capable and any(scen.switch.qos(t).ecn for t in scen.topology.tiers)
