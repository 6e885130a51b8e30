"""The scenario's queueing and flow-control keys: traffic classes, ECN, PFC, credits, shared buffers,
trimming, and a tier's effective settings (``SwitchSpec.qos(tier)``)."""
from __future__ import annotations

from typing import Annotated, Optional, Union

from pydantic import Field, model_validator

from .. import units
from ..spec_types import Size, Strict, unit as _unit


Priority = Annotated[int, Field(ge=0, le=7)]


class TrafficClassSpec(Strict):
    """DSCP → priority (0..7) and which priorities are lossless (PFC protects them; they are never tail-dropped
    by the switch program). DSCPs not listed map to ``default``."""
    dscp: dict[Annotated[int, Field(ge=0, le=63)], Priority] = {}
    default: Priority = 0
    lossless: list[Priority] = []


class EcnSpec(Strict):
    """RED/DCQCN marking curve of one egress queue: P(mark) = 0 below kmin, linear up to pmax at kmax, 1 above."""
    kmin: Size
    kmax: Size
    pmax: float = Field(0.1, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _order(self):
        if self.kmax < self.kmin:
            raise ValueError(f"kmax: must be ≥ kmin ({self.kmin} bytes), got {self.kmax}")
        return self


class PfcSpec(Strict):
    """PFC of the lossless priorities: Xoff/Xon thresholds on the bytes that arrived on one ingress port (per
    priority) and are still queued in the switch, headroom per ingress port for what arrives after Xoff."""
    enabled: bool = False
    xoff: Size = units.size_bytes("32KB")
    xon: Size = units.size_bytes("16KB")
    headroom: Size = units.size_bytes("48KB")

    @model_validator(mode="after")
    def _order(self):
        if self.xon > self.xoff:
            raise ValueError(f"xon: must be ≤ xoff ({self.xoff} bytes), got {self.xon}")
        return self


class CreditSpec(Strict):
    """Credit-based link-level flow control of the lossless priorities, as InfiniBand does per virtual lane: the
    receiving port grants the sender its free buffer (in `block`s), the sender transmits only what it was
    granted, grants are renewed every `update_interval` as the receiver's queues drain. Lossless by
    construction, with no round-trip headroom (testbed/qos/credits.py)."""
    enabled: bool = False
    block: Size = 64                                  # credit granularity (bytes)
    update_interval: Annotated[int, *_unit(units.time_ns), Field(ge=100_000)] = units.time_ns("1ms")
    buffer: Optional[Size] = None                     # receive buffer per ingress and lane; None = the queue buffer


class SharedBufferSpec(Strict):
    """One buffer shared by all queues of a switch, with dynamic thresholds (Broadcom-style MMU, as the HPCC
    simulator models it): a queue may hold at most alpha × the free shared space, PFC Xoff of a lossless ingress
    follows the same rule, and `headroom` is reserved per lossless ingress (port, priority) for what arrives
    after Xoff. The shared pool is `size` minus those reservations."""
    size: Size
    alpha: float = Field(1.0, gt=0.0, le=64.0)
    headroom: Optional[Size] = None                   # per lossless ingress; None = switch.pfc.headroom
    xon_offset: Size = units.size_bytes("3KB")        # Xon once the ingress is this far below the threshold


class TrimSpec(Strict):
    """Packet trimming (as UEC switches do): a RoCEv2 packet of a lossy priority that would overflow its egress
    queue, or find it deeper than `threshold`, is cut to its headers (IP + UDP + 64 bytes: BTH and the transport
    header), flagged (BTH byte 4, bit 0x20) and sent on `priority`, so its receiver learns of the loss at once
    instead of after a timeout (ebpf/lib/trim.h)."""
    enabled: bool = False
    threshold: Optional[Size] = None                  # queue depth that trims; None = the port's buffer
    priority: Priority = 7                            # where trimmed headers go (a lossy priority of their own)


EcnMap = Union[EcnSpec, dict[Priority, EcnSpec], None]


class QosSpec(Strict):
    """Buffers, traffic classes, ECN and PFC of one tier's switches (what `switch.tiers.<tier>` overrides)."""
    buffer: Optional[Size] = None               # per port; None = the link's `buffer`
    traffic_classes: Optional[TrafficClassSpec] = None
    ecn: EcnMap = None                          # one curve for every priority, or {priority: curve}
    pfc: Optional[PfcSpec] = None
    credit: Optional[CreditSpec] = None
    shared_buffer: Optional[SharedBufferSpec] = None
    trim: Optional[TrimSpec] = None


class ResolvedQos(Strict):
    buffer: Optional[int]
    traffic_classes: TrafficClassSpec
    ecn: dict[int, EcnSpec]
    pfc: PfcSpec
    credit: CreditSpec
    shared_buffer: Optional[SharedBufferSpec] = None
    trim: TrimSpec = TrimSpec()

    @property
    def headroom(self) -> int:
        """Bytes reserved per lossless ingress out of a shared buffer (0 when nothing is lossless)."""
        sb = self.shared_buffer
        if not (sb and self.lossless):
            return 0
        return sb.headroom if sb.headroom is not None else self.pfc.headroom

    @property
    def flow_control(self) -> Optional[str]:
        """What keeps the lossless priorities lossless: "pfc", "credit" or None (then they are lossy)."""
        return "pfc" if self.pfc.enabled else "credit" if self.credit.enabled else None

    @property
    def lossless(self) -> list[int]:
        """The priorities flow control protects (`traffic_classes.lossless` where PFC or credits are on)."""
        return list(self.traffic_classes.lossless) if self.flow_control else []

    def priorities(self) -> list[int]:
        tc = self.traffic_classes
        trim = [self.trim.priority] if self.trim.enabled else []      # trimmed headers' queue and class
        return sorted({tc.default, *tc.dscp.values(), *tc.lossless, *trim})
