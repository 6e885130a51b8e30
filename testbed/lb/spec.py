"""The scenario's load-balancing keys beyond the mode itself: adaptive routing, WCMP, DLB."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from .. import units
from ..spec_types import Strict, Time, unit as _unit


class AdaptiveSpec(Strict):
    """Adaptive routing (``load_balancing: adaptive``): take the least loaded allowed egress port."""
    granularity: Literal["packet", "flowlet"] = "packet"    # choose per packet (reorders) or per flowlet
    metric: Literal["queue", "load", "queue+load"] = "queue"   # queued bytes, recent tx bytes, or their sum
    flowlet_timeout: Optional[Time] = None                  # granularity flowlet; None = switch.flowlet_timeout
    load_window: Annotated[int, *_unit(units.time_ns), Field(gt=0)] = units.time_ns("20ms")   # the load metric's memory:
                                                    # many packets long (1 ms at 40 Mbit/s held 3: noise)


class WcmpSpec(Strict):
    """Weighted-cost multipath (``load_balancing: wcmp``): each next-hop group becomes a table of `slots` entries
    in which every member appears in proportion to its weight, as switch ASICs replicate members; a flow (hash),
    a flowlet or a packet draws one entry. `source: static` takes the weights from `topology.links[].weight`;
    `int` and `load`: the WCMP controller (testbed/lb/wcmp_controller.py) sets each source leaf's weights every
    `interval` from the INT path delays or the ports' tx rates."""
    source: Literal["static", "int", "load"] = "static"
    granularity: Literal["flow", "flowlet", "packet"] = "flowlet"
    slots: int = Field(64, ge=2, le=255)
    interval: Annotated[int, *_unit(units.time_ns), Field(ge=1_000_000)] = units.time_ns("10ms")


class DlbSpec(Strict):
    """Dynamic load balancing (``load_balancing: dlb``, Broadcom style): every egress port has a quality band
    0 (best) .. bands − 1 from its quantised recent load (a fraction of `load_window`) and its quantised queue
    depth (drain time as a fraction of its buffer's), combined as a mean weighted by `load_weight` and
    `queue_weight`; a flow idle longer than `inactivity` starts a new flowlet on a port of the best band, and
    keeps that port while its gaps stay shorter (unless the port loses its link)."""
    inactivity: Time = units.time_ns("100us")
    load_weight: int = Field(1, ge=0, le=1000)
    queue_weight: int = Field(1, ge=0, le=1000)
    bands: int = Field(8, ge=2, le=16)
    load_window: Annotated[int, *_unit(units.time_ns), Field(gt=0)] = units.time_ns("20ms")   # the load's memory

    @model_validator(mode="after")
    def _weights(self):
        if self.load_weight == 0 and self.queue_weight == 0:
            raise ValueError("load_weight and queue_weight are both 0: nothing ranks the ports "
                             "(give one a weight ≥ 1)")
        return self
