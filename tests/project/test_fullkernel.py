"""Tests that need a distribution kernel (rdma_rxe, netem, red): run them with `testbed vm test`.

They are skipped on the CI/development kernel (no loadable modules; see conftest). Timings are for the TCG guest
(~5x slower than the host), so loads are small and tolerances generous.
"""
from __future__ import annotations

import json
import re
import socket
import subprocess
import time

import pytest

from testbed.fabric import netns
from testbed.workloads.rxe import softroce as rxe
from testbed.workloads.rxe.perftest import perftest_pair

from conftest import make_scenario

pytestmark = [pytest.mark.fullkernel, pytest.mark.e2e]


def _ping_rtt_ms(lab, src: str, dst: str, count: int = 10) -> float:
    """Median RTT of ``count`` pings (after one warm-up)."""
    addr = lab.topo.address(dst)
    p = netns.spawn(lab.fabric.ns[src], ["ping", "-n", "-q", "-c", "1", "-W", "5", addr],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p.wait(30)
    p = netns.spawn(lab.fabric.ns[src], ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "5", addr],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.communicate(timeout=60)[0]
    rtts = sorted(float(x) for x in re.findall(r"time=([0-9.]+) ms", out))
    assert len(rtts) >= count // 2, out
    return rtts[len(rtts) // 2]


def test_link_delay_with_netem(lab):
    """host 1 ms + fabric 2 ms a hop: h0→leaf0→spine0→leaf1→h1 is 6 ms one way, 12 ms more RTT than no delay."""
    topo = {"spines": 1, "leaves": 2, "hosts_per_leaf": 1}
    base = lab(make_scenario(topology=topo))
    rtt0 = _ping_rtt_ms(base, "h0", "h1")
    delayed = lab(make_scenario(topology={**topo, "host_link": {"delay": "1ms"}, "fabric_link": {"delay": "2ms"}}))
    rtt1 = _ping_rtt_ms(delayed, "h0", "h1")
    print(f"RTT without delay {rtt0:.2f} ms, with 1 ms + 2 ms + 2 ms + 1 ms each way {rtt1:.2f} ms")
    # TCG timers overshoot by a few hundred µs per netem release (8 releases a round trip): generous upper bound
    assert 11.0 <= rtt1 - rtt0 <= 20.0, (rtt0, rtt1)
    # netem sits under the port's TBF (the shaper stays root: the PFC/ECN code finds it where it always is)
    out = subprocess.run(["tc", "-n", delayed.fabric.ns["leaf0"], "-j", "qdisc", "show"], capture_output=True,
                         text=True, check=True).stdout
    q = json.loads(out)
    kinds = {(x["kind"], x.get("parent", "root") if not x.get("root") else "root") for x in q}
    assert ("tbf", "root") in kinds and ("netem", "1:1") in kinds, q


def _udp_goodput_mbps(lab, scen, count=800, size=1400) -> float:
    import threading

    from conftest import udp_send
    lb = lab(scen)
    rx = []

    def receive():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((lb.topo.address("h1"), 9000))
        s.settimeout(3.0)
        n, t_first, t_last = 0, None, None
        try:
            while True:
                n += len(s.recv(2048))
                t_last = time.monotonic()
                t_first = t_first or t_last
        except socket.timeout:
            pass
        rx.append((n, (t_last or 0) - (t_first or 0)))
    th = threading.Thread(target=lambda: netns.run_in(lb.fabric.ns["h1"], receive))
    th.start()
    time.sleep(0.3)
    udp_send(lb, "h0", "h1", count=count, sport=20001, size=size)
    th.join(30)
    n, secs = rx[0]
    assert n >= 0.95 * count * size, (n, count * size)
    return n * 8 / secs / 1e6


def test_link_delay_keeps_the_rate(lab):
    """A 2 ms delay line under the shaper costs no throughput: the same back-pressured UDP sender gets the same
    goodput with and without it (absolute rates under TCG are below the 4 Mbit/s shaper: its timers are coarse)."""
    topo = {"spines": 1, "leaves": 2, "hosts_per_leaf": 1, "host_link": {"rate": "4mbit"}}
    base = _udp_goodput_mbps(lab, make_scenario(topology=topo))
    delayed = _udp_goodput_mbps(lab, make_scenario(topology={**topo, "fabric_link": {"delay": "2ms"}}))
    print(f"UDP goodput h0→h1 at 4 Mbit/s: {base:.2f} Mbit/s without delay, {delayed:.2f} with 2 ms per fabric hop")
    # Measured in the TCG guest with other jobs on the host: 3.82 vs 3.09 Mbit/s (81 %). Not yet explained (likely
    # TCG timer overshoot of each netem release bunching packets); tighten after a run on KVM/Vagrant.
    assert base <= 4.2 and delayed >= 0.7 * base, (base, delayed)


def test_rxe_ib_write_bw_on_a_veth_pair():
    """The lowest level: Soft-RoCE + perftest work in this kernel with the root-namespace + policy-routing set-up."""
    with rxe.pair_on_veth() as p:
        res, out = perftest_pair(p["dev_b"], p["gid_b"], p["dev_a"], p["gid_a"], p["addr_b"])
        counters = {v: int(open(f"/sys/class/net/{v}/statistics/tx_bytes").read()) for v in (p["if_a"], p["if_b"])}
    print(f"ib_write_bw on a veth pair: {res}; veth tx bytes {counters}")
    assert res["bw_avg_mbps"] > 0, out
    assert counters[p["if_a"]] > res["msg_bytes"] * res["iterations"]    # RoCE really crossed the veth


def test_rxe_ib_write_bw_across_leaf_spine(lab):
    """rxe hosts in the root namespace, switches in namespaces with eBPF: ib_write_bw h0→h1 crosses a spine."""
    lb = lab(make_scenario(topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 1, "host_link": {"rate": "1gbit"},
                                     "fabric_link": {"rate": "1gbit"}}))

    def spine_rx_bytes() -> int:
        total = 0
        for sp in ("spine0", "spine1"):
            out = subprocess.run(["ip", "-n", lb.fabric.ns[sp], "-j", "-s", "link", "show"], capture_output=True,
                                 text=True, check=True).stdout
            total += sum(x.get("stats64", {}).get("rx", {}).get("bytes", 0) for x in json.loads(out))
        return total

    before = spine_rx_bytes()
    with rxe.RootHosts(lb, ["h0", "h1"]) as rh:
        res, out = perftest_pair(rh.device("h1"), rh.gid_index("h1"), rh.device("h0"), rh.gid_index("h0"),
                                 rh.address("h1"))
    crossed = spine_rx_bytes() - before
    print(f"ib_write_bw across leaf-spine: {res}; spine rx bytes {crossed}")
    assert res["bw_avg_mbps"] > 0, out
    assert crossed > res["msg_bytes"] * res["iterations"], "RoCE traffic did not cross the spines"


# ECN: the eBPF marker and the kernel's RED, both held at standing queue depths between kmin and kmax.
KMIN, KMAX, PMAX = 30_000, 90_000, 0.5
DEPTHS = (45_000, 60_000, 75_000)            # P(mark) on the curve: 0.125, 0.25, 0.375
FRAME = 1014                                 # bytes of one datagram at the queue: 972 + UDP 8 + IP 20 + Ethernet 14
LOAD_MBPS, LINK_MBPS, SECONDS, WARMUP_S = 6, 4, 4.0, 0.8


def _curve(depth: float) -> float:
    """The RED/DCQCN marking probability the eBPF marker applies to each packet (ecn_should_mark)."""
    return min(max(PMAX * (depth - KMIN) / (KMAX - KMIN), 0.0), 1.0)


def _red_fraction(p: float) -> float:
    """Fraction of packets Linux RED marks at a steady average queue whose curve probability is ``p``. RED does
    not toss a coin per packet: it marks once ``count × p`` passes a uniform random drawn after the previous
    mark (red_action/red_mark_probability, Floyd's uniform spacing), so the gap X between marks has
    P(X > n) = 1 − n·p and the fraction is 1/E[X] ≈ 2p/(1+p) — 0.4 at p = 0.25, not 0.25."""
    if p <= 0:
        return 0.0
    k = 0
    while (k + 1) * p < 1:
        k += 1
    return 1.0 / sum(1 - n * p for n in range(k + 1))


def _red_p_from_fraction(f: float) -> float:
    """The curve probability p whose RED marking fraction is ``f`` (the inverse of _red_fraction, bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _red_fraction(mid) < f else (lo, mid)
    return (lo + hi) / 2


def _red_reference(depth: int) -> dict:
    """Kernel reference: UDP ECT(0) at LOAD_MBPS into TBF(LINK_MBPS) + RED(ecn, KMIN/KMAX/PMAX) whose hard limit is
    ``depth``: the overloaded queue stands at ``depth`` and RED's average follows it. CE is counted at the receiver
    on packets that arrived after WARMUP_S (the queue filling); the qdisc backlog is sampled during the run."""
    import threading
    a, b = "ftb-redref-a", "ftb-redref-b"
    netns.create([a, b])
    try:
        for cmd in (["ip", "-n", a, "link", "add", "ra", "type", "veth", "peer", "name", "rb", "netns", b],
                    ["ip", "-n", a, "addr", "add", "10.78.0.1/24", "dev", "ra"],
                    ["ip", "-n", b, "addr", "add", "10.78.0.2/24", "dev", "rb"],
                    ["ip", "-n", a, "link", "set", "ra", "up"], ["ip", "-n", b, "link", "set", "rb", "up"],
                    ["tc", "-n", a, "qdisc", "add", "dev", "ra", "root", "handle", "1:", "tbf", "rate",
                     f"{LINK_MBPS}mbit", "burst", "3000", "limit", "400000"],
                    ["tc", "-n", a, "qdisc", "add", "dev", "ra", "parent", "1:1", "handle", "10:", "red", "limit",
                     str(depth), "min", str(KMIN), "max", str(KMAX), "avpkt", str(FRAME), "burst", "40",
                     "probability", str(PMAX), "bandwidth", f"{LINK_MBPS}mbit", "ecn"]):
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr.strip()}"
        got = {}

        def receive():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            s.bind(("10.78.0.2", 9000))
            s.settimeout(2.0)
            n = ce = 0
            first = None
            try:
                while True:
                    _, anc, _, _ = s.recvmsg(2048, 64)
                    now = time.monotonic()
                    first = first or now
                    if now - first < WARMUP_S:
                        continue
                    n += 1
                    for lvl, typ, data in anc:
                        if lvl == socket.IPPROTO_IP and typ == socket.IP_TOS and data[0] & 3 == 3:
                            ce += 1
            except socket.timeout:
                pass
            finally:
                s.close()
            got.update(n=n, ce=ce)

        def send():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x02)           # ECT(0)
            s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_SNDBUFFORCE", 32), 8 << 20)
            gap = FRAME * 8 / (LOAD_MBPS * 1e6)
            end = time.monotonic() + SECONDS
            t = time.monotonic()
            while t < end:
                s.sendto(bytes(972), ("10.78.0.2", 9000))
                t += gap
                d = t - time.monotonic()
                if d > 0:
                    time.sleep(d)
            s.close()

        backlog, stop = [], threading.Event()

        def sample():
            stop.wait(WARMUP_S + 0.5)
            while not stop.wait(0.4):
                out = subprocess.run(["tc", "-n", a, "-j", "-s", "qdisc", "show", "dev", "ra"],
                                     capture_output=True, text=True).stdout
                backlog.extend(q["backlog"] for q in json.loads(out or "[]") if q.get("kind") == "red")
        rx = threading.Thread(target=lambda: netns.run_in(b, receive))
        smp = threading.Thread(target=sample)
        rx.start()
        time.sleep(0.3)
        smp.start()
        try:
            netns.run_in(a, send)
        finally:
            stop.set()
            smp.join(30)
            rx.join(30)
        got["backlog_median"] = sorted(backlog)[len(backlog) // 2] if backlog else None
        got["qdisc"] = subprocess.run(["tc", "-n", a, "-s", "qdisc", "show", "dev", "ra"], capture_output=True,
                                      text=True).stdout
        return got
    finally:
        netns.delete([a, b])


def _ebpf_marks(depth: int) -> dict:
    """The same load through the eBPF marker: one ECT(0) UDP flow into a leaf uplink of LINK_MBPS whose queue
    marks with KMIN/KMAX/PMAX and tail-drops at ``switch.buffer`` = ``depth``, so the virtual queue each packet
    sees stands at ``depth`` less a frame or two. Counters are read after WARMUP_S and at the end; the
    difference is the standing queue's (marks, ECT packets, mean depth seen)."""
    import threading

    from testbed import workloads
    from testbed.lab import Lab
    scen = make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 1,
                                   "host_link": {"rate": "100mbit", "buffer": "400000"},
                                   "fabric_link": {"rate": f"{LINK_MBPS}mbit", "buffer": "400000"}},
                         switch={"buffer": str(depth), "ecn": {"kmin": str(KMIN), "kmax": str(KMAX),
                                                               "pmax": PMAX}},
                         traffic={"ecn": "ect0"})
    with Lab(scen, "ecnref") as lb:
        t = lb.topo
        up = t.uplinks("leaf0")[0].ifindex
        flow = workloads.Flow(0, "h0", "h1", t.address("h0"), t.address("h1"), 47000, 9000, "udp", None,
                              int(LOAD_MBPS * 1e6), 0.0, ecn="ect0")

        def counters():
            qc = [c for (ifx, _), c in lb.datapath.queue_counters().items() if ifx == up]
            return {k: sum(getattr(c, k) for c in qc) for k in ("packets", "ect_packets", "ecn_marks", "depth_sum",
                                                                "drops")}
        snap = {}

        def at_warmup():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and counters()["packets"] == 0:   # agents start, then the flow
                time.sleep(0.05)
            time.sleep(WARMUP_S)
            snap.update(counters())
        th = threading.Thread(target=at_warmup)
        th.start()
        try:
            workloads.run([flow], lambda h: lb.fabric.ns[h], SECONDS, 1000)
        finally:
            th.join(60)
        end = counters()
        d = {k: end[k] - snap.get(k, 0) for k in end}
        return {"ect": d["ect_packets"], "ce": d["ecn_marks"], "drops": d["drops"],
                "depth_mean": d["depth_sum"] / d["packets"] if d["packets"] else 0.0}


def test_ecn_ebpf_marker_agrees_with_red():
    """Both markers at three standing queue depths between kmin and kmax (the curve, not the saturated end; the
    depth is held by making it the tail-drop limit of an overloaded port). At each depth the eBPF marker's CE
    fraction follows pmax·(D−kmin)/(kmax−kmin) at the depth its packets saw; RED's follows the same curve
    through its count-based spacing (_red_fraction: ≈ 2p/(1+p)), and the p recovered from RED's fraction
    agrees with the eBPF marker's."""
    rows = []
    for depth in DEPTHS:
        red, ebpf = _red_reference(depth), _ebpf_marks(depth)
        f_red, f_ebpf = red["ce"] / max(red["n"], 1), ebpf["ce"] / max(ebpf["ect"], 1)
        rows.append((depth, red, ebpf, f_red, f_ebpf))
        print(f"D={depth}: curve p={_curve(depth):.3f} (at D−frame {_curve(depth - FRAME):.3f}) | "
              f"RED {f_red:.3f} of {red['n']} (expected {_red_fraction(_curve(depth - FRAME)):.3f}, "
              f"p from it {_red_p_from_fraction(f_red):.3f}, backlog median {red['backlog_median']}) | "
              f"eBPF {f_ebpf:.3f} of {ebpf['ect']} at mean depth {ebpf['depth_mean']:.0f} "
              f"(curve there {_curve(ebpf['depth_mean']):.3f}), drops {ebpf['drops']}")
    for depth, red, ebpf, f_red, f_ebpf in rows:
        assert red["n"] > 1000 and ebpf["ect"] > 1000, (depth, red, ebpf)          # 1305–1644 measured
        # Worst seen in 5 lane runs (15 depths): queue mean D−4.4 KB (a sender descheduled under TCG lets it
        # dip; D−1.4..2.5 KB otherwise), eBPF vs the curve at its mean depth 0.022 and at D−frame 0.032, RED vs
        # its expected fraction 0.031, p recovered from RED vs eBPF 0.037.
        assert depth - 6 * FRAME <= ebpf["depth_mean"] <= depth - FRAME, (depth, ebpf)
        assert abs(f_ebpf - _curve(ebpf["depth_mean"])) <= 0.04, (depth, f_ebpf, ebpf)
        assert abs(f_ebpf - _curve(depth - FRAME)) <= 0.05, (depth, f_ebpf, ebpf)
        assert abs(f_red - _red_fraction(_curve(depth - FRAME))) <= 0.045, (depth, f_red, red["qdisc"])
        # ~1,550 packets per marker: 1σ of each fraction ≈ 0.012, of this difference ≈ 0.017; 0.057 seen once
        # (CI-9: eBPF +0.035 over its curve, RED −0.02 under its expectation, at D = 75 KB)
        assert abs(_red_p_from_fraction(f_red) - f_ebpf) <= 0.06, (depth, f_red, f_ebpf)
    f_ebpf = [r[4] for r in rows]
    assert f_ebpf == sorted(f_ebpf) and f_ebpf[-1] - f_ebpf[0] >= 0.15, f_ebpf     # a rising curve, not a plateau
