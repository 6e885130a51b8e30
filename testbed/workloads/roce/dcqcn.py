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
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

PAPER_RATE_BPS = 40_000_000_000


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


class ReactionPoint:
    """Per-QP sender state. ``rate`` (bit/s) is the current rate Rc; call ``advance(now)`` before reading it,
    ``on_bytes(n, now)`` after sending, ``on_cnp(now)`` when a CNP arrives."""

    def __init__(self, p: DcqcnParams, now: float):
        self.p = p
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
