"""The switch program compiled with BCC and loaded, composed of the families' map parts (forwarding, QoS,
INT, counters): ``Datapath(topo, switch_spec, ports).load()``; the package docstring lists the maps."""
from __future__ import annotations

import ctypes as ct
import ipaddress
import re
import time
from pathlib import Path

from . import kheaders, source
from ..fabric.port import PortConfig, port_configs
from .int_wire import INT_MAX_HOPS
from .bccutil import import_bcc, quiet_stderr
from .source import LbPlugin
from ..errors import DatapathError
from .names import (ADAPTIVE_MODES, ADAPTIVE_STAGE, CONTROL_PROGRAM, HOST_PROGRAM, INT_STAGE, MIN_MAX_NH,
                    NIC_RELEASE, PROGRAM, STAGES, pow2)
from .forwarding import ForwardingMaps
from .qos_maps import QosMaps
from .int_maps import IntMaps
from .counter_maps import CounterMaps


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


class Datapath(ForwardingMaps, QosMaps, IntMaps, CounterMaps):
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
            "FLOW_SIZE": min(65536, max(4096, pow2(2 * hosts * hosts))),
        }

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

    def program_ids(self) -> list[int]:
        """The kernel's ids of every program loaded (objects.py: a lab's state file records them)."""
        from .objects import program_id
        self._need()
        return sorted(i for f in self._bpf.funcs.values() if (i := program_id(f.fd)) is not None)

    def _need(self):
        if self._bpf is None:
            raise DatapathError("datapath not loaded: call load() first")

    def close(self) -> None:
        """Release the program and maps (attached tc filters keep their own reference to the program)."""
        if self._bpf is not None:
            self._bpf.cleanup()
        self._bpf = self._fn = self._host_fn = self._ctl = None

    def __enter__(self):
        return self.load()

    def __exit__(self, *exc):
        self.close()
