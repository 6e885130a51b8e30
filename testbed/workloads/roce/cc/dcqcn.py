"""DCQCN (Zhu et al., SIGCOMM 2015): the reaction point (sender rate control) and the notification point (CE → CNP
pacing), pure logic driven by explicit times so it can be unit-tested and simulated.

Reference parameters (the paper, 40 Gbit/s): g = 1/256, CNP interval 50 µs, rate-increase timer 55 µs, α-update
timer 55 µs, byte counter 10 MB, fast-recovery steps F = 5, additive increase R_AI = 40 Mbit/s, hyper increase
R_HAI = 10 × R_AI (the paper leaves R_HAI to the implementation; 10× is our choice), minimum rate 0.1% of line rate.

Scaling to the emulated link rate (``scaled``): the emulation is the 40 Gbit/s network slowed down uniformly by
k = 40 Gbit/s / rate — every time × k, every rate ÷ k, every byte count unchanged (the byte counter, and the switch's
Kmin/Kmax in bytes). Such a slow-down keeps every ratio of the control loop (bytes per timer period, rate steps as
a fraction of line rate, CNPs per queue drain time) except the fixed kernel/Python path delay, which gets
relatively smaller. At 100 Mbit/s (k = 400): CNP interval 20 ms, timers 22 ms, R_AI 100 kbit/s.
Any parameter can be set explicitly in the scenario (``traffic.dcqcn``) instead.

DCQCN is CNP-driven: the reaction point is a ``SenderCC`` whose ``on_cnp`` cuts the rate, ``on_sent`` feeds the
byte counter and ``advance`` runs the timers; its ACK and loss hooks are the default no-ops. The receiver's
notification point is the one per-CC receiver part the engine knows by name (rc.py's Responder).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

from pydantic import Field

from ....spec_types import Rate, Size, Time
from .base import CCConfig, SenderCC

PAPER_RATE_BPS = 40_000_000_000


class DcqcnConfig(CCConfig):
    """``traffic.dcqcn``: DCQCN parameters; None = the paper's value scaled to the host link rate."""
    KEYS = {"cnp_interval": "cnp_interval_s", "rate_timer": "rate_timer_s", "alpha_timer": "alpha_timer_s",
            "rate_ai": "rate_ai_bps", "rate_hai": "rate_hai_bps", "min_rate": "min_rate_bps"}
    NS = frozenset({"cnp_interval", "rate_timer", "alpha_timer"})
    g: Optional[float] = Field(None, gt=0, le=1)          # α's gain
    cnp_interval: Optional[Time] = None                   # at most one CNP per QP this often
    rate_timer: Optional[Time] = None                     # rate-increase timer
    alpha_timer: Optional[Time] = None                    # α-decay timer
    byte_counter: Optional[Size] = None                   # a rate-increase step per this many bytes sent
    fast_recovery: Optional[int] = Field(None, ge=0, le=100)   # steps towards the target before increasing it
    rate_ai: Optional[Rate] = None                        # additive increase
    rate_hai: Optional[Rate] = None                       # hyper increase
    min_rate: Optional[Rate] = None


@dataclass
class DcqcnParams:
    line_rate_bps: float
    g: float = 1 / 256
    cnp_interval_s: float = 50e-6
    rate_timer_s: float = 55e-6
    alpha_timer_s: float = 55e-6
    byte_counter: int = 10_000_000
    fast_recovery: int = 5
    rate_ai_bps: float = 40e6
    rate_hai_bps: float = 400e6
    min_rate_bps: float = 40e6

    @classmethod
    def scaled(cls, line_rate_bps: float, **override) -> "DcqcnParams":
        k = PAPER_RATE_BPS / line_rate_bps
        p = cls(line_rate_bps=line_rate_bps, cnp_interval_s=50e-6 * k, rate_timer_s=55e-6 * k,
                alpha_timer_s=55e-6 * k, rate_ai_bps=40e6 / k, rate_hai_bps=400e6 / k, min_rate_bps=40e6 / k)
        for key, v in override.items():
            if v is not None:
                setattr(p, key, v)
        return p

    def to_dict(self) -> dict:
        return asdict(self)


class ReactionPoint(SenderCC):
    """Per-QP sender state. ``rate`` (bit/s) is the current rate Rc; call ``advance(now)`` before reading it,
    ``on_bytes(n, now)`` (``on_sent``) after sending, ``on_cnp(now)`` when a CNP arrives."""

    def __init__(self, p: DcqcnParams, now: float):
        self.p = p
        self.cwnd = math.inf                         # rate-based only
        self.rate = self.target = float(p.line_rate_bps)
        self.alpha = 1.0
        self.t_next = now + p.rate_timer_s          # rate-increase timer
        self.a_next = now + p.alpha_timer_s         # α decay timer
        self.bytes = 0
        self.t_count = self.b_count = 0
        self.cnps = 0
        self.min_rate_seen = self.rate

    def on_cnp(self, now: float) -> None:
        p = self.p
        self.advance(now)
        self.cnps += 1
        self.target = self.rate
        self.rate = max(p.min_rate_bps, self.rate * (1 - self.alpha / 2))
        self.alpha = (1 - p.g) * self.alpha + p.g
        self.t_count = self.b_count = 0
        self.bytes = 0
        self.t_next = now + p.rate_timer_s
        self.a_next = now + p.alpha_timer_s
        self.min_rate_seen = min(self.min_rate_seen, self.rate)

    def _increase(self) -> None:
        p = self.p
        f = p.fast_recovery
        if max(self.t_count, self.b_count) < f:
            pass                                     # fast recovery: towards the target only
        elif min(self.t_count, self.b_count) > f:    # hyper increase
            self.target += (min(self.t_count, self.b_count) - f) * p.rate_hai_bps
        else:                                        # additive increase
            self.target += p.rate_ai_bps
        self.target = min(self.target, p.line_rate_bps)
        self.rate = min(p.line_rate_bps, (self.target + self.rate) / 2)

    def advance(self, now: float) -> None:
        p = self.p
        while self.a_next <= now:
            self.alpha *= (1 - p.g)            # a whole period without a CNP (on_cnp restarts the timer)
            self.a_next += p.alpha_timer_s
        while self.t_next <= now:
            self.t_count += 1
            self.t_next += p.rate_timer_s
            self._increase()

    def on_bytes(self, n: int, now: float) -> None:
        self.bytes += n
        while self.bytes >= self.p.byte_counter:
            self.bytes -= self.p.byte_counter
            self.b_count += 1
            self._increase()

    def on_sent(self, now: float, wire_bytes: int) -> None:
        self.on_bytes(wire_bytes, now)

    def stats(self) -> dict:
        return {"dcqcn_cnps": self.cnps, "dcqcn_rate_final": self.rate, "dcqcn_alpha": self.alpha,
                "dcqcn_rate_min": self.min_rate_seen}


#: the SenderCC name of DCQCN's reaction point
DcqcnSender = ReactionPoint


class NotificationPoint:
    """Per-QP receiver state: at most one CNP per ``interval`` however many CE-marked packets arrive."""

    def __init__(self, interval_s: float):
        self.interval = interval_s
        self.last = -1e18
        self.ce = 0
        self.cnps = 0

    def on_ce(self, now: float) -> bool:
        """A CE-marked packet arrived; True = send a CNP now."""
        self.ce += 1
        if now - self.last >= self.interval:
            self.last = now
            self.cnps += 1
            return True
        return False


def jain(xs) -> float:
    xs = list(xs)
    s = sum(xs)
    q = sum(x * x for x in xs)
    return s * s / (len(xs) * q) if q else 0.0
