"""YAML scenario → validated, typed model.

Every mistake is reported as one line naming the key path (``topology.spines: must be ≥ 1, got 0``), so a
scenario can be fixed without reading a traceback. ``--set key.path=value`` overrides are applied to the raw
document before validation, so they are checked exactly like the file.
"""
from __future__ import annotations

import builtins
import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (BeforeValidator, Field, PrivateAttr, ValidationError,
                      model_validator)

from . import dilation, profiles, units
from .spec_types import NodeName, Rate, ScenarioError, Size, Strict, Time, unit as _unit
from .datapath.int_wire import INT_HEADER_BYTES, INT_HOP_BYTES
from .controller.spec import ControllerSpec
from .controller import checks as controller_checks
from .collective import checks as collective_checks
from .collective.spec import CollectiveSpec
from .inband.spec import IntSpec
from .lb.plugin import PluginSpec, resolve_source as resolve_plugin
from .lb.spec import AdaptiveSpec, DlbSpec, WcmpSpec
from .qos.spec import (CreditSpec, EcnMap, EcnSpec, PfcSpec, QosSpec, ResolvedQos, SharedBufferSpec,
                       TrafficClassSpec, TrimSpec)
from .routing.spec import FailureSpec, SmSpec
from .topology.model import TIERS
from .topology.spec import TopologySpec
from .inband import checks as inband_checks
from .lb import checks as lb_checks
from .qos import checks as qos_checks
from .routing import checks as routing_checks
from .workloads import checks as workload_checks
from .workloads.iperf3.spec import Iperf3Spec
from .workloads.mpi.spec import MpiSpec
from .workloads.roce import cc as roce_cc
from .workloads.roce.cc import DcqcnConfig, EqdsConfig, HpccConfig, NsccConfig, SwiftConfig, TimelyConfig

#: every mechanism family's cross-field checks, run on the whole scenario once its sections are valid
MECHANISM_CHECKS = (qos_checks.pfc_does_something, qos_checks.shared_buffer_fits, inband_checks.int_fits,
                    qos_checks.trim_can_trim, lb_checks.wcmp_source_fits, routing_checks.failures_fit,
                    workload_checks.engine_keys_apply, workload_checks.mpi_ranks_fit, workload_checks.iperf3_fits,
                    controller_checks.planned_entropy_fits, collective_checks.adapt_fits)


ROCE_DSCP = 26                  # AF31: the DSCP RoCE NICs mark by default




class SwitchSpec(Strict):
    load_balancing: Literal["ecmp", "flowlet", "spray", "adaptive", "wcmp", "dlb", "plugin"] = "ecmp"
    plugin: Optional[PluginSpec] = None     # load_balancing plugin: the header and its parameters (lb/plugin.py)
    # distributed: every switch's own ECMP groups (topology FIB), local fast failover, routes recomputed when a
    # link changes; sm: a subnet manager computes per-destination tables (switch.sm) and sweeps link state
    routing: Literal["distributed", "sm"] = "distributed"
    sm: SmSpec = SmSpec()
    flowlet_timeout: Time = units.time_ns("500us")
    spray: Literal["random", "round_robin"] = "random"
    adaptive: AdaptiveSpec = AdaptiveSpec()
    wcmp: WcmpSpec = WcmpSpec()
    dlb: DlbSpec = DlbSpec()
    hash_seed: int = Field(1, ge=0, lt=2**32)
    # what the ECMP/WCMP/failover hash covers; roce_qp adds the BTH destination QP of RoCEv2 packets
    hash_fields: list[Literal["src_ip", "dst_ip", "sport", "dport", "proto", "roce_qp"]] = \
        ["src_ip", "dst_ip", "sport", "dport", "proto"]
    buffer: Optional[Size] = None
    traffic_classes: TrafficClassSpec = TrafficClassSpec()
    ecn: EcnMap = None
    pfc: PfcSpec = PfcSpec()
    credit: CreditSpec = CreditSpec()
    shared_buffer: Optional[SharedBufferSpec] = None    # None: every (port, priority) has its own `buffer`
    trim: TrimSpec = TrimSpec()
    tiers: dict[Literal[TIERS], QosSpec] = {}

    @model_validator(mode="after")
    def _plugin(self):
        if self.load_balancing == "plugin" and self.plugin is None:
            raise ValueError("load_balancing: plugin needs switch.plugin: {source: HEADER.h, params: {...}}")
        if self.plugin is not None and self.load_balancing != "plugin":
            raise ValueError(f"plugin: only with load_balancing: plugin (it is {self.load_balancing})")
        return self

    @model_validator(mode="after")
    def _hash_fields(self):
        if not self.hash_fields:
            raise ValueError("hash_fields: the hash needs at least one field (e.g. [src_ip, dst_ip])")
        if len(set(self.hash_fields)) != len(self.hash_fields):
            raise ValueError(f"hash_fields: a field is listed twice ({', '.join(self.hash_fields)})")
        return self

    @property
    def sm_multipath(self) -> bool:
        """Under SM routing, whether a destination gets every port the engine allows (for the load balancer to
        pick among: flowlet, spray, adaptive) or the engine's one deterministic port (ecmp: no choice, as a
        LID's linear forwarding table entry)."""
        return self.load_balancing != "ecmp"

    def qos(self, tier: str) -> "ResolvedQos":
        """The effective settings of a tier's switches: the tier's override where it sets a key, else these."""
        o = self.tiers.get(tier, QosSpec())
        ecn = o.ecn if o.ecn is not None else self.ecn
        if isinstance(ecn, EcnSpec):
            ecn = {p: ecn for p in range(8)}
        return ResolvedQos(buffer=o.buffer if o.buffer is not None else self.buffer,
                           traffic_classes=o.traffic_classes or self.traffic_classes,
                           ecn=dict(ecn or {}), pfc=o.pfc or self.pfc, credit=o.credit or self.credit,
                           shared_buffer=o.shared_buffer or self.shared_buffer, trim=o.trim or self.trim)

    @property
    def classes_on(self) -> bool:
        """True when any tier uses more than one priority, PFC or credits: ports then get HTB + one class per
        priority (flow control pauses or meters one class)."""
        for t in TIERS:                 # a tier the topology lacks is refused in Scenario, so all may be read
            q = self.qos(t)
            if q.flow_control or q.traffic_classes.dscp or q.traffic_classes.default or q.trim.enabled:
                return True
        return False

    @property
    def credit_on(self) -> bool:
        return any(self.qos(t).credit.enabled for t in TIERS)

    @property
    def shared_buffer_on(self) -> bool:
        return any(self.qos(t).shared_buffer for t in TIERS)

    def trim_priority(self, tiers) -> Optional[int]:
        """The priority trimmed headers travel on (every switch of ``tiers`` classifies them to it), or None when
        no tier trims. One for the fabric: Scenario refuses tiers that disagree."""
        return next((self.qos(t).trim.priority for t in tiers if self.qos(t).trim.enabled), None)


def _image_name(v):
    """A Docker image reference as the local daemon knows it (repository[:tag] or an image id)."""
    if not isinstance(v, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                                                 r"|sha256:[0-9a-f]{64}", v):
        raise ValueError(f"not a Docker image name (lowercase repository[:tag], e.g. fabric-testbed/host or "
                         f"debian:bookworm), got {v!r}")
    return v


ImageName = Annotated[str, BeforeValidator(_image_name)]


class DockerHostsSpec(Strict):
    """``hosts.docker``: every host is a container of ``image`` (``per_host`` names other images for some hosts),
    started without a network of its own; the fabric moves the host's NICs into it (testbed/container/)."""
    image: ImageName = "fabric-testbed/host"
    per_host: dict[NodeName, ImageName] = {}

    def image_of(self, host: str) -> str:
        return self.per_host.get(host, self.image)


class HostsSpec(Strict):
    pfc: bool = False            # host NICs obey PFC pause frames (per priority) from their leaf
    docker: Optional[DockerHostsSpec] = None    # hosts are Docker containers (default: network namespaces)


class IncastSpec(Strict):
    receiver: NodeName = "h0"
    senders: Union[list[NodeName], int, None] = None   # names, a count (first N others), or all others


class RoceSpec(Strict):
    """Options of the built-in RoCEv2 engine (``traffic.engine: roce``)."""
    entropy: Literal["qp", "packet", "reps", "bitmap"] = "qp"   # qp: one UDP source port per QP; packet: cycle
                                                    # per packet; reps/bitmap: path-aware (roce/entropy.py)
    entropy_values: Optional[int] = Field(None, ge=1, le=4096)   # source ports a flow sprays over (None: 8 for
                                                    # packet, 256 for reps/bitmap)
    penalty_decay: Optional[Annotated[int, *_unit(units.time_ns), Field(ge=1000)]] = None   # bitmap: one
                                                    # penalty point decays per this long (None: one smoothed RTT)
    message_size: Optional[Size] = None             # RDMA WRITE size; None = the whole flow (1MB for duration flows)
    mtu: Optional[Literal[256, 512, 1024, 2048, 4096]] = None   # IB path MTU; None = largest fitting packet_size
    rto: Union[Literal["auto"], Annotated[int, *_unit(units.time_ns), Field(ge=100_000)]] = "auto"
                                                    # auto: RFC 6298 estimate above the longest queueing a packet
                                                    # can meet on its path (× 2 with flow control; flows.rto_s),
                                                    # at least 10 ms;
                                                    # a time: go-back-N's fixed timeout (a NIC's), the extended
                                                    # transport's floor; below the queueing: a warning
    reorder_window: int = Field(32, ge=1, le=1 << 20)   # ooo receiver: NAK a hole this many PSNs behind …
    reorder_time: Optional[Annotated[int, *_unit(units.time_ns), Field(ge=0)]] = None   # … and this long after
                                                    # (None = rto / 4): sprayed paths reorder by queueing-delay spread
    drop_prob: float = Field(0.0, ge=0.0, le=0.5)   # test-only: receiver discards this fraction of data packets
    ce_prob: float = Field(0.0, ge=0.0, le=1.0)     # test-only: sender CE-marks this fraction of packets
    batch: int = Field(8, ge=1, le=32)              # same-size packets per UDP GSO sendmsg (entropy qp only);
                                                    # 1 = one sendmsg per packet with UDP checksum 0

    @property
    def values(self) -> int:
        """Entropy values a flow uses: 1 for qp, else entropy_values or its mode's default."""
        if self.entropy == "qp":
            return 1
        return self.entropy_values or (8 if self.entropy == "packet" else 256)


class RxeSpec(Strict):
    """``traffic.engine: rxe`` (Soft-RoCE + perftest, where the kernel has rdma_rxe): which perftest runs per flow
    and its message size."""
    test: Literal["write_bw", "send_bw"] = "write_bw"      # ib_write_bw | ib_send_bw
    msg_bytes: Size = 65536


class JobSpec(Strict):
    """One collective job: ``iterations`` × (the collective, then ``gap`` of compute)."""
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    pattern: Literal["allreduce", "all-to-all", "incast", "permutation"]
    hosts: Optional[list[NodeName]] = None     # None = every host; incast: the first one receives
    bytes: Size                                # allreduce: buffer per rank; all-to-all: per pair; incast: per
                                               # sender; permutation: per flow
    iterations: int = Field(1, ge=1, le=10000)
    gap: Time = 0
    algorithm: Optional[Literal["direct", "pairwise"]] = None   # all-to-all: every pair at once (direct, the
                                               # default) or N−1 shifted steps (pairwise exchange)

    @model_validator(mode="after")
    def _enough_hosts(self):
        if self.hosts is not None and len(set(self.hosts)) < 2:
            raise ValueError("hosts: a collective needs at least 2 distinct hosts")
        if self.algorithm is not None and self.pattern != "all-to-all":
            raise ValueError(f"algorithm: chooses how an all-to-all is scheduled, not a {self.pattern}")
        return self


class TrafficSpec(Strict):
    engine: Literal["udp", "tcp", "roce", "rxe", "mpi", "iperf3"] = "udp"
    pattern: Literal["pairs", "permutation", "all-to-all", "incast", "allreduce", "poisson"] = "permutation"
    receiver: Literal["gbn", "ooo"] = "gbn"      # RoCE: go-back-N (as NICs do) or reordering-tolerant
    cc: str = "none"        # RoCE CC: none | a registered name (built-ins and plugins: workloads/roce/cc/registry.py)
    cc_params: Optional[dict[str, Any]] = None   # the selected CC's parameters, checked by its own model
    roce: RoceSpec = RoceSpec()
    # each built-in CC's parameters (its module's model); cc_params is the alternative spelling for the selected one
    dcqcn: DcqcnConfig = DcqcnConfig()
    nscc: NsccConfig = NsccConfig()
    swift: SwiftConfig = SwiftConfig()
    timely: TimelyConfig = TimelyConfig()
    hpcc: HpccConfig = HpccConfig()
    eqds: EqdsConfig = EqdsConfig()
    rxe: RxeSpec = RxeSpec()
    mpi: MpiSpec = MpiSpec()                     # engine mpi: the Open MPI benchmark (workloads/mpi/spec.py)
    iperf3: Iperf3Spec = Iperf3Spec()            # engine iperf3: Debian's iperf3 per flow (workloads/iperf3)
    jobs: list[JobSpec] = []                     # collectives; when given, `pattern` and `pairs` are not used
    pairs: list[tuple[NodeName, NodeName]] = []
    incast: IncastSpec = IncastSpec()
    flows_per_pair: int = Field(1, ge=1, le=1024)
    qps_per_connection: int = Field(1, ge=1, le=64)   # collectives/replay: each transfer over this many QPs
    flow_size: Optional[Size] = None          # bytes per flow; None = send for `duration`
    rate: Optional[Rate] = None               # per flow; None = host link rate (back-pressured)
    start: Time = 0
    sport: Union[Literal["random", "sequential"], Annotated[int, Field(ge=1, le=65535)]] = "random"
    sport_base: int = Field(20000, ge=1024, le=65000)
    dport: int = Field(5001, ge=1, le=65000)
    packet_size: Optional[int] = Field(None, ge=64, le=9000)   # IP packet size; None = MTU
    dscp: int = Field(0, ge=0, le=63)         # DSCP of every flow's packets (IP_TOS)
    rail_shift: int = Field(0, ge=0, le=7)    # flow on rail r goes to the destination's NIC on rail r + shift
    ecn: Literal["none", "ect0", "ect1"] = "none"   # ECN codepoint UDP senders put on their packets
    load: Optional[float] = Field(None, gt=0, le=1)   # poisson: each host's offered load, share of its link rate
    size_dist: Optional[str] = None           # poisson: websearch | hadoop | alistorage | a CDF file (sizes.py)
    arrival_window: Optional[Time] = None     # poisson: flows arrive this long after `start`; None = half the rest
    replay: Optional[str] = None              # a schedule file (workloads/replay.py); then pattern/jobs unused
    collective: CollectiveSpec = CollectiveSpec()   # collectives that read the network (testbed/collective)
    _cc_config: Any = PrivateAttr(None)
    _queues_held: bool = PrivateAttr(False)

    @property
    def queues_held(self) -> bool:
        """Some tier runs PFC or credits, so a paused queue can hold a packet longer than its buffer ÷ rate (set by
        the Scenario it belongs to; ``rto: auto`` doubles its floor then)."""
        return self._queues_held

    @model_validator(mode="after")
    def _cc(self):
        """``cc`` names a registered CC; ``cc_params`` is validated by that CC's own model (one line naming
        ``traffic.cc_params.<key>``) and, for a built-in, is not given beside its ``traffic.<cc>`` section."""
        if self.cc == "none":
            if self.cc_params:
                raise ValueError("cc_params: parameters given but traffic.cc is 'none'")
            return self
        try:
            cc = roce_cc.get_cc(self.cc)
        except roce_cc.UnknownCC as e:
            raise ValueError(f"@traffic.cc: {e}") from None
        if self.cc_params is None:
            if len(cc.sections) == 1:
                self._cc_config = getattr(self, cc.sections[0])
            elif cc.sections:
                self._cc_config = cc.params_model(**{s: getattr(self, s) for s in cc.sections})
            else:
                self._cc_config = cc.params_model()
            return self
        for sec in cc.sections:
            if getattr(self, sec).model_fields_set:
                raise ValueError(f"cc_params: traffic.{sec} is given too: give {self.cc}'s parameters once")
        try:
            self._cc_config = cc.params_model.model_validate(self.cc_params)
        except ValidationError as e:
            raise ValueError(f"@traffic.cc_params.{_first_error(e)}") from None
        return self

    @property
    def cc_config(self):
        """The selected CC's parameters (its own model): ``cc_params``, or its ``traffic.<cc>`` section."""
        return self._cc_config

    @model_validator(mode="after")
    def _qps(self):
        if self.qps_per_connection > 1 and not (self.jobs or self.replay or self.pattern == "allreduce"):
            raise ValueError("qps_per_connection: splits the transfers of collective jobs and replayed schedules; "
                             "pattern flows use flows_per_pair")
        return self

    @model_validator(mode="after")
    def _replay(self):
        if self.replay is None:
            return self
        if self.jobs:
            raise ValueError("replay: give either a schedule to replay or collective jobs, not both")
        if self.flow_size is not None:
            raise ValueError("flow_size: a replayed schedule gives each transfer's bytes")
        if self.engine == "rxe":
            raise ValueError("engine: a replayed schedule runs on the built-in engines (roce, udp, tcp)")
        if self.rail_shift:
            raise ValueError("rail_shift: a replayed transfer is striped over the rails, as collectives are")
        from .workloads.replay import ReplayError, read
        try:
            read(self.replay)
        except ReplayError as e:
            raise ValueError(f"replay: {e}") from None
        return self

    @model_validator(mode="after")
    def _poisson(self):
        given = [k for k in ("load", "size_dist", "arrival_window") if getattr(self, k) is not None]
        if self.pattern != "poisson":
            if given:
                raise ValueError(f"{given[0]}: applies to pattern 'poisson' only (pattern is {self.pattern!r})")
            return self
        if self.load is None or self.size_dist is None:
            raise ValueError("load: pattern 'poisson' needs load (e.g. 0.5) and size_dist "
                             "(websearch | hadoop | alistorage | FILE)")
        if self.flow_size is not None:
            raise ValueError("flow_size: pattern 'poisson' draws each flow's size from size_dist")
        if self.engine == "rxe":
            raise ValueError("engine: pattern 'poisson' runs on the built-in engines (udp, tcp, roce)")
        from .workloads.sizes import SizeDistError, resolve
        try:
            resolve(self.size_dist)
        except SizeDistError as e:
            raise ValueError(str(e)) from None
        if self.arrival_window is not None and self.arrival_window <= 0:
            raise ValueError("arrival_window: must be > 0")
        return self

    @model_validator(mode="after")
    def _pairs_needed(self):
        if self.pattern == "pairs" and not self.pairs and not self.jobs:
            raise ValueError("pairs: pattern 'pairs' needs a list like [[h0, h1]]")
        if self.pattern == "allreduce" and not self.jobs and self.flow_size is None:
            raise ValueError("flow_size: pattern 'allreduce' needs the buffer size per rank in flow_size")
        if self.engine == "rxe" and self.runs_collectives:
            raise ValueError("engine: collectives run on the built-in engines (roce, udp, tcp), not on rxe/perftest")
        if (self.receiver != "gbn" or self.cc != "none") and self.engine not in ("roce",):
            raise ValueError(f"engine: receiver/cc apply to the RoCE engine (engine: roce), got {self.engine!r}")
        for fam in ("nscc", "swift", "timely", "hpcc", "eqds"):      # parameters of a CC that does not run
            given = any(v is not None for v in getattr(self, fam).model_dump().values())
            if given and fam not in self.cc.split("+"):
                raise ValueError(f"{fam}: parameters given but traffic.cc is {self.cc!r}")
        return self

    @property
    def runs_collectives(self) -> bool:
        return (bool(self.jobs) or self.pattern == "allreduce") and self.replay is None

    @property
    def scheduled(self) -> bool:
        """Runs as one dependency-driven schedule (workloads/replay.py): a replay or collective jobs."""
        return self.replay is not None or self.runs_collectives

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
    # builtins.int: the field `int` below shadows the name in this class's (deferred) annotations
    interval: Annotated[builtins.int, *_unit(units.time_ns), Field(ge=10_000_000)] = units.time_ns("100ms")
    int: IntSpec = IntSpec()


class PlacementSpec(Strict):
    """One fabric split over the machines of a Ray cluster (``testbed run|up --cluster``; testbed/cluster/):
    ``partitions`` machines, chosen by ``strategy`` — ``auto`` (METIS: links weighted by rate, nodes by expected
    load, every leaf kept with its hosts), ``by-leaf`` (whole leaf groups) or ``manual`` (``assign``: node →
    machine index 0..partitions−1; a host left out follows its leaf)."""
    partitions: int = Field(2, ge=1, le=64)
    strategy: Literal["auto", "by-leaf", "manual"] = "auto"
    assign: dict[NodeName, Annotated[int, Field(ge=0)]] = {}

    @model_validator(mode="after")
    def _assign_with_manual(self):
        if self.strategy == "manual" and not self.assign:
            raise ValueError("@placement.assign: strategy manual needs assign: {node: machine index, …}")
        if self.strategy != "manual" and self.assign:
            raise ValueError(f"@placement.assign: only with strategy: manual (strategy is {self.strategy})")
        for n, m in self.assign.items():
            if m >= self.partitions:
                raise ValueError(f"@placement.assign.{n}: machine {m} out of range: partitions is {self.partitions} "
                                 f"(machines 0..{self.partitions - 1})")
        return self


class Scenario(Strict):
    name: str = Field("scenario", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    # a fabric architecture's defaults merged under the scenario before validation (testbed/profiles.py)
    profile: Optional[Literal[profiles.NAMES]] = None
    seed: int = Field(1, ge=0)
    duration: Annotated[int, *_unit(units.time_ns), Field(gt=0)] = units.time_ns("5s")
    topology: TopologySpec = TopologySpec()
    switch: SwitchSpec = SwitchSpec()
    hosts: HostsSpec = HostsSpec()
    traffic: TrafficSpec = TrafficSpec()
    telemetry: TelemetrySpec = TelemetrySpec()
    capture: list[NodeName] = []
    failures: list[FailureSpec] = []
    # the scenario is in real units, emulated N times slower (testbed/dilation.py); auto: N from the CPU budget
    time_dilation: Union[Annotated[int, Field(ge=1, le=1_000_000)], Literal["auto"], None] = None
    placement: Optional[PlacementSpec] = None    # one fabric over several machines (with --cluster)
    controller: ControllerSpec = ControllerSpec()   # the fabric controller: planned entropy (testbed/controller)
    # a validation scenario's published result: read by `testbed validate` (testbed/validate/spec.py), not by a run
    reference: Optional[dict[str, Any]] = None
    _profile_keys: tuple[str, ...] = PrivateAttr(default=())
    _dilation: int = PrivateAttr(default=1)
    _real_doc: Optional[dict] = PrivateAttr(default=None)
    _dilated_keys: tuple[str, ...] = PrivateAttr(default=())
    _auto_budget: Optional[dict] = PrivateAttr(default=None)

    @property
    def dilation(self) -> int:
        """N of a dilated scenario (this one holds the emulated values; ``time_dilation`` is unset in it), else 1."""
        return self._dilation

    @property
    def real_doc(self) -> Optional[dict]:
        """A dilated scenario as written, in real units (None when not dilated)."""
        return self._real_doc

    @property
    def auto_budget(self) -> Optional[dict]:
        """``time_dilation: auto``: the packets/s per core it divided by and where that figure comes from."""
        return self._auto_budget

    @property
    def dilated_keys(self) -> tuple[str, ...]:
        """The dotted keys time dilation scaled."""
        return self._dilated_keys

    @property
    def profile_keys(self) -> tuple[str, ...]:
        """The dotted keys ``profile`` filled (the scenario and its overrides left them unset), for the
        manifest; empty without a profile or when built by ``model_validate`` directly."""
        return self._profile_keys

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
        if self.hosts.docker is not None:
            where += [("hosts.docker.per_host", n) for n in self.hosts.docker.per_host]
        if isinstance(self.traffic.mpi.ranks, list):
            where += [("traffic.mpi.ranks", n) for n in self.traffic.mpi.ranks]
        if self.placement is not None:
            where += [(f"placement.assign.{n}", n) for n in self.placement.assign]
        if self.traffic.replay is not None:
            from .workloads.replay import check, read
            check(read(self.traffic.replay), {n for n in names if n.startswith("h")},
                  f"@traffic.replay: {self.traffic.replay}")
        for path, n in where:
            if n not in names:
                raise ValueError(f"@{path}: no node {n!r} in this topology "
                                 f"({self.topology.hosts} hosts h0..h{self.topology.hosts - 1})")
        for tier in self.switch.tiers:
            if tier not in self.topology.tiers:
                raise ValueError(f"@switch.tiers.{tier}: this topology has no {tier} switches "
                                 f"(kind {self.topology.kind}: {', '.join(self.topology.tiers)})")
        self._rail_shift_crosses()
        self.traffic._queues_held = any(self.switch.qos(t).flow_control for t in self.topology.tiers)
        for check in MECHANISM_CHECKS:
            check(self)
        self._docker_hosts_fit()
        for a, b in self.traffic.pairs:
            if a == b:
                raise ValueError(f"@traffic.pairs: a flow from {a} to itself never crosses the fabric")
            if not (a.startswith("h") and b.startswith("h")):
                raise ValueError(f"@traffic.pairs: flows run between hosts, got [{a}, {b}]")
        return self

    def _docker_hosts_fit(self) -> None:
        """Container hosts are hosts, and their NICs must stay in the container's namespace."""
        d = self.hosts.docker
        if d is None:
            return
        for n in d.per_host:
            if not n.startswith("h"):
                raise ValueError(f"@hosts.docker.per_host.{n}: {n} is a switch; only hosts are containers")
        if self.traffic.engine == "rxe":
            raise ValueError("@hosts.docker: not with traffic.engine rxe (Soft-RoCE moves the host NICs into the "
                             "initial namespace, out of the containers); use udp, tcp or roce")

    def _rail_shift_crosses(self) -> None:
        """Cross-rail flows need a path between rails, and a shift that is a whole number of rails is none."""
        shift, topo = self.traffic.rail_shift, self.topology
        if not shift:
            return
        if self.traffic.jobs:
            raise ValueError("@traffic.rail_shift: applies to pattern flows; collective jobs run on rail 0")
        if shift % topo.rails == 0:
            raise ValueError(f"@traffic.rail_shift: {shift} is a multiple of topology.rails ({topo.rails}): every "
                             f"flow would stay on its own rail")
        if not topo.rails_share_spines:
            raise ValueError(f"@traffic.rail_shift: cross-rail flows need topology.rails_share_spines: true "
                             f"(separate rail planes are not connected), got {shift}")

    @property
    def packet_size(self) -> int:
        """The IP packet size the traffic engines send: `traffic.packet_size`, or the topology's MTU."""
        return self.traffic.packet_size or self.topology.mtu

    @property
    def fabric_mtu(self) -> int:
        """The MTU of links between switches: the topology's, plus room for the largest INT stack when INT is on
        (as fabrics run 9216 under hosts' 9000), unless `telemetry.int.fabric_mtu` says otherwise; at least the
        host links' (`host_mtu`)."""
        i = self.telemetry.int
        if not i.enabled:
            return self.host_mtu
        return max(self.host_mtu, i.fabric_mtu if i.fabric_mtu is not None else self.topology.mtu + i.room())

    @property
    def host_int_hops(self) -> int:
        """Hop records the INT stack of an HPCC flow's data packet gathers (its sender starts the stack, every
        switch of the path adds a record, the receiver echoes them): the switches of the longest path; 0 unless
        `traffic.cc` is hpcc."""
        return self.topology.path_switches if self.traffic.cc == "hpcc" else 0

    @property
    def host_mtu(self) -> int:
        """The MTU of host links: the topology's, plus room for an HPCC flow's INT stack (`host_int_hops`), whose
        bytes travel to the receiving host as real bytes on the links (as HPCC's INT does)."""
        h = self.host_int_hops
        return self.topology.mtu + (INT_HEADER_BYTES + h * INT_HOP_BYTES if h else 0)

# ---------------------------------------------------------------- loading and overrides

_BASE60 = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")


class _Loader(yaml.SafeLoader):
    """Safe YAML without YAML 1.1's base-60 numbers: ``oversubscription: 2:1`` is the text 2:1, not 121."""

    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and implicit[0] and _BASE60.match(value):
            return "tag:yaml.org,2002:str"
        return super().resolve(kind, value, implicit)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def _key(p: Any) -> str:
    """A key path component as the user typed it; a key that is empty, has spaces or unprintable characters is
    quoted, so the message stays one readable line."""
    text = str(p)
    return text if text and text.isprintable() and " " not in text and "." not in text else repr(p)


def _fmt_error(err: dict) -> str:
    loc = ".".join(_key(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[", "union[")))
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
        value = _yaml(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _first_error(e: ValidationError) -> str:
    errors = e.errors()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _fmt_error(errors[0]) + more


def _show(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _profile_blame(doc: dict, filled: list[str], first: str) -> str:
    """Which keys the profile filled caused the refusal: the refused key itself when the profile filled it, and
    every filled key without which the scenario is valid (e.g. the credits infiniband enables next to an explicit
    switch.pfc.enabled: true)."""
    loc = first.split(": ", 1)[0]
    blamed = []
    for key in filled:
        if key != loc:
            try:
                Scenario.model_validate(profiles.without(doc, key))
            except ValidationError:
                continue
        blamed.append(key)
    if not blamed:
        return ""
    got = "; ".join(f"{k}: {_show(_get(doc, k))}" for k in blamed)
    return (f" ({got} {'was' if len(blamed) == 1 else 'were'} set by profile {doc['profile']}; set "
            f"{'it' if len(blamed) == 1 else 'them'} explicitly to change that)")


def _get(doc: dict, dotted: str) -> Any:
    for k in dotted.split("."):
        doc = doc[k]
    return doc


def from_dict(doc: Any, overrides: tuple[str, ...] = ()) -> Scenario:
    """Validate a raw scenario mapping: overrides applied first, then the profile's defaults merged under the
    result (so ``--set profile=…`` selects the profile and explicit keys still win), then the model."""
    doc = copy.deepcopy(doc) if doc is not None else {}
    if not isinstance(doc, dict):
        raise ScenarioError("<scenario>: the file must be a mapping of keys (topology:, switch:, traffic: …)")
    for text in overrides:
        set_path(doc, *parse_override(text))
    doc, filled = profiles.apply(doc)
    if doc.get("time_dilation") is not None:
        return _emulated(doc, filled)
    try:
        scen = Scenario.model_validate(doc)
    except ValidationError as e:
        first = _first_error(e)
        raise ScenarioError(first + (_profile_blame(doc, filled, first) if filled else "")) from None
    scen._profile_keys = tuple(filled)
    return scen


def _emulated(doc: dict, filled) -> Scenario:
    """A dilated scenario (``time_dilation``): what it states in real units scaled by N (dilation.py), then
    validated — the checks apply to what is emulated. ``real`` keeps the mapping as written."""
    import os
    td, n, budget = doc["time_dilation"], None, None
    try:
        if td == "auto":
            tr = doc.get("traffic")                 # (a traffic that is not a mapping fails validation below)
            per_core, source = dilation.budget((tr.get("engine") if isinstance(tr, dict) else None) or "udp")
            n = dilation.auto_factor(doc, os.cpu_count() or 1, per_core)
            budget = {"pps_per_core": per_core, "source": source}
        elif isinstance(td, int) and not isinstance(td, bool) and 1 <= td <= 1_000_000:
            n = td
        else:
            raise ScenarioError(f"time_dilation: a whole number 1..1000000 or auto, got {td!r}")
        scaled, keys = dilation.dilate({k: v for k, v in doc.items() if k != "time_dilation"}, Scenario, n,
                                       frozenset(filled))
        emu = Scenario.model_validate(scaled)
    except ValidationError as e:                  # (a ValueError too: caught first)
        if n is None:                             # the topology auto reads its factor from is itself wrong
            raise ScenarioError(f"topology.{_first_error(e)} (time_dilation auto reads it)") from None
        raise ScenarioError(f"{_first_error(e)} (with time_dilation {n}: the emulated value)") from None
    except ValueError as e:                       # DilationError, a quantity that does not parse
        raise ScenarioError(str(e)) from None
    emu._profile_keys, emu._dilation, emu._real_doc, emu._dilated_keys = tuple(filled), n, doc, tuple(keys)
    emu._auto_budget = budget
    return emu


def load(path: str | Path, overrides: tuple[str, ...] = ()) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read scenario ({e.strerror})") from None
    try:
        doc = _yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ScenarioError(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    resolve_plugin(doc.get("switch") if isinstance(doc, dict) else None, path.parent)
    tr = ((doc or {}).get("traffic") or {}) if isinstance(doc, dict) else {}
    for key in ("size_dist", "replay"):                # a CDF or schedule file beside the scenario
        ref = tr.get(key) if isinstance(tr, dict) else None
        if isinstance(ref, str) and not Path(ref).is_absolute() and (path.parent / ref).is_file():
            doc["traffic"][key] = str((path.parent / ref).resolve())
    try:
        scen = from_dict(doc, overrides)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None
    if "name" not in (doc or {}):
        scen = scen.model_copy(update={"name": path.stem[:40]})
    return scen


def to_dict(scen: Scenario, roundtrip: bool = False) -> dict:
    """The scenario as resolved (every default filled in), for the manifest (quantities as integers: bit/s,
    bytes, ns); ``roundtrip``: quantities with their units, so ``from_dict`` reads back the same scenario."""
    return scen.model_dump(mode="json", context={"roundtrip": roundtrip})
