"""Spurious retransmissions in RoCE runs (flows.csv ``spurious_retransmits``), asserted only on runs the CPU guard
did not flag: a flagged run is run once more, and a second flag fails the test with the figures behind it."""
from __future__ import annotations

import pytest

#: the most of a lossless run's packets that may be retransmissions whose first copy had arrived
SPURIOUS_SHARE = 0.01


def flagged(row) -> str:
    """Why the CPU guard flagged a run (its summary figures), '' when it did not."""
    if not bool(row["cpu_bound"]):
        return ""
    keys = ("cpu_busy_max", "cpu_saturated_share", "starved_samples", "starved_stolen_samples",
            "backlogged_samples", "cpu_steal_mean")
    return ", ".join(f"{k} {row[k]}" for k in keys if k in row)


def unflagged(run, what: str, first=None):
    """``run()`` → (…, row): its result (or ``first``, a result already had), run again once when the row is
    ``cpu_bound``; fails if both were."""
    got = run() if first is None else first
    why = flagged(got[-1])
    if why:
        print(f"\n[{what}] flagged cpu_bound ({why}): run again")
        got = run()
        if again := flagged(got[-1]):
            pytest.fail(f"{what}: flagged cpu_bound twice ({why}; then {again}): no verdict on spurious "
                        f"retransmissions from an overloaded emulator")
    return got


def spurious_share(flows) -> float:
    """Retransmissions whose first copy had arrived, as a share of every data packet sent."""
    return float(flows["spurious_retransmits"].sum()) / max(1, int(flows["packets_sent"].sum()))


def assert_few_spurious(flows, row, what: str) -> None:
    share = spurious_share(flows)
    print(f"\n[{what}] spurious retransmits {int(flows['spurious_retransmits'].sum())} of "
          f"{int(flows['packets_sent'].sum())} packets sent ({share:.2%}), retransmits {row['retransmits']}, "
          f"drops {row['drops']}")
    assert not flagged(row), f"{what}: {flagged(row)}"
    assert share <= SPURIOUS_SHARE, (what, share)
