"""`testbed validate`'s pure parts: each metric on a hand-made result (one-way, asymmetric and incast traffic),
the reference block's checks and bands, the suite's selection and verdicts, and the balls-in-bins values the
ECMP references quote, computed exactly."""
from __future__ import annotations

import math
from fractions import Fraction
from math import factorial
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from testbed import scenario
from testbed.spec_types import ScenarioError
from testbed.validate import metrics, suite
from testbed.validate.spec import ReferenceSpec, parse

ROOT = Path(__file__).resolve().parents[2]


def _links(rows):
    return pd.DataFrame(rows, columns=["time_s", "switch", "port", "role", "direction", "bytes"])


def test_uplink_load_max_is_each_leafs_busiest_uplink_over_its_mean_averaged_over_the_leaves_that_sent():
    # leaf0: 3 flows' bytes on one uplink, 1 on another, 2 idle (2 samples): 3000 / (4000 / 4) = 3
    # leaf1: one flow on each uplink: 1; leaf2 sent nothing (one-way traffic): left out; spine and rx rows ignored
    rows = []
    for t in (0.1, 0.2):
        rows += [(t, "leaf0", "up0", "up", "tx", 1500), (t, "leaf0", "up1", "up", "tx", 500),
                 (t, "leaf0", "up2", "up", "tx", 0), (t, "leaf0", "up3", "up", "tx", 0)]
        rows += [(t, "leaf1", f"up{i}", "up", "tx", 500) for i in range(4)]
        rows += [(t, "leaf2", f"up{i}", "up", "tx", 0) for i in range(4)]
        rows += [(t, "leaf0", "up0", "up", "rx", 99999), (t, "spine0", "p0", "spine", "tx", 99999)]
    res = SimpleNamespace(links=_links(rows))
    assert metrics.uplink_load_max(res) == pytest.approx((3.0 + 1.0) / 2)
    one_way = SimpleNamespace(links=_links([r for r in rows if r[1] != "leaf1"]))
    assert metrics.uplink_load_max(one_way) == pytest.approx(3.0)
    with pytest.raises(metrics.MetricError, match="no uplink sent a byte"):
        metrics.uplink_load_max(SimpleNamespace(links=_links([r for r in rows if r[1] == "leaf2"])))


def _flows(rows):
    df = pd.DataFrame(rows, columns=["flow_id", "src", "dst", "start_s", "end_s", "ideal_fct_s", "goodput_mbps"])
    df["fct_s"] = df["end_s"] - df["start_s"]
    df["slowdown"] = df["fct_s"] / df["ideal_fct_s"]
    return df


def test_slowdown_and_fct_max_are_the_worst_sized_flow_and_need_every_one_complete():
    # asymmetric: one long flow and two short ones of different ideals
    res = SimpleNamespace(flows=_flows([(0, "h0", "h4", 0.0, 2.2, 2.0, 8.0), (1, "h1", "h5", 0.5, 0.8, 0.2, 5.0),
                                        (2, "h2", "h6", 0.1, 0.4, 0.25, 6.0)]))
    assert metrics.slowdown_max(res) == pytest.approx(1.5)          # 0.3 / 0.2
    assert metrics.fct_max_s(res) == pytest.approx(2.2)
    late = _flows([(0, "h0", "h4", 0.0, None, 2.0, None), (1, "h1", "h5", 0.5, 0.8, 0.2, 5.0)])
    with pytest.raises(metrics.MetricError, match="1 of 2 sized flows did not complete"):
        metrics.slowdown_max(SimpleNamespace(flows=late))
    unsized = _flows([(0, "h0", "h4", 0.0, 1.0, None, 8.0)])
    with pytest.raises(metrics.MetricError, match="no sized flow"):
        metrics.fct_max_s(SimpleNamespace(flows=unsized))


def test_incast_over_ideal_is_the_whole_span_over_the_flows_ideals_back_to_back():
    # 3 → 1: starts 0, 0.1, 0.2; ends 1.0, 1.5, 2.0; each ideal 0.5 → (2.0 − 0) / 1.5
    res = SimpleNamespace(flows=_flows([(i, f"h{i + 1}", "h0", 0.1 * i, e, 0.5, 1.0)
                                        for i, e in enumerate((1.0, 1.5, 2.0))]))
    assert metrics.incast_over_ideal(res) == pytest.approx(2.0 / 1.5)


def test_jain_goodput_over_the_flows():
    assert metrics.jain_goodput(SimpleNamespace(flows=_flows([(0, "a", "b", 0, 1, None, 10.0),
                                                              (1, "c", "d", 0, 1, None, 10.0)]))) == 1.0
    two = _flows([(0, "a", "b", 0, 1, None, 10.0), (1, "c", "d", 0, None, None, None)])
    assert metrics.jain_goodput(SimpleNamespace(flows=two)) == pytest.approx(0.5)   # one got everything


def _spec(**kw):
    base = dict(source="a paper, fig. 1", normalisation="none", metric="slowdown_max", value=2.0,
                tolerance=0.1, why="because")
    return ReferenceSpec.model_validate(base | kw)


def test_bands_and_verdicts_of_each_kind():
    assert _spec(kind="equal").bounds() == pytest.approx((1.8, 2.2))
    assert _spec(kind="at_most").bounds() == (float("-inf"), pytest.approx(2.2))
    assert _spec(kind="at_least").bounds() == (pytest.approx(1.8), float("inf"))
    assert _spec(kind="equal").verdict(2.19) == "pass" and _spec(kind="equal").verdict(1.79) == "fail"
    assert _spec(kind="at_most").verdict(0.1) == "pass" and _spec(kind="at_most").verdict(2.21) == "fail"
    assert _spec(kind="at_least").verdict(9.0) == "pass" and _spec(kind="at_least").verdict(1.7) == "fail"


def test_a_bad_reference_block_is_one_line_naming_the_file_and_key():
    for doc, msg in [({"metric": "nope"}, r"x\.yaml: reference\.source: Field required"),
                     (dict(source="abc", normalisation="none", metric="nope", value=1, tolerance=0, why="why"),
                      r"x\.yaml: reference\.metric: .*unknown metric 'nope'; known: .*slowdown_max"),
                     (dict(source="abc", normalisation="none", metric="fct_max_s", value=1, tolerance=0, why="why",
                           baseline=[]), r"reference\.baseline: .*empty baseline"),
                     (dict(source="abc", normalisation="none", metric="fct_max_s", value=1, tolerance=0, why="why",
                           kind="below"), r"reference\.kind: ")]:
        with pytest.raises(ScenarioError, match=msg) as e:
            parse(doc, "x.yaml")
        assert "\n" not in str(e.value)
    with pytest.raises(ScenarioError, match="no reference: block"):
        parse(None, "x.yaml")


def test_every_validation_scenario_loads_with_its_reference_and_names_a_source():
    refs = suite.discover()
    assert len(refs) >= 7
    for r in refs:
        s = scenario.load(r.path)
        assert s.name.startswith("val-") and r.spec.source and r.spec.why
        assert r.path.read_text().startswith("# Reference: ")
    assert any(r.spec.quick for r in refs) and not all(r.spec.quick for r in refs)


def test_select_quick_only_and_unknown_names():
    refs = suite.discover()
    quick = suite.select(refs, True, [])
    assert quick and all(r.spec.quick for r in quick)
    assert [r.name for r in suite.select(refs, False, ["uet-incast-sender-cc"])] == ["uet-incast-sender-cc"]
    with pytest.raises(suite.ValidateError, match=r"--only: no reference 'nosuch'; known: .*ecmp-balls-in-bins-4"):
        suite.select(refs, False, ["nosuch"])


def _outcome(values, **kw):
    ref = suite.Reference("r", Path("r.yaml"), _spec(kind="at_most"))
    return suite.Outcome(ref, dict(values), **kw)


def test_rows_pass_fail_and_invalid():
    ok = suite.row(_outcome({1: 1.0, 2: 3.0}))
    assert ok["verdict"] == "pass" and ok["measured"] == 2.0 and ok["seeds"] == 2 and ok["high"] == pytest.approx(2.2)
    assert ok["low"] is None and ok["ci95"] == pytest.approx(12.706, rel=1e-3)   # t(0.975, 1) · s / √2 with s = √2
    assert suite.row(_outcome({1: 3.0}))["verdict"] == "fail"
    flagged = suite.row(_outcome({1: 1.0}, flagged=1))
    assert flagged["verdict"] == "invalid" and "1 run(s) flagged" in flagged["notes"]
    broken = suite.row(_outcome({1: 1.0}, failed=1, notes=["seed 2: 1 of 16 sized flows did not complete"]))
    assert broken["verdict"] == "fail" and "did not complete" in broken["notes"]
    assert suite.row(_outcome({}))["verdict"] == "fail"
    assert list(ok) == suite.COLUMNS


def _expected_max(n: int) -> Fraction:
    """E[max load] of n balls in n bins, exactly: P(max ≤ k) = n!/nⁿ · [xⁿ](Σ_{j≤k} xʲ/j!)ⁿ."""
    def at_most(k):
        poly = [Fraction(1)] + [Fraction(0)] * n
        for _ in range(n):
            poly = [sum(poly[a] * Fraction(1, factorial(m - a)) for a in range(m + 1) if m - a <= k)
                    for m in range(n + 1)]
        return poly[n] * factorial(n) / Fraction(n ** n)
    return sum(1 - at_most(k) for k in range(n))


def test_the_balls_in_bins_references_quote_the_exact_expected_maximum():
    assert _expected_max(4) == Fraction(17, 8)
    refs = {r.name: r.spec for r in suite.discover()}
    for n in (4, 8):
        assert refs[f"ecmp-balls-in-bins-{n}"].value == pytest.approx(float(_expected_max(n)), abs=5e-4)
        s = scenario.load(ROOT / "scenarios" / "validation" / f"ecmp-balls-in-bins-{n}.yaml")
        assert s.topology.spines == s.topology.hosts_per_leaf == n
        assert s.topology.fabric_link.rate >= n * s.topology.host_link.rate     # no uplink can fill
