"""The back end of a fabric on this machine: one ``Lab`` (its datapath and helpers), this process's link
sampler, CPU guard, captures, INT collector and WCMP controller, and the lab's CPU accounting."""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import Callable

from .. import telemetry
from ..errors import HelperFailed
from ..fabric import netns
from ..fabric.capture import Captures
from ..inband.collector import IntCollector
from ..lab import Lab, reap_stale
from ..scenario import Scenario
from .backend import Backend, Collected

STEAL_NOTE = 0.02      # a run whose mean steal share reaches this is worth a degradation line


class LocalBackend(Backend):
    """Every namespace on this machine; everything the lab forks is accounted to it (a cpuacct cgroup)."""

    def __init__(self, scen: Scenario, source: str = "", metrics: str | None = None):
        """``metrics``: HOST:PORT to serve live Prometheus metrics on while the lab lives."""
        if scen.traffic.engine == "rxe":
            from ..workloads import rxe
            rxe.require()                     # one clear line where the kernel has no rdma_rxe, before building
        if scen.traffic.engine == "iperf3":
            from ..workloads import iperf3
            iperf3.require()                  # iperf3 missing: named in one line, before building
        if scen.traffic.engine == "mpi":
            from ..workloads import mpi
            mpi.require(scen.traffic.mpi.transport)    # Open MPI, mpi4py: named in one line, before building
        self.scen, self.source, self.metrics = scen, source, metrics
        self.name = "r" + secrets.token_hex(3)   # short: "ftb-<lab>-pfc" must fit a 15-character process name
        self.lab: Lab | None = None
        self.acct = None
        self.sampler = self.collector = self.controller = self.captures = None
        self.fabric_controller = self.collective = None
        self.warnings: list[str] = []
        self.pcaps: list[str] = []

    def up(self, log: Callable[[str], None]) -> None:
        from ..workloads.flows import rto_warning
        reap_stale()
        scen = self.scen
        self.acct = telemetry.LabCpuAccount(self.name).__enter__()
        try:
            self.lab = lab = Lab(scen, self.name, source=self.source, metrics=self.metrics, log=log)
            lab.__enter__()
        except BaseException:
            self.lab = None
            self.acct.__exit__(None, None, None)
            raise
        self.topo, self.warnings = lab.topo, lab.warnings
        topo = lab.topo
        log(f"fabric up: {len(topo.hosts)} {'container ' if lab.containers is not None else ''}hosts, "
            f"{len(topo.switches)} switches, {len(topo.links)} links "
            f"({sum(lab.fabric.timings.values()):.2f} s); datapath {scen.switch.load_balancing}"
            + (f", SM routing ({scen.switch.sm.engine}, sweep every {scen.switch.sm.sweep_interval / 1e6:g} ms)"
               if scen.switch.routing == "sm" else "")
            + (f", {len(scen.failures)} failure event(s)" if scen.failures else ""))
        for w in lab.warnings + [w for w in [rto_warning(scen.traffic, topo)] if w]:
            log(f"warning: {w}")
        for note in lab.containers.notes if lab.containers is not None else ():
            log(note)
        if self.metrics is not None:
            log(f"metrics: http://{self.metrics}/metrics")
        if scen.traffic.engine == "tcp" and scen.traffic.ecn != "none":
            for h in topo.hosts:
                netns.write_sysctl(lab.fabric.ns[h], "net.ipv4.tcp_ecn", 1)

    def ns_of(self, node: str) -> str:
        return self.lab.fabric.ns[node]

    def capture(self, outdir: Path) -> None:
        self.captures = Captures(self.lab.fabric, list(self.scen.capture), outdir, mac_control=self.lab.pfc_on)
        self.captures.start()

    def start(self, origin: float, outdir: Path, log: Callable[[str], None]) -> None:
        lab, scen = self.lab, self.scen
        if scen.controller.entropy != "off":
            # forked while this process runs no thread of its own yet; it plans the run's flows (the same plan
            # the traffic makes: workloads.plan is deterministic) before it says it is ready
            from ..controller.service import FabricController
            from ..workloads import plan, replay
            flows = replay.schedule_flows(scen.traffic, lab.topo, scen.seed) if scen.traffic.scheduled else \
                plan(scen.traffic, lab.topo, scen.seed, scen.duration / 1e9)
            self.fabric_controller = FabricController(lab.topo, scen, lab.name, flows, origin, lab.datapath)
            self.fabric_controller.on_fork = lab.recorder("fabric-controller")
            self.fabric_controller.start()
        if scen.traffic.collective.adapt is not None:
            # the collectives that read the network: forked before any thread too (collective/decider.py)
            from ..collective.decider import CollectiveHelper
            self.collective = CollectiveHelper(lab.topo, scen, lab.name, origin, lab.datapath)
            self.collective.on_fork = lab.recorder("collective-helper")
            self.collective.start()
        if scen.switch.load_balancing == "wcmp" and scen.switch.wcmp.source != "static":
            # forked first, while this process runs no thread of its own yet (the sampler, the INT reader)
            from ..lb.wcmp_controller import WcmpController
            self.controller = WcmpController(lab.topo, lab.datapath, lab.fabric, scen, origin)
            self.controller.on_fork = lab.recorder("wcmp-controller")
            self.controller.start()
        self.sampler = telemetry.LinkSampler(lab.topo, lab.datapath, scen.telemetry.interval / 1e9, lab.fabric,
                                             origin=origin, cpu=telemetry.CpuGuard(self.acct, origin),
                                             resync_classes=not lab.pfc_on)
        self.sampler.start()
        if lab.datapath.int_spec is not None:        # telemetry.int: the sinks' reports, read as they come
            self.collector = IntCollector(lab.datapath, origin)
            for helper in (self.controller, self.collective):
                pipe = getattr(helper, "reports", None)
                if pipe is not None and pipe.w is not None:
                    self.collector.forward_to(pipe.w)
            self.collector.start()

    def check(self) -> None:
        for helper in (self.sampler, self.collector, self.controller, self.fabric_controller, self.collective):
            if helper is not None:
                helper.check()
        self.lab.check()

    def traffic_kw(self) -> dict:
        ctrs, fc = self.lab.containers, self.fabric_controller
        return {"containers": ctrs.containers if ctrs is not None else None,
                "controller": ({"path": str(fc.path), "timeout_s": self.scen.controller.timeout / 1e9,
                                "adaptive": self.scen.controller.entropy == "adaptive"}
                               if fc is not None else None),
                "adapt": ({"path": str(self.collective.path),
                           "timeout_s": self.scen.traffic.collective.adapt.timeout / 1e9}
                          if self.collective is not None else None)}

    def failures_go(self, t0: float) -> None:
        self.lab.failures_go(t0)

    def rxe_flows(self, flows, duration_s: float, info: dict, outdir: Path) -> list:
        from ..workloads import rxe
        tr = self.scen.traffic
        return rxe.run_flows(self.lab, flows, duration_s, tr.rxe.test, tr.rxe.msg_bytes,
                             log_dir=outdir / "perftest", info=info)

    def iperf3_flows(self, flows, origin: float, duration_s: float, log_dir: Path,
                     check: Callable[[], None]) -> tuple[list, str | None]:
        from ..workloads import iperf3
        tr = self.scen.traffic
        return iperf3.run_flows(flows, tr.iperf3.protocol, self.scen.packet_size, duration_s, self.ns_of, origin,
                                log_dir, check)

    def mpi_run(self, origin: float, deadline_s: float, log_dir: Path, check: Callable[[], None]) -> tuple[list, dict]:
        from ..workloads import mpi
        return mpi.run(self.scen.traffic.mpi, self.lab.topo, self.lab.name, self.ns_of, origin, deadline_s, log_dir,
                       check)

    def stop(self) -> None:
        # the INT reader before the controller it forwards reports to (the pipe is closed with the controller)
        for h in (self.sampler, self.collector):
            if h is not None:
                h.stop()
        if self.controller is not None:
            try:
                self.controller.stop()
            except HelperFailed:                     # kept in its error: down() reports it, once
                pass
        for helper in (self.fabric_controller, self.collective):
            if helper is not None:
                try:
                    helper.stop()
                except HelperFailed:                 # kept in its error: down() reports it, once
                    pass
        if self.captures is not None:
            self.pcaps, self.captures = self.captures.stop(), None

    def collect(self, flows) -> Collected:
        lab, s = self.lab, self.sampler
        dp = lab.datapath
        got = Collected(rows=s.rows, model_error=s.model_error(), health=s.health(), flow_paths=dp.flow_paths(),
                        drops=dp.drop_counters(), resyncs=dp.resyncs, timings=dict(lab.fabric.timings),
                        pcaps=self.pcaps)
        if self.collector is not None:
            got.int_rows = self.collector.rows(lab.topo, flows)
        if dp.int_on:                                # telemetry.int or hpcc's host stacks
            got.int_stats = dp.int_counters()
        if self.controller is not None:
            got.weights, got.wcmp_controller = self.controller.rows, self.controller.health()
        got.docker = lab.containers.manifest() if lab.containers is not None else None
        if self.fabric_controller is not None:
            got.controller = self.fabric_controller.results or None
        if self.collective is not None:
            got.collective = self.collective.results or None
        return got

    def down(self, got: Collected | None) -> list[str]:
        lab, self.lab = self.lab, None
        acct, self.acct = self.acct, None
        for helper in (self.controller, self.fabric_controller, self.collective):
            if helper is not None and helper.pid is not None:      # the run stopped before stop()
                try:
                    helper.stop()
                except HelperFailed:
                    pass
        try:
            if lab is not None:
                lab.close(force=True)
        finally:
            if acct is not None:
                acct.__exit__(None, None, None)
        if lab is None:
            return []
        if got is not None:
            s = self.sampler
            got.cpu = s.cpu.result()
            got.degradations = self._degradations(s, acct)
            if self.collector is not None and self.collector.forward_lost:
                got.degradations.append(f"WCMP controller: {self.collector.forward_lost} INT report(s) not handed "
                                        f"to it (its pipe was full): those intervals had fewer signals")
            got.helpers = {k: lab.results.get(k, {}) for k in ("pfc", "routing", "scheduler")}
            got.metrics = lab.results.get("exporter") or None
            got.errors = [e for e in (s.error, self.collector and self.collector.error,
                                      self.controller and self.controller.error,
                                      self.fabric_controller and self.fabric_controller.error,
                                      self.collective and self.collective.error) if e]
        return list(lab.failures)

    @staticmethod
    def _degradations(sampler, acct) -> list[str]:
        """The sampler's and the CPU accounting's: late samples, no per-core accounting, the hypervisor's steal."""
        out = list(sampler.degradations)
        if sampler.late_samples:
            out.append(f"telemetry: {sampler.late_samples} sample(s) taken late (the sampler fell behind; their "
                       f"intervals are longer)")
        if acct is not None and acct.why:         # no per-core accounting, or its cgroup was left behind
            out.append(f"cpu guard: {acct.why}")
        steal = [f for _, f in sampler.cpu.steal]
        if steal and sum(steal) / len(steal) >= STEAL_NOTE:
            out.append(f"cpu guard: the hypervisor took {sum(steal) / len(steal):.0%} of the machine's CPU time "
                       f"(steal; {max(steal):.0%} in the worst sample): the emulated links lost that time too")
        return out
