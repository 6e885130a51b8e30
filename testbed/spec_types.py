"""The scenario vocabulary every mechanism's schema is written in: quantities with units (``Rate``, ``Size``,
``Time``, ``Delay``), node names, ratios, the strict base model and the scenario error.

A leaf module (it imports only ``units`` and ``errors``), so each mechanism package can declare its own part of
the scenario without importing the scenario itself.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from . import units
from .errors import TestbedError


class ScenarioError(TestbedError):
    """A scenario problem, already phrased for the user (one line, key path first)."""


class Quantity:
    """Marks a scenario field as a rate or a time, so time dilation knows what to scale (``unit`` adds it)."""

    def __init__(self, kind: str):
        self.kind = kind


_SUFFIX = {units.rate_bps: "bit", units.size_bytes: "B", units.time_ns: "ns"}


def unit(parser):
    """A quantity with units: parsed from text like `40mbit`; written back as plain integers (bit/s, bytes, ns),
    or — in a round-trip dump (``to_dict(roundtrip=True)``) — with its unit, so it parses back to itself (a
    bare number would read as seconds). Use as ``Annotated[int, *unit(units.time_ns), Field(...)]``."""
    def parse(v):
        if v is None:
            return v
        try:
            return parser(v)
        except ValueError as e:
            raise ValueError(str(e)) from None

    def dump(v, info):
        ctx = info.context or {}
        return f"{v}{_SUFFIX[parser]}" if v is not None and ctx.get("roundtrip") else v
    kind = {units.rate_bps: "rate", units.time_ns: "time"}.get(parser)
    return (BeforeValidator(parse), PlainSerializer(dump)) + ((Quantity(kind),) if kind else ())


Rate = Annotated[int, *unit(units.rate_bps), Field(gt=0)]
Size = Annotated[int, *unit(units.size_bytes), Field(gt=0)]
Time = Annotated[int, *unit(units.time_ns), Field(ge=0)]
NodeName = Annotated[str, Field(pattern=r"^(h|leaf|spine|core)[0-9]+$")]
Delay = Annotated[int, *unit(units.time_ns), Field(ge=0, le=1_000_000_000)]


def whole_us(delay: int | None) -> None:
    """netem works in whole microseconds: refuse a shorter non-zero delay."""
    if delay and delay < 1000:
        raise ValueError(f"delay: netem works in whole microseconds, got {delay} ns (use ≥ 1us or 0)")


def _ratio(v):
    """``2:1`` (also ``2``, ``1.5``) → the text ``a:b``. YAML 1.1 would read an unquoted 2:1 as the base-60
    number 121; the scenario loader does not."""
    if v is None:
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if v <= 0:
            raise ValueError(f"expected a ratio like 2:1, got {v!r}")
        f = Fraction(v).limit_denominator(1000)
        a, b = f.numerator, f.denominator
    elif isinstance(v, str) and (m := re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-9]+)\s*", v)) and int(m[1]) and int(m[2]):
        a, b = int(m[1]), int(m[2])
    else:
        raise ValueError(f"expected a ratio like 2:1, got {v!r}")
    if a < b:
        raise ValueError(f"must be at least 1:1 (hosts : uplink capacity of a leaf), got {a}:{b}")
    return f"{a}:{b}"


Ratio = Annotated[str, BeforeValidator(_ratio)]


class Strict(BaseModel):
    """Every scenario model: unknown keys are errors, values are frozen."""
    model_config = ConfigDict(extra="forbid", frozen=True)
