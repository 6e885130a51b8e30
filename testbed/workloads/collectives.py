"""Collectives as flow schedules (``traffic.jobs``, or ``traffic.pattern: allreduce``).

Each job is ``iterations`` × (its collective, then ``gap`` of compute). A collective is a list of steps, each step
a set of sized flows that must all finish before the next step starts (a barrier, as NCCL/MPI steps do):
  allreduce    ring over the job's N hosts: 2(N−1) steps (reduce-scatter, then all-gather); in each step every
               host sends bytes/N to the next host in the ring
  all-to-all   one step: every ordered pair of distinct hosts, ``bytes`` each
  incast       one step: every other host → the first host, ``bytes`` each
  permutation  one step: a seeded derangement, ``bytes`` per flow (cross-leaf when possible)
Several jobs run at once: round k runs step k of every job that still has steps (jobs on shared hosts then share
their links). A round is one ``workloads.run`` (one set of agents); the orchestrator's barrier between rounds is
not counted: a step lasts from its first flow's start to its last flow's end, an operation's ``jct_ms`` is the sum
of its steps' durations, and ``start_s``/``end_s`` are the first step's start and the last step's end. A compute
gap is waited before a job's next iteration (a round waits for the longest gap among the jobs it continues).
On a multi-rail fabric every transfer is striped over the rails, as NCCL gives each NIC its own channel: R flows
of bytes/R (the remainder on rail 0), flow r from the source's NIC r to the destination's NIC r.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from .flows import Flow, _host_group, derangement, roce_opts, _engine


@dataclass
class Step:
    job: str
    iteration: int
    op: str
    index: int
    last: bool
    pairs: list            # (src, dst, bytes)
    gap_s: float = 0.0     # compute gap to wait before this step (first step of iteration ≥ 1)


@dataclass
class OpRecord:
    job: str
    iteration: int
    op: str
    bytes: int = 0
    start: float | None = None
    end: float | None = None
    busy_s: float = 0.0
    complete: bool = True
    flows: list = field(default_factory=list)


def steps_of(job, name: str, topo, rng: random.Random) -> list[list]:
    hosts = list(dict.fromkeys(job.hosts)) if job.hosts else list(topo.hosts)
    n = len(hosts)
    b = job.bytes
    if job.pattern == "allreduce":
        chunk = max(1, b // n)
        ring = [(hosts[i], hosts[(i + 1) % n], chunk) for i in range(n)]
        return [list(ring) for _ in range(2 * (n - 1))]
    if job.pattern == "all-to-all":
        return [[(a, c, b) for a in hosts for c in hosts if a != c]]
    if job.pattern == "incast":
        return [[(h, hosts[0], b) for h in hosts[1:]]]
    if job.pattern == "permutation":
        perm = derangement(hosts, rng, {h: _host_group(topo, h) for h in hosts})
        return [[(h, perm[h], b) for h in hosts]]
    raise ValueError(f"unknown collective {job.pattern!r}")


def stripes(nbytes: int, rails: int) -> list[int]:
    """A transfer's bytes per rail: bytes // rails each, the remainder on rail 0 (rails with 0 bytes dropped)."""
    base, extra = divmod(nbytes, rails)
    return [p for p in [base + extra] + [base] * (rails - 1) if p > 0]


def schedule(traffic, topo, seed: int) -> list[list[Step]]:
    """Rounds of steps (round k = step k of every job still running)."""
    rng = random.Random(seed)
    per_job = []
    for i, job in enumerate(traffic.job_list()):
        name = job.name or f"job{i}"
        seq = []
        for it in range(job.iterations):
            steps = steps_of(job, name, topo, rng)
            for k, pairs in enumerate(steps):
                seq.append(Step(name, it, job.pattern, k, k == len(steps) - 1, pairs,
                                gap_s=job.gap / 1e9 if (k == 0 and it > 0) else 0.0))
        per_job.append(seq)
    rounds = max(len(s) for s in per_job)
    return [[s[r] for s in per_job if r < len(s)] for r in range(rounds)]


def run_jobs(traffic, topo, seed: int, ns_of, duration_s: float, packet_size: int, sndbuf_bytes=None,
             log=lambda s: None, origin: float | None = None, check=None, on_t0=None, prio: int | None = None):
    """Run every round; return (flows, results, op rows). Times are seconds since ``origin`` (epoch seconds;
    default the first round's t0). ``check`` is handed to every round (it may raise to abort the run);
    ``on_t0`` gets every round's t0 (the failure scheduler takes the first); ``prio``: the host NIC class of
    every flow (runner.host_prio)."""
    from . import run as run_flows
    name, engine = _engine(traffic)
    opts = roce_opts(traffic, topo) if name == "roce" else None
    rounds = schedule(traffic, topo, seed)
    rails = getattr(topo.spec, "rails", 1)
    base_dport = engine.dport if engine.dport is not None else traffic.dport
    rng = random.Random(seed + 1)
    all_flows, all_results = [], []
    ops: dict[tuple, OpRecord] = {}
    fid = 0
    give_up = time.time() + duration_s
    for r, steps in enumerate(rounds):
        gap = max((s.gap_s for s in steps), default=0.0)
        if gap:
            time.sleep(gap)
        if time.time() > give_up:
            log(f"collectives: stopped before round {r + 1}/{len(rounds)}: the run's duration is over")
            break
        flows, owner = [], []
        for s in steps:
            for src, dst, nbytes in s.pairs:
                for rail, part in enumerate(stripes(nbytes, rails)):
                    sport = rng.randrange(traffic.sport_base, 65536 - 64)
                    flows.append(Flow(flow_id=fid, src=src, dst=dst, src_addr=topo.address(src, rail),
                                      dst_addr=topo.address(dst, rail), sport=sport, dport=base_dport,
                                      proto=engine.proto, size_bytes=part, rate_bps=traffic.rate, start_s=0.0,
                                      engine=name, opts=opts, dscp=traffic.wire_dscp, ecn=traffic.ecn, prio=prio,
                                      rail=rail))
                    owner.append(s)
                    fid += 1
        info: dict = {}
        limit = max(1.0, give_up - time.time())
        results = run_flows(flows, ns_of, limit, packet_size, sndbuf_bytes=sndbuf_bytes, info=info, check=check,
                            on_t0=on_t0)
        t0 = info["t0"]
        if origin is None:
            origin = t0
        for s in steps:
            mine = [(f, res) for f, res, o in zip(flows, results, owner) if o is s]
            key = (s.job, s.iteration)
            rec = ops.setdefault(key, OpRecord(s.job, s.iteration, s.op))
            starts = [res.start_s for _, res in mine if res.start_s is not None]
            ends = [res.end_s for _, res in mine if res.end_s is not None]
            done = all(res.complete for _, res in mine)
            rec.complete &= done
            rec.bytes += sum(f.size_bytes for f, _ in mine)
            if starts and ends:
                st, en = min(starts) + t0 - origin, max(ends) + t0 - origin
                rec.start = st if rec.start is None else rec.start
                rec.end = en
                rec.busy_s += en - st
        for f, res, o in zip(flows, results, owner):
            res.start_s = None if res.start_s is None else res.start_s + t0 - origin
            res.end_s = None if res.end_s is None else res.end_s + t0 - origin
            all_flows.append(f)
            all_results.append((res, o))
    rows = [dict(job=o.job, iteration=o.iteration, op=o.op, bytes=o.bytes, start_s=o.start, end_s=o.end,
                 jct_ms=o.busy_s * 1e3 if o.complete and o.end is not None else None) for o in ops.values()]
    return all_flows, all_results, rows
