"""Sender-side congestion control of the RoCE engine beside DCQCN (``dcqcn.py``): pure logic, explicit times.

Every controller has the same interface (``SenderCC``): ``cwnd`` (bytes allowed in flight, ``math.inf`` when
purely rate-based), ``rate`` (pacing rate in bit/s, None = unpaced), ``on_ack(now, *, acked_bytes, rtt_s, ecn,
inflight, hops=None)``, ``on_loss(now, kind)`` with kind trim | nak | timeout, and ``stats()`` for flows.csv.
``hops`` is a tuple of ``Hop`` INT records (HPCC reads them; Swift counts them). EQDS adds a credit gate
(``may_send``/``consume``/``on_credit``) and a receiver-side ``CreditPacer``.

``scaled_params`` builds the parameter dicts the agents receive (``traffic.<cc>`` overrides over the papers'
defaults scaled to the link rate and base RTT); ``make_sender_cc(name, params, now)`` builds a flow's controller.
"""
from __future__ import annotations

from typing import Optional, Protocol, Union

from .base import Hop, ParamsBase
from .eqds import CreditPacer, EqdsParams, EqdsSender, NsccEqds
from .hpcc import HpccParams, HpccSender
from .nscc import NsccParams, NsccSender
from .swift import SwiftParams, SwiftSender
from .timely import TimelyParams, TimelySender

__all__ = ["Hop", "CreditPacer", "EqdsParams", "EqdsSender", "NsccEqds", "HpccParams", "HpccSender", "NsccParams",
           "NsccSender", "SwiftParams", "SwiftSender", "TimelyParams", "TimelySender", "CC_NAMES", "FAMILIES",
           "families", "scaled_params", "make_sender_cc", "estimate_base_rtt", "SenderCC"]

#: every ``traffic.cc`` value; ``none`` and ``dcqcn`` are handled by rc.py itself (DCQCN is CNP-driven)
CC_NAMES = ("none", "dcqcn", "nscc", "swift", "timely", "hpcc", "eqds", "nscc+eqds")
FAMILIES = {"nscc": (NsccParams, NsccSender), "swift": (SwiftParams, SwiftSender),
            "timely": (TimelyParams, TimelySender), "hpcc": (HpccParams, HpccSender),
            "eqds": (EqdsParams, EqdsSender)}
#: the host's kernel/Python path in a base RTT (send + receive + ACK turnaround) when it is estimated from the
#: topology: what ping-pong RTTs between two namespaces on an idle link of this machine come to
HOST_PATH_S = 200e-6


class SenderCC(Protocol):
    cwnd: float
    rate: Optional[float]

    def on_ack(self, now: float, *, acked_bytes: int, rtt_s: Optional[float], ecn: bool, inflight: int,
               hops: "Optional[tuple[Hop, ...]]" = None) -> None: ...

    def on_loss(self, now: float, kind: str) -> None: ...

    def stats(self) -> dict: ...


def families(name: str) -> tuple[str, ...]:
    """The parameter families a ``traffic.cc`` value uses (``nscc+eqds`` → nscc and eqds)."""
    if name not in CC_NAMES:
        raise ValueError(f"traffic.cc: unknown congestion control {name!r} (known: {', '.join(CC_NAMES)})")
    return tuple(f for f in name.split("+") if f in FAMILIES)


def estimate_base_rtt(link_rates_bps, packet_bytes: int, one_way_delay_s: float = 0.0,
                      host_path_s: float = HOST_PATH_S) -> float:
    """Unloaded RTT of a path as this emulator has it: one data packet serialised once, at the slowest link, the
    propagation both ways and the hosts' kernel/Python path (ACKs are small: their serialisation is left out).
    Once, not per hop: every emulated link is a token bucket with a two-frame burst, so a packet crosses a link
    whose bucket is full without waiting; a flow at line rate waits its serialisation where its rate is set (its
    own NIC, or the slowest link) and finds the next links' buckets refilled. Measured: RTT p50 0.6 ms on an
    empty 4-link 20 Mbit/s path with 1,092-byte packets (0.2 + 0.44 ms), where store-and-forward per hop would
    give 1.95 ms; taking the larger value let the delay-based controllers keep 3× the queue their targets mean."""
    ser = max(packet_bytes * 8 / r for r in link_rates_bps) if link_rates_bps else 0.0
    return ser + 2 * one_way_delay_s + host_path_s


def scaled_params(name: str, line_rate_bps: float, base_rtt_s: float, overrides: Optional[dict] = None) -> dict:
    """{family: params dict} for ``traffic.cc`` = ``name``; ``overrides`` = {family: {field: value or None}}."""
    overrides = overrides or {}
    out = {}
    for fam in families(name):
        cls = FAMILIES[fam][0]
        out[fam] = cls.scaled(line_rate_bps, base_rtt_s, **(overrides.get(fam) or {})).to_dict()
    return out


def _params(fam: str, p: Union[ParamsBase, dict]):
    cls = FAMILIES[fam][0]
    return p if isinstance(p, cls) else cls.from_dict(p)


def make_sender_cc(name: str, params: Union[dict, ParamsBase], now: float):
    """A flow's sender controller for ``traffic.cc`` = ``name``; ``params`` is the family's params (object or
    dict) or the {family: params} mapping ``scaled_params`` returns. ``none`` → None; ``dcqcn`` is not built
    here (rc.py drives ``dcqcn.ReactionPoint`` from CNPs)."""
    fams = families(name)
    if name == "dcqcn":
        raise ValueError("traffic.cc: dcqcn is CNP-driven: use dcqcn.ReactionPoint")
    if not fams:
        return None

    def get(fam):
        if isinstance(params, ParamsBase):
            return _params(fam, params)
        if isinstance(params, dict) and fam in params:
            return _params(fam, params[fam])
        if len(fams) == 1 and isinstance(params, dict):
            return _params(fam, params)
        raise ValueError(f"traffic.{fam}: no parameters given for cc {name!r}")

    if name == "nscc+eqds":
        return NsccEqds(get("nscc"), get("eqds"), now)
    fam, = fams
    p = get(fam)
    if fam == "eqds":
        return EqdsSender.from_params(p)
    return FAMILIES[fam][1](p, now)
