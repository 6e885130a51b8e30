"""The scenario's ``controller`` keys: the fabric controller that plans each flow's entropy."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BeforeValidator, Field

from .. import units
from ..spec_types import Strict, unit


DEFAULT_INTERVAL = units.time_ns("10ms")


class ControllerSpec(Strict):
    """``entropy: plan``: every flow's source port comes from the controller when the flow starts (the hosts ask
    it over a socket; controller/service.py), chosen so that ECMP puts it on a path of its own; ``adaptive``:
    also, every ``interval``, flows on overloaded, queueing or failed links are moved to better paths mid-flow;
    ``off``: the hosts' own entropy (``traffic.sport``)."""
    entropy: Annotated[Literal["off", "plan", "adaptive"],
                       BeforeValidator(lambda v: "off" if v is False else v)] = "off"
                                                  # (YAML reads a bare off as false: the same)
    timeout: Annotated[int, *unit(units.time_ns), Field(ge=1_000_000)] = units.time_ns("200ms")   # a host that
                                                  # gets no answer in this long keeps its own source port
    interval: Optional[Annotated[int, *unit(units.time_ns), Field(ge=1_000_000)]] = None   # adaptive: how often
                                                  # the controller reads the ports and moves flows (10 ms unset)

    @property
    def interval_ns(self) -> int:
        return self.interval if self.interval is not None else DEFAULT_INTERVAL
