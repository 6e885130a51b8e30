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


Priority = Annotated[int, Field(ge=0, le=7)]
ROCE_DSCP = 26                  # AF31: the DSCP RoCE NICs mark by default


class TrafficClassSpec(Strict):
    """DSCP → priority (0..7) and which priorities are lossless (PFC protects them; they are never tail-dropped
    by the switch program). DSCPs not listed map to ``default``."""
    dscp: dict[Annotated[int, Field(ge=0, le=63)], Priority] = {}
    default: Priority = 0
    lossless: list[Priority] = []


class EcnSpec(Strict):
    """RED/DCQCN marking curve of one egress queue: P(mark) = 0 below kmin, linear up to pmax at kmax, 1 above."""
    kmin: Size
    kmax: Size
    pmax: float = Field(0.1, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _order(self):
        if self.kmax < self.kmin:
            raise ValueError(f"kmax: must be ≥ kmin ({self.kmin} bytes), got {self.kmax}")
        return self


class PfcSpec(Strict):
    """PFC of the lossless priorities: Xoff/Xon thresholds on the bytes that arrived on one ingress port (per
    priority) and are still queued in the switch, headroom per ingress port for what arrives after Xoff."""
    enabled: bool = False
    xoff: Size = units.size_bytes("32KB")
    xon: Size = units.size_bytes("16KB")
    headroom: Size = units.size_bytes("48KB")

    @model_validator(mode="after")
    def _order(self):
        if self.xon > self.xoff:
            raise ValueError(f"xon: must be ≤ xoff ({self.xoff} bytes), got {self.xon}")
        return self


EcnMap = Union[EcnSpec, dict[Priority, EcnSpec], None]


class QosSpec(Strict):
    """Buffers, traffic classes, ECN and PFC of one tier's switches (what `switch.tiers.<tier>` overrides)."""
    buffer: Optional[Size] = None               # per port; None = the link's `buffer`
    traffic_classes: Optional[TrafficClassSpec] = None
    ecn: EcnMap = None                          # one curve for every priority, or {priority: curve}
    pfc: Optional[PfcSpec] = None


class AdaptiveSpec(Strict):
    """Adaptive routing (``load_balancing: adaptive``): take the least loaded allowed egress port."""
    granularity: Literal["packet", "flowlet"] = "packet"    # choose per packet (reorders) or per flowlet
    metric: Literal["queue", "load", "queue+load"] = "queue"   # queued bytes, recent tx bytes, or their sum
    flowlet_timeout: Optional[Time] = None                  # granularity flowlet; None = switch.flowlet_timeout
    load_window: Annotated[int, _unit(units.time_ns), Field(gt=0)] = units.time_ns("1ms")   # the load metric's memory


class SwitchSpec(Strict):
    load_balancing: Literal["ecmp", "flowlet", "spray", "adaptive"] = "ecmp"
    flowlet_timeout: Time = units.time_ns("500us")
    spray: Literal["random", "round_robin"] = "random"
    adaptive: AdaptiveSpec = AdaptiveSpec()
    hash_seed: int = Field(1, ge=0, lt=2**32)
    buffer: Optional[Size] = None
    traffic_classes: TrafficClassSpec = TrafficClassSpec()
    ecn: EcnMap = None
    pfc: PfcSpec = PfcSpec()
    tiers: dict[Literal["leaf", "spine"], QosSpec] = {}

    def qos(self, tier: str) -> "ResolvedQos":
        """The effective settings of a tier's switches: the tier's override where it sets a key, else these."""
        o = self.tiers.get(tier, QosSpec())
        ecn = o.ecn if o.ecn is not None else self.ecn
        if isinstance(ecn, EcnSpec):
            ecn = {p: ecn for p in range(8)}
        return ResolvedQos(buffer=o.buffer if o.buffer is not None else self.buffer,
                           traffic_classes=o.traffic_classes or self.traffic_classes,
                           ecn=dict(ecn or {}), pfc=o.pfc or self.pfc)

    @property
    def classes_on(self) -> bool:
        """True when any tier uses more than one priority or PFC: ports then get HTB + one class per priority."""
        for t in ("leaf", "spine"):
            q = self.qos(t)
            if q.pfc.enabled or q.traffic_classes.dscp or q.traffic_classes.default:
                return True
        return False


class ResolvedQos(Strict):
    buffer: Optional[int]
    traffic_classes: TrafficClassSpec
    ecn: dict[int, EcnSpec]
    pfc: PfcSpec

    def priorities(self) -> list[int]:
        tc = self.traffic_classes
        return sorted({tc.default, *tc.dscp.values(), *tc.lossless})


class HostsSpec(Strict):
    pfc: bool = False            # host NICs obey PFC pause frames (per priority) from their leaf


class IncastSpec(Strict):
    receiver: NodeName = "h0"
    senders: Union[list[NodeName], int, None] = None   # names, a count (first N others), or all others


class RoceSpec(Strict):
    """Options of the built-in RoCEv2 engine (``traffic.engine: roce``)."""
    entropy: Literal["qp", "packet"] = "qp"        # qp: one UDP source port per QP; packet: cycle per packet
    entropy_values: int = Field(8, ge=1, le=4096)   # source ports cycled over with entropy: packet
    message_size: Optional[Size] = None             # RDMA WRITE size; None = the whole flow (1MB for duration flows)
    mtu: Optional[Literal[256, 512, 1024, 2048, 4096]] = None   # IB path MTU; None = largest fitting packet_size
    rto: Annotated[int, _unit(units.time_ns), Field(ge=100_000)] = units.time_ns("10ms")
    reorder_window: int = Field(32, ge=1, le=1 << 20)   # ooo receiver: NAK a hole this many PSNs behind …
    reorder_time: Optional[Annotated[int, _unit(units.time_ns), Field(ge=0)]] = None   # … and this long after
                                                    # (None = rto / 4): sprayed paths reorder by queueing-delay spread
    drop_prob: float = Field(0.0, ge=0.0, le=0.5)   # test-only: receiver discards this fraction of data packets
    ce_prob: float = Field(0.0, ge=0.0, le=1.0)     # test-only: sender CE-marks this fraction of packets
    batch: int = Field(8, ge=1, le=32)              # same-size packets per UDP GSO sendmsg (entropy qp only);
                                                    # 1 = one sendmsg per packet with UDP checksum 0


class RxeSpec(Strict):
    """``traffic.engine: rxe`` (Soft-RoCE + perftest, where the kernel has rdma_rxe): which perftest runs per flow
    and its message size."""
    test: Literal["write_bw", "send_bw"] = "write_bw"      # ib_write_bw | ib_send_bw
    msg_bytes: Size = 65536


class DcqcnSpec(Strict):
    """DCQCN parameters; None = the paper's value scaled to the host link rate (testbed/workloads/roce/dcqcn.py)."""
    g: Optional[float] = Field(None, gt=0, le=1)
    cnp_interval: Optional[Time] = None
    rate_timer: Optional[Time] = None
    alpha_timer: Optional[Time] = None
    byte_counter: Optional[Size] = None
    fast_recovery: Optional[int] = Field(None, ge=0, le=100)
    rate_ai: Optional[Rate] = None
    rate_hai: Optional[Rate] = None
    min_rate: Optional[Rate] = None


class JobSpec(Strict):
    """One collective job: ``iterations`` × (the collective, then ``gap`` of compute)."""
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    pattern: Literal["allreduce", "all-to-all", "incast", "permutation"]
    hosts: Optional[list[NodeName]] = None     # None = every host; incast: the first one receives
    bytes: Size                                # allreduce: buffer per rank; all-to-all: per pair; incast: per
                                               # sender; permutation: per flow
    iterations: int = Field(1, ge=1, le=10000)
    gap: Time = 0

    @model_validator(mode="after")
    def _enough_hosts(self):
        if self.hosts is not None and len(set(self.hosts)) < 2:
            raise ValueError("hosts: a collective needs at least 2 distinct hosts")
        return self


class TrafficSpec(Strict):
    engine: Literal["udp", "tcp", "roce", "rxe"] = "udp"
    pattern: Literal["pairs", "permutation", "all-to-all", "incast", "allreduce"] = "permutation"
    receiver: Literal["gbn", "ooo"] = "gbn"      # RoCE: go-back-N (as NICs do) or reordering-tolerant
    cc: Literal["none", "dcqcn"] = "none"        # RoCE congestion control
    roce: RoceSpec = RoceSpec()
    dcqcn: DcqcnSpec = DcqcnSpec()
    rxe: RxeSpec = RxeSpec()
    jobs: list[JobSpec] = []                     # collectives; when given, `pattern` and `pairs` are not used
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
    dscp: int = Field(0, ge=0, le=63)         # DSCP of every flow's packets (IP_TOS)
    ecn: Literal["none", "ect0", "ect1"] = "none"   # ECN codepoint UDP senders put on their packets

    @model_validator(mode="after")
    def _pairs_needed(self):
        if self.pattern == "pairs" and not self.pairs and not self.jobs:
            raise ValueError("pairs: pattern 'pairs' needs a list like [[h0, h1]]")
        if self.pattern == "allreduce" and not self.jobs and self.flow_size is None:
            raise ValueError("flow_size: pattern 'allreduce' needs the buffer size per rank in flow_size")
        if self.engine == "rxe" and self.collective:
            raise ValueError("engine: collectives run on the built-in engines (roce, udp, tcp), not on rxe/perftest")
        if (self.receiver != "gbn" or self.cc != "none") and self.engine not in ("roce",):
            raise ValueError(f"engine: receiver/cc apply to the RoCE engine (engine: roce), got {self.engine!r}")
        return self

    @property
    def collective(self) -> bool:
        return bool(self.jobs) or self.pattern == "allreduce"

    @property
    def wire_dscp(self) -> int:
        """The DSCP the flows' packets carry: ``dscp``, except that RoCE defaults to 26 (AF31, what RoCE NICs
        use) when ``dscp`` is not given."""
        if self.engine in ("roce", "rxe") and "dscp" not in self.model_fields_set:
            return ROCE_DSCP
        return self.dscp

    def job_list(self) -> list[JobSpec]:
        if self.jobs:
            return list(self.jobs)
        return [JobSpec(pattern="allreduce", bytes=self.flow_size)]


class TelemetrySpec(Strict):
    interval: Annotated[int, _unit(units.time_ns), Field(ge=10_000_000)] = units.time_ns("100ms")


class Scenario(Strict):
    name: str = Field("scenario", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    seed: int = Field(1, ge=0)
    duration: Annotated[int, _unit(units.time_ns), Field(gt=0)] = units.time_ns("5s")
    topology: TopologySpec = TopologySpec()
    switch: SwitchSpec = SwitchSpec()
    hosts: HostsSpec = HostsSpec()
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
        for i, job in enumerate(self.traffic.jobs):
            where += [(f"traffic.jobs.{i}.hosts", n) for n in job.hosts or []]
        for path, n in where:
            if n not in names:
                raise ValueError(f"@{path}: no node {n!r} in this topology "
                                 f"({self.topology.hosts} hosts h0..h{self.topology.hosts - 1})")
        self._pfc_does_something()
        for a, b in self.traffic.pairs:
            if a == b:
                raise ValueError(f"@traffic.pairs: a flow from {a} to itself never crosses the fabric")
            if not (a.startswith("h") and b.startswith("h")):
                raise ValueError(f"@traffic.pairs: flows run between hosts, got [{a}, {b}]")
        return self


    def _pfc_does_something(self) -> None:
        """PFC that could never pause anything is a mistake, not a configuration: refuse it with the fix."""
        sw, t = self.switch, self.traffic
        on = {tier: sw.qos(tier) for tier in ("leaf", "spine") if sw.qos(tier).pfc.enabled}
        for tier, q in on.items():
            if not q.traffic_classes.lossless:
                o = sw.tiers.get(tier)
                where = f"switch.tiers.{tier}" if o and o.traffic_classes is not None else "switch"
                raise ValueError(f"@{where}.traffic_classes.lossless: PFC is enabled ({tier} switches) but no "
                                 f"priority is lossless, so it would never pause anything; make one lossless and "
                                 f"send on it, e.g. {where}.traffic_classes: {{dscp: {{26: 3}}, lossless: [3]}} "
                                 f"with traffic.dscp: 26")
        if on and t.engine != "rxe":
            d = t.wire_dscp
            if all(q.traffic_classes.dscp.get(d, q.traffic_classes.default) not in q.traffic_classes.lossless
                   for q in on.values()):
                q = next(iter(on.values()))
                prio = q.traffic_classes.dscp.get(d, q.traffic_classes.default)
                want = next((k for k, v in q.traffic_classes.dscp.items() if v in q.traffic_classes.lossless), None)
                fix = f"set traffic.dscp: {want}" if want is not None else "map a DSCP to a lossless priority"
                raise ValueError(f"@traffic.dscp: PFC protects priorities {q.traffic_classes.lossless} but the "
                                 f"traffic (DSCP {d} → priority {prio}) is lossy, so PFC would never pause "
                                 f"anything; {fix}")


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
