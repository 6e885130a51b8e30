"""The scenario's in-band telemetry keys (``telemetry.int``)."""
from __future__ import annotations

from typing import Optional

from pydantic import Field

from ..datapath.int_wire import INT_HEADER_BYTES, INT_HOP_BYTES, INT_MAX_HOPS
from ..spec_types import Strict


class IntSpec(Strict):
    """In-band network telemetry (INT-MD over UDP, docs/int.md): the first switch marks every `sample`-th UDP
    packet of a flow, every switch pushes its hop record, the last switch strips the stack and exports it.
    Links between switches carry `fabric_mtu` (default: the topology's MTU plus the largest stack), so a
    full-sized packet always has room; a packet that would exceed it is not instrumented (counted)."""
    enabled: bool = False
    sample: int = Field(1, ge=1, le=1_000_000)
    max_hops: int = Field(INT_MAX_HOPS, ge=1, le=INT_MAX_HOPS)
    fabric_mtu: Optional[int] = Field(None, ge=576, le=9216)

    def room(self) -> int:
        """Bytes the largest stack adds to a packet."""
        return INT_HEADER_BYTES + self.max_hops * INT_HOP_BYTES
