"""A small deterministic discrete-event model of N senders sharing one bottleneck queue, to check the
controllers' closed-loop behaviour (fairness, standing queue) without a fabric; usable by docs and tests.

Each sender has a NIC at the line rate and always has data; its packets (``mss`` bytes) enter one FIFO egress
queue of rate ``line_rate_bps`` (RED/ECN marking at kmin/kmax/pmax on the queue at enqueue, drop above
``buffer``), then cross ``prop`` (base RTT − 2 serialisations, split evenly both ways) to the receiver, which ACKs
every packet (after a seeded random host delay of up to ``jitter_s``, default one packet time, as a real host
has — without it a deterministic model phase-locks the flows' packets), echoing CE and the queue's INT record (queue, tx bytes, timestamp, rate at dequeue). DCQCN
runs dcqcn.py's NotificationPoint/ReactionPoint (CNPs), EQDS a CreditPacer at the receiver. ``cc`` is a
``traffic.cc`` name or a ``CongestionControl`` (a plugin's, before it is installed; ``overrides`` = its params). A drop becomes a NAK
one propagation RTT later. Everything is driven by one event heap and one seeded RNG (the ECN coin), so a run
is reproducible.
"""
from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Optional

from .dcqcn import DcqcnParams, NotificationPoint, jain
from . import CC_NAMES, CongestionControl, CreditPacer, Hop, get_cc, make_sender_cc, scaled_params


@dataclass
class ModelResult:
    cc: str
    goodput_bps: list            # per flow, over the measurement window
    jain: float
    queue_mean: float            # bytes, time-sampled every 100 µs over the measurement window
    queue_p99: float
    utilisation: float           # bottleneck busy share over the window
    drops: int
    marks: int
    stats: list = field(default_factory=list)


class _Flow:
    def __init__(self, i, start):
        self.i, self.start = i, start
        self.inflight = 0
        self.next_nic = self.next_pace = start
        self.wake: Optional[float] = None
        self.cc = self.np = None                 # the flow's SenderCC; DCQCN's notification point
        self.acked_window = 0
        self.sent = 0


def run(cc: "str | CongestionControl", *, n_flows: int = 2, line_rate_bps: float = 100e6, base_rtt_s: float = 500e-6,
        mss: int = 1024, t_end: float = 3.0, stagger: float = 0.05, buffer: int = 1 << 20,
        ecn: Optional[tuple] = (20_000, 80_000, 0.2), overrides: Optional[dict] = None,
        dcqcn: Optional[DcqcnParams] = None, seed: int = 1, measure_from: Optional[float] = None,
        jitter_s: Optional[float] = None) -> ModelResult:
    rng = random.Random(seed)
    jit = random.Random(seed + 1)
    ser = mss * 8 / line_rate_bps
    prop = base_rtt_s - 2 * ser
    if prop <= 0:
        raise ValueError(f"base_rtt_s {base_rtt_s} is below two serialisations ({2 * ser})")
    half = prop / 2
    jitter = ser if jitter_s is None else jitter_s     # host-side delay spread per ACK: breaks phase locking
    if jitter >= half:
        raise ValueError(f"jitter_s {jitter} must be below half the propagation RTT ({half})")
    t0 = t_end / 2 if measure_from is None else measure_from
    plugin = None                      # a CC from outside the built-ins: a CongestionControl, or its registered name
    if isinstance(cc, CongestionControl) or cc not in CC_NAMES:
        plugin = cc if isinstance(cc, CongestionControl) else get_cc(cc)
        cc = plugin.name
        own = plugin.scale(line_rate_bps, base_rtt_s, plugin.params_model(**(overrides or {})), mss)
    params = scaled_params(cc, line_rate_bps, base_rtt_s, overrides) if cc in CC_NAMES[2:] else {}
    dparams = dcqcn or DcqcnParams.scaled(line_rate_bps)
    pacer = CreditPacer.from_params(_eqds(params)) if "eqds" in params else None
    flows = [_Flow(i, i * stagger) for i in range(n_flows)]
    ev: list = []
    seq = [0]

    def at(t, kind, *data):
        seq[0] += 1
        heapq.heappush(ev, (t, seq[0], kind, data))

    q = 0
    queue: list = []            # FIFO of (flow, send_time, ce, solicited); index head
    head = [0]
    busy = [False]
    tx = [0]
    drops = marks = 0
    busy_time = [0.0]
    samples: list = []
    next_sample = [t0]
    pacer_at = [None]

    def schedule_pacer(now):
        if pacer is None:
            return
        t = pacer.next_time()
        if t is None:
            return
        t = max(t, now)
        if pacer_at[0] is None or t < pacer_at[0]:
            pacer_at[0] = t
            at(t, "pacer")

    def wake(f, t):
        if f.wake is None or t < f.wake:
            f.wake = t
            at(t, "wake", f)

    def try_send(f, now):
        while True:
            c = f.cc
            if c is not None:
                c.advance(now)
                rate, cwnd = c.rate, c.cwnd
            else:
                rate, cwnd = None, math.inf
            if not f.inflight < cwnd:
                return                                   # window: an ACK will call again
            if c is not None and hasattr(c, "may_send") and not c.may_send(mss, now):
                return                                   # credit: a grant will call again
            t = max(f.next_nic, f.next_pace)
            if t > now + 1e-12:
                wake(f, t)
                return
            solicited = False
            if c is not None and hasattr(c, "consume"):
                e = c.eqds if hasattr(c, "eqds") else c
                solicited = e.unsolicited < mss
                c.consume(mss, now)
            f.inflight += mss
            f.sent += 1
            f.next_nic = now + ser
            f.next_pace = now + (mss * 8 / rate if rate else 0.0)
            if c is not None:
                c.on_sent(now, mss)
            at(now + ser, "arrive", f, now, solicited)

    def start_service(now):
        if head[0] < len(queue) and not busy[0]:
            busy[0] = True
            at(now + ser, "depart")

    for f in flows:
        at(f.start, "start", f)

    while ev:
        now, _, kind, data = heapq.heappop(ev)
        if now > t_end:
            break
        while next_sample[0] <= now:
            samples.append(q)
            next_sample[0] += 1e-4
        if kind == "start":
            f, = data
            f.cc = (plugin.make(own, now) if plugin is not None
                    else make_sender_cc(cc, dparams if cc == "dcqcn" else params, now))
            if cc == "dcqcn":
                f.np = NotificationPoint(dparams.cnp_interval_s)
            if pacer is not None:
                pacer.register(f.i, None)
                schedule_pacer(now)
            try_send(f, now)
        elif kind == "wake":
            f, = data
            if f.wake == now:
                f.wake = None
            try_send(f, now)
        elif kind == "arrive":
            f, t_sent, solicited = data
            if q + mss > buffer:
                drops += 1
                at(now + prop, "loss", f)
                continue
            ce = False
            if ecn is not None:
                kmin, kmax, pmax = ecn
                pm = 0.0 if q <= kmin else (1.0 if q >= kmax else pmax * (q - kmin) / (kmax - kmin))
                ce = rng.random() < pm
                marks += ce
            queue.append((f, t_sent, ce, solicited))
            q += mss
            start_service(now)
        elif kind == "depart":
            f, t_sent, ce, solicited = queue[head[0]]
            queue[head[0]] = None
            head[0] += 1
            q -= mss
            tx[0] += mss
            if now >= t0:
                busy_time[0] += ser
            busy[0] = False
            hop = Hop(q, tx[0], int(round(now * 1e9)), line_rate_bps)
            at(now + half, "rx", f, t_sent, ce, solicited, hop)
            start_service(now)
        elif kind == "rx":
            f, t_sent, ce, solicited, hop = data
            if f.np is not None and ce and f.np.on_ce(now):
                at(now + half, "cnp", f)
            if pacer is not None and solicited:
                pacer.on_data(mss)
                schedule_pacer(now)
            at(now + half - jitter + jit.random() * jitter, "ack", f, t_sent, ce, hop)
        elif kind == "ack":
            f, t_sent, ce, hop = data
            f.inflight -= mss
            if now >= t0:
                f.acked_window += mss
            if f.cc is not None:
                f.cc.on_ack(now, acked_bytes=mss, rtt_s=now - t_sent, ecn=ce, inflight=f.inflight, hops=(hop,))
            try_send(f, now)
        elif kind == "cnp":
            f, = data
            f.cc.on_cnp(now)
        elif kind == "loss":
            f, = data
            f.inflight -= mss
            if f.cc is not None:
                f.cc.on_loss(now, "nak")
            if pacer is not None:
                pacer.on_data(mss)              # its credit is not outstanding any more
                pacer.register(f.i, None)
            try_send(f, now)
        elif kind == "pacer":
            if pacer_at[0] == now:
                pacer_at[0] = None
            while (g := pacer.next_grant(now)) is not None:
                at(now + half, "credit", flows[g[0]], g[1])
            schedule_pacer(now)
        elif kind == "credit":
            f, n = data
            f.cc.on_credit(n, now)
            try_send(f, now)

    window = t_end - t0
    gp = [f.acked_window * 8 / window for f in flows]
    samples.sort()
    qm = sum(samples) / len(samples) if samples else 0.0
    p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))] if samples else 0.0
    return ModelResult(cc, gp, jain(gp), qm, p99, busy_time[0] / window, drops, marks,
                       [f.cc.stats() if f.cc is not None else {} for f in flows])


def _eqds(params: dict):
    from .eqds import EqdsParams
    return EqdsParams.from_dict(params["eqds"])
