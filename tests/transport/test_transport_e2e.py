"""Reference checks of the RoCE engine's extended transport and congestion control on real fabrics,
scaled from published simulator validations to this machine's rates (20 Mbit/s hosts). Each runs through
``runner.run`` and reads the files it wrote. The bounds are those measured over repeated runs on the 2-core VM
(20 runs: the table in docs/transport.md, "Ultra-Ethernet-style transport"). Times are wall-clock, not scaled by the
hypervisor's steal (conftest ``run_had``): eqds's 16 → 1 incast read 1.038–1.067 × ideal whatever the steal in
its traffic window (0–16 %), and scaled by 1 − steal 0.90 × — faster than its link allows."""
from __future__ import annotations

import pandas as pd
import pytest

from testbed import runner, scenario

from conftest import ROOT
import cpu_guard
from retx_check import assert_few_spurious

pytestmark = pytest.mark.e2e


def _run(tmp_path, name: str, doc: dict | str, *sets: str):
    """Run a scenario document, or scenarios/DOC.yaml with ``--set`` overrides; its links, flows and summary
    (a second run of the same name gets a directory of its own)."""
    scen = scenario.load(ROOT / "scenarios" / f"{doc}.yaml", sets) if isinstance(doc, str) else scenario.from_dict(doc)
    out = tmp_path / name
    while out.exists():
        out = out.with_name(out.name + "+")
    d, row = runner.run(scen, out)
    return pd.read_csv(d / "links.csv"), pd.read_csv(d / "flows.csv"), row


def _tx(links):
    return links[links["direction"] == "tx"]


# ---------------------------------------------------------------- incast 16 → 1

def test_eqds_bounds_a_16_to_1_incast_near_the_ideal_time(tmp_path):
    """scenarios/uec-incast.yaml. uet-htsim bounds a 15:1 incast at ~94 % of ideal with receiver credit. Ideal:
    the 4 MB ÷ 20 Mbit/s = 1.678 s (payload only). A 2 KB IB MTU (2,200-byte frames, as RoCE fabrics run jumbo
    frames): headers are 3 % of the wire, not 6.4 % as with 1,024-byte payloads, which alone would leave 1.064 ×
    ideal as the best possible. RTO floor 50 ms: with the default 10 ms, a CI run with a core saturated timed out
    11 times without a single drop (ACKs late, not lost). Bounds: docs/transport.md's 20-run table. The lossless
    eqds run resends ≤ 1 % of its packets in vain (spurious_retransmits; measured 0), asserted on a run the CPU
    guard did not flag."""
    ideal = 16 * 256 * 1024 * 8 / 20e6
    ratio, drops, whole = {}, {}, {}
    for cc in ("eqds", "none", "dcqcn"):                      # measured first, asserted after: every figure printed
        def run(cc=cc):
            return _run(tmp_path, cc, "uec-incast", f"traffic.cc={cc}")
        links, flows, row = (cpu_guard.valid(lambda _k: run(), f"incast 16→1 {cc}", row_of=lambda got: got[2])
                             if cc == "eqds" else run())
        if cc == "eqds":
            eqds = (flows, row)
        ratio[cc] = (flows["end_s"].max() - flows["start_s"].min()) / ideal
        drops[cc] = int(_tx(links)["drops"].sum())
        whole[cc] = bool(flows["complete"].all() and flows["checksum_ok"].all())
        print(f"\n[incast 16→1 {cc}] {ratio[cc]:.3f} × ideal; drops {drops[cc]}; timeouts "
              f"{int(flows['timeouts'].sum())}; complete {int(flows['complete'].sum())}/16; busiest core "
              f"{row['cpu_busy_max']:.2f}, steal {row['cpu_steal_mean']:.3f}")
    print(f"\n[incast 16→1 / eqds] none {ratio['none'] / ratio['eqds']:.3f}, dcqcn {ratio['dcqcn'] / ratio['eqds']:.3f}")
    assert all(whole.values()), whole
    assert drops["eqds"] == 0 and ratio["eqds"] <= 1.15, ratio
    assert_few_spurious(*eqds, "incast 16→1 eqds")
    assert ratio["none"] >= 1.03 * ratio["eqds"] and ratio["dcqcn"] >= 1.6 * ratio["eqds"], ratio


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
    """Every CC: Jain over the two flows' rates after convergence ≥ 0.95 (the bound; asserted at the
    margin measured) and the link used; hpcc and swift hold the bottleneck's p99 queue (the largest depth a packet
    met per 50 ms, 99th percentile) below dcqcn's, which marks between 10 and 40 KB. Bounds: docs/transport.md's 20-run
    table."""
    jain, q99, used, echoes = {}, {}, {}, None
    for cc in CCS:                                            # measured first, asserted after: every figure printed
        links, flows, row = _run(tmp_path, cc, bottleneck(cc))
        rates, q99[cc], qmean = converged(links, flows)
        jain[cc] = sum(rates) ** 2 / (2 * sum(r * r for r in rates))
        used[cc] = sum(rates) / 20                              # frames at the receivers' ports
        if cc == "hpcc":
            echoes = int(min(flows["int_echoes"].min(), flows["int_stacks"].min()))
        print(f"\n[bottleneck {cc}] after {CONVERGED_S:g} s: {[round(float(r), 2) for r in rates]} Mbit/s at the "
              f"receivers, Jain {jain[cc]:.3f}, link used {used[cc]:.3f}; bottleneck queue p99 {q99[cc] / 1e3:.1f} "
              f"KB, mean {qmean / 1e3:.1f} KB; timeouts {flows['timeouts'].tolist()}; busiest core "
              f"{row['cpu_busy_max']:.2f}, steal {row['cpu_steal_mean']:.3f}")
    print(f"\n[bottleneck p99 queue / dcqcn's] " + ", ".join(f"{cc} {q99[cc] / q99['dcqcn']:.2f}" for cc in CCS))
    assert min(jain.values()) >= 0.95, jain                   # dcqcn 0.951 once in 20 runs, the others ≥ 0.995
    assert min(used.values()) >= 0.7, used
    assert echoes > 100                                      # hpcc: every flow's ACKs brought INT records back
    # swift 0.42–0.63 × dcqcn's over 20 quiet runs, 0.76 once beside the FTB_STRESS hog (its pacing wakes late)
    assert q99["hpcc"] <= 0.4 * q99["dcqcn"] and q99["swift"] <= 0.8 * q99["dcqcn"], q99


# ---------------------------------------------------------------- seven flows into one host

def test_swift_and_timely_share_a_7_to_1_incast_and_every_flow_completes(tmp_path):
    """scenarios/uec-cc-compare.yaml's incast: h1…h7 → h0, 256 KB each over a 10 Mbit/s host link (ideal 7 × 256 KB
    ÷ 10 Mbit/s = 1.47 s). Swift used to starve 4 of the 7 (RTT samples taken when a sender paced below a packet per
    RTT next woke up, not when the ACK came: windows fell below a packet and stayed there), TIMELY to complete
    0.5 of 7 (a rate cut per NAK and per spurious timeout down to its floor). Bounds: docs/transport.md's 20-run table
(timely's tail: a timeout or two after its drops);
    swift's Jain fell to 0.948 once in 29 runs (a CI rehearsal: one flow of 7 at 2.55 Mbit/s, the others
    1.35–1.82), hence 0.94 here — the 0.95 bound is for two flows on one bottleneck, asserted above. hpcc and nscc
    run the same incast for its last check: every run without a drop resends ≤ 1 % of its packets in vain
    (spurious_retransmits; measured 0 for all four with rto auto, 0.4–2.8 % with the old fixed 10 ms), each
    asserted on a run the CPU guard did not flag."""
    ideal = 7 * 256 * 1024 * 8 / 10e6
    jain, ratio, whole, lossless = {}, {}, {}, {}
    for cc in ("swift", "timely", "hpcc", "nscc"):
        _links, flows, row = cpu_guard.valid(lambda _k, cc=cc: _run(tmp_path, cc, "uec-cc-compare", f"traffic.cc={cc}"),
                                             f"incast 7→1 {cc}", row_of=lambda got: got[2])
        whole[cc] = bool(flows["complete"].all() and flows["checksum_ok"].all())
        if row["drops"] == 0:
            lossless[cc] = (flows, row)
        if cc not in ("swift", "timely"):
            print(f"\n[incast 7→1 {cc}] complete {int(flows['complete'].sum())}/7, timeouts "
                  f"{flows['timeouts'].tolist()}, drops {row['drops']:.0f}")
            continue
        g = flows["goodput_mbps"]
        jain[cc] = g.sum() ** 2 / (len(g) * (g ** 2).sum())
        ratio[cc] = (flows["end_s"].max() - flows["start_s"].min()) / ideal
        whole[cc] = bool(flows["complete"].all() and flows["checksum_ok"].all())
        print(f"\n[incast 7→1 {cc}] {ratio[cc]:.3f} × ideal, Jain {jain[cc]:.3f}, complete "
              f"{int(flows['complete'].sum())}/7, goodput {g.round(2).tolist()} Mbit/s, timeouts "
              f"{flows['timeouts'].tolist()}, drops {row['drops']:.0f}, steal {row['cpu_steal_mean']:.3f}")
    assert all(whole.values()), whole
    assert min(jain.values()) >= 0.94, jain
    assert {"swift", "hpcc", "nscc"} <= set(lossless), sorted(lossless)   # timely: a few drops some runs
    for cc, (flows, row) in lossless.items():
        assert_few_spurious(flows, row, f"incast 7→1 {cc}")
    # swift 1.04–1.08 × ideal over 29 runs alone; beside the FTB_STRESS hog 1.03–1.16 over 9 valid runs (once in 9
    # one sender of 7 ended at 1.23 Mbit/s while another took 2.08: a straggler the guard does not see). timely
    # 1.13–1.19 (its drops); 1.33 once beside the hog, two of its flows timing out after 264 drops (each waits one
    # RTO, ~0.2 s here)
    assert ratio["swift"] <= 1.2 and ratio["timely"] <= 1.4, ratio


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
    """reps and bitmap put measurably less on the slow link than oblivious spraying and finish sooner (bounds:
    docs/transport.md's 20-run table). Oblivious spraying pays for the slow link in trims and timeouts; reps
    recycles the entropies that came back unmarked, bitmap skips the penalised ones."""
    slow, fct, ok = {}, {}, {}
    for e in ("packet", "reps", "bitmap"):
        links, flows, row = _run(tmp_path, e, degraded(e))
        tx = _tx(links)
        slow[e] = int(tx[(tx["switch"] == "spine0") & (tx["peer"] == "leaf1")]["bytes"].sum())
        fct[e] = flows["fct_s"].max()
        ok[e] = bool(flows["complete"].all() and flows["checksum_ok"].all() and (flows["entropies_used"] > 1).all())
        print(f"\n[degraded spine, entropy {e}] slow link {slow[e] / 1e3:.0f} KB, FCT max {fct[e]:.3f} s, "
              f"entropies used {flows['entropies_used'].tolist()}, penalties {flows['entropy_penalties'].tolist()}, "
              f"steal {row['cpu_steal_mean']:.3f}")
    print(f"\n[degraded spine ratios] " + ", ".join(f"{e}: slow {slow[e] / slow['packet']:.3f}, fct "
                                                 f"{fct[e] / fct['packet']:.3f}" for e in ("reps", "bitmap")))
    assert all(ok.values()), ok
    # bitmap: 0.68–0.88 over 20 runs on a quiet machine; 0.909 on a valid run beside the CPU hog (FTB_STRESS=1),
    # where oblivious spraying put less on the slow link (581 KB, below its quiet 616–785) and bitmap as much
    assert slow["reps"] <= 0.85 * slow["packet"] and slow["bitmap"] <= 0.93 * slow["packet"], slow
    assert fct["reps"] <= 0.9 * fct["packet"] and fct["bitmap"] < fct["packet"], fct


# ---------------------------------------------------------------- spraying + trimming + out-of-order delivery

def test_spraying_with_trimming_keeps_the_tail_near_a_lone_flow(tmp_path):
    """scenarios/uec-spray-trim.yaml: leaf0's four hosts send 2 MB each to leaf1's over four 20 Mbit/s spines
    (full load, no oversubscription), oblivious spraying over 256 entropies, 8 KB fabric buffers. uet-htsim
    bounds 2 MB flows at ~1.25 × the lone-flow time. Without trimming the tail is longer on average but the two
    ranges overlap (docs/transport.md, 20 runs), so what is asserted beside the bound is the mechanism: trimming turns
    the drops into trims that are NAKed at once: no drop and at most one timeout per flow with it, drops without.
    The timeouts without trimming are no longer asserted: with rto auto (its floor 20 ms here, the path's queueing)
    9–15 per flow over 4 runs (0.5–6 with a 39 ms floor), against 24.5–34 with the old fixed 10 ms."""
    _l, lone_flows, lone_row = _run(tmp_path, "lone", "uec-spray-trim", "traffic.pairs=[[h0,h4]]")
    lone = lone_flows["fct_s"][0]
    tail, timeouts, ok = {}, {}, {}
    for trim in (True, False):
        links, flows, row = _run(tmp_path, f"trim-{trim}", "uec-spray-trim", f"switch.trim.enabled={trim}")
        tail[trim] = flows["fct_s"].max()
        timeouts[trim] = flows["timeouts"].mean()
        drops = int(_tx(links)["drops"].sum())
        ok[trim] = bool(flows["complete"].all() and flows["checksum_ok"].all()
                        and (drops == 0 and flows["trims_seen"].sum() > 0 if trim else drops > 0))
        print(f"\n[spray permutation, trim {trim}] tail {tail[trim]:.3f} s = {tail[trim] / lone:.3f} × "
              f"lone ({lone:.3f} s, steal {lone_row['cpu_steal_mean']:.3f}); timeouts {flows['timeouts'].tolist()}; "
              f"trims {int(_tx(links)['trims'].sum())}, drops {drops}, steal {row['cpu_steal_mean']:.3f}")
    assert all(ok.values()), ok
    assert tail[True] <= 1.2 * lone, (tail, lone)
    assert timeouts[True] <= 1, timeouts
