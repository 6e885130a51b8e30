"""What the counters read back as: per port, per queue, per flow."""
from __future__ import annotations

from dataclasses import dataclass, field



@dataclass
class PortCounters:
    """Counters of one switch port (summed over CPUs). ``discards``: frames the switch program could not forward
    (not IPv4, malformed, no route, TTL, …), charged to the port they arrived on — not congestion drops, which
    are per egress queue (QueueCounters). ``read_at``: the instant (time.time()) these values were read."""
    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0
    discards: int = 0
    discard_reasons: dict[str, int] = field(default_factory=dict)   # only reasons with a count
    read_at: float = 0.0


@dataclass
class QueueCounters:
    """Counters of one (egress port, priority) queue, summed over CPUs; ``depth_max`` is the largest depth an
    arriving packet saw since the previous read (the read resets it)."""
    packets: int = 0
    bytes: int = 0
    depth_sum: int = 0
    ecn_marks: int = 0
    ect_packets: int = 0
    drops: int = 0
    pause_rx: int = 0
    xoff_events: int = 0
    overflows: int = 0          # (as an ingress) lossless packets dropped for a full ingress buffer
    trims: int = 0              # packets cut to their headers and sent on the trim priority (switch.trim)
    depth_max: int = 0

    @property
    def depth_mean(self) -> float:
        return self.depth_sum / self.packets if self.packets else 0.0


@dataclass
class FlowPath:
    """How one flow was spread at one switch with a choice of next hops (n > 1)."""
    switch: str
    saddr: str
    daddr: str
    sport: int
    dport: int
    proto: int
    packets: dict[int, int]          # egress ifindex → packets sent there (only ports that were used)
    flowlets: int = 0                # flowlets the switch started for it (modes that keep flowlets; else 0)
    bytes: int = 0                   # frame bytes of the packets counted in ``packets``

    @property
    def paths(self) -> int:
        return len(self.packets)
