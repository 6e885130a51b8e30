"""End-to-end: real namespaces, veths, TBF shaping and the eBPF switch program, with real packets.

Each test would fail if the feature it names were broken. Assertions are on counts and ratios read from the
datapath's BPF maps, never on wall-clock time.
"""
from __future__ import annotations

import math
import subprocess
import time
from collections import Counter

import pytest

from testbed import workloads
from testbed.fabric import netns
from testbed.datapath import hashing

from conftest import make_scenario, udp_send

pytestmark = pytest.mark.e2e

FAST = {"rate": "1gbit", "buffer": "1MB"}


def _ping(lab, src, dst_addr) -> bool:
    p = netns.spawn(lab.fabric.ns[src], ["ping", "-c1", "-W2", "-q", dst_addr],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p.wait() == 0


def _uplink_packets(lab, leaf, fp) -> dict[str, int]:
    names = {p.ifindex: p.ifname for p in lab.topo.uplinks(leaf)}
    return {names[i]: n for i, n in fp.packets.items() if i in names and n}


def _flows_at(lab, leaf):
    return [fp for fp in lab.datapath.flow_paths() if fp.switch == leaf]


@pytest.mark.parametrize("mode", ["ecmp", "flowlet", "spray"])
def test_ping_between_every_host_pair(lab, mode):
    lb = lab(make_scenario(topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2},
                           switch={"load_balancing": mode}))
    hosts = lb.topo.hosts
    failed = [(a, b) for a in hosts for b in hosts if a != b and not _ping(lb, a, lb.topo.address(b))]
    assert not failed, f"no reply for {failed}"
    # the packets crossed the eBPF switches: every host port and the spine layer forwarded them
    counters = lb.datapath.port_counters()
    downs = [p for sw in lb.topo.switches for p in lb.topo.ports[sw] if p.role == "down"]
    assert all(counters[p.ifindex].rx_packets >= 2 * (len(hosts) - 1) for p in downs)
    spines = [p for sw in lb.topo.switches for p in lb.topo.ports[sw] if p.role == "spine"]
    assert sum(counters[p.ifindex].rx_packets for p in spines) >= 8 * 2   # 8 cross-leaf pairs, echo + reply


def test_ecmp_pins_each_flow_and_spreads_flows_binomially(lab):
    lb = lab(make_scenario(topology={"spines": 4, "leaves": 2, "hosts_per_leaf": 1, "host_link": FAST,
                                     "fabric_link": FAST},
                           switch={"load_balancing": "ecmp", "hash_seed": 11}))
    n_flows, per_flow = 64, 20
    for k in range(n_flows):
        udp_send(lb, "h0", "h1", per_flow, sport=30000 + k)
    assert lb.datapath.drop_counters().get("no_route", 0) == 0
    flows = _flows_at(lb, "leaf0")
    assert len(flows) == n_flows
    load = Counter()
    seed = lb.datapath.switch_seed("leaf0")
    ups = [p.ifindex for p in lb.topo.uplinks("leaf0")]
    for fp in flows:
        used = {i: n for i, n in fp.packets.items() if n}
        assert len(used) == 1, f"ECMP split flow {fp.sport} over {used}"
        (ifx, n), = used.items()
        assert n == per_flow
        # the switch chose exactly what the hash predicts
        assert ups[hashing.ecmp_index(seed, fp.saddr, fp.daddr, fp.sport, fp.dport, fp.proto, 4)] == ifx
        load[ifx] += 1
    # 64 flows over 4 uplinks: Binomial(64, 1/4) per uplink, mean 16, sd 3.46 — within 4 sd, and all used
    sd = math.sqrt(n_flows * 0.25 * 0.75)
    assert len(load) == 4
    assert all(abs(c - 16) <= 4 * sd for c in load.values()), load


def test_ecmp_seed_changes_the_choice_per_switch(lab):
    """Each switch hashes with its own seed (no polarisation): 48 flows h1 → h0 take, at leaf1, exactly the
    uplinks leaf1's seed predicts; with leaf0's seed the prediction is wrong for about 3/4 of them (a datapath
    using one seed for every switch would make it right for all)."""
    lb = lab(make_scenario(topology={"spines": 4, "leaves": 2, "hosts_per_leaf": 1, "host_link": FAST,
                                     "fabric_link": FAST}))
    for k in range(48):
        udp_send(lb, "h1", "h0", 3, sport=32000 + k)
    ups = [p.ifindex for p in lb.topo.uplinks("leaf1")]
    cfg = lb.datapath.bpf[b"sw_config"]
    own, other = (cfg[cfg.Key(lb.topo.switch_ids[sw])].seed for sw in ("leaf1", "leaf0"))   # what the kernel holds
    flows = _flows_at(lb, "leaf1")
    assert len(flows) == 48
    wrong_with_other = 0
    for fp in flows:
        (ifx,) = [i for i, n in fp.packets.items() if n]
        assert ups[hashing.ecmp_index(own, fp.saddr, fp.daddr, fp.sport, fp.dport, fp.proto, 4)] == ifx
        wrong_with_other += ups[hashing.ecmp_index(other, fp.saddr, fp.daddr, fp.sport, fp.dport, fp.proto,
                                                   4)] != ifx
    assert wrong_with_other >= 24, wrong_with_other         # Binomial(48, 3/4): mean 36, sd 3


@pytest.mark.parametrize("kind,packets,tolerance", [("round_robin", 4000, 0.05), ("random", 20000, 0.05)])
def test_spray_splits_one_flow_evenly_over_all_uplinks(lab, kind, packets, tolerance):
    lb = lab(make_scenario(topology={"spines": 4, "leaves": 2, "hosts_per_leaf": 1, "host_link": FAST,
                                     "fabric_link": FAST},
                           switch={"load_balancing": "spray", "spray": kind}))
    udp_send(lb, "h0", "h1", packets, sport=40000)
    (fp,) = _flows_at(lb, "leaf0")
    per_uplink = _uplink_packets(lb, "leaf0", fp)
    assert sum(per_uplink.values()) == packets
    assert len(per_uplink) == 4
    for name, n in per_uplink.items():
        share = n / packets
        assert abs(share - 0.25) <= 0.25 * tolerance, f"{name}: {share:.4f} of the flow ({per_uplink})"


def test_flowlet_switches_only_after_an_idle_gap(lab):
    timeout = "50ms"
    lb = lab(make_scenario(topology={"spines": 4, "leaves": 2, "hosts_per_leaf": 1, "host_link": FAST,
                                     "fabric_link": FAST},
                           switch={"load_balancing": "flowlet", "flowlet_timeout": timeout}))
    bursts, per_burst = 24, 20
    chosen = []
    prev = Counter()
    for _ in range(bursts):
        udp_send(lb, "h0", "h1", per_burst, sport=41000)
        (fp,) = _flows_at(lb, "leaf0")
        now = Counter(_uplink_packets(lb, "leaf0", fp))
        delta = {k: now[k] - prev[k] for k in now if now[k] - prev[k]}
        prev = now
        # never inside a burst: all packets of one burst (µs apart) took one uplink
        assert len(delta) == 1 and sum(delta.values()) == per_burst, delta
        chosen.append(next(iter(delta)))
        time.sleep(0.15)            # idle gap of 150 ms > 50 ms: a new flowlet, a fresh random path
    # 24 flowlets on 4 uplinks at random: P(one uplink only) = 4 · 4^-24 — a stuck path means no switching
    assert len(set(chosen)) >= 2, chosen
    assert sum(1 for a, b in zip(chosen, chosen[1:]) if a != b) >= 5, chosen


def test_flowlet_keeps_the_path_while_gaps_stay_below_the_timeout(lab):
    lb = lab(make_scenario(topology={"spines": 4, "leaves": 2, "hosts_per_leaf": 1, "host_link": FAST,
                                     "fabric_link": FAST},
                           switch={"load_balancing": "flowlet", "flowlet_timeout": "500ms"}))
    for _ in range(20):
        udp_send(lb, "h0", "h1", 10, sport=42000)
        time.sleep(0.005)           # 5 ms gaps ≪ 500 ms
    (fp,) = _flows_at(lb, "leaf0")
    assert len(_uplink_packets(lb, "leaf0", fp)) == 1


@pytest.mark.parametrize("host_rate,fabric_rate", [(40, 1000), (1000, 30)])
def test_links_are_shaped_to_their_rate(lab, machine, host_rate, fabric_rate):
    """One blasting UDP flow gets the bottleneck rate (host NIC or a spine link) within ±5% — at least 95 % of
    the rate over the time the hypervisor left the machine (steal stops the shaper as well)."""
    lb = lab(make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 1,
                                     "host_link": {"rate": f"{host_rate}mbit", "buffer": "256KB"},
                                     "fabric_link": {"rate": f"{fabric_rate}mbit", "buffer": "256KB"}}))
    flow = workloads.Flow(0, "h0", "h1", lb.topo.address("h0"), lb.topo.address("h1"), 43000, 5001, "udp",
                          None, None, 0.0)
    before = lb.datapath.port_counters()
    duration = 3.0
    machine.start()
    (res,) = workloads.run([flow], lambda h: lb.fabric.ns[h], duration, 1500)
    had = machine.available()
    after = lb.datapath.port_counters()
    bottleneck = min(host_rate, fabric_rate) * 1e6
    # the wire carries Ethernet frames: 1514 bytes per 1472 bytes of UDP payload
    wire_bps = res.bytes * 1514 / 1472 * 8 / (res.end_s - res.start_s)
    assert 0.95 * had <= wire_bps / bottleneck <= 1.05, \
        f"{wire_bps / 1e6:.2f} Mbit/s on a {bottleneck / 1e6:g} Mbit/s path ({1 - had:.1%} of the machine stolen)"
    if fabric_rate < host_rate:
        # the spine's queue overflowed: the excess was dropped at the shaped fabric link, not delivered
        up = lb.topo.uplinks("leaf0")[0]
        tx = after[up.ifindex].tx_packets - before[up.ifindex].tx_packets
        assert res.packets_received < tx
    else:
        assert res.lost == 0            # a blocking sender on its own shaped NIC is back-pressured


def test_multi_rail_hosts_use_their_rails_leaf(lab):
    lb = lab(make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 1, "rails": 2}))
    topo = lb.topo
    # h0's NIC r attaches to the leaf of rail r; h1 is in host group 1
    assert [topo.leaf_of("h0", r) for r in (0, 1)] == ["leaf0", "leaf2"]
    assert [topo.leaf_of("h1", r) for r in (0, 1)] == ["leaf1", "leaf3"]
    for rail, count in ((0, 300), (1, 500)):
        udp_send(lb, "h0", "h1", count, sport=44000 + rail, rail=rail)
    c = lb.datapath.port_counters()
    rx = {leaf: c[topo.port_named(leaf, "h0").ifindex].rx_packets for leaf in ("leaf0", "leaf2")}
    assert 300 <= rx["leaf0"] < 500 and 500 <= rx["leaf2"] < 700, rx
    spine_rx = {s: sum(c[p.ifindex].rx_packets for p in topo.ports[s]) for s in ("spine0", "spine1")}
    assert 300 <= spine_rx["spine0"] < 500 and 500 <= spine_rx["spine1"] < 700, spine_rx
    for rail in (0, 1):
        assert _ping(lb, "h0", topo.address("h1", rail))


def test_host_offloads_are_off_so_switches_see_wire_sized_packets(lab):
    lb = lab(make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 1}))
    # a TCP stream: with TSO/GSO on, the leaf would see ~64 KB super-packets
    flow = workloads.Flow(0, "h0", "h1", lb.topo.address("h0"), lb.topo.address("h1"), 45000, 5001, "tcp",
                          2_000_000, None, 0.0)
    before = lb.datapath.port_counters()
    (res,) = workloads.run([flow], lambda h: lb.fabric.ns[h], 5.0, 1500)
    assert res.bytes == 2_000_000
    c = lb.datapath.port_counters()[lb.topo.port_named("leaf0", "h0").ifindex]
    c0 = before[lb.topo.port_named("leaf0", "h0").ifindex]
    avg = (c.rx_bytes - c0.rx_bytes) / (c.rx_packets - c0.rx_packets)
    assert avg <= 1514, f"average frame {avg:.0f} bytes: segmentation offload still on"


def test_idle_fabric_puts_no_frame_on_any_link(lab):
    """Ports come up without an IPv6 address (addr_gen_mode none, a request before link-up): no DAD, router
    solicitation or MLD report at link-up, frames the switches could only discard as drops. With the mode set in
    the link-up request itself, the veth end that came up second got a link-local address and sent 3-4 frames in
    these 3 s; with IPv6 addresses on every port each sent about 6."""
    from testbed.bench.pps import _rx_packets
    lb = lab(make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 1}))
    time.sleep(3)
    switch_rx = {i: c.rx_packets for i, c in lb.datapath.port_counters().items() if c.rx_packets}
    host_rx = {h: netns.run_in(lb.fabric.ns[h], _rx_packets, "eth0") for h in lb.topo.hosts}
    assert not switch_rx and not any(host_rx.values()), (switch_rx, host_rx)
    for node in lb.topo.nodes:                       # no IPv6 address on any fabric port
        addrs = subprocess.run(["ip", "-n", lb.fabric.ns[node], "-6", "-o", "addr", "show", "scope", "link"],
                               capture_output=True, text=True, check=True)
        assert addrs.stdout == "", (node, addrs.stdout)


def test_switch_ports_share_one_filter_block(lab):
    """Every port of a switch has a clsact bound to the switch's shared blocks; the program is one filter on
    the ingress block (one request per switch, and no per-port block for the kernel to scan)."""
    from testbed.fabric import EGRESS_BLOCK, INGRESS_BLOCK
    lb = lab(make_scenario(topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2}))
    for sw in lb.topo.switches:
        ns = lb.fabric.ns[sw]
        qdiscs = subprocess.run(["tc", "-n", ns, "qdisc", "show"], capture_output=True, text=True, check=True)
        bound = [ln for ln in qdiscs.stdout.splitlines()
                 if "clsact" in ln and f"ingress_block {INGRESS_BLOCK} egress_block {EGRESS_BLOCK}" in ln]
        assert len(bound) == len(lb.topo.ports[sw]), qdiscs.stdout
        filters = subprocess.run(["tc", "-n", ns, "filter", "show", "block", str(INGRESS_BLOCK)],
                                 capture_output=True, text=True, check=True)
        assert filters.stdout.count("ftb_switch_ingress") == 1, filters.stdout
    for h in lb.topo.hosts:                          # no hook where no program goes (hosts.pfc is off)
        qdiscs = subprocess.run(["tc", "-n", lb.fabric.ns[h], "qdisc", "show"], capture_output=True, text=True)
        assert "clsact" not in qdiscs.stdout


def test_offloads_off_in_one_request_clears_what_the_four_legacy_commands_clear():
    """The fabric clears TSO/GSO/GRO/SG with one ETHTOOL_SFEATURES request per NIC: the device ends up with the
    features the four legacy ethtool commands leave, less tx-tcp-accecn-segmentation, which the legacy TSO
    command leaves on here (kernel 6.18) and the request clears too (read back with ETHTOOL_GFEATURES)."""
    import array
    import os
    from testbed.fabric import ethtool, feature_names, offloads_off_request
    from testbed.fabric.netlink import Batch
    name = "ftb-toffl"
    sock = netns.create([name], netlink=True)[name]
    try:
        fd = os.open(netns.path(name), os.O_RDONLY)
        b = Batch(sock, name)
        for i in (0, 1):
            b.veth(f"n{i}", 10 + 2 * i, f"02:fb:ee:00:00:{2 * i:02x}", 1500, f"p{i}", 11 + 2 * i,
                   f"02:fb:ee:00:00:{2 * i + 1:02x}", fd, gso_max_segs=1)
        b.commit()
        os.close(fd)
        for cmd in (0x1f, 0x24, 0x2c, 0x19):          # legacy ETHTOOL_STSO, SGSO, SGRO, SSG, each set to 0
            ethtool(sock, "n0", array.array("I", [cmd, 0]))
        names = feature_names(sock, "n1")
        ethtool(sock, "n1", offloads_off_request(names))
        words = (len(names) + 31) // 32

        def active(ifname):
            buf = array.array("I", [0x3a, words] + [0] * (4 * words))        # ETHTOOL_GFEATURES
            ethtool(sock, ifname, buf)
            return [buf[2 + 4 * w + 2] for w in range(words)]                # available, requested, active, …
        def on(ifname):
            bits = active(ifname)
            return {f for i, f in enumerate(names) if bits[i // 32] >> (i % 32) & 1}
        legacy, fabric = on("n0"), on("n1")
        assert fabric == legacy - {"tx-tcp-accecn-segmentation"}, (legacy, fabric)
        assert not fabric & {"tx-scatter-gather", "tx-generic-segmentation", "rx-gro", "tx-tcp-segmentation",
                             "tx-tcp6-segmentation", "tx-tcp-accecn-segmentation"}
    finally:
        sock.close()
        netns.delete([name])


def test_namespace_mount_points_share_one_inode():
    """The mount-point files of one create() are links of one unnamed file in /run/netns's own mount, so a
    large build allocates no inode per namespace (on ext4 each new inode scanned the recently deleted ones)."""
    import ctypes
    import os
    names = [f"ftb-tinode-{i}" for i in range(3)]
    netns.create(names)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2(netns.path(names[0]).encode(), 2)        # MNT_DETACH: uncover the file under the mount
        st = os.stat(netns.path(names[0]))
        assert st.st_nlink == 3 and st.st_size == 0
    finally:
        netns.delete(names)
    assert not any(os.path.lexists(netns.path(n)) for n in names)


def test_the_namespace_directory_is_a_mount_of_its_own_before_a_namespace_is_mounted(tmp_path, monkeypatch):
    """A namespace file mounted on a plain directory is hidden when `ip netns add` later binds the directory
    onto itself: it can no longer be unmounted, and unlinking it fails with EBUSY (a CI machine kept 13 such
    files). create() makes the directory a shared mount of its own first, as `ip netns` does; `ip netns add`
    then leaves it alone, and the namespace is removed."""
    import os
    d = tmp_path / "netns"
    monkeypatch.setattr(netns, "NETNS_DIR", str(d))

    def mounts():                 # a bind of the same filesystem: os.path.ismount cannot tell
        return [ln for ln in open("/proc/self/mountinfo") if ln.split()[4] == str(d)]
    try:
        netns.create(["ftb-townmount-a"])
        (own,) = mounts()
        assert "shared:" in own
        netns.create(["ftb-townmount-b"])                      # a mount already: not bound again
        assert len(mounts()) == 1
        netns.delete(["ftb-townmount-a", "ftb-townmount-b"])
        assert not os.listdir(d)
    finally:
        for _ in mounts():
            subprocess.run(["umount", "-l", str(d)], check=True)


def test_teardown_leaves_no_namespace_veth_or_bpf_program(lab):
    from testbed.lab import Lab
    progs_before = set(_switch_programs())
    lb = Lab(make_scenario(topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2}), "tdown1")
    with lb:
        assert len(netns.list_names("ftb-tdown1-")) == 8
        ours = set(_switch_programs()) - progs_before
        assert len(ours) == 1
        assert _ping(lb, "h0", lb.topo.address("h3"))
    assert netns.list_names("ftb-tdown1-") == []
    # the kernel frees namespaces (and with them veths, filters and the program) asynchronously
    from conftest import wait_for
    assert wait_for(lambda: not ours & set(_switch_programs()), timeout=20), "BPF program still loaded"
    assert not _root_veths_with_our_macs()


def _switch_programs() -> list[int]:
    """Ids of loaded BPF programs named like the switch program (bpf syscall, no bpftool needed)."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    ids, cur = [], 0
    while True:
        attr = ctypes.create_string_buffer(struct.pack("II", cur, 0), 128)
        if libc.syscall(321, 11, attr, 128) != 0:          # BPF_PROG_GET_NEXT_ID
            break
        cur = struct.unpack_from("I", attr.raw, 4)[0]
        attr = ctypes.create_string_buffer(struct.pack("I", cur), 128)
        fd = libc.syscall(321, 13, attr, 128)              # BPF_PROG_GET_FD_BY_ID
        if fd < 0:
            continue
        info = ctypes.create_string_buffer(256)
        q = ctypes.create_string_buffer(struct.pack("IIQ", fd, 256, ctypes.addressof(info)), 128)
        if libc.syscall(321, 15, q, 128) == 0:              # BPF_OBJ_GET_INFO_BY_FD
            name = info.raw[64:80].split(b"\0")[0]
            if name.startswith(b"ftb_switch"):
                ids.append(cur)
        import os
        os.close(fd)
    return ids


def _root_veths_with_our_macs() -> list[str]:
    import os
    out = []
    for dev in os.listdir("/sys/class/net"):
        try:
            mac = open(f"/sys/class/net/{dev}/address").read().strip()
        except OSError:
            continue
        if mac.startswith("02:fb:"):
            out.append(dev)
    return out


def test_congestion_drops_in_the_fabric_do_not_back_pressure_the_senders(lab, machine):
    """Two hosts blast at line rate into one uplink of the same rate: like real NICs they keep sending at line
    rate (the fabric, not their sockets, absorbs the excess) and the uplink's queue drops about half. Line rate
    of the time the hypervisor left: a NIC's shaper stops while it steals (0.88 of line rate under 13.5 %)."""
    lb = lab(make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 2,
                                     "host_link": {"rate": "40mbit", "buffer": "256KB"},
                                     "fabric_link": {"rate": "40mbit", "buffer": "256KB"}}))
    t = lb.topo
    flows = [workloads.Flow(i, src, dst, t.address(src), t.address(dst), 46000 + i, 5001, "udp", None, None, 0.0)
             for i, (src, dst) in enumerate((("h0", "h2"), ("h1", "h3")))]
    duration = 3.0
    up = t.uplinks("leaf0")[0].ifindex

    def dropped():        # tail drops by the switch's queue model + drops by the port's qdisc
        tail = sum(c.drops for (ifx, _), c in lb.datapath.queue_counters().items() if ifx == up)
        return tail + lb.fabric.qdisc_stats(["leaf0"])[up][2]
    d0 = dropped()
    machine.start()
    res = workloads.run(flows, lambda h: lb.fabric.ns[h], duration, 1500)
    had = machine.available()
    d1 = dropped()
    line_pps = 40e6 / (1514 * 8)
    for r in res:
        assert r.packets_sent >= 0.9 * had * line_pps * duration, \
            f"{r.src} was back-pressured: {r.packets_sent} ({1 - had:.1%} of the machine stolen)"
    sent = sum(r.packets_sent for r in res)
    received = sum(r.packets_received for r in res)
    assert 0.4 <= received / sent <= 0.6, (received, sent)
    assert d1 - d0 >= 0.3 * sent                       # the uplink's queue dropped the excess
