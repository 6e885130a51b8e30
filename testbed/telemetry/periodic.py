"""One loop for the run's periodic threads (the link sampler, the WCMP controller): a step every interval, on a
fixed grid; a step that ends past the next tick makes the loop skip ahead — never a burst of catch-up steps on a
busy machine — and is counted."""
from __future__ import annotations

import threading
import time
from typing import Callable


def run_every(interval_s: float, stop: threading.Event, step: Callable[[], None], late: Callable[[], None]) -> None:
    """Call ``step`` every ``interval_s`` until ``stop`` is set; ``late`` once per skipped tick."""
    nxt = time.time() + interval_s
    while not stop.wait(max(0.0, nxt - time.time())):
        step()
        nxt += interval_s
        if nxt < time.time():
            late()
            nxt = time.time() + interval_s
