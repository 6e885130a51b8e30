"""The scenario's ``controller`` keys: what they default to, and every configuration in which the controller
would pick nothing refused in one line naming the key."""
from __future__ import annotations

import pytest

from testbed import scenario


def test_defaults_and_off_spelled_as_yaml_reads_it():
    c = scenario.from_dict({}).controller
    assert (c.entropy, c.timeout, c.interval, c.interval_ns) == ("off", 200_000_000, None, 10_000_000)
    assert scenario.from_dict({"controller": {"entropy": False}}).controller.entropy == "off"
    a = scenario.from_dict({"controller": {"entropy": "adaptive", "interval": "5ms"}}).controller
    assert (a.entropy, a.interval) == ("adaptive", 5_000_000)


@pytest.mark.parametrize("doc, start", [
    ({"controller": {"entropy": "plan"}, "switch": {"load_balancing": "spray"}},
     "controller.entropy: planned entropy steers ECMP's per-flow hash; with switch.load_balancing spray"),
    ({"controller": {"entropy": "plan"}, "switch": {"routing": "sm"}}, "controller.entropy: under switch.routing sm"),
    ({"controller": {"entropy": "plan"}, "traffic": {"engine": "iperf3"}},
     "controller.entropy: the hosts that ask the controller are the udp, tcp and roce engines'"),
    ({"controller": {"entropy": "plan"}, "traffic": {"engine": "roce", "roce": {"entropy": "reps"}}},
     "controller.entropy: a planned flow keeps one source port"),
    ({"controller": {"entropy": "adaptive"}, "traffic": {"engine": "tcp"}},
     "controller.entropy: adaptive moves flows mid-flow by their source port"),
    ({"controller": {"entropy": "plan", "interval": "5ms"}},
     "controller.interval: only controller.entropy adaptive reads the ports"),
    ({"controller": {"entropy": "sometimes"}}, "controller.entropy:"),
    ({"controller": {"entropy": "adaptive", "interval": "10us"}}, "controller.interval:"),
])
def test_a_controller_that_would_pick_nothing_is_refused_in_one_line(doc, start):
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.from_dict(doc)
    assert str(e.value).startswith(start) and "\n" not in str(e.value)
