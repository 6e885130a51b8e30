"""The suite's CPU guard (tests/cpu_guard.py) on made-up summary rows: a valid run is taken at once, a flagged
one is run again up to 3 times in all, and a run flagged while the hypervisor took the machine is run again
after a pause without counting, up to 4 such waits."""
from __future__ import annotations

import pytest

import cpu_guard


def _runs(rows):
    seen = []

    def run(k):
        seen.append(k)
        return None, rows[k]
    return run, seen


OK = {"cpu_bound": False}
BUSY = {"cpu_bound": True, "cpu_bound_reason": "core 0 saturated", "cpu_steal_mean": 0.0}
STOLEN = {"cpu_bound": True, "cpu_bound_reason": "the hypervisor took 20%", "cpu_steal_mean": 0.2}


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch):
    monkeypatch.setattr(cpu_guard, "STEAL_PAUSE_S", 0.0)
    monkeypatch.setattr(cpu_guard, "RERUNS", [])          # made-up runs stay out of the session's count


def test_a_valid_run_is_taken_and_a_flagged_one_is_run_again():
    run, seen = _runs([OK])
    assert cpu_guard.valid(run, "x") == (None, OK) and seen == [0]
    run, seen = _runs([BUSY, BUSY, OK])
    assert cpu_guard.valid(run, "x")[1] is OK and seen == [0, 1, 2]


def test_three_flagged_runs_fail_the_test():
    run, seen = _runs([BUSY, BUSY, BUSY, OK])
    with pytest.raises(pytest.fail.Exception, match=r"flagged x in 3 runs \(0 of them during steal\), the last: core 0"):
        cpu_guard.valid(run, "x")
    assert seen == [0, 1, 2]


def test_runs_flagged_during_steal_do_not_count_up_to_four_waits():
    run, seen = _runs([STOLEN, BUSY, STOLEN, STOLEN, BUSY, OK])
    assert cpu_guard.valid(run, "x")[1] is OK and seen == [0, 1, 2, 3, 4, 5]
    run, seen = _runs([STOLEN] * 7 + [OK])
    with pytest.raises(pytest.fail.Exception, match=r"in 7 runs \(4 of them during steal\)"):
        cpu_guard.valid(run, "x")              # the 5th to 7th stolen runs count: 3 attempts
    assert cpu_guard.stolen({"cpu_steal_mean": "0.1"}) and not cpu_guard.stolen({"cpu_steal_mean": ""})
