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
    ({"switch": {"credit": {"enabled": True}}},
     "switch.traffic_classes.lossless: credit flow control is enabled (leaf switches) but no priority is lossless"),
    ({"switch": {"credit": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]}}},
     "credit flow control protects priorities [3] but the traffic (DSCP 0 → priority 0) is lossy"),
    ({"switch": {"credit": {"enabled": True}, "pfc": {"enabled": True},
                 "traffic_classes": {"dscp": {26: 3}, "lossless": [3]}}, "traffic": {"dscp": 26}},
     "switch.credit.enabled: credit-based flow control and PFC would both govern"),
    ({"switch": {"pfc": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                 "tiers": {"spine": {"credit": {"enabled": True}}}}, "traffic": {"dscp": 26}},
     "switch.tiers.spine.credit.enabled: credit-based flow control and PFC would both govern"),
    ({"switch": {"credit": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                 "tiers": {"spine": {"traffic_classes": {"dscp": {26: 4}, "lossless": [4]}}}},
      "traffic": {"dscp": 26}},
     "switch.tiers.spine.traffic_classes: with credit flow control every tier must map DSCPs to the same"),
    ({"switch": {"credit": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                 "shared_buffer": {"size": "1MB"}}, "traffic": {"dscp": 26}},
     "switch.shared_buffer: credit flow control grants a fixed buffer per ingress"),
    ({"switch": {"pfc": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                 "shared_buffer": {"size": "128KB", "headroom": "48KB"}}, "traffic": {"dscp": 26}},
     "switch.shared_buffer.size: 131072 bytes leave no shared pool after the headroom reserved for 4 ports × 1 "
     "lossless priorities × 49152 bytes = 196608 bytes (leaf switches)"),
    ({"switch": {"pfc": {"enabled": True}, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                 "tiers": {"spine": {"shared_buffer": {"size": "64KB"}}}}, "traffic": {"dscp": 26}},
     "switch.tiers.spine.shared_buffer.size: 65536 bytes leave no shared pool"),
])
def test_flow_control_that_would_do_nothing_or_clash_is_refused(doc, msg):
    import re
    with pytest.raises(scenario.ScenarioError, match=re.escape(msg)):
        scenario.from_dict(doc)


def test_roce_defaults_to_dscp_26_and_pfc_accepts_it():
    sc = scenario.from_dict({"switch": {"pfc": {"enabled": True}, "traffic_classes": {"dscp": {26: 3},
                                                                                     "lossless": [3]}},
                             "traffic": {"engine": "roce"}})
    assert sc.traffic.wire_dscp == 26
    assert scenario.from_dict({"traffic": {"engine": "roce", "dscp": 0}}).traffic.wire_dscp == 0


F = {"at": "1s", "link": ["leaf0", "spine1"], "state": "down"}


@pytest.mark.parametrize("failures,msg", [
    ([dict(F, at="9s")], "failures.0.at: 9 s is not within the run's duration (5 s after the traffic starts)"),
    ([F, dict(F, link=["leaf0", "leaf1"])], "failures.1.link: leaf0 and leaf1 are not linked"),
    ([dict(F, link=["leaf0", "spine9"])], "failures.0.link: no node 'spine9' in this topology"),
    ([dict(F, link=["leaf0", "leaf0"])], "failures.0.link: a link joins two different nodes"),
    ([{"at": "1s", "node": "core0", "state": "down"}], "failures.0.node: no node 'core0' in this topology"),
    ([{"at": "1s", "node": "h1", "state": "down"}], "failures.0.node: h1 is a host"),
    ([{"at": "1s", "node": "spine1", "rate": "10mbit"}], "failures.0.rate: applies to a link"),
    ([dict(F, rate="1mbit")], "failures.0.state: give either state: down|up or rate"),
    ([{"at": "1s", "link": ["leaf0", "spine1"]}], "failures.0.state: give either state: down|up or rate"),
    ([{"at": "1s", "state": "down"}], "failures.0.link: give either link: [a, b] or node"),
    ([dict(F, state="sideways")], "failures.0.state: Input should be 'down' or 'up'"),
    ([dict(F, colour=1)], "failures.0.colour: unknown key"),
    ([dict(F, at="-1s")], "failures.0.at:"),
])
def test_bad_failures_are_one_line_naming_the_key(failures, msg):
    import re
    with pytest.raises(scenario.ScenarioError, match="^" + re.escape(msg)) as e:
        scenario.from_dict({"failures": failures})
    assert "\n" not in str(e.value)


def test_failure_keys_need_their_context():
    with pytest.raises(scenario.ScenarioError, match=r"^failures: not with traffic.engine rxe"):
        scenario.from_dict({"failures": [F], "traffic": {"engine": "rxe"}})
    with pytest.raises(scenario.ScenarioError, match=r"^failures.0.rate: a rate change re-shapes a single-queue"):
        scenario.from_dict({"failures": [{"at": "1s", "link": ["leaf0", "spine1"], "rate": "5mbit"}],
                            "switch": {"traffic_classes": {"dscp": {26: 3}}}})
    sc = scenario.from_dict({"duration": "3s", "failures": [
        F, {"at": "2.5s", "link": ["leaf0", "spine1"], "state": "up"}, {"at": "1s", "node": "spine1", "state": "down"},
        {"at": "1s", "link": ["leaf1", "spine0"], "rate": "10mbit"}, {"at": "0.5s", "link": ["h0", "leaf0"],
                                                                     "state": "down"}]})
    assert [f.target for f in sc.failures] == ["leaf0-spine1", "leaf0-spine1", "spine1", "leaf1-spine0", "h0-leaf0"]
    assert sc.failures[3].rate == 10_000_000 and sc.failures[1].at == 2_500_000_000
    assert scenario.from_dict(scenario.to_dict(sc, roundtrip=True)) == sc


@pytest.mark.parametrize("switch,msg", [
    ({"routing": "sm", "sm": {"engine": "lash"}}, "switch.sm.engine: Input should be 'minhop', 'updn' or 'ftree'"),
    ({"routing": "sm", "sm": {"sweep_interval": "10us"}}, "switch.sm.sweep_interval: must be ≥ 1000000"),
    ({"routing": "ib"}, "switch.routing: Input should be 'distributed' or 'sm'"),
    ({"routing": "sm", "sm": {"period": "1s"}}, "switch.sm.period: unknown key"),
])
def test_bad_sm_keys_are_one_line_naming_the_key(switch, msg):
    import re
    with pytest.raises(scenario.ScenarioError, match="^" + re.escape(msg)) as e:
        scenario.from_dict({"switch": switch})
    assert "\n" not in str(e.value)


def test_sm_defaults_and_multipath_follow_the_load_balancer():
    sc = scenario.from_dict({"switch": {"routing": "sm"}})
    assert (sc.switch.sm.engine, sc.switch.sm.sweep_interval) == ("minhop", 10_000_000)
    assert not sc.switch.sm_multipath
    assert scenario.from_dict({"switch": {"routing": "sm", "load_balancing": "adaptive"}}).switch.sm_multipath
    assert scenario.from_dict({}).switch.routing == "distributed"


def test_shared_buffer_pool_is_the_size_less_reserved_headroom():
    """PortConfig: a shared-buffer switch's ports hold the whole buffer in their qdisc, and the pool is the size
    less headroom × ports × lossless priorities (leaf0: 2 hosts + 2 spines; headroom defaults to pfc.headroom);
    without lossless priorities the pool is the whole size; switches of other tiers keep per-queue buffers."""
    from testbed import topology
    from testbed.fabric.port import port_configs
    sc = scenario.from_dict({"switch": {"pfc": {"enabled": True, "headroom": "32KB"},
                                        "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                                        "tiers": {"leaf": {"shared_buffer": {"size": "1MB", "alpha": 2}}}},
                             "traffic": {"dscp": 26}})
    topo = topology.build(sc.topology)
    ports = port_configs(topo, sc.switch)
    leaf0 = ports[topo.ports["leaf0"][0].ifindex]
    assert leaf0.shared_pool == 2**20 - 4 * 32 * 1024 and leaf0.buffer_bytes == 2**20
    assert leaf0.ingress_buffer == leaf0.shared_pool + 32 * 1024
    assert ports[topo.ports["spine0"][0].ifindex].shared_pool == 0
    assert sc.switch.shared_buffer_on and sc.switch.qos("leaf").headroom == 32 * 1024
    lossy = scenario.from_dict({"switch": {"shared_buffer": {"size": "1MB"}}})
    assert port_configs(topology.build(lossy.topology), lossy.switch)[leaf0.ifindex].shared_pool == 2**20
    with pytest.raises(scenario.ScenarioError, match="alpha"):
        scenario.from_dict({"switch": {"shared_buffer": {"size": "1MB", "alpha": 0}}})


def test_credits_make_their_priorities_lossless_per_tier():
    sc = scenario.from_dict({"switch": {"traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                                        "tiers": {"spine": {"credit": {"enabled": True, "buffer": "32KB"}}}},
                             "traffic": {"dscp": 26}})
    leaf, spine = sc.switch.qos("leaf"), sc.switch.qos("spine")
    assert (leaf.flow_control, leaf.lossless) == (None, [])            # no flow control: lossless means nothing
    assert (spine.flow_control, spine.lossless, spine.credit.buffer) == ("credit", [3], 32 * 1024)
    assert sc.switch.credit_on and sc.switch.classes_on


def test_wcmp_keys_and_sources_without_what_they_measure_are_refused_in_one_line():
    sc = scenario.from_dict({"switch": {"load_balancing": "wcmp", "wcmp": {"granularity": "packet", "slots": 32}}})
    assert (sc.switch.wcmp.source, sc.switch.wcmp.granularity, sc.switch.wcmp.slots) == ("static", "packet", 32)
    for bad, msg in [({"source": "int"}, "^switch.wcmp.source: int weighs paths by their INT delays: set "
                                         "telemetry.int.enabled: true"),
                     ({"slots": 1}, "switch.wcmp.slots"), ({"granularity": "burst"}, "switch.wcmp.granularity")]:
        with pytest.raises(scenario.ScenarioError, match=msg):
            scenario.from_dict({"switch": {"load_balancing": "wcmp", "wcmp": bad}})
    with pytest.raises(scenario.ScenarioError, match="^switch.wcmp.source: load weights are set by the WCMP "
                                                     "controller on distributed routing's groups"):
        scenario.from_dict({"switch": {"load_balancing": "wcmp", "routing": "sm", "wcmp": {"source": "load"}}})
    ok = scenario.from_dict({"switch": {"load_balancing": "wcmp", "wcmp": {"source": "int"}},
                             "telemetry": {"int": {"enabled": True}}})
    assert ok.switch.wcmp.source == "int"


def test_dlb_keys_and_nonsense_are_refused_in_one_line():
    sc = scenario.from_dict({"switch": {"load_balancing": "dlb"}})
    d = sc.switch.dlb
    assert (d.inactivity, d.load_weight, d.queue_weight, d.bands) == (100_000, 1, 1, 8)
    sc = scenario.from_dict({"switch": {"load_balancing": "dlb", "dlb": {"inactivity": "2ms", "load_weight": 0,
                                                                          "bands": 16}}})
    assert (sc.switch.dlb.inactivity, sc.switch.dlb.load_weight, sc.switch.dlb.bands) == (2_000_000, 0, 16)
    assert sc.switch.sm_multipath                       # under SM routing DLB gets every allowed port
    for bad, msg in [({"load_weight": 0, "queue_weight": 0}, "^switch.dlb: load_weight and queue_weight are both 0"),
                     ({"bands": 1}, "^switch.dlb.bands: must be ≥ 2, got 1$"),
                     ({"bands": 17}, "^switch.dlb.bands: must be ≤ 16, got 17$"),
                     ({"queue_weight": -1}, "^switch.dlb.queue_weight: must be ≥ 0"),
                     ({"inactivity": "soon"}, "^switch.dlb.inactivity: expected a time"),
                     ({"granularity": "packet"}, "^switch.dlb.granularity: unknown key")]:
        with pytest.raises(scenario.ScenarioError, match=msg) as e:
            scenario.from_dict({"switch": {"load_balancing": "dlb", "dlb": bad}})
        assert "\n" not in str(e.value)


def test_lossless_qdisc_holds_what_every_ingress_may_send():
    """Under PFC each ingress may hold xoff + headroom in the switch; a lossless queue's qdisc must hold that from
    every port of its switch (else it drops what PFC allowed: 128–579 packets with 512 KB of headroom), and at
    least 4 buffers; and the link's rate × STALL_S more, for the bytes the queue model drained while a stalled
    shaper had not sent them (default 100 Mbit/s links: 625 KB)."""
    from testbed import topology
    from testbed.fabric.port import STALL_S, port_configs
    for xoff, headroom, want in (("128KB", "512KB", 4 * (128 + 512) * 1024), ("16KB", "16KB", 4 * 100 * 1024)):
        sc = scenario.from_dict({"switch": {"buffer": "100KB", "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                                            "pfc": {"enabled": True, "xoff": xoff, "xon": "8KB",
                                                    "headroom": headroom}},
                                 "traffic": {"dscp": 26}})
        topo = topology.build(sc.topology)                   # leaf0: 2 hosts + 2 spines
        c = port_configs(topo, sc.switch)[topo.ports["leaf0"][0].ifindex]
        assert c.lossless_limit == want, headroom
        assert c.queue_limit(3) == want + 100_000_000 // 8 * STALL_S, headroom


@pytest.mark.parametrize("doc,msg", [
    ({"telemetry": {"int": {"enabled": True}}, "traffic": {"dscp": 27}},
     "traffic.dscp: INT marks instrumented packets with DSCP bit 0; 27 is odd, use an even DSCP"),
    ({"telemetry": {"int": {"enabled": True}}, "switch": {"traffic_classes": {"dscp": {26: 3, 11: 1}}}},
     "switch.traffic_classes.dscp: INT marks instrumented packets with DSCP bit 0, so odd DSCP values (11)"),
    ({"telemetry": {"int": {"enabled": True, "fabric_mtu": 1400}}},
     "telemetry.int.fabric_mtu: 1400 is below topology.mtu (1500)"),
    ({"telemetry": {"int": {"enabled": True, "max_hops": 9}}}, "telemetry.int.max_hops"),
])
def test_int_settings_that_cannot_work_are_refused(doc, msg):
    import re
    with pytest.raises(scenario.ScenarioError, match=re.escape(msg)):
        scenario.from_dict(doc)


def test_int_gives_links_between_switches_room_for_the_stack():
    from testbed import topology
    from testbed.fabric.port import port_configs
    sc = scenario.from_dict({"telemetry": {"int": {"enabled": True, "max_hops": 4}}})
    assert sc.fabric_mtu == 1500 + 16 + 4 * 32
    assert scenario.from_dict({}).fabric_mtu == 1500
    assert scenario.from_dict({"telemetry": {"int": {"enabled": True, "fabric_mtu": 9000}}}).fabric_mtu == 9000
    t = topology.build(sc.topology)
    ports = port_configs(t, sc.switch, fabric_mtu=sc.fabric_mtu)
    assert {c.mtu for c in ports.values() if c.port.role in ("nic", "down")} == {1500}
    assert {c.mtu for c in ports.values() if c.port.role not in ("nic", "down")} == {1644}


def test_every_shipped_scenario_loads():
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2] / "scenarios"
    files = sorted(root.glob("*.yaml"))
    assert len(files) >= 14
    for f in files:
        scenario.load(f)


def test_entropy_modes_default_their_values_and_refuse_nonsense():
    def roce(**r):
        return scenario.from_dict({"traffic": {"engine": "roce", "roce": r}}).traffic.roce
    assert roce().values == 1 and roce(entropy="packet").values == 8 and roce(entropy="reps").values == 256
    assert roce(entropy="bitmap", entropy_values=16).values == 16 and roce(entropy="bitmap").penalty_decay is None
    with pytest.raises(scenario.ScenarioError, match="traffic.roce.entropy"):
        roce(entropy="sometimes")


@pytest.mark.parametrize("doc, line", [
    ({"\n": 0}, "'\\n': unknown key"),
    ({"traffic": {"bad key": 1}}, "traffic.'bad key': unknown key"),
    ({"time_dilation": "auto", "topology": {"spines": 0}},
     "topology.spines: must be ≥ 1, got 0 (time_dilation auto reads it)"),
    ({"time_dilation": "auto", "traffic": 1},
     "traffic: Input should be a valid dictionary or instance of TrafficSpec, got 1 (with time_dilation "),
    ({"topology": {"kind": []}}, "topology.kind: Input should be "),
    ({"time_dilation": "auto", "traffic": {"packet_size": "x"}},
     "traffic.packet_size: a whole number of bytes, got 'x' (time_dilation auto reads it)"),
])
def test_what_the_fuzzer_found_is_one_line(doc, line):
    """Found by tests/scenario/test_scenario_fuzz.py: a key with a newline made a two-line message, and time_dilation auto
    over a wrong topology, or a traffic that is not a mapping, raised a traceback."""
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.from_dict(doc)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)   # (auto's factor: this machine's)
