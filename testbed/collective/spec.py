"""The scenario's ``traffic.collective`` keys: collectives that read the network."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, field_validator

from .. import units
from ..spec_types import Strict, unit

Signal = Literal["util", "queue", "ecn"]


class AdaptSpec(Strict):
    """``policy`` decides every operation's flows from the ``signals`` of a ``NetworkView`` read at the
    operation's start (collective/view.py): the links' rates and failures always, then each signal asked for.
    ``interval``: the view is read at most this often (an operation that starts sooner gets the last reading);
    ``timeout``: a host without a decision in this long sends the operation as the static collective would."""
    policy: str = "weighted-split"
    signals: list[Signal] = Field(default_factory=lambda: ["util", "queue"], min_length=1)
    interval: Annotated[int, *unit(units.time_ns), Field(ge=1_000_000)] = units.time_ns("10ms")
    timeout: Annotated[int, *unit(units.time_ns), Field(ge=1_000_000)] = units.time_ns("200ms")

    @field_validator("policy")
    @classmethod
    def _known(cls, v: str) -> str:
        from .policy import UnknownPolicy, get_policy
        try:
            get_policy(v)
        except UnknownPolicy as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("signals")
    @classmethod
    def _distinct(cls, v: list) -> list:
        if len(set(v)) != len(v):
            raise ValueError(f"a signal is named twice: {v}")
        return v


class CollectiveSpec(Strict):
    """``adapt``: the collective jobs read the network (None: they run their static schedule)."""
    adapt: Optional[AdaptSpec] = None
