"""The eBPF switching datapath: one BCC-compiled tc ingress program that serves every switch port.

``Datapath(topo, switch_spec, ports).load()`` compiles ebpf/switch.c, loads its ingress function as a SCHED_CLS
program and fills the maps from the topology; the fabric then attaches ``ingress_fd`` (cls_bpf, direct-action)
on the clsact ingress of every switch port. Because ports have fabric-unique ifindexes, one program and one set
of maps serve all switches: the port map tells which switch a packet arrived at.

Maps (names as in ebpf/lib/maps.h): ``ports`` (array by ifindex → switch id, MACs), ``fib`` (LPM trie keyed by
switch id + IPv4 destination → next-hop group), ``sw_config`` (array by switch id → mode, seed, flowlet
timeout, spray kind, adaptive and DLB parameters), ``rr_next`` (round-robin counters), ``flows`` (LRU by
switch + 5-tuple → flowlet state and packets per next-hop slot), ``port_stats`` (per-CPU array by ifindex),
``drop_reason_counts`` (per-CPU array), ``port_down`` (by ifindex: 1 when the port lost its link; every egress
choice skips it). With ``switch.routing: sm`` the FIB starts empty: the subnet manager (routing/manager.py)
writes a /32 per destination host.
Congestion and flow control (ebpf/lib/qos.h; read from user space through queue_model.py): ``qos_config`` (per
switch: DSCP → priority, lossless and ECN curves, Xoff, trimming: lib/trim.h), ``port_qos`` (per port: drain rate, buffer, limits),
``vq`` (per (port, priority): the queue model, under a spin lock), ``egress_paused`` (when a paused queue
stopped draining), ``ingress_state`` (PFC accounting per ingress, under a spin lock), ``queue_stats`` /
``queue_max`` (per-CPU counters, with the trims of switch.trim), ``pfc_events`` (ring buffer to the PFC agent), ``pfc_stats`` (the agent's
counters). User space changes the model only through the control program ``ftb_ctl`` (``Datapath.control``).
Load balancing ``plugin`` (``Datapath(plugin=LbPlugin(...))``, built by testbed/lb/plugin.py): the plugin's header
is compiled in at ebpf/lb/plugin.h's place and ``plugin_params`` holds its parameters by index.
"""
from __future__ import annotations

import ctypes as ct
import functools
import ipaddress
import re
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import hashing, kheaders, source
from ..fabric.port import HOST_LINK_ROLES, N_PRIO, PortConfig, port_configs
from .int_wire import INT_MAX_HOPS
from .bccutil import import_bcc, quiet_stderr
from .source import LbPlugin
from ..errors import DatapathError
from . import queue_model
from .queue_model import drift_resync, ingress_queued, queue_state

__all__ = ["Datapath", "DatapathError", "PortCounters", "QueueCounters", "N_PRIO", "FlowPath", "DROP_REASONS",
           "MODES", "SPRAY_KINDS", "LbPlugin"]

PROGRAM = "ftb_switch_ingress"
NIC_RELEASE = "ftb_nic_release"     # XDP on leaf host ports: releases the sender's socket (see switch.c)
HOST_PROGRAM = "ftb_host_ingress"
STAGES = ("ftb_stage_adaptive", "ftb_stage_forward", "ftb_stage_failover",   # tail-call stages, in the order of
          "ftb_stage_int")                                                    # STAGE_* (common.h)
INT_STAGE = "ftb_stage_int"
ADAPTIVE_STAGE = "ftb_stage_adaptive"
ADAPTIVE_MODES = ("adaptive", "dlb")   # the load-balancing modes whose choice runs in ADAPTIVE_STAGE (switch.c)
CONTROL_PROGRAM = "ftb_ctl"          # user space's atomic changes to the queue model (run with PROG_TEST_RUN)
MODES = {"ecmp": 0, "flowlet": 1, "spray": 2, "adaptive": 3, "wcmp": 4, "dlb": 5, "plugin": 6}
WCMP_GRANULARITY = {"flow": 0, "flowlet": 1, "packet": 2}
AR_METRICS = {"queue": 0, "load": 1, "queue+load": 2}
AR_GRANULARITY = {"packet": 0, "flowlet": 1}
SPRAY_KINDS = {"random": 0, "round_robin": 1}
# Index = the DROP_* enum in ebpf/lib/common.h.
DROP_REASONS = ("not_ipv4", "malformed", "no_route", "empty_group", "ttl", "no_port", "bad_egress", "port_down")
MIN_MAX_NH = 16
PORT_VALID = 1
PORT_EDGE = 2                        # the port faces a host: INT's source and sink (common.h)
INT_STATS = ("sourced", "no_room", "transit", "exceeded", "exported", "export_lost", "failed",   # INT_* (common.h)
             "probes", "delivered")


@dataclass
class PortCounters:
    """Counters of one switch port (summed over CPUs). ``discards``: frames the switch program could not forward
    (not IPv4, malformed, no route, TTL, …), charged to the port they arrived on — not congestion drops, which
    are per egress queue (QueueCounters). ``read_at``: the instant (time.time()) these values were read."""
    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0
    discards: int = 0
    discard_reasons: dict[str, int] = field(default_factory=dict)   # only reasons with a count
    read_at: float = 0.0


@dataclass
class QueueCounters:
    """Counters of one (egress port, priority) queue, summed over CPUs; ``depth_max`` is the largest depth an
    arriving packet saw since the previous read (the read resets it)."""
    packets: int = 0
    bytes: int = 0
    depth_sum: int = 0
    ecn_marks: int = 0
    ect_packets: int = 0
    drops: int = 0
    pause_rx: int = 0
    xoff_events: int = 0
    overflows: int = 0          # (as an ingress) lossless packets dropped for a full ingress buffer
    trims: int = 0              # packets cut to their headers and sent on the trim priority (switch.trim)
    depth_max: int = 0

    @property
    def depth_mean(self) -> float:
        return self.depth_sum / self.packets if self.packets else 0.0


@dataclass
class FlowPath:
    """How one flow was spread at one switch with a choice of next hops (n > 1)."""
    switch: str
    saddr: str
    daddr: str
    sport: int
    dport: int
    proto: int
    packets: dict[int, int]          # egress ifindex → packets sent there (only ports that were used)
    flowlets: int = 0                # flowlets the switch started for it (modes that keep flowlets; else 0)
    bytes: int = 0                   # frame bytes of the packets counted in ``packets``

    @property
    def paths(self) -> int:
        return len(self.packets)


@functools.lru_cache(maxsize=1024)
def _wcmp_bytes(weights: tuple[int, ...], slots: int) -> tuple[int, bytes]:
    table = hashing.wcmp_table(weights, slots)
    return len(table), bytes(table) + bytes(slots - len(table))


def fill_group(v, topo, ports, max_nh: int, weights=None) -> None:
    """Fill an ``nh_group`` map value: the egress ports (at most ``max_nh``) and the WCMP table of their
    weights (``weights``, integers, else the ``topology.links`` weight of each port's link;
    hashing.wcmp_table), which the switch program reads under ``load_balancing: wcmp``. One home for the group
    layout: the loader, the SM, the distributed re-route and the WCMP controller all write groups through it.
    Tables are cached per weight tuple (an SM install at k=16 writes 327,680 groups)."""
    ports = tuple(ports)[:max_nh]
    v.n = len(ports)
    for i, p in enumerate(ports):
        v.ports[i] = p
    w = tuple(weights)[:len(ports)] if weights is not None else tuple(topo.port(p).weight for p in ports)
    v.nslots, table = _wcmp_bytes(w, len(v.wslot))
    ct.memmove(v.wslot, table, len(table))


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _net_u32(addr: str) -> int:
    """An IPv4 address as the u32 whose memory holds it in network byte order (as the C side stores it)."""
    return int.from_bytes(socket.inet_aton(addr), "little")


def _net_str(u32: int) -> str:
    return socket.inet_ntoa(struct.pack("<I", u32))


_CLANG_ERROR = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?:(?P<col>\d+):)? (?:fatal )?error: (?P<msg>.*)$")


def _plugin_error(log: str, plugin: LbPlugin) -> str:
    """A plugin build's failure in one line: clang's first ``error:`` as ``switch.plugin.source: FILE:LINE: …``
    when it is in the plugin's header (its #line markers make clang name it), else the error with the plugin
    named; the verifier's complaint likewise."""
    src = str(Path(plugin.source).resolve())
    for ln in log.splitlines():
        m = _CLANG_ERROR.match(ln.strip())
        if m:
            if Path(m["file"]).resolve() == Path(src):
                return f"switch.plugin.source: {src}:{m['line']}: {m['msg']}"
            return f"switch.plugin.source {src}: {m['file']}:{m['line']}: {m['msg']}"
    first = _first_error(log)
    return f"switch.plugin.source {src}: {first}" if first else ""


def _first_error(log: str) -> str:
    """The line of a BCC log that says what went wrong: a compiler error, or the verifier's complaint (the
    line before its "processed N insns" summary)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("processed ") and " insns" in ln and i:
            return "verifier: " + lines[i - 1]
    return next((ln for ln in lines if "error" in ln.lower()), "")   # none: the exception says it (BCC's own)


class Datapath:
    """Compile, load and configure the switch program; read its counters. One object serves every switch."""

    def __init__(self, topo, switch_spec, ports: dict[int, PortConfig] | None = None, int_spec=None,
                 host_stacks: bool = False, plugin: LbPlugin | None = None):
        """``ports``: every port's egress configuration (fabric.port), the same objects the fabric builder used;
        default: computed from ``switch_spec``. ``int_spec``: the scenario's ``telemetry.int`` (None: off).
        ``host_stacks``: every switch adds its INT record to the stacks hosts start (Scenario.host_int_hops:
        traffic.cc hpcc). ``plugin``: a load-balancing plugin to compile in (switch.load_balancing: plugin;
        testbed/lb/plugin.py for_datapath)."""
        self.topo = topo
        self.plugin = plugin
        self.switch_spec = switch_spec
        self.int_spec = int_spec if int_spec is not None and int_spec.enabled else None
        self.host_stacks = bool(host_stacks)
        self.ports = ports if ports is not None else port_configs(topo, switch_spec)
        self._bpf = None
        self.resyncs = 0                       # queue models reset to the real backlog (sync_queue_models)
        self.track_flows = False               # per-flow counters at every switch, single-port routes too
        self._fn = None
        self.compile_seconds: float | None = None
        self._names = {i: n for n, i in topo.switch_ids.items()}
        self._switch_ports = sorted(p.ifindex for sw in topo.switches for p in topo.ports[sw])
        self._all_ports = sorted(p.ifindex for ps in topo.ports.values() for p in ps)
        self._host_fn = None
        self._int_consumer = None             # open_int_reports
        # Per switch: FIB rows longest prefix first, for mapping a flow's slots back to ifindexes.
        self._fib_by_switch: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}
        for e in topo.fib:
            self._fib_by_switch.setdefault(e.switch, []).append(
                (int(ipaddress.IPv4Address(e.prefix)), e.plen, tuple(e.ports)))
        for rows in self._fib_by_switch.values():
            rows.sort(key=lambda r: -r[1])
        self.max_nh = max([MIN_MAX_NH] + [len(e.ports) for e in topo.fib])
        hosts = len(topo.hosts)
        self.sm = getattr(switch_spec, "routing", "distributed") == "sm"
        nics = sum(1 for ps in topo.ports.values() for p in ps if p.address)
        # SM: one /32 per (switch, destination NIC); distributed: the topology's FIB plus, after failures, one
        # override per (switch, leaf prefix)
        extra = len(topo.switches) * nics if self.sm else len(topo.switches) * max(1, sum(
            1 for e in topo.fib if not e.ports and topo.nodes[e.switch].kind == "leaf"))
        self.sizes = {
            "MAX_NH": self.max_nh,
            # peers too: a cut link's far port (another machine's) has credit state mirrored here
            "PORT_SLOTS": max([1] + [max(p.ifindex, p.peer_ifindex) for ps in topo.ports.values() for p in ps]) + 1,
            "N_SWITCHES": max(1, len(topo.switch_ids)),
            "ACCT_SLOTS": max([1] + [len(topo.ports[sw]) for sw in topo.switches]),
            "WCMP_SLOTS": switch_spec.wcmp.slots,
            "INT_MAX_HOPS": INT_MAX_HOPS,
            "SWQ_MAX": max([1] + [len(topo.ports[sw]) for sw in topo.switches]) * len(self.priorities()),
            "FIB_SIZE": len(topo.fib) + extra + 16,
            "FLOW_SIZE": min(65536, max(4096, _pow2(2 * hosts * hosts))),
        }

    # ---------------------------------------------------------------- loading

    def load(self) -> "Datapath":
        """Compile ebpf/switch.c with BCC, load the ingress program and fill every map from the topology."""
        if self._bpf is not None:
            return self
        kheaders.ensure()
        BPF = import_bcc()
        text = source.render(source.EBPF_DIR / "switch.c", self.plugin)
        # INT off: the INT stage is not compiled at all (nothing can tail-call it; a fifth less compile time)
        cflags = [f"-D{k}={v}" for k, v in self.sizes.items()] + [f"-DFTB_INT_STAGE={int(self.int_on)}"]
        if self.plugin is not None:
            # a call to an undeclared function would compile (C89) and fail in the verifier without a line
            cflags += ["-DFTB_PLUGIN=1", f"-DPLUGIN_PARAMS={max(1, len(self.plugin.values))}",
                       "-Werror=implicit-function-declaration"]
        t0 = time.perf_counter()
        with quiet_stderr() as err:
            try:
                bpf = BPF(text=text.encode(), cflags=cflags)
                fn = bpf.load_func(PROGRAM.encode(), BPF.SCHED_CLS)
                self._nic = bpf.load_func(NIC_RELEASE.encode(), BPF.XDP)
                self._host_fn = bpf.load_func(HOST_PROGRAM.encode(), BPF.SCHED_CLS)
                self._ctl = bpf.load_func(CONTROL_PROGRAM.encode(), BPF.SCHED_CLS)
                # the INT stage only where INT is on, the adaptive stage only once a switch's mode needs it
                # (set_mode): nothing tail-calls them otherwise, and verifying them (0.4 and 0.5 s) is time
                # every lab would pay
                self._stages = [bpf.load_func(name.encode(), BPF.SCHED_CLS) if self._stage_needed(name) else None
                                for name in STAGES]
            except Exception as e:   # BCC raises bare Exception with the details on stderr
                log = err.text()
                self.build_log = log
                if self.plugin is not None:
                    raise DatapathError(_plugin_error(log, self.plugin) or
                                        f"switch.plugin.source {self.plugin.source}: {e}") from None
                first = _first_error(log) or str(e)
                raise DatapathError(f"eBPF switch program failed to build/load: {first}") from None
            self.build_log = err.text()
        self.compile_seconds = time.perf_counter() - t0
        self._bpf, self._fn = bpf, fn
        try:
            stages = bpf[b"stages"]
            for i, fn in enumerate(self._stages):
                if fn is not None:
                    stages[ct.c_int(i)] = ct.c_int(fn.fd)
            self._fill_ports()
            if not self.sm:                    # SM routing: the subnet manager programs the FIB
                self._fill_fib()
            self.set_mode(self.switch_spec)
            self._fill_plugin()
            self._fill_qos()
            self._fill_int()
        except Exception:
            self.close()
            raise
        return self

    def _fill_plugin(self) -> None:
        if self.plugin is None:
            return
        t = self._bpf[b"plugin_params"]
        for i, v in enumerate(self.plugin.values):
            t[t.Key(i)] = t.Leaf(v)

    def _stage_needed(self, name: str, switch_spec=None) -> bool:
        """Whether a tail-call stage can be reached: INT only with INT on, adaptive only where a switch's mode
        (adaptive routing or DLB) calls it."""
        if name == INT_STAGE:
            return self.int_on
        if name == ADAPTIVE_STAGE:
            return (switch_spec or self.switch_spec).load_balancing in ADAPTIVE_MODES
        return True

    def _ensure_stage(self, name: str) -> None:
        """Load a stage left out at load time, before anything can tail-call it."""
        i = STAGES.index(name)
        if self._stages[i] is None:
            with quiet_stderr() as err:
                try:
                    self._stages[i] = self._bpf.load_func(name.encode(), import_bcc().SCHED_CLS)
                except Exception as e:   # BCC raises bare Exception with the details on stderr
                    raise DatapathError(f"eBPF stage {name} failed to load: {_first_error(err.text()) or e}") \
                        from None
            self._bpf[b"stages"][ct.c_int(i)] = ct.c_int(self._stages[i].fd)

    @property
    def ingress_fd(self) -> int:
        self._need()
        return self._fn.fd

    @property
    def ingress_name(self) -> str:
        return PROGRAM

    @property
    def nic_release_fd(self) -> int:
        """XDP program for the leaf side of host links (the host NIC's transmit completion)."""
        self._need()
        return self._nic.fd

    @property
    def host_ingress_fd(self) -> int:
        """The program for host NICs that obey PFC (hosts.pfc): hands pause frames to the agent."""
        self._need()
        return self._host_fn.fd

    @property
    def bpf(self):
        self._need()
        return self._bpf

    # ---------------------------------------------------------------- congestion & flow control

    def qos_for(self, switch: str):
        return self.switch_spec.qos(self.topo.nodes[switch].kind)

    def priorities(self) -> list[int]:
        """Priorities any switch uses (the queues worth reading)."""
        return sorted({p for t in self.topo.tiers for p in self.switch_spec.qos(t).priorities()})

    def _fill_qos(self):
        cfg_t, pq_t = self._bpf[b"qos_config"], self._bpf[b"port_qos"]
        trim_prio = self.switch_spec.trim_priority(self.topo.tiers)
        for sw in self.topo.switches:
            q = self.qos_for(sw)
            v = cfg_t.Leaf()
            tc = q.traffic_classes
            for d in range(64):          # with INT, DSCP bit 0 marks a stack: d | 1 is classified as d
                v.dscp_prio[d] = tc.dscp.get(d & ~1 if self.int_on else d, tc.default)
            v.pfc = 1 if (q.pfc.enabled and tc.lossless) else 0
            v.credit = 1 if (q.credit.enabled and tc.lossless) else 0
            v.lossless = sum(1 << p for p in q.lossless)       # without PFC or credits nothing is lossless
            v.xoff = q.pfc.xoff
            if trim_prio is not None:    # trimming (lib/trim.h): flagged headers go to its priority everywhere
                v.trim_classify, v.trim_prio = 1, trim_prio
                v.trim_on = 1 if q.trim.enabled else 0
                v.trim_threshold = (q.trim.threshold or 0) if q.trim.enabled else 0
            for prio, e in q.ecn.items():
                v.ecn_on |= 1 << prio
                v.kmin[prio], v.kmax[prio] = e.kmin, e.kmax
                v.pmax[prio] = min(int(round(e.pmax * 2**32)), 2**32)
            pool = self.ports[self.topo.ports[sw][0].ifindex].shared_pool
            if pool:                     # one buffer for the switch: dynamic thresholds over its queues
                v.shared_pool, v.alpha, v.headroom = pool, int(round(q.shared_buffer.alpha * 1024)), q.headroom
                keys = self.shared_queues(sw)
                sq = self._bpf[b"sw_queues"].Leaf()
                sq.n = len(keys)
                for i, k in enumerate(keys):
                    sq.key[i], sq.ps_per_byte[i] = k, self.ports[k // N_PRIO].ps_per_byte
                self._bpf[b"sw_queues"][self._bpf[b"sw_queues"].Key(self.topo.switch_ids[sw])] = sq
            cfg_t[cfg_t.Key(self.topo.switch_ids[sw])] = v
            for local, p in enumerate(self.topo.ports[sw]):
                c = self.ports[p.ifindex]
                w = pq_t.Leaf()
                w.local = local
                w.ps_per_byte = c.ps_per_byte
                w.buffer = c.buffer_bytes
                w.classes = 1 if c.classes else 0
                w.lossless_limit = c.lossless_limit
                w.ingress_limit = c.ingress_buffer
                pq_t[pq_t.Key(p.ifindex)] = w

    def port_buffer(self, port) -> int:
        """Bytes one queue of a switch port may hold (switch.buffer or its tier's, else the link's buffer)."""
        return self.ports[port.ifindex].buffer_bytes

    def queue_counters(self, ports=None, reset_max: bool = True) -> dict[tuple[int, int], QueueCounters]:
        """(ifindex, priority) → counters, for switch ports (or ``ports``) and the priorities in use."""
        self._need()
        t, mt = self._bpf[b"queue_stats"], self._bpf[b"queue_max"]
        prios = self.priorities()
        out = {}
        for ifx in (ports if ports is not None else self._all_ports):
            for prio in prios:
                k = ifx * N_PRIO + prio
                c = QueueCounters()
                for cpu in t.getvalue(t.Key(k)):
                    c.packets += cpu.packets
                    c.bytes += cpu.bytes
                    c.depth_sum += cpu.depth_sum
                    c.ecn_marks += cpu.ecn_marks
                    c.ect_packets += cpu.ect_packets
                    c.drops += cpu.drops
                    c.pause_rx += cpu.pause_rx
                    c.xoff_events += cpu.xoff_events
                    c.overflows += cpu.overflows
                    c.trims += cpu.trims
                c.depth_max = int(max(mt.getvalue(mt.Key(k))))
                out[(ifx, prio)] = c
        if reset_max:
            mt.clear()
        return out

    def pfc_counters(self, ports=None) -> dict[tuple[int, int], tuple[int, int]]:
        """(ifindex, priority) → (PFC frames sent out of the port, ns its egress was paused, including an
        ongoing pause), from the agent's map."""
        self._need()
        st, pa = self._bpf[b"pfc_stats"], self._bpf[b"egress_paused"]
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        out = {}
        for ifx in (ports if ports is not None else self._all_ports):
            for prio in self.priorities():
                k = ifx * N_PRIO + prio
                v = st[st.Key(k)]
                since = pa[pa.Key(k)].value
                out[(ifx, prio)] = (int(v.pause_tx), int(v.paused_ns) + (now - since if 0 < since < now else 0))
        return out

    def credit_counters(self, ports=None) -> dict[tuple[int, int], tuple[int, int, int]]:
        """(receiving ifindex, priority) → (times its sender ran out of credit, ns it was stalled, including an
        ongoing stall, credit bytes granted), from the credit meter's map (testbed/qos/credits.py)."""
        self._need()
        st = self._bpf[b"credit_stats"]
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        out = {}
        for ifx in (ports if ports is not None else self._all_ports):
            for prio in self.priorities():
                v = st[st.Key(ifx * N_PRIO + prio)]
                since = int(v.since)
                out[(ifx, prio)] = (int(v.stalls), int(v.stall_ns) + (now - since if 0 < since < now else 0),
                                    int(v.granted))
        return out

    def ingress_queued(self, ifindex: int, prio: int) -> int:
        """PFC ingress accounting: bytes that arrived on (ifindex, prio) and still sit in the switch's egress
        queues (what Xoff/Xon compare against)."""
        self._need()
        return ingress_queued(self._bpf, self.sizes["ACCT_SLOTS"], ifindex, prio)

    def queue_depth(self, ifindex: int, prio: int | None = None) -> int:
        """The model's depth of a port's queue (one priority, or all) now, in bytes."""
        self._need()
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return sum(queue_state(self._bpf, ifindex, p, now)[0]
                   for p in ([prio] if prio is not None else self.priorities()))

    def shared_queues(self, switch: str) -> list[int]:
        """vq indexes of every queue of a switch (its ports × the priorities in use): what its shared buffer
        holds."""
        return [p.ifindex * N_PRIO + prio for p in self.topo.ports[switch] for prio in self.priorities()]

    def shared_peaks(self, reset: bool = True) -> dict[str, int]:
        """Switch → highest shared-buffer occupancy the switch program computed since the last reading (bytes),
        for switches with a shared buffer."""
        self._need()
        t = self._bpf[b"shared_peak"]
        out = {sw: int(max(t.getvalue(t.Key(self.topo.switch_ids[sw]))))
               for sw in self.topo.switches if self.ports[self.topo.ports[sw][0].ifindex].shared_pool}
        if reset:
            t.clear()
        return out

    @property
    def control_fd(self) -> int:
        """The control program (ftb_ctl): see ``control``. Also usable from a forked child (the PFC agent)."""
        self._need()
        return self._ctl.fd

    def control(self, op: int, key: int, a: int = 0, b: int = 0, c: int = 0) -> int:
        """Change the queue model atomically with the switch program's updates (queue_model.control)."""
        self._need()
        return queue_model.control(self._ctl.fd, op, key, a, b, c)

    def sync_queue_models(self, ifindexes, read_backlogs, resync: bool = True,
                          classes: bool = False) -> tuple[dict, dict[int, int]]:
        """Read the real backlogs (``read_backlogs(leaves)``: a root-qdisc dump, ifindex → (bytes, packets, drops,
        qlen, backlog), filling ``leaves`` with the backlog of each priority's qdisc) between two reads of the
        models of ``ifindexes``; return the dump and each port's model depth at that instant, and reset a model
        that is more than a frame off to the real backlog: the single queue of a port without traffic classes,
        and — with ``classes`` (a lab without a PFC agent, which would do it) — each running priority's queue.

        Why: the model drains at the nominal rate, but the real shaper can fall a few ms behind (a late timer or
        softirq, even on a quiet machine). On a queue that never empties that lag never comes back: the real
        queue stayed 10–20 KB (10–30 %) above the model for the rest of the run, so the switch's tail drop and
        ECN acted on the wrong depth. With PFC, the agent resynchronises the classes at each pause and resume and
        in its sweep."""
        self._need()
        vq, pq, pa = self._bpf[b"vq"], self._bpf[b"port_qos"], self._bpf[b"egress_paused"]
        single = not self.switch_spec.classes_on
        prios = [0] if single else (self.priorities() if classes else [])
        keys = {(i, prio): vq.Key(i * N_PRIO + prio) for i in ifindexes for prio in prios}
        before = {q: vq[k].finish for q, k in keys.items()}
        leaves: dict = {}
        dump = read_backlogs(leaves)
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        depths = {i: self.queue_depth(i) for i in ifindexes if i in dump and not single}
        for (i, prio), k in keys.items():
            c = self.ports.get(i)
            if i not in dump or c is None:
                continue
            backlog = dump[i][4] if single else leaves.get((i, c.class_id(prio)))
            if backlog is None or pa[pa.Key(i * N_PRIO + prio)].value:     # no such class, or paused
                continue
            ps = pq[pq.Key(i)].ps_per_byte
            if not ps:
                continue
            depth, fix = drift_resync(now, backlog, ps, vq[k].finish, self.topo.spec.mtu)
            if single:
                depths[i] = depth
            if fix and resync:
                self.control(queue_model.CTL_VQ_RESYNC, i * N_PRIO + prio, now, backlog * ps // 1000,
                             before[(i, prio)])
                self.resyncs += 1
        return dump, depths

    def _need(self):
        if self._bpf is None:
            raise DatapathError("datapath not loaded: call load() first")

    def _fill_ports(self):
        t = self._bpf[b"ports"]
        for sw in self.topo.switches:
            sid = self.topo.switch_ids[sw]
            for p in self.topo.ports[sw]:
                v = t.Leaf()
                v.switch_id, v.flags = sid, PORT_VALID | (PORT_EDGE if p.role == "down" else 0)
                ct.memmove(v.mac, _mac(p.mac), 6)
                ct.memmove(v.peer_mac, _mac(p.peer_mac), 6)
                t[t.Key(p.ifindex)] = v

    def _fill_fib(self):
        t = self._bpf[b"fib"]
        for e in self.topo.fib:
            v = t.Leaf()
            fill_group(v, self.topo, e.ports, self.max_nh)
            t[self._fib_key(t, e.switch, e.prefix, e.plen)] = v

    def port_rates(self) -> dict[int, int]:
        """ifindex → the rate (bit/s) the queue model drains each switch port at now: the link rate, or what a
        failure's rate change set (``port_qos.ps_per_byte``; the topology keeps the original rates)."""
        self._need()
        t = self._bpf[b"port_qos"]
        out = {}
        for ifx in self._switch_ports:
            ps = t[t.Key(ifx)].ps_per_byte
            out[ifx] = 8 * 10**12 // ps if ps else self.topo.port(ifx).rate_bps
        return out

    def set_group_weights(self, switch: str, prefix: str, plen: int, weights: dict[int, int]) -> tuple[int, ...]:
        """Give the FIB entry (switch, prefix/plen) a new WCMP table from integer ``weights`` (egress ifindex →
        weight). Its ports stay as they are — a re-route's change of members is kept; a member without a weight
        gets 1. One map update: a packet sees the old table or the new one. Returns the ports."""
        self._need()
        t = self._bpf[b"fib"]
        k = self._fib_key(t, switch, prefix, plen)
        v = t[k]
        ports = tuple(v.ports[i] for i in range(min(v.n, self.max_nh)))
        fill_group(v, self.topo, ports, self.max_nh, [weights.get(p, 1) for p in ports])
        t[k] = v
        return ports

    def _fib_key(self, t, switch: str, prefix: str, plen: int):
        k = t.Key()
        k.prefixlen, k.switch_id, k.addr = 32 + plen, self.topo.switch_ids[switch], _net_u32(prefix)
        return k

    def set_mode(self, switch_spec, switches=None) -> None:
        """Apply a SwitchSpec (load balancing, flowlet timeout, spray kind, hash seed) live, to every switch or
        to the named ones. Existing flowlet state stays; call clear_flows() for a clean slate."""
        self._need()
        if switch_spec.load_balancing == "plugin" and self.plugin is None:
            raise DatapathError("load_balancing plugin: this switch program was built without one "
                                "(Datapath(plugin=...))")
        if self._stage_needed(ADAPTIVE_STAGE, switch_spec):
            self._ensure_stage(ADAPTIVE_STAGE)
        if switches is None:
            self.switch_spec = switch_spec
        t = self._bpf[b"sw_config"]
        for sw in (switches if switches is not None else self.topo.switches):
            sid = self.topo.switch_ids[sw]
            v = t.Leaf()
            v.mode = MODES[switch_spec.load_balancing]
            v.spray = SPRAY_KINDS[switch_spec.spray]
            v.seed = hashing.switch_seed(switch_spec.hash_seed, sid)
            v.flowlet_timeout_ns = int(switch_spec.flowlet_timeout)
            ar = switch_spec.adaptive
            v.ar_metric = AR_METRICS[ar.metric]
            v.ar_granularity = AR_GRANULARITY[ar.granularity]
            v.load_window_ns = int(ar.load_window)
            v.track = 1 if self.track_flows or getattr(switch_spec, "routing", "distributed") == "sm" else 0
            v.wcmp_granularity = WCMP_GRANULARITY[switch_spec.wcmp.granularity]
            v.hash_fields = hashing.hash_mask(switch_spec.hash_fields)
            if switch_spec.load_balancing == "adaptive" and ar.flowlet_timeout is not None:
                v.flowlet_timeout_ns = int(ar.flowlet_timeout)
            dlb = switch_spec.dlb
            v.dlb_bands, v.dlb_load_weight, v.dlb_queue_weight = dlb.bands, dlb.load_weight, dlb.queue_weight
            if switch_spec.load_balancing == "dlb":
                # DLB is the adaptive stage choosing per flowlet (the inactivity gap) with the band as its cost
                v.ar_granularity = AR_GRANULARITY["flowlet"]
                v.flowlet_timeout_ns = int(dlb.inactivity)
                v.load_window_ns = int(dlb.load_window)
            t[t.Key(sid)] = v

    # ---------------------------------------------------------------- in-band telemetry

    @property
    def int_on(self) -> bool:
        """The INT stage runs: leaf stacks (telemetry.int) or host stacks (hpcc)."""
        return self.int_spec is not None or self.host_stacks

    def _fill_int(self) -> None:
        if not self.int_on:
            return
        i = self.int_spec
        t = self._bpf[b"int_config"]
        v = t.Leaf()
        if i is not None:
            v.enabled, v.sample, v.max_hops = 1, i.sample, i.max_hops
        v.host_stacks = 1 if self.host_stacks else 0
        v.mtu = max([self.topo.spec.mtu] + [c.mtu for c in self.ports.values() if c.port.role not in HOST_LINK_ROLES])
        t[t.Key(0)] = v

    def int_counters(self) -> dict[str, int]:
        """What INT did so far (INT_STATS names: packets instrumented at their source, refused for want of room,
        records pushed in transit, hops past max_hops, reports exported and lost for a full ring buffer, packets
        the program could not instrument)."""
        self._need()
        t = self._bpf[b"int_stats"]
        return {name: int(sum(t.getvalue(t.Key(i)))) for i, name in enumerate(INT_STATS)}

    def open_int_reports(self, callback) -> None:
        """Deliver every sink's report (struct int_report bytes) to ``callback(data: bytes)`` from poll_int (a later
        call replaces the consumer: BCC opens a ring buffer once per program)."""
        self._need()
        first = self._int_consumer is None
        self._int_consumer = callback
        if first:
            def cb(_ctx, data, size):
                self._int_consumer(ct.string_at(data, size))
            self._int_cb = cb                  # BCC keeps only a weak hold on the callback
            self._bpf[b"int_reports"].open_ring_buffer(cb)

    def poll_int(self, timeout_ms: int) -> None:
        self._bpf.ring_buffer_poll(timeout_ms)

    def switch_seed(self, switch: str) -> int:
        """The ECMP seed a switch uses (for hashing.ecmp_index)."""
        return hashing.switch_seed(self.switch_spec.hash_seed, self.topo.switch_ids[switch])

    # ---------------------------------------------------------------- reading

    def port_counters(self) -> dict[int, PortCounters]:
        """Counters of every switch port, by ifindex."""
        self._need()
        t = self._bpf[b"port_stats"]
        out = {}
        clock = time.time
        for ifx in self._switch_ports:
            t0 = clock()
            values = t.getvalue(t.Key(ifx))
            c = PortCounters(read_at=(t0 + clock()) / 2)
            for cpu in values:
                c.rx_packets += cpu.rx_packets
                c.rx_bytes += cpu.rx_bytes
                c.tx_packets += cpu.tx_packets
                c.tx_bytes += cpu.tx_bytes
                for i, name in enumerate(DROP_REASONS):
                    if cpu.drops[i]:
                        c.discard_reasons[name] = c.discard_reasons.get(name, 0) + cpu.drops[i]
            c.discards = sum(c.discard_reasons.values())
            out[ifx] = c
        return out

    def drop_counters(self) -> dict[str, int]:
        """Drops by reason over the whole fabric (including packets on ports the maps do not know)."""
        self._need()
        t = self._bpf[b"drop_reason_counts"]
        return {name: int(sum(t.getvalue(t.Key(i)))) for i, name in enumerate(DROP_REASONS)}

    def next_hops(self, switch: str, daddr: str) -> tuple[int, ...]:
        """The next-hop group (egress ifindexes) the FIB gives ``switch`` for ``daddr`` now: the live map (the
        subnet manager or a reroute may have changed it), or the topology's FIB before the program is loaded."""
        if self._bpf is not None:
            t = self._bpf[b"fib"]
            k = t.Key()
            k.prefixlen, k.switch_id, k.addr = 64, self.topo.switch_ids[switch], _net_u32(daddr)
            try:
                v = t[k]
            except KeyError:
                return ()
            return tuple(int(v.ports[i]) for i in range(min(v.n, self.max_nh)))
        a = int(ipaddress.IPv4Address(daddr))
        for net, plen, ports in self._fib_by_switch.get(switch, ()):
            mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
            if (a & mask) == net:
                return ports
        return ()

    def set_port_down(self, ifindex: int, down: bool) -> None:
        """Mark a switch port as having lost (or regained) its link; every egress choice skips a down port.
        The link-state watcher (routing/manager.py) keeps this map in a running lab; tests set it directly."""
        self._need()
        t = self._bpf[b"port_down"]
        t[t.Key(ifindex)] = t.Leaf(1 if down else 0)

    def ports_down(self) -> set[int]:
        """Switch ports the datapath currently treats as down."""
        self._need()
        t = self._bpf[b"port_down"]
        return {i for i in self._switch_ports if t[t.Key(i)].value}

    def track_all_flows(self) -> None:
        """Keep per-flow counters at every switch a flow crosses, on single-port routes too (as SM routing does),
        for live per-flow metrics: one flow-table lookup more per packet where a route has one port."""
        self.track_flows = True
        self.set_mode(self.switch_spec)

    def flow_paths(self) -> list[FlowPath]:
        """Per-flow packet counts per next hop at switches where the flow had a choice (n > 1), or at every
        switch it crossed with SM routing or ``track_all_flows``."""
        self._need()
        out = []
        for k, v in self._bpf[b"flows"].items():
            sw = self._names.get(k.switch_id, f"switch{k.switch_id}")
            daddr = _net_str(k.daddr)
            group = self.next_hops(sw, daddr)
            packets = {}
            for slot in range(min(len(group), self.max_nh)):
                if v.pkts[slot]:
                    packets[group[slot]] = int(v.pkts[slot])
            out.append(FlowPath(sw, _net_str(k.saddr), daddr, k.sport, k.dport, k.proto, packets,
                                int(v.flowlets), int(v.bytes)))
        out.sort(key=lambda f: (f.switch, f.saddr, f.daddr, f.sport, f.dport, f.proto))
        return out

    def clear_flows(self) -> None:
        """Forget flowlet state and per-flow path counts."""
        self._need()
        self._bpf[b"flows"].clear()

    def reset_counters(self) -> None:
        """Zero port and drop counters (e.g. between phases of a run)."""
        self._need()
        for name in ("port_stats", "drop_reason_counts", "queue_stats", "queue_max", "pfc_stats"):
            self._bpf[name.encode()].clear()      # arrays: clear() zeroes every element

    def close(self) -> None:
        """Release the program and maps (attached tc filters keep their own reference to the program)."""
        if self._bpf is not None:
            self._bpf.cleanup()
        self._bpf = self._fn = self._host_fn = self._ctl = None

    def __enter__(self):
        return self.load()

    def __exit__(self, *exc):
        self.close()
