"""Cross-field checks of the traffic engines that run outside the agents (mpi, iperf3) against the rest of the
scenario.

Each function takes the whole scenario and raises ValueError("@key.path: why") for the scenario loader to
turn into one line."""
from __future__ import annotations

#: keys that plan the agents' flows: engine mpi runs its benchmark instead
_PATTERN_KEYS = ("jobs", "replay", "pattern", "pairs", "flow_size", "rate", "flows_per_pair", "incast", "load",
                 "size_dist", "qps_per_connection", "packet_size", "ecn")


def engine_keys_apply(scen) -> None:
    """An engine's own keys without that engine would do nothing, and engine mpi plans no flows; iperf3 runs
    pattern flows only."""
    from .iperf3.spec import Iperf3Spec
    from .mpi.spec import MpiSpec
    tr = scen.traffic
    if tr.engine != "mpi" and tr.mpi != MpiSpec():
        raise ValueError(f"@traffic.mpi: applies to traffic.engine mpi (engine is {tr.engine!r})")
    if tr.engine != "iperf3" and tr.iperf3 != Iperf3Spec():
        raise ValueError(f"@traffic.iperf3: applies to traffic.engine iperf3 (engine is {tr.engine!r})")
    if tr.engine == "mpi":
        for key in _PATTERN_KEYS:
            if key in tr.model_fields_set:
                raise ValueError(f"@traffic.{key}: engine mpi runs the benchmark of traffic.mpi; {key} does not "
                                 f"apply")
    if tr.engine == "iperf3" and (tr.jobs or tr.replay is not None or tr.pattern in ("allreduce", "poisson")):
        raise ValueError("@traffic.engine: iperf3 runs pattern flows (pairs, permutation, all-to-all, incast), "
                         "not collectives, replays or poisson arrivals; use udp, tcp or roce")


def mpi_ranks_fit(scen) -> None:
    """MPI ranks run on hosts of this topology, in its namespaces (not containers, one machine)."""
    if scen.traffic.engine != "mpi":
        return
    ranks, n = scen.traffic.mpi.ranks, scen.topology.hosts
    if isinstance(ranks, int) and ranks > n:
        raise ValueError(f"@traffic.mpi.ranks: {ranks} ranks, the topology has {n} hosts (one rank per host)")
    if isinstance(ranks, list):
        for h in ranks:
            if not h.startswith("h"):
                raise ValueError(f"@traffic.mpi.ranks: {h} is a switch; ranks run on hosts")
    if scen.hosts.docker is not None:
        raise ValueError("@hosts.docker: not with traffic.engine mpi (the ranks run in the host namespaces)")
    if scen.placement is not None:
        raise ValueError("@placement: traffic.engine mpi runs on one machine (its ranks' management network is "
                         "local)")


def iperf3_fits(scen) -> None:
    """iperf3 cannot set its sockets' priority: where host NICs have traffic classes its packets would all leave
    in the default class."""
    if scen.traffic.engine == "iperf3" and (scen.hosts.pfc or scen.switch.credit_on):
        raise ValueError("@traffic.engine: iperf3 cannot choose its sockets' priority, and the host NICs have "
                         "traffic classes here (hosts.pfc or credits); use udp or tcp")
