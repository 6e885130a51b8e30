"""One run lifecycle over two back ends: lifecycle.py runs a scenario the same way whether its fabric lives on
this machine (local.py) or is split over a Ray cluster's machines (testbed/cluster/run.py); backend.py says what
a back end provides."""
from __future__ import annotations

from .backend import Backend, Collected
from .lifecycle import RESULTS_DIR, RunFailed, new_run_id, run

__all__ = ["Backend", "Collected", "RESULTS_DIR", "RunFailed", "new_run_id", "run"]
