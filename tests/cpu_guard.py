"""The CPU guard as the arbiter of the suite's fidelity assertions.

A fidelity figure (a rate, a time, an imbalance) measured on a run the guard flags (summary ``cpu_bound``) is a
measurement of the machine, not of the code. So an e2e test takes its runs through :func:`valid`: a flagged
run is run again, at most twice, with the guard's reason printed; still flagged, the test fails naming the
reason. A run flagged while the hypervisor took the machine (summary ``cpu_steal_mean`` at the guard's steal
threshold) is another machine's load, not this one's: after a pause it is run again without counting against
those attempts, up to ``STEAL_WAITS`` times. A valid run that misses a bound fails at once: never re-run. The
session's last line counts the re-runs (:func:`summary_line`).

``FTB_STRESS=1`` runs the whole suite beside a bounded CPU hog (:class:`Hog`: Debian's ``stress-ng --cpu 1
--cpu-load 50``, half of one core of two), started and stopped by the session itself: what a user's busy
machine does to the emulator.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Callable, TypeVar

import pytest

#: a flagged run is tried this many times in all
ATTEMPTS = 3
#: … plus this many more when the hypervisor took the machine meanwhile, each after STEAL_PAUSE_S
STEAL_WAITS, STEAL_PAUSE_S = 4, 10.0
T = TypeVar("T")

#: (test, what ran, the guard's reason) of every re-run of the session
RERUNS: list[tuple[str, str, str]] = []


def flagged(row) -> bool:
    """``cpu_bound`` as the summary row or summary.csv has it (bool, or "True" read back from a CSV)."""
    return str(row.get("cpu_bound")) == "True"


def reason(row) -> str:
    why = row.get("cpu_bound_reason")
    return why if isinstance(why, str) and why else "cpu_bound"


def stolen(row) -> bool:
    """The hypervisor took the guard's steal threshold of the machine's time during the run."""
    from testbed.report.summary import STEAL_SHARE
    try:
        return float(row.get("cpu_steal_mean")) >= STEAL_SHARE
    except (TypeError, ValueError):
        return False


def valid(run: Callable[[int], T], label: str, row_of: Callable[[T], dict] = lambda got: got[1]) -> T:
    """``run(attempt)`` (attempt 0, 1, 2, …: each into its own directory) until the guard calls its run valid;
    returns that run's result. ``row_of`` picks the summary row out of it (default: the second item, as
    ``runner.run`` returns ``(directory, row)``)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    counted = waits = attempt = 0
    while True:
        got = run(attempt)
        attempt += 1
        row = row_of(got)
        if not flagged(row):
            return got
        steal = stolen(row) and waits < STEAL_WAITS
        if steal:
            waits += 1
        else:
            counted += 1
        if counted >= ATTEMPTS:
            break
        RERUNS.append((test, label, reason(row)))
        if steal:
            print(f"\n[cpu guard] {label}: flagged ({reason(row)}) while the hypervisor took the machine; "
                  f"running it again in {STEAL_PAUSE_S:g} s (not counted: {waits} of {STEAL_WAITS} such waits)")
            time.sleep(STEAL_PAUSE_S)
        else:
            print(f"\n[cpu guard] {label}: flagged ({reason(row)}); running it again ({counted + 1} of {ATTEMPTS})")
    pytest.fail(f"the CPU guard flagged {label} in {attempt} runs ({waits} of them during steal), the last: "
                f"{reason(row)}", pytrace=False)


def summary_line() -> str:
    tests = {t for t, _, _ in RERUNS}
    return (f"cpu guard: {len(RERUNS)} flagged run(s) re-run, in {len(tests)} test(s)"
            + (" (FTB_STRESS=1: beside stress-ng --cpu 1 --cpu-load 50)" if Hog.wanted() else ""))


class Hog:
    """``stress-ng --cpu 1 --cpu-load 50`` in its own process group for the session (FTB_STRESS=1); its own
    ``--timeout`` ends it even if the session is killed."""

    ARGS = ["--cpu", "1", "--cpu-load", "50", "--timeout", "3h", "--quiet"]

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def wanted() -> bool:
        return os.environ.get("FTB_STRESS") == "1"

    def start(self) -> None:
        exe = shutil.which("stress-ng")
        if exe is None:
            raise pytest.UsageError("FTB_STRESS=1 needs stress-ng (scripts/test-setup.sh installs it)")
        self.proc = subprocess.Popen([exe, *self.ARGS], start_new_session=True, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> str | None:
        """Stop it; a line when it had died before the end (the session did not run beside the hog)."""
        if self.proc is None:
            return None
        died = self.proc.poll()
        if died is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        return None if died is None else f"FTB_STRESS: stress-ng exited early (status {died})"

    def pid(self) -> int | None:
        """The hog's pid (a child of the session: tests that count their children leave it out)."""
        return self.proc.pid if self.proc is not None else None


#: the session's hog (started by conftest when FTB_STRESS=1)
HOG = Hog()
