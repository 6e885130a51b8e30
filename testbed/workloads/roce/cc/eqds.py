"""EQDS (Olteanu et al., NSDI 2022) receiver-driven credit, as UEC's receiver-credit CC uses it.

Receiver: one ``CreditPacer`` per receiving host, shared by all its senders. Senders are registered with their
remaining demand (bytes still to be credited; None = unbounded until ``stop``). The pacer issues credit in
quanta of ``credit_bytes`` round robin over the senders with demand, spaced so that credit leaves at
``link_rate × overcommit``: quantum q is due q·8/(rate) after the previous one (``next_time``); idle periods
(no sender with demand) are not banked. A grant takes at most the sender's remaining demand, so a sender is
never credited beyond what it declared. ``overcommit`` (default 1.02) makes up for credit that is issued but
never turns into a packet in time — the short last packet of a message, a grant crossing a sender's finish — so
the receiver link does not idle; a cap on outstanding credit (granted but its data not yet arrived, default 1 BDP,
lowered by ``on_data``) keeps that 2 % from building a queue when every credit is used.

Sender: ``EqdsSender(unsolicited_bytes)`` may send one unsolicited window (default 1 BDP, EQDS's speculative
first RTT) and after that only against credit: ``may_send(n)``, ``consume(n)``, ``on_credit(n, now)``. Unused
credit: each grant expires ``credit_ttl`` (default 2 base RTTs) after it arrived — credit is a permit for *now*,
banking it would let a sender burst later into a queue the pacer did not plan for; expired and, at the end,
left-over credit is counted (``credit_expired``, ``credit_returned``) so the waste is visible in flows.csv.
``NsccEqds`` puts both gates in front of the sender (``nscc+eqds``): a packet needs window and credit.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Hashable, Optional

from pydantic import Field

from ....spec_types import Size, Time
from .base import MSS, CCConfig, ParamsBase, SenderCC, bdp_bytes, check_positive
from .nscc import NsccParams, NsccSender


class EqdsConfig(CCConfig):
    """``traffic.eqds``: EQDS receiver-credit parameters."""
    KEYS = {"credit": "credit_bytes", "unsolicited": "unsolicited_bytes", "credit_ttl": "credit_ttl_s"}
    NS = frozenset({"credit_ttl"})
    base_rtt: Optional[Time] = None
    credit: Optional[Size] = None             # bytes per grant
    unsolicited: Optional[Size] = None        # the first window a sender may send without credit
    overcommit: Optional[float] = Field(None, ge=1, le=2)
    credit_ttl: Optional[Time] = None
    max_outstanding: Optional[Size] = None


@dataclass
class EqdsParams(ParamsBase):
    mss: int = MSS
    credit_bytes: int = MSS
    unsolicited_bytes: int = 0
    overcommit: float = 1.02
    credit_ttl_s: float = 0.0
    max_outstanding: int = 0

    @classmethod
    def scaled(cls, line_rate_bps: float, base_rtt_s: float, **override) -> "EqdsParams":
        check_positive("eqds", line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s)
        bdp = int(math.ceil(bdp_bytes(line_rate_bps, base_rtt_s)))
        p = cls(line_rate_bps=line_rate_bps, base_rtt_s=base_rtt_s, unsolicited_bytes=bdp,
                credit_ttl_s=2 * base_rtt_s, max_outstanding=bdp)._override(override)
        if override.get("credit_bytes") is None:
            p.credit_bytes = p.mss
        if override.get("max_outstanding") is None:
            # 4 BDP: granted credit also waits in the receiver's own queue and the engine's receive path, so
            # the credit loop is longer than the base RTT; measured on a 16→1 incast at 20 Mbit/s, a 1-BDP cap
            # left the link under-driven (1.16–1.20 × ideal), 4 BDP reached 1.12
            p.max_outstanding = max(OUTSTANDING_BDPS * bdp, p.credit_bytes)
        return p


OUTSTANDING_BDPS = 4
#: how late a pacer may still catch up on its grants: the engine's receive thread runs on a shared 2-core
#: machine and wakes late — a few slots (a 1 KB slot is 0.4 ms at 20 Mbit/s), or tens of ms when the
#: hypervisor steals the core; credit lost to each late wake-up left a 16→1 incast's link under-driven
#: (1.12–1.18 × ideal catching up 1 slot). The outstanding cap bounds the burst a catch-up releases.
CATCH_UP_S = 0.02


class CreditPacer:
    """Receiver-side credit pacer shared by every sender of one receiver."""

    def __init__(self, link_rate_bps: float, *, credit_bytes: int = MSS, overcommit: float = 1.02,
                 max_outstanding: Optional[int] = None):
        check_positive("eqds", link_rate_bps=link_rate_bps, credit_bytes=credit_bytes, overcommit=overcommit)
        self.rate = link_rate_bps * overcommit
        self.quantum = int(credit_bytes)
        self.cap = max_outstanding
        self.demand: "collections.OrderedDict[Hashable, Optional[int]]" = collections.OrderedDict()
        self.outstanding = 0
        self.t_next: Optional[float] = None
        self.granted: dict = collections.defaultdict(int)

    @classmethod
    def from_params(cls, p: EqdsParams) -> "CreditPacer":
        return cls(p.line_rate_bps, credit_bytes=p.credit_bytes, overcommit=p.overcommit,
                   max_outstanding=p.max_outstanding)

    def register(self, key: Hashable, demand: Optional[int]) -> None:
        """Sender ``key`` wants ``demand`` more bytes credited (added to what it still wanted; None = unbounded)."""
        old = self.demand.get(key, 0)
        self.demand[key] = None if (demand is None or old is None) else old + int(demand)

    def stop(self, key: Hashable) -> None:
        self.demand.pop(key, None)

    def on_data(self, nbytes: int) -> None:
        """Credited data arrived: it is no longer outstanding."""
        self.outstanding = max(0, self.outstanding - int(nbytes))

    def _active(self) -> bool:
        return any(d is None or d > 0 for d in self.demand.values())

    def next_time(self) -> Optional[float]:
        """When the next grant is due — a time ≤ now means at once (after an idle period it is 0.0); None: no
        sender has demand, or the outstanding cap holds credit back until ``on_data``."""
        if not self._active() or (self.cap is not None and self.outstanding >= self.cap):
            return None
        return 0.0 if self.t_next is None else self.t_next

    def next_grant(self, now: float) -> Optional[tuple]:
        """(sender_key, bytes) if a grant is due at ``now``, else None; call until None."""
        if not self._active():
            self.t_next = None                           # idle: nothing banked
            return None
        if self.cap is not None and self.outstanding >= self.cap:
            return None
        slot = self.quantum * 8 / self.rate
        late = max(CATCH_UP_S, slot)
        if self.t_next is None or self.t_next < now - late:
            # later than that (the receive thread descheduled that long): the rest is lost, no bigger burst
            self.t_next = now if self.t_next is None else now - late
        if self.t_next > now + 1e-12:
            return None
        for _ in range(len(self.demand)):
            key, d = next(iter(self.demand.items()))
            self.demand.move_to_end(key)                 # round robin: the next call starts at the next sender
            if d is not None and d <= 0:
                continue
            n = self.quantum if d is None else min(self.quantum, d)
            if d is not None:
                self.demand[key] = d - n
            self.outstanding += n
            self.granted[key] += n
            self.t_next += n * 8 / self.rate
            return key, n
        return None


class EqdsSender(SenderCC):
    """Sender-side gate: one unsolicited window, then credit only. ``cwnd`` is infinite, ``rate`` None."""

    def __init__(self, unsolicited_bytes: int, credit_ttl_s: float = math.inf):
        self.unsolicited = int(unsolicited_bytes)
        self.ttl = credit_ttl_s
        self.credits: collections.deque = collections.deque()    # [expiry, bytes]
        self.cwnd = math.inf
        self.rate: Optional[float] = None
        self.received = self.used = self.expired = self.returned = 0
        self.unsolicited_sent = 0

    @classmethod
    def from_params(cls, p: EqdsParams) -> "EqdsSender":
        return cls(p.unsolicited_bytes, p.credit_ttl_s)

    def _expire(self, now: Optional[float]) -> None:
        if now is None:
            return
        while self.credits and self.credits[0][0] <= now:
            self.expired += self.credits.popleft()[1]

    def credit(self, now: Optional[float] = None) -> int:
        self._expire(now)
        return sum(c[1] for c in self.credits)

    def on_credit(self, nbytes: int, now: float = 0.0) -> None:
        self.received += int(nbytes)
        self.credits.append([now + self.ttl, int(nbytes)])

    def may_send(self, nbytes: int, now: Optional[float] = None) -> bool:
        return nbytes <= self.unsolicited + self.credit(now)

    def consume(self, nbytes: int, now: Optional[float] = None) -> None:
        if not self.may_send(nbytes, now):
            raise ValueError(f"eqds: {nbytes} bytes sent without credit")
        take = min(self.unsolicited, nbytes)
        self.unsolicited -= take
        self.unsolicited_sent += take
        rest = nbytes - take
        self.used += rest
        while rest:
            c = self.credits[0]
            k = min(c[1], rest)
            c[1] -= k
            rest -= k
            if not c[1]:
                self.credits.popleft()

    def finish(self) -> int:
        """The flow is done: drop (return) the credit left; returns how much."""
        left = sum(c[1] for c in self.credits)
        self.returned += left
        self.credits.clear()
        return left

    # SenderCC interface: credit is the only gate, congestion signals do not change it
    def on_ack(self, now, *, acked_bytes, rtt_s, ecn, inflight, hops=None) -> None:
        return None

    def on_loss(self, now: float, kind: str) -> None:
        if kind not in ("trim", "nak", "timeout"):
            raise ValueError(f"loss kind must be trim, nak or timeout, got {kind!r}")

    def stats(self) -> dict:
        return {"credit_received": self.received, "credit_used": self.used, "credit_expired": self.expired,
                "credit_returned": self.returned, "unsolicited_sent": self.unsolicited_sent}


class NsccEqds(SenderCC):
    """``nscc+eqds``: the NSCC window and the EQDS credit gate together (a packet needs both)."""

    def __init__(self, nscc: NsccParams, eqds: EqdsParams, now: float):
        self.nscc = NsccSender(nscc, now)
        self.eqds = EqdsSender.from_params(eqds)
        self.rate: Optional[float] = None

    @property
    def cwnd(self) -> float:
        return self.nscc.cwnd

    def may_send(self, nbytes: int, inflight: int, now: Optional[float] = None) -> bool:
        return inflight + nbytes <= self.cwnd and self.eqds.may_send(nbytes, now)

    def on_credit(self, nbytes: int, now: float = 0.0) -> None:
        self.eqds.on_credit(nbytes, now)

    def consume(self, nbytes: int, now: Optional[float] = None) -> None:
        self.eqds.consume(nbytes, now)

    def on_ack(self, now, *, acked_bytes, rtt_s, ecn, inflight, hops=None) -> None:
        self.nscc.on_ack(now, acked_bytes=acked_bytes, rtt_s=rtt_s, ecn=ecn, inflight=inflight, hops=hops)

    def on_loss(self, now: float, kind: str) -> None:
        self.nscc.on_loss(now, kind)

    def stats(self) -> dict:
        return {**self.nscc.stats(), **self.eqds.stats()}
