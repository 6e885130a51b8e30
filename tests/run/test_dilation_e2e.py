"""A dilated run end to end: a scenario in real units (25 Gbit/s links, a 4 ms run) emulated 1,000 times slower
reports its flows in both units, and the real ones are what the real fabric would give."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import guarded_run, make_scenario, run_had

pytestmark = pytest.mark.e2e


def test_a_dilated_run_reports_real_units(tmp_path):
    scen = make_scenario(name="td", duration="4ms", time_dilation=1000,
                         topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                                   "host_link": {"rate": "25gbit", "buffer": "256KB"},
                                   "fabric_link": {"rate": "25gbit", "buffer": "256KB"}},
                         traffic={"engine": "udp", "pattern": "pairs", "pairs": [["h0", "h2"]], "flow_size": "1MB"},
                         telemetry={"interval": "100us"})
    assert scen.topology.host_link.rate == 25_000_000 and scen.duration == 4 * 10**9
    d, row = guarded_run(scen, tmp_path / "run")
    flows = pd.read_csv(d / "flows.csv")
    f = flows.iloc[0]
    assert f["complete"] and f["fct_real_s"] == pytest.approx(f["fct_s"] / 1000)
    assert f["goodput_real_mbps"] == pytest.approx(f["goodput_mbps"] * 1000)
    # 1 MB at 25 Gbit/s: 0.336 ms of payload on the wire (plus headers); the emulated flow took 1,000 × that
    print(f"\n[dilation] fct {f['fct_s'] * 1e3:.1f} ms emulated = {f['fct_real_s'] * 1e6:.0f} µs real, goodput "
          f"{f['goodput_real_mbps'] / 1e3:.2f} Gbit/s real, slowdown {f['slowdown']:.3f}")
    assert 0.85 * run_had(row) * 25_000 < f["goodput_real_mbps"] < 25_000
    links = pd.read_csv(d / "links.csv")
    assert (links["rate_real_bps"] == links["rate_bps"] * 1000).all()
    assert set(links["rate_real_bps"].unique()) == {25e9}
    assert row["time_dilation"] == 1000 and row["fct_p50_real_ms"] == pytest.approx(row["fct_p50_ms"] / 1000)
    assert row["duration_real_s"] == pytest.approx(0.004)
    m = json.loads((d / "manifest.json").read_text())
    assert m["time_dilation"]["factor"] == 1000 and not m["time_dilation"]["auto"]
    assert "topology.host_link.rate" in m["time_dilation"]["scaled_keys"]
    assert m["time_dilation"]["scenario_real"]["duration"] == "4ms"
