"""Open-loop Poisson traffic on a real fabric (kernel TCP between namespaces, the eBPF switch): the flows the
plan drew all run and complete, flows.csv carries each one's ideal FCT and slowdown, the summary's slowdown
percentiles are those of flows.csv, and the report draws slowdown by flow size."""
from __future__ import annotations

import pandas as pd
import pytest

from testbed import scenario
from testbed.report import write_report

from conftest import guarded_run

pytestmark = pytest.mark.e2e


def test_poisson_alistorage_flows_complete_with_their_slowdown(tmp_path):
    doc = {"name": "poisson", "seed": 2, "duration": "4s",
           "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                        "host_link": {"rate": "40mbit", "buffer": "256KB"},
                        "fabric_link": {"rate": "40mbit", "buffer": "256KB"}},
           "traffic": {"engine": "tcp", "pattern": "poisson", "load": 0.3, "size_dist": "alistorage",
                       "arrival_window": "1.5s"}}
    d, row = guarded_run(scenario.from_dict(doc), tmp_path / "run")
    flows = pd.read_csv(d / "flows.csv")
    print(f"\n[poisson] {len(flows)} flows, completed {row['flows_completed']}, slowdown p50 "
          f"{row['slowdown_p50']:.2f} p99 {row['slowdown_p99']:.2f}, by size "
          f"{flows.groupby(pd.cut(flows['size_bytes'], [0, 1e4, 1e5, 1e7]), observed=True)['slowdown'].median().round(2).to_dict()}")
    assert 150 <= len(flows) <= 300                         # 4 hosts × 1.5 s × 0.3 × 5 MB/s ÷ 40.9 KB = 220
    assert row["flows_completed"] == len(flows) and flows["fct_s"].notna().all()
    assert (flows["bytes"] == flows["size_bytes"]).all()
    ideal = flows["ideal_fct_s"]
    assert (ideal > 0).all() and (flows["slowdown"] - flows["fct_s"] / ideal).abs().max() < 1e-9
    assert row["slowdown_p50"] == pytest.approx(flows["slowdown"].quantile(0.5))
    assert row["slowdown_p99"] == pytest.approx(flows["slowdown"].quantile(0.99))
    big = flows[flows["size_bytes"] >= 100_000]
    assert (big["slowdown"] >= 0.9).all(), big[["size_bytes", "fct_s", "ideal_fct_s"]]   # a bound, big flows
    page = write_report(d).read_text()
    assert "FCT slowdown by flow size" in page and "slowdown-by-size" in page
