"""Telemetry while traffic runs: link counters (links.py), the CPU fidelity guard (cpu.py), paths per flow
(paths.py), in-band telemetry reports (int.py)."""
from __future__ import annotations

from .cpu import CpuGuard, LabCpuAccount
from .int import IntCollector, IntFailed
from .links import LinkSampler, SamplerFailed
from .paths import paths_used

__all__ = ["CpuGuard", "IntCollector", "IntFailed", "LabCpuAccount", "LinkSampler", "SamplerFailed", "paths_used"]
