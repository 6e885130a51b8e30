"""The ready scenarios in scenarios/ reproduce what their header says: each runs as shipped (``--set``-style
overrides where the header compares), shorter where it can be, and the direction and rough size of the result
are asserted. Times and rates compared across runs are scaled by the share of the traffic window the hypervisor
left the machine (summary ``cpu_steal_mean``)."""
from __future__ import annotations

import pandas as pd
import pytest

from testbed import runner, scenario

from conftest import ROOT, guarded_run, run_had

pytestmark = pytest.mark.e2e


def _run(tmp_path, name: str, tag: str, *sets: str):
    """Run scenarios/NAME.yaml with ``--set`` overrides; the run's links, flows and summary."""
    d, row = guarded_run(scenario.load(ROOT / "scenarios" / f"{name}.yaml", sets), tmp_path / tag)
    return pd.read_csv(d / "links.csv"), pd.read_csv(d / "flows.csv"), row


def _uplink_bytes(links) -> pd.DataFrame:
    up = links[(links["direction"] == "tx") & (links["role"] == "up")]
    return up.groupby(["switch", "port"])["bytes"].sum().reset_index()


def test_ecmp_collisions_count_flows_per_uplink(tmp_path):
    """Uplinks 5× the hosts: each uplink's bytes are a whole number of flows (within 15 % of one), 4 per leaf,
    and uplink_imbalance is the busiest uplink's count per leaf, averaged by bytes. Over seeds 1–2 ECMP
    collides (mean > 1.2; balls in bins: 2.125); spraying spreads every flow evenly (< 1.05)."""
    imbalances = []
    for seed in (1, 2):
        links, flows, row = _run(tmp_path, "ecmp-collisions", f"ecmp-{seed}", f"seed={seed}")
        per_flow = flows["bytes"].mean()
        up = _uplink_bytes(links)
        up["flows"] = up["bytes"] / per_flow
        assert ((up["flows"] - up["flows"].round()).abs() < 0.15).all(), up
        maxima = []
        for leaf, g in up.groupby("switch"):
            assert round(g["flows"].sum()) == 4, g
            maxima.append(g["flows"].round().max())
        print(f"\n[ecmp-collisions seed {seed}] flows per uplink {up['flows'].round(2).tolist()}, "
              f"uplink_imbalance {row['uplink_imbalance']:.3f}")
        assert row["uplink_imbalance"] == pytest.approx(sum(maxima) / len(maxima), abs=0.15)
        imbalances.append(row["uplink_imbalance"])
    assert sum(imbalances) / len(imbalances) > 1.2
    _l, _f, spray = _run(tmp_path, "ecmp-collisions", "spray", "switch.load_balancing=spray")
    assert spray["uplink_imbalance"] < 1.05


def test_spraying_lifts_permutation_utilisation_above_90_percent(tmp_path):
    """The permutation of spray-utilisation: spraying ≥ 90 % mean uplink utilisation (of the time the
    hypervisor left), ECMP's collisions at least 5 points lower."""
    util = {}
    for mode in ("ecmp", "spray"):
        _l, _f, row = _run(tmp_path, "spray-utilisation", mode, f"switch.load_balancing={mode}")
        util[mode] = row["mean_uplink_util"] / run_had(row)
        print(f"\n[spray-utilisation {mode}] mean uplink util {row['mean_uplink_util']:.3f} (steal "
              f"{row['cpu_steal_mean']:.3f}), imbalance {row['uplink_imbalance']:.3f}")
    assert util["spray"] >= 0.9
    assert util["ecmp"] <= util["spray"] - 0.05


def test_pfc_makes_the_incast_lossless(tmp_path):
    """incast-pfc (8 → 1 at 40 Mbit/s): without PFC the receiver's leaf tail-drops and nothing pauses; with PFC
    nothing is dropped, pause frames pause the senders' ports for seconds in all, and the receiver gets as much
    (goodput, of the time the hypervisor left, ≥ 0.9 × without). Measured over 10 runs: without PFC 66–70k drops;
    with, 0 drops, 1,994–2,188 pause frames, 7.5–7.6 s paused, goodput 1.01–1.05 × (with the 48 KB headroom the
    file had before: 2 and 4 drops in 2 of 8 runs)."""
    got = {}
    for pfc in (False, True):
        _l, _f, row = _run(tmp_path, "incast-pfc", f"pfc-{pfc}", f"switch.pfc.enabled={pfc}")
        got[pfc] = row
        print(f"\n[incast-pfc pfc {pfc}] drops {row['drops']}, pause frames {row['pause_frames']}, paused "
              f"{row['paused_s_total']:.2f} s, goodput {row['goodput_mbps']:.1f} Mbit/s (steal "
              f"{row['cpu_steal_mean']:.3f})")
    assert got[False]["drops"] > 40_000 and got[False]["pause_frames"] == 0
    assert got[True]["drops"] == 0 and got[True]["pause_frames"] > 1000 and got[True]["paused_s_total"] > 5.0
    assert got[True]["goodput_mbps"] / run_had(got[True]) >= 0.9 * got[False]["goodput_mbps"] / run_had(got[False])


def test_pfc_throttles_the_head_of_line_victim(tmp_path):
    """pfc-hol-victim: without PFC the victim (h5 → h1) gets its host link; with PFC ≤ 0.75 of that, and
    nothing is dropped (measured in the credit tests: 38.9 → 13.0 Mbit/s)."""
    got = {}
    for pfc in (False, True):
        _l, flows, row = _run(tmp_path, "pfc-hol-victim", f"pfc-{pfc}", f"switch.pfc.enabled={pfc}",
                                f"hosts.pfc={pfc}")
        victim = flows[flows["src"] == "h5"].iloc[0]
        got[pfc] = (victim["goodput_mbps"] / run_had(row), row)
        print(f"\n[pfc-hol-victim pfc {pfc}] victim {victim['goodput_mbps']:.1f} Mbit/s, drops {row['drops']}, "
              f"pauses {row['pause_frames']}")
    assert got[False][0] >= 0.85 * 40 * 1480 / 1514
    assert got[True][0] <= 0.75 * got[False][0]
    assert got[True][1]["drops"] == 0 and got[True][1]["pause_frames"] > 0


def test_spraying_needs_the_reordering_tolerant_receiver(tmp_path):
    """spray-reordering: go-back-N resends a large share of the message (≥ 20 %), the ooo receiver < 2 %, and
    at least 10× fewer. Packet counts of the receivers' logic, not rates: plain runs, whatever the guard says (the
    400 Mbit/s sender keeps a core busy by design; at 40 or 100 Mbit/s go-back-N does not finish in 10 s)."""
    got = {}
    for receiver in ("gbn", "ooo"):
        d, _r = runner.run(scenario.load(ROOT / "scenarios" / "spray-reordering.yaml",
                                         [f"traffic.receiver={receiver}"]), tmp_path / receiver)
        flows = pd.read_csv(d / "flows.csv")
        (fl,) = flows.itertuples()
        if receiver == "ooo":
            assert fl.checksum_ok and fl.complete
        else:       # go-back-N may not finish beside the FTB_STRESS hog (hog pass N: 3.75 of 4 MB); never wrong
            assert fl.checksum_ok == True or not fl.complete, fl      # noqa: E712 (numpy bool, NaN)
        got[receiver] = int(fl.retrans)
        print(f"\n[spray-reordering {receiver}] retrans {fl.retrans}, reordered {fl.reordered}, naks {fl.naks}")
    n_pk = (4 << 20) // 1024
    assert got["gbn"] > 0.2 * n_pk and got["ooo"] < 0.02 * n_pk
    assert got["gbn"] > 10 * max(1, got["ooo"])


def test_dcqcn_shares_the_bottleneck_fairly(tmp_path):
    """dcqcn-fairness: Jain's index over the two flows' goodput ≥ 0.95 with DCQCN (measured 0.999–1.000), and
    the link stays used."""
    _l, flows, row = _run(tmp_path, "dcqcn-fairness", "dcqcn")
    g = flows["goodput_mbps"]
    jain = g.sum() ** 2 / (len(g) * (g ** 2).sum())
    print(f"\n[dcqcn-fairness] goodput {g.round(2).tolist()}, Jain {jain:.3f}")
    assert jain >= 0.95
    assert g.sum() >= 0.8 * 20 * 1024 / 1090 * run_had(row)


def test_more_qps_per_connection_shorten_the_ring_allreduce(tmp_path):
    """qp-scaling: 4 QPs per connection finish the ring all-reduce sooner than 1 (the hash spreads 8 QPs per leaf
    instead of 2 flows); with one fixed source port the 4 QPs of a leaf share one uplink (imbalance ≈ 2) unless
    the switches hash the RoCE destination QP. JCT: the mean over the job's 3 iterations. Run at time_dilation 4:
    beside the FTB_STRESS hog, 16 Python QPs starved the shapers (guard-flagged) in 2 of 4 runs undilated and in
    2–3 of 3 tries at 2 and 3; at 4, 1 flagged try in 5 runs."""
    runs = {"1qp": (), "4qp": ("traffic.qps_per_connection=4",),
            "4qp-fixed": ("traffic.qps_per_connection=4", "traffic.sport=49152"),
            "4qp-fixed-qphash": ("traffic.qps_per_connection=4", "traffic.sport=49152",
                                 "switch.hash_fields=[src_ip,dst_ip,sport,dport,proto,roce_qp]")}
    jct, imb = {}, {}
    for name, sets in runs.items():
        d, row = guarded_run(scenario.load(ROOT / "scenarios" / "qp-scaling.yaml", ("time_dilation=4",) + sets),
                             tmp_path / name)
        ops, fl = pd.read_csv(d / "collectives.csv"), pd.read_csv(d / "flows.csv")
        # rto auto: no spurious timeout. Retransmits are not asserted 0: about one run in ten a packet of some
        # QP arrives out of order (veth hands frames to per-CPU backlogs; docs/architecture.md §4, Links and timing) and
        # go-back-N resends the rest of that transfer (12–57 packets of 2,304 seen)
        assert len(ops) == 3 and ops["jct_ms"].notna().all() and fl["timeouts"].sum() == 0
        assert row["retransmits"] <= 0.05 * fl["packets_sent"].sum()
        jct[name], imb[name] = ops["jct_ms"].mean() * run_had(row), row["uplink_imbalance"]
    print(f"\n[qp-scaling] JCT ms {({k: round(v) for k, v in jct.items()})}, uplink imbalance "
          f"{({k: round(v, 3) for k, v in imb.items()})}")
    assert jct["4qp"] < 0.9 * jct["1qp"]
    assert imb["4qp-fixed"] > 1.9 and jct["4qp-fixed"] > 1.2 * jct["4qp"]
    assert jct["4qp-fixed-qphash"] < 0.85 * jct["4qp-fixed"] and imb["4qp-fixed-qphash"] < 1.5


def test_spraying_shortens_the_pairwise_all_to_all_on_two_rails(tmp_path):
    """alltoall-multirail: the two pairwise all-to-all bursts (15 steps of 4 elephants per leaf and rail on 4
    uplinks) finish sooner sprayed than hashed — summed JCT ratio 0.70–0.75 over 4 runs here (0.69–0.71 at 0.5 and 2 Mbit/s), ECMP
    uplink imbalance 1.19 against ≤ 1.10 sprayed. Every transfer completes in both. (The runs are flagged
    cpu_bound on a 2-core machine — 16 Python agents — and the ratio held regardless.)"""
    jct, imb = {}, {}
    for lb in ("ecmp", "spray"):
        d, row = guarded_run(scenario.load(ROOT / "scenarios" / "alltoall-multirail.yaml",
                                           [f"switch.load_balancing={lb}"]), tmp_path / lb)
        ops = pd.read_csv(d / "collectives.csv")
        assert len(ops) == 3 and ops["jct_ms"].notna().all(), ops
        a2a = ops[ops["job"] == "a2a"]
        jct[lb], imb[lb] = a2a["jct_ms"].sum() * run_had(row), row["uplink_imbalance"]
    ratio = jct["spray"] / jct["ecmp"]
    print(f"\n[alltoall-multirail] all-to-all JCT ms {({k: round(v) for k, v in jct.items()})}, ratio {ratio:.2f}, "
          f"uplink imbalance {({k: round(v, 2) for k, v in imb.items()})}")
    assert ratio < 0.8
    assert imb["ecmp"] > 1.15 and imb["spray"] < 1.12
