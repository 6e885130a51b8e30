"""Cross-field checks of in-band telemetry against the traffic classes, the MTU and HPCC.

Each function takes the whole scenario and raises ValueError("@key.path: why") for the scenario loader to
turn into one line."""
from __future__ import annotations


def int_fits(scen) -> None:
    """INT marks the packets that carry a stack with DSCP bit 0 (value 1): traffic that uses odd DSCPs would
    be mistaken for it, and a fabric MTU below the hosts' would drop their full-sized packets. HPCC's stacks
    (host stacks) read consecutive records of one path, so its flows keep one entropy value."""
    i = scen.telemetry.int
    hpcc = scen.traffic.cc == "hpcc"
    if not i.enabled and not hpcc:
        return
    why = "INT marks" if i.enabled else "traffic.cc hpcc carries INT stacks and marks"
    if hpcc and scen.traffic.roce.entropy != "qp":
        raise ValueError(f"@traffic.roce.entropy: hpcc computes each hop's rate from consecutive INT records "
                         f"of one path; entropy {scen.traffic.roce.entropy!r} sends a flow's packets over "
                         f"several paths (use qp)")
    if i.enabled and i.fabric_mtu is not None and i.fabric_mtu < scen.topology.mtu:
        raise ValueError(f"@telemetry.int.fabric_mtu: {i.fabric_mtu} is below topology.mtu "
                         f"({scen.topology.mtu}): links between switches would drop full-sized packets")
    odd = sorted({d for t in scen.topology.tiers for d in scen.switch.qos(t).traffic_classes.dscp if d & 1})
    if odd:
        raise ValueError(f"@switch.traffic_classes.dscp: {why} instrumented packets with DSCP bit 0, so "
                         f"odd DSCP values ({', '.join(map(str, odd))}) cannot be classified; use even ones")
    if scen.traffic.wire_dscp & 1:
        raise ValueError(f"@traffic.dscp: {why} instrumented packets with DSCP bit 0; "
                         f"{scen.traffic.wire_dscp} is odd, use an even DSCP")
