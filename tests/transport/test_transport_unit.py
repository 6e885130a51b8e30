"""The RoCE engine's extended transport, pure logic: entropy policies, XACK format, the RUD receiver's SACK bitmap,
echoes and its NAK of a trimmed packet, HPCC's INT stack and its echo (no network)."""
import struct

from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP

from testbed.workloads.roce import entropy, wire as w
from testbed.workloads.roce.requester import RttStats
from testbed.workloads.roce.responder import Responder


class _Sink:
    """Stands in for the host Endpoint: keeps every control packet a Responder sends."""

    def __init__(self):
        self.pkts: list[bytes] = []

    def send_ctl(self, pkt: bytes, dst: str, prio=None) -> bool:
        self.pkts.append(pkt)
        return True

    def last(self):
        """(is NAK, PSN, XACK tuple) of the last control packet."""
        p = self.pkts[-1]
        a = IP(p)
        return a[AETH].syndrome >> 5 == 3, a[BTH].psn, w.parse_xack(p, 20 + 8 + 16, len(p) - 4)


def _responder(receiver="ooo", npk=64, ext=True):
    flow = {"flow_id": 0, "size_bytes": npk * 1024, "src_addr": "10.0.0.1", "dst_addr": "10.0.1.2", "sport": 49152,
            "opts": {"receiver": receiver, "mtu": 1024, "msg_bytes": npk * 1024, "reorder_window": 32,
                     "reorder_time_s": 1.0, "rto_s": 1.0, "cnp_interval_s": 1e-3, "ext": ext}}
    ep = _Sink()
    return Responder(flow, ep, drain_s=0.1), ep


def _packet(psn: int, ts: int = 0, trimmed: bool = False, ext: bool = True) -> bytearray:
    op = w.OP_WRITE_FIRST if psn == 0 else w.OP_WRITE_MIDDLE
    hdr = (w.BTH_RETH.pack(op, 0, 0xFFFF, 0x100, psn, 0, 0, 1 << 20) if psn == 0 else
           w.BTH.pack(op, 0, 0xFFFF, 0x100, psn))
    p = bytearray(hdr + (w.XTH.pack(ts, 0) if ext else b"") + bytes(1024) + bytes(4))
    if trimmed:
        p = p[:w.TRIM_KEEP]
        p[4] |= w.BTH_TRIMMED
    return p


def _deliver(r, psn, now=0.0, sport=49152, tos=w.ECT0, **kw):
    p = _packet(psn, **kw)
    r.on_data(p, len(p), p[0], tos, now, sport)


def test_sack_bitmap_covers_the_psns_after_the_cumulative_ack():
    r, ep = _responder()
    for psn in (0, 1, 3, 5):
        _deliver(r, psn)
    r._ack()
    nak, psn, x = ep.last()
    flags, base, bitmap, _ts, _credit, echoes, recs = x
    assert not nak and psn == 1 and recs == b""                       # cumulative: PSNs 0 and 1
    assert flags & w.XACK_SACK and base == 3 and bitmap == 0b101      # 3 and 5 received, 4 missing
    assert len(echoes) == 4 and all(e == (49152, 0) for e in echoes)


def test_every_arrival_counts_towards_an_ack_with_sacks_and_echoes_carry_entropy_and_ce():
    r, ep = _responder()
    _deliver(r, 1, sport=49153, tos=w.CE, ts=777)     # PSN 0 missing: the cumulative ACK cannot move
    for psn in range(2, 9):
        _deliver(r, psn, sport=49150 + psn)
    nak, psn, x = ep.last()                           # the 8th arrival sent an ACK anyway
    assert len(ep.pkts) == 1 and not nak
    flags, base, bitmap, ts, _credit, echoes, _recs = x
    assert base == 1 and bitmap == 0xFF and flags & w.XACK_TS     # base: the first missing PSN + 1
    assert echoes[0] == (49153, w.ECHO_CE) and echoes[-1] == (49158, 0)


def test_a_trimmed_packet_is_nakked_at_once():
    r, ep = _responder()
    _deliver(r, 0)
    _deliver(r, 1, trimmed=True, ts=5)
    nak, psn, x = ep.last()
    assert nak and psn == 1 and x[0] & w.XACK_TRIM and r.trims == 1
    assert x[5][-1] == (49152, w.ECHO_TRIM) and x[3] == 5
    assert r.bytes == 1024                            # the trimmed header placed nothing
    _deliver(r, 1)                                    # the retransmission completes PSN 1
    assert r.epsn == 2 and r.result()["trims_seen"] == 1


def test_gbn_nakks_the_expected_psn_for_a_trimmed_packet():
    r, ep = _responder(receiver="gbn", ext=False)
    _deliver(r, 0, ext=False)
    _deliver(r, 2, ext=False, trimmed=True)
    nak, psn, x = ep.last()
    assert nak and psn == 1 and x[0] & w.XACK_TRIM


def test_round_robin_uses_every_value_in_turn():
    p = entropy.make("packet", 4, 1e-3, 0)
    assert [p.pick(0) for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert p.stats()["entropies_used"] == 4


def test_reps_recycles_clean_values_and_drops_marked_ones():
    p = entropy.make("reps", 16, 1e-3, 0)
    p.feedback(3, False, False, 0)
    p.feedback(7, True, False, 0)                     # CE: not recycled
    p.feedback(5, False, True, 0)                     # trimmed: not recycled
    p.feedback(9, False, False, 0)
    assert [p.pick(0), p.pick(0)] == [3, 9]           # the clean ones, in order
    assert p.explored == 0
    p.pick(0)                                         # nothing to recycle: explore
    assert p.explored == 1 and p.stats()["entropy_penalties"] == 2


def test_bitmap_skips_penalised_values_until_the_penalty_decays():
    p = entropy.make("bitmap", 4, 1e-3, 0)
    p.feedback(1, True, False, 0.0)                   # CE: 1 point
    p.feedback(2, False, True, 0.0)                   # trim: 4 points
    assert [p.pick(0.0) for _ in range(4)] == [0, 3, 0, 3]
    assert [p.pick(1.5e-3) for _ in range(3)] == [0, 1, 3]   # value 1 decayed after 1 ms, value 2 has 3 left
    assert 2 in [p.pick(4.1e-3) for _ in range(4)]    # 4 points × 1 ms
    p.lost(0, 5e-3)
    assert p.score[0] == entropy.PENALTY_MAX


def test_bitmap_with_everything_penalised_takes_the_least_penalised():
    p = entropy.make("bitmap", 3, 1.0, 0)
    for k, pts in ((0, 3), (1, 1), (2, 2)):
        for _ in range(pts):
            p.feedback(k, True, False, 0.0)
    assert p.pick(0.0) == 1


def test_rtt_estimator_and_adaptive_rto():
    r = RttStats()
    assert r.rto(0.01) == 0.01
    for _ in range(50):
        r.add(0.02)
    assert abs(r.srtt - 0.02) < 1e-9 and r.rto(0.01) < 0.025
    assert r.stats()["rtt_p50_s"] == 0.02 and r.stats()["rtt_min_s"] == 0.02


def test_xack_round_trip():
    b = w.xack_bytes(w.XACK_SACK | w.XACK_CREDIT, 0x1000005, 0b1011, 123456, 99, [(1000, 1), (1001, 2)])
    assert len(b) == w.XACK_LEN + 2 * w.ECHO_LEN
    assert w.parse_xack(b, 0, len(b)) == (5, 5, 0b1011, 123456, 99, [(1000, 1), (1001, 2)], b"")
    assert w.parse_xack(b, 0, 10) is None


# ---------------------------------------------------------------- HPCC: the host INT stack and its echo

def _record(switch: int, queue: int, tx: int, ts: int, kbps: int) -> bytes:
    """One hop record laid out as docs/int.md says (written here by hand, not with wire.INT_HOP)."""
    return struct.pack("!IIIIQII", switch, (1 << 16) | 2, 999, (3 << 24) | queue, ts, tx, kbps)


def test_an_hpcc_sender_starts_an_empty_host_stack_as_docs_int_md_lays_it_out():
    st = w.int_host_stack(3, (26 << 2) | w.ECT0)
    assert len(st) == 16
    assert st[0] == 0x10 and st[1] == 4 and st[2] == w.INT_SHIM_HOST and st[3] == 0x6A   # type 1, 4 words, TOS
    w0, instr, ds_id, ds_instr, ds_flags = struct.unpack("!IHHHH", st[4:])
    assert (w0 >> 28, (w0 >> 25) & 0b111, (w0 >> 8) & 0x1F, w0 & 0xFF) == (2, 0, 8, 3)   # version, D/E/M,
    assert (instr, ds_id, ds_instr, ds_flags) == (0xF800, 0x4654, 0xC000, 0)              # HopML, remaining


def test_the_receiver_echoes_the_last_stack_once_and_the_sender_reads_it_in_path_order():
    r, ep = _responder()
    first = _record(7, 100, 1000, 5_000, 10_000) + _record(9, 200, 2000, 4_000, 20_000)   # newest (the sink) first
    last = _record(7, 300, 3000, 15_000, 10_000) + _record(9, 0, 4000, 14_000, 20_000)
    p = _packet(0)
    r.on_data(p, len(p), p[0], w.ECT0 | w.INT_DSCP_BIT, 0.0, 49152, first)
    p = _packet(1)
    r.on_data(p, len(p), p[0], w.ECT0 | w.INT_DSCP_BIT, 0.0, 49152, last)
    r._ack()
    *_, recs = ep.last()[2]
    assert ep.last()[2][0] & w.XACK_INT and recs == last              # the newest packet's records, as they came
    hops = w.int_hops(recs)
    assert [h.qlen_bytes for h in hops] == [0, 300] and [h.tx_bytes for h in hops] == [4000, 3000]
    assert [h.ts_ns for h in hops] == [14_000, 15_000] and [h.link_rate_bps for h in hops] == [20e6, 10e6]
    r._ack()
    assert ep.last()[2][6] == b"" and not ep.last()[2][0] & w.XACK_INT   # echoed once
    assert r.result()["int_stacks"] == 2


def test_xack_with_int_records_round_trips():
    recs = _record(1, 2, 3, 4, 5) * 3
    b = w.xack_bytes(w.XACK_TS, 10, 0, 77, 0, [(1000, 0)], recs)
    assert w.parse_xack(b, 0, len(b)) == (w.XACK_TS | w.XACK_INT, 10, 0, 77, 0, [(1000, 0)], recs)
    assert w.parse_xack(b, 0, len(b) - 32)[6] == recs[:64]          # a cut XACK yields the whole records it holds


def test_hpcc_reads_a_tx_counter_that_wrapped_at_32_bits():
    from testbed.workloads.roce.cc import HpccParams, HpccSender
    from testbed.workloads.roce.cc.base import Hop
    s = HpccSender(HpccParams.scaled(10e6, 1e-3), 0.0)
    s.measure((Hop(0, 2**32 - 500, 0, 10e6),))
    u = s.measure((Hop(0, 750, 1_000_000, 10e6),))                  # 1,250 bytes in 1 ms = 10 Mbit/s
    assert abs(u - 1.0) < 1e-9
