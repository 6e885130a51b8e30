"""Scenario profiles (testbed/profiles.py): defaults merged under the scenario, explicit keys win, strict errors."""
import re

import pytest

from testbed import profiles, scenario

from conftest import ROOT, run_cli

SCEN = str(ROOT / "scenarios" / "ib-vs-roce.yaml")


def test_infiniband_fills_sm_adaptive_credits_and_ooo():
    sc = scenario.from_dict({"profile": "infiniband", "traffic": {"engine": "roce"}})
    sw = sc.switch
    assert (sw.routing, sw.sm.engine, sw.load_balancing, sw.adaptive.granularity) == ("sm", "minhop", "adaptive",
                                                                                      "packet")
    assert sw.credit.enabled and not sw.pfc.enabled and sw.ecn is None
    assert sw.traffic_classes.dscp == {26: 3} and sw.traffic_classes.lossless == [3]
    assert sc.traffic.receiver == "ooo" and sc.traffic.cc == "none" and sc.traffic.wire_dscp == 26
    assert not sc.hosts.pfc
    assert sc.profile == "infiniband"
    assert set(sc.profile_keys) == {"switch.routing", "switch.sm.engine", "switch.load_balancing",
                                    "switch.adaptive.granularity", "switch.credit.enabled",
                                    "switch.traffic_classes.dscp", "switch.traffic_classes.lossless",
                                    "traffic.dscp", "traffic.receiver"}


def test_rocev2_fills_ecmp_pfc_dscp_ecn_and_dcqcn():
    sc = scenario.from_dict({"profile": "rocev2", "traffic": {"engine": "roce"}})
    sw = sc.switch
    assert (sw.routing, sw.load_balancing) == ("distributed", "ecmp")
    assert sw.pfc.enabled and not sw.credit.enabled and sc.hosts.pfc
    assert sw.traffic_classes.lossless == [3] and sc.traffic.dscp == 26
    assert (sw.ecn.kmin, sw.ecn.kmax, sw.ecn.pmax) == (20 * 1024, 80 * 1024, 0.2)
    assert (sc.traffic.cc, sc.traffic.receiver, sc.traffic.roce.rto) == ("dcqcn", "gbn", "auto")
    assert {"switch.pfc.enabled", "traffic.cc", "traffic.roce.rto"} <= set(sc.profile_keys)


@pytest.mark.parametrize("kind,engine", [({"kind": "fat-tree", "k": 4}, "ftree"), ({"kind": "leaf-spine"}, "minhop"),
                                         ({"kind": "clos3"}, "minhop"), (None, "minhop")])
def test_infiniband_sm_engine_follows_the_topology_kind(kind, engine):
    doc = {"profile": "infiniband"} | ({"topology": kind} if kind else {})
    assert scenario.from_dict(doc).switch.sm.engine == engine


def test_the_sm_engine_follows_a_kind_set_by_an_override():
    sc = scenario.from_dict({"profile": "infiniband"}, ("topology.kind=fat-tree", "topology.k=4"))
    assert sc.switch.sm.engine == "ftree"


def test_explicit_keys_win_also_inside_a_nested_mapping():
    doc = {"profile": "infiniband", "topology": {"kind": "fat-tree", "k": 4},
           "switch": {"load_balancing": "spray", "sm": {"sweep_interval": "50ms"}, "credit": {"buffer": "32KB"},
                      "traffic_classes": {"dscp": {48: 5}, "lossless": [5]}},
           "traffic": {"engine": "roce", "dscp": 48}}
    sc = scenario.from_dict(doc)
    sw = sc.switch
    assert sw.load_balancing == "spray"                                  # explicit wins
    assert sw.sm.sweep_interval == 50_000_000 and sw.sm.engine == "ftree"   # sibling filled by the profile
    assert sw.credit.buffer == 32 * 1024 and sw.credit.enabled
    assert sw.traffic_classes.dscp == {48: 5} and sw.traffic_classes.lossless == [5]   # a map is filled whole
    assert sc.traffic.dscp == 48
    for k in ("switch.load_balancing", "switch.traffic_classes.dscp", "traffic.dscp"):
        assert k not in sc.profile_keys
    assert "switch.sm.engine" in sc.profile_keys and "switch.credit.enabled" in sc.profile_keys


def test_explicit_ecn_keys_and_per_priority_ecn_win():
    sc = scenario.from_dict({"profile": "rocev2", "switch": {"ecn": {"kmin": "5KB"}}})
    assert (sc.switch.ecn.kmin, sc.switch.ecn.kmax) == (5 * 1024, 80 * 1024)       # the other keys filled
    per_prio = {3: {"kmin": "1KB", "kmax": "2KB"}}
    sc = scenario.from_dict({"profile": "rocev2", "switch": {"ecn": per_prio}})
    assert set(sc.switch.ecn) == {3} and not any(k.startswith("switch.ecn") for k in sc.profile_keys)


def test_set_overrides_apply_before_the_profile():
    """--set / --vary edit the raw document first: a varied profile takes effect, an explicit key still wins."""
    sc = scenario.load(SCEN, ("profile=rocev2",))
    assert sc.profile == "rocev2" and sc.switch.pfc.enabled and sc.name == "ib-vs-roce"
    sc = scenario.load(SCEN, ("profile=rocev2", "switch.load_balancing=spray", "traffic.cc=none"))
    assert sc.switch.load_balancing == "spray" and sc.traffic.cc == "none" and sc.switch.pfc.enabled
    sc = scenario.load(SCEN, ("profile=infiniband", "profile=rocev2"))     # the last --set wins, as for any key
    assert sc.profile == "rocev2"
    plain = scenario.load(SCEN)
    assert plain.profile is None and plain.profile_keys == () and not plain.switch.pfc.enabled


def test_no_profile_changes_nothing():
    doc = {"traffic": {"engine": "roce"}}
    assert scenario.from_dict(doc) == scenario.Scenario.model_validate(doc)
    assert profiles.apply(dict(doc)) == (doc, [])


def test_traffic_defaults_only_for_the_roce_engine():
    """receiver / cc are RoCE engine keys (refused elsewhere): with udp the profile leaves them, and rocev2 makes
    the UDP packets ECN-capable instead."""
    ib = scenario.from_dict({"profile": "infiniband", "traffic": {"engine": "udp"}})
    assert ib.traffic.receiver == "gbn" and "traffic.receiver" not in ib.profile_keys
    ro = scenario.from_dict({"profile": "rocev2", "traffic": {"engine": "tcp"}})
    assert ro.traffic.cc == "none" and ro.traffic.ecn == "ect0" and ro.switch.pfc.enabled


def test_a_resolved_profile_scenario_reads_back_to_itself():
    sc = scenario.load(SCEN, ("profile=infiniband",))
    again = scenario.from_dict(scenario.to_dict(sc, roundtrip=True))
    assert scenario.to_dict(again) == scenario.to_dict(sc)
    assert again.profile_keys == ()             # every key is explicit in a resolved scenario: nothing to fill
    assert scenario.to_dict(sc)["profile"] == "infiniband"


@pytest.mark.parametrize("doc,msg", [
    ({"profile": "ib"}, "profile: Input should be 'infiniband' or 'rocev2', got 'ib'"),
    ({"profile": 3}, "profile: Input should be 'infiniband' or 'rocev2', got 3"),
    ({"profile": "infiniband", "switch": {"pfc": {"enabled": True}}},
     "switch.credit.enabled: credit-based flow control and PFC would both govern the lossless priorities of the "
     "leaf switches; enable one of them (switch.credit.enabled: true was set by profile infiniband; set it "
     "explicitly to change that)"),
    ({"profile": "rocev2", "switch": {"credit": {"enabled": True}}},
     "switch.credit.enabled: credit-based flow control and PFC would both govern the lossless priorities of the "
     "leaf switches; enable one of them (switch.pfc.enabled: true was set by profile rocev2; set it explicitly"),
    ({"profile": "rocev2", "traffic": {"dscp": 0}},
     "traffic.dscp: PFC protects priorities [3] but the traffic (DSCP 0 → priority 0) is lossy, so PFC would "
     "never pause anything; set traffic.dscp: 26 (switch.pfc.enabled: true was set by profile rocev2"),
    ({"profile": "rocev2", "switch": {"ecn": {"kmin": "100KB"}}},
     "switch.ecn.kmax: must be ≥ kmin (102400 bytes), got 81920"),
])
def test_profile_errors_are_one_line_and_name_what_the_profile_set(doc, msg):
    with pytest.raises(scenario.ScenarioError, match=re.escape(msg)) as e:
        scenario.from_dict(doc)
    assert "\n" not in str(e.value)


def test_an_error_the_profile_did_not_cause_does_not_blame_it():
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.from_dict({"profile": "infiniband", "topology": {"spines": 0}})
    assert str(e.value) == "topology.spines: must be ≥ 1, got 0"


def test_sweep_refuses_an_unknown_profile_in_one_line_before_building():
    res = run_cli("sweep", SCEN, "--vary", "profile=infiniband,ib", timeout=60)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: {SCEN}: profile: Input should be 'infiniband' or 'rocev2', got 'ib'"], res.stderr
