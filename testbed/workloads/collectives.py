"""Collectives as schedules of transfers (``traffic.jobs``, or ``traffic.pattern: allreduce``).

Each job is ``iterations`` × (its collective, then ``gap`` of compute). A collective is a list of steps, each step
a set of sized transfers; a step starts when every transfer of the step before has arrived (as NCCL/MPI steps
wait for their data):
  allreduce    ring over the job's N hosts: 2(N−1) steps (reduce-scatter, then all-gather); in each step every
               host sends bytes/N to the next host in the ring
  all-to-all   one step: every ordered pair of distinct hosts, ``bytes`` each; with ``algorithm: pairwise``
               N−1 steps instead (pairwise exchange, as MPI's all-to-all runs it for large messages): in step k
               host i sends ``bytes`` to host i + k (mod N): N flows at a time, low entropy
  incast       one step: every other host → the first host, ``bytes`` each
  permutation  one step: a seeded derangement, ``bytes`` per flow (cross-leaf when possible)
``schedule`` lists the steps; replay.from_collectives turns them into transfers that wait for the step before
(an iteration's first step for the previous iteration, plus the gap), and replay.play runs every job at once in
one run, each at its own pace: an operation's ``jct_ms`` is its span, first transfer start to last arrival,
the dependency waits included (each ≈ 1 ms: one announcement between the agents, gating.py).
On a multi-rail fabric every transfer is striped over the rails, as NCCL gives each NIC its own channel: R flows
of bytes/R (the remainder on rail 0), flow r from the source's NIC r to the destination's NIC r. With
``traffic.qps_per_connection`` Q each stripe is split again over Q queue pairs (flows) the same way.
"""
from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass

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
    variants: list | None = None   # per pair: the ring order it belongs to (None: all the job's own, 0)


def job_hosts(job, topo) -> list[str]:
    return list(dict.fromkeys(job.hosts)) if job.hosts else list(topo.hosts)


def ring_orders(hosts: list[str], k: int, rng: random.Random) -> list[list[str]]:
    """``k`` distinct ring orders over ``hosts``: the job's own first, then seeded shuffles (fewer when the hosts
    have fewer distinct rings: (n − 1)! / 2). What an all-reduce lays out per iteration when a collective policy
    picks its ring (traffic.collective.adapt.rings), as NCCL builds several rings (channels) at start."""
    def canon(order):                                  # a ring read from its first host, either way round
        i = order.index(hosts[0])
        fwd = order[i:] + order[:i]
        return min(tuple(fwd), tuple([fwd[0]] + fwd[1:][::-1]))
    out, seen = [list(hosts)], {canon(list(hosts))}
    distinct = math.factorial(len(hosts) - 1) // 2 if len(hosts) > 2 else 1
    while len(out) < min(k, distinct):
        o = rng.sample(hosts, len(hosts))
        if canon(o) not in seen:
            seen.add(canon(o))
            out.append(o)
    return out


def ring_steps(orders: list[list[str]], nbytes: int) -> tuple[list[list], list[int]]:
    """A ring all-reduce's 2(N−1) steps laid out over every order at once: (each step's pairs, each pair's
    order index); a policy runs one order's flows and skips the rest."""
    n = len(orders[0])
    chunk = max(1, nbytes // n)
    pairs = [(o[i], o[(i + 1) % n], chunk) for o in orders for i in range(n)]
    variants = [v for v in range(len(orders)) for _ in range(n)]
    return [list(pairs) for _ in range(2 * (n - 1))], variants


def steps_of(job, name: str, topo, rng: random.Random) -> list[list]:
    hosts = job_hosts(job, topo)
    n = len(hosts)
    b = job.bytes
    if job.pattern == "allreduce":
        return ring_steps([hosts], b)[0]
    if job.pattern == "all-to-all" and job.algorithm == "pairwise":
        return [[(hosts[i], hosts[(i + k) % n], b) for i in range(n)] for k in range(1, n)]
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


class TransferFlows:
    """Turns transfers (src, dst, bytes) into the run's flows: striped over the rails, each stripe split over
    ``qps_per_connection`` queue pairs (as NCCL_IB_QPS_PER_CONNECTION does), numbered in order, each with a
    random source port — or the scenario's fixed one (low entropy: then only a hash over the RoCE destination QP
    tells the QPs apart; non-RoCE engines move QP q to dport + q) — and the traffic's engine, options and
    marking: what collectives and replay share. ``persistent``: a connection's QP q keeps one source port for
    the whole run (as a QP lives as long as the job), which collectives that read the network rely on."""

    def __init__(self, traffic, topo, seed: int, prio: int | None = None, persistent: bool = False):
        self.traffic, self.topo, self.prio = traffic, topo, prio
        self.name, engine = _engine(traffic)
        self.engine = engine
        self.opts = roce_opts(traffic, topo) if self.name == "roce" else None
        self.rails = getattr(topo.spec, "rails", 1)
        self.dport = engine.dport if engine.dport is not None else traffic.dport
        self.rng = random.Random(seed + 1)
        self.seed = seed
        self.next_id = 0
        self.qps = getattr(traffic, "qps_per_connection", 1)
        sport = traffic.sport
        self.fixed = sport if isinstance(sport, int) and not isinstance(sport, bool) else None
        self.ports: dict | None = {} if persistent else None      # (src, dst, rail, qp) → its source port

    def __call__(self, src: str, dst: str, nbytes: int, start_s: float = 0.0) -> list[Flow]:
        out = []
        tr = self.traffic
        for rail, part in enumerate(stripes(nbytes, self.rails)):
            for qp, piece in enumerate(stripes(part, self.qps)):
                sport = self.fixed if self.fixed is not None else self._port((src, dst, rail, qp))
                dport = self.dport + qp if self.fixed is not None and self.engine.dport is None else self.dport
                out.append(Flow(flow_id=self.next_id, src=src, dst=dst, src_addr=self.topo.address(src, rail),
                                dst_addr=self.topo.address(dst, rail), sport=sport, dport=dport,
                                proto=self.engine.proto, size_bytes=piece, rate_bps=tr.rate, start_s=start_s,
                                engine=self.name, opts=self.opts, dscp=tr.wire_dscp, ecn=tr.ecn, prio=self.prio,
                                rail=rail, qp=qp))
                self.next_id += 1
        return out


    def _port(self, qp: tuple) -> int:
        """A fresh random port per flow, or (persistent) the QP's own: drawn from the seed and the QP alone, so
        that a QP keeps its port whatever else the schedule lays out."""
        lo, hi = self.traffic.sport_base, 65536 - 64
        if self.ports is None:
            return self.rng.randrange(lo, hi)
        if qp not in self.ports:
            key = ":".join(map(str, (self.seed, *qp))).encode()
            self.ports[qp] = random.Random(zlib.crc32(key)).randrange(lo, hi)
        return self.ports[qp]


def schedule(traffic, topo, seed: int) -> list[list[Step]]:
    """Rounds of steps (round k = step k of every job still running). With ``traffic.collective.adapt.rings``
    k > 1, an all-reduce lays out k ring orders in every step (``Step.variants``), chosen once per job."""
    rng = random.Random(seed)
    adapt = traffic.collective.adapt
    rings = adapt.ring_count if adapt is not None else 1
    per_job = []
    for i, job in enumerate(traffic.job_list()):
        name = job.name or f"job{i}"
        orders = ring_orders(job_hosts(job, topo), rings, rng) if job.pattern == "allreduce" and rings > 1 else None
        seq = []
        for it in range(job.iterations):
            steps, variants = ring_steps(orders, job.bytes) if orders else (steps_of(job, name, topo, rng), None)
            for k, pairs in enumerate(steps):
                seq.append(Step(name, it, job.pattern, k, k == len(steps) - 1, pairs,
                                gap_s=job.gap / 1e9 if (k == 0 and it > 0) else 0.0, variants=variants))
        per_job.append(seq)
    rounds = max(len(s) for s in per_job)
    return [[s[r] for s in per_job if r < len(s)] for r in range(rounds)]
