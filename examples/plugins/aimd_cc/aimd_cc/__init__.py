"""AIMD on a congestion window, as a fabric-testbed plugin: the smallest complete example of the interface.

Per ACK without congestion the window grows by ``ai`` MSS per RTT (``ai · mss · acked / cwnd``); an ACK that
echoes a CE mark, a NAK, a trim or a timeout multiplies it by ``beta``, at most once per RTT (one congestion
event per round trip, as TCP Reno counts them). The window stays within [min_cwnd, max_cwnd].
"""
from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from testbed.workloads.roce.cc import MSS, CCConfig, CongestionControl, SenderCC, Size, Time, Track, bdp_bytes


class AimdConfig(CCConfig):
    """``traffic.cc_params`` of ``cc: aimd``; None = the default scaled to the run (see ``Aimd.scale``)."""
    base_rtt: Optional[Time] = None                   # None = the engine's estimate from the topology
    ai: Optional[float] = Field(None, gt=0, le=16)    # MSS added per RTT
    beta: Optional[float] = Field(None, gt=0, lt=1)   # the window × beta on congestion
    init_cwnd: Optional[Size] = None                  # bytes; default 1 BDP
    min_cwnd: Optional[Size] = None                   # bytes; default 1 MSS
    max_cwnd: Optional[Size] = None                   # bytes; default 4 BDP

    @model_validator(mode="after")
    def _order(self):
        if self.min_cwnd is not None and self.max_cwnd is not None and self.min_cwnd > self.max_cwnd:
            raise ValueError(f"max_cwnd: must be ≥ min_cwnd ({self.min_cwnd}), got {self.max_cwnd}")
        return self


class AimdSender(SenderCC):
    """One flow's window."""

    def __init__(self, p: dict, now: float):
        self.p = p
        self.cwnd = float(min(max(p["init_cwnd"], p["min_cwnd"]), p["max_cwnd"]))
        self.rate = None                              # window-limited, not paced
        self.rtt = p["base_rtt_s"]
        self.last_cut = -1e18
        self.cuts = 0
        self.track = Track(self.cwnd)

    def _cut(self, now: float) -> None:
        if now - self.last_cut < self.rtt:            # the same congestion event
            return
        self.last_cut = now
        self.cuts += 1
        self.cwnd = max(self.p["min_cwnd"], self.cwnd * self.p["beta"])
        self.track(self.cwnd)

    def on_ack(self, now, *, acked_bytes, rtt_s, ecn, inflight, hops=None) -> None:
        if rtt_s is not None:
            self.rtt = rtt_s
        if ecn:
            self._cut(now)
            return
        p = self.p
        self.cwnd = min(p["max_cwnd"], self.cwnd + p["ai"] * p["mss"] * acked_bytes / self.cwnd)
        self.track(self.cwnd)

    def on_loss(self, now, kind) -> None:
        self._cut(now)

    def stats(self) -> dict:
        return {**self.track.dict("cwnd"), "aimd_cuts": self.cuts}


class Aimd(CongestionControl):
    """``traffic.cc: aimd``."""
    name = "aimd"
    params_model = AimdConfig

    def scale(self, line_rate_bps, base_rtt_s, params, mss):
        bdp = bdp_bytes(line_rate_bps, base_rtt_s)
        d = {"mss": mss, "base_rtt_s": base_rtt_s, "ai": 1.0, "beta": 0.5, "init_cwnd": bdp,
             "min_cwnd": mss, "max_cwnd": 4 * bdp}
        d.update({k: v for k, v in params.model_dump().items() if v is not None and k != "base_rtt"})
        return d

    def make(self, params, now):
        return AimdSender(params, now)


__all__ = ["Aimd", "AimdConfig", "AimdSender", "MSS"]
