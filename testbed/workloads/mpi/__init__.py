"""``traffic.engine: mpi``: a real collective library on the fabric — Open MPI's collectives, one rank per host.

What users run first on a new cluster is a collective microbenchmark (nccl-tests, OSU); NCCL needs GPUs, Open
MPI does not, and its tuned component has the real algorithms (ring, recursive doubling, Rabenseifner, Bruck,
pairwise). ``traffic.mpi`` (spec.py) picks the operation, sizes, iterations, ranks, transport (TCP BTL, or UCX)
and algorithm; each rank runs ``rank.py`` (mpi4py), launched by mpirun inside the host namespaces over a
management network of its own (launcher.py); rank 0's timings become collectives.csv rows with nccl-tests'
algbw and busbw (busbw.py). The switch counters, queues and CPU guard of the run work as for every engine.

``require()`` says in one line what is missing (Open MPI, mpi4py, the UCX PML); ``run()`` runs the benchmark
on a built lab.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..agent_set import WorkloadError
from . import launcher
from .busbw import MPI_COLUMNS, rows as result_rows, summary
from .spec import ALGORITHMS, BENCHMARKS, MpiSpec


def require(transport: str = "tcp") -> None:
    why = launcher.missing(transport)
    if why:
        raise WorkloadError(why)


def tcp_retransmits(ns: list[str]) -> int:
    """TCP segments retransmitted so far by the hosts of namespaces ``ns`` (/proc/net/snmp of each)."""
    from ...fabric import netns

    def read() -> int:
        with open("/proc/thread-self/net/snmp") as f:
            lines = [ln.split() for ln in f if ln.startswith("Tcp:")]
        return int(lines[1][lines[0].index("RetransSegs")])
    return sum(netns.run_in(n, read) for n in ns)


def run(spec: MpiSpec, topo, lab: str, ns_of: Callable[[str], str], origin: float, deadline_s: float,
        log_dir: Path, check: Callable[[], None]) -> tuple[list[dict], dict]:
    """Run the benchmark on the lab's hosts; (collectives.csv rows, the manifest's ``mpi`` section: hosts,
    transport, algorithm, the management network's bytes, the ranks' TCP retransmissions)."""
    require(spec.transport)
    hosts = spec.hosts(topo.hosts)
    nics = sorted({p.ifname for h in hosts for p in topo.ports[h]})
    hnp, addrs = launcher.mgmt_addresses(len(hosts), [topo.address(h, r) for h in topo.hosts
                                                      for r in range(topo.spec.rails)])
    rank_ns = [ns_of(h) for h in hosts]
    log_dir.mkdir(parents=True, exist_ok=True)
    hostfile = log_dir / "hostfile"
    hostfile.write_text("".join(f"{h} slots=1\n" for h in hosts))
    mgmt = launcher.MgmtNet(lab, rank_ns, addrs, hnp)
    agent = launcher.agent_script(log_dir / "rsh-agent.sh", dict(zip(hosts, rank_ns)), mgmt.session)
    report = log_dir / "report.json"
    preload, why = launcher.idle_shim()
    argv = launcher.mpirun_argv(hosts, hostfile, agent, nics, spec.transport, spec.mca_algorithm(),
                                {"benchmark": spec.benchmark, "sizes": list(spec.sizes), "report": str(report),
                                 "iterations": spec.iterations, "warmup": spec.warmup}, preload)
    with mgmt:
        retrans0 = tcp_retransmits(rank_ns)
        got = launcher.run(mgmt, argv, hosts, log_dir, report, deadline_s, check)
        info = {"hosts": hosts, "nics": nics, "transport": spec.transport, "algorithm": spec.algorithm,
                "benchmark": spec.benchmark, "mgmt_bytes": mgmt.bytes(),
                "tcp_retransmits": tcp_retransmits(rank_ns) - retrans0, "argv": argv,
                "idle_shim": str(preload) if preload else None, "degradations": [why] if why else []}
    return result_rows(got, origin, spec.algorithm, spec.transport), info


__all__ = ["ALGORITHMS", "BENCHMARKS", "MPI_COLUMNS", "MpiSpec", "WorkloadError", "require", "run", "summary",
           "tcp_retransmits"]
