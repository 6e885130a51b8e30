"""The WCMP controller's pure logic (lb/wcmp_controller.py ``update``) with hand-computed steps, and its INT probe on
crafted packets with BPF_PROG_TEST_RUN: scapy reads the probe as the format says, the spine adds its record,
the sink exports the report and drops the probe (it never reaches a host)."""
import os

import pytest

from conftest import datapath_fixtures

from testbed.lb import wcmp_controller as wcmp
from testbed.datapath import testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT, TC_ACT_SHOT
from testbed.inband.collector import PROBE_PORT, decode


def test_one_step_moves_weight_toward_the_lower_signal():
    # signals 1, 1, 1, 4 (mean 1.75): the three grow by 1.75^0.1, the fourth shrinks by (1.75/4)^0.1
    w = wcmp.update([0.25] * 4, [1.0, 1.0, 1.0, 4.0], 1 / 64)
    up, down = 1.75 ** 0.1, (1.75 / 4) ** 0.1
    total = 3 * up + down
    assert w == pytest.approx([up / total] * 3 + [down / total])
    assert sum(w) == pytest.approx(1.0)


def test_a_step_is_bounded_and_unmeasured_members_keep_their_weight():
    w = wcmp.update([0.5, 0.5], [1.0, 1e9], 1 / 64)          # mean 5e8: ×7.4 for the first, capped at ×1.5;
    assert w[0] / w[1] == pytest.approx(1.5 / 0.5 ** 0.1)     # the second ×(1/2)^0.1
    assert wcmp.update([0.3, 0.7], [None, None], 1 / 64) == [0.3, 0.7]
    kept = wcmp.update([0.2, 0.3, 0.5], [None, 1.0, 1.0], 1 / 64)
    assert kept == pytest.approx([0.2, 0.3, 0.5])             # equal signals: nothing moves
    floor = wcmp.update([1e-6, 1.0], [1e9, 1.0], 1 / 64)
    assert floor[0] >= 1 / 64 - 1e-12                         # at least one table slot each


def test_weights_converge_to_equal_signals_when_delay_follows_load():
    # two paths whose delay grows with their share (capacity 1 and 3): equal delay at shares 1/4, 3/4
    w = [0.5, 0.5]
    for _ in range(400):
        w = wcmp.update(w, [w[0] / 1.0, w[1] / 3.0], 1 / 64)
    assert w == pytest.approx([0.25, 0.75], abs=0.01)


scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP = scapy_all.Ether, scapy_all.IP, scapy_all.UDP
from int_scapy import IntStack  # noqa: E402

scen, topo, dp = datapath_fixtures({"topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 1},
                                    "telemetry": {"int": {"enabled": True}}}, "wcu2")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF, namespaces)")
def test_a_probe_is_read_as_int_gains_the_spines_record_and_ends_at_the_sink(dp, topo):
    up = topo.uplinks("leaf0")[1]
    f = wcmp.probe_frame(topo, "leaf0", up.ifindex, "198.18.0.254", topo.address("h1"), 3000, 123456789, 8)
    p = Ether(f)
    st = IntStack(bytes(p[UDP].payload))
    assert p[IP].tos == 0x04 and p[UDP].dport == PROBE_PORT and len(st.hops) == 1 and st.remaining == 7
    assert st.hops[0].switch_id == topo.switch_ids["leaf0"] and st.hops[0].egress_port == up.ifindex
    assert st.hops[0].queue_occupancy == 3000
    again = p.copy()
    del again[IP].chksum
    assert Ether(bytes(again))[IP].chksum == p[IP].chksum
    r = testrun.run(dp.ingress_fd, f, ifindex=up.peer_ifindex)             # at the spine: transit
    assert r.verdict == TC_ACT_REDIRECT and len(IntStack(bytes(Ether(r.data)[UDP].payload)).hops) == 2
    sink_in = next(q for q in topo.ports[up.peer_node] if q.peer_node == "leaf1")
    got = []
    dp.open_int_reports(got.append)
    dp.poll_int(0)
    got.clear()
    r2 = testrun.run(dp.ingress_fd, r.data, ifindex=sink_in.peer_ifindex)  # at leaf1: the sink
    dp.poll_int(0)
    assert r2.verdict == TC_ACT_SHOT                                       # measured, then dropped
    (rep,) = [decode(b) for b in got]
    assert rep.dport == PROBE_PORT and [h.switch_id for h in rep.hops] == [
        topo.switch_ids[n] for n in ("leaf0", up.peer_node, "leaf1")]
    assert dp.int_counters()["probes"] == 1
