"""The scenario model: round trip through the lab state, and the checks that refuse what would do nothing."""
import pytest

from testbed import scenario


def test_a_resolved_scenario_reads_back_to_itself():
    """`testbed status` rebuilds a lab's topology from its state file: quantities keep their units there (a bare
    number reads as seconds, so 50 µs written as 50000 came back as 50000 s)."""
    doc = {"duration": "2.5s", "topology": {"host_link": {"rate": "40mbit", "buffer": "64KB", "delay": "50us"}},
           "switch": {"flowlet_timeout": "200us", "ecn": {"kmin": "10KB", "kmax": "20KB"},
                      "adaptive": {"load_window": "2ms"}},
           "traffic": {"engine": "roce", "roce": {"rto": "5ms", "reorder_time": "1ms"}, "rate": "10mbit"},
           "telemetry": {"interval": "50ms"}}
    sc = scenario.from_dict(doc)
    again = scenario.from_dict(scenario.to_dict(sc, roundtrip=True))
    assert again == sc
    assert scenario.to_dict(sc)["topology"]["host_link"]["delay"] == 50_000       # the manifest: plain integers


@pytest.mark.parametrize("doc,msg", [
    ({"switch": {"pfc": {"enabled": True}}}, "switch.traffic_classes.lossless: PFC is enabled"),
    ({"switch": {"pfc": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]}}},
     "traffic.dscp: PFC protects priorities [3] but the traffic (DSCP 0 → priority 0) is lossy"),
])
def test_pfc_that_would_pause_nothing_is_refused(doc, msg):
    import re
    with pytest.raises(scenario.ScenarioError, match=re.escape(msg)):
        scenario.from_dict(doc)


def test_roce_defaults_to_dscp_26_and_pfc_accepts_it():
    sc = scenario.from_dict({"switch": {"pfc": {"enabled": True}, "traffic_classes": {"dscp": {26: 3},
                                                                                     "lossless": [3]}},
                             "traffic": {"engine": "roce"}})
    assert sc.traffic.wire_dscp == 26
    assert scenario.from_dict({"traffic": {"engine": "roce", "dscp": 0}}).traffic.wire_dscp == 0
