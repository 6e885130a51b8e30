"""What every sender-side congestion controller shares: the INT hop record, the parameter scaling rule and the
min/final tracking that goes into flows.csv.

Scaling rule of the window/delay/INT families (``scaled(line_rate_bps, base_rtt_s)``), unlike DCQCN's uniform
slow-down (``dcqcn.py``): these controllers are clocked by the RTT, and on this kernel the base RTT is set by
serialisation and the Python/kernel path (~0.2–2 ms), not by the link rate. So the papers' settings are mapped by
the bandwidth-delay product: a delay (target, threshold, gradient scale) given at the paper's RTT keeps its ratio
to the base RTT (``paper_value / paper_base_rtt × base_rtt``); a byte quantity given as a fraction of the paper's
BDP keeps that fraction of ours; counts of packets stay counts of packets; rate steps keep their fraction of the
line rate. The loop's gains per RTT are then the paper's, and every queue target is the same number of BDPs.

The base RTT is a parameter, not a running minimum: flows that learn it from their own samples disagree (a flow
that starts into a standing queue never sees the empty path, takes a larger target and more than its share), so
every flow of a run uses the one value the engine measured or estimated (``traffic.<cc>.base_rtt``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import ClassVar, NamedTuple, Optional

from ....spec_types import Strict

MSS = 1024          # payload bytes per packet: the IB path MTU the engine picks for 1500-byte packets


class Hop(NamedTuple):
    """One switch's INT record as HPCC reads it: the egress queue (bytes), its cumulative transmitted bytes, the
    record's timestamp (ns) and the egress link rate (bit/s)."""
    qlen_bytes: int
    tx_bytes: int
    ts_ns: int
    link_rate_bps: float


def bdp_bytes(line_rate_bps: float, base_rtt_s: float) -> float:
    return line_rate_bps * base_rtt_s / 8


def check_positive(name: str, **vals) -> None:
    """One readable line per bad parameter (the scenario key is ``traffic.<name>.<field>``)."""
    for k, v in vals.items():
        if v is None or not (v > 0) or v == math.inf:
            raise ValueError(f"traffic.{name}.{k}: must be a positive finite number, got {v!r}")


@dataclass
class ParamsBase:
    line_rate_bps: float
    base_rtt_s: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def _override(self, override: dict):
        names = {f.name for f in fields(self)}
        for k, v in override.items():
            if k not in names:
                raise ValueError(f"unknown congestion-control parameter {k!r} for {type(self).__name__}")
            if v is not None:
                setattr(self, k, v)
        return self


class SenderCC:
    """The interface the RoCE requester drives one flow's congestion control through (docs/extending.md).

    ``cwnd``: bytes allowed in flight (``math.inf``: not window-limited); ``rate``: pacing rate in bit/s (None:
    unpaced). The engine reads both before every burst. The hooks below default to doing nothing, so an
    ACK-driven controller writes ``on_ack``/``on_loss`` and a CNP-driven one (DCQCN) ``on_cnp``/``on_sent``/
    ``advance``; both fit one slot of the requester."""
    cwnd: float = math.inf
    rate: Optional[float] = None

    def advance(self, now: float) -> None:
        """Time passed: run the timers due by ``now`` (called before ``rate`` is read)."""

    def on_ack(self, now: float, *, acked_bytes: int, rtt_s: Optional[float], ecn: bool, inflight: int,
               hops: "Optional[tuple[Hop, ...]]" = None) -> None:
        """An ACK: ``acked_bytes`` newly delivered, an RTT sample (None when the ACK echoed no transmit time),
        whether any packet it covers was CE-marked, the bytes still in flight, the INT hop records it echoed."""

    def on_loss(self, now: float, kind: str) -> None:
        """A loss signal: ``trim`` (a switch cut the payload), ``nak`` (a gap at the receiver), ``timeout``."""

    def on_cnp(self, now: float) -> None:
        """A congestion notification packet from the receiver (sent for CE-marked arrivals, one per interval)."""

    def on_sent(self, now: float, wire_bytes: int) -> None:
        """Packets of ``wire_bytes`` (IP length, all of them) left the sender."""

    def stats(self) -> dict:
        """Counters for the flow's results (``cc_state`` in the sender's output)."""
        return {}


class CCConfig(Strict):
    """A controller's scenario parameters (``traffic.<cc>`` / ``traffic.cc_params``); None = the scaled default.
    ``KEYS`` maps a scenario key to its runtime parameter where the names differ; keys in ``NS`` are times in ns
    that the runtime takes in seconds. ``base_rtt`` is not a parameter override (the engine's estimate when
    None)."""
    KEYS: ClassVar[dict] = {}
    NS: ClassVar[frozenset] = frozenset()

    def overrides(self) -> dict:
        """{runtime parameter: value} of the keys given (times → seconds), ``base_rtt`` left out."""
        out = {}
        for k, v in self.model_dump().items():
            if k == "base_rtt" or v is None:
                continue
            out[self.KEYS.get(k, k)] = v / 1e9 if k in self.NS else v
        return out


class Track:
    """Min/max/final of one value over a flow's life (for flows.csv)."""

    def __init__(self, v: Optional[float]):
        self.min = self.max = self.final = v

    def __call__(self, v: Optional[float]) -> None:
        if v is None:
            return
        self.final = v
        self.min = v if self.min is None else min(self.min, v)
        self.max = v if self.max is None else max(self.max, v)

    def dict(self, name: str) -> dict:
        return {f"{name}_min": self.min, f"{name}_max": self.max, f"{name}_final": self.final}
