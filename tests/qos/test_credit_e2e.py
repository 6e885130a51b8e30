"""End-to-end credit-based flow control (InfiniBand style): real namespaces, HTB/TBF, the eBPF switch and the
credit meter of the flow-control agent.

Each test fails if its feature breaks: an 8→1 incast through two switch hops stays lossless over more than a
million packets while keeping the receiver busy (senders out of credit wait, they do not drop); at a buffer
where PFC without headroom loses packets, credits lose none; and a victim flow's slowdown from head-of-line
blocking under each."""
from __future__ import annotations

import pytest

from testbed import runner, workloads
from testbed.fabric import netns

from conftest import Machine, guarded_run, lab_load_ok, make_scenario

pytestmark = pytest.mark.e2e

LOSSLESS = {"dscp": {26: 3}, "lossless": [3]}


def fc_scenario(fc: str, buffer: str, rate="40mbit", sink_rate=None, leaves=3, hosts_per_leaf=3,
                fabric_rate=None, headroom=None):
    """3 leaves × 3 hosts under one spine; ``fc``: "credit" (buffer = the credit buffer per ingress), "pfc"
    (buffer = xoff + headroom per ingress) or "none"."""
    from testbed import units
    link = {"rate": rate, "buffer": "256KB"}
    topo = {"spines": 1, "leaves": leaves, "hosts_per_leaf": hosts_per_leaf, "host_link": link,
            "fabric_link": {"rate": fabric_rate or rate, "buffer": "256KB"}}
    if sink_rate:
        topo["links"] = [{"between": ["leaf0", "h0"], "rate": sink_rate}]
    sw = {"buffer": "100KB", "traffic_classes": LOSSLESS}
    if fc == "credit":
        sw["credit"] = {"enabled": True, "buffer": buffer}
    elif fc == "pfc":
        b, h = units.size_bytes(buffer), units.size_bytes(headroom)
        sw["pfc"] = {"enabled": True, "xoff": b - h, "xon": (b - h) // 2, "headroom": h}
    return make_scenario(topology=topo, switch=sw, hosts={"pfc": fc == "pfc"}, traffic={"dscp": 26})


def run_pairs(lb, scen, pairs, duration, packet_size=1500):
    t = lb.topo
    fl = [workloads.Flow(i, s, d, t.address(s), t.address(d), 30000 + i, 5001, "udp", None, None, 0.0, dscp=26)
          for i, (s, d) in enumerate(pairs)]
    runner.set_host_classes(scen, fl)
    return workloads.run(fl, lambda h: lb.fabric.ns[h], duration, packet_size, sndbuf_bytes=150_000)


def host_socket_drops(lb, host: str) -> int:
    """Datagrams the receiving host's kernel dropped at its sockets (Udp RcvbufErrors of its namespace): a
    receiving agent starved of CPU, not the fabric."""
    def read() -> int:
        with open("/proc/thread-self/net/snmp") as f:
            head, vals = [ln.split() for ln in f if ln.startswith("Udp:")][:2]
        return int(vals[head.index("RcvbufErrors")])
    return netns.run_in(lb.fabric.ns[host], read)


def outcome(lb, res) -> dict:
    """Drops anywhere (switch program: buffers and overflowing ingresses; every qdisc), packets lost end to end,
    lossless packets the switches queued, and the credit counters."""
    q = lb.datapath.queue_counters()
    names = {p.ifindex: f"{n}/{p.ifname}" for n, ps in lb.topo.ports.items() for p in ps}
    out = {"drops": sum(c.drops for c in q.values()), "overflows": sum(c.overflows for c in q.values()),
           "qdisc_drops": {names[i]: v[2] for i, v in lb.fabric.qdisc_stats(list(lb.topo.nodes)).items() if v[2]},
           "lost": sum(r.lost for r in res), "received": sum(r.packets_received for r in res),
           "queued": sum(c.packets for (_, p), c in q.items() if p == 3)}
    if lb.scen.switch.credit_on:
        cr = lb.datapath.credit_counters()
        out.update(stalls=sum(v[0] for v in cr.values()), stall_s=sum(v[1] for v in cr.values()) / 1e9,
                   granted=sum(v[2] for v in cr.values()))
    return out


def test_credit_incast_is_lossless_over_a_million_packets_and_keeps_the_receiver_busy(lab, machine):
    """8→1 incast, two switch hops for six senders (leaf → spine → leaf0), small packets so that the switches
    queue over 10⁶ lossless packets in the run; the receiver's link (50 Mbit/s) is the bottleneck, every other
    link runs at 100 Mbit/s. Senders out of credit wait: nothing is dropped anywhere, nothing is lost, and the
    receiver's link stays busy."""
    scen = fc_scenario("credit", "32KB", rate="100mbit", sink_rate="50mbit")
    lb = lab(scen)
    # 28 s: 1.04–1.05 M packets queued in 25 s on a quiet machine, 0.99 M once in a CI run (receiver link 0.77
    # busy instead of 0.81): the million needs the margin
    machine.start()
    sock0 = host_socket_drops(lb, "h0")
    res = run_pairs(lb, scen, [(s, "h0") for s in lb.topo.hosts if s != "h0"], 28.0, packet_size=200)
    had = machine.available()
    o = outcome(lb, res)
    o["socket_drops"] = host_socket_drops(lb, "h0") - sock0
    start, end = min(r.start_s for r in res), max(r.end_s for r in res)
    util = sum(r.bytes for r in res) * (200 + 14) / (200 - 20) * 8 / (end - start) / 50e6
    lb.close(force=True)
    cr = (lb.results.get("pfc") or {}).get("credits") or {}
    print(f"\n[credit incast] {o['queued']:,} lossless packets queued, {o['received']:,} delivered, util {util:.3f}; "
          f"drops {o['drops']}, overflows {o['overflows']}, qdisc {o['qdisc_drops']}, lost {o['lost']} (of which "
          f"{o['socket_drops']} at h0's socket); "
          f"stalls {o['stalls']} ({o['stall_s']:.1f} s), granted {o['granted']:,} B; "
          f"grant latency {cr.get('grant_latency_us')}; {1 - had:.1%} of the machine stolen")
    assert o["queued"] >= 1_000_000, o
    # lossless fabric: nothing dropped anywhere on the way; what the receiving agent, starved of CPU, let its
    # socket drop is the host's (once beside a CPU hog and another benchmark: 4,555 lost, 0 in the fabric)
    assert o["drops"] == 0 and o["overflows"] == 0 and not o["qdisc_drops"], o
    assert o["lost"] == o["socket_drops"], o
    assert o["stalls"] > 0 and o["granted"] > 0                   # credits did hold senders back
    assert util >= 0.75 * had, (util, had)                        # 0.80–0.81 measured
    assert not (lb.results.get("pfc") or {}).get("errors"), lb.results.get("pfc").get("errors")


def incast(lab, fc, buffer, headroom=None):
    """8 → h0 at 40 Mbit/s for 3 s: the outcome, the receiver link's utilisation and the share of the machine
    the hypervisor left meanwhile (``had``)."""
    scen = fc_scenario(fc, buffer, headroom=headroom)
    lb = lab(scen)
    m = Machine()
    res = run_pairs(lb, scen, [(s, "h0") for s in lb.topo.hosts if s != "h0"], 3.0)
    o = outcome(lb, res)
    o["had"] = m.available()
    start, end = min(r.start_s for r in res), max(r.end_s for r in res if r.end_s is not None)
    o["util"] = sum(r.bytes for r in res) * 1514 / 1480 * 8 / (end - start) / 40e6
    lb.close(force=True)
    return o


def test_credits_are_lossless_at_a_buffer_where_pfc_without_headroom_drops(lab):
    """16 KB per lossless ingress, 40 Mbit/s: PFC with one frame of headroom (Xoff at 16 KB − 1 frame) drops —
    the bytes its upstream sends while the pause is on its way overflow the buffer — while credits, which never
    let a sender send what the buffer cannot hold, drop nothing and keep the receiver busy."""
    pfc = incast(lab, "pfc", "16KB", headroom="1514")
    credit = incast(lab, "credit", "16KB")
    print(f"\n[16 KB per ingress] PFC, 1 frame of headroom: {pfc}\n[16 KB per ingress] credits: {credit}")
    assert pfc["overflows"] > 0 and pfc["lost"] > 0, pfc
    assert credit["drops"] == 0 and not credit["qdisc_drops"] and credit["lost"] == 0, credit
    assert credit["util"] >= 0.9 * credit["had"], credit


def victim(lab, fc, buffer="64KB", headroom=None):
    """h2, h3 (leaf1) and h4 (leaf2) → h0 (leaf0); the victim h5 (leaf2) → h1 (leaf0), an uncongested receiver
    whose traffic shares leaf2's uplink and the spine's port to leaf0 with the incast. Fabric links are 5× the
    hosts': without flow control the victim gets its whole host link."""
    scen = fc_scenario(fc, buffer, fabric_rate="200mbit", leaves=3, hosts_per_leaf=2, headroom=headroom)
    lb = lab(scen)
    m = Machine()
    res = run_pairs(lb, scen, [("h2", "h0"), ("h3", "h0"), ("h4", "h0"), ("h5", "h1")], 3.0)
    o = outcome(lb, res)
    o["had"] = m.available()
    lb.close(force=True)
    return res[3].goodput_mbps, o


def test_victim_flow_slowdown_under_pfc_and_credits(lab):
    """Head-of-line blocking: a flow to an idle receiver slows down behind an incast it only shares links with,
    under PFC (the spine's port to leaf0 is paused, then leaf2's uplink) and under credits (that port waits for
    leaf0's credit, then leaf2's uplink for the spine's): both spread congestion to the victim, neither drops."""
    free, o_free = victim(lab, "none")
    # headroom for the agent's worst reaction on a busy machine at 200 Mbit/s fabric links (~20 ms: 500 KB;
    # 128 KB overflowed 4 packets in a suite run)
    pfc, o_pfc = victim(lab, "pfc", "640KB", headroom="512KB")
    credit, o_cr = victim(lab, "credit")
    line = 40 * 1480 / 1514
    print(f"\n[victim flow] goodput without flow control {free:.1f} Mbit/s, PFC {pfc:.1f} ({pfc / free:.2f}×), "
          f"credits {credit:.1f} ({credit / free:.2f}×); credit stalls {o_cr['stalls']}")
    assert free >= 0.85 * line * o_free["had"], (free, o_free["had"])
    assert pfc <= 0.75 * free and credit <= 0.75 * free, (free, pfc, credit)
    for name, o in (("pfc", o_pfc), ("credits", o_cr)):
        assert o["drops"] == 0 and o["lost"] == 0, (name, o)


def test_incast_credit_scenario_reports_credit_counters(tmp_path):
    """`testbed run scenarios/incast-credit.yaml`: links.csv carries the credit columns on every switch port —
    the receiving ports' stalls and grants, the sending ports' wait — and they add up: the summary's totals are
    the rx rows' sums, every port that granted credit into the congested leaf shows stalls, and the tx rows of
    leaf1's uplink (which waited for the spine's credit: congestion spread two hops) show the wait. Lossless,
    and light enough for the emulator (`lab_load_ok`)."""
    import pandas as pd
    from pathlib import Path

    from testbed import scenario
    root = Path(__file__).resolve().parents[2]
    d, row = guarded_run(scenario.load(root / "scenarios" / "incast-credit.yaml"), tmp_path / "run")
    links = pd.read_csv(d / "links.csv")
    for col in ("credit_stalls", "credit_stall_s", "credits_granted", "credit_wait_s"):
        assert col in links.columns, col
    rx, tx = links[links["direction"] == "rx"], links[links["direction"] == "tx"]
    assert row["credit_stalls"] == rx["credit_stalls"].sum() > 0
    assert abs(row["credit_stall_s_total"] - rx["credit_stall_s"].sum()) < 1e-6
    per_port = rx.groupby(["switch", "port"])[["credit_stalls", "credits_granted"]].sum()
    assert per_port.loc[("spine0", "leaf1"), "credit_stalls"] > 0         # leaf1's uplink ran out of credit
    assert per_port.loc[("leaf1", "h3"), "credits_granted"] > 0
    # leaf1's uplink waited for the spine's credit (0.28–0.33 s per run); the spine's own port to leaf0 waits
    # little (0.02–0.13 s, 0 in a CI run): leaf0 drains it first, the spine's ingresses fill
    assert tx[(tx["switch"] == "leaf1") & (tx["port"] == "spine0")]["credit_wait_s"].sum() > 0.1
    assert row["drops"] == 0 and row["lost_packets"] == 0 and row["discards"] == 0
    ok, seen = lab_load_ok(row)                 # the scenario is light enough (steal on a busy host aside)
    assert ok, seen
