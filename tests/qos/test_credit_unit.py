"""Credit-based flow control: the switch program's accounting in credit mode (BPF_PROG_TEST_RUN on crafted
packets: bytes charged per ingress, no Xoff, the credit buffer as the ingress's limit) and the credit meter's
pure arithmetic (grant, margin, the meter's token rate, the in-place TBF bucket rewrite)."""
import time

import pytest

from conftest import datapath_fixtures, fresh_queues

from testbed.qos.credits import grant, margin_bytes, meter_rate
from testbed.datapath import N_PRIO, testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT, TC_ACT_SHOT
from testbed.fabric.netlink import TbfBucket, tbf_change_message

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, Raw = scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.Raw

CREDIT_BUFFER = 20_000
SWITCH = {"buffer": 200_000, "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
          "credit": {"enabled": True, "buffer": CREDIT_BUFFER}}


# ---------------------------------------------------------------- pure arithmetic

def test_grant_is_the_free_buffer_less_the_margin_in_blocks():
    assert grant(20_000, 0, 3_000, 64) == 16_960            # 17,000 rounded down to 64-byte blocks
    assert grant(20_000, 16_000, 3_000, 64) == 960
    assert grant(20_000, 18_000, 3_000, 64) == 0            # over-full: no credit, never negative


def test_margin_covers_two_frames_and_half_a_millisecond_at_the_rate():
    assert margin_bytes(40_000_000, 1500) == 2 * 1514 + 2_500
    assert margin_bytes(8_000_000, 9000) == 2 * 9014 + 500


def test_meter_rate_keeps_a_full_bucket_within_tcs_tick_range():
    assert meter_rate(20_000) == 8000                       # the floor: ≤ 1 byte per ms of refill
    big = 64 * 1024 * 1024
    assert big * 8 / meter_rate(big) <= 200.0               # the bucket's transmission time fits the u32 of ticks


@pytest.mark.parametrize("burst", [1514, 16_960, 1_000_000])
def test_bucket_rewrite_equals_a_freshly_encoded_change(burst):
    """Rewriting the buffer field in place gives the very request pyroute2's encoder would build (at the meter's
    rate for a bucket of up to 1 MB)."""
    rate = meter_rate(1_000_000)
    b = TbfBucket(7, 0x130000, 0x10013, rate, 4_000_000)
    assert b.with_burst(burst) == tbf_change_message(7, 0x130000, 0x10013, rate, burst, 4_000_000)


# ---------------------------------------------------------------- the switch program in credit mode

scen, topo, dp = datapath_fixtures({"topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                                                 "host_link": {"rate": "1mbit", "buffer": "256KB"}},
                                    "switch": SWITCH, "traffic": {"dscp": 26}}, "cru", host_ports=True)


def _frame(topo):
    inp = topo.port(topo.port_named("h0", "eth0").peer_ifindex)
    return inp, bytes(Ether(src=inp.peer_mac, dst=inp.mac) / IP(src=topo.address("h0"), dst=topo.address("h1"),
                                                                tos=26 << 2) / UDP(sport=1, dport=2)
                      / Raw(b"x" * 1000))


def test_credit_mode_charges_the_ingress_without_xoff_and_stops_at_the_credit_buffer(dp, topo):
    """Credits read the same per-ingress accounting as PFC: every lossless byte is charged to its ingress
    (`arrived` counts what the sender used), but no Xoff is ever raised; the ingress may hold its credit buffer
    and no more — a sender that ignored its credit would lose the excess."""
    inp, f = _frame(topo)
    out = topo.port(topo.port_named("h1", "eth0").peer_ifindex)
    fresh_queues(dp)
    t = dp.bpf[b"egress_paused"]                            # the egress stands still: byte counts stay exact
    t[t.Key(out.ifindex * N_PRIO + 3)] = t.Leaf(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    fit = CREDIT_BUFFER // len(f)
    verdicts = [testrun.run(dp.ingress_fd, f, ifindex=inp.ifindex).verdict for _ in range(fit + 3)]
    assert verdicts == [TC_ACT_REDIRECT] * fit + [TC_ACT_SHOT] * 3
    st = dp.bpf[b"ingress_state"][dp.bpf[b"ingress_state"].Key(inp.ifindex * N_PRIO + 3)]
    assert st.arrived == fit * len(f) and st.xoff_ns == 0
    q = dp.queue_counters(ports=[inp.ifindex, out.ifindex])
    assert q[(inp.ifindex, 3)].xoff_events == 0 and q[(inp.ifindex, 3)].overflows == 3
    assert q[(out.ifindex, 3)].drops == 3 and q[(out.ifindex, 3)].packets == fit
    assert dp.ingress_queued(inp.ifindex, 3) == fit * len(f)
