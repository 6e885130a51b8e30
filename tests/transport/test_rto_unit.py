"""The RoCE engine's retransmit timeout, pure: the RFC 6298 estimator (hand-computed values, Karn's rule on
go-back-N's own send times, back-off), the floor ``rto: auto`` takes from the fabric, the fixed-RTO warning, and
the receiver's count of spurious retransmissions carried to flows.csv and summary.csv (no network)."""
from __future__ import annotations

import pytest

from testbed import report as rp, topology
from testbed.workloads import flows
from testbed.workloads.results import flow_result
from testbed.workloads.roce import requester as rq, wire as w
from testbed.workloads.roce.requester import Requester, RttStats
from testbed.workloads.roce.responder import Responder

from conftest import make_scenario

LINK = {"rate": "40mbit", "buffer": "256KB"}
BASE = {"spines": 2, "leaves": 2, "hosts_per_leaf": 1, "host_link": LINK, "fabric_link": LINK}


# ---------------------------------------------------------------- the estimator (RFC 6298 2.2–2.3, 5.5)

def test_first_sample_sets_srtt_and_rttvar_and_the_rto():
    r = RttStats(expect=True, granularity=0.001)
    assert r.rto(0.01) == pytest.approx(0.04)              # before a sample: INITIAL (4) × the floor
    r.add(0.1)                                             # R = 100 ms: SRTT = R, RTTVAR = R/2
    assert (r.srtt, r.var) == (pytest.approx(0.1), pytest.approx(0.05))
    assert r.rto(0.01) == pytest.approx(0.1 + 4 * 0.05)    # SRTT + 4·RTTVAR = 300 ms


def test_a_second_sample_moves_rttvar_by_a_quarter_and_srtt_by_an_eighth():
    r = RttStats(granularity=0.001)
    r.add(0.1)
    r.add(0.02)                                            # RTTVAR = 3/4·50 + 1/4·|100 − 20| = 57.5 ms (old SRTT)
    assert r.var == pytest.approx(0.0575)
    assert r.srtt == pytest.approx(0.09)                   # SRTT = 7/8·100 + 1/8·20 = 90 ms
    assert r.rto(0.01) == pytest.approx(0.09 + 4 * 0.0575)  # 320 ms


def test_the_floor_and_the_clock_granularity_bound_the_rto_from_below():
    r = RttStats(granularity=0.002)
    for _ in range(200):
        r.add(0.005)                                       # a steady 5 ms: RTTVAR → 0
    assert r.rto(0.0) == pytest.approx(0.005 + 0.002)      # SRTT + G once 4·RTTVAR < G
    assert r.rto(0.4) == 0.4                               # the floor above the estimate


def test_back_off_doubles_per_timeout_and_a_new_ack_resets_it():
    r = RttStats(granularity=0.001)
    r.add(0.1)
    r.timed_out()
    assert r.rto(0.01) == pytest.approx(2 * 0.3)
    r.timed_out()
    assert r.rto(0.01) == pytest.approx(4 * 0.3)
    for _ in range(30):
        r.timed_out()
    assert r.rto(0.01) == RttStats.MAX_S                    # capped at 60 s
    r.new_ack()
    assert r.rto(0.01) == pytest.approx(0.3)


# ---------------------------------------------------------------- the requester: samples without timestamps

class _Ep:
    users = 0

    def __init__(self):
        self.req = {}

    def release(self):
        pass


class _Sock:
    def close(self):
        pass


def _requester(monkeypatch, **opts) -> Requester:
    """A go-back-N requester of 64 packets with no sockets (the endpoint and the data socket stubbed)."""
    monkeypatch.setattr(rq, "endpoint", _Ep)
    monkeypatch.setattr(rq.w, "data_socket", lambda *a, **k: _Sock())
    flow = {"flow_id": 0, "size_bytes": 64 * 1024, "src_addr": "198.18.0.1", "dst_addr": "198.18.0.2",
            "sport": 49152, "opts": {"mtu": 1024, "msg_bytes": 64 * 1024, "rto_s": 0.01, **opts}}
    r = Requester(flow, {"t0": 0.0, "duration_s": 10.0})
    r.begin(0.0)
    return r


def _send(r: Requester, psns, now: float) -> None:
    r._commit([(i, i < r.hi, 1024, 0, 1072) for i in psns], None, None, now)


def _ack(r: Requester, psn: int, now: float) -> None:
    t = w.Template("198.18.0.2", "198.18.0.1", 0x101)
    pkt = w.ack_packet(t, psn, 49152, 0)
    buf = bytearray(pkt[28:])                              # what the endpoint's UDP socket reads: BTH onwards
    r.on_ack(buf, len(buf), now)


def test_go_back_n_samples_its_own_send_times_and_skips_what_a_resend_makes_ambiguous(monkeypatch):
    r = _requester(monkeypatch, rto_auto=True)
    assert r.adaptive and r.rtt.expect
    _send(r, range(8), 1.0)
    _ack(r, 7, 1.1)                                        # PSN 7, sent at 1.0, covered at 1.1: R = 100 ms
    assert r.rtt.n == 1 and r.rtt.srtt == pytest.approx(0.1)
    _send(r, range(8, 16), 1.2)
    r.nxt = 8
    _send(r, range(8, 16), 1.3)                            # go back N: PSNs 8–15 again
    _ack(r, 15, 1.35)                                      # either copy may have made it: no sample (Karn)
    assert r.rtt.n == 1 and r.una == 16
    _send(r, range(16, 24), 1.4)                           # sent after the resend: valid again
    _ack(r, 23, 1.45)
    assert r.rtt.n == 2 and r.rtt.min == pytest.approx(0.05)
    assert r.stats()["rtt_samples"] == 2


def test_a_timeout_backs_the_estimated_rto_off_and_a_new_ack_ends_it(monkeypatch):
    r = _requester(monkeypatch, rto_auto=True)
    _send(r, range(8), 1.0)
    _ack(r, 3, 1.1)                                        # R = 100 ms: RTO = 300 ms
    assert r.rto_now() == pytest.approx(0.3)
    r._check_rto(1.35)                                     # 250 ms without progress: not yet
    assert r.timeouts == 0
    r._check_rto(1.41)
    assert r.timeouts == 1 and r.nxt == 4 and r.rto_now() == pytest.approx(0.6)
    _ack(r, 5, 1.5)                                        # new data: the back-off ends; PSN 5 (never resent)
    assert r.rtt.n == 2                                    # is a sample of 500 ms: SRTT 150 ms, RTTVAR 137.5 ms
    assert r.rto_now() == pytest.approx(0.15 + 4 * 0.1375)


def test_a_fixed_rto_on_go_back_n_stays_fixed(monkeypatch):
    r = _requester(monkeypatch)                            # rto_s 10 ms, not auto: a NIC's timeout
    assert not r.adaptive
    _send(r, range(8), 1.0)
    _ack(r, 7, 1.1)
    assert r.rtt.n == 1 and r.rto_now() == 0.01            # sampled (flows.csv rtt_*), not used
    _send(r, range(8, 16), 1.2)
    r._check_rto(1.211)
    assert r.timeouts == 1 and r.rto_now() == 0.01         # no back-off


# ---------------------------------------------------------------- the floor, the options, the warning

def test_auto_floor_is_the_worst_queueing_twice_with_flow_control_and_follows_time_dilation():
    """4 queues on a leaf–spine path; 256 KB at 40 Mbit/s drains in 52.4288 ms: bound 209.7152 ms, the floor
    without flow control; with PFC (or credits) on a tier a paused queue drains slower: 419.4304 ms. The same
    fabric written in real units at 10× the rate with time_dilation 10 emulates the same links, so its floor is
    the same emulated 210 ms (10 × the real fabric's 21 ms)."""
    sc = make_scenario(topology=BASE, traffic={"engine": "roce"})
    assert sc.traffic.roce.rto == "auto" and not sc.traffic.queues_held      # the default; a lossy fabric
    topo = topology.build(sc.topology)
    assert flows.rto_s(sc.traffic.roce, topo) == pytest.approx(4 * 262144 * 8 / 40e6)
    o = flows.roce_opts(sc.traffic, topo)
    assert o["rto_auto"] and o["rto_s"] == pytest.approx(0.2097152)
    assert o["ack_every_s"] == pytest.approx(flows.RTO_FLOOR_S / 8)
    assert o["reorder_time_s"] == pytest.approx(0.2097152 / 4)
    classes = {"dscp": {26: 3}, "lossless": [3]}
    for fc in ({"pfc": {"enabled": True}}, {"credit": {"enabled": True}}):
        held = make_scenario(topology=BASE, switch={"traffic_classes": classes, **fc},
                             traffic={"engine": "roce", "dscp": 26})
        assert held.traffic.queues_held, fc
        assert flows.roce_opts(held.traffic, topo)["rto_s"] == pytest.approx(0.4194304), fc
    fast = {"rate": "400mbit", "buffer": "256KB"}
    dil = make_scenario(time_dilation=10, topology={**BASE, "host_link": fast, "fabric_link": fast},
                        traffic={"engine": "roce"})
    assert flows.rto_s(dil.traffic.roce, topology.build(dil.topology)) == pytest.approx(0.2097152)
    fixed = make_scenario(topology=BASE, traffic={"engine": "roce", "roce": {"rto": "50ms"}})
    o = flows.roce_opts(fixed.traffic, topo)
    assert not o["rto_auto"] and o["rto_s"] == 0.05 and o["ack_every_s"] == pytest.approx(0.05 / 8)


def test_a_fixed_rto_below_the_worst_queueing_warns_in_one_line_for_every_transport():
    topo = topology.build(make_scenario(topology=BASE).topology)

    def warn(**traffic):
        return flows.rto_warning(make_scenario(topology=BASE, traffic={"engine": "roce", **traffic}).traffic, topo)
    assert warn() is None                                  # auto: never
    gbn = warn(roce={"rto": "10ms"})
    assert gbn.startswith("traffic.roce.rto: 10 ms is below the 210 ms") and "go-back-N's fixed RTO" in gbn
    ooo = warn(receiver="ooo", roce={"rto": "10ms"})
    assert ooo.startswith("traffic.roce.rto: 10 ms is below the 210 ms") and "RTO floor" in ooo
    assert "\n" not in gbn + ooo
    assert warn(roce={"rto": "250ms"}) is None
    assert flows.rto_warning(make_scenario(topology=BASE, traffic={"engine": "udp"}).traffic, topo) is None


# ---------------------------------------------------------------- spurious retransmissions (the receiver)

def _responder(receiver: str) -> Responder:
    class Sink:
        def send_ctl(self, pkt, dst, prio=None):
            return True
    flow = {"flow_id": 0, "size_bytes": 16 * 1024, "src_addr": "198.18.0.1", "dst_addr": "198.18.0.2",
            "sport": 49152, "opts": {"receiver": receiver, "mtu": 1024, "msg_bytes": 16 * 1024, "reorder_window": 32,
                                     "reorder_time_s": 1.0, "rto_s": 1.0, "cnp_interval_s": 1e-3,
                                     "ext": receiver == "ooo"}}
    return Responder(flow, Sink(), drain_s=0.1)


def _data(r: Responder, psn: int, trimmed: bool = False) -> None:
    op = w.OP_WRITE_FIRST if psn == 0 else w.OP_WRITE_MIDDLE
    hdr = (w.BTH_RETH.pack(op, 0, 0xFFFF, 0x100, psn, 0, 0, 1 << 20) if psn == 0 else
           w.BTH.pack(op, 0, 0xFFFF, 0x100, psn))
    p = bytearray(hdr + (w.XTH.pack(0, 0) if r.ext else b"") + bytes(1024) + bytes(4))
    if trimmed:
        p = p[:w.TRIM_KEEP]
        p[4] |= w.BTH_TRIMMED
    r.on_data(p, len(p), op, w.ECT0, 0.0, 49152)


@pytest.mark.parametrize("receiver", ["gbn", "ooo"])
def test_spurious_retransmits_are_copies_of_psns_already_accepted(receiver):
    r = _responder(receiver)
    for psn in (0, 1, 2, 3, 2):                            # 2 again: its first copy had arrived
        _data(r, psn)
    _data(r, 5)                                            # a gap: gbn discards it, ooo keeps it
    for psn in (4, 5, 1):                                  # 5: gbn's needed resend / ooo's second copy; 1 again
        _data(r, psn)
    _data(r, 3, trimmed=True)                              # a trimmed copy of an accepted PSN: sent in vain too
    res = r.result()
    want = 3 if receiver == "gbn" else 4                   # 2, 1, trimmed 3 (+ 5 for ooo, which accepted it)
    assert res["spurious_retransmits"] == want
    assert res["dup"] == want - 1                          # the same but the trimmed copy


def test_flows_csv_and_summary_carry_spurious_retransmits():
    f = flows.Flow(flow_id=0, src="h0", dst="h1", src_addr="198.18.0.1", dst_addr="198.18.0.2", sport=49152,
                   dport=4791, proto="rocev2", size_bytes=4096, rate_bps=None, start_s=0.0)
    tx = {"send_start": 10.0, "packets_sent": 6, "retrans": 2}
    rx = {"last_rx": 10.5, "bytes": 4096, "complete": True, "packets": 4, "dup": 1, "spurious_retransmits": 1}
    row = dict(flow_result(f, 10.0, tx, rx).to_dict(), paths_used=1)
    assert row["spurious_retransmits"] == 1 and row["retrans"] == 2
    meta = dict(run_id="r1", scenario="s", load_balancing="ecmp", seed=1, duration_s=1.0, offered_mbps=1.0)
    summary = rp.summarize(rp.links_frame([]), rp.flows_frame([row, dict(row, flow_id=1)]),
                           dict(cpu_bound=False, cpu_busy_max=0.1, cpu_busy_mean=0.1), meta)
    assert summary["spurious_retransmits"] == 2 and summary["retransmits"] == 4


def test_ib_vs_roce_warns_with_the_old_fixed_10ms_and_not_by_default():
    """The issue's measurement: rocev2 with rto 10ms resent 6,357–6,688 packets of 5,120 that were only late."""
    from testbed import scenario
    from conftest import ROOT
    path = ROOT / "scenarios" / "ib-vs-roce.yaml"
    for sets in ([], ["profile=rocev2"], ["profile=infiniband"]):
        sc = scenario.load(path, sets)
        assert flows.rto_warning(sc.traffic, topology.build(sc.topology)) is None, sets
    sc = scenario.load(path, ["profile=rocev2", "traffic.roce.rto=10ms"])
    assert flows.rto_warning(sc.traffic, topology.build(sc.topology)) == (
        "traffic.roce.rto: 10 ms is below the 210 ms a packet can queue on its path (buffers ÷ link rates): "
        "go-back-N's fixed RTO may resend packets that are only late; set traffic.roce.rto: auto (or above 210 ms)")
