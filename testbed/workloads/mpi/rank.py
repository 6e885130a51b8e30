"""The program every MPI rank runs (``traffic.engine: mpi``): one collective at each size, timed per call.

Started by mpirun inside the host namespaces as ``python rank.py '<json>'`` — a file of its own, importing
nothing of the testbed, so that a rank starts in the time Python and mpi4py take. The JSON holds ``benchmark``,
``sizes`` (bytes), ``iterations``, ``warmup`` and ``report``, the file rank 0 writes its results to (mpirun's
forwarded stdout may cut a long line and tag its pieces).

Every call is barrier-aligned: all ranks leave an MPI_Barrier, each takes its wall clock (CLOCK_REALTIME, the
clock the run's result files share), calls the collective and takes it again. Rank 0 gathers every rank's
(start, end) pairs and writes them as JSON to ``report``, ``{"ranks": N, "results": [{"benchmark", "bytes", "times":
[[[start, end] per rank] per timed call]}]}``; the driver turns it into collectives.csv rows (busbw.py).

Buffers follow nccl-tests' size convention: ``bytes`` is the whole buffer a rank passes — allreduce: its send
and receive buffer (float32, summed); reduce_scatter: its send buffer, of which it receives bytes ÷ N (float32,
summed); allgather: its receive buffer, to which it contributes bytes ÷ N; alltoall: its send buffer, bytes ÷ N
to each rank; bcast: the buffer rank 0 sends. A size that is not a whole number of units (4 × N bytes for the
float32 operations, N bytes for the others) is rounded down to one; the rows carry the bytes used.
"""
from __future__ import annotations

import json
import os
import sys
import time


def unit(benchmark: str, ranks: int) -> int:
    """The bytes a size must be a multiple of (see the module's docstring)."""
    per = 4 if benchmark in ("allreduce", "reduce_scatter") else 1
    return per * (ranks if benchmark in ("reduce_scatter", "allgather", "alltoall") else 1)


def used_bytes(benchmark: str, ranks: int, size: int) -> int:
    """``size`` rounded down to a whole number of units (0 when it holds none)."""
    u = unit(benchmark, ranks)
    return size // u * u


def _call(comm, benchmark: str, size: int):
    """A closure that runs the collective once on buffers of ``size`` bytes."""
    import numpy as np
    from mpi4py import MPI
    n = comm.Get_size()
    if benchmark == "allreduce":
        a, b = np.ones(size // 4, np.float32), np.empty(size // 4, np.float32)
        return lambda: comm.Allreduce(a, b, op=MPI.SUM)
    if benchmark == "reduce_scatter":
        a, b = np.ones(size // 4, np.float32), np.empty(size // 4 // n, np.float32)
        return lambda: comm.Reduce_scatter_block(a, b, op=MPI.SUM)
    if benchmark == "allgather":
        a, b = np.ones(size // n, np.uint8), np.empty(size, np.uint8)
        return lambda: comm.Allgather(a, b)
    if benchmark == "alltoall":
        a, b = np.ones(size, np.uint8), np.empty(size, np.uint8)
        return lambda: comm.Alltoall(a, b)
    if benchmark == "bcast":
        a = np.ones(size, np.uint8)
        return lambda: comm.Bcast(a, root=0)
    raise ValueError(f"unknown benchmark {benchmark!r}")


def main(args: dict) -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    bench, n = args["benchmark"], comm.Get_size()
    out = []
    for size in args["sizes"]:
        size = used_bytes(bench, n, size)
        if not size:
            continue
        call = _call(comm, bench, size)
        times = []
        for i in range(args["warmup"] + args["iterations"]):
            comm.Barrier()
            t0 = time.time()
            call()
            t1 = time.time()
            if i >= args["warmup"]:
                times.append((t0, t1))
        every = comm.gather(times, root=0)
        if comm.Get_rank() == 0:
            calls = [[list(every[r][i]) for r in range(n)] for i in range(args["iterations"])]
            out.append({"benchmark": bench, "bytes": size, "times": calls})
    if comm.Get_rank() == 0:
        tmp = args["report"] + ".part"
        with open(tmp, "w") as f:
            json.dump({"ranks": n, "results": out}, f)
        os.replace(tmp, args["report"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
