"""NSCC (Ultra Ethernet transport, network-signal congestion control): a sender window steered by ECN and the
queueing delay (RTT − base RTT) together, four cases per ACK:

  ECN  delay < target   → no change: one marked packet on an otherwise short path is a path problem (the path
                          selector moves away from it), not a reason to slow the whole flow down
  ECN  delay ≥ target   → multiplicative decrease, cwnd × max(1 − γ·(delay − target)/delay, 1 − max_md),
                          at most once per RTT
  —    delay < target   → proportional increase, cwnd += α · acked · (target − delay)/target: fast while far below
                          the target, vanishing at it
  —    delay ≥ target   → fair increase, cwnd += fi · acked / cwnd: the same fi bytes per RTT for every flow,
                          which is what makes competing flows converge to equal windows

Quick adapt on a trim, NAK or timeout (at most once per RTT): the window drops to what was actually acknowledged
over the last RTT (the measured throughput × RTT), never below ``min_cwnd`` — a loss says the window was too big,
the delivered bytes say by how much.

Defaults (``NsccParams.scaled``), mapped by the BDP (see ``base.py``): target queueing delay 0.75 × base RTT
(UEC's reference settings tie the target to the base RTT), initial window 1 BDP (start at line rate), max window
1.5 BDP, min window 1 packet, α = 1 (at zero queueing delay the window doubles per RTT), fi = 0.1 BDP per RTT,
γ = 0.8, max_md = 0.5 (the decrease gain and bound Swift also uses). Our choices where the spec leaves a value to
the implementation; each is a ``traffic.nscc`` key.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Optional

from pydantic import Field

from ....spec_types import Size, Time
from .base import MSS, CCConfig, ParamsBase, SenderCC, Track, bdp_bytes, check_positive


class NsccConfig(CCConfig):
    """``traffic.nscc``: NSCC parameters; None = the scaled default (docs/transport.md)."""
    KEYS = {"target_qdelay": "target_qdelay_s", "fi": "fi_bytes"}
    NS = frozenset({"target_qdelay"})
    base_rtt: Optional[Time] = None           # None = estimated from the topology
    target_qdelay: Optional[Time] = None
    init_cwnd: Optional[Size] = None
    min_cwnd: Optional[Size] = None
    max_cwnd: Optional[Size] = None
    alpha: Optional[float] = Field(None, gt=0)
    fi: Optional[Size] = None                 # fair increase, bytes per RTT
    gamma: Optional[float] = Field(None, gt=0, le=1)
    max_md: Optional[float] = Field(None, gt=0, lt=1)


@dataclass
class NsccParams(ParamsBase):
    mss: int = MSS
    target_qdelay_s: float = 0.0
    init_cwnd: float = 0.0
    min_cwnd: float = MSS
    max_cwnd: float = 0.0
    alpha: float = 1.0
    fi_bytes: float = 0.0
    gamma: float = 0.8
    max_md: float = 0.5

    @classmethod
    def scaled(cls, line_rate_bps: float, base_rtt_s: float, **override) -> "NsccParams":
        check_positive("nscc", line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s)
        bdp = bdp_bytes(line_rate_bps, base_rtt_s)
        p = cls(line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s, target_qdelay_s=0.75 * base_rtt_s,
                init_cwnd=bdp, max_cwnd=1.5 * bdp, fi_bytes=0.1 * bdp)
        p._override(override)
        if override.get("min_cwnd") is None:
            p.min_cwnd = p.mss
        return p


class NsccSender(SenderCC):
    """Per-flow NSCC window; ``rate`` is None (window-limited, sent at line rate)."""

    def __init__(self, p: NsccParams, now: float):
        self.p = p
        self.cwnd = float(min(max(p.init_cwnd, p.min_cwnd), p.max_cwnd))
        self.rate: Optional[float] = None
        self.base = p.base_rtt_s
        self.last_rtt = p.base_rtt_s
        self.last_md = self.last_qa = -1e18
        self.acked: collections.deque = collections.deque()     # (time, bytes) of the last RTT
        self.acked_sum = 0
        self.cases = {"pi": 0, "fi": 0, "hold": 0, "md": 0, "qa": 0}
        self.track = Track(self.cwnd)

    def _clamp(self) -> None:
        self.cwnd = min(max(self.cwnd, self.p.min_cwnd), self.p.max_cwnd)
        self.track(self.cwnd)

    def _window(self, now: float) -> None:
        while self.acked and self.acked[0][0] < now - self.last_rtt:
            self.acked_sum -= self.acked.popleft()[1]

    def on_ack(self, now: float, *, acked_bytes: int, rtt_s: Optional[float], ecn: bool, inflight: int,
               hops=None) -> None:
        p = self.p
        self.acked.append((now, acked_bytes))
        self.acked_sum += acked_bytes
        if rtt_s is None:
            return
        self.last_rtt = rtt_s
        self._window(now)
        delay = rtt_s - self.base
        target = p.target_qdelay_s
        if ecn and delay >= target:
            if now - self.last_md >= rtt_s and delay > 0:
                self.cwnd *= max(1 - p.gamma * (delay - target) / delay, 1 - p.max_md)
                self.last_md = now
                self.cases["md"] += 1
        elif ecn:
            self.cases["hold"] += 1
        elif delay < target:
            self.cwnd += p.alpha * acked_bytes * (target - delay) / target
            self.cases["pi"] += 1
        else:
            self.cwnd += p.fi_bytes * acked_bytes / self.cwnd
            self.cases["fi"] += 1
        self._clamp()

    def on_loss(self, now: float, kind: str) -> None:
        if kind not in ("trim", "nak", "timeout"):
            raise ValueError(f"loss kind must be trim, nak or timeout, got {kind!r}")
        if now - self.last_qa < self.last_rtt:
            return
        self._window(now)
        self.cwnd = min(self.cwnd, float(self.acked_sum))
        self.last_qa = self.last_md = now
        self.cases["qa"] += 1
        self._clamp()

    def stats(self) -> dict:
        return {**self.track.dict("cwnd"), **{f"nscc_{k}": v for k, v in self.cases.items()}}
