"""The switch program, run on crafted packets with BPF_PROG_TEST_RUN (Cilium style): verdict, rewritten packet
and map state. Needs root and BCC. skb->ifindex is set through the test-run context, which requires a device
with that ifindex in the caller's namespace: the module runs inside a throwaway namespace ``ftb-dpt-<pid>``
holding one veth per switch port, created with the port's ifindex."""
import os
import random
import time
from collections import Counter

import pytest

from conftest import datapath_fixtures

from testbed import scenario
from testbed.datapath import hashing, testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT, TC_ACT_SHOT

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, TCP, IPv6, ARP, Raw = (scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.TCP,
                                       scapy_all.IPv6, scapy_all.ARP, scapy_all.Raw)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF, namespaces)")

SPINES = 4


scen, topo, loaded = datapath_fixtures({"topology": {"spines": SPINES, "leaves": 3, "hosts_per_leaf": 2}}, "dpt",
                                       name="loaded")


@pytest.fixture
def dp(loaded, scen):
    """The loaded datapath, back in the scenario's mode with empty flow state and counters."""
    loaded.set_mode(scen.switch)
    loaded.clear_flows()
    loaded.reset_counters()
    return loaded


def spec(**kw):
    return scenario.SwitchSpec(**kw)


# ---------------------------------------------------------------- helpers

def frame(src_port, src_ip, dst_ip, sport=20000, dport=5001, proto="udp", ttl=64, ip_id=1, payload=64):
    """A frame as it arrives on a switch port: from the peer's MAC to the port's MAC."""
    l4 = UDP(sport=sport, dport=dport) if proto == "udp" else TCP(sport=sport, dport=dport, flags="A")
    return (Ether(src=src_port.peer_mac, dst=src_port.mac) / IP(src=src_ip, dst=dst_ip, ttl=ttl, id=ip_id)
            / l4 / Raw(b"x" * payload))


def run(dp, pkt, ifindex):
    r = testrun.run(dp.ingress_fd, bytes(pkt), ifindex=ifindex)
    return r.verdict, Ether(r.data)


def host_port(topo, host):
    """The leaf-side port facing ``host`` (where its packets enter the fabric)."""
    nic = topo.port_named(host, "eth0")
    return topo.port(nic.peer_ifindex)


def egress_of(topo, out):
    """The switch port a forwarded frame left through, from its source MAC."""
    return next(p for sw in topo.switches for p in topo.ports[sw] if p.mac == out[Ether].src.lower())


def check_forwarded(topo, pkt_in, out):
    """Router rewrite: MACs of the egress link, TTL − 1, valid IPv4 checksum, everything else unchanged."""
    eg = egress_of(topo, out)
    assert out[Ether].dst == eg.peer_mac
    assert out[IP].ttl == pkt_in[IP].ttl - 1
    fixed = out[IP].copy()
    del fixed.chksum
    assert out[IP].chksum == IP(bytes(fixed))[IP].chksum
    expect = pkt_in[IP].copy()
    expect.ttl -= 1
    expect.chksum = out[IP].chksum
    assert bytes(out[IP]) == bytes(expect)
    return eg


# ---------------------------------------------------------------- forwarding and ECMP

def test_load_sizes_and_fd(dp, topo):
    assert dp.ingress_fd > 0 and dp.ingress_name == "ftb_switch_ingress"
    assert dp.sizes["N_SWITCHES"] == len(topo.switches)
    assert dp.compile_seconds < 10


def test_ecmp_matches_python_mirror(dp, topo):
    rng = random.Random(42)
    port = host_port(topo, "h0")
    ups = [p.ifindex for p in topo.uplinks("leaf0")]
    seed = dp.switch_seed("leaf0")
    used = set()
    for i in range(300):
        sport, dport = rng.randrange(1024, 65536), rng.randrange(1, 65536)
        proto = rng.choice(["udp", "tcp"])
        dst = rng.choice([topo.address("h2"), topo.address("h3")])
        pkt = frame(port, topo.address("h0"), dst, sport, dport, proto, ttl=rng.randrange(2, 256),
                    ip_id=rng.randrange(65536))
        verdict, out = run(dp, pkt, port.ifindex)
        assert verdict == TC_ACT_REDIRECT
        eg = check_forwarded(topo, pkt, out)
        want = ups[hashing.ecmp_index(seed, topo.address("h0"), dst, sport, dport, 6 if proto == "tcp" else 17,
                                      len(ups))]
        assert eg.ifindex == want
        used.add(eg.ifindex)
    assert used == set(ups)


def test_one_flow_always_one_port(dp, topo):
    port = host_port(topo, "h1")
    for _ in range(50):
        verdict, _ = run(dp, frame(port, topo.address("h1"), topo.address("h3"), 31000, 4791), port.ifindex)
        assert verdict == TC_ACT_REDIRECT
    (fp,) = [f for f in dp.flow_paths() if f.sport == 31000]
    assert fp.switch == "leaf0" and fp.saddr == topo.address("h1") and fp.daddr == topo.address("h3")
    assert fp.dport == 4791 and fp.proto == 17
    assert fp.paths == 1 and sum(fp.packets.values()) == 50


def test_seeds_differ_between_switches_and_scenarios(dp, topo, scen):
    """leaf0 and leaf1 hash with different seeds; a different hash_seed changes the choices too."""
    p0, p1 = host_port(topo, "h0"), host_port(topo, "h2")     # h4 sits on leaf2: both leaves go up
    ups0 = [p.ifindex for p in topo.uplinks("leaf0")]
    ups1 = [p.ifindex for p in topo.uplinks("leaf1")]
    s0, s1 = dp.switch_seed("leaf0"), dp.switch_seed("leaf1")
    assert s0 != s1
    a, b = topo.address("h0"), topo.address("h4")

    def choices(seed_note):
        got0, got1 = [], []
        for sp in range(40000, 40100):
            _, o0 = run(dp, frame(p0, a, b, sp, 5001), p0.ifindex)
            _, o1 = run(dp, frame(p1, a, b, sp, 5001), p1.ifindex)   # same 5-tuple, other leaf
            got0.append(ups0.index(egress_of(topo, o0).ifindex))
            got1.append(ups1.index(egress_of(topo, o1).ifindex))
        return got0, got1

    c0, c1 = choices("default")
    assert c0 == [hashing.ecmp_index(s0, a, b, sp, 5001, 17, SPINES) for sp in range(40000, 40100)]
    assert c1 == [hashing.ecmp_index(s1, a, b, sp, 5001, 17, SPINES) for sp in range(40000, 40100)]
    assert sum(x != y for x, y in zip(c0, c1)) > 50          # independent: ~75% differ with 4 paths

    dp.set_mode(spec(hash_seed=scen.switch.hash_seed + 1))
    d0, _ = choices("reseeded")
    assert d0 == [hashing.ecmp_index(dp.switch_seed("leaf0"), a, b, sp, 5001, 17, SPINES)
                  for sp in range(40000, 40100)]
    assert sum(x != y for x, y in zip(c0, d0)) > 50


def test_single_next_hop_at_spine(dp, topo):
    """spine0 → leaf1 has one port: forwarded there, no per-flow state."""
    sp_port = next(p for p in topo.ports["spine0"] if p.peer_node == "leaf0")
    pkt = frame(sp_port, topo.address("h0"), topo.address("h3"), 1234, 80)
    verdict, out = run(dp, pkt, sp_port.ifindex)
    assert verdict == TC_ACT_REDIRECT
    eg = check_forwarded(topo, pkt, out)
    assert eg.node == "spine0" and eg.peer_node == "leaf1"
    assert dp.flow_paths() == []
    c = dp.port_counters()
    assert (c[sp_port.ifindex].rx_packets, c[sp_port.ifindex].rx_bytes) == (1, len(pkt))
    assert (c[eg.ifindex].tx_packets, c[eg.ifindex].tx_bytes) == (1, len(pkt))


def test_down_to_host(dp, topo):
    up = topo.uplinks("leaf1")[0]
    pkt = frame(up, topo.address("h0"), topo.address("h3"))
    verdict, out = run(dp, pkt, up.ifindex)
    assert verdict == TC_ACT_REDIRECT
    eg = check_forwarded(topo, pkt, out)
    assert eg.peer_node == "h3" and out[Ether].dst == topo.port_named("h3", "eth0").mac


# ---------------------------------------------------------------- spray and flowlet

def test_spray_round_robin_exactly_even(dp, topo):
    dp.set_mode(spec(load_balancing="spray", spray="round_robin"))
    port = host_port(topo, "h0")
    for _ in range(25 * SPINES):
        assert run(dp, frame(port, topo.address("h0"), topo.address("h2"), 5555, 5001),
                   port.ifindex)[0] == TC_ACT_REDIRECT
    (fp,) = dp.flow_paths()
    assert fp.packets == {p.ifindex: 25 for p in topo.uplinks("leaf0")}


def test_spray_random_within_tolerance(dp, topo):
    dp.set_mode(spec(load_balancing="spray", spray="random"))
    port = host_port(topo, "h0")
    n = 200 * SPINES
    for _ in range(n):
        run(dp, frame(port, topo.address("h0"), topo.address("h2"), 6666, 5001), port.ifindex)
    (fp,) = dp.flow_paths()
    assert fp.paths == SPINES
    assert all(120 <= c <= 280 for c in fp.packets.values()), fp.packets     # mean 200, sd ~12


def _uplink_depths(dp, topo, leaf, depths):
    """Make the queue model of each uplink of ``leaf`` (priority 0) hold ``depths`` bytes now."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    vq, pq = dp.bpf[b"vq"], dp.bpf[b"port_qos"]
    for p, depth in zip(topo.uplinks(leaf), depths):
        k = vq.Key(p.ifindex * 8)
        v = vq[k]
        v.finish = now + depth * pq[pq.Key(p.ifindex)].ps_per_byte // 1000
        vq[k] = v


def test_adaptive_takes_the_uplink_with_the_shortest_queue(dp, topo):
    """AR by queue: with uplink queues of 3 MB, 50 KB, 2 MB and 4 MB (100 Mbit/s ports: they drain 12.5 KB a
    ms, so only a 160 ms stall of a busy machine would tie them), every packet of a burst goes to the 50 KB one,
    and the tail-call stages forward it like any other mode."""
    dp.set_mode(spec(load_balancing="adaptive"))
    ups = topo.uplinks("leaf0")
    _uplink_depths(dp, topo, "leaf0", [3_000_000, 50_000, 2_000_000, 4_000_000])
    port = host_port(topo, "h0")
    for i in range(10):
        pkt = frame(port, topo.address("h0"), topo.address("h2"), 7000, 5001, ip_id=i)
        verdict, out = run(dp, pkt, port.ifindex)
        assert verdict == TC_ACT_REDIRECT
        assert check_forwarded(topo, pkt, out).ifindex == ups[1].ifindex
    (fp,) = dp.flow_paths()
    assert fp.packets == {ups[1].ifindex: 10}


def test_adaptive_breaks_ties_at_random(dp, topo):
    """Equal (empty) queues: the choice is spread over every uplink (400 packets of different flows, each uplink
    within 60–140; the model's queues stay empty between packets at 100 Mbit/s only if we reset them)."""
    dp.set_mode(spec(load_balancing="adaptive"))
    port = host_port(topo, "h0")
    got = Counter()
    for i in range(400):
        _uplink_depths(dp, topo, "leaf0", [0] * SPINES)
        _, out = run(dp, frame(port, topo.address("h0"), topo.address("h2"), 8000 + i, 5001), port.ifindex)
        got[egress_of(topo, out).ifindex] += 1
    assert len(got) == SPINES and all(60 <= c <= 140 for c in got.values()), got


def test_adaptive_per_flowlet_keeps_its_port_until_a_gap(dp, topo):
    """Granularity flowlet: the first packet takes the shortest queue, the rest of the burst stays there although
    another queue becomes shorter; after an idle gap above the timeout the next packet chooses again."""
    dp.set_mode(spec(load_balancing="adaptive", adaptive={"granularity": "flowlet", "flowlet_timeout": "20ms"}))
    ups = topo.uplinks("leaf0")
    port = host_port(topo, "h0")
    pkt = frame(port, topo.address("h0"), topo.address("h2"), 9000, 5001)
    # MB-deep losers: only a 140 ms stall of a busy machine would drain them to a tie (12.5 KB a ms)
    _uplink_depths(dp, topo, "leaf0", [1_900_000, 1_800_000, 10_000, 1_900_000])
    assert egress_of(topo, run(dp, pkt, port.ifindex)[1]).ifindex == ups[2].ifindex
    _uplink_depths(dp, topo, "leaf0", [190_000, 10_000, 180_000, 190_000])
    assert egress_of(topo, run(dp, pkt, port.ifindex)[1]).ifindex == ups[2].ifindex    # same flowlet
    time.sleep(0.03)
    _uplink_depths(dp, topo, "leaf0", [1_900_000, 10_000, 1_800_000, 1_900_000])
    assert egress_of(topo, run(dp, pkt, port.ifindex)[1]).ifindex == ups[1].ifindex    # a new flowlet
    (fp,) = dp.flow_paths()
    assert fp.flowlets == 2 and sum(fp.packets.values()) == 3


def test_adaptive_by_load_takes_the_least_recently_busy_uplink(dp, topo):
    """AR by load: the port that sent the fewest bytes over the load window wins, whatever its queue."""
    dp.set_mode(spec(load_balancing="adaptive", adaptive={"metric": "load", "load_window": "1s"}))
    ups = topo.uplinks("leaf0")
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    pl = dp.bpf[b"port_load"]
    for p, b in zip(ups, [50_000, 60_000, 2_000, 70_000]):
        v = pl[pl.Key(p.ifindex)]
        v.bytes, v.last_ns = b, now
        pl[pl.Key(p.ifindex)] = v
    _uplink_depths(dp, topo, "leaf0", [0, 0, 90_000, 0])      # the queue metric would avoid it
    port = host_port(topo, "h0")
    _, out = run(dp, frame(port, topo.address("h0"), topo.address("h2"), 9100, 5001), port.ifindex)
    assert egress_of(topo, out).ifindex == ups[2].ifindex
    after = pl[pl.Key(ups[2].ifindex)]
    assert after.bytes > 2_000                                # the packet was charged to its port's load


def test_flowlet_keeps_port_in_burst_and_moves_after_gap(dp, topo):
    timeout = 50_000_000                                   # 50 ms
    dp.set_mode(spec(load_balancing="flowlet", flowlet_timeout="50ms"))
    assert dp.switch_spec.flowlet_timeout == timeout
    port = host_port(topo, "h1")
    seen, checked = [], 0
    for burst in range(12):
        if burst:
            time.sleep(2 * timeout / 1e9)
        ports, stretched, last = set(), False, time.monotonic()
        for _ in range(10):                                # back to back: gaps far below the timeout
            verdict, out = run(dp, frame(port, topo.address("h1"), topo.address("h2"), 7777, 5001), port.ifindex)
            assert verdict == TC_ACT_REDIRECT
            ports.add(egress_of(topo, out).ifindex)
            now = time.monotonic()
            stretched |= now - last > 0.5 * timeout / 1e9  # a loaded machine paused us: not a burst any more
            last = now
        if not stretched:
            assert len(ports) == 1, f"path changed inside burst {burst}"
            checked += 1
        seen.append(ports.pop())
    assert checked >= 6
    assert len(set(seen)) > 1                              # P(12 bursts on one of 4 paths) = 4^-11
    (fp,) = dp.flow_paths()
    assert sum(fp.packets.values()) == 120
    assert fp.flowlets == 12 if checked == 12 else 12 <= fp.flowlets <= 12 + 9 * (12 - checked)


def test_flowlet_never_moves_when_gaps_stay_below_timeout(dp, topo):
    dp.set_mode(spec(load_balancing="flowlet", flowlet_timeout="5s"))
    port = host_port(topo, "h0")
    for _ in range(20):
        run(dp, frame(port, topo.address("h0"), topo.address("h3"), 8888, 5001), port.ifindex)
        time.sleep(0.002)
    (fp,) = dp.flow_paths()
    assert fp.paths == 1 and sum(fp.packets.values()) == 20 and fp.flowlets == 1


# ---------------------------------------------------------------- drops

def _drops(dp, ifindex):
    return dp.port_counters()[ifindex].discard_reasons


def test_non_ipv4_dropped_and_counted(dp, topo):
    port = host_port(topo, "h0")
    v6 = Ether(src=port.peer_mac, dst=port.mac) / IPv6(src="fd00::1", dst="fd00::2") / UDP() / Raw(b"x" * 20)
    arp = Ether(src=port.peer_mac, dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=topo.address("h1"))
    assert run(dp, v6, port.ifindex)[0] == TC_ACT_SHOT
    assert run(dp, arp, port.ifindex)[0] == TC_ACT_SHOT
    assert _drops(dp, port.ifindex) == {"not_ipv4": 2}
    c = dp.port_counters()[port.ifindex]
    assert c.rx_packets == 2 and c.discards == 2 and c.tx_packets == 0
    assert dp.drop_counters()["not_ipv4"] == 2


def test_unknown_local_destination_dropped(dp, topo):
    port = host_port(topo, "h0")
    net = topo.address("h0").rsplit(".", 1)[0]
    assert run(dp, frame(port, topo.address("h0"), f"{net}.99"), port.ifindex)[0] == TC_ACT_SHOT
    assert _drops(dp, port.ifindex) == {"empty_group": 1}


def test_no_route_dropped(dp, topo):
    sp_port = topo.ports["spine0"][0]
    assert run(dp, frame(sp_port, topo.address("h0"), "10.1.2.3"), sp_port.ifindex)[0] == TC_ACT_SHOT
    assert _drops(dp, sp_port.ifindex) == {"no_route": 1}


def test_ttl(dp, topo):
    port = host_port(topo, "h0")
    assert run(dp, frame(port, topo.address("h0"), topo.address("h2"), ttl=1), port.ifindex)[0] == TC_ACT_SHOT
    assert run(dp, frame(port, topo.address("h0"), topo.address("h2"), ttl=0), port.ifindex)[0] == TC_ACT_SHOT
    assert _drops(dp, port.ifindex) == {"ttl": 2}
    pkt = frame(port, topo.address("h0"), topo.address("h2"), ttl=2)
    verdict, out = run(dp, pkt, port.ifindex)
    assert verdict == TC_ACT_REDIRECT and out[IP].ttl == 1
    check_forwarded(topo, pkt, out)


def test_malformed_ipv4_dropped(dp, topo):
    """(The kernel's test run refuses IPv4 frames shorter than an IP header, so those cannot be tried here.)"""
    port = host_port(topo, "h0")
    good = bytes(frame(port, topo.address("h0"), topo.address("h2"), payload=0))
    long_ihl = good[:14] + bytes([0x4F]) + good[15:]        # claims 60 header bytes, carries 28
    bad_version = good[:14] + bytes([0x65]) + good[15:]
    for raw in (long_ihl, bad_version):
        assert run(dp, raw, port.ifindex)[0] == TC_ACT_SHOT
    assert _drops(dp, port.ifindex) == {"malformed": 2}


def test_packet_on_unknown_port_dropped(dp, topo):
    pkt = frame(host_port(topo, "h0"), topo.address("h0"), topo.address("h2"))
    assert run(dp, pkt, 1)[0] == TC_ACT_SHOT                  # lo: not a switch port
    assert dp.drop_counters()["no_port"] == 1


def test_fragments_hash_without_ports(dp, topo):
    """Every fragment of a datagram must take the first fragment's path."""
    port = host_port(topo, "h0")
    ups = [p.ifindex for p in topo.uplinks("leaf0")]
    a, b = topo.address("h0"), topo.address("h2")
    pkt = Ether(src=port.peer_mac, dst=port.mac) / IP(src=a, dst=b, flags="MF", id=9) / UDP(sport=1, dport=2)
    verdict, out = run(dp, pkt, port.ifindex)
    assert verdict == TC_ACT_REDIRECT
    assert egress_of(topo, out).ifindex == ups[hashing.ecmp_index(dp.switch_seed("leaf0"), a, b, 0, 0, 17, SPINES)]


# ---------------------------------------------------------------- local fast failover (port_down)

@pytest.fixture
def downed(dp):
    """Ports set down by a test; every one is brought back afterwards."""
    marked = []

    def down(*ports):
        for p in ports:
            dp.set_port_down(p.ifindex, True)
            marked.append(p)
    yield down
    for p in marked:
        dp.set_port_down(p.ifindex, False)


@pytest.mark.parametrize("mode", ["ecmp", "flowlet", "spray", "adaptive", "dlb"])
def test_a_port_that_lost_its_link_is_never_chosen(dp, topo, downed, mode):
    dp.set_mode(spec(load_balancing=mode))
    port = host_port(topo, "h0")
    ups = [p.ifindex for p in topo.uplinks("leaf0")]
    dead = topo.uplinks("leaf0")[1]
    downed(dead)
    used = Counter()
    for sp in range(42000, 42200):
        pkt = frame(port, topo.address("h0"), topo.address("h2"), sp, 5001)
        verdict, out = run(dp, pkt, port.ifindex)
        assert verdict == TC_ACT_REDIRECT
        eg = check_forwarded(topo, pkt, out)
        used[eg.ifindex] += 1
        if mode == "ecmp":        # the flows of the dead port move by rendezvous over the live ones, the rest stay
            h = hashing.flow_hash(dp.switch_seed("leaf0"), topo.address("h0"), topo.address("h2"), sp, 5001, 17)
            want = hashing.pick(h, len(ups))
            if ups[want] == dead.ifindex:
                want = hashing.failover_index(h, ups, {dead.ifindex})
            assert eg.ifindex == ups[want]
    assert dead.ifindex not in used and set(used) == set(ups) - {dead.ifindex}
    assert dp.drop_counters()["port_down"] == 0
    # the per-flow counters count the port the packets really took
    assert all(dead.ifindex not in f.packets for f in dp.flow_paths())


def test_when_every_port_of_a_group_is_down_the_packet_is_dropped_as_port_down(dp, topo, downed):
    port = host_port(topo, "h0")
    downed(*topo.uplinks("leaf0"))
    verdict, _ = run(dp, frame(port, topo.address("h0"), topo.address("h2")), port.ifindex)
    assert verdict == TC_ACT_SHOT
    sp_port = next(p for p in topo.ports["spine0"] if p.peer_node == "leaf0")
    to_leaf1 = next(p for p in topo.ports["spine0"] if p.peer_node == "leaf1")
    downed(to_leaf1)                                   # a single-port group: nothing to fail over to
    verdict, _ = run(dp, frame(sp_port, topo.address("h0"), topo.address("h3")), sp_port.ifindex)
    assert verdict == TC_ACT_SHOT
    assert dp.drop_counters()["port_down"] == 2
    assert dp.port_counters()[port.ifindex].discard_reasons == {"port_down": 1}
    assert dp.ports_down() == {p.ifindex for p in topo.uplinks("leaf0")} | {to_leaf1.ifindex}


def test_failover_mirror_moves_only_the_dead_ports_flows():
    ports = [101, 103, 105, 107]
    moved = Counter()
    for h in range(0, 1 << 32, 1 << 20):
        i = hashing.pick(h, 4)
        j = hashing.failover_index(h, ports, {103}) if ports[i] == 103 else i
        assert ports[j] != 103
        moved[ports[j]] += ports[i] == 103
    assert hashing.failover_index(5, ports, set(ports)) is None
    assert min(moved[p] for p in (101, 105, 107)) > 0.25 * sum(moved.values())   # spread, not to one neighbour


def roce_frame(src_port, src_ip, dst_ip, dqp: int, sport=49152):
    """A RoCEv2 RDMA WRITE ONLY frame: UDP 4791, BTH with destination QP ``dqp``."""
    bth = bytes([0x0A, 0, 0xFF, 0xFF, 0, (dqp >> 16) & 0xFF, (dqp >> 8) & 0xFF, dqp & 0xFF, 0x80, 0, 0, 1])
    return (Ether(src=src_port.peer_mac, dst=src_port.mac) / IP(src=src_ip, dst=dst_ip) / UDP(sport=sport, dport=4791)
            / Raw(bth + b"x" * 64))


def test_hash_fields_roce_qp_spreads_qps_that_share_a_source_port(dp, topo):
    """One fixed UDP source port, 64 destination QPs: the 5-tuple hash keeps them on one uplink; with roce_qp in
    switch.hash_fields every choice is hashing.pkt_hash's and they spread over every uplink; src/dst only
    ignores the ports (one uplink again, where the mirror says)."""
    p0 = host_port(topo, "h0")
    ups = [p.ifindex for p in topo.uplinks("leaf0")]
    a, b = topo.address("h0"), topo.address("h4")
    seed = dp.switch_seed("leaf0")
    qps = [0x100 + 2 * i for i in range(64)]

    def choices():
        return [ups.index(egress_of(topo, run(dp, roce_frame(p0, a, b, q), p0.ifindex)[1]).ifindex) for q in qps]

    assert len(set(choices())) == 1
    for fields in (["src_ip", "dst_ip", "sport", "dport", "proto", "roce_qp"], ["src_ip", "dst_ip"]):
        dp.set_mode(spec(hash_fields=fields))
        got = choices()
        mask = hashing.hash_mask(fields)
        assert got == [hashing.pick(hashing.pkt_hash(seed, mask, a, b, 49152, 4791, 17, q), SPINES) for q in qps]
        assert len(set(got)) == (SPINES if "roce_qp" in fields else 1)
    assert hashing.pkt_hash(seed, 0, a, b, 1, 2, 17, 5) == hashing.flow_hash(seed, a, b, 1, 2, 17)
    with pytest.raises(scenario.ScenarioError, match="hash_fields"):
        scenario.from_dict({"switch": {"hash_fields": []}})
    with pytest.raises(scenario.ScenarioError, match="listed twice"):
        scenario.from_dict({"switch": {"hash_fields": ["sport", "sport"]}})
