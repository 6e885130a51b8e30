"""Spurious retransmissions in RoCE runs (flows.csv ``spurious_retransmits``): a fidelity figure, asserted only on
runs the CPU guard called valid (tests/cpu_guard.py ``valid`` re-runs a flagged one)."""
from __future__ import annotations

import cpu_guard

#: the most of a lossless run's packets that may be retransmissions whose first copy had arrived
SPURIOUS_SHARE = 0.01


def spurious_share(flows) -> float:
    """Retransmissions whose first copy had arrived, as a share of every data packet sent."""
    return float(flows["spurious_retransmits"].sum()) / max(1, int(flows["packets_sent"].sum()))


def assert_few_spurious(flows, row, what: str) -> None:
    share = spurious_share(flows)
    print(f"\n[{what}] spurious retransmits {int(flows['spurious_retransmits'].sum())} of "
          f"{int(flows['packets_sent'].sum())} packets sent ({share:.2%}), retransmits {row['retransmits']}, "
          f"drops {row['drops']}")
    assert not cpu_guard.flagged(row), f"{what}: {cpu_guard.reason(row)}"
    assert share <= SPURIOUS_SHARE, (what, share)
