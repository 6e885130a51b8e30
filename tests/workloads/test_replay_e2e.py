"""Schedule replay on a real fabric: transfers start when the transfers they depend on have arrived (and after
their delay or start time), the per-tag rows span them, and the replay of the built-in ring all-reduce's export
reproduces its JCT."""
from __future__ import annotations

import pandas as pd
import pytest

from testbed import scenario

from conftest import ROOT, guarded_run, make_scenario

pytestmark = pytest.mark.e2e

RELAY_S = 0.015        # receiver's announcement → orchestrator → sender's agent → first byte (see below)

SCHEDULE = """id,src,dst,bytes,start,deps,delay,tag
a,h0,h2,256KB,,,,x
b,h2,h1,64KB,,a,,x
c,h1,h3,64KB,,b,30ms,x
d,h3,h0,16KB,100ms,,,y
e,h0,h3,64KB,,a d,,y
"""


def test_transfers_start_when_their_dependencies_arrived(tmp_path):
    (tmp_path / "s.csv").write_text(SCHEDULE)
    scen = make_scenario(name="replay-e2e", duration="5s",
                         topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                                   "host_link": {"rate": "20mbit"}, "fabric_link": {"rate": "20mbit"}},
                         traffic={"engine": "roce", "replay": str(tmp_path / "s.csv")})
    d, row = guarded_run(scen, tmp_path / "run")
    flows = pd.read_csv(d / "flows.csv").set_index("transfer")
    assert flows["complete"].all() and len(flows) == 5
    assert flows.loc["e", "tag"] == "y" and flows.loc["a", "tag"] == "x"
    s, e = flows["start_s"], flows["end_s"]
    gaps = {"b": s["b"] - e["a"], "c": s["c"] - e["b"] - 0.030, "e": s["e"] - max(e["a"], e["d"])}
    print(f"\n[replay] relay after the last dependency (ms): "
          f"{ {k: round(v * 1e3, 2) for k, v in gaps.items()} }; d starts {(s['d'] - s['a']) * 1e3:.1f} ms "
          f"after a")
    for k, g in gaps.items():
        assert 0 <= g <= RELAY_S, (k, g)
    assert 0.100 - 0.002 <= s["d"] - s["a"] <= 0.100 + RELAY_S      # a starts at t0, d at t0 + 100 ms
    ops = pd.read_csv(d / "collectives.csv").set_index("job")
    assert ops.loc["x", "op"] == "replay" and ops.loc["x", "transfers"] == 3
    assert ops.loc["x", "bytes"] == (256 + 64 + 64) * 1024
    assert ops.loc["x", "jct_ms"] == pytest.approx((e[["a", "b", "c"]].max() - s[["a", "b", "c"]].min()) * 1e3,
                                                    abs=1e-3)
    assert (d / "schedule.csv").read_text() == SCHEDULE
    assert row["jct_mean_ms"] == pytest.approx(ops["jct_ms"].mean())


def _jct(tmp_path, name: str) -> tuple[float, dict]:
    d, row = guarded_run(scenario.load(ROOT / "scenarios" / f"{name}.yaml"), tmp_path / name)
    ops = pd.read_csv(d / "collectives.csv")
    assert len(ops) == 1 and ops["jct_ms"].notna().all(), ops
    return float(ops["jct_ms"].iloc[0]), row


def test_replayed_ring_allreduce_reproduces_the_builtin_jct(tmp_path):
    """scenarios/replay-allreduce.yaml replays the export of scenarios/allreduce-ring.yaml (14 steps of 8
    transfers of 128 KB): its JCT, the whole span with 13 dependency waits, is within 5 % of the built-in
    collective's (the sum of its steps)."""
    built, row_b = _jct(tmp_path, "allreduce-ring")
    rep, row_r = _jct(tmp_path, "replay-allreduce")
    print(f"\n[replay ring] built-in JCT {built:.1f} ms, replay {rep:.1f} ms, ratio {rep / built:.3f} "
          f"(steal {row_b['cpu_steal_mean']:.3f} / {row_r['cpu_steal_mean']:.3f})")
    assert rep == pytest.approx(built, rel=0.05)


def test_poisson_background_runs_beside_a_collective_and_slows_it(tmp_path):
    """jobs + pattern: poisson: the ring all-reduce and open-loop web-search-sized flows in one run; the
    background flows run while the collective does (tagged ``background``, no collectives.csv row) and make
    its JCT longer than alone."""
    def scen(**traffic):
        return make_scenario(name="bg", duration="6s",
                             topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                                       "host_link": {"rate": "10mbit"}, "fabric_link": {"rate": "10mbit"}},
                             traffic={"engine": "roce", "roce": {"rto": "500ms"},
                                      "jobs": [{"name": "ring", "pattern": "allreduce", "bytes": "512KB",
                                                "hosts": ["h0", "h2", "h1", "h3"]}], **traffic})
    alone_dir, _ = guarded_run(scen(), tmp_path / "alone")
    d, row = guarded_run(scen(pattern="poisson", load=0.4, size_dist="alistorage", arrival_window="1s"),
                         tmp_path / "bg")
    alone = pd.read_csv(alone_dir / "collectives.csv")
    ops = pd.read_csv(d / "collectives.csv")
    flows = pd.read_csv(d / "flows.csv")
    bg, ring = flows[flows["tag"] == "background"], flows[flows["job"] == "ring"]
    assert list(ops["job"]) == ["ring"] and ops["op"].iloc[0] == "allreduce" and len(ring) == 24
    assert len(bg) >= 5 and bg["complete"].all() and ring["complete"].all()
    first, last = ring["start_s"].min(), ring["end_s"].max()
    assert (bg["start_s"] < last).sum() >= 3 and (bg["end_s"] > first).sum() >= 3   # during the collective
    print(f"\n[background] ring JCT alone {alone['jct_ms'].iloc[0]:.0f} ms, with {len(bg)} background flows "
          f"{ops['jct_ms'].iloc[0]:.0f} ms")
    assert ops["jct_ms"].iloc[0] > 1.05 * alone["jct_ms"].iloc[0]
    assert row["flows"] == len(flows)
