"""Cross-field checks of the fabric controller against the switches and the traffic.

Each function takes the whole scenario and raises ValueError("@key.path: why") for the scenario loader to
turn into one line."""
from __future__ import annotations


def planned_entropy_fits(scen) -> None:
    """Planned entropy steers ECMP's hash: it picks nothing where the switches do not hash a flow onto one path
    (spraying, flowlets, adaptive routing, a subnet manager's tables), nor for traffic the agents do not send."""
    ctl = scen.controller
    if ctl.interval is not None and ctl.entropy != "adaptive":
        raise ValueError(f"@controller.interval: only controller.entropy adaptive reads the ports every interval; "
                         f"with entropy {ctl.entropy} it would do nothing")
    if ctl.entropy == "off":
        return
    lb = scen.switch.load_balancing
    if lb != "ecmp":
        raise ValueError(f"@controller.entropy: planned entropy steers ECMP's per-flow hash; with "
                         f"switch.load_balancing {lb} the source port picks no path (use ecmp)")
    if getattr(scen.switch, "routing", "distributed") == "sm":
        raise ValueError("@controller.entropy: under switch.routing sm every destination has one port: the source "
                         "port picks no path")
    tr = scen.traffic
    if tr.engine not in ("udp", "tcp", "roce"):
        raise ValueError(f"@controller.entropy: the hosts that ask the controller are the udp, tcp and roce engines' "
                         f"agents; engine {tr.engine} does not ask")
    if ctl.entropy == "adaptive" and tr.engine == "tcp":
        raise ValueError("@controller.entropy: adaptive moves flows mid-flow by their source port, which a TCP "
                         "connection cannot change (use plan, or the udp or roce engine)")
    if tr.engine == "roce" and tr.roce.entropy != "qp":
        raise ValueError(f"@controller.entropy: a planned flow keeps one source port; traffic.roce.entropy "
                         f"{tr.roce.entropy} sprays its packets over several")
    if tr.pattern == "poisson":
        raise ValueError("@controller.entropy: plans the run's flows, or a schedule's queue pairs, before they "
                         "start; poisson arrivals are not planned yet")
    if ctl.entropy == "adaptive" and tr.scheduled:
        raise ValueError("@controller.entropy: a collective's or replay's queue pairs are planned (use plan); "
                         "moving them mid-run is not built yet")
    if scen.hosts.docker is not None or scen.placement is not None:
        raise ValueError("@controller.entropy: the hosts reach the controller through a socket file of this "
                         "machine: not from containers nor over several machines")
