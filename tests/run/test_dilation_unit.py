"""Time dilation, pure parts: what is scaled (only what the scenario states, rates ÷ N, times × N, sizes kept),
what is refused, how auto picks N, and the real-unit columns of the results."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from testbed import dilation, scenario
from testbed.workloads import replay

REAL = {"name": "td", "duration": "20ms", "time_dilation": 1000,
        "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                     "host_link": {"rate": "25gbit", "buffer": "256KB"}, "fabric_link": {"rate": "100gbit"}},
        "switch": {"flowlet_timeout": "5us"},
        "traffic": {"engine": "roce", "flow_size": "1MB", "rate": "10gbit", "roce": {"rto": "100us"}},
        "telemetry": {"interval": "100us"},
        "failures": [{"at": "2ms", "link": ["leaf0", "spine0"], "rate": "40gbit"}]}


def test_what_the_scenario_states_is_scaled_and_nothing_else():
    s = scenario.from_dict(REAL)
    assert s.dilation == 1000 and s.time_dilation is None and s.real_doc["time_dilation"] == 1000
    assert s.duration == 20 * 10**9                                         # 20 ms × 1000 = 20 s
    assert s.topology.host_link.rate == 25 * 10**6 and s.topology.fabric_link.rate == 100 * 10**6
    assert s.switch.flowlet_timeout == 5 * 10**6 and s.traffic.roce.rto == 100 * 10**6
    assert s.telemetry.interval == 100 * 10**6 and s.traffic.rate == 10 * 10**6
    assert s.failures[0].at == 2 * 10**9 and s.failures[0].rate == 40 * 10**6
    assert s.topology.host_link.buffer == 256 * 1024 and s.traffic.flow_size == 1 << 20   # sizes kept
    defaults = scenario.from_dict({})
    assert s.switch.sm.sweep_interval == defaults.switch.sm.sweep_interval       # not stated: a default
    assert s.topology.fabric_link.buffer == defaults.topology.fabric_link.buffer
    assert set(s.dilated_keys) == {"duration", "topology.host_link.rate", "topology.fabric_link.rate",
                                   "switch.flowlet_timeout", "traffic.rate", "traffic.roce.rto",
                                   "telemetry.interval", "failures.0.at", "failures.0.rate"}
    again = scenario.from_dict(scenario.to_dict(s, roundtrip=True))          # the manifest's scenario
    assert again.dilation == 1 and again.topology.host_link.rate == s.topology.host_link.rate


def test_profile_filled_keys_are_not_scaled():
    doc = {"topology": {"host_link": {"rate": "10gbit"}}}
    out, keys = dilation.dilate(doc, scenario.Scenario, 100, frozenset({"topology.host_link.rate"}))
    assert out == doc and keys == []
    out, keys = dilation.dilate(doc, scenario.Scenario, 100)
    assert out["topology"]["host_link"]["rate"] == "100000000bit" and keys == ["topology.host_link.rate"]


@pytest.mark.parametrize("change,msg", [
    ({"time_dilation": 10**6}, "topology.host_link.rate: 25gbit ÷ time_dilation 1000000 = 25kbit, below the 100kbit"),
    ({"time_dilation": 2, "switch": {"flowlet_timeout": "100ns"}},
     "switch.flowlet_timeout: 100 ns × time_dilation 2 = 200 ns, below the kernel's 1 µs"),
    ({"time_dilation": 10, "telemetry": {"interval": "100us"}},
     r"telemetry.interval: .* \(with time_dilation 10: the emulated value\)"),
    ({"time_dilation": 0}, "time_dilation: a whole number 1..1000000 or auto, got 0"),
    ({"time_dilation": "sometimes"}, "time_dilation: a whole number"),
])
def test_what_cannot_be_dilated_is_refused_in_one_line(change, msg):
    doc = {**REAL, **{k: (REAL.get(k, {}) | v if isinstance(v, dict) else v) for k, v in change.items()}}
    with pytest.raises(scenario.ScenarioError, match=msg):
        scenario.from_dict(doc)


def test_auto_picks_the_smallest_nice_factor_within_the_budget():
    assert list(zip(range(7), dilation.nice_factors())) == [(0, 1), (1, 2), (2, 5), (3, 10), (4, 20), (5, 50),
                                                            (6, 100)]
    # 4 hosts × 25 Gbit/s ÷ (8 × 1500 B) = 8.33 M packets/s; RoCE: 3,000 per core × 2 cores → 1,000 gives
    # 8,333/s (over), 2,000 gives 4,167/s
    doc = {"topology": {"host_link": {"rate": "25gbit"}}, "traffic": {"engine": "roce"}}
    assert dilation.auto_factor(doc, 2, per_core=3000) == 2000
    slow = {"topology": {"host_link": {"rate": "20mbit"}}}
    assert dilation.auto_factor(slow, 2, per_core=6000) == 1     # 4 × 20 Mbit/s of UDP: 6,667/s ≤ 12,000/s
    assert dilation.auto_factor(slow, 1, per_core=6000) == 2     # … > 6,000/s on one core
    s = scenario.from_dict({**REAL, "time_dilation": "auto"})
    assert s.dilation == dilation.auto_factor(REAL, __import__("os").cpu_count() or 1)


def test_auto_divides_by_what_bench_capacity_measured_here_else_the_built_in_figure(tmp_path, monkeypatch):
    """No measurement of this machine: the built-in 6,000 packets/s per core and the manifest says so; after
    `testbed bench capacity` saved 1,667/s per core for udp, 4 hosts × 20 Mbit/s (6,667 packets/s) on 2 cores
    need N = 2 (3,333/s ≤ 3,334/s), and the source names the measurement; roce keeps its built-in figure."""
    import os
    monkeypatch.setattr(dilation, "BUDGET_DIR", tmp_path)
    slow = {"topology": {"host_link": {"rate": "20mbit"}}, "time_dilation": "auto"}
    assert dilation.budget("udp") == (6000.0, "built-in (testbed bench capacity has not measured this machine and "
                                              "kernel)")
    path = dilation.save_budget("udp", 1667.0, "40 Mbit/s links, default.yaml")
    assert path.parent == tmp_path and dilation.machine_key() in path.name
    per_core, source = dilation.budget("udp")
    assert per_core == 1667.0 and source.startswith("measured by testbed bench capacity on ") and "default.yaml" in source
    assert dilation.budget("roce")[0] == 3000.0
    s = scenario.from_dict(slow)
    cores = os.cpu_count() or 1
    assert s.dilation == dilation.auto_factor(slow, cores, 1667.0) and s.auto_budget == {"pps_per_core": 1667.0,
                                                                                          "source": source}
    if cores == 2:
        assert s.dilation == 2


def test_replayed_times_are_dilated_too():
    t = [replay.Transfer("a", "h0", "h1", 10, start_s=0.001, delay_s=0.0005)]
    assert replay.dilated(t, 1) is t
    (d,) = replay.dilated(t, 100)
    assert (d.start_s, d.delay_s, d.bytes) == (pytest.approx(0.1), pytest.approx(0.05), 10)


def test_real_unit_columns_divide_times_and_multiply_rates():
    flows = pd.DataFrame({"fct_s": [2.0, None], "goodput_mbps": [25.0, 0.0], "start_s": [1.0, 1.5]})
    dilation.real_columns(flows, 1000, dilation.FLOW_REAL)
    assert flows["fct_real_s"].tolist()[0] == 0.002 and math.isnan(flows["fct_real_s"].tolist()[1])
    assert flows["goodput_real_mbps"].tolist() == [25000.0, 0.0] and flows["start_real_s"].tolist() == [0.001,
                                                                                                       0.0015]
    row = dilation.real_summary({"goodput_mbps": 20.0, "fct_p99_ms": 40.0, "jct_mean_ms": math.nan}, 1000)
    assert row["goodput_real_mbps"] == 20000.0 and row["fct_p99_real_ms"] == 0.04
    assert math.isnan(row["jct_mean_real_ms"]) and "duration_real_s" not in row
