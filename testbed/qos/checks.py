"""Cross-field checks of the queueing and flow-control keys against the rest of the scenario: flow control
that could never act, a shared buffer with no pool left, trimming that could never trim.

Each function takes the whole scenario and raises ValueError("@key.path: why") for the scenario loader to
turn into one line."""
from __future__ import annotations

from ..topology import build


def pfc_does_something(scen) -> None:
    """Flow control (PFC or credits) that could never act is a mistake, not a configuration: refuse it with
    the fix. And one tier cannot run both on its lossless priorities."""
    sw, t = scen.switch, scen.traffic
    on = {tier: sw.qos(tier) for tier in scen.topology.tiers if sw.qos(tier).flow_control}
    for tier, q in on.items():
        o = sw.tiers.get(tier)
        if q.pfc.enabled and q.credit.enabled:
            where = f"switch.tiers.{tier}" if o and o.credit is not None else "switch"
            raise ValueError(f"@{where}.credit.enabled: credit-based flow control and PFC would both govern the "
                             f"lossless priorities of the {tier} switches; enable one of them")
        fc, never = fc_words(q)
        if not q.traffic_classes.lossless:
            where = f"switch.tiers.{tier}" if o and o.traffic_classes is not None else "switch"
            raise ValueError(f"@{where}.traffic_classes.lossless: {fc} is enabled ({tier} switches) but no "
                             f"priority is lossless, so it would {never}; make one lossless and send on "
                             f"it, e.g. {where}.traffic_classes: {{dscp: {{26: 3}}, lossless: [3]}} with "
                             f"traffic.dscp: 26")
    credit = [tier for tier in scen.topology.tiers if sw.qos(tier).credit.enabled]
    if credit:
        maps = {tier: (sw.qos(tier).traffic_classes.dscp, sw.qos(tier).traffic_classes.default)
                for tier in scen.topology.tiers}
        first = scen.topology.tiers[0]
        for tier, m in maps.items():
            if m != maps[first]:
                raise ValueError(f"@switch.tiers.{tier}.traffic_classes: with credit flow control every tier "
                                 f"must map DSCPs to the same priorities as the {first} switches (a receiver "
                                 f"meters the sender's class of its own priority)")
    if on and t.engine != "rxe":
        d = t.wire_dscp
        if all(q.traffic_classes.dscp.get(d, q.traffic_classes.default) not in q.traffic_classes.lossless
               for q in on.values()):
            q = next(iter(on.values()))
            fc, never = fc_words(q)
            prio = q.traffic_classes.dscp.get(d, q.traffic_classes.default)
            want = next((k for k, v in q.traffic_classes.dscp.items() if v in q.traffic_classes.lossless), None)
            fix = f"set traffic.dscp: {want}" if want is not None else "map a DSCP to a lossless priority"
            raise ValueError(f"@traffic.dscp: {fc} protects priorities {q.traffic_classes.lossless} but the "
                             f"traffic (DSCP {d} → priority {prio}) is lossy, so {fc} would {never}; {fix}")


def shared_buffer_fits(scen) -> None:
    """A shared buffer must leave a pool after every lossless ingress's headroom, and credits advertise a
    fixed per-ingress buffer, which a shared pool does not have."""
    sw = scen.switch
    if not sw.shared_buffer_on:
        return

    topo = build(scen.topology)
    for tier in scen.topology.tiers:
        q = sw.qos(tier)
        sb = q.shared_buffer
        if sb is None:
            continue
        o = sw.tiers.get(tier)
        where = f"switch.tiers.{tier}.shared_buffer" if o and o.shared_buffer is not None else "switch.shared_buffer"
        if q.credit.enabled:
            raise ValueError(f"@{where}: credit flow control grants a fixed buffer per ingress; a shared buffer "
                             f"with dynamic thresholds is supported with PFC or lossy queues only")
        ports = max(len(topo.ports[s]) for s in topo.switches if topo.nodes[s].kind == tier)
        reserved = ports * len(q.lossless) * q.headroom
        if sb.size <= reserved + 2 * (scen.topology.mtu + 14):
            raise ValueError(f"@{where}.size: {sb.size} bytes leave no shared pool after the headroom reserved "
                             f"for {ports} ports × {len(q.lossless)} lossless priorities × {q.headroom} bytes "
                             f"= {reserved} bytes ({tier} switches); raise size or lower headroom")


def trim_can_trim(scen) -> None:
    """Trimming cuts RoCEv2 data packets of a lossy priority to their BTH: refuse a configuration under which
    it never could (other engines, the traffic lossless or on the trim priority itself), tiers that send
    trimmed headers to different priorities, and INT, whose stack would sit where the BTH is cut."""
    sw, t = scen.switch, scen.traffic
    on = {tier: sw.qos(tier) for tier in scen.topology.tiers if sw.qos(tier).trim.enabled}
    if not on:
        return

    def where(tier: str, key: str) -> str:
        o = sw.tiers.get(tier)
        return f"switch.tiers.{tier}.trim.{key}" if o and o.trim is not None else f"switch.trim.{key}"
    first = next(iter(on))
    prio = on[first].trim.priority
    for tier, q in on.items():
        if q.trim.priority != prio:
            raise ValueError(f"@{where(tier, 'priority')}: trimmed headers go to one priority fabric-wide "
                             f"(every hop classifies them to it); the {first} switches use {prio}, the {tier} "
                             f"switches {q.trim.priority}")
        if q.trim.priority in q.lossless:
            raise ValueError(f"@{where(tier, 'priority')}: priority {q.trim.priority} is lossless at the {tier} "
                             f"switches; trimmed headers need a lossy priority of their own")
    if scen.telemetry.int.enabled:
        raise ValueError(f"@{where(first, 'enabled')}: not with telemetry.int.enabled: the INT stack sits "
                         f"between the UDP header and the BTH, where a trim cuts; turn one of them off")
    if t.cc == "hpcc":
        raise ValueError(f"@{where(first, 'enabled')}: not with traffic.cc hpcc: its INT stack sits between "
                         f"the UDP header and the BTH, where a trim cuts; turn trimming off")
    if t.engine != "roce":
        raise ValueError(f"@{where(first, 'enabled')}: trims the built-in RoCE engine's packets (UDP 4791, "
                         f"traffic.engine: roce), whose receiver reads a trimmed header; traffic.engine "
                         f"{t.engine} would have nothing trimmed (or, rxe, cannot use it)")
    d = t.wire_dscp
    for tier, q in on.items():
        tc = q.traffic_classes
        p = tc.dscp.get(d, tc.default)
        if p == q.trim.priority:
            raise ValueError(f"@{where(tier, 'priority')}: the traffic (DSCP {d}) is on priority {p} itself at "
                             f"the {tier} switches, the queue trimmed headers would join; choose another")
    if all(t_q.traffic_classes.dscp.get(d, t_q.traffic_classes.default) in t_q.lossless for t_q in on.values()):
        q = on[first]
        raise ValueError(f"@{where(first, 'enabled')}: the traffic (DSCP {d} → priority "
                         f"{q.traffic_classes.dscp.get(d, q.traffic_classes.default)}) is lossless wherever "
                         f"trimming is on, so nothing would ever be trimmed; trim a lossy priority")


def fc_words(q) -> tuple[str, str]:
    return ("PFC", "never pause anything") if q.pfc.enabled else ("credit flow control", "never meter anything")
