"""collectives.csv rows of an MPI benchmark (``traffic.engine: mpi``), from what rank 0 printed (rank.py).

One row per timed call and size. A call's time on a rank is that rank's own span (it left the barrier, called,
returned); the call's time is the slowest rank's (the collective is done when every rank is), and the bandwidths
are nccl-tests' (its doc/PERFORMANCE.md): algbw = bytes ÷ time, busbw = algbw × the operation's factor — what
each rank's link had to carry for the algorithm-independent minimum, comparable to the link rate. In Mbit/s
(10^6 bit/s) like every rate of the results.
"""
from __future__ import annotations

from statistics import mean

#: benchmark → busbw factor as a function of the rank count n (nccl-tests)
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "bcast": lambda n: 1.0,
}

#: the columns an MPI row adds to collectives.csv's own (job … jct_ms)
MPI_COLUMNS = ["ranks", "algorithm", "transport", "time_min_ms", "time_mean_ms", "time_max_ms", "algbw_mbps",
               "busbw_mbps"]


def rows(report: dict, origin: float, algorithm: str, transport: str) -> list[dict]:
    """collectives.csv rows of rank 0's report; times in seconds since ``origin`` (the run's time zero)."""
    out = []
    n = int(report["ranks"])
    for res in report["results"]:
        bench, size = res["benchmark"], int(res["bytes"])
        for i, call in enumerate(res["times"]):
            spans = [end - start for start, end in call]
            start, end = min(s for s, _ in call), max(e for _, e in call)
            slowest = max(spans)
            algbw = size * 8 / slowest / 1e6 if slowest > 0 else float("nan")
            out.append({"job": "mpi", "iteration": i, "op": bench, "bytes": size,
                        "start_s": start - origin, "end_s": end - origin, "jct_ms": (end - start) * 1e3,
                        "ranks": n, "algorithm": algorithm, "transport": transport,
                        "time_min_ms": min(spans) * 1e3, "time_mean_ms": mean(spans) * 1e3,
                        "time_max_ms": slowest * 1e3, "algbw_mbps": algbw,
                        "busbw_mbps": algbw * BUS_FACTOR[bench](n)})
    return out


def summary(rows_: list[dict]) -> dict:
    """The summary row's MPI figures: the largest size's mean algbw and busbw over its calls (empty without
    rows)."""
    if not rows_:
        return {}
    top = max(r["bytes"] for r in rows_)
    calls = [r for r in rows_ if r["bytes"] == top]
    return {"mpi_bytes": top, "mpi_algbw_mbps": mean(r["algbw_mbps"] for r in calls),
            "mpi_busbw_mbps": mean(r["busbw_mbps"] for r in calls)}
