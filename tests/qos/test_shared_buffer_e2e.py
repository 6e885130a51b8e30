"""End-to-end shared switch buffers with dynamic thresholds: real namespaces, TBF/HTB, the eBPF switch and (with
PFC) the flow-control agent.

A burst into one port of an otherwise idle switch takes alpha/(1 + alpha) of the shared pool — far more than a
static per-queue share — and two congested ports split it, alpha/(1 + 2 alpha) each; an incast with PFC whose
Xoff follows the dynamic threshold stays lossless and reports the switches' occupancy."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from testbed import runner, scenario, workloads

from testbed.report.summary import STEAL_SHARE

from conftest import guarded_run, make_scenario

pytestmark = pytest.mark.e2e

SIZE = 120 * 1024                       # leaf0's shared buffer (no lossless priority: all of it is the pool)
ROOT = Path(__file__).resolve().parents[2]


def burst_scenario():
    link = {"rate": "40mbit", "buffer": "256KB"}
    return make_scenario(topology={"spines": 1, "leaves": 2, "hosts_per_leaf": 6, "host_link": link,
                                   "fabric_link": link},
                         switch={"shared_buffer": {"size": SIZE, "alpha": 1}})


def resync_models(lb, sw: str, stop: threading.Event, raised: list[int]) -> None:
    """What a run's sampler does every 0.1 s, without consuming the depth maxima and peaks the test reads: reset
    a queue model that drifted from the real backlog (a descheduled shaper sends less than its rate — without
    this the qdisc once held 126 KB more than the model and dropped). ``raised`` gets the largest sum over the
    switch's queues of what a reset added to the models: the occupancy the program computes can pass the pool
    by that much (it once read 160 KB of 120 KB), though it never admits a packet beyond it."""
    ports = [p.ifindex for p in lb.topo.ports[sw]]
    while not stop.wait(0.1):
        dump, depths = lb.datapath.sync_queue_models(ports, lambda leaves: lb.fabric.qdisc_stats([sw], None, leaves))
        up = sum(max(0, dump[i][4] - depths[i]) for i in depths if i in dump)
        raised[0] = max(raised[0], up)


@pytest.mark.parametrize("congested", [1, 2])
def test_a_congested_port_takes_its_dynamic_share_of_the_pool(lab, machine, congested):
    """Two senders at line rate into h0 (and, with 2 congested ports, two more into h1), all on leaf0 (7 ports,
    7 queues: a static share would be 17.6 KB). With alpha 1 one congested queue alone stands at half the pool
    (60 KB), two at a third each (40 KB): depth ≤ alpha × (pool − occupancy). Tail drops above; the qdisc
    (which holds the whole buffer) drops nothing."""
    scen = burst_scenario()
    lb = lab(scen)
    t = lb.topo
    pairs = [("h2", "h0"), ("h3", "h0")] + ([("h4", "h1"), ("h5", "h1")] if congested == 2 else [])
    fl = [workloads.Flow(i, s, d, t.address(s), t.address(d), 30000 + i, 5001, "udp", None, None, 0.0)
          for i, (s, d) in enumerate(pairs)]
    # the steady state: flows start a few ms apart, and the first queue alone would take half the pool
    snap = {}
    timer = threading.Timer(1.0, lambda: snap.update(q=lb.datapath.queue_counters(), peak=lb.datapath.shared_peaks()))
    stop = threading.Event()
    raised = [0]
    resync = threading.Thread(target=resync_models, args=(lb, "leaf0", stop, raised))
    resync.start()
    timer.start()
    machine.start()
    try:
        workloads.run(fl, lambda h: lb.fabric.ns[h], 2.5, 1500, sndbuf_bytes=150_000)
    finally:
        stop.set()
        resync.join()
    timer.join()
    stolen = 1 - machine.available()
    q, q0 = lb.datapath.queue_counters(), snap["q"]
    peak = lb.datapath.shared_peaks()["leaf0"]
    qdisc = {i: v[2] for i, v in lb.fabric.qdisc_stats(["leaf0"]).items() if v[2]}
    lb.close(force=True)
    share = SIZE / (1 + congested)                           # alpha × (pool − n × share) = share
    ports = [t.port(t.port_named(h, "eth0").peer_ifindex).ifindex for h in ("h0", "h1")[:congested]]
    # the depth arriving packets saw, on average over the steady state (a maximum would catch the moments a
    # descheduled sender lets the other queue drain, when the threshold rightly gives this one more)
    means = [(q[(p, 0)].depth_sum - q0[(p, 0)].depth_sum) / max(1, q[(p, 0)].packets - q0[(p, 0)].packets)
             for p in ports]
    print(f"\n[shared buffer, {congested} congested] mean depth seen {[round(m) for m in means]} B, max "
          f"{[q[(p, 0)].depth_max for p in ports]} B (threshold {share:.0f}), leaf0 peak {peak} B, drops "
          f"{[q[(p, 0)].drops for p in ports]}, resyncs raised the models by ≤ {raised[0]} B")
    for p, m in zip(ports, means):
        # 0.954–0.988 measured (6 runs); 0.916 in a CI run on a host stealing CPU (a stalled sender lets the
        # other queue drain below its threshold), 0.82 under 21.8 % steal: a run the hypervisor took ≥ 10 % of
        # is cpu_bound by steal (STEAL_SHARE), not a result — only the upper bound holds for it
        assert m <= share, (m, share)
        if stolen < STEAL_SHARE:
            assert 0.88 * share <= m, (m, share, stolen)
        assert m > 2 * SIZE / 7                               # far above a static share of the buffer
        assert q[(p, 0)].drops > q0[(p, 0)].drops
    assert 0.9 * congested * share <= peak <= SIZE + 1514 + raised[0], (peak, raised[0])
    assert not qdisc, qdisc


def test_incast_with_pfc_on_dynamic_thresholds_is_lossless(tmp_path):
    """`testbed run scenarios/incast-shared-buffer.yaml`: 8→1 incast at 20 Mbit/s, PFC Xoff at the dynamic
    threshold with 64 KB of headroom per lossless ingress reserved out of a 1 MB buffer: no drop, no loss, pauses
    sent; links.csv carries each switch's occupancy and the summary its peak, within the buffer. Losslessness
    is a fidelity figure (the PFC agent must pause in time): asserted on a run the CPU guard calls valid (90
    drops once on a run the hypervisor took 24 % of the CPU from)."""
    import pandas as pd
    d, row = guarded_run(scenario.load(ROOT / "scenarios" / "incast-shared-buffer.yaml"), tmp_path / "run")
    links = pd.read_csv(d / "links.csv")
    for col in ("switch_buffer_bytes", "switch_buffer_peak_bytes", "switch_buffer_peak_frac"):
        assert col in links.columns, col
    leaf0 = links[(links["switch"] == "leaf0") & (links["direction"] == "tx")]
    print(f"\n[shared buffer incast] drops {row['drops']}, lost {row['lost_packets']}, pauses {row['pause_frames']}, "
          f"peak {row['switch_buffer_peak_bytes']} B ({row['switch_buffer_peak_frac']:.2f} of 1 MB), cpu_bound "
          f"{row['cpu_bound']}, "
          f"leaf0 occupancy max {leaf0['switch_buffer_bytes'].max()} B")
    assert row["drops"] == 0 and row["lost_packets"] == 0 and row["discards"] == 0
    assert row["pause_frames"] > 0
    assert row["switch_buffer_peak_bytes"] == links["switch_buffer_peak_bytes"].max() > 0
    assert 0 < row["switch_buffer_peak_frac"] <= 1.0
    assert leaf0["switch_buffer_bytes"].max() > 0
