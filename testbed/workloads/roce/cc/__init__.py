"""Sender-side congestion control of the RoCE engine: pure logic, explicit times, one module per controller
(dcqcn, nscc, swift, timely, hpcc, eqds) behind one interface.

Every controller is a ``SenderCC`` (base.py; docs/extending.md field by field): ``cwnd`` (bytes allowed in
flight, ``math.inf`` when purely rate-based), ``rate`` (pacing rate in bit/s, None = unpaced), ``advance(now)``,
``on_ack(now, *, acked_bytes, rtt_s, ecn, inflight, hops=None)``, ``on_loss(now, kind)`` with kind trim | nak |
timeout, ``on_cnp(now)`` (DCQCN's signal), ``on_sent(now, wire_bytes)`` and ``stats()`` for the results. ``hops``
is a tuple of ``Hop`` INT records (HPCC reads them; Swift counts them). EQDS adds a credit gate
(``may_send``/``consume``/``on_credit``) and a receiver-side ``CreditPacer``.

Each module owns its scenario model (``SwiftConfig`` … = ``traffic.swift``) beside its runtime parameters
(``SwiftParams.scaled``). ``registry.py`` maps every ``traffic.cc`` name — built-in or an installed plugin of the
entry-point group ``fabric_testbed.cc`` — to a ``CongestionControl``: its model, its scaling, its factory.
``scaled_params``/``make_sender_cc`` are the built-ins' shortcuts the unit tests and the loop model use.
"""
from __future__ import annotations

from typing import Optional, Union

from ....spec_types import Rate, Size, Time
from .base import MSS, CCConfig, Hop, ParamsBase, SenderCC, Track, bdp_bytes
from .dcqcn import DcqcnConfig, DcqcnParams, DcqcnSender, NotificationPoint, ReactionPoint, jain
from .eqds import CreditPacer, EqdsConfig, EqdsParams, EqdsSender, NsccEqds
from .hpcc import HpccConfig, HpccParams, HpccSender
from .nscc import NsccConfig, NsccParams, NsccSender
from .registry import GROUP, BUILTINS, CongestionControl, UnknownCC
from .registry import get as get_cc, maybe as maybe_cc, names as cc_names
from .swift import SwiftConfig, SwiftParams, SwiftSender
from .timely import TimelyConfig, TimelyParams, TimelySender

#: the interface a plugin uses (docs/extending.md): SenderCC, CCConfig, CongestionControl, Track, bdp_bytes, MSS,
#: Hop and the units of a params model (Rate, Size, Time)
__all__ = ["Hop", "MSS", "SenderCC", "CCConfig", "CongestionControl", "Track", "bdp_bytes", "GROUP", "Rate",
           "Size", "Time",
           "get_cc", "maybe_cc", "cc_names", "UnknownCC", "BUILTINS",
           "CreditPacer", "EqdsConfig", "EqdsParams", "EqdsSender", "NsccEqds", "HpccConfig", "HpccParams",
           "HpccSender", "NsccConfig", "NsccParams", "NsccSender", "SwiftConfig", "SwiftParams", "SwiftSender",
           "TimelyConfig", "TimelyParams", "TimelySender", "DcqcnConfig", "DcqcnParams", "DcqcnSender",
           "ReactionPoint", "NotificationPoint", "jain", "CC_NAMES", "FAMILIES", "families", "scaled_params",
           "make_sender_cc", "estimate_base_rtt"]

#: the built-in ``traffic.cc`` values (installed plugins add theirs: ``cc_names()``)
CC_NAMES = ("none",) + tuple(BUILTINS)
FAMILIES = {"nscc": (NsccParams, NsccSender), "swift": (SwiftParams, SwiftSender),
            "timely": (TimelyParams, TimelySender), "hpcc": (HpccParams, HpccSender),
            "eqds": (EqdsParams, EqdsSender)}
#: the host's kernel/Python path in a base RTT (send + receive + ACK turnaround) when it is estimated from the
#: topology: what ping-pong RTTs between two namespaces on an idle link of this machine come to
HOST_PATH_S = 200e-6


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
    dict) or the {family: params} mapping ``scaled_params`` returns (what the agents receive as ``cc_params``).
    ``none`` → None. DCQCN and installed plugins: ``params`` = {name: what its ``scale`` returned} (or that
    dict itself)."""
    if name == "none":
        return None
    if name == "dcqcn" or name not in CC_NAMES:
        if isinstance(params, DcqcnParams):
            return ReactionPoint(params, now)
        own = params.get(name, params) if isinstance(params, dict) else params
        return get_cc(name).make(own, now)
    fams = families(name)

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
