"""INT in the switch program (ebpf/lib/int.h) on crafted packets with BPF_PROG_TEST_RUN, read back with an
independent scapy parser (tests/int_scapy.py): h0 → h2 crosses leaf0 (source), a spine (transit) and leaf1
(sink). Every hop's output is a well-formed packet (IP and UDP checksums valid) whose stack holds one more
record, newest first; the sink's output is the packet h0 sent (TTL and MACs as routers leave them) and its
report holds the three records in path order; a CE mark made on the way survives the strip. Host stacks (HPCC):
a stack h0 started gains every switch's record, the last leaf's too, and reaches h2."""
import os
import struct

import pytest

from conftest import datapath_fixtures

from testbed.bench.next_hop import int_costs
from testbed.datapath import testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT
from testbed.inband.collector import decode
from testbed.workloads.roce.wire import int_host_stack, int_hops

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, Raw = scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.Raw
from int_scapy import IntStack  # noqa: E402  (needs scapy)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF, namespaces)")

scen, topo, dp = datapath_fixtures({"topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2},
                                    "telemetry": {"int": {"enabled": True}}}, "inu")


@pytest.fixture(autouse=True)
def clean(dp, scen):
    set_int(dp)
    dp.clear_flows()
    dp.bpf[b"int_stats"].clear()
    reports(dp)                                                # what an earlier test left in the ring buffer
    yield


def set_int(dp, **kw):
    t = dp.bpf[b"int_config"]
    v = t[t.Key(0)]
    v.sample, v.max_hops = kw.get("sample", dp.int_spec.sample), kw.get("max_hops", dp.int_spec.max_hops)
    v.enabled, v.host_stacks = kw.get("enabled", 1), kw.get("host_stacks", 0)
    t[t.Key(0)] = v


def packet(topo, size=100, sport=4242, chksum=None, tos=0, dst="h2", dport=5001, head=b""):
    """h0's UDP packet to ``dst``; ``head``: bytes before the payload (a host stack)."""
    inp = topo.port(topo.port_named("h0", "eth0").peer_ifindex)
    u = UDP(sport=sport, dport=dport) if chksum is None else UDP(sport=sport, dport=dport, chksum=chksum)
    f = Ether(src=inp.peer_mac, dst=inp.mac) / IP(src=topo.address("h0"), dst=topo.address(dst), tos=tos) / u \
        / Raw(head + bytes(range(256)) * (size // 256) + bytes(size % 256))
    return inp.ifindex, bytes(f)


def hop(dp, topo, ifindex, frame):
    """Run the switch program on ``frame`` arriving on ``ifindex``: (the egress port, the frame it sends)."""
    r = testrun.run(dp.ingress_fd, frame, ifindex=ifindex)
    assert r.verdict == TC_ACT_REDIRECT, r.verdict
    sw = topo.port(ifindex).node
    out = next(p for p in topo.ports[sw] if p.mac == Ether(r.data[:14]).src.lower())
    return out, r.data


def checksums_valid(frame: bytes) -> None:
    p = Ether(frame)
    ip_ck, udp_ck = p[IP].chksum, p[UDP].chksum
    del p[IP].chksum
    del p[UDP].chksum
    q = Ether(bytes(p))
    assert q[IP].chksum == ip_ck, "IP checksum"
    assert udp_ck == 0 or q[UDP].chksum == udp_ck, "UDP checksum"
    assert p[IP].len == len(frame) - 14 and p[UDP].len == len(frame) - 34


def path(dp, topo, size=100, **kw):
    """h0 → h2 through the three switches: every hop's (egress port, frame)."""
    ifx, f = packet(topo, size, **kw)
    out = []
    for _ in range(3):
        eg, f = hop(dp, topo, ifx, f)
        out.append((eg, f))
        ifx = eg.peer_ifindex
    return out


def reports(dp):
    got = []
    dp.open_int_reports(got.append)
    dp.poll_int(0)
    return [decode(b) for b in got]


def test_each_hop_pushes_a_well_formed_record_and_the_sink_restores_the_packet(dp, topo, scen):
    _, sent = packet(topo)
    hops = path(dp, topo)
    ids = topo.switch_ids
    for n, (eg, f) in enumerate(hops[:2], start=1):
        checksums_valid(f)
        p = Ether(f)
        assert p[IP].tos & 0x04 and p[IP].len == len(sent) - 14 + 16 + 32 * n
        st = IntStack(bytes(p[UDP].payload))
        assert (st.type, st.npt, st.ver, st.hop_ml, st.e) == (1, 0, 2, 8, 0)
        assert st.length == (16 + 32 * n) // 4 and len(st.hops) == n and st.remaining == 8 - n
        assert (st.instructions, st.ds_id, st.ds_instructions) == (0xF800, 0x4654, 0xC000)
        assert st.ds_flags == Ether(sent)[UDP].chksum and st.tos == 0
        newest = st.hops[0]
        assert newest.switch_id == ids[eg.node] and newest.egress_port == eg.ifindex
        assert newest.link_rate_kbps == eg.rate_bps // 1000 and newest.queue_occupancy == 0
        assert newest.hop_latency == (len(f) * 8 * 10**9) // eg.rate_bps or \
            abs(newest.hop_latency - len(f) * 8e9 / eg.rate_bps) <= 1          # idle: its own serialisation
        assert bytes(st.hops[-1].payload) == b"" and bytes(st.payload) == bytes(Ether(sent)[UDP].payload)
    eg, out = hops[2]
    assert eg.peer_node == "h2"
    want = Ether(sent)
    want[Ether].src, want[Ether].dst = Ether(out).src, Ether(out).dst
    want[IP].ttl -= 3
    del want[IP].chksum
    assert out == bytes(want)                                   # the packet h0 sent, as routers forward it
    (r,) = reports(dp)
    assert [h.switch_id for h in r.hops] == [ids["leaf0"], ids[hops[1][0].node], ids["leaf1"]]
    assert [h.egress for h in r.hops] == [e.ifindex for e, _ in hops]
    assert [h.ingress for h in r.hops][1:] == [e.peer_ifindex for e, _ in hops[:2]]
    assert (r.saddr, r.daddr, r.sport, r.dport, r.proto) == (topo.address("h0"), topo.address("h2"), 4242, 5001, 17)
    assert r.length == len(sent) - 14 and not r.exceeded
    assert r.hops[0].ts_ns <= r.hops[1].ts_ns <= r.hops[2].ts_ns
    assert dp.int_counters() == {"sourced": 1, "no_room": 0, "transit": 1, "exceeded": 0, "exported": 1,
                                      "export_lost": 0, "failed": 0, "probes": 0, "delivered": 0}


def test_a_zero_udp_checksum_stays_zero_and_a_ce_mark_on_the_way_survives(dp, topo):
    ifx, f = packet(topo, chksum=0, tos=0x02)                  # ECT(0)
    eg, f = hop(dp, topo, ifx, f)
    assert Ether(f)[UDP].chksum == 0
    eg2, f = hop(dp, topo, eg.peer_ifindex, f)
    p = Ether(f)                                               # as a congested spine marks CE
    p[IP].tos |= 0x03
    del p[IP].chksum
    _, out = hop(dp, topo, eg2.peer_ifindex, bytes(p))
    q = Ether(out)
    assert q[IP].tos == 0x03 and q[UDP].chksum == 0
    checksums_valid(out)


def test_no_room_in_the_fabric_mtu_means_no_stack_and_is_counted(dp, topo, scen):
    room = 16 + 32 * scen.telemetry.int.max_hops
    fits = scen.fabric_mtu - room - 28                         # UDP payload that leaves exactly the room
    assert Ether(path(dp, topo, size=fits)[0][1])[IP].tos & 0x04
    first = Ether(path(dp, topo, size=fits + 1, sport=4243)[0][1])
    assert not first[IP].tos & 0x04 and first[IP].len == fits + 1 + 28
    assert dp.int_counters()["no_room"] == 1 and dp.int_counters()["sourced"] == 1


def test_past_max_hops_a_switch_sets_e_and_adds_nothing(dp, topo):
    set_int(dp, max_hops=1)
    hops = path(dp, topo)
    st = IntStack(bytes(Ether(hops[1][1])[UDP].payload))
    assert st.e == 1 and len(st.hops) == 1 and st.remaining == 0
    checksums_valid(hops[1][1])
    (r,) = reports(dp)
    assert r.exceeded and len(r.hops) == 1 and r.hops[0].switch_id == topo.switch_ids["leaf0"]
    assert dp.int_counters()["exceeded"] == 2                 # the spine and the sink


def test_every_sample_th_packet_of_a_flow_is_instrumented(dp, topo):
    set_int(dp, sample=4)
    marked = [bool(Ether(path(dp, topo)[0][1])[IP].tos & 0x04) for _ in range(8)]
    assert marked == [True, False, False, False, True, False, False, False]
    assert len(reports(dp)) == 2


def test_a_flow_within_one_leaf_reports_one_hop_and_is_not_changed(dp, topo):
    inp = topo.port(topo.port_named("h0", "eth0").peer_ifindex)
    f = bytes(Ether(src=inp.peer_mac, dst=inp.mac) / IP(src=topo.address("h0"), dst=topo.address("h1"))
              / UDP(sport=7, dport=5001) / Raw(b"y" * 64))
    eg, out = hop(dp, topo, inp.ifindex, f)
    assert eg.peer_node == "h1" and len(out) == len(f) and not Ether(out)[IP].tos & 0x04
    (r,) = reports(dp)
    assert len(r.hops) == 1 and r.hops[0].switch_id == topo.switch_ids["leaf0"] and r.hops[0].egress == eg.ifindex


def test_report_layout_matches_the_c_struct():
    from testbed.inband.collector import HOP, REPORT
    assert REPORT.size == 32 and HOP.size == 32
    assert struct.calcsize("<Q4s4sHHBBBBII") == 32


def test_cost_of_int_per_hop_against_plain_forwarding(dp, topo, capsys):
    """Per-packet cost of each INT role against the same packet forwarded with INT off, same program, same run
    (testbed.bench.next_hop.int_costs, also `testbed bench select`)."""
    out = int_costs(dp, topo)
    reports(dp)
    with capsys.disabled():
        print("\n[int cost] " + ", ".join(f"{r} {a:.0f} ns/pkt vs {b:.0f} plain ({a / b:.2f}×)"
                                          for r, (a, b) in out.items()))
    for role, (a, b) in out.items():       # 1.7–3.1× measured over 6 runs (≈ 0.4–0.7 µs more per hop)
        assert a < 4 * b, (role, a, b)


# ---------------------------------------------------------------- host stacks (traffic.cc: hpcc)

ROCE_TOS = (26 << 2) | 0x02                                     # DSCP 26, ECT(0): what the RoCE engine sends


def host_path(dp, topo, dst="h2", hops=3):
    """An HPCC data packet h0 → ``dst`` with the engine's empty host stack (room for 3 records): the packet sent
    and every hop's (egress port, frame) until it leaves the fabric."""
    ifx, sent = packet(topo, dst=dst, dport=4791, tos=ROCE_TOS | 0x04, head=int_host_stack(3, ROCE_TOS))
    out, f = [], sent
    for _ in range(hops):
        eg, f = hop(dp, topo, ifx, f)
        out.append((eg, f))
        ifx = eg.peer_ifindex
    return sent, out


@pytest.mark.parametrize("leaf_int", [1, 0], ids=["with-telemetry-int", "host-stacks-only"])
def test_a_host_stack_gains_every_hops_record_and_reaches_the_receiving_host(dp, topo, leaf_int):
    """Every switch, the first and last leaf included, pushes its record as transit; the last leaf delivers the
    stack to h2 (HPCC's receiver echoes it) instead of exporting it; the engine's decoder reads the records."""
    set_int(dp, enabled=leaf_int, host_stacks=1)
    sent, hops = host_path(dp, topo)
    ids = topo.switch_ids
    payload = bytes(IntStack(bytes(Ether(sent)[UDP].payload)).payload)
    for n, (eg, f) in enumerate(hops, start=1):
        checksums_valid(f)
        p = Ether(f)
        assert p[IP].tos == ROCE_TOS | 0x04 and p[IP].len == len(sent) - 14 + 32 * n
        st = IntStack(bytes(p[UDP].payload))
        assert (st.type, st.flags, st.tos, st.length, st.remaining, st.e) == (1, 1, ROCE_TOS, 4 + 8 * n, 3 - n, 0)
        assert [h.switch_id for h in st.hops][0] == ids[eg.node] and bytes(st.payload) == payload
    eg, f = hops[-1]
    assert eg.peer_node == "h2"
    st = IntStack(bytes(Ether(f)[UDP].payload))
    assert [h.switch_id for h in st.hops] == [ids["leaf1"], ids[hops[1][0].node], ids["leaf0"]]   # newest first
    decoded = int_hops(bytes(Ether(f)[UDP].payload)[16:16 + 3 * 32])                             # path order
    assert [h.link_rate_bps for h in decoded] == [e.rate_bps for e, _ in hops]
    assert [h.qlen_bytes for h in decoded] == [0, 0, 0] and decoded[0].ts_ns <= decoded[1].ts_ns <= decoded[2].ts_ns
    assert reports(dp) == []
    c = dp.int_counters()
    assert (c["transit"], c["delivered"], c["sourced"], c["exported"], c["failed"]) == (3, 1, 0, 0, 0)
    if not leaf_int:                                           # host stacks only: plain UDP is not instrumented
        plain = path(dp, topo)
        assert all(not Ether(f)[IP].tos & 0x04 for _, f in plain) and Ether(plain[2][1])[IP].len == 128


def test_a_host_stack_within_one_leaf_gets_that_leafs_record(dp, topo):
    set_int(dp, enabled=0, host_stacks=1)
    sent, ((eg, f),) = host_path(dp, topo, dst="h1", hops=1)
    st = IntStack(bytes(Ether(f)[UDP].payload))
    assert eg.peer_node == "h1" and len(st.hops) == 1 and st.hops[0].switch_id == topo.switch_ids["leaf0"]
    assert dp.int_counters()["delivered"] == 1


def test_a_host_stack_where_host_stacks_are_off_is_left_alone_and_counted(dp, topo):
    set_int(dp, enabled=1, host_stacks=0)
    sent, ((_eg, f),) = host_path(dp, topo, hops=1)
    assert Ether(f)[IP].len == Ether(sent)[IP].len and bytes(Ether(f)[UDP].payload) == bytes(Ether(sent)[UDP].payload)
    assert dp.int_counters()["failed"] == 1 and dp.int_counters()["transit"] == 0
