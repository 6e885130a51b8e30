"""Cross-field checks of the load-balancing keys against the rest of the scenario.

Each function takes the whole scenario and raises ValueError("@key.path: why") for the scenario loader to
turn into one line."""
from __future__ import annotations


def wcmp_source_fits(scen) -> None:
    """Measured WCMP weights need what they are measured from, and routes the controller may weigh."""
    sw = scen.switch
    if sw.load_balancing != "wcmp" or sw.wcmp.source == "static":
        return
    if sw.wcmp.source == "int" and not scen.telemetry.int.enabled:
        raise ValueError("@switch.wcmp.source: int weighs paths by their INT delays: set "
                         "telemetry.int.enabled: true (or use source: load)")
    if sw.routing == "sm":
        raise ValueError(f"@switch.wcmp.source: {sw.wcmp.source} weights are set by the WCMP controller on "
                         f"distributed routing's groups; switch.routing: sm programs one port per destination")
