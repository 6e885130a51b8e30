"""HPCC (Li et al., SIGCOMM 2019): a window computed from the switches' INT records.

Per ACK, for every hop i with the previous record L[i] of this flow:
  txRate_i = (tx_bytes − L[i].tx_bytes) / (ts − L[i].ts)
  u_i      = (min(qlen, L[i].qlen) − a) / (B_i·T) + txRate_i / B_i     (B_i the link rate, T the base RTT)
the bottleneck is the hop with the largest u_i, τ its record interval; U ← (1 − τ/T)·U + (τ/T)·u (τ ≤ T).
Window: U ≥ η or inc_stage ≥ max_stage → W = Wc/(U/η) + W_AI (multiplicative towards η, the stage resets);
else W = Wc + W_AI (additive, stage + 1). The reference window Wc takes the new W only once per RTT — on the
first ACK past the sequence that was next to send at the last update (``acked`` total ≥ the mark), the
paper's per-ACK/per-RTT split: every ACK reacts, but the base of the reaction moves once per RTT. W and Wc are
kept ≥ ``min_cwnd`` (one packet): a reference window below it would take 1/W_AI RTTs to recover.
The allowance a (``qlen_allowance``, default one packet, 0 = the paper's rule; the queue term never goes below 0)
is ours: a record's queue is what arrived behind its packet while it was serialised, others' packets — at the
paper's hundreds of packets per BDP that is noise, at this testbed's 5–25 packets per BDP one packet is 4–16 % of
B·T, and counted as queue it pushes the flow with fewer packets (which collides with the others' packets more
often than they with its) below its share for good; with it two flows converge to Jain 1.0 in the model.
cwnd = W, rate = W/T (HPCC paces at the window's rate). Loss is left to the transport (the window already
reflects the queue); a timeout resets W to W_init · (1 − η) as a floor against a stale window (our choice).

Defaults (``HpccParams.scaled``): η = 0.95, max_stage = 5 (the paper's), W_init = B·T (one BDP: start at line
rate), W_AI = W_init·(1 − η)/N with N = 20 expected concurrent flows (the paper's rule for W_AI; N is our
choice), T = the base RTT. B and T here are the emulated link rate and the measured base RTT: the rule is
already BDP-relative, so nothing else scales.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from typing import Annotated

from pydantic import Field

from .... import units
from ....spec_types import Size, Time, unit
from .base import MSS, CCConfig, ParamsBase, SenderCC, Track, bdp_bytes, check_positive


class HpccConfig(CCConfig):
    """``traffic.hpcc``: HPCC parameters."""
    base_rtt: Optional[Time] = None
    eta: Optional[float] = Field(None, gt=0, le=1)
    max_stage: Optional[int] = Field(None, ge=0, le=100)
    w_init: Optional[Size] = None
    w_ai: Optional[float] = Field(None, gt=0)        # bytes per RTT
    expected_flows: Optional[int] = Field(None, ge=1, le=100000)
    qlen_allowance: Optional[Annotated[int, *unit(units.size_bytes), Field(ge=0)]] = None   # bytes of each INT
                                              # queue reading not counted (None = one packet; 0 = the paper's rule)


@dataclass
class HpccParams(ParamsBase):
    mss: int = MSS
    eta: float = 0.95
    max_stage: int = 5
    w_init: float = 0.0
    w_ai: float = 0.0
    expected_flows: int = 20
    min_cwnd: float = MSS
    qlen_allowance: int = -1         # bytes; -1 = one packet (mss)

    @classmethod
    def scaled(cls, line_rate_bps: float, base_rtt_s: float, **override) -> "HpccParams":
        check_positive("hpcc", line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s)
        p = cls(line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s)._override(override)
        if override.get("w_init") is None:
            p.w_init = bdp_bytes(line_rate_bps, base_rtt_s)
        if p.qlen_allowance < 0:
            p.qlen_allowance = p.mss
        if override.get("w_ai") is None:
            p.w_ai = p.w_init * (1 - p.eta) / p.expected_flows
        return p


class HpccSender(SenderCC):
    def __init__(self, p: HpccParams, now: float):
        self.p = p
        self.T = p.base_rtt_s
        self.wc = self.cwnd = float(p.w_init)
        self.rate: Optional[float] = self.cwnd * 8 / self.T
        self.U = 0.0
        self.inc_stage = 0
        self.last: Optional[tuple] = None
        self.acked = 0
        self.update_mark = 0
        self.updates = 0
        self.track = Track(self.cwnd)
        self.u_track = Track(None)

    def measure(self, hops) -> float:
        """Update and return U from ``hops`` against the previous records (the paper's MeasureInflight)."""
        T = self.T
        if self.last is not None and len(self.last) == len(hops):
            u, tau = 0.0, None
            for h, old in zip(hops, self.last):
                dt = (h.ts_ns - old.ts_ns) / 1e9
                if dt <= 0:
                    continue
                b = h.link_rate_bps / 8
                sent = h.tx_bytes - old.tx_bytes
                if sent < 0:                            # INT carries the counter's low 32 bits
                    sent += 1 << 32
                tx_rate = sent / dt
                q = max(0, min(h.qlen_bytes, old.qlen_bytes) - self.p.qlen_allowance)
                ui = q / (b * T) + tx_rate / b
                if tau is None or ui > u:
                    u, tau = ui, dt
            if tau is not None:
                tau = min(tau, T)
                self.U = (1 - tau / T) * self.U + tau / T * u
                self.u_track(self.U)
        self.last = tuple(hops)
        return self.U

    def window(self, U: float, update_wc: bool) -> float:
        """The paper's ComputeWind."""
        p = self.p
        if U >= p.eta or self.inc_stage >= p.max_stage:
            w = max(self.wc / (U / p.eta) + p.w_ai, p.min_cwnd)
            if update_wc:
                self.inc_stage = 0
                self.wc = w
        else:
            w = max(self.wc + p.w_ai, p.min_cwnd)
            if update_wc:
                self.inc_stage += 1
                self.wc = w
        return w

    def on_ack(self, now: float, *, acked_bytes: int, rtt_s: Optional[float], ecn: bool, inflight: int,
               hops=None) -> None:
        self.acked += acked_bytes
        if not hops:
            return
        first = self.last is None
        U = self.measure(hops)
        if first:
            return
        update = self.acked > self.update_mark
        if update:
            self.update_mark = self.acked + inflight
            self.updates += 1
        w = self.window(U, update)
        self.cwnd = w
        self.rate = self.cwnd * 8 / self.T
        self.track(self.cwnd)

    def on_loss(self, now: float, kind: str) -> None:
        if kind not in ("trim", "nak", "timeout"):
            raise ValueError(f"loss kind must be trim, nak or timeout, got {kind!r}")
        if kind == "timeout":
            self.wc = self.cwnd = max(self.p.w_init * (1 - self.p.eta), self.p.min_cwnd)
            self.rate = self.cwnd * 8 / self.T
            self.inc_stage = 0
            self.track(self.cwnd)

    def stats(self) -> dict:
        return {**self.track.dict("cwnd"), **self.u_track.dict("hpcc_u"), "hpcc_wc_updates": self.updates}
