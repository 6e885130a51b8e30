"""``NetworkView``: what a collective library sees of the network when an operation starts — the data a
telemetry service would hand a communication library — and how two readings of the switches' counters become it.

Per switch port (a link's sending end), over the span since the previous reading:
  capacity_bps  the rate the port drains at now (a degraded link's lower rate; 0 when its link is down)
  util          background busy share: (bits the port sent − the bits the adapted operations themselves were
                planned to put on it) ÷ (capacity × span), in [0, 1]
  queue         mean depth the port's queue model showed the packets it took, ÷ the port's buffer, in [0, 1]
  ecn           share of the ECN-capable packets it sent that left CE-marked, in [0, 1]
  int           mean depth the INT hop records of this port (its egress) reported, ÷ the port's buffer, in [0, 1]:
                the queue as the packets themselves saw it (telemetry.int; 0 without reports)
A link's ``available_bps`` is its capacity × (1 − min(0.9, s)) for each signal s the scenario asks for
(``traffic.collective.adapt.signals``); a host NIC, which no switch counter watches, counts its line rate. A
path is as available as its least available link. Everything here is pure: the readings come from
``service.read_ports``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_PENALTY = 0.9          # a signal never takes more than 90 % of a link: a busy link is slow, not gone


@dataclass(frozen=True)
class PortReading:
    """One switch port's counters at one instant (cumulative, as the switch program keeps them)."""
    at: float                # seconds (time.monotonic)
    tx_bytes: int
    packets: int             # packets its queue model took (all priorities)
    depth_sum: int           # sum of the depth each of them saw, bytes
    ect_packets: int
    ecn_marks: int
    capacity_bps: float
    buffer_bytes: int


@dataclass(frozen=True)
class LinkSignals:
    capacity_bps: float
    util: float = 0.0
    queue: float = 0.0
    ecn: float = 0.0
    int: float = 0.0


class IntDepths:
    """The INT hop records since the last reading, per egress port: their queue depths' sum and count."""

    def __init__(self):
        self.sums: dict[int, list[int]] = {}

    def add(self, reports) -> None:
        for r in reports:
            for h in r.hops:
                s = self.sums.setdefault(h.egress, [0, 0])
                s[0] += h.queue_bytes
                s[1] += 1

    def share(self, port: int, buffer_bytes: int) -> float:
        s = self.sums.get(port)
        return _share(s[0] / s[1] / buffer_bytes) if s and s[1] and buffer_bytes else 0.0

    def reset(self) -> None:
        self.sums = {}


def _share(x: float) -> float:
    return min(1.0, max(0.0, x))


def signals_between(before: PortReading, now: PortReading, own_bits: float = 0.0,
                    down: bool = False, int_share: float = 0.0) -> LinkSignals:
    """The port's signals over the span between two readings (module docstring); ``own_bits``: what the adapted
    operations decided in that span were planned to send through it; ``int_share``: IntDepths.share of it."""
    span = now.at - before.at
    cap = 0.0 if down else now.capacity_bps
    sent = (now.tx_bytes - before.tx_bytes) * 8 - own_bits
    util = _share(sent / (now.capacity_bps * span)) if span > 0 and now.capacity_bps else 0.0
    pk = now.packets - before.packets
    queue = _share((now.depth_sum - before.depth_sum) / pk / now.buffer_bytes) if pk > 0 and now.buffer_bytes else 0.0
    ect = now.ect_packets - before.ect_packets
    ecn = _share((now.ecn_marks - before.ecn_marks) / ect) if ect > 0 else 0.0
    return LinkSignals(cap, util, queue, ecn, int_share)


@dataclass
class NetworkView:
    """The network at one instant, for a collective's policy: each switch port's ``LinkSignals``, the signals
    the scenario lets policies use, and ECMP's path of a flow (the fabric's real hashes, controller/planner.py's
    PathModel: what INT or a path-tracing service would report)."""
    model: object                                   # controller.planner.PathModel
    links: dict[int, LinkSignals] = field(default_factory=dict)
    signals: tuple[str, ...] = ()
    at: float = 0.0                                  # when it was read (seconds since the run's time zero)
    _paths: dict = field(default_factory=dict)

    def path(self, flow, sport: int) -> tuple[int, ...]:
        """The egress ports ``flow`` (a PlanFlow) crosses with source port ``sport``, its NIC first."""
        key = (flow.src, flow.saddr, flow.daddr, flow.dport, flow.proto, flow.dqp, flow.rail, sport)
        got = self._paths.get(key)
        if got is None:
            got = self._paths[key] = self.model.path(flow, sport)
        return got

    def available_bps(self, port: int) -> float:
        s = self.links.get(port)
        if s is None:                                # a host NIC: no switch counter, its line rate
            return 0.0 if port in self.model.down else float(self.model.capacity(port))
        a = s.capacity_bps
        for name in self.signals:
            a *= 1.0 - min(MAX_PENALTY, getattr(s, name))
        return a

    def path_bps(self, path) -> float:
        return min(self.available_bps(p) for p in path)
