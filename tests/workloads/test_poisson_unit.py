"""Open-loop datacenter workloads without a kernel: the flow-size CDFs (workloads/sizes.py), Poisson arrivals
(workloads/flows.py, pattern poisson), the ideal FCT (workloads/fct.py) and the slowdown summary — each against
a value computed by hand."""
from __future__ import annotations

import random

import pandas as pd
import pytest

from testbed import scenario, topology
from testbed.report.figures import slowdown_buckets
from testbed.workloads import plan
from testbed.workloads.fct import IdealFct, ideal_fct_s, path_ports
from testbed.workloads.sizes import SizeCdf, SizeDistError, read_file, resolve
from testbed.topology.fibwalk import Router


def test_the_named_means_are_the_trapezoid_sums():
    """websearch: 0.15·5 k + 0.05·15 k + 0.10·25 k + 0.10·40 k + 0.13·65 k + 0.07·140 k + 0.10·600 k + 0.10·1.5 M
    + 0.10·3.5 M + 0.07·7.5 M + 0.03·20 M = 1,711,250 bytes; alistorage 40,869.8 bytes."""
    assert resolve("websearch").mean() == pytest.approx(1_711_250)
    assert resolve("alistorage").mean() == pytest.approx(40_869.8)
    assert resolve("hadoop").mean() > 0


def test_quantiles_interpolate_between_the_published_points():
    ws = resolve("websearch")
    assert ws.quantile(0.15) == pytest.approx(10_000)            # a point
    assert ws.quantile(0.175) == pytest.approx(15_000)           # half-way between 15 % and 20 %
    assert ws.quantile(0.0) == 0 and ws.sample(random.Random(1)) >= 1


def test_samples_follow_the_cdf():
    """60,000 draws (seeded) of alistorage: the share ≤ 8 KB is the CDF's 0.6921 within 0.01 (binomial σ 0.0019)
    and the mean is the trapezoid mean within 4 % (the 256 KB–2 MB tail: σ of the mean ≈ 1.6 %)."""
    ali, rng = resolve("alistorage"), random.Random(7)
    xs = [ali.sample(rng) for _ in range(60_000)]
    assert sum(x <= 8_000 for x in xs) / len(xs) == pytest.approx(0.6921, abs=0.01)
    assert sum(xs) / len(xs) == pytest.approx(40_869.8, rel=0.04)


def test_a_cdf_file_in_percent_or_fraction_and_its_errors(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("# bytes cdf\n0 0\n1000 50\n3000 100\n")
    assert read_file(p).mean() == pytest.approx(0.5 * 500 + 0.5 * 2000)
    p.write_text("0 0\n1000 0.5\n3000 1\n")
    assert read_file(p).mean() == pytest.approx(1250)
    p.write_text("0 0\n1000 50\nten 100\n")
    with pytest.raises(SizeDistError, match="line 3"):
        read_file(p)
    p.write_text("0 0\n1000 60\n2000 50\n3000 100\n")
    with pytest.raises(SizeDistError, match="goes down"):
        read_file(p)
    with pytest.raises(SizeDistError, match="neither websearch"):
        resolve(str(tmp_path / "missing.txt"))
    with pytest.raises(SizeDistError, match="end at 1"):
        SizeCdf.from_points("x", [(0, 0), (10, 0.5)])


def _scen(**traffic):
    doc = {"duration": "102s", "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                                           "host_link": {"rate": "40mbit"}, "fabric_link": {"rate": "40mbit"}},
           "traffic": {"engine": "tcp", "pattern": "poisson", "load": 0.5, "size_dist": "alistorage",
                       "arrival_window": "100s", **traffic}}
    return scenario.from_dict(doc)


def test_poisson_arrivals_offer_the_load_asked():
    """4 hosts at 40 Mbit/s, load 0.5, alistorage: each host starts 0.5 × 5 MB/s ÷ 40,869.8 B = 61.2 flows/s, so
    100 s give 24,468 flows (Poisson σ 156: within 3 %); every flow goes to another host, starts inside the
    window, and the sizes offer 0.5 of the links within 10 % (the 256 KB–2 MB tail: σ of the offered load 3 %;
    over 10 s it is 9.6 %, and seed 3 offered 0.445)."""
    scen = _scen()
    topo = topology.build(scen.topology)
    flows = plan(scen.traffic, topo, seed=3, duration_s=102.0)
    assert len(flows) == pytest.approx(4 * 100 * 0.5 * 5e6 / 40_869.8, rel=0.03)
    assert all(f.src != f.dst and 0 <= f.start_s < 100 for f in flows)
    assert [f.start_s for f in flows] == sorted(f.start_s for f in flows)
    assert len({f.sport for f in flows}) == len(flows)            # distinct 5-tuples
    offered = sum(f.size_bytes for f in flows) / 100 / 4 / 5e6
    assert offered == pytest.approx(0.5, rel=0.10)
    assert plan(scen.traffic, topo, seed=3, duration_s=102.0) == flows    # the seed decides everything


@pytest.mark.parametrize("traffic,msg", [
    ({"pattern": "permutation", "load": 0.5, "size_dist": None}, "load: applies to pattern 'poisson' only"),
    ({"size_dist": None}, "needs load"),
    ({"size_dist": "webserch"}, "neither websearch"),
    ({"flow_size": "1MB"}, "flow_size: pattern 'poisson' draws"),
])
def test_poisson_keys_are_checked(traffic, msg):
    with pytest.raises(scenario.ScenarioError, match=msg):
        _scen(**traffic)


def test_ideal_fct_is_the_store_and_forward_bound():
    """10,000 bytes of UDP at packet_size 1500: 7 packets (payload 1,472), first frame 1,514 B, wire bytes
    10,000 + 7 × 42 = 10,294; over h0 → leaf0 → spine → leaf1 → h2, four 40 Mbit/s links: 4 × 1,514 × 8 / 40e6
    + (10,294 − 1,514) × 8 / 40e6 = 1.2112 ms + 1.756 ms = 2.9672 ms. With leaf0 → spine1 at 10 Mbit/s the
    widest path avoids spine1, so the ideal does not change."""
    doc = {"topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, "host_link": {"rate": "40mbit"},
                        "fabric_link": {"rate": "40mbit"},
                        "links": [{"between": ["leaf0", "spine1"], "rate": "10mbit"}]},
           "traffic": {"engine": "udp", "pattern": "pairs", "pairs": [["h0", "h2"]], "flow_size": 10_000}}
    scen = scenario.from_dict(doc)
    topo = topology.build(scen.topology)
    ports = path_ports(topo, Router(topo), "h0", "h2")
    assert [p.node for p in ports] == ["h0", "leaf0", "spine0", "leaf1"]
    assert ideal_fct_s(10_000, 1472, 28, ports) == pytest.approx(2.9672e-3)
    (f,) = plan(scen.traffic, topo, seed=1, duration_s=10.0)
    assert IdealFct(topo, 1500)(f) == pytest.approx(2.9672e-3)
    same_leaf = path_ports(topo, Router(topo), "h0", "h1")
    assert ideal_fct_s(100, 1472, 28, same_leaf) == pytest.approx(2 * 142 * 8 / 40e6)   # one frame, two links


def test_slowdown_buckets_take_p50_and_p99_per_size_decade():
    flows = pd.DataFrame({"size_bytes": [5_000, 6_000, 7_000, 50_000, 2_000_000, 9_000],
                          "slowdown": [1.0, 2.0, 3.0, 1.5, 1.1, None]})
    got = slowdown_buckets(flows)
    assert [(b, n) for b, n, _, _ in got] == [("< 10 KB", 3), ("10–100 KB", 1), ("1–10 MB", 1)]
    assert got[0][2] == pytest.approx(2.0) and got[0][3] == pytest.approx(2.98)   # p99 of 1, 2, 3 (linear)
