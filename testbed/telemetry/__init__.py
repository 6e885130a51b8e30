"""Telemetry while traffic runs: link counters (links.py), the CPU fidelity guard (cpu.py), paths per flow
(paths.py). In-band telemetry's reports are testbed/inband/."""
from __future__ import annotations

from .cpu import CpuGuard, LabCpuAccount
from .links import LinkSampler, SamplerFailed
from .paths import paths_used

__all__ = ["CpuGuard", "LabCpuAccount", "LinkSampler", "SamplerFailed", "paths_used"]
