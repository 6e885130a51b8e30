"""YAML scenario → validated, typed model.

Every mistake is reported as one line naming the key path (``topology.spines: must be ≥ 1, got 0``), so a
scenario can be fixed without reading a traceback. ``--set key.path=value`` overrides are applied to the raw
document before validation, so they are checked exactly like the file.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from . import units


class ScenarioError(Exception):
    """A scenario problem, already phrased for the user (one line, key path first)."""


def _unit(parser):
    def parse(v):
        if v is None:
            return v
        try:
            return parser(v)
        except ValueError as e:
            raise ValueError(str(e)) from None
    return BeforeValidator(parse)


Rate = Annotated[int, _unit(units.rate_bps), Field(gt=0)]
Size = Annotated[int, _unit(units.size_bytes), Field(gt=0)]
Time = Annotated[int, _unit(units.time_ns), Field(ge=0)]
NodeName = Annotated[str, Field(pattern=r"^(h|leaf|spine)[0-9]+$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkSpec(Strict):
    rate: Rate = units.rate_bps("100mbit")
    buffer: Size = units.size_bytes("256KB")
    # One-way propagation delay of the link (each direction), e.g. 50us. Emulated with netem under the shaping
    # qdisc, so it needs a kernel with sch_netem (`testbed doctor`: netem) — a distribution kernel or the VM.
    delay: Annotated[int, _unit(units.time_ns), Field(ge=0, le=1_000_000_000)] = 0

    @model_validator(mode="after")
    def _delay_in_us(self):
        if self.delay and self.delay < 1000:
            raise ValueError(f"delay: netem works in whole microseconds, got {self.delay} ns (use ≥ 1us or 0)")
        return self


class TopologySpec(Strict):
    kind: Literal["leaf-spine"] = "leaf-spine"
    spines: int = Field(2, ge=1, le=64)
    leaves: int = Field(2, ge=1, le=256)
    hosts_per_leaf: int = Field(2, ge=1, le=253)
    rails: int = Field(1, ge=1, le=8)
    mtu: int = Field(1500, ge=576, le=9000)
    host_link: LinkSpec = LinkSpec()
    fabric_link: LinkSpec = LinkSpec()
    offloads: bool = False

    @model_validator(mode="after")
    def _fits_address_plan(self):
        from .topology import max_leaves_per_rail
        limit = max_leaves_per_rail(self.rails)
        if self.leaves > limit:
            raise ValueError(f"leaves: at most {limit} leaves per rail fit the address plan with "
                             f"{self.rails} rail(s), got {self.leaves}")
        return self

    @property
    def hosts(self) -> int:
        return self.leaves * self.hosts_per_leaf


class SwitchSpec(Strict):
    load_balancing: Literal["ecmp", "flowlet", "spray"] = "ecmp"
    flowlet_timeout: Time = units.time_ns("500us")
    spray: Literal["random", "round_robin"] = "random"
    hash_seed: int = Field(1, ge=0, lt=2**32)


class IncastSpec(Strict):
    receiver: NodeName = "h0"
    senders: Union[list[NodeName], int, None] = None   # names, a count (first N others), or all others


class TrafficSpec(Strict):
    engine: Literal["udp", "tcp"] = "udp"
    pattern: Literal["pairs", "permutation", "all-to-all", "incast"] = "permutation"
    pairs: list[tuple[NodeName, NodeName]] = []
    incast: IncastSpec = IncastSpec()
    flows_per_pair: int = Field(1, ge=1, le=1024)
    flow_size: Optional[Size] = None          # bytes per flow; None = send for `duration`
    rate: Optional[Rate] = None               # per flow; None = host link rate (back-pressured)
    start: Time = 0
    sport: Union[Literal["random", "sequential"], Annotated[int, Field(ge=1, le=65535)]] = "random"
    sport_base: int = Field(20000, ge=1024, le=65000)
    dport: int = Field(5001, ge=1, le=65000)
    packet_size: Optional[int] = Field(None, ge=64, le=9000)   # IP packet size; None = MTU

    @model_validator(mode="after")
    def _pairs_needed(self):
        if self.pattern == "pairs" and not self.pairs:
            raise ValueError("pairs: pattern 'pairs' needs a list like [[h0, h1]]")
        return self


class TelemetrySpec(Strict):
    interval: Annotated[int, _unit(units.time_ns), Field(ge=10_000_000)] = units.time_ns("100ms")


class Scenario(Strict):
    name: str = Field("scenario", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    seed: int = Field(1, ge=0)
    duration: Annotated[int, _unit(units.time_ns), Field(gt=0)] = units.time_ns("5s")
    topology: TopologySpec = TopologySpec()
    switch: SwitchSpec = SwitchSpec()
    traffic: TrafficSpec = TrafficSpec()
    telemetry: TelemetrySpec = TelemetrySpec()
    capture: list[NodeName] = []

    @model_validator(mode="after")
    def _names_exist(self):
        from .topology import node_names
        names = set(node_names(self.topology))
        where = [("capture", n) for n in self.capture]
        where += [("traffic.pairs", n) for pair in self.traffic.pairs for n in pair]
        where.append(("traffic.incast.receiver", self.traffic.incast.receiver))
        if isinstance(self.traffic.incast.senders, list):
            where += [("traffic.incast.senders", n) for n in self.traffic.incast.senders]
        for path, n in where:
            if n not in names:
                raise ValueError(f"@{path}: no node {n!r} in this topology "
                                 f"({self.topology.hosts} hosts h0..h{self.topology.hosts - 1})")
        for a, b in self.traffic.pairs:
            if a == b:
                raise ValueError(f"@traffic.pairs: a flow from {a} to itself never crosses the fabric")
            if not (a.startswith("h") and b.startswith("h")):
                raise ValueError(f"@traffic.pairs: flows run between hosts, got [{a}, {b}]")
        return self


# ---------------------------------------------------------------- loading and overrides

def _fmt_error(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[", "union[")))
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if msg.startswith("@"):                      # a model validator naming its own key path
        path, _, msg = msg[1:].partition(": ")
        loc = path
    elif ": " in msg and err["type"] == "value_error" and msg.split(": ", 1)[0].isidentifier():
        sub, _, msg = msg.partition(": ")      # "leaves: ..." raised by a model validator
        loc = f"{loc}.{sub}" if loc else sub
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        sym = {"greater_than_equal": "≥", "less_than_equal": "≤", "greater_than": ">", "less_than": "<"}
        bound = next(iter(err.get("ctx", {}).values()), "?")
        msg = f"must be {sym[err['type']]} {bound}"
    if ("input" in err and err["type"] != "extra_forbidden" and ", got " not in msg
            and not isinstance(err["input"], (dict, list))):
        msg += f", got {err['input']!r}"
    return f"{loc or '<scenario>'}: {msg}"


def set_path(doc: dict, dotted: str, value: Any) -> None:
    """Apply one ``key.path=value`` override to a raw scenario document."""
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(f"{dotted}: {k} is not a section")
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {text!r}: expected key.path=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def from_dict(doc: Any, overrides: tuple[str, ...] = ()) -> Scenario:
    doc = copy.deepcopy(doc) if doc is not None else {}
    if not isinstance(doc, dict):
        raise ScenarioError("<scenario>: the file must be a mapping of keys (topology:, switch:, traffic: …)")
    for text in overrides:
        set_path(doc, *parse_override(text))
    try:
        return Scenario.model_validate(doc)
    except ValidationError as e:
        errors = e.errors()
        first = _fmt_error(errors[0])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ScenarioError(first + more) from None


def load(path: str | Path, overrides: tuple[str, ...] = ()) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read scenario ({e.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ScenarioError(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    try:
        scen = from_dict(doc, overrides)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None
    if "name" not in (doc or {}):
        scen = scen.model_copy(update={"name": path.stem[:40]})
    return scen


def to_dict(scen: Scenario) -> dict:
    """The scenario as resolved (every default filled in), for the manifest."""
    return scen.model_dump(mode="json")
