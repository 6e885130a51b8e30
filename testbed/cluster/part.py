"""One machine's part of a fabric over several machines: the body of the Ray actor pinned to that machine.

It is a ``Lab`` restricted to the machine's nodes (Topology.restrict) whose cut ports are VXLAN devices
(fabric.Tunnel), with its own datapath load (its switches' port, FIB and QoS maps), its own PFC agent and link
sampler, and the traffic agents of its hosts — the same code a single-machine run uses. The driver
(cluster/run.py) calls it step by step; every step that fails raises with one line, and ``close`` always tears
the part down (it is idempotent, and the driver calls it on every path). The actor runs several calls at once
(``max_concurrency``): the driver can stop the agents or close the part while ``agents_collect`` waits.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import threading
from pathlib import Path

from ..fabric import Tunnel


def underlay_of(address: str) -> tuple[str | None, int, int | None]:
    """(interface, MTU, rate in bit/s or None) of the interface holding ``address`` in this namespace — the
    machine's underlay. The rate: the local cluster's ``--underlay-rate``, else the NIC's link speed."""
    from pyroute2 import IPRoute

    from . import local
    with IPRoute() as ipr:
        for a in ipr.get_addr(family=2):
            if a.get_attr("IFA_ADDRESS") == address:
                link = ipr.get_links(a["index"])[0]
                ifname, mtu = link.get_attr("IFLA_IFNAME"), link.get_attr("IFLA_MTU")
                break
        else:
            return None, 1500, None
    st = local.read_state()
    if st and address in local.names_by_address():
        return ifname, mtu, st["underlay_rate_bps"]
    try:
        speed = int(open(f"/sys/class/net/{ifname}/speed").read())
    except (OSError, ValueError):
        speed = -1
    return ifname, mtu, speed * 1_000_000 if speed > 0 else None


class Part:
    """The actor's state: one lab part, its sampler and its traffic agents."""

    def __init__(self):
        self.lab = None
        self.sampler = None
        self.collector = None                  # telemetry.int: this machine's sinks' reports
        self.captures = None                   # capture: this machine's tcpdumps, into a directory of its own
        self.agents = None
        self.relay = None                      # gated flows: this machine's gate directory and relay
        self.acct = None                       # the run's cpuacct group on this machine (shared by its parts)
        self._lock = threading.Lock()

    def probe(self) -> dict:
        """Who and where this actor is: its node's address, underlay MTU and rate, pid."""
        import ray
        address = ray.util.get_node_ip_address()
        ifname, mtu, rate = underlay_of(address)
        return {"address": address, "interface": ifname, "mtu": mtu, "rate_bps": rate, "pid": os.getpid(),
                "hostname": platform.node(), "root": os.geteuid() == 0}

    def build(self, scen, lab_name: str, nodes: list[str], tunnels: dict[int, tuple[int, str, str]],
              kind: str = "run", key: bytes | None = None) -> dict:
        """Build this machine's part: a lab of kind ``run`` owned by this actor's process, or ``up`` (``testbed
        up --cluster``: it stays until ``testbed down``, and ``testbed clean`` on the machine removes it).
        ``key``: the run's key, which seals what the part's helpers say to the other machines (auth.py)."""
        import ray

        from ..lab import Lab, reap_stale
        from ..telemetry import LabCpuAccount
        reap_stale()
        if kind == "run":        # before the lab forks its helpers: they join it; named after the run, so
            # that the parts on one machine are counted together, as one machine's lab would be
            self.acct = LabCpuAccount(run_of(lab_name), shared=True).__enter__()
        lab = Lab(scen, lab_name, kind=kind, keep=kind == "up", nodes=nodes,
                  tunnels={ifx: Tunnel(vni, lo, rem) for ifx, (vni, lo, rem) in tunnels.items()},
                  underlay=ray.util.get_node_ip_address(), key=key)
        with self._lock:
            self.lab = lab
        lab.__enter__()
        return {"timings": dict(lab.fabric.timings), "warnings": list(lab.warnings),
                "compile_s": lab.datapath.compile_seconds,
                "docker": lab.containers.manifest() if lab.containers is not None else None,
                "routing": lab.helpers["routing"].endpoints if "routing" in lab.helpers else None}

    def routing_peers(self, peers: list[dict], master: bool) -> None:
        """The other machines' routing agents: this one floods its link state to them from now on. Under SM
        routing the ``master`` machine's agent is the subnet manager: it returns once every switch is programmed."""
        self.lab.helpers["routing"].set_peers(peers, master)

    def metrics_start(self) -> tuple[str, int]:
        """This machine's live metrics exporter, on its underlay address (a free port): the driver's
        FabricFederation fetches it at every scrape."""
        import ray
        return self.lab.serve_metrics((ray.util.get_node_ip_address(), 0))

    def failures_go(self, t0: float) -> None:
        """Start this machine's failure scheduler on the traffic's t0 (every machine's on the same)."""
        self.lab.failures_go(t0)

    def start(self, origin: float) -> None:
        """Start sampling the part's switches on the run's clock (time zero ``origin``, chosen by the driver), and
        reading its sinks' INT reports when telemetry.int is on; the captures start first, as on one machine."""
        import tempfile

        from .. import telemetry
        from ..fabric.capture import Captures
        from ..inband.collector import IntCollector
        lab = self.lab
        if lab.scen.capture:
            self.captures = Captures(lab.fabric, list(lab.scen.capture),
                                     Path(tempfile.mkdtemp(prefix=f"ftb-{lab.name}-")), mac_control=lab.pfc_on)
            self.captures.start()
        self.sampler = telemetry.LinkSampler(lab.topo, lab.datapath, lab.scen.telemetry.interval / 1e9, lab.fabric,
                                             origin=origin, cpu=telemetry.CpuGuard(self.acct, origin),
                                             resync_classes=not lab.pfc_on)
        self.sampler.start()
        if lab.datapath.int_spec is not None:
            self.collector = IntCollector(lab.datapath, origin)
            self.collector.start()

    def check(self) -> None:
        """Raise (one line) if a helper of this part died: the sampler, the PFC agent."""
        if self.sampler is not None:
            self.sampler.check()
        if self.collector is not None:
            self.collector.check()
        if self.relay is not None:
            self.relay.check()
        if self.lab is not None:
            self.lab.check()

    # ---- traffic agents (workloads.agent_set.AgentSet, for this machine's hosts)

    def agents_start(self, hosts: list[str]) -> None:
        from ..workloads.agent_set import AgentSet
        ctrs = self.lab.containers
        self.agents = AgentSet(hosts, self.lab.fabric.ns.__getitem__,
                               ctrs.containers if ctrs is not None else None).__enter__()

    def agents_ready(self, deadline: float, started: float) -> None:
        self.agents.wait_ready(deadline, started)

    def gates_open(self, gates: str, machine: int) -> tuple[str, int]:
        """This machine's gate directory and relay (cluster/gate_relay.py); returns its TCP endpoint on the underlay."""
        import ray

        from .gate_relay import GateRelay
        self.relay = GateRelay(gates, machine, ray.util.get_node_ip_address())
        return self.relay.endpoint

    def agents_jobs(self, jobs: dict[str, dict], remote: dict[str, tuple[str, int]] | None = None) -> None:
        """Hand the agents their jobs; ``remote``: the hosts of other machines this one's agents announce to (their
        machines' relay endpoints)."""
        if self.relay is not None:
            self.relay.start(remote or {})
        self.agents.hand_jobs(jobs)

    def agents_bound(self, deadline: float) -> None:
        self.agents.wait_bound(deadline)

    def agents_go(self, t0: float) -> None:
        self.agents.start(t0)

    def agents_collect(self, deadline: float, timeout_s: float) -> dict:
        return self.agents.collect(deadline, timeout_s, self.check)

    def agents_close(self) -> list[str]:
        """Kill and reap this machine's agents (always); returns the problems doing so."""
        a, self.agents = self.agents, None
        relay, self.relay = self.relay, None
        problems = []
        if a is not None:
            a.__exit__(None, None, None)
            problems = list(a.problems)
        if relay is not None:
            relay.close()
        return problems

    # ---- the end

    def _stop_captures(self) -> dict[str, bytes]:
        """Stop this machine's tcpdumps; their files (name → contents, the driver's to merge and keep), the
        capture directory removed."""
        c, self.captures = self.captures, None
        if c is None:
            return {}
        try:
            c.stop()
            return {f.name: f.read_bytes() for f in sorted(c.dir.iterdir())}
        finally:
            shutil.rmtree(c.dir.parent)

    def finish(self) -> dict:
        """After the traffic: the last sample, per-flow paths and drop counters, then tear the part down;
        everything the driver merges into the run's result directory."""
        s, lab, collector = self.sampler, self.lab, self.collector
        self.sampler = self.collector = None
        s.stop()
        pcaps = self._stop_captures()
        intr = None
        if collector is not None:
            collector.stop()
            intr = dict(collector.export(), counters=lab.datapath.int_counters(), error=collector.error)
        out = {"rows": s.rows, "model_samples": s.model_samples, "degradations": list(s.degradations),
               "late_samples": s.late_samples, "health": s.health(), "cpu": s.cpu.result(), "error": s.error,
               "flow_paths": lab.datapath.flow_paths(), "drops": lab.datapath.drop_counters(),
               "resyncs": lab.datapath.resyncs, "timings": dict(lab.fabric.timings), "int": intr,
               "pcaps": pcaps}
        self.close()
        out.update(failures=list(lab.failures), pfc=lab.results.get("pfc", {}),
                   routing=lab.results.get("routing", {}), scheduler=lab.results.get("scheduler", {}),
                   teardown_s=lab.fabric.timings.get("teardown"))
        return out

    def close(self) -> None:
        """Tear everything of this part down (agents, sampler, helpers, namespaces): on success, failure and
        interruption alike; idempotent."""
        self.agents_close()
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.stop()
        collector, self.collector = self.collector, None
        if collector is not None:
            collector.stop()
        self._stop_captures()
        with self._lock:
            lab = self.lab
        if lab is not None:
            lab.close(force=True)
        acct, self.acct = self.acct, None
        if acct is not None:
            acct.__exit__(None, None, None)


def run_of(part_lab: str) -> str:
    """The run a part's lab belongs to: ``c1a2bm1`` → ``c1a2b``."""
    return re.sub(r"m\d+$", "", part_lab)


def cleanup(lab_name: str) -> int:
    """Remove what a dead actor left of its part on this machine (run as a Ray task pinned to it): its helper
    processes, agents and namespaces — VXLAN devices with them. Returns the namespaces removed."""
    from ..lab import remove
    return remove(lab_name)


__all__ = ["Part", "cleanup", "run_of", "underlay_of"]
