"""The scenario's ``traffic.collective`` keys: collectives that read the network."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, field_validator, model_validator

from .. import units
from ..spec_types import Strict, unit

Signal = Literal["util", "queue", "ecn", "int"]


class AdaptSpec(Strict):
    """``policy`` decides every operation's flows from the ``signals`` of a ``NetworkView`` read at the
    operation's start (collective/view.py): the links' rates and failures always, then each signal asked for.
    ``interval``: the view is read at most this often (an operation that starts sooner gets the last reading);
    ``timeout``: a host without a decision in this long sends the operation as the static collective would."""
    policy: str = "weighted-split"
    signals: list[Signal] = Field(default_factory=lambda: ["util", "queue"], min_length=1)
    interval: Annotated[int, *unit(units.time_ns), Field(ge=1_000_000)] = units.time_ns("10ms")
    timeout: Annotated[int, *unit(units.time_ns), Field(ge=1_000_000)] = units.time_ns("200ms")
    rings: Optional[int] = Field(None, ge=1, le=8)   # all-reduce: ring orders laid out per iteration, of which
                                                     # the policy runs one (ring-order: 3 unset; others: 1)

    @field_validator("policy")
    @classmethod
    def _known(cls, v: str) -> str:
        from .policy import UnknownPolicy, get_policy
        try:
            get_policy(v)
        except UnknownPolicy as e:
            raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _rings(self):
        from .policy import get_policy
        picks = get_policy(self.policy).picks_rings
        if self.rings is not None and self.rings > 1 and not picks:
            raise ValueError(f"rings: policy {self.policy} sends the job's own ring; only a policy that picks "
                             f"among ring orders (ring-order) uses {self.rings}")
        if self.rings is not None and self.rings < 2 and picks:
            raise ValueError(f"rings: {self.policy} picks among ring orders: give 2 or more, got {self.rings}")
        return self

    @property
    def ring_count(self) -> int:
        """Ring orders an all-reduce lays out per iteration: ``rings``, else 3 for a policy that picks among
        them and 1 for the others."""
        if self.rings is not None:
            return self.rings
        from .policy import get_policy
        return 3 if get_policy(self.policy).picks_rings else 1

    @field_validator("signals")
    @classmethod
    def _distinct(cls, v: list) -> list:
        if len(set(v)) != len(v):
            raise ValueError(f"a signal is named twice: {v}")
        return v


class CollectiveSpec(Strict):
    """``adapt``: the collective jobs read the network (None: they run their static schedule)."""
    adapt: Optional[AdaptSpec] = None
