"""`switch.trim` in the scenario: defaults, per-tier overrides, the trim priority's class on every switch port, and
one-line errors for configurations under which nothing could ever be trimmed."""
import re

import pytest

from testbed import scenario, topology
from testbed.fabric.port import port_configs

ROCE = {"engine": "roce"}


def test_defaults_and_the_trim_priority_gets_a_class_everywhere():
    sc = scenario.from_dict({"switch": {"trim": {"enabled": True, "threshold": "40KB"}}, "traffic": ROCE})
    t = sc.switch.trim
    assert (t.enabled, t.threshold, t.priority) == (True, 40 * 1024, 7)
    assert sc.switch.classes_on and sc.switch.trim_priority(sc.topology.tiers) == 7
    ports = port_configs(topology.build(sc.topology), sc.switch)
    assert {c.classes for c in ports.values() if c.is_switch_port} == {(0, 7)}
    off = scenario.from_dict({})
    assert not off.switch.trim.enabled and off.switch.trim_priority(off.topology.tiers) is None
    assert not off.switch.classes_on                        # trimming off changes nothing


def test_a_tier_override_replaces_the_switch_wide_trim():
    sc = scenario.from_dict({"switch": {"tiers": {"spine": {"trim": {"enabled": True, "priority": 5}}}},
                             "traffic": ROCE})
    assert sc.switch.qos("spine").trim.enabled and not sc.switch.qos("leaf").trim.enabled
    assert sc.switch.trim_priority(sc.topology.tiers) == 5
    assert 5 in sc.switch.qos("spine").priorities() and 5 not in sc.switch.qos("leaf").priorities()


@pytest.mark.parametrize("doc,msg", [
    ({"switch": {"trim": {"enabled": True}}},
     "switch.trim.enabled: trims the built-in RoCE engine's packets"),
    ({"switch": {"trim": {"enabled": True}}, "traffic": {"engine": "rxe"}},
     "switch.trim.enabled: trims the built-in RoCE engine's packets"),
    ({"switch": {"trim": {"enabled": True}}, "traffic": ROCE, "telemetry": {"int": {"enabled": True}}},
     "switch.trim.enabled: not with telemetry.int.enabled"),
    ({"switch": {"trim": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                 "pfc": {"enabled": True}}, "traffic": ROCE},
     "switch.trim.enabled: the traffic (DSCP 26 → priority 3) is lossless wherever trimming is on"),
    ({"switch": {"trim": {"enabled": True, "priority": 3}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                 "pfc": {"enabled": True}}, "traffic": ROCE},
     "switch.trim.priority: priority 3 is lossless at the leaf switches"),
    ({"switch": {"trim": {"enabled": True, "priority": 3}, "traffic_classes": {"dscp": {26: 3}}}, "traffic": ROCE},
     "switch.trim.priority: the traffic (DSCP 26) is on priority 3 itself"),
    ({"switch": {"trim": {"enabled": True}, "tiers": {"spine": {"trim": {"enabled": True, "priority": 6}}}},
      "traffic": ROCE},
     "switch.tiers.spine.trim.priority: trimmed headers go to one priority fabric-wide"),
    ({"switch": {"trim": {"enabled": True, "threshold": 0}}, "traffic": ROCE}, "switch.trim.threshold:"),
    ({"switch": {"trim": {"enabled": True, "priority": 8}}, "traffic": ROCE}, "switch.trim.priority:"),
])
def test_a_trim_that_could_never_trim_is_one_line_naming_the_key(doc, msg):
    with pytest.raises(scenario.ScenarioError, match="^" + re.escape(msg)) as e:
        scenario.from_dict(doc)
    assert "\n" not in str(e.value)
