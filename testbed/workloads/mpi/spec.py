"""The scenario's ``traffic.mpi`` keys (``traffic.engine: mpi``) and what Open MPI accepts for them.

The algorithm names are those Open MPI 4.1's tuned collective component takes for each operation
(``ompi_info --param coll tuned --level 9``: ``coll_tuned_<op>_algorithm``); a name an operation does not have
is refused when the scenario is loaded, in one line that lists the ones it has.
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, model_validator

from ...spec_types import NodeName, Size, Strict

#: benchmark → Open MPI's coll/tuned operation name and its algorithms (index = the MCA enum's value)
ALGORITHMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "allreduce": ("allreduce", ("ignore", "basic_linear", "nonoverlapping", "recursive_doubling", "ring",
                                "segmented_ring", "rabenseifner")),
    "alltoall": ("alltoall", ("ignore", "linear", "pairwise", "modified_bruck", "linear_sync", "two_proc")),
    "allgather": ("allgather", ("ignore", "linear", "bruck", "recursive_doubling", "ring", "neighbor", "two_proc")),
    "reduce_scatter": ("reduce_scatter", ("ignore", "non-overlapping", "recursive_halving", "ring", "butterfly")),
    "bcast": ("bcast", ("ignore", "basic_linear", "chain", "pipeline", "split_binary_tree", "binary_tree",
                        "binomial", "knomial", "scatter_allgather", "scatter_allgather_ring")),
}
BENCHMARKS = tuple(ALGORITHMS)
DEFAULT_SIZES = (64 * 1024, 1 << 20, 16 << 20)


class MpiSpec(Strict):
    """One Open MPI collective benchmark over the fabric: every size, ``warmup`` untimed then ``iterations``
    timed calls, one rank per host of ``ranks``."""
    benchmark: Literal["allreduce", "alltoall", "allgather", "reduce_scatter", "bcast"] = "allreduce"
    sizes: list[Size] = Field(list(DEFAULT_SIZES), min_length=1, max_length=32)   # bytes per call, as
                                      # nccl-tests counts them (results/README.md: collectives.csv, engine mpi)
    iterations: int = Field(10, ge=1, le=10_000)
    warmup: int = Field(2, ge=0, le=1000)
    ranks: Union[Literal["all"], list[NodeName], int] = "all"   # all hosts, these hosts, or the first N hosts
    transport: Literal["tcp", "ucx"] = "tcp"      # tcp: PML ob1 + the TCP BTL; ucx: PML ucx on the fabric NICs
    algorithm: str = "auto"                       # auto: Open MPI's own choice; else a name of ALGORITHMS

    @model_validator(mode="after")
    def _checks(self):
        if self.algorithm != "auto":
            _, names = ALGORITHMS[self.benchmark]
            if self.algorithm not in names[1:]:
                raise ValueError(f"algorithm: Open MPI has no {self.benchmark} algorithm {self.algorithm!r} "
                                 f"(auto, {', '.join(names[1:])})")
        if isinstance(self.ranks, int) and self.ranks < 2:
            raise ValueError(f"ranks: a collective needs at least 2 ranks, got {self.ranks}")
        if isinstance(self.ranks, list) and len(set(self.ranks)) < 2:
            raise ValueError("ranks: a collective needs at least 2 distinct hosts")
        if isinstance(self.ranks, list) and len(set(self.ranks)) != len(self.ranks):
            raise ValueError("ranks: a host is listed twice (one rank per host)")
        return self

    def hosts(self, all_hosts: list[str]) -> list[str]:
        """The hosts that run a rank, in rank order."""
        if self.ranks == "all":
            return list(all_hosts)
        if isinstance(self.ranks, int):
            return list(all_hosts[:self.ranks])
        return list(self.ranks)

    def mca_algorithm(self) -> dict[str, str]:
        """The MCA parameters that force ``algorithm`` (empty for auto)."""
        if self.algorithm == "auto":
            return {}
        op, names = ALGORITHMS[self.benchmark]
        return {"coll_tuned_use_dynamic_rules": "1", f"coll_tuned_{op}_algorithm": str(names.index(self.algorithm))}
