"""The run's former home, kept so that ``from testbed.runner import run, RunFailed`` goes on working: the one run
lifecycle is testbed/runs/ (lifecycle.py over a back end: local.py, or the cluster's)."""
from __future__ import annotations

from .runs.lifecycle import (RESULTS_DIR, TIMELINE_BIN_S, RunFailed, Traffic, host_prio, new_run_id, run,
                             scheduled_traffic, set_host_classes)

__all__ = ["RESULTS_DIR", "TIMELINE_BIN_S", "RunFailed", "Traffic", "host_prio", "new_run_id", "run",
           "scheduled_traffic", "set_host_classes"]
