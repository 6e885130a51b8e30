"""Swift (Kumar et al., SIGCOMM 2020): AIMD on a delay target.

Target delay = base RTT + base_target + h × hops + flow scaling, where the flow-scaling term
α/√cwnd + β' (cwnd in packets, clamped to [0, fs_range]) is fs_range at cwnd = fs_min_cwnd and 0 at
fs_max_cwnd (α = fs_range / (1/√fs_min − 1/√fs_max), β' = −α/√fs_max): small windows — many flows sharing a
bottleneck — get a larger target, which keeps the queue stable as the flow count grows.

Per ACK: RTT < target → additive increase, ai packets per RTT (cwnd += ai · acked/cwnd, or ai · acked below one
packet); RTT ≥ target → multiplicative decrease cwnd × max(1 − β·(RTT − target)/RTT, 1 − max_mdf), at most once per
RTT. A NAK/trim (fast recovery) decreases by max_mdf (once per RTT); ``retx_reset`` consecutive timeouts reset the
window to ``min_cwnd``. The window may fall below one packet: then ``rate`` = cwnd / RTT paces the sender (the
engine lets one packet be in flight).

Defaults (``SwiftParams.scaled``): ai = 1 packet, β = 0.8, max_mdf = 0.5, fs_min_cwnd = 0.1 and fs_max_cwnd = 100
packets, min_cwnd = 0.01 packet, retx_reset = 5 (the paper's AIMD constants and flow-scaling range); the delay
allowances are BDP-mapped (``base.py``): base_target = 0.5 × base RTT of queueing over the unloaded path, h =
0.1 × base RTT per hop, fs_range = 2 × base RTT — the paper gives its target in µs for its own fabric, so these
ratios are our mapping of it; initial window 1 BDP, max window 4 BDP.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pydantic import Field, model_validator

from ....spec_types import Size, Time
from .base import MSS, CCConfig, ParamsBase, SenderCC, Track, bdp_bytes, check_positive


class SwiftConfig(CCConfig):
    """``traffic.swift``: Swift parameters; windows in bytes, fs_min/max_cwnd in packets."""
    KEYS = {"base_target": "base_target_s", "hop_scale": "hop_scale_s", "fs_range": "fs_range_s"}
    NS = frozenset({"base_target", "hop_scale", "fs_range"})
    base_rtt: Optional[Time] = None
    ai: Optional[float] = Field(None, gt=0)
    beta: Optional[float] = Field(None, gt=0, le=1)
    max_mdf: Optional[float] = Field(None, gt=0, lt=1)
    base_target: Optional[Time] = None
    hop_scale: Optional[Time] = None
    fs_range: Optional[Time] = None
    fs_min_cwnd: Optional[float] = Field(None, gt=0)
    fs_max_cwnd: Optional[float] = Field(None, gt=0)
    min_cwnd: Optional[Size] = None
    max_cwnd: Optional[Size] = None
    init_cwnd: Optional[Size] = None
    hops: Optional[int] = Field(None, ge=0, le=16)
    retx_reset: Optional[int] = Field(None, ge=1, le=100)

    @model_validator(mode="after")
    def _fs_order(self):
        if self.fs_min_cwnd is not None and self.fs_max_cwnd is not None and self.fs_min_cwnd >= self.fs_max_cwnd:
            raise ValueError(f"fs_max_cwnd: must be > fs_min_cwnd ({self.fs_min_cwnd}), got {self.fs_max_cwnd}")
        return self


@dataclass
class SwiftParams(ParamsBase):
    mss: int = MSS
    ai: float = 1.0
    beta: float = 0.8
    max_mdf: float = 0.5
    base_target_s: float = 0.0
    hop_scale_s: float = 0.0
    fs_range_s: float = 0.0
    fs_min_cwnd: float = 0.1
    fs_max_cwnd: float = 100.0
    min_cwnd: float = 0.01 * MSS
    max_cwnd: float = 0.0
    init_cwnd: float = 0.0
    hops: int = 1                   # used when the ACK carries no per-hop records
    retx_reset: int = 5

    @classmethod
    def scaled(cls, line_rate_bps: float, base_rtt_s: float, **override) -> "SwiftParams":
        check_positive("swift", line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s)
        bdp = bdp_bytes(line_rate_bps, base_rtt_s)
        p = cls(line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s, base_target_s=0.5 * base_rtt_s,
                hop_scale_s=0.1 * base_rtt_s, fs_range_s=2 * base_rtt_s, max_cwnd=4 * bdp, init_cwnd=bdp)
        return p._override(override)


class SwiftSender(SenderCC):
    def __init__(self, p: SwiftParams, now: float):
        self.p = p
        self.cwnd = float(min(max(p.init_cwnd, p.min_cwnd), p.max_cwnd))
        self.rate: Optional[float] = None
        self.base = p.base_rtt_s
        self.rtt = p.base_rtt_s
        self.last_decrease = -1e18
        self.retx = 0
        self.decreases = 0
        fmin, fmax = 1 / math.sqrt(p.fs_min_cwnd), 1 / math.sqrt(p.fs_max_cwnd)
        self.fs_alpha = p.fs_range_s / (fmin - fmax)
        self.fs_beta = -self.fs_alpha * fmax
        self.track = Track(self.cwnd)
        self.rate_track = Track(None)

    def target(self, hops: Optional[int] = None) -> float:
        p = self.p
        pk = max(self.cwnd / p.mss, 1e-9)
        fs = min(max(self.fs_alpha / math.sqrt(pk) + self.fs_beta, 0.0), p.fs_range_s)
        return self.base + p.base_target_s + p.hop_scale_s * (p.hops if hops is None else hops) + fs

    def _can_decrease(self, now: float) -> bool:
        return now - self.last_decrease >= self.rtt

    def _decrease(self, now: float, factor: float) -> None:
        self.cwnd *= factor
        self.last_decrease = now
        self.decreases += 1

    def _clamp(self) -> None:
        p = self.p
        self.cwnd = min(max(self.cwnd, p.min_cwnd), p.max_cwnd)
        self.rate = self.cwnd * 8 / self.rtt if self.cwnd < p.mss else None
        self.track(self.cwnd)
        self.rate_track(self.rate)

    def on_ack(self, now: float, *, acked_bytes: int, rtt_s: Optional[float], ecn: bool, inflight: int,
               hops=None) -> None:
        p = self.p
        self.retx = 0
        if rtt_s is None:
            return
        self.rtt = rtt_s
        target = self.target(len(hops) if hops else None)
        if rtt_s < target:
            if self.cwnd >= p.mss:
                self.cwnd += p.ai * p.mss * acked_bytes / self.cwnd
            else:
                self.cwnd += p.ai * acked_bytes
        elif self._can_decrease(now):
            self._decrease(now, max(1 - p.beta * (rtt_s - target) / rtt_s, 1 - p.max_mdf))
        self._clamp()

    def on_loss(self, now: float, kind: str) -> None:
        p = self.p
        if kind == "timeout":
            self.retx += 1
            if self.retx >= p.retx_reset:
                self.cwnd = p.min_cwnd
                self.last_decrease = now
                self.decreases += 1
            elif self._can_decrease(now):
                self._decrease(now, 1 - p.max_mdf)
        elif kind in ("trim", "nak"):
            if self._can_decrease(now):
                self._decrease(now, 1 - p.max_mdf)
        else:
            raise ValueError(f"loss kind must be trim, nak or timeout, got {kind!r}")
        self._clamp()

    def stats(self) -> dict:
        return {**self.track.dict("cwnd"), **self.rate_track.dict("rate"), "swift_decreases": self.decreases}
