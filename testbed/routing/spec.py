"""The scenario's routing keys: the subnet manager (``switch.sm``) and failures on a schedule (``failures``)."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from .. import units
from ..spec_types import NodeName, Rate, Strict, Time, unit as _unit


class SmSpec(Strict):
    """Subnet-manager routing (``switch.routing: sm``): the routing engine and how often the SM sweeps the
    fabric's link state (testbed/routing/manager.py)."""
    engine: Literal["minhop", "updn", "ftree"] = "minhop"
    sweep_interval: Annotated[int, *_unit(units.time_ns), Field(ge=1_000_000)] = \
        units.time_ns("10ms")


class FailureSpec(Strict):
    """One ``failures`` entry: at ``at`` (after the traffic's t0, the instant flows start) a link or a switch
    goes down or up, or a link's rate changes (both directions)."""
    at: Time
    link: Optional[tuple[NodeName, NodeName]] = None
    node: Optional[NodeName] = None
    state: Optional[Literal["down", "up"]] = None
    rate: Optional[Rate] = None

    @model_validator(mode="after")
    def _one_target_one_change(self):
        if (self.link is None) == (self.node is None):
            raise ValueError("link: give either link: [a, b] or node: <switch>, not both or neither")
        if (self.state is None) == (self.rate is None):
            raise ValueError("state: give either state: down|up or rate: <new rate>, not both or neither")
        if self.node is not None and self.rate is not None:
            raise ValueError("rate: applies to a link (a switch has no rate of its own); use link: [a, b]")
        return self

    @property
    def target(self) -> str:
        return "-".join(self.link) if self.link else self.node

    @property
    def change(self) -> str:
        return self.state if self.state else f"rate {self.rate}bit"
