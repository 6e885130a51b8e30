"""The scenario's ``traffic.iperf3`` keys (``traffic.engine: iperf3``)."""
from __future__ import annotations

from typing import Literal

from ...spec_types import Strict


class Iperf3Spec(Strict):
    """``traffic.engine: iperf3``: which transport iperf3 runs for every flow."""
    protocol: Literal["udp", "tcp"] = "udp"
