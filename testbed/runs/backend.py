"""What a run needs from the place its fabric lives: the interface the one run lifecycle (lifecycle.py) drives.

Two back ends implement it: this machine (local.py, a ``Lab``) and a fabric split over Ray machines
(testbed/cluster/run.py, one ``Lab`` part per machine). A back end builds and tears down, maps nodes to
namespaces, runs its telemetry and helpers, and reports what they measured as plain data (``Collected``): the
lifecycle alone turns that into the manifest, flows.csv, cc.csv, sm.csv and the degradations, so both back ends
write the same files, columns and manifest keys.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import TestbedError


@dataclass
class Collected:
    """What a back end measured, merged over its machines. Filled by ``collect`` (the telemetry, read before the
    fabric goes) and ``down`` (the helpers' results, known once they stopped)."""
    rows: list = field(default_factory=list)             # links.csv: the link samples
    cpu: dict = field(default_factory=dict)              # the CPU guard's samples (summary's cpu columns)
    model_error: dict = field(default_factory=dict)      # queue model vs the qdiscs' backlog
    health: dict = field(default_factory=dict)           # the sampler(s): samples, late, failed dumps, error
    degradations: list[str] = field(default_factory=list)   # telemetry and CPU accounting lines
    errors: list[str] = field(default_factory=list)      # what failed on the way (one line each): fails the run
    flow_paths: list = field(default_factory=list)       # the datapath's per-flow path records
    drops: dict = field(default_factory=dict)            # datapath drop counters
    resyncs: int = 0                                     # queue model resyncs of the datapath
    timings: dict = field(default_factory=dict)          # build phases → seconds
    pcaps: list[str] = field(default_factory=list)       # capture files, relative to the result directory
    int_rows: list | None = None                         # int.csv (telemetry.int)
    int_stats: dict | None = None                        # the INT counters (telemetry.int or HPCC's host stacks)
    weights: list | None = None                          # weights.csv (the WCMP controller)
    controller: dict | None = None                       # the fabric controller's results (controller.csv rows …)
    collective: dict | None = None                       # the collective helper's (decisions, signals)
    wcmp_controller: dict | None = None                  # its health
    metrics: dict | None = None                          # the live metrics exporter(s)
    docker: dict | None = None                           # container hosts
    helpers: dict[str, dict] = field(default_factory=dict)   # pfc, routing, scheduler: each helper's results
    sections: dict = field(default_factory=dict)         # manifest sections of this back end only (cluster)


class Backend(ABC):
    """One fabric's life for a run: ``up`` builds it, ``start`` starts its telemetry on the run's clock, the
    traffic runs in ``ns_of``'s namespaces with ``traffic_kw``, ``stop`` and ``collect`` read what was measured,
    ``down`` tears everything down (always, idempotent) and reports what failed doing so."""

    name: str                     # the lab's name (the manifest's ``lab``)
    topo: object                  # the whole fabric's Topology
    warnings: list[str]           # found while building (headroom, underlay): the manifest's headroom_warnings

    scen: object                  # the Scenario it runs

    def capabilities(self) -> dict:
        """What the machine driving the run can do (doctor.as_dict), for the manifest: Docker's capabilities
        only when the scenario has container hosts, so every back end records the same ones."""
        from .. import doctor
        return doctor.as_dict(doctor.probe(with_bcc=False, with_docker=self.scen.hosts.docker is not None))

    @abstractmethod
    def up(self, log: Callable[[str], None]) -> None:
        """Build the fabric with its datapath and helpers; on failure leave nothing behind and raise."""

    @abstractmethod
    def ns_of(self, node: str) -> str:
        """The network namespace holding ``node``."""

    def capture(self, outdir: Path) -> None:
        """Start packet captures into ``outdir`` before the run's clock starts (where they run here)."""

    @abstractmethod
    def start(self, origin: float, outdir: Path, log: Callable[[str], None]) -> None:
        """Start telemetry (and captures not started by ``capture``) on the run's clock (time zero ``origin``)."""

    def check(self) -> None:
        """Raise HelperFailed (one line) if something the run needs died; polled while traffic runs."""

    def traffic_kw(self) -> dict:
        """What workloads.run and replay.play need beyond ``ns_of`` here (container hosts, remote agents)."""
        return {}

    def failures_go(self, t0: float) -> None:
        """The traffic chose its t0: start the failure scheduler(s)."""

    def rxe_flows(self, flows, duration_s: float, info: dict, outdir: Path) -> list:
        """Run Soft-RoCE flows with perftest (traffic.engine rxe); only where every host's namespace is here."""
        raise TestbedError("traffic.engine: rxe is not supported by this back end")

    def iperf3_flows(self, flows, origin: float, duration_s: float, log_dir: Path,
                     check: Callable[[], None]) -> tuple[list, str | None]:
        """Run the flows with iperf3 (traffic.engine iperf3): (their results, the first failure's line or None)."""
        raise TestbedError("traffic.engine: iperf3 is not supported by this back end")

    def mpi_run(self, origin: float, deadline_s: float, log_dir: Path, check: Callable[[], None]) -> tuple[list, dict]:
        """Run the Open MPI benchmark (traffic.engine mpi): (collectives.csv rows, the manifest's ``mpi``)."""
        raise TestbedError("traffic.engine: mpi is not supported by this back end")

    @abstractmethod
    def stop(self) -> None:
        """Stop telemetry and captures (after the traffic, whatever happened); idempotent."""

    @abstractmethod
    def collect(self, flows) -> Collected:
        """Everything measured before the fabric goes (``flows``: the run's, to match INT reports to)."""

    @abstractmethod
    def down(self, got: Collected | None) -> list[str]:
        """Tear everything down; fill ``got`` (when there is one) with what stopping the helpers returned.
        Returns what failed (one line each)."""
