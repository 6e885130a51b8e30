"""End-to-end congestion and flow control: real namespaces, HTB/TBF shaping, the eBPF switch and the PFC agent.

Each test fails if its feature breaks: ECN marking (none below the port rate, the curve's rate on a standing
queue, never non-ECT), tail drops vs lossless PFC in an 8→1 incast, pause spreading onto a victim flow, PFC
frames decoded by tshark, and the queue model against the qdisc's real backlog."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time

import pytest

from testbed.fabric.netlink import dump_root_qdisc_stats
from testbed import runner, scenario, telemetry, workloads
from testbed.fabric import netns
from testbed.fabric.capture import Captures
from testbed.qos.pfc import summarize_reactions
from testbed.report.summary import STEAL_SHARE, interval_steal

from conftest import make_scenario

pytestmark = pytest.mark.e2e

RATE = "40mbit"
LINK = {"rate": RATE, "buffer": "256KB"}
PAYLOAD_TO_WIRE = 1514 / 1480          # UDP bytes counted by the receiver (header included) → Ethernet frame


@pytest.fixture
def qlab(lab):
    """qlab(scenario) → a built Lab, torn down (PFC agent included) after the test (conftest's ``lab``)."""
    return lab


def flows_to(lb, scen, pairs, dscp=0, ecn="none", rate=None, sport=30000):
    t = lb.topo
    fl = [workloads.Flow(i, s, d, t.address(s), t.address(d), sport + i, 5001, "udp", None, rate, 0.0,
                         dscp=dscp, ecn=ecn) for i, (s, d) in enumerate(pairs)]
    runner.set_host_classes(scen, fl)
    return fl


def run_flows(lb, flows, duration):
    return workloads.run(flows, lambda h: lb.fabric.ns[h], duration, 1500, sndbuf_bytes=150_000)


def totals(lb):
    q = lb.datapath.queue_counters()
    out = {"drops": sum(c.drops for c in q.values()), "marks": sum(c.ecn_marks for c in q.values()),
           "ect": sum(c.ect_packets for c in q.values()), "pause_rx": sum(c.pause_rx for c in q.values())}
    pf = lb.datapath.pfc_counters()
    out["pause_tx"] = sum(v[0] for v in pf.values())
    return q, out


def qdisc_drops(lb) -> int:
    return sum(qdisc_drops_at(lb).values())


def qdisc_drops_at(lb) -> dict[str, int]:
    """Root-qdisc drops per port ("node/ifname") that dropped anything: where a loss happened."""
    names = {p.ifindex: f"{n}/{p.ifname}" for n, ps in lb.topo.ports.items() for p in ps}
    return {names.get(i, str(i)): v[2] for i, v in lb.fabric.qdisc_stats(list(lb.topo.nodes)).items() if v[2]}


# ---------------------------------------------------------------- ECN

KMIN, KMAX, PMAX = 20 * 1024, 200 * 1024, 0.5


def ecn_scenario(buffer="100KB"):
    return make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 2, "host_link": LINK,
                                   "fabric_link": {"rate": "200mbit", "buffer": "256KB"}},
                         switch={"buffer": buffer, "ecn": {"kmin": KMIN, "kmax": KMAX, "pmax": PMAX}})


def test_ecn_no_marks_below_port_rate(qlab):
    scen = ecn_scenario()
    lb = qlab(scen)
    res = run_flows(lb, flows_to(lb, scen, [("h0", "h2")], ecn="ect0", rate=20_000_000), 2.0)
    _, t = totals(lb)
    assert res[0].bytes > 2_000_000 and t["ect"] > 1000
    assert t["marks"] == 0 and t["drops"] == 0


def test_ecn_marks_follow_the_curve_on_a_standing_queue(qlab):
    """Two senders into one receiver port: the queue stands at the 100 KB buffer, between Kmin and Kmax, where
    P(mark) = pmax (d − kmin)/(kmax − kmin). The curve is linear there, so the expected marks are
    n_ect × P(mean depth seen); packets of the initial ramp below Kmin make it a slight overestimate."""
    scen = ecn_scenario()
    lb = qlab(scen)
    run_flows(lb, flows_to(lb, scen, [("h0", "h2"), ("h1", "h2")], ecn="ect0"), 3.0)
    q, t = totals(lb)
    port = lb.topo.port_named("leaf1", "h2").ifindex
    c = q[(port, 0)]
    assert KMIN < c.depth_mean < KMAX and c.drops > 0          # a standing queue at the buffer
    expected = c.ect_packets * PMAX * (c.depth_mean - KMIN) / (KMAX - KMIN)
    assert 0.8 * expected <= c.ecn_marks <= 1.1 * expected, (c.ecn_marks, expected, c.depth_mean)
    assert t["marks"] == c.ecn_marks                           # nowhere else: the fabric links are not congested


def test_non_ect_never_marked_but_dropped(qlab):
    scen = ecn_scenario()
    lb = qlab(scen)
    res = run_flows(lb, flows_to(lb, scen, [("h0", "h2"), ("h1", "h2")], ecn="none"), 2.0)
    _, t = totals(lb)
    assert t["ect"] == 0 and t["marks"] == 0
    assert t["drops"] > 0 and sum(r.lost for r in res) > 0


# ---------------------------------------------------------------- PFC

def pfc_scenario(enabled, fabric=LINK, leaves=3, hosts_per_leaf=3, spines=1):
    return make_scenario(
        topology={"spines": spines, "leaves": leaves, "hosts_per_leaf": hosts_per_leaf, "host_link": LINK,
                  "fabric_link": fabric},
        switch={"buffer": "100KB", "traffic_classes": {"dscp": {26: 3}, "lossless": [3]},
                # headroom for the agent's worst reaction on a busy machine (~20 ms at 40 Mbit/s: 100 KB, + 2
                # frames + the 15 KB shaper burst); 48 and 64 KB overflowed an ingress (3–31 packets) in suite runs
                "pfc": {"enabled": enabled, "xoff": "30KB", "xon": "15KB", "headroom": "128KB"}},
        hosts={"pfc": True}, traffic={"dscp": 26})


def incast(qlab, enabled, duration=3.0, machine=None):
    scen = pfc_scenario(enabled)
    lb = qlab(scen)
    senders = [h for h in lb.topo.hosts if h != "h0"]
    assert len(senders) == 8
    if machine:
        machine.start()
    res = run_flows(lb, flows_to(lb, scen, [(s, "h0") for s in senders], dscp=26), duration)
    t = {"had": machine.available() if machine else 1.0}     # what the hypervisor left the traffic
    q, tot = totals(lb)
    t |= tot
    t["qdisc_drops_at"] = qdisc_drops_at(lb)
    t["qdisc_drops"] = sum(t["qdisc_drops_at"].values())
    t["lost"] = sum(r.lost for r in res)
    start = min(r.start_s for r in res)
    end = max(r.end_s for r in res if r.end_s is not None)   # PFC off: a flow may deliver nothing (tail-drop lockout)
    t["util"] = sum(r.bytes for r in res) * PAYLOAD_TO_WIRE * 8 / (end - start) / 40e6
    lb.close(force=True)
    t["agent"] = summarize_reactions(lb.results.get("pfc")) if lb.results.get("pfc") else None
    t["agent_errors"] = (lb.results.get("pfc") or {}).get("errors")
    t["drift_resyncs"] = (lb.results.get("pfc") or {}).get("drift_resyncs")
    return t


def test_incast_pfc_off_drops(qlab):
    t = incast(qlab, False)
    assert t["drops"] + t["qdisc_drops"] > 0 and t["lost"] > 0
    assert t["pause_tx"] == 0 and t["pause_rx"] == 0


def test_incast_pfc_on_is_lossless_and_keeps_the_receiver_busy(qlab, machine):
    t = incast(qlab, True, machine=machine)
    assert t["drops"] == 0 and t["qdisc_drops"] == 0 and t["lost"] == 0, t
    assert t["pause_tx"] > 0 and t["pause_rx"] > 0
    assert t["util"] >= 0.90 * t["had"], t            # of the time the hypervisor left
    assert not t["agent_errors"], t["agent_errors"]
    print(f"\n[pfc incast] util {t['util']:.3f}, pause frames {t['pause_tx']}, drift resyncs {t['drift_resyncs']}, "
          f"agent {t['agent']}")


def test_incast_pfc_stays_lossless_when_the_receiver_port_falls_behind(qlab):
    """The 8→1 incast with PFC, and the receiver's port (leaf0→h0, never paused itself) stops serialising for
    100 ms at 1 s: its real queue grows by what the model thinks left (~500 KB of arrivals at 40 Mbit/s × 2…),
    past the lossless class's 4 × buffer limit unless the model learns of it. The PFC agent's sweep resets the
    model to the real backlog within ~20 ms, Xoff goes upstream, and nothing is lost."""
    scen = pfc_scenario(True)
    lb = qlab(scen)
    port = lb.topo.port_named("leaf0", "h0")
    t0 = time.monotonic()

    def stall():
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        _stall_shaper(lb, port, 0.1, prio=3)

    th = threading.Thread(target=stall)
    th.start()
    try:
        res = run_flows(lb, flows_to(lb, scen, [(s, "h0") for s in lb.topo.hosts if s != "h0"], dscp=26), 3.0)
    finally:
        th.join()
    _, t = totals(lb)
    at = qdisc_drops_at(lb)
    lost = sum(r.lost for r in res)
    lb.close(force=True)
    drift = (lb.results.get("pfc") or {}).get("drift_resyncs")
    print(f"\n[pfc incast, receiver port stalled 100 ms] qdisc drops {at}, lost {lost}, drift resyncs {drift}")
    assert t["drops"] == 0 and not at and lost == 0, (t, at, lost)
    assert drift and drift > 0


def victim_run(qlab, enabled):
    """h2, h3 (leaf1), h4 (leaf2) → h0 (leaf0) incast; victim h5 (leaf2) → h1 (leaf0), an uncongested receiver
    whose traffic shares the spine's port to leaf0 and leaf2's uplink with the incast. Fabric links are 5× faster
    than hosts: without PFC the victim has all the capacity it needs."""
    scen = pfc_scenario(enabled, fabric={"rate": "200mbit", "buffer": "256KB"}, leaves=3, hosts_per_leaf=2)
    lb = qlab(scen)
    res = run_flows(lb, flows_to(lb, scen, [("h2", "h0"), ("h3", "h0"), ("h4", "h0"), ("h5", "h1")], dscp=26),
                   3.0)
    victim = res[3]
    pf = lb.datapath.pfc_counters()
    q = lb.datapath.queue_counters()
    topo = lb.topo
    spine_to_leaf0 = topo.port_named("spine0", "leaf0").ifindex
    leaf2_up = topo.port_named("leaf2", "spine0").ifindex
    return victim.goodput_mbps, {"spine_paused_s": pf[(spine_to_leaf0, 3)][1] / 1e9,
                                 "leaf2_up_pause_rx": q[(leaf2_up, 3)].pause_rx}


def test_pause_spreading_slows_an_innocent_flow_only_with_pfc(qlab, machine):
    off, s_off = victim_run(qlab, False)
    had = machine.available()                                   # what the hypervisor left during that run
    on, s_on = victim_run(qlab, True)
    print(f"\n[pause spreading] victim goodput PFC off {off:.1f} Mbit/s, on {on:.1f} Mbit/s; {s_on}; "
          f"{1 - had:.1%} of the machine stolen during the PFC-off run")
    assert off >= 0.85 * 40 * 1480 / 1514 * had, (off, had)   # the victim gets its host link without PFC
    assert on <= 0.75 * off, (on, off)                          # head-of-line blocked behind the paused port
    assert s_on["spine_paused_s"] > 0.1                         # leaf0 paused the spine …
    assert s_on["leaf2_up_pause_rx"] > 0                        # … which paused leaf2 (the victim's leaf)
    assert s_off["spine_paused_s"] == 0 and s_off["leaf2_up_pause_rx"] == 0


def test_pfc_pauses_only_the_heavy_ingress(qlab):
    """Xoff by ingress accounting: h1 (line rate) and h2 (5 Mbit/s) both send to h0 through leaf0, whose port to
    h0 is congested. The queue is almost all h1's bytes, so only leaf0's port to h1 passes Xoff and sends pause
    frames; h2's ingress holds ~1/9 of the queue, stays below Xoff and is never paused. Pausing every port that
    feeds a queue above Xoff (egress-triggered) would pause h2 about as often as h1."""
    scen = pfc_scenario(True, leaves=2, hosts_per_leaf=3)
    lb = qlab(scen)
    topo = lb.topo
    fl = flows_to(lb, scen, [("h1", "h0"), ("h2", "h0")], dscp=26)
    fl[1].rate_bps = 5_000_000
    res = run_flows(lb, fl, 2.0)
    pf = lb.datapath.pfc_counters()
    q = lb.datapath.queue_counters()
    heavy, light = topo.port_named("leaf0", "h1").ifindex, topo.port_named("leaf0", "h2").ifindex
    h0 = topo.port_named("leaf0", "h0").ifindex
    print(f"\n[pfc ingress] pause_tx heavy {pf[(heavy, 3)][0]}, light {pf[(light, 3)][0]}; "
          f"xoff heavy {q[(heavy, 3)].xoff_events}, light {q[(light, 3)].xoff_events}; "
          f"h0 port queue max {q[(h0, 3)].depth_max} B; goodput {[round(r.goodput_mbps, 1) for r in res]}")
    assert q[(h0, 3)].depth_max > 30 * 1024                    # the egress queue did pass Xoff
    assert pf[(heavy, 3)][0] >= 10
    assert pf[(light, 3)][0] == 0 and q[(light, 3)].xoff_events == 0
    assert sum(c.drops for c in q.values()) == 0 and sum(r.lost for r in res) == 0
    assert res[1].goodput_mbps >= 0.9 * 5 * 1480 / 1514 * 0.98      # the light flow is not slowed


@pytest.mark.skipif(not shutil.which("tshark"), reason="needs tshark")
def test_pfc_frames_decode_in_tshark(qlab, tmp_path):
    scen = pfc_scenario(True, leaves=2, hosts_per_leaf=3)
    lb = qlab(scen)
    cap = Captures(lb.fabric, ["h1"], tmp_path)
    cap.start()
    try:
        run_flows(lb, flows_to(lb, scen, [("h1", "h0"), ("h2", "h0"), ("h3", "h0")], dscp=26), 1.5)
    finally:
        files = cap.stop()
    pcap = str(next(tmp_path / f for f in files))
    out = subprocess.run(["tshark", "-r", pcap, "-Y", "macc.opcode == 0x0101", "-T", "fields",
                          "-e", "eth.dst", "-e", "macc.cbfc.enbv", "-e", "macc.cbfc.pause_time.c3"],
                         capture_output=True, text=True, timeout=60)
    rows = [ln.split("\t") for ln in out.stdout.splitlines() if ln.strip()]
    assert rows, out.stderr
    assert all(r[0] == "01:80:c2:00:00:01" for r in rows)
    times = {r[2] for r in rows}
    assert "65535" in times and "0" in times, times             # Xoff and Xon, priority 3
    verbose = subprocess.run(["tshark", "-r", pcap, "-Y", "macc.opcode == 0x0101", "-V"],
                             capture_output=True, text=True, timeout=60).stdout
    assert "Class Based Flow Control" in verbose and "C3: True" in verbose


# ---------------------------------------------------------------- queue model

def _bracketed(read_real, read_model, within_s: float = 0.001):
    """(real, model) read at (nearly) one instant: the model is read just before and just after the netlink
    dump and their mean is used; a pair whose reads took longer than ``within_s`` (the sampling thread was
    descheduled on the busy 2-core machine, so the two sides describe different instants) is not a
    measurement of the model and is discarded — whatever its error."""
    t0 = time.perf_counter()
    m0 = read_model()
    real = read_real()
    m1 = read_model()
    if time.perf_counter() - t0 > within_s:
        return None
    return real, (m0 + m1) / 2


def _stall_shaper(lb, port, seconds: float, prio: int | None = None) -> None:
    """Stop a port's TBF — the root one, or the leaf of priority ``prio``'s HTB class — for ``seconds`` (rate
    8 kbit/s, then back): what a late timer or softirq does to the real serialiser, exaggerated. The queue model,
    draining at the nominal rate, does not see it."""
    from testbed.fabric.netlink import TC_H_ROOT, tbf_change_message
    c = lb.ports[port.ifindex]
    burst, limit = c.burst_bytes, c.queue_limit(prio)
    handle, parent = (0x10000, TC_H_ROOT) if prio is None else (c.leaf_handle(prio), c.class_id(prio))
    s = netns.netlink_socket(lb.fabric.ns[port.node])
    try:
        for rate in (8000, port.rate_bps):
            s.send(tbf_change_message(port.ifindex, handle, parent, rate, burst, limit))
            s.recv(65536)
            time.sleep(seconds if rate == 8000 else 0)
    finally:
        s.close()


def queue_model_run(qlab, stall_s: float = 0.0, resync: bool = True, classes: bool = False):
    """Two senders into one 40 Mbit/s port with a 150 KB buffer (a standing queue), with the telemetry sampler
    running as in `testbed run` (100 ms); ``resync``: whether it resets a drifted model to the real backlog.
    Every 20 ms the model's depth is compared with the qdisc's real backlog (netlink), read back to back. With
    ``stall_s`` the port's shaper stops that long 0.8 s after the queue first stood. Returns the signed
    relative errors (model − real) / real over samples with ≥ 16 KB real backlog as (time since the queue first
    stood, error); the errors the sampler saw just
    before each of its resyncs (the model the datapath acted on at the end of an interval, links.csv
    ``queue_model_bytes`` vs ``backlog_bytes``); the busiest core's mean lab load; the number of resyncs."""
    scen = ecn_scenario(buffer="150KB")
    if classes:                         # HTB with a class per priority on every port; no PFC, so no agent
        scen = scen.model_copy(update={"switch": scen.switch.model_copy(update={
            "traffic_classes": scenario.TrafficClassSpec(dscp={26: 3}, default=0)})})
    lb = qlab(scen)
    port = lb.topo.port_named("leaf1", "h2")
    sock = netns.netlink_socket(lb.fabric.ns["leaf1"])
    samples = []
    stop = threading.Event()
    sampler = telemetry.LinkSampler(lb.topo, lb.datapath, 0.1, lb.fabric, resync=resync, resync_classes=classes)

    def sample():
        stalled = not stall_s
        standing = None                      # when the queue first stood (the agents' start varies with load)
        while not stop.is_set():
            now = time.monotonic()
            if not stalled and standing is not None and now - standing >= 0.8:
                _stall_shaper(lb, port, stall_s, 0 if classes else None)
                stalled = True
            got = _bracketed(lambda: dump_root_qdisc_stats(sock)[port.ifindex][4],
                             lambda: lb.datapath.queue_depth(port.ifindex))
            if got and got[0] >= 16_384:
                real, model = got
                standing = standing if standing is not None else now
                samples.append((now - standing, (model - real) / real))
            time.sleep(0.02)

    sampler.start()
    th = threading.Thread(target=sample)
    th.start()
    try:
        run_flows(lb, flows_to(lb, scen, [("h0", "h2"), ("h1", "h2")]), 3.0)
    finally:
        stop.set()
        th.join()
        sampler.stop()
        sock.close()
    resyncs = lb.datapath.resyncs
    lb.close(force=True)
    # while the hypervisor steals a core the shaper on it stops and the model drains: the model may run low by
    # what the link would have sent in that time — at most the core count × the machine's steal share of the
    # interval × the interval at the link rate. That much of a low error is the host's, not the model's.
    steal = [list(x) for x in sampler.cpu.steal]
    cores = os.cpu_count() or 1
    before_reset = []
    for r in sampler.rows:
        if (r["switch"], r["port"], r["direction"]) != ("leaf1", "h2", "tx") or r.get("backlog_bytes", 0) < 16_384:
            continue
        share = min(1.0, cores * interval_steal(steal, r["time_s"] - r["interval_s"], r["time_s"]))
        stolen = share * r["interval_s"] * port.rate_bps / 8
        err = r["queue_model_bytes"] - r["backlog_bytes"]
        before_reset.append((min(0.0, err + stolen) if err < 0 else err) / r["backlog_bytes"])
    busy = [max(b) for _, b in sampler.cpu.samples]
    return samples, before_reset, statistics.fmean(busy) if busy else float("nan"), resyncs


def _stats(xs) -> str:
    a = [abs(x) for x in xs]
    return (f"{len(xs)} samples, median |error| {statistics.median(a):.3%}, mean {statistics.fmean(a):.3%}, "
            f"signed mean {statistics.fmean(xs):+.3%}, max {max(a):.3%}")


def test_queue_model_tracks_the_real_backlog(qlab):
    """The error the datapath acts on: with the sampler resynchronising (as in `testbed run`), the model just
    before each reset (links.csv queue_model_bytes) against the real backlog read at the same instant — the
    drift of one 100 ms interval — has a median ≤ 5 % (20 runs: 0.3–0.5 %), less what the hypervisor's steal in
    the interval explains (a CI run under 13 % steal had every interval stolen from). Without resync the drift is not
    bounded: usually 1–2 %, but a shaper that falls behind once leaves the model off for the rest of the run
    (12 % in 1 of 20 runs; test_queue_model_resyncs_after_the_shaper_falls_behind forces it)."""
    _, before_reset, busy, resyncs = queue_model_run(qlab)
    assert len(before_reset) >= 20                 # ~30 intervals
    print(f"\n[queue model, just before each resync] {_stats(before_reset)}; {resyncs} resyncs; "
          f"busiest core {busy:.2f}")
    assert statistics.median(abs(x) for x in before_reset) <= 0.05


@pytest.mark.parametrize("classes", [False, True], ids=["single-queue", "classes"])
@pytest.mark.parametrize("resync", [False, True], ids=["resync-off", "resync-on"])
def test_queue_model_resyncs_after_the_shaper_falls_behind(qlab, machine, resync, classes):
    """The real shaper stops for 40 ms on a standing queue: the real queue takes the bytes the model thinks
    left (up to the qdisc's limit, buffer + 64 KB) and, the port being overloaded, keeps them for the rest of
    the run — without resync the model stays > 10 % low from then on; with it, the sampler resets the model at
    its next tick and from 300 ms after the stall the median error is ≤ 5 % again. The same on a port with a
    class per priority and no PFC agent (the sampler resynchronises each running class). The hypervisor's
    steal stops the shaper too, between resyncs: under 12–15 % steal the median read 5.3 % and 10.4 %, so a
    run it took ≥ 10 % of (cpu_bound by steal) asks only for the resyncs."""
    machine.start()
    timed, _, busy, resyncs = queue_model_run(qlab, stall_s=0.04, resync=resync, classes=classes)
    stolen = 1 - machine.available()
    before = [abs(e) for t, e in timed if 0.1 <= t < 0.8]
    after = [abs(e) for t, e in timed if t >= 1.1]
    print(f"\n[queue model, 40 ms shaper stall 0.8 s into the standing queue, resync {'on' if resync else 'off'}] median |error| before "
          f"{statistics.median(before):.3%}, from 0.3 s after {statistics.median(after):.3%}; {resyncs} resyncs; "
          f"busiest core {busy:.2f}")
    assert len(before) >= 10 and len(after) >= 30
    if resync:
        assert resyncs >= 1
        if stolen < STEAL_SHARE:
            assert statistics.median(after) <= 0.05, (after, stolen)
    else:
        assert resyncs == 0 and statistics.median(after) > 0.10, after


def test_queue_model_tracks_the_real_backlog_under_pfc(qlab):
    """Under PFC the paused ports' queues never empty, so any drift of the model would accumulate (it read
    20–60 % high before the agent resynchronised it with the frozen real backlog at each pause and resume).
    8→1 incast with PFC: sample the model against the qdisc's backlog every 10 ms on the ports PFC pauses
    (leaf1's and leaf2's uplinks, the spine's port to leaf0). One attempt; the median carries the claim."""
    scen = pfc_scenario(True)
    lb = qlab(scen)
    topo = lb.topo
    watched = [topo.port_named("leaf1", "spine0"), topo.port_named("leaf2", "spine0"),
               topo.port_named("spine0", "leaf0")]
    socks = {p.node: netns.netlink_socket(lb.fabric.ns[p.node]) for p in watched}
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            for p in watched:
                got = _bracketed(lambda: dump_root_qdisc_stats(socks[p.node])[p.ifindex][4],
                                 lambda: lb.datapath.queue_depth(p.ifindex))
                if got and got[0] >= 16_384:
                    real, model = got
                    samples.append((model - real) / real)
            time.sleep(0.01)

    th = threading.Thread(target=sample)
    th.start()
    try:
        run_flows(lb, flows_to(lb, scen, [(s, "h0") for s in topo.hosts if s != "h0"], dscp=26), 3.0)
    finally:
        stop.set()
        th.join()
        for s in socks.values():
            s.close()
    pf = lb.datapath.pfc_counters()
    lb.close(force=True)
    assert sum(pf[(p.ifindex, 3)][1] for p in watched) > 0.1e9          # those ports were paused
    assert lb.results.get("pfc").get("resyncs", 0) > 0
    assert len(samples) >= 30, len(samples)
    median = statistics.median(abs(x) for x in samples)
    print(f"\n[queue model, PFC] {len(samples)} samples on paused ports, median |error| {median:.3%}, "
          f"mean |error| {statistics.fmean(abs(x) for x in samples):.3%}, signed mean "
          f"{statistics.fmean(samples):+.3%}; {lb.results.get('pfc').get('resyncs')} resyncs")
    assert median <= 0.10, median
