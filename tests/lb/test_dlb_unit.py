"""DLB (lib/adaptive.h dlb_band, through the adaptive stage) on crafted packets with BPF_PROG_TEST_RUN.

The queue model (`vq`: a queue's finish time) and the load metric (`port_load`: decaying bytes) of leaf0's four
uplinks are written directly, so that each port sits in a chosen quality band; a new flowlet (a flow's first
packet, or one after an idle gap above the inactivity) must then take a port of the lowest band, ties spread
over every tied port, and a flowlet keeps its port however its band changes until such a gap. The values are
set in the middle of a quantisation level, with a 1 s load window and a 4 MB buffer (335 ms to drain at
100 Mbit/s): a level is 40–125 ms wide, so the microseconds between writing the state and running the packet
(and the bytes the test packets themselves add) never move a port across a level edge."""
import os
import random
import time
from collections import Counter

import pytest

from conftest import loaded_datapath

from testbed import scenario, topology
from testbed.datapath import hashing, testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, Raw = scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.Raw

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF, namespaces)")

WINDOW = 10**9          # dlb.load_window: 1 s


@pytest.fixture(scope="module")
def scen():
    return scenario.from_dict({
        "topology": {"spines": 4, "leaves": 2, "hosts_per_leaf": 1,
                     "fabric_link": {"rate": "100mbit", "buffer": "4MB"}},
        "switch": {"load_balancing": "dlb", "dlb": {"load_window": "1s"}}})


@pytest.fixture(scope="module")
def topo(scen):
    return topology.build(scen.topology)


@pytest.fixture(scope="module")
def dp(topo, scen):
    with loaded_datapath(topo, scen.switch, [p for sw in topo.switches for p in topo.ports[sw]], "dlu") as d:
        yield d


def dlb(scen, **kw):
    """The scenario's switch spec with these switch.dlb keys (validated as a scenario would be)."""
    return scen.switch.model_copy(update={"dlb": scenario.DlbSpec(**{"load_window": "1s", **kw})})


def ups(topo):
    return topo.uplinks("leaf0")


def scales(dp, p):
    """(time per byte in ps, the buffer's drain time in ns) of a port, as the program reads them."""
    q = dp.bpf[b"port_qos"][dp.bpf[b"port_qos"].Key(p.ifindex)]
    return q.ps_per_byte, q.buffer * q.ps_per_byte // 1000


def set_levels(dp, topo, levels, bands):
    """Put each uplink's (load level, queue level) in the middle of that quantisation level now."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    vq, pl = dp.bpf[b"vq"], dp.bpf[b"port_load"]
    for p, (lv, qv) in zip(ups(topo), levels):
        ps, buf_ns = scales(dp, p)
        v = pl[pl.Key(p.ifindex)]
        v.bytes, v.last_ns = (2 * lv + 1) * WINDOW * 1000 // (2 * bands * ps), now
        pl[pl.Key(p.ifindex)] = v
        k = vq.Key(p.ifindex * 8)
        q = vq[k]
        q.finish, q.enq, q.cap = now + (2 * qv + 1) * buf_ns // (2 * bands), 0, 0
        vq[k] = q


def mirror_bands(dp, topo, levels, spec):
    """Each uplink's band by the Python mirror, from the same mid-level times set_levels writes."""
    d = spec.dlb
    out = []
    for p, (lv, qv) in zip(ups(topo), levels):
        _, buf_ns = scales(dp, p)
        load_ns = (2 * lv + 1) * WINDOW // (2 * d.bands)
        queue_ns = (2 * qv + 1) * buf_ns // (2 * d.bands)
        out.append(hashing.dlb_band(load_ns, WINDOW, queue_ns, buf_ns, d.bands, d.load_weight, d.queue_weight))
    return out


def send(dp, topo, sport):
    """One packet h0 → h1 from UDP source port ``sport``; the uplink (index) it left through."""
    inp = topo.port(topo.port_named("h0", "eth0").peer_ifindex)
    f = Ether(src=inp.peer_mac, dst=inp.mac) / IP(src=topo.address("h0"), dst=topo.address("h1")) \
        / UDP(sport=sport, dport=5001) / Raw(b"x" * 32)
    r = testrun.run(dp.ingress_fd, bytes(f), ifindex=inp.ifindex)
    assert r.verdict == TC_ACT_REDIRECT
    src = Ether(r.data[:14]).src.lower()
    return next(i for i, p in enumerate(ups(topo)) if p.mac == src)


def test_band_mirror_quantises_and_rounds():
    # 8 bands: levels are eighths; a full (or paused: huge) queue is the top level
    assert [hashing.dlb_level(ns, 800, 8) for ns in (0, 99, 100, 799, 800, 10**18)] == [0, 0, 1, 7, 7, 7]
    assert hashing.dlb_level(5, 0, 8) == 0                                   # no scale: no queue model
    assert hashing.dlb_band(450, 1000, 250, 1000, 8, 1, 1) == 3              # levels 3, 2: 2.5 rounds up
    assert hashing.dlb_band(450, 1000, 250, 1000, 8, 3, 1) == 3              # (9 + 2) / 4 = 2.75
    assert hashing.dlb_band(450, 1000, 250, 1000, 8, 0, 1) == 2              # queue only
    assert hashing.dlb_band(10**9, 1000, 10**9, 1000, 16, 1, 1) == 15        # saturated: the worst band


def test_new_flowlets_take_the_lowest_band_and_spread_over_its_ports(dp, topo, scen):
    """Bands 4, 1, 1, 5 (load/queue levels (5,3), (1,1), (0,2), (2,7)): 400 new flows all start on uplink 1 or
    2, each about half of them (binomial 200 ± 10: 150–250 holds at 5σ)."""
    spec = dlb(scen)
    dp.set_mode(spec)
    dp.clear_flows()
    levels = [(5, 3), (1, 1), (0, 2), (2, 7)]
    assert mirror_bands(dp, topo, levels, spec) == [4, 1, 1, 5]
    got = Counter()
    for i in range(400):
        set_levels(dp, topo, levels, 8)
        got[send(dp, topo, 10_000 + i)] += 1
    assert set(got) == {1, 2} and all(150 <= c <= 250 for c in got.values()), got


def test_all_ports_tied_spread_evenly(dp, topo, scen):
    """All four uplinks in band 0 (idle): 800 new flows spread over all of them evenly (200 ± 12 each)."""
    dp.set_mode(dlb(scen))
    dp.clear_flows()
    got = Counter()
    for i in range(800):
        set_levels(dp, topo, [(0, 0)] * 4, 8)
        got[send(dp, topo, 20_000 + i)] += 1
    assert len(got) == 4 and all(140 <= c <= 260 for c in got.values()), got


def test_chosen_band_matches_the_mirror_over_random_states(dp, topo, scen):
    """300 random configurations (bands 2–16, weights 0–4, random load and queue levels per port): the port a
    new flowlet takes is always one the Python mirror puts in the lowest band."""
    rng = random.Random(11)
    dp.clear_flows()
    for i in range(300):
        bands = rng.randint(2, 16)
        lw, qw = rng.choice([(1, 1), (0, 1), (1, 0), (3, 1), (1, 4), (2, 3)])
        spec = dlb(scen, bands=bands, load_weight=lw, queue_weight=qw)
        dp.set_mode(spec)
        levels = [(rng.randrange(bands), rng.randrange(bands)) for _ in range(4)]
        want = mirror_bands(dp, topo, levels, spec)
        set_levels(dp, topo, levels, bands)
        got = send(dp, topo, 30_000 + i)
        assert want[got] == min(want), (bands, lw, qw, levels, want, got)


def test_a_flowlet_keeps_its_port_until_an_idle_gap(dp, topo, scen):
    """Inactivity 200 ms: the first packet takes the one best port (uplink 2); its band then becomes the worst
    and another port the best, yet the next 20 packets (back to back) stay on uplink 2; after a 300 ms gap the
    flow starts a new flowlet on the now best port (uplink 0)."""
    dp.set_mode(dlb(scen, inactivity="200ms"))
    dp.clear_flows()
    set_levels(dp, topo, [(6, 6), (5, 5), (1, 0), (4, 4)], 8)
    assert send(dp, topo, 4242) == 2
    for _ in range(20):
        set_levels(dp, topo, [(0, 0), (3, 3), (7, 7), (3, 3)], 8)
        assert send(dp, topo, 4242) == 2
    time.sleep(0.3)
    set_levels(dp, topo, [(0, 0), (3, 3), (7, 7), (3, 3)], 8)
    assert send(dp, topo, 4242) == 0
    (fp,) = dp.flow_paths()
    assert fp.packets == {ups(topo)[2].ifindex: 21, ups(topo)[0].ifindex: 1}
    assert fp.flowlets == 2


def test_a_flowlet_leaves_a_port_that_lost_its_link(dp, topo, scen):
    """Within a flowlet the port is kept unless it lost its link; a dead port is never taken, not even from the
    best band, while another port lives."""
    dp.set_mode(dlb(scen, inactivity="200ms"))
    dp.clear_flows()
    set_levels(dp, topo, [(6, 6), (5, 5), (1, 0), (4, 4)], 8)
    assert send(dp, topo, 5151) == 2
    dead = ups(topo)[2]
    dp.set_port_down(dead.ifindex, True)
    try:
        for _ in range(10):
            set_levels(dp, topo, [(6, 6), (5, 5), (0, 0), (4, 4)], 8)
            assert send(dp, topo, 5151) == 3          # the best live band, and kept within the flowlet
    finally:
        dp.set_port_down(dead.ifindex, False)
