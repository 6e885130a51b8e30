"""A validation scenario's ``reference:`` block: what the published result is and how it is compared.

The scenario schema keeps the block as a mapping (``testbed run`` ignores it); ``testbed validate`` reads it
here, strictly, so a typo is one line naming the file and key.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, ValidationError, field_validator

from ..spec_types import ScenarioError, Strict

Kind = Literal["at_most", "at_least", "equal"]


class ReferenceSpec(Strict):
    """``metric`` (metrics.py) of the scenario's runs against ``value``:

    - ``at_most``: the mean passes when ≤ value × (1 + tolerance) (a published upper bound, such as uet-htsim's
      ``!tailFCT``);
    - ``at_least``: when ≥ value × (1 − tolerance);
    - ``equal``: when within value × (1 ± tolerance).

    ``baseline``: ``--set`` options of a second configuration run with the same seeds; the metric is then the
    ratio of each seed's run to its baseline run (oversubscribed ÷ full bisection, for one). ``quick``: in
    ``testbed validate --quick``. ``differs``: a known modelling difference the verdict should be read with."""
    source: str = Field(min_length=3)              # paper and figure, or repository and file
    normalisation: str = Field(min_length=3)       # how the source's sizes, buffers and rates were scaled
    metric: str
    value: float
    kind: Kind = "equal"
    tolerance: float = Field(ge=0, le=10)
    why: str = Field(min_length=3)                 # why this tolerance
    seeds: int = Field(3, ge=1, le=100)
    baseline: Optional[list[str]] = None
    quick: bool = False
    differs: Optional[str] = None

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        from .metrics import METRICS
        if v not in METRICS:
            raise ValueError(f"unknown metric {v!r}; known: {', '.join(sorted(METRICS))}")
        return v

    @field_validator("baseline")
    @classmethod
    def _sets(cls, v):
        if v is not None:
            if not v:
                raise ValueError("an empty baseline runs the same configuration twice: give --set options or "
                                 "leave it out")
            bad = [s for s in v if "=" not in s]
            if bad:
                raise ValueError(f"baseline entries are KEY.PATH=VALUE, got {bad[0]!r}")
        return v

    def bounds(self) -> tuple[float, float]:
        """(low, high) of a passing mean (±inf on the open side)."""
        lo, hi = self.value * (1 - self.tolerance), self.value * (1 + self.tolerance)
        lo, hi = min(lo, hi), max(lo, hi)
        if self.kind == "at_most":
            return float("-inf"), hi
        if self.kind == "at_least":
            return lo, float("inf")
        return lo, hi

    def verdict(self, mean: float) -> str:
        lo, hi = self.bounds()
        return "pass" if lo <= mean <= hi else "fail"


def parse(doc, where: str) -> ReferenceSpec:
    """The block, or a ScenarioError naming ``where`` and the key."""
    if doc is None:
        raise ScenarioError(f"{where}: no reference: block, so nothing to validate against")
    try:
        return ReferenceSpec.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ScenarioError(f"{where}: reference.{loc}: {err['msg']}") from None
