"""The congestion-control registry (testbed/workloads/roce/cc/registry.py) and DCQCN as a SenderCC: the built-ins
are found through the entry-point group, ``traffic.cc`` / ``traffic.cc_params`` errors are one line naming the
key, ``cc_params`` and ``traffic.<cc>`` give the agents the same parameters, and DCQCN on the deterministic loop
model gives the figures it gave before it moved behind SenderCC."""
from importlib import metadata
from pathlib import Path

import pytest

from testbed.scenario import ScenarioError, from_dict
from testbed.topology import build as build_topology
from testbed.workloads import flows as fl
from testbed.workloads.roce.cc import (BUILTINS, GROUP, CongestionControl, DcqcnParams, ReactionPoint, SenderCC,
                                       cc_names, get_cc, make_sender_cc)
from testbed.workloads.roce.cc.loop_model import run

BUILTIN_NAMES = ("dcqcn", "nscc", "swift", "timely", "hpcc", "eqds", "nscc+eqds")


def _scen(**traffic):
    return from_dict({"topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 1},
                      "traffic": {"engine": "roce", "pattern": "pairs", "pairs": [["h0", "h1"]], **traffic}})


def _error(**traffic) -> str:
    with pytest.raises(ScenarioError) as e:
        _scen(**traffic)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ------------------------------------------------------------------ registry

def test_builtins_are_registered_under_the_entry_point_group():
    eps = {ep.name: ep for ep in metadata.entry_points(group=GROUP)}
    assert set(BUILTIN_NAMES) <= set(eps), sorted(eps)          # pyproject.toml's entry points are installed
    for name in BUILTIN_NAMES:
        cc = get_cc(name)
        assert isinstance(cc, CongestionControl) and type(cc) is eps[name].load() is BUILTINS[name]
    assert cc_names()[:len(BUILTIN_NAMES)] == BUILTIN_NAMES


def test_every_builtin_scales_and_makes_a_sender_cc():
    for name in BUILTIN_NAMES:
        cc = get_cc(name)
        params = cc.scale(100e6, 1e-3, cc.params_model(), 1024)
        sender = cc.make(params, 0.0)
        assert isinstance(sender, SenderCC), name
        assert sender.cwnd > 0 and isinstance(sender.stats(), dict)


def test_unknown_cc_is_one_line_listing_the_known_ones():
    msg = _error(cc="bbr")
    assert msg.startswith("traffic.cc: unknown congestion control 'bbr' (known: none, dcqcn, nscc, swift"), msg


@pytest.mark.parametrize("cc, params, expect", [
    ("swift", {"ai": -1}, "traffic.cc_params.ai: must be > 0"),
    ("swift", {"bogus": 1}, "traffic.cc_params.bogus: unknown key"),
    ("swift", {"fs_min_cwnd": 5, "fs_max_cwnd": 2}, "traffic.cc_params.fs_max_cwnd: must be > fs_min_cwnd"),
    ("dcqcn", {"cnp_interval": "soon"}, "traffic.cc_params.cnp_interval: expected a time"),
    ("timely", {"beta": 2}, "traffic.cc_params.beta: must be ≤ 1"),
    ("nscc+eqds", {"eqds": {"overcommit": 3}}, "traffic.cc_params.eqds.overcommit: must be ≤ 2"),
])
def test_cc_params_errors_name_the_key(cc, params, expect):
    msg = _error(cc=cc, cc_params=params)
    assert msg.startswith(expect), msg


def test_cc_params_and_the_cc_section_together_are_an_error():
    assert _error(cc="swift", cc_params={"ai": 2}, swift={"beta": 0.5}).startswith(
        "traffic.cc_params: traffic.swift is given too")
    assert _error(cc="none", cc_params={"ai": 2}).startswith("traffic.cc_params: parameters given but traffic.cc")


@pytest.mark.parametrize("cc, section", [
    ("swift", {"ai": 2, "base_target": "300us", "base_rtt": "1ms"}),
    ("timely", {"t_low": "100us", "min_rate": "1mbit"}),
    ("nscc+eqds", {"nscc": {"target_qdelay": "300us"}, "eqds": {"overcommit": 1.05, "base_rtt": "2ms"}}),
])
def test_cc_params_reach_the_agents_as_the_section_does(cc, section):
    topo = build_topology(_scen().topology)
    if cc == "nscc+eqds":
        by_section = _scen(cc=cc, **section)
    else:
        by_section = _scen(cc=cc, **{cc: section})
    by_params = _scen(cc=cc, cc_params=section)
    a, b = fl.roce_opts(by_section.traffic, topo), fl.roce_opts(by_params.traffic, topo)
    assert a["cc_params"] == b["cc_params"] and a["ext"] and b["ext"]
    if cc == "swift":
        assert a["cc_params"]["swift"]["base_target_s"] == pytest.approx(300e-6)


def test_dcqcn_cc_params_reach_the_agents_as_traffic_dcqcn_does():
    topo = build_topology(_scen().topology)
    a = fl.roce_opts(_scen(cc="dcqcn", dcqcn={"cnp_interval": "5ms", "g": 0.5}).traffic, topo)
    b = fl.roce_opts(_scen(cc="dcqcn", cc_params={"cnp_interval": "5ms", "g": 0.5}).traffic, topo)
    assert a["dcqcn"] == b["dcqcn"] and a["cnp_interval_s"] == b["cnp_interval_s"] == pytest.approx(5e-3)
    assert a["cnp"] and not a["ext"] and a.get("cc_params") is None
    assert not fl.roce_opts(_scen(cc="swift").traffic, topo)["cnp"]


# ------------------------------------------------------------------ DCQCN behind SenderCC

def test_dcqcn_is_a_sender_cc_driven_by_its_hooks():
    """The SenderCC hooks (advance, on_sent, on_cnp) do what the reaction point's own methods did; ACKs and
    losses do nothing (DCQCN reacts to CNPs only)."""
    p = DcqcnParams.scaled(100e6)
    a, b = make_sender_cc("dcqcn", {"dcqcn": p.to_dict()}, 0.0), ReactionPoint(p, 0.0)
    assert isinstance(a, SenderCC) and a.cwnd == float("inf") and a.rate == 100e6
    t = 0.0
    for step in range(400):
        t += 0.003
        a.advance(t)
        b.advance(t)
        a.on_sent(t, 1100)
        b.on_bytes(1100, t)
        a.on_ack(t, acked_bytes=1024, rtt_s=1e-3, ecn=True, inflight=0)
        a.on_loss(t, "nak")
        if step % 37 == 0:
            a.on_cnp(t)
            b.on_cnp(t)
        assert (a.rate, a.alpha, a.target) == (b.rate, b.alpha, b.target)
    s = a.stats()
    assert s["dcqcn_cnps"] == b.cnps == 11 and s["dcqcn_rate_final"] == a.rate


@pytest.mark.parametrize("kw, jain, queue_mean, queue_p99, util, marks", [
    # measured on the loop model before DCQCN moved into roce/cc/ behind SenderCC (commit 3feb0a8)
    ({}, 0.998632943, 7355.733333333, 27648, 0.958027093, 97),
    ({"n_flows": 4}, 0.904632453, 10389.981866667, 30720, 0.973591893, 218),
    ({"seed": 7}, 0.999897006, 7631.0528, 27648, 0.963269973, 365),
])
def test_dcqcn_on_the_loop_model_gives_the_figures_it_gave_before(kw, jain, queue_mean, queue_p99, util, marks):
    r = run("dcqcn", **kw)
    print(f"\n[dcqcn model {kw}] jain {r.jain:.9f}, queue mean {r.queue_mean:.9f}, p99 {r.queue_p99}, "
          f"utilisation {r.utilisation:.9f}, marks {r.marks}, drops {r.drops}")
    assert (round(r.jain, 9), round(r.queue_mean, 9), r.queue_p99, round(r.utilisation, 9), r.marks, r.drops) == (
        jain, queue_mean, queue_p99, util, marks, 0)


def test_a_plugin_cc_closes_the_loop_on_the_model_before_it_is_installed():
    """examples/plugins/aimd_cc's CongestionControl, imported from its directory (not installed): on the loop
    model two and four AIMD flows share the bottleneck fairly with the queue held by the ECN marks (RED 20–80 KB)
    and no drop. Measured: Jain 0.997 / 1.000, queue p99 32 / 39 KB, utilisation 1.00."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "plugins" / "aimd_cc"))
    try:
        import aimd_cc
    finally:
        sys.path.pop(0)
    for n in (2, 4):
        r = run(aimd_cc.Aimd(), n_flows=n, overrides={"beta": 0.5})
        print(f"\n[aimd model, {n} flows] jain {r.jain:.4f}, queue p99 {r.queue_p99 / 1e3:.1f} KB, utilisation "
              f"{r.utilisation:.3f}, marks {r.marks}")
        assert r.cc == "aimd" and r.jain >= 0.99 and r.drops == 0 and r.marks > 0
        assert r.queue_p99 <= 80_000 and r.utilisation >= 0.95
    with pytest.raises(Exception, match="beta"):
        run(aimd_cc.Aimd(), overrides={"beta": 1.5})


def test_time_dilation_scales_cc_params_as_it_scales_the_cc_section():
    """``traffic.cc_params`` has no schema in the scenario model (it depends on ``traffic.cc``): time dilation
    reads the selected CC's model for it, so its times are × N and its rates ÷ N as in ``traffic.<cc>``."""
    base = {"duration": "20ms", "time_dilation": 100, "topology": {"host_link": {"rate": "10gbit"}}}
    by_section = from_dict({**base, "traffic": {"engine": "roce", "cc": "timely",
                                                "timely": {"t_low": "50us", "delta": "1gbit", "segment": "16KB"}}})
    by_params = from_dict({**base, "traffic": {"engine": "roce", "cc": "timely",
                                               "cc_params": {"t_low": "50us", "delta": "1gbit", "segment": "16KB"}}})
    assert by_params.traffic.cc_config == by_section.traffic.timely
    assert by_params.traffic.cc_config.t_low == 5 * 10**6 and by_params.traffic.cc_config.delta == 10**7
    assert {"traffic.cc_params.t_low", "traffic.cc_params.delta"} <= set(by_params.dilated_keys)
