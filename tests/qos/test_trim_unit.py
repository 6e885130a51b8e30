"""Packet trimming in the switch program (ebpf/lib/trim.h, qos_egress in lib/qos.h) on crafted scapy RoCEv2
packets with BPF_PROG_TEST_RUN: below the limit a packet is forwarded untouched; over it a RoCEv2 packet is cut
to IP + UDP + 64 bytes (IP length and checksum fixed, UDP length 72 and checksum 0, BTH byte 4 bit 0x20 set,
the BTH otherwise as sent) and sent on the trim priority (its queue, its HTB class in skb->priority), counted in
`trims`, not in `drops`; a non-RoCE packet over the limit is still dropped; a trimmed header is classified to
the trim priority at the next hop and never trimmed again; with trimming off the packet is dropped as before.

The queue a packet sees is set in the `vq` map, as tests/qos/test_qos_unit.py does."""
import os
import struct
import time

import pytest

from conftest import datapath_fixtures, fresh_queues

from testbed.datapath import N_PRIO, testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT, TC_ACT_SHOT
from testbed.qos_classes import skb_priority
from testbed.workloads.roce import wire

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, Raw = scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.Raw

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF, namespaces)")

BUFFER = 100_000
TRIM_PRIO = 7
DATA_PRIO = 0            # RoCE's DSCP 26 is not mapped: the default priority, lossy

# every link at 1 Mbit/s (8 µs a byte): a depth set just before a run drains only a few bytes meanwhile, even
# across a stall of a busy machine (at a fabric link's default rate 50 KB of excess drained in ~10 ms); EXCESS
# over the buffer lasts 4 s at 1 Mbit/s (50 KB, 0.4 s, once drained below the limit beside a CPU hog)
EXCESS = 500_000
scen, topo, loaded = datapath_fixtures({"topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                                                     "host_link": {"rate": "1mbit", "buffer": "256KB"},
                                                     "fabric_link": {"rate": "1mbit", "buffer": "256KB"}},
                                        "switch": {"buffer": BUFFER, "trim": {"enabled": True}},
                                        "traffic": {"engine": "roce"}}, "trm", host_ports=True, name="loaded")


@pytest.fixture
def dp(loaded):
    yield fresh_queues(loaded)
    for sw in topo_switch_ids(loaded):                 # what a test changed in the trim configuration
        set_trim(loaded, sw, on=1, threshold=0)


def topo_switch_ids(dp):
    return list(dp.topo.switch_ids.values())


def set_trim(dp, sw_id, **kw):
    t = dp.bpf[b"qos_config"]
    v = t[t.Key(sw_id)]
    if "on" in kw:
        v.trim_on = kw["on"]
    if "threshold" in kw:
        v.trim_threshold = kw["threshold"]
    t[t.Key(sw_id)] = v


def ports(topo):
    """(ingress port facing h0, egress port facing h1) at leaf0."""
    inp = topo.port(topo.port_named("h0", "eth0").peer_ifindex)
    out = topo.port(topo.port_named("h1", "eth0").peer_ifindex)
    return inp, out


PSN = 0x123456
DQPN = 0x000A0B


def roce_payload(n=1000, psn=PSN, flags=0):
    """UDP payload of an RDMA WRITE FIRST: BTH (byte 4 = ``flags``) + RETH + ``n`` data bytes + ICRC."""
    bth = struct.pack("!BBHII", wire.OP_WRITE_FIRST, 0, wire.PKEY_DEFAULT, (flags << 24) | DQPN, psn)
    reth = wire.RETH.pack(0x1000, 0x42, 1 << 20)
    return bth + reth + bytes((i * 7) & 0xFF for i in range(n)) + b"\xde\xad\xbe\xef"


def frame(topo, payload, dport=wire.ROCE_PORT, dst="h1", src_port=None):
    inp = topo.port(src_port) if src_port else ports(topo)[0]
    return bytes(Ether(src=inp.peer_mac, dst=inp.mac)
                 / IP(src=topo.address("h0"), dst=topo.address(dst), tos=wire.DSCP_ROCE << 2 | wire.ECT0, flags="DF")
                 / UDP(sport=49152, dport=dport, chksum=0) / Raw(payload))


def set_depth(dp, ifindex, prio, depth):
    ps = dp.bpf[b"port_qos"][dp.bpf[b"port_qos"].Key(ifindex)].ps_per_byte
    t = dp.bpf[b"vq"]
    k = t.Key(ifindex * N_PRIO + prio)
    v = t[k]
    v.finish = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + depth * ps // 1000
    t[k] = v


def run(dp, f, ifindex):
    r = testrun.run(dp.ingress_fd, f, ifindex=ifindex)
    return r.verdict, r.data, r.priority


def counters(dp, ifindex):
    q = dp.queue_counters(ports=[ifindex])
    return q[(ifindex, DATA_PRIO)], q[(ifindex, TRIM_PRIO)]


def ip_checksum_valid(p):
    ck = p[IP].chksum
    q = p[IP].copy()
    del q.chksum
    return IP(bytes(q)).chksum == ck


def test_the_loader_configures_trimming(dp, topo):
    for sw, sid in topo.switch_ids.items():
        v = dp.bpf[b"qos_config"][dp.bpf[b"qos_config"].Key(sid)]
        assert (v.trim_on, v.trim_classify, v.trim_prio, v.trim_threshold) == (1, 1, TRIM_PRIO, 0), sw
    _, out = ports(topo)
    assert dp.ports[out.ifindex].classes == (DATA_PRIO, TRIM_PRIO)       # the trim priority has its class


def test_below_the_limit_a_roce_packet_is_forwarded_untouched(dp, topo):
    inp, out = ports(topo)
    f = frame(topo, roce_payload())
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER - 5000)
    verdict, data, prio = run(dp, f, inp.ifindex)
    assert verdict == TC_ACT_REDIRECT and len(data) == len(f)
    assert data[14 + 28:] == f[14 + 28:]                                  # UDP payload (BTH …) as sent
    assert prio == skb_priority(DATA_PRIO)
    data_q, trim_q = counters(dp, out.ifindex)
    assert (data_q.packets, data_q.trims, data_q.drops, trim_q.packets) == (1, 0, 0, 0)


def test_over_the_limit_a_roce_packet_is_trimmed_to_its_headers(dp, topo):
    inp, out = ports(topo)
    payload = roce_payload()
    f = frame(topo, payload)
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER + EXCESS)                   # the frame does not fit
    verdict, data, prio = run(dp, f, inp.ifindex)
    assert verdict == TC_ACT_REDIRECT
    p = Ether(data)
    assert len(data) == 14 + 92 and p[IP].len == 92 and ip_checksum_valid(p)
    assert p[UDP].len == 72 and p[UDP].chksum == 0 and p[UDP].dport == wire.ROCE_PORT
    kept = bytes(p[UDP].payload)
    assert len(kept) == 64
    assert kept[4] == wire.BTH_TRIMMED and kept[4] & 0x20                 # the trim flag, FECN/BECN clear
    op, _, pkey, qp, apsn = struct.unpack("!BBHII", kept[:12])
    assert (op, pkey, qp & 0xFFFFFF, apsn & 0xFFFFFF) == (wire.OP_WRITE_FIRST, wire.PKEY_DEFAULT, DQPN, PSN)
    assert kept[:4] == payload[:4] and kept[5:] == payload[5:64]         # BTH, RETH and data head as sent
    assert p[IP].tos == f[15] and p[IP].ttl == 63
    assert prio == skb_priority(TRIM_PRIO)
    data_q, trim_q = counters(dp, out.ifindex)
    assert (data_q.trims, data_q.drops, data_q.packets) == (1, 0, 0)
    assert (trim_q.packets, trim_q.bytes, trim_q.drops, trim_q.trims) == (1, 14 + 92, 0, 0)
    vq = dp.bpf[b"vq"]                                                    # the header joined the trim queue
    assert vq[vq.Key(out.ifindex * N_PRIO + TRIM_PRIO)].enq == 14 + 92
    assert vq[vq.Key(out.ifindex * N_PRIO + DATA_PRIO)].enq == 0


def test_a_flagged_packet_keeps_its_flags_and_becn(dp, topo):
    """FECN/BECN share the byte: a trim only adds 0x20."""
    inp, out = ports(topo)
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER + EXCESS)
    _, data, _ = run(dp, frame(topo, roce_payload(flags=0x40)), inp.ifindex)
    assert bytes(Ether(data)[UDP].payload)[4] == 0x40 | wire.BTH_TRIMMED


def test_a_non_roce_udp_packet_over_the_limit_is_still_dropped(dp, topo):
    inp, out = ports(topo)
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER + EXCESS)
    verdict, _, _ = run(dp, frame(topo, roce_payload(), dport=5001), inp.ifindex)
    assert verdict == TC_ACT_SHOT
    data_q, trim_q = counters(dp, out.ifindex)
    assert (data_q.drops, data_q.trims, trim_q.packets) == (1, 0, 0)


def test_a_short_roce_packet_over_the_limit_is_dropped(dp, topo):
    """Nothing to cut from 64 bytes of UDP payload or less (ACKs, CNPs, tiny writes)."""
    inp, out = ports(topo)
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER + EXCESS)
    verdict, _, _ = run(dp, frame(topo, roce_payload(n=64 - 32)), inp.ifindex)    # UDP payload: exactly 64
    assert verdict == TC_ACT_SHOT
    data_q, _ = counters(dp, out.ifindex)
    assert (data_q.drops, data_q.trims) == (1, 0)


def test_with_the_trim_queue_full_too_the_header_is_dropped(dp, topo):
    inp, out = ports(topo)
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER + EXCESS)
    set_depth(dp, out.ifindex, TRIM_PRIO, BUFFER + EXCESS)
    verdict, _, _ = run(dp, frame(topo, roce_payload()), inp.ifindex)
    assert verdict == TC_ACT_SHOT
    data_q, trim_q = counters(dp, out.ifindex)
    assert (data_q.trims, data_q.drops, trim_q.drops, trim_q.packets) == (0, 0, 1, 0)


def test_threshold_trims_before_the_buffer_is_full(dp, topo):
    inp, out = ports(topo)
    set_trim(dp, topo.switch_ids["leaf0"], threshold=20_000)
    set_depth(dp, out.ifindex, DATA_PRIO, 40_000)                         # past the threshold, within the buffer
    verdict, data, prio = run(dp, frame(topo, roce_payload()), inp.ifindex)
    assert verdict == TC_ACT_REDIRECT and len(data) == 14 + 92 and prio == skb_priority(TRIM_PRIO)
    set_depth(dp, out.ifindex, DATA_PRIO, 40_000)
    other = frame(topo, roce_payload(), dport=5001)                        # not RoCE: the buffer still applies
    verdict, data, prio = run(dp, other, inp.ifindex)
    assert verdict == TC_ACT_REDIRECT and len(data) == len(other) and prio == skb_priority(DATA_PRIO)
    set_depth(dp, out.ifindex, DATA_PRIO, 10_000)                         # below the threshold: untouched
    f = frame(topo, roce_payload())
    verdict, data, _ = run(dp, f, inp.ifindex)
    assert verdict == TC_ACT_REDIRECT and len(data) == len(f)
    data_q, _ = counters(dp, out.ifindex)
    assert (data_q.trims, data_q.drops, data_q.packets) == (1, 0, 2)


def test_with_trimming_off_the_packet_is_dropped_as_before(dp, topo):
    inp, out = ports(topo)
    set_trim(dp, topo.switch_ids["leaf0"], on=0)
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER + EXCESS)
    verdict, _, _ = run(dp, frame(topo, roce_payload()), inp.ifindex)
    assert verdict == TC_ACT_SHOT
    data_q, trim_q = counters(dp, out.ifindex)
    assert (data_q.drops, data_q.trims, trim_q.packets) == (1, 0, 0)


def egress_of(topo, ifindex, data):
    sw = topo.port(ifindex).node
    return next(p for p in topo.ports[sw] if p.mac == Ether(data[:14]).src.lower())


def test_a_trimmed_header_goes_on_the_trim_priority_at_the_next_hop(dp, topo):
    """h0 → h2: leaf0 trims (its uplinks full), the spine classifies the header to the trim priority although
    its own data queue is full too: the header is neither dropped nor trimmed again."""
    inp, _ = ports(topo)
    for up in topo.ports["leaf0"]:
        if up.role == "up":
            set_depth(dp, up.ifindex, DATA_PRIO, BUFFER + EXCESS)
    verdict, data, prio = run(dp, frame(topo, roce_payload(), dst="h2"), inp.ifindex)
    assert verdict == TC_ACT_REDIRECT and len(data) == 14 + 92 and prio == skb_priority(TRIM_PRIO)
    eg = egress_of(topo, inp.ifindex, data)
    spine_in = eg.peer_ifindex
    down = egress_of(topo, spine_in, run(dp, data, spine_in)[1])          # the spine's port towards leaf1
    dp.reset_counters()
    set_depth(dp, down.ifindex, DATA_PRIO, BUFFER + EXCESS)
    verdict, out, prio = run(dp, data, spine_in)
    assert verdict == TC_ACT_REDIRECT and prio == skb_priority(TRIM_PRIO)
    assert Ether(out)[UDP].payload.load == Ether(data)[UDP].payload.load   # not cut again
    data_q, trim_q = counters(dp, down.ifindex)
    assert (trim_q.packets, trim_q.trims, data_q.trims, data_q.drops, data_q.packets) == (1, 0, 0, 0, 0)


def test_a_long_flagged_packet_is_classified_not_trimmed(dp, topo):
    """The flag decides, not the length: a full-sized packet that carries it goes to the trim priority whole."""
    inp, out = ports(topo)
    set_depth(dp, out.ifindex, DATA_PRIO, BUFFER + EXCESS)
    f = frame(topo, roce_payload(flags=wire.BTH_TRIMMED))
    verdict, data, prio = run(dp, f, inp.ifindex)
    assert verdict == TC_ACT_REDIRECT and len(data) == len(f) and prio == skb_priority(TRIM_PRIO)
    data_q, trim_q = counters(dp, out.ifindex)
    assert (trim_q.packets, data_q.trims, trim_q.trims, data_q.drops) == (1, 0, 0, 0)
