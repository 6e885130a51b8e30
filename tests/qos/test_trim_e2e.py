"""End to end packet trimming (switch.trim) on a real fabric: a RoCE incast (3 → 1 at 20 Mbit/s, 512 KB each, no
congestion control) into a 16 KB lossy buffer. With trimming the overloaded queue (leaf0 → h0) trims instead of
dropping — its links.csv rows read drops 0 and trims > 0, as does the summary — every trimmed header reaches its
receiver, which NAKs it at once (flows.csv trims_seen), and every flow completes byte-exact; without trimming the
same queue drops and trims nothing. Runs through ``runner.run`` and reads the files it wrote, as a user would."""
from __future__ import annotations

import pandas as pd
import pytest

from testbed import scenario

from conftest import guarded_run

pytestmark = pytest.mark.e2e

LINK = {"rate": "20mbit", "buffer": "256KB"}


def incast(trim: bool, receiver: str = "gbn") -> dict:
    """Flows end when done (the duration only bounds a slow go-back-N recovery: 2.5–4.2 s seen). A host whose
    flow is over answers late packets with ICMP port-unreachables (DSCP 50: Linux gives ICMP errors precedence
    6), which no trim can save: they go to a priority of their own (1), as network control does in fabrics, or
    the few that meet the full data queue would be its drops (1–15 per run, seen)."""
    return {"name": "trim-incast", "duration": "15s",
            "topology": {"spines": 1, "leaves": 2, "hosts_per_leaf": 3, "host_link": LINK,
                         "fabric_link": {"rate": "100mbit", "buffer": "256KB"}},
            "switch": {"buffer": "16KB", "trim": {"enabled": trim}, "traffic_classes": {"dscp": {50: 1}}},
            "traffic": {"engine": "roce", "pattern": "incast", "flow_size": "512KB", "receiver": receiver,
                        "incast": {"receiver": "h0", "senders": ["h3", "h4", "h5"]}}}


@pytest.mark.parametrize("trim,receiver", [(True, "gbn"), (True, "ooo"), (False, "gbn")])
def test_an_overloaded_lossy_queue_trims_instead_of_dropping(tmp_path, trim, receiver):
    d, row = guarded_run(scenario.from_dict(incast(trim, receiver)), tmp_path / "run")
    links, flows = pd.read_csv(d / "links.csv"), pd.read_csv(d / "flows.csv")
    tx = links[links["direction"] == "tx"]
    hot = tx[(tx["switch"] == "leaf0") & (tx["peer"] == "h0")]
    drops, trims, seen = int(hot["drops"].sum()), int(hot["trims"].sum()), int(flows["trims_seen"].sum())
    print(f"\n[trim {'on' if trim else 'off'}, {receiver}] leaf0→h0 drops {drops}, trims {trims}; fabric drops "
          f"{row['drops']}, trims {row['trims']}; receivers saw {seen} trimmed; completed {row['flows_completed']}"
          f"/3, fct max {row['fct_max_ms']:.0f} ms, retransmits {row['retransmits']}")
    assert row["trims"] == int(tx["trims"].sum()) and (links.loc[links["direction"] == "rx", "trims"] == 0).all()
    if trim:
        assert drops == 0 and trims > 100                    # every overflow became a trimmed header …
        assert int(tx["drops"].sum()) == 0                   # … the switches dropped none, the trim queue included
        # The kernel's qdisc behind the model is not the feature: once in a CI rehearsal the h0 shaper fell behind
        # its timers past the qdisc's slack (docs/architecture.md §4, timers under load) and dropped 133 packets
        # (1.2 % of the 10,748 trims; 0 in every other run seen), which go-back-N recovered. Bounded, and printed.
        qdisc = float(tx["qdisc_drops"].fillna(0).sum())
        print(f"[trim on, {receiver}] kernel qdisc drops behind the model: {qdisc:.0f}")
        assert qdisc <= 0.02 * trims
        assert trims <= row["trims"] and trims >= 0.98 * row["trims"]   # the overloaded queue trimmed (others at
        # most 1.2 % of all: a 16 KB fabric queue behind a stalled receiver trims too, 0–78 over 20 runs)
        assert seen == row["trims"]                          # each reached its receiver, which NAKed it
        assert row["flows_completed"] == 3 and flows["checksum_ok"].all()   # and every lost payload came back
    else:
        assert drops > 100 and trims == 0 and row["trims"] == 0 and seen == 0
