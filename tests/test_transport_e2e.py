"""Reference checks of the RoCE engine's extended transport and congestion control on real fabrics (issue 12),
scaled from published simulator validations to this machine's rates (20 Mbit/s hosts). Each runs through
``runner.run`` and reads the files it wrote. The bounds are those measured over repeated runs on the 2-core VM
(spreads in the comments); times compared across runs are scaled by the share of the window the hypervisor
left the machine (``_had``)."""
from __future__ import annotations

import pandas as pd
import pytest

from testbed import runner, scenario

from conftest import ROOT, run_had

pytestmark = pytest.mark.e2e


def _run(tmp_path, name: str, doc: dict | str, *sets: str):
    """Run a scenario document, or scenarios/DOC.yaml with ``--set`` overrides; its links, flows and summary."""
    scen = scenario.load(ROOT / "scenarios" / f"{doc}.yaml", sets) if isinstance(doc, str) else scenario.from_dict(doc)
    d, row = runner.run(scen, tmp_path / name)
    return pd.read_csv(d / "links.csv"), pd.read_csv(d / "flows.csv"), row


def _tx(links):
    return links[links["direction"] == "tx"]


# ---------------------------------------------------------------- incast 16 → 1

def test_eqds_bounds_a_16_to_1_incast_near_the_ideal_time(tmp_path):
    """scenarios/uec-incast.yaml. uet-htsim bounds a 15:1 incast at ~94 % of ideal with receiver credit. Ideal:
    the 4 MB ÷ 20 Mbit/s = 1.678 s (payload only). A 2 KB IB MTU (2,200-byte frames, as RoCE fabrics run jumbo
    frames): headers are 3 % of the wire, not 6.4 % as with 1,024-byte payloads, which alone would leave 1.064 ×
    ideal as the best possible. RTO floor 50 ms: with the default 10 ms, a CI run with a core saturated timed out
    11 times without a single drop (ACKs late, not lost). eqds measured 1.08–1.12 × ideal, 0 drops, on an earlier
    VM; 1.13–1.19 × over 7 runs on this one, where the receiver's agent saturates a core (busiest core
    0.93–1.00); none 1.33 ×, dcqcn 2.1–2.6 ×."""
    ideal = 16 * 256 * 1024 * 8 / 20e6
    ratio, drops, whole = {}, {}, {}
    for cc in ("eqds", "none", "dcqcn"):                      # measured first, asserted after: every figure printed
        links, flows, row = _run(tmp_path, cc, "uec-incast", f"traffic.cc={cc}")
        span = flows["end_s"].max() - flows["start_s"].min()
        ratio[cc] = span * run_had(row) / ideal
        drops[cc] = int(_tx(links)["drops"].sum())
        whole[cc] = bool(flows["complete"].all() and flows["checksum_ok"].all())
        print(f"\n[incast 16→1 {cc}] {span:.3f} s = {ratio[cc]:.3f} × ideal; drops {drops[cc]}; timeouts "
              f"{int(flows['timeouts'].sum())}; complete {int(flows['complete'].sum())}/16; busiest core "
              f"{row['cpu_busy_max']:.2f}, steal {row['cpu_steal_mean']:.3f}")
    assert all(whole.values()), whole
    assert drops["eqds"] == 0 and ratio["eqds"] <= 1.25
    assert ratio["none"] > ratio["eqds"] and ratio["dcqcn"] > ratio["eqds"]


# ---------------------------------------------------------------- two flows, one bottleneck

CCS = ("dcqcn", "nscc", "swift", "timely", "hpcc", "eqds", "nscc+eqds")
CONVERGED_S = 1.0          # the share is measured from this long after the first flow started …
BOTTLENECK_S = 4.0         # … to the end of the flows (duration flows)


def bottleneck(cc: str) -> dict:
    """h0 and h1 (leaf0) both send to leaf1 over one 20 Mbit/s spine link: the bottleneck is leaf0's uplink.
    Counters every 50 ms: each flow's share after convergence is what leaf1 sent to its receiver."""
    return {"name": f"fair-{cc.replace('+', '-')}", "duration": f"{BOTTLENECK_S:g}s",
            "topology": {"spines": 1, "leaves": 2, "hosts_per_leaf": 2,
                         "host_link": {"rate": "20mbit", "buffer": "64KB"},
                         "fabric_link": {"rate": "20mbit", "buffer": "128KB"}},
            "switch": {"ecn": {"kmin": "10KB", "kmax": "40KB", "pmax": 0.2}},
            "traffic": {"engine": "roce", "pattern": "pairs", "pairs": [["h0", "h2"], ["h1", "h3"]],
                        "receiver": "ooo", "cc": cc},
            "telemetry": {"interval": "50ms"}}


def converged(links, flows) -> tuple[list[float], float, float]:
    """(each flow's rate at its receiver's port in Mbit/s, the bottleneck queue's p99 and mean in bytes) over the
    samples from CONVERGED_S after the first start to the end of the flows."""
    t0 = flows["start_s"].min()
    tx = _tx(links)
    win = tx[(tx["time_s"] >= t0 + CONVERGED_S) & (tx["time_s"] <= t0 + BOTTLENECK_S)]
    rates = []
    for dst in ("h2", "h3"):
        port = win[(win["switch"] == "leaf1") & (win["peer"] == dst)]
        rates.append(port["bytes"].sum() * 8 / port["interval_s"].sum() / 1e6)
    up = win[(win["switch"] == "leaf0") & (win["peer"] == "spine0")]
    return rates, float(up["queue_bytes_max"].quantile(0.99)), float(up["queue_bytes_mean"].mean())


def test_two_flows_share_a_bottleneck_fairly_and_delay_and_int_cc_keep_its_queue_short(tmp_path):
    """Every CC: Jain over the two flows' rates after convergence ≥ 0.95 and the link used; hpcc and swift hold
    the bottleneck's p99 queue (the largest depth a packet met per 50 ms, 99th percentile) well below dcqcn's,
    which marks between 10 and 40 KB. Measured (20 runs, README): see the bounds below."""
    jain, q99, used, echoes = {}, {}, {}, None
    for cc in CCS:                                            # measured first, asserted after: every figure printed
        links, flows, row = _run(tmp_path, cc, bottleneck(cc))
        rates, q99[cc], qmean = converged(links, flows)
        jain[cc] = sum(rates) ** 2 / (2 * sum(r * r for r in rates))
        used[cc] = sum(rates) / (20 * run_had(row))              # frames at the receivers' ports
        if cc == "hpcc":
            echoes = int(min(flows["int_echoes"].min(), flows["int_stacks"].min()))
        print(f"\n[bottleneck {cc}] after {CONVERGED_S:g} s: {[round(float(r), 2) for r in rates]} Mbit/s at the "
              f"receivers, Jain {jain[cc]:.3f}, link used {used[cc]:.3f}; bottleneck queue p99 {q99[cc] / 1e3:.1f} "
              f"KB, mean {qmean / 1e3:.1f} KB; timeouts {flows['timeouts'].tolist()}; busiest core "
              f"{row['cpu_busy_max']:.2f}")
    print(f"\n[bottleneck p99 queue / dcqcn's] " + ", ".join(f"{cc} {q99[cc] / q99['dcqcn']:.2f}" for cc in CCS))
    assert min(jain.values()) >= 0.95, jain
    assert min(used.values()) >= 0.8, used
    assert echoes > 100                                      # hpcc: every flow's ACKs brought INT records back
    assert q99["hpcc"] <= 0.5 * q99["dcqcn"] and q99["swift"] <= 0.7 * q99["dcqcn"], q99


# ---------------------------------------------------------------- seven flows into one host

def test_swift_and_timely_share_a_7_to_1_incast_and_every_flow_completes(tmp_path):
    """scenarios/uec-cc-compare.yaml's incast: h1…h7 → h0, 256 KB each over a 10 Mbit/s host link (ideal 7 × 256 KB
    ÷ 10 Mbit/s = 1.47 s). Swift used to starve 4 of the 7 (RTT samples taken when a sender paced below a packet per
    RTT next woke up, not when the ACK came: windows fell below a packet and stayed there), TIMELY to complete
    0.5 of 7 (a rate cut per NAK and per spurious timeout down to its floor). Measured (20 runs, README): the
    bounds below."""
    ideal = 7 * 256 * 1024 * 8 / 10e6
    jain, ratio, whole = {}, {}, {}
    for cc in ("swift", "timely"):
        _links, flows, row = _run(tmp_path, cc, "uec-cc-compare", f"traffic.cc={cc}")
        g = flows["goodput_mbps"]
        jain[cc] = g.sum() ** 2 / (len(g) * (g ** 2).sum())
        ratio[cc] = (flows["end_s"].max() - flows["start_s"].min()) * run_had(row) / ideal
        whole[cc] = bool(flows["complete"].all() and flows["checksum_ok"].all())
        print(f"\n[incast 7→1 {cc}] {ratio[cc]:.3f} × ideal, Jain {jain[cc]:.3f}, complete "
              f"{int(flows['complete'].sum())}/7, goodput {g.round(2).tolist()} Mbit/s, timeouts "
              f"{flows['timeouts'].tolist()}, drops {row['drops']:.0f}")
    assert all(whole.values()), whole
    assert min(jain.values()) >= 0.9, jain
    assert max(ratio.values()) <= 1.6, ratio


# ---------------------------------------------------------------- one degraded spine link

def degraded(entropy: str) -> dict:
    """leaf1–spine0 at 4 Mbit/s of the four 20 Mbit/s paths; two 2 MB flows leaf0 → leaf1 spray over 64
    entropy values (ECMP switches: the entropy picks the spine), ECN and trimming on."""
    return {"name": f"degraded-{entropy}", "duration": "5s",
            "topology": {"spines": 4, "leaves": 2, "hosts_per_leaf": 2,
                         "host_link": {"rate": "20mbit", "buffer": "32KB"},
                         "fabric_link": {"rate": "20mbit", "buffer": "32KB"},
                         "links": [{"between": ["leaf1", "spine0"], "rate": "4mbit"}]},
            "switch": {"ecn": {"kmin": "8KB", "kmax": "24KB", "pmax": 0.5}, "trim": {"enabled": True}},
            "traffic": {"engine": "roce", "pattern": "pairs", "pairs": [["h0", "h2"], ["h1", "h3"]],
                        "flow_size": "2MB", "receiver": "ooo",
                        "roce": {"entropy": entropy, "entropy_values": 64}}}


def test_path_aware_spraying_steers_off_a_degraded_link_and_finishes_sooner(tmp_path):
    """Measured: oblivious spraying put 685 KB on the slow link and finished in 1.25–1.35 s (≈1000 trims,
    11 timeouts per flow); reps 510 KB, 1.01 s, no trims; bitmap 514–521 KB, 0.98–1.03 s."""
    slow, fct, ok = {}, {}, {}
    for e in ("packet", "reps", "bitmap"):
        links, flows, row = _run(tmp_path, e, degraded(e))
        tx = _tx(links)
        slow[e] = int(tx[(tx["switch"] == "spine0") & (tx["peer"] == "leaf1")]["bytes"].sum())
        fct[e] = flows["fct_s"].max() * run_had(row)
        ok[e] = bool(flows["complete"].all() and flows["checksum_ok"].all() and (flows["entropies_used"] > 1).all())
        print(f"\n[degraded spine, entropy {e}] slow link {slow[e] / 1e3:.0f} KB, FCT max {fct[e]:.3f} s, "
              f"entropies used {flows['entropies_used'].tolist()}, penalties {flows['entropy_penalties'].tolist()}")
    print(f"\n[degraded spine ratios] " + ", ".join(f"{e}: slow {slow[e] / slow['packet']:.3f}, fct "
                                                 f"{fct[e] / fct['packet']:.3f}" for e in ("reps", "bitmap")))
    assert all(ok.values()), ok
    for e in ("reps", "bitmap"):
        assert slow[e] < 0.9 * slow["packet"]
        assert fct[e] < 0.9 * fct["packet"]


# ---------------------------------------------------------------- spraying + trimming + out-of-order delivery

def test_spraying_with_trimming_keeps_the_tail_near_a_lone_flow(tmp_path):
    """scenarios/uec-spray-trim.yaml: leaf0's four hosts send 2 MB each to leaf1's over four 20 Mbit/s spines
    (full load, no oversubscription), oblivious spraying over 256 entropies, 8 KB fabric buffers. uet-htsim
    bounds 2 MB flows at ~1.25 × the lone-flow time. Measured: lone 0.892 s; with trimming the tail 0.958–0.975 s
    (1.07–1.10 ×, 0–1 timeouts per flow, ~500 trims, 0 drops); without, 1.07–1.19 × with 18–38 timeouts per flow
    — the two tails overlap, so what is asserted is the mechanism: trimming turns the drops that time flows out
    into trims that are NAKed at once."""
    _l, lone_flows, lone_row = _run(tmp_path, "lone", "uec-spray-trim", "traffic.pairs=[[h0,h4]]")
    lone = lone_flows["fct_s"][0] * run_had(lone_row)
    tail, timeouts, ok = {}, {}, {}
    for trim in (True, False):
        links, flows, row = _run(tmp_path, f"trim-{trim}", "uec-spray-trim", f"switch.trim.enabled={trim}")
        tail[trim] = flows["fct_s"].max() * run_had(row)
        timeouts[trim] = flows["timeouts"].mean()
        drops = int(_tx(links)["drops"].sum())
        ok[trim] = bool(flows["complete"].all() and flows["checksum_ok"].all()
                        and (not trim or (drops == 0 and flows["trims_seen"].sum() > 0)))
        print(f"\n[spray permutation, trim {trim}] tail {tail[trim]:.3f} s = {tail[trim] / lone:.3f} × "
              f"lone; timeouts {flows['timeouts'].tolist()}; trims {int(_tx(links)['trims'].sum())}, drops {drops}")
    assert all(ok.values()), ok
    assert tail[True] <= 1.25 * lone
    assert timeouts[True] <= 3 and timeouts[False] >= 10, timeouts
