"""Credit-based flow control: the switch program's accounting in credit mode (BPF_PROG_TEST_RUN on crafted
packets: bytes charged per ingress, no Xoff, the credit buffer as the ingress's limit) and the credit meter's
pure arithmetic (grant, margin, the meter's token rate, the in-place TBF bucket rewrite)."""
import time
from types import SimpleNamespace

import pytest

from conftest import datapath_fixtures, fresh_queues

from testbed.qos.credits import CreditMeter, grant, margin_bytes, meter_rate
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


def test_margin_is_two_frames_whatever_the_rate():
    assert margin_bytes(1500) == 2 * 1514
    assert margin_bytes(9000) == 2 * 9014


class LateSender:
    """A sender's credit meter as the agent drives it, each TBF change landing after the port sent up to ``late``
    more bytes from the bucket in force (a change replaces the bucket, it does not add to it); ``sent`` is FCTBS."""

    def __init__(self, late: int, tokens: int = 0, sent: int = 0):
        self.late, self.tokens, self.sent = late, tokens, sent
        self.kicked, self.errors, self.cap = {}, [], None

    def netlink(self, port, burst):
        spent = min(self.tokens, self.late)
        self.sent, self.tokens = self.sent + spent, burst
        self.changes = getattr(self, "changes", 0) + 1

    def read_qdisc(self, port, prio, required=False):
        return SimpleNamespace(bytes=self.sent)

    def control(self, op, key, at, sent, cap):
        self.cap = (sent, cap)

    def kick(self, port, prio):
        pass

    def drain(self) -> int:
        self.sent, self.tokens = self.sent + self.tokens, 0
        return self.sent


class Identity:
    """A TbfBucket stand-in whose encoded change is the burst itself (LateSender reads it back)."""
    @staticmethod
    def with_burst(burst):
        return burst


@pytest.mark.parametrize("late", [0, 1514, 9_000, 40_000])
def test_a_grant_holds_its_limit_however_late_the_agent_applies_it(late):
    """The sender has sent 100,000 bytes and still holds 20,000 of an old grant; the receiver raises the limit
    (FCCL) to 130,000. Whatever the old bucket lets out while the changes are on their way, the sender never
    passes 130,000 + the one frame the close lets it keep (before: one change of the bucket to 30,000 let a
    20,000-byte delay pass the limit by 20,000), and an agent on time loses it nothing."""
    frame = 1514
    port = LateSender(late, tokens=20_000, sent=100_000)
    meter = object.__new__(CreditMeter)
    meter.agent = port
    assert meter._apply(7, 3, Identity, frame, 130_000, 120_000, 30_000, modelled=True) is not None
    opened = port.tokens
    assert port.drain() <= 130_000 + frame
    assert port.cap[1] == 130_000 and port.cap[0] + opened == 130_000        # the queue model learns the limit
    if late == 0:
        assert opened == 30_000 and port.sent == 130_000


def test_raises_of_less_than_two_frames_never_let_the_port_pass_its_limit():
    """A port at its limit (it sent all it was granted) gets raises of one frame at a time: each would need a close
    (which lets a frame out) without room to open after it, so none is applied until the limit has grown by two
    frames; meanwhile the port stays within the newest limit + the one frame of the margin."""
    frame = 1514
    port = LateSender(0, tokens=0, sent=100_000)
    meter = object.__new__(CreditMeter)
    meter.agent = port
    current = 100_000
    for limit in range(100_000 + frame, 100_000 + 10 * frame, frame):
        if meter._apply(7, 3, Identity, frame, limit, current, 20_000, modelled=False) is not None:
            current = limit
        assert port.drain() <= limit + frame, limit
    assert getattr(port, "changes", 0) == 2 * 4                 # opened at +2, +4, +6 and +8 frames



def test_bytes_that_bypassed_the_meter_never_open_more_than_the_credit():
    """The ingress counted 50,000 bytes the port's meter never sent (a host's packets on the lossless DSCP from a
    socket of another priority): FCCL − FCTBS would open 70,000 bytes (and, growing, pass what a TBF bucket at the
    meter's rate can hold); the grant opens no more than the 20,000 of credit the receiver has."""
    frame = 1514
    port = LateSender(0, tokens=0, sent=100_000)
    meter = object.__new__(CreditMeter)
    meter.agent = port
    assert meter._apply(7, 3, Identity, frame, 150_000 + 20_000, 120_000, 20_000, modelled=False) is not None
    assert port.tokens == 20_000 and port.drain() == 120_000

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



def test_an_ingress_recount_commits_the_drain_so_a_model_moved_back_cannot_undo_a_grant(dp, topo):
    """CTL_INGRESS_RECOUNT, what the credit meter reads: ten packets charged to h0's ingress while the egress
    stands still; then the egress model has sent six of them, and the recount returns the four still queued and
    commits that. A resync that moves the egress model back (the real queue lagged and still holds all ten) does
    not bring the six back: the ingress holds four, so a grant sized on four stays within the buffer (a figure
    read beside the program without committing would now read ten)."""
    from testbed.datapath import queue_model as qm
    inp, f = _frame(topo)
    out = topo.port(topo.port_named("h1", "eth0").peer_ifindex)
    fresh_queues(dp)
    k, ik = out.ifindex * N_PRIO + 3, inp.ifindex * N_PRIO + 3
    paused, vq = dp.bpf[b"egress_paused"], dp.bpf[b"vq"]
    paused[paused.Key(k)] = paused.Leaf(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    assert [testrun.run(dp.ingress_fd, f, ifindex=inp.ifindex).verdict for _ in range(10)] == [TC_ACT_REDIRECT] * 10
    ps = dp.bpf[b"port_qos"][dp.bpf[b"port_qos"].Key(out.ifindex)].ps_per_byte     # 8 µs a byte at 1 Mbit/s

    def model_holds(frames):
        v = vq[vq.Key(k)]
        v.finish = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + frames * len(f) * ps // 1000
        vq[vq.Key(k)] = v

    paused[paused.Key(k)] = paused.Leaf(0)
    model_holds(4)
    q1 = dp.control(qm.CTL_INGRESS_RECOUNT, ik)
    assert 4 * len(f) - 100 <= q1 <= 4 * len(f)              # 100 bytes: 800 µs of drain between the two calls
    model_holds(10)
    assert dp.control(qm.CTL_INGRESS_RECOUNT, ik) == q1
    assert dp.ingress_queued(inp.ifindex, 3) == q1
    assert dp.control(qm.CTL_INGRESS_RECOUNT, 10**9) == -1    # no such ingress: refused
