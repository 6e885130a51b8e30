"""The fabric controller (network–host co-design): it knows the topology and every switch's hash, and plans the
entropy (UDP/TCP source port) of each flow so that ECMP puts it on a path of its own (planner.py, pure)."""
from __future__ import annotations

from .planner import PathModel, PlanFlow, Planner

__all__ = ["PathModel", "PlanFlow", "Planner"]
