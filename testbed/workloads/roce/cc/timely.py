"""TIMELY (Mittal et al., SIGCOMM 2015): rate control on the RTT gradient.

Once per completion — every ``segment_bytes`` acknowledged, or one RTT since the last update if that comes first —
with a fresh RTT sample:
  rtt_diff ← (1 − α)·rtt_diff + α·(rtt − prev_rtt);   gradient = rtt_diff / base RTT
  rtt < T_low            → rate += δ                                  (too little queue: additive increase)
  rtt > T_high           → rate × (1 − β·(1 − T_high/rtt))            (too much: decrease towards T_high)
  gradient ≤ 0           → rate += N·δ, N = hai_n once ``hai_after`` consecutive non-positive gradients (HAI),
                           else 1
  gradient > 0           → rate × (1 − β·gradient)                    (delay rising: decrease by the gradient)
Rate clamped to [min_rate, line rate]; ``cwnd`` is infinite (rate-based). A timeout/NAK/trim multiplies the rate by
``loss_factor`` = 0.5, at most once per RTT (the paper leaves loss to the transport; our choice, so a lossy path
slows the flow — once per RTT as TCP cuts once per window: an incast's burst of drops NAKs every hole, and a cut
per NAK took the rate to its minimum, where δ per completion needs thousands of RTTs to recover).

Defaults (``TimelyParams.scaled``): α = 0.875, β = 0.8, T_low = 50 µs, T_high = 500 µs at min RTT 20 µs, δ = 10
Mbit/s at 10 Gbit/s, segment 16 KB, HAI ×5 after 5 (the paper's 10 Gbit/s settings, the same as the HPCC authors'
ns-3 TIMELY). BDP-mapped (``base.py``): T_low = 2.5 × base RTT, T_high = 25 × base RTT, δ = 0.1 % of the line rate,
segment = 0.64 BDP (16 KB of a 25 KB BDP) but at least one packet; min rate 0.1 % of the line rate. The
one-RTT bound on a completion is ours: per-segment updates give a flow increases and decreases in proportion to
its rate, so any rate split is a fixed point (TIMELY's known unfairness); at the paper's line-rate segment a
completion is ~0.65 RTT anyway, and an RTT bound gives slower flows the same δ per RTT — AIMD, which converges.
An increase is δ (or N·δ) per RTT since the last completion, not per completion: the paper's flows complete a
16–64 KB segment every few RTTs at any rate, but here a packet is 1–2 BDPs, so a flow below line rate completes
once per packet — every 30 ms at 5 % of a 10 Mbit/s link with 2 KB packets — and δ per completion took it seconds
to climb back after an incast's losses (at most 64 RTTs count, after an idle period).
The gradient is normalised by the base RTT parameter, not by each flow's own minimum sample (the paper's minRTT is
the path's propagation RTT): flows that learn it disagree — here a lone packet through full token buckets reads
0.1–0.3 ms, a packet behind its flow's own NIC 0.6 ms — and a flow with a smaller minimum reads every gradient
larger and cuts deeper (two flows settled at 3.4 and 10.3 Mbit/s on one 20 Mbit/s link).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pydantic import Field

from ....spec_types import Rate, Size, Time
from .base import MSS, CCConfig, ParamsBase, SenderCC, Track, bdp_bytes, check_positive

PAPER_RATE, PAPER_MIN_RTT = 10e9, 20e-6
MAX_RTTS_PER_UPDATE = 64        # an increase counts at most this many RTTs since the last completion


class TimelyConfig(CCConfig):
    """``traffic.timely``: TIMELY parameters."""
    KEYS = {"t_low": "t_low_s", "t_high": "t_high_s", "delta": "delta_bps", "segment": "segment_bytes",
            "min_rate": "min_rate_bps"}
    NS = frozenset({"t_low", "t_high"})
    base_rtt: Optional[Time] = None
    alpha: Optional[float] = Field(None, gt=0, le=1)
    beta: Optional[float] = Field(None, gt=0, le=1)
    t_low: Optional[Time] = None
    t_high: Optional[Time] = None
    delta: Optional[Rate] = None
    segment: Optional[Size] = None
    hai_after: Optional[int] = Field(None, ge=1, le=1000)
    hai_n: Optional[int] = Field(None, ge=1, le=1000)
    min_rate: Optional[Rate] = None
    loss_factor: Optional[float] = Field(None, gt=0, le=1)


@dataclass
class TimelyParams(ParamsBase):
    mss: int = MSS
    alpha: float = 0.875
    beta: float = 0.8
    t_low_s: float = 0.0
    t_high_s: float = 0.0
    delta_bps: float = 0.0
    segment_bytes: int = 0
    hai_after: int = 5
    hai_n: int = 5
    min_rate_bps: float = 0.0
    loss_factor: float = 0.5

    @classmethod
    def scaled(cls, line_rate_bps: float, base_rtt_s: float, **override) -> "TimelyParams":
        check_positive("timely", line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s)
        r = base_rtt_s / PAPER_MIN_RTT
        bdp = bdp_bytes(line_rate_bps, base_rtt_s)
        p = cls(line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s, t_low_s=50e-6 * r, t_high_s=500e-6 * r,
                delta_bps=10e6 / PAPER_RATE * line_rate_bps, segment_bytes=0,
                min_rate_bps=1e-3 * line_rate_bps)
        p._override(override)
        if override.get("segment_bytes") is None:
            p.segment_bytes = max(p.mss, round(16384 / (PAPER_RATE * PAPER_MIN_RTT / 8) * bdp))
        return p


class TimelySender(SenderCC):
    def __init__(self, p: TimelyParams, now: float):
        self.p = p
        self.cwnd = math.inf
        self.rate: Optional[float] = float(p.line_rate_bps)
        self.min_rtt = None                      # the measured minimum RTT (stats only: gradients use the base RTT)
        self.last_decrease = -math.inf
        self.last_loss = -math.inf
        self.loss_cuts = 0
        self.prev_rtt: Optional[float] = None
        self.rtt_diff = 0.0
        self.neg = 0
        self.pending = 0
        self.last_update = now
        self.regions = {"low": 0, "high": 0, "neg": 0, "pos": 0, "hai": 0}
        self.track = Track(self.rate)

    def _set(self, r: float) -> None:
        p = self.p
        self.rate = min(max(r, p.min_rate_bps), p.line_rate_bps)
        self.track(self.rate)

    def on_ack(self, now: float, *, acked_bytes: int, rtt_s: Optional[float], ecn: bool, inflight: int,
               hops=None) -> None:
        self.pending += acked_bytes
        if rtt_s is None or (self.pending < self.p.segment_bytes and now - self.last_update < rtt_s):
            return
        rtts = min((now - self.last_update) / rtt_s, MAX_RTTS_PER_UPDATE)
        self.pending = 0
        self.last_update = now
        self.update(rtt_s, now, max(1.0, rtts))

    def update(self, rtt: float, now: float = math.inf, rtts: float = 1.0) -> None:
        """One completion event with RTT sample ``rtt`` (the paper's Algorithm 1). Decreases at most once per
        RTT and by at most half (our bound: with the few updates per RTT of an emulated link, an unbounded
        gradient decrease collapses the rate to its minimum, where the ACK clock is too slow to recover).
        ``rtts``: the RTTs since the last completion (≥ 1); an increase is δ per RTT of them."""
        p = self.p
        self.min_rtt = rtt if self.min_rtt is None else min(self.min_rtt, rtt)
        if self.prev_rtt is None:
            self.prev_rtt = rtt
        new_diff = rtt - self.prev_rtt
        self.prev_rtt = rtt
        self.rtt_diff = (1 - p.alpha) * self.rtt_diff + p.alpha * new_diff
        gradient = self.rtt_diff / p.base_rtt_s
        if rtt < p.t_low_s:
            self.regions["low"] += 1
            self._set(self.rate + rtts * p.delta_bps)
            return
        if rtt > p.t_high_s:
            self.regions["high"] += 1
            self.neg = 0
            self._decrease(p.beta * (1 - p.t_high_s / rtt), rtt, now)
            return
        if gradient <= 0:
            self.neg += 1
            n = p.hai_n if self.neg >= p.hai_after else 1
            self.regions["hai" if n > 1 else "neg"] += 1
            self._set(self.rate + rtts * n * p.delta_bps)
        else:
            self.neg = 0
            self.regions["pos"] += 1
            self._decrease(p.beta * gradient, rtt, now)

    def _decrease(self, by: float, rtt: float, now: float) -> None:
        if now - self.last_decrease < rtt:
            return
        self.last_decrease = now if now != math.inf else self.last_decrease
        self._set(self.rate * (1 - min(by, 0.5)))

    def on_loss(self, now: float, kind: str) -> None:
        if kind not in ("trim", "nak", "timeout"):
            raise ValueError(f"loss kind must be trim, nak or timeout, got {kind!r}")
        self.neg = 0
        if now - self.last_loss < (self.prev_rtt or self.p.base_rtt_s):
            return                                # the same congestion event
        self.last_loss = now
        self.loss_cuts += 1
        self._set(self.rate * self.p.loss_factor)

    def stats(self) -> dict:
        return {**self.track.dict("rate"), **{f"timely_{k}": v for k, v in self.regions.items()},
                "timely_loss_cuts": self.loss_cuts}
