"""Unit tests for testbed.report with synthetic run data (no kernel, no root)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from testbed import report as rp

pytestmark = pytest.mark.plots

RATE = 100_000_000  # 100 Mbit/s
IV = 0.5            # telemetry interval (s)


def make_links(up_bytes: dict[tuple[str, str], list[int]], *, extra: dict | None = None) -> list[dict]:
    """Link samples: leaf uplinks (tx with the given bytes per sample, rx 0), one host port each, spine ports."""
    rows = []
    n = len(next(iter(up_bytes.values())))
    for i in range(n):
        t = (i + 1) * IV
        for (leaf, spine), series in up_bytes.items():
            for direction, b in (("tx", series[i]), ("rx", 0)):
                r = dict(time_s=t, switch=leaf, port=spine, peer=spine, direction=direction, role="up",
                         rate_bps=RATE, bytes=b, packets=b // 1000, interval_s=IV)
                if extra:
                    r.update(extra)
                rows.append(r)
            rows.append(dict(time_s=t, switch=spine, port=leaf, peer=leaf, direction="tx", role="spine",
                             rate_bps=RATE, bytes=series[i], packets=series[i] // 1000, interval_s=IV))
        for leaf in sorted({lf for lf, _ in up_bytes}):
            rows.append(dict(time_s=t, switch=leaf, port="h9", peer="h9", direction="tx", role="down",
                             rate_bps=RATE, bytes=1234, packets=1, interval_s=IV))
    return rows


def make_flows(fcts: list[float | None]) -> list[dict]:
    out = []
    for i, f in enumerate(fcts):
        out.append(dict(flow_id=i, src=f"h{i}", dst=f"h{i + 4}", sport=49152 + i, dport=4791, proto="udp",
                        bytes=1_000_000, start_s=0.1, end_s=None if f is None else 0.1 + f, fct_s=f,
                        goodput_mbps=None if f is None else 8.0 / f, paths_used=1,
                        lost=i % 2, src_leaf="leaf0"))
    return out


META = dict(run_id="r1", scenario="ecmp-a2a", load_balancing="ecmp", seed=7, duration_s=2.0, offered_mbps=400.0)
CPU = dict(cpu_bound=False, cpu_busy_max=0.42, cpu_busy_mean=0.21)
MANIFEST = dict(scenario={"name": "ecmp-a2a", "topology": {"leaves": 2}}, seed=7, kernel="6.18",
                versions={"testbed": "0.1.0"}, start="2025-01-01T00:00:00Z")

EVEN = {("leaf0", "spine0"): [1000, 1000, 1000, 1000], ("leaf0", "spine1"): [1000, 1000, 1000, 1000],
        ("leaf1", "spine0"): [0, 0, 0, 0], ("leaf1", "spine1"): [0, 0, 0, 0]}
UNEVEN = {("leaf0", "spine0"): [3_000_000, 3_000_000, 3_000_000, 3_000_000],
          ("leaf0", "spine1"): [1_000_000, 1_000_000, 1_000_000, 1_000_000],
          ("leaf1", "spine0"): [0, 0, 0, 0], ("leaf1", "spine1"): [2_000_000, 2_000_000, 2_000_000, 2_000_000]}


def same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True


# --- columns and order ----------------------------------------------------------------------------------

def test_links_columns_order_and_extras(tmp_path):
    links = make_links(EVEN, extra={"queue_bytes_max": 5, "ecn_marks": 0})
    rp.write_run(tmp_path, MANIFEST, links, make_flows([0.01]), CPU, META)
    df = pd.read_csv(tmp_path / "links.csv")
    assert list(df.columns[:7]) == ["time_s", "switch", "port", "peer", "bytes", "packets", "util"]
    assert {"direction", "role", "rate_bps", "interval_s", "queue_bytes_max", "ecn_marks"} <= set(df.columns[7:])
    assert len(df) == len(links)


def test_flows_columns_order_and_extras(tmp_path):
    rp.write_run(tmp_path, MANIFEST, make_links(EVEN), make_flows([0.01, None]), CPU, META)
    df = pd.read_csv(tmp_path / "flows.csv")
    assert list(df.columns[:12]) == rp.FLOW_COLUMNS
    assert list(df.columns[12:]) == ["lost", "src_leaf"]
    assert df["fct_s"].isna().tolist() == [False, True]


def test_summary_columns_order(tmp_path):
    row = rp.write_run(tmp_path, MANIFEST, make_links(EVEN), make_flows([0.01]), CPU, META)
    df = pd.read_csv(tmp_path / "summary.csv")
    assert len(df) == 1
    assert list(df.columns[:13]) == rp.SUMMARY_COLUMNS
    assert list(df.columns[13:13 + len(rp.SUMMARY_EXTRA_COLUMNS)]) == rp.SUMMARY_EXTRA_COLUMNS
    assert list(row)[:13] == rp.SUMMARY_COLUMNS
    assert row["cpu_bound"] is False and row["cpu_busy_mean"] == 0.21 and row["cpu_busy_max"] == 0.42
    assert df["cpu_bound"].iloc[0] == False  # noqa: E712  (read back as a boolean)


def test_manifest_as_is_plus_files(tmp_path):
    rp.write_run(tmp_path, MANIFEST, make_links(UNEVEN), make_flows([0.01, 0.02]), CPU, META)
    m = json.loads((tmp_path / "manifest.json").read_text())
    for k, v in MANIFEST.items():
        assert m[k] == v
    assert set(m["files"]) == {"manifest.json", "links.csv", "flows.csv", "summary.csv", "uplink_util.png",
                               "uplink_bytes.png", "fct_cdf.png"}
    for f in m["files"]:
        assert (tmp_path / f).is_file()


def test_manifest_nan_and_odd_types_are_plain_json(tmp_path):
    man = dict(MANIFEST, nan=float("nan"), path=Path("/x"), np=np.int64(3))
    rp.write_run(tmp_path, man, make_links(EVEN), make_flows([0.01]), CPU, META)
    m = json.loads((tmp_path / "manifest.json").read_text())  # strict JSON: would fail on NaN
    assert m["nan"] is None and m["path"] == "/x" and m["np"] == 3


# --- util and summary definitions ------------------------------------------------------------------------

def test_util_computation():
    df = rp.links_frame([dict(time_s=1.0, switch="leaf0", port="spine0", peer="spine0", direction="tx",
                              role="up", rate_bps=100_000_000, bytes=6_250_000, packets=5000, interval_s=1.0),
                         dict(time_s=1.0, switch="leaf0", port="spine1", peer="spine1", direction="tx",
                              role="up", rate_bps=100_000_000, bytes=625_000, packets=500, interval_s=0.1),
                         dict(time_s=1.0, switch="leaf0", port="spine2", peer="spine2", direction="tx",
                              role="up", rate_bps=0, bytes=0, packets=0, interval_s=0.1)])
    assert df["util"].iloc[0] == pytest.approx(0.5)
    assert df["util"].iloc[1] == pytest.approx(0.5)
    assert math.isnan(df["util"].iloc[2])  # no rate → undefined, not inf


def test_imbalance_even_is_one():
    row = rp.summarize(rp.links_frame(make_links(EVEN)), rp.flows_frame(make_flows([0.01])), CPU, META)
    # leaf0 is the only source leaf: its two uplinks count, leaf1's do not
    assert row["uplink_imbalance"] == pytest.approx(1.0)
    assert row["uplinks"] == 2
    # the traffic window is the flow's 0.1 … 0.11 s: only the first sample (0 … 0.5 s) overlaps it
    assert row["traffic_window_s"] == pytest.approx(0.01)
    assert row["mean_uplink_util"] == pytest.approx(1000 * 8 / (0.01 * RATE))
    assert row["max_uplink_util"] == pytest.approx(row["mean_uplink_util"])


def _flows(*specs) -> list[dict]:
    """(src_leaf, dst_leaf, start_s, end_s) per flow."""
    return [dict(flow_id=i, src=f"h{i}", dst=f"h{i + 8}", sport=1000 + i, dport=5001, proto="udp", bytes=1000,
                 start_s=st, end_s=en, fct_s=en - st, goodput_mbps=1.0, paths_used=1, src_leaf=sl, dst_leaf=dl)
            for i, (sl, dl, st, en) in enumerate(specs)]


def _uplink_rows(per_uplink: dict[tuple[str, str], list[int]], iv: float = IV) -> list[dict]:
    rows = []
    n = len(next(iter(per_uplink.values())))
    for i in range(n):
        for (leaf, spine), series in per_uplink.items():
            rows.append(dict(time_s=(i + 1) * iv, switch=leaf, port=spine, peer=spine, direction="tx", role="up",
                             rate_bps=RATE, bytes=series[i], packets=series[i] // 1000, interval_s=iv))
    return rows


def test_one_way_spray_over_four_uplinks_is_one():
    """One flow h0→h4 sprayed evenly over leaf0's 4 uplinks; leaf1's uplinks carry a few bytes (ACKs)."""
    up = {("leaf0", f"spine{s}"): [1_000_000] * 4 for s in range(4)}
    up.update({("leaf1", f"spine{s}"): [600 if s == 0 else 0] * 4 for s in range(4)})
    row = rp.summarize(rp.links_frame(_uplink_rows(up)), rp.flows_frame(_flows(("leaf0", "leaf1", 0.0, 2.0))),
                       CPU, META)
    assert row["uplink_imbalance"] == pytest.approx(1.0)      # the pooled definition said 2.0
    assert row["uplink_imbalance_max"] == pytest.approx(1.0)
    assert row["uplinks"] == 4


def test_ecmp_collision_from_one_leaf():
    """4 one-way ECMP flows from leaf0 land 2, 1, 1, 0 on its uplinks: busiest/mean = 2/1 = 2.0 (pooled with
    leaf1's idle uplinks it read 4.0)."""
    up = {("leaf0", "spine0"): [2_000_000] * 4, ("leaf0", "spine1"): [1_000_000] * 4,
          ("leaf0", "spine2"): [1_000_000] * 4, ("leaf0", "spine3"): [0] * 4}
    up.update({("leaf1", f"spine{s}"): [0] * 4 for s in range(4)})
    flows = _flows(*[("leaf0", "leaf1", 0.0, 2.0)] * 4)
    row = rp.summarize(rp.links_frame(_uplink_rows(up)), rp.flows_frame(flows), CPU, META)
    assert row["uplink_imbalance"] == pytest.approx(2.0)
    assert row["uplinks"] == 4


def test_incast_leaves_sending_different_amounts_are_not_imbalanced():
    """leaf1 sends 3× what leaf2 sends into leaf0, each spread evenly over its 2 uplinks: imbalance 1.0."""
    up = {("leaf1", "spine0"): [3_000_000] * 4, ("leaf1", "spine1"): [3_000_000] * 4,
          ("leaf2", "spine0"): [1_000_000] * 4, ("leaf2", "spine1"): [1_000_000] * 4,
          ("leaf0", "spine0"): [0] * 4, ("leaf0", "spine1"): [0] * 4}
    flows = _flows(("leaf1", "leaf0", 0.0, 2.0), ("leaf1", "leaf0", 0.0, 2.0), ("leaf2", "leaf0", 0.0, 2.0))
    row = rp.summarize(rp.links_frame(_uplink_rows(up)), rp.flows_frame(flows), CPU, META)
    assert row["uplink_imbalance"] == pytest.approx(1.0)      # pooled: 3/2 = 1.5
    assert row["uplinks"] == 4


def test_imbalance_is_weighted_by_each_leafs_bytes():
    """leaf0: 4 MB as 2+2+0+0 (2.0); leaf1: 12 MB even (1.0): (2.0×4 + 1.0×12) / 16 = 1.25; worst leaf 2.0."""
    up = {("leaf0", "spine0"): [500_000] * 4, ("leaf0", "spine1"): [500_000] * 4,
          ("leaf0", "spine2"): [0] * 4, ("leaf0", "spine3"): [0] * 4}
    up.update({("leaf1", f"spine{s}"): [750_000] * 4 for s in range(4)})
    flows = _flows(("leaf0", "leaf1", 0.0, 2.0), ("leaf1", "leaf0", 0.0, 2.0))
    row = rp.summarize(rp.links_frame(_uplink_rows(up)), rp.flows_frame(flows), CPU, META)
    assert row["uplink_imbalance"] == pytest.approx(1.25)
    assert row["uplink_imbalance_max"] == pytest.approx(2.0)


def test_same_leaf_flows_make_no_source_leaf():
    up = {("leaf0", "spine0"): [0] * 4, ("leaf0", "spine1"): [0] * 4}
    row = rp.summarize(rp.links_frame(_uplink_rows(up)), rp.flows_frame(_flows(("leaf0", "leaf0", 0.0, 1.0))),
                       CPU, META)
    assert row["uplinks"] == 0 and math.isnan(row["uplink_imbalance"]) and math.isnan(row["mean_uplink_util"])


def test_util_is_over_the_traffic_window():
    """A link idle for the first half of a 2 s run and at full rate for the second: utilisation 1.0 over the
    traffic window (1 s … 2 s), where the whole-run average said 0.5."""
    full = int(RATE * IV / 8)
    up = {("leaf0", "spine0"): [0, 0, full, full]}
    row = rp.summarize(rp.links_frame(_uplink_rows(up)), rp.flows_frame(_flows(("leaf0", "leaf1", 1.0, 2.0))),
                       CPU, META)
    assert row["traffic_start_s"] == 1.0 and row["traffic_end_s"] == 2.0 and row["traffic_window_s"] == 1.0
    assert row["mean_uplink_util"] == pytest.approx(1.0)
    assert row["max_uplink_util"] == pytest.approx(1.0)


def test_util_uneven_two_leaves_asymmetric():
    """Two source leaves, one-way each, different loads; each uplink's util = its bytes / (rate × window)."""
    up = {("leaf0", "spine0"): [3_000_000] * 4, ("leaf0", "spine1"): [1_000_000] * 4,
          ("leaf1", "spine0"): [0] * 4, ("leaf1", "spine1"): [2_000_000] * 4}
    flows = _flows(("leaf0", "leaf1", 0.0, 2.0), ("leaf1", "leaf0", 0.0, 2.0))
    row = rp.summarize(rp.links_frame(_uplink_rows(up)), rp.flows_frame(flows), CPU, META)
    utils = [12e6 * 8 / (2.0 * RATE), 4e6 * 8 / (2.0 * RATE), 0.0, 8e6 * 8 / (2.0 * RATE)]
    assert row["uplinks"] == 4 and row["uplink_tx_bytes"] == 24_000_000
    assert row["mean_uplink_util"] == pytest.approx(np.mean(utils))
    assert row["max_uplink_util"] == pytest.approx(0.48)
    # leaf0: 12/8 = 1.5 with 16 MB; leaf1: 8/4 = 2.0 with 8 MB → (1.5×16 + 2.0×8)/24
    assert row["uplink_imbalance"] == pytest.approx((1.5 * 16 + 2.0 * 8) / 24)


def _tx(port, backlogs, utils, offered, paused=0.0, **extra):
    rows = []
    for i, (b, u, o) in enumerate(zip(backlogs, utils, offered)):
        rows.append(dict(time_s=(i + 1) * IV, switch="leaf0", port=port, peer=port, direction="tx", role="up",
                         rate_bps=RATE, bytes=int(u * RATE * IV / 8), packets=max(1, int(u * RATE * IV / 8 / 1514)),
                         interval_s=IV, backlog_bytes=b,
                         offered_bytes=o, paused_s=paused, **extra))
    return rows


def test_starved_shaper_samples_flag_the_run():
    """A port with a standing queue and enough offered load that still delivered 60 % of its rate, in 3 of its
    4 backlogged samples: starved; the run is cpu_bound although the CPU guard saw no saturated core."""
    cap = RATE * IV / 8
    rows = _tx("spine0", [50_000] * 5, [1.0, 0.6, 0.6, 0.6, 1.0], [cap] * 5)
    rows += _tx("spine1", [0, 0, 0, 0], [0.3] * 4, [cap * 0.3] * 4)          # no queue: not a candidate
    rows += _tx("spine2", [50_000] * 4, [0.1] * 4, [cap] * 4, paused=0.05)   # paused by PFC: not a candidate
    row = rp.summarize(rp.links_frame(rows), rp.flows_frame(_flows(("leaf0", "leaf1", 0.0, 2.0))), CPU, META)
    assert row["backlogged_samples"] == 4 and row["starved_samples"] == 3
    assert row["starved_share"] == pytest.approx(3 / 4)
    assert row["cpu_bound"] is True
    assert row["starved_stolen_samples"] == 0                    # no steal samples: none is the host's
    assert row["cpu_bound_reason"] == ("shapers starved of CPU in 3 of 4 backlogged samples (0 during steal; "
                                       "95 % lower bound 30.1% > 5%)")
    two = rp.summarize(rp.links_frame(_tx("spine0", [50_000] * 4, [1.0, 0.6, 0.6, 1.0], [cap] * 4)),
                       rp.flows_frame(_flows(("leaf0", "leaf1", 0.0, 2.0))), CPU, META)
    assert (two["starved_samples"], two["cpu_bound"]) == (2, False)    # 2 of 3: fewer than STARVED_MIN


def test_the_guard_names_every_rule_that_flagged_a_run():
    """One line per verdict, each rule with its figures: core 1 saturated in 25 % of the samples, 10 of 50
    starved (Wilson lower bound 11.2 %), 12 % steal; a valid run's reason is empty, a run without samples
    has no verdict."""
    from testbed.report.summary import guard_reasons
    sat = {"cpu_bound": True, "cpu_worst_core": 1, "cpu_saturated_share": 0.25}
    bound, why = guard_reasons(sat, 50, 10, 3, 0.12)
    assert bound is True and why == ("core 1 saturated by the lab in 25% of the samples (flagged from 20%); "
                                     "shapers starved of CPU in 10 of 50 backlogged samples (3 during steal; 95 % "
                                     "lower bound 11.2% > 5%); the hypervisor took 12% of the machine's CPU time "
                                     "(flagged from 10%)")
    assert guard_reasons(dict(sat, cpu_bound=False), 25, 2, 0, 0.01) == (False, "")
    late = {"events": 2, "leaked_max": 40, "headroom_frames": 32, "reaction_us": 12_300.0}   # 48 KB of 1,514 B
    assert guard_reasons(dict(sat, cpu_bound=False), 25, 2, 0, 0.01, late) == (
        True, "the PFC agent paused too late 2 time(s): up to 40 frames arrived after Xoff where the headroom "
              "holds 32 (reaction 12.3 ms)")
    assert guard_reasons({"cpu_bound": None}, 0, 0, 0, math.nan) == (None, "")


def test_a_slow_port_one_frame_short_of_its_rate_is_not_starved():
    """1 Mbit/s, 100 ms samples: 12,500 B per sample, 11,875 B at 95 %. A backlogged port that delivered 5
    frames of 2,214 B (11,070 B, util 0.886) lost the sixth to the sample's boundary: not starved (11,070 +
    2,214 ≥ 11,875); 4 frames (8,856 B, 0.708) is: 8,856 + 2,214 = 11,070 < 11,875."""
    def row(frames):
        return dict(time_s=0.1, switch="leaf0", port="spine0", peer="spine0", direction="tx", role="up",
                    rate_bps=1_000_000, bytes=frames * 2214, packets=frames, interval_s=0.1,
                    util=frames * 2214 * 8 / 1e5, backlog_bytes=20_000, offered_bytes=12_500, paused_s=0.0)
    from testbed.report.summary import starved
    for frames, hungry in ((5, 0), (4, 1)):
        first = dict(row(6), time_s=0.0)
        assert starved(rp.links_frame([first, row(frames)])) == (1, hungry, 0), frames


def test_a_starved_sample_during_hypervisor_steal_is_counted_as_stolen():
    """The same port (0.5 s samples); the CPU guard saw 6 % steal in its sample ending at 1.0 s (covering
    0.5–1.0 s), 4 % (below 5 %) at 2.0 s: of the starved samples ending at 1.0 and 1.5 s only the first overlaps
    it: 1 stolen."""
    cap = RATE * IV / 8
    rows = _tx("spine0", [50_000] * 4, [1.0, 0.6, 0.6, 1.0], [cap] * 4)
    cpu = dict(CPU, cpu_steal=[[0.5, 0.0], [1.0, 0.06], [1.5, 0.0], [2.0, 0.04]])
    row = rp.summarize(rp.links_frame(rows), rp.flows_frame(_flows(("leaf0", "leaf1", 0.0, 2.0))), cpu, META)
    assert (row["starved_samples"], row["starved_stolen_samples"]) == (2, 1)


def test_credit_counters_sum_rx_rows_and_a_waiting_port_is_not_starved():
    """Credits: the summary adds up the receiving ports' rx rows (3 + 1 stalls, 0.25 + 0.5 s); the tx rows'
    credit_wait_s (the same stall seen from the sender) is not counted again, and a port that waited for credit
    with a standing queue delivered little because it had no credit, not because it was starved of CPU."""
    cap = RATE * IV / 8
    rows = _tx("spine0", [50_000] * 4, [0.2] * 4, [cap] * 4, credit_wait_s=0.05)
    rows += [dict(time_s=IV, switch="spine0", port="leaf0", peer="leaf0", direction="rx", role="down",
                  rate_bps=RATE, bytes=0, packets=0, interval_s=IV, credit_stalls=3, credit_stall_s=0.25,
                  credits_granted=1000),
             dict(time_s=2 * IV, switch="spine0", port="leaf0", peer="leaf0", direction="rx", role="down",
                  rate_bps=RATE, bytes=0, packets=0, interval_s=IV, credit_stalls=1, credit_stall_s=0.5,
                  credits_granted=0)]
    row = rp.summarize(rp.links_frame(rows), rp.flows_frame(_flows(("leaf0", "leaf1", 0.0, 2.0))), CPU, META)
    assert row["credit_stalls"] == 4 and row["credit_stall_s_total"] == pytest.approx(0.75)
    assert row["backlogged_samples"] == 0 and row["starved_samples"] == 0 and row["cpu_bound"] is False
    no_credit = rp.summarize(rp.links_frame(_tx("spine0", [0] * 2, [0.5] * 2, [cap] * 2)),
                             rp.flows_frame([]), CPU, META)
    assert no_credit["credit_stalls"] == 0 and no_credit["credit_stall_s_total"] == 0.0


def test_shared_buffer_summary_is_the_fullest_switch():
    """Shared buffers: the summary's peak is the largest per-switch peak of any sample (bytes and fraction), the
    rows' occupancy read from the qdiscs and the program's peak combined; 0 without shared buffers."""
    from testbed.telemetry.links import _shared_buffer
    cap = RATE * IV / 8
    dump = (0.0, {1: (0, 0, 0, 0, 30_000), 2: (0, 0, 0, 0, 10_000)})      # (bytes, packets, drops, qlen, backlog)
    assert _shared_buffer("leaf0", 100_000, dump, {"leaf0": 35_000}) == {
        "switch_buffer_bytes": 40_000, "switch_buffer_peak_bytes": 40_000, "switch_buffer_peak_frac": 0.4}
    assert _shared_buffer("leaf0", 100_000, dump, {"leaf0": 55_000})["switch_buffer_peak_bytes"] == 55_000
    rows = _tx("leaf0", [0] * 2, [0.5] * 2, [cap] * 2)
    for r, (now, peak) in zip(rows, [(20_000, 55_000), (40_000, 41_000)]):
        r.update(switch_buffer_bytes=now, switch_buffer_peak_bytes=peak, switch_buffer_peak_frac=peak / 100_000)
    row = rp.summarize(rp.links_frame(rows), rp.flows_frame([]), CPU, META)
    assert row["switch_buffer_peak_bytes"] == 55_000 and row["switch_buffer_peak_frac"] == pytest.approx(0.55)
    none = rp.summarize(rp.links_frame(_tx("leaf0", [0] * 2, [0.5] * 2, [cap] * 2)), rp.flows_frame([]), CPU, META)
    assert none["switch_buffer_peak_bytes"] == 0 and none["switch_buffer_peak_frac"] == 0.0


def test_a_port_without_enough_work_is_not_starved():
    cap = RATE * IV / 8
    rows = _tx("spine0", [50_000] * 4, [0.6] * 4, [cap * 0.5] * 4)      # backlogged but little offered
    row = rp.summarize(rp.links_frame(rows), rp.flows_frame(_flows(("leaf0", "leaf1", 0.0, 2.0))), CPU, META)
    assert row["backlogged_samples"] == 0 and row["starved_samples"] == 0 and row["cpu_bound"] is False


def test_no_traffic_gives_nan():
    row = rp.summarize(rp.links_frame([]), rp.flows_frame([]), CPU, META)
    for k in ("mean_uplink_util", "max_uplink_util", "uplink_imbalance", "fct_p50_ms", "fct_p99_ms"):
        assert math.isnan(row[k]), k
    assert row["goodput_mbps"] == 0.0 and row["flows"] == 0 and row["uplinks"] == 0


def test_percentiles_goodput_and_counts():
    fcts = [i / 1000 for i in range(1, 101)] + [None, float("nan")]  # 1..100 ms, two unfinished
    row = rp.summarize(rp.links_frame([]), rp.flows_frame(make_flows(fcts)), CPU, META)
    ms = np.arange(1, 101, dtype=float)
    assert row["fct_p50_ms"] == pytest.approx(np.percentile(ms, 50))
    assert row["fct_p99_ms"] == pytest.approx(np.percentile(ms, 99))
    assert row["fct_max_ms"] == pytest.approx(100.0)
    assert row["flows"] == 102 and row["flows_completed"] == 100
    assert row["goodput_mbps"] == pytest.approx(102 * 1_000_000 * 8 / 2.0 / 1e6)
    assert row["lost_packets"] == sum(i % 2 for i in range(102))


# --- files ----------------------------------------------------------------------------------------------

def test_atomic_write_leaves_no_temp_files(tmp_path):
    out = tmp_path / "new" / "run"
    rp.write_run(out, MANIFEST, make_links(UNEVEN), make_flows([0.01, 0.02]), CPU, META)
    assert not [p for p in out.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]


def test_atomic_write_failure_keeps_old_file(tmp_path):
    target = tmp_path / "x.csv"
    target.write_text("old\n")

    def boom(fh):
        fh.write("half")
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        rp.atomic_write(target, boom)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.csv"]


def test_plots_written_and_skipped(tmp_path):
    cc = rp.cc_frame([{"flow_id": f, "time_s": t / 100, "cwnd_bytes": 1000 + 10 * t, "rate_bps": 1e6 * (1 + f)}
                      for f in (0, 1, 2) for t in range(50)])
    names = rp.plots(tmp_path, rp.links_frame(make_links(UNEVEN)), rp.flows_frame(make_flows([0.01, 0.03])),
                     rp.int_frame(int_rows()), cc)
    assert set(names) == set(rp.PLOT_FILES.values())
    for n in names:
        assert (tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty"
    assert rp.plots(empty, rp.links_frame([]), rp.flows_frame(make_flows([None]))) == []


def test_report_regenerates_identical_summary(tmp_path):
    names = {"weird": "NA"}  # a node called NA must survive the CSV round trip
    links = make_links(UNEVEN) + [dict(time_s=0.5, switch="leaf0", port=names["weird"], peer="NA",
                                       direction="tx", role="down", rate_bps=RATE, bytes=1, packets=1,
                                       interval_s=IV)]
    flows = make_flows([0.0123456789, 0.02, None, 0.1 / 3])
    row = rp.write_run(tmp_path, MANIFEST, links, flows, CPU, META)
    before = (tmp_path / "summary.csv").read_text()
    (tmp_path / "summary.csv").unlink()
    (tmp_path / "fct_cdf.png").unlink()
    again = rp.report(tmp_path)
    assert same(row, again)
    assert (tmp_path / "summary.csv").read_text() == before
    assert (tmp_path / "fct_cdf.png").is_file()
    assert rp.links_frame(pd.read_csv(tmp_path / "links.csv", keep_default_na=False,
                                      na_values=[""]))["port"].iloc[-1] == "NA"


def test_report_without_inputs_in_manifest_uses_old_summary(tmp_path):
    row = rp.write_run(tmp_path, MANIFEST, make_links(UNEVEN), make_flows([0.01, 0.02]), CPU, META)
    m = json.loads((tmp_path / "manifest.json").read_text())
    del m["report_inputs"]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert same(row, rp.report(tmp_path))


def test_report_error_on_non_result_dir(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(rp.ReportError) as e:
        rp.report(tmp_path)
    assert "not a result directory" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(rp.ReportError, match="no such directory"):
        rp.report(tmp_path / "missing")


def test_report_error_on_bad_manifest(tmp_path):
    rp.write_run(tmp_path, MANIFEST, make_links(EVEN), make_flows([0.01]), CPU, META)
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(rp.ReportError, match="not valid JSON"):
        rp.report(tmp_path)


# --- sweep ----------------------------------------------------------------------------------------------

def test_sweep_table_joins_and_writes(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    ra = rp.write_run(a, MANIFEST, make_links(UNEVEN), make_flows([0.01]), CPU, META)
    rb = rp.write_run(b, MANIFEST, make_links(EVEN), make_flows([0.02, 0.03]), dict(CPU, cpu_bound=True),
                      dict(META, run_id="r2", load_balancing="spray"))
    rc = rp.write_run(c, MANIFEST, make_links(EVEN), make_flows([0.02]), CPU, dict(META, run_id="r3"))
    (c / "summary.csv").unlink()  # recomputed in memory, not written
    df = rp.sweep_table([a, b, c])
    assert list(df.columns[:13]) == rp.SUMMARY_COLUMNS
    assert df["run_id"].tolist() == ["r1", "r2", "r3"]
    assert df["load_balancing"].tolist() == ["ecmp", "spray", "ecmp"]
    assert df["run_dir"].tolist() == [str(a), str(b), str(c)]
    assert df["uplink_imbalance"].tolist() == pytest.approx([ra["uplink_imbalance"], rb["uplink_imbalance"],
                                                             rc["uplink_imbalance"]])
    assert df["cpu_bound"].tolist() == [False, True, False]
    assert not (c / "summary.csv").exists()
    out = tmp_path / "sweep"
    assert rp.write_sweep(out, df) == ["sweep.csv", "sweep.png"]
    back = pd.read_csv(out / "sweep.csv")
    assert back["run_id"].tolist() == ["r1", "r2", "r3"]
    assert not [p for p in out.iterdir() if p.suffix == ".tmp"]


def test_sweep_table_errors_and_empty(tmp_path):
    with pytest.raises(rp.ReportError):
        rp.sweep_table([tmp_path])
    empty = rp.sweep_table([])
    assert list(empty.columns[:13]) == rp.SUMMARY_COLUMNS and len(empty) == 0


def int_rows():
    """Two paths: a→b with path delays 1, 2, 3, 4 ms (flows 0 and 1), a→c with 10 ms once (flow 2); every report
    has two hops (hop 1 carries the rest of the delay)."""
    out = []
    for n, (path, flow, delay) in enumerate([("a>b", 0, 1e6), ("a>b", 0, 2e6), ("a>b", 1, 3e6), ("a>b", 1, 4e6),
                                              ("a>c", 2, 10e6)]):
        for hop in (0, 1):
            out.append({"time_s": 0.01 * n, "report": n, "flow_id": flow, "path": path, "hop": hop,
                        "switch": path.split(">")[hop], "ingress_port": "x", "egress_port": "y", "queue_id": 0,
                        "queue_bytes": 0, "hop_latency_ns": delay / 2, "tx_bytes": 0, "link_rate_bps": 1e9,
                        "hop_time_s": 0.01 * n, "path_delay_ns": delay, "exceeded": 0, "ip_bytes": 100,
                        "probe": 0})
    return out


def test_int_path_delays_are_per_report_not_per_hop(tmp_path):
    df = rp.int_frame(int_rows())
    fig = rp.summary.int_figures(df)
    assert fig["int_reports"] == 5 and fig["int_paths"] == 2
    assert fig["int_path_delay_p50_ns"] == 3e6                   # median of 1, 2, 3, 4, 10 ms
    assert fig["int_path_delay_p99_ns"] == pytest.approx(4e6 + 0.96 * 6e6)   # linear between 4 and 10 ms
    assert fig["int_path_delay_p99_max_ns"] == 10e6              # the worst path's p99 (a→c: one report)
    paths = rp.frames.int_paths_frame(df).set_index("path")
    assert paths.loc["a>b", "reports"] == 4 and paths.loc["a>b", "flows"] == 2
    assert paths.loc["a>b", "delay_p50_ns"] == 2.5e6 and paths.loc["a>b", "delay_max_ns"] == 4e6
    row = rp.write_run(tmp_path, MANIFEST, make_links(UNEVEN), make_flows([0.01]), CPU, META, int_rows=int_rows())
    assert row["int_reports"] == 5 and (tmp_path / "int.csv").is_file() and (tmp_path / "int_paths.csv").is_file()
    assert same(row, rp.report(tmp_path))                        # recomputed from int.csv alone
    no_int = rp.summary.int_figures(None)
    assert no_int["int_reports"] == 0 and math.isnan(no_int["int_path_delay_p50_ns"])


def test_starved_share_flags_only_with_95_percent_confidence():
    """Wilson score lower bounds, by hand: 2 of 25 → 0.0222 (a short healthy run's noise: not flagged), 10 of
    50 → 0.1124 (flagged), 2 of 3 → 0.2077."""
    from testbed.report.summary import wilson_lower
    assert wilson_lower(2, 25) == pytest.approx(0.02222, abs=1e-4)
    assert wilson_lower(10, 50) == pytest.approx(0.11244, abs=1e-4)
    assert wilson_lower(2, 3) == pytest.approx(0.20765, abs=1e-4)
    assert wilson_lower(0, 0) == 0.0 and wilson_lower(0, 40) == 0.0


def test_hypervisor_steal_counts_against_the_cores_time_and_flags_the_run(monkeypatch):
    """Two cores, 1 s samples. Core 0: 0.5 s stolen, the lab busy 0.4 s → the lab had 0.5 s and used 0.4:
    0.8 of it (not 0.4). Core 1 wholly stolen: nothing could run, 1.0. The machine's steal share 1.5 / 2 = 0.75.
    A summary whose window mean steal is ≥ 0.1 is cpu_bound although no core was saturated by the lab: the flow
    runs 0.1–0.4 s, so the samples ending at 0.2, 0.3, 0.4 s count (mean of 0.04, 0, 0 = 0.0133: not flagged;
    of 0.2, 0.1, 0 = 0.1: flagged)."""
    from testbed.report.summary import summarize
    from testbed.telemetry import cpu as cpumod
    stats = iter([[(0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0)],
                  [(0.4, 0.4, 1.0, 0.5), (0.0, 0.0, 1.0, 1.0)]])
    monkeypatch.setattr(cpumod, "read_cores", lambda: next(stats))
    guard = cpumod.CpuGuard(None, 0.0)
    guard.sample()
    guard.sample()
    (_, busy), = guard.samples
    assert busy == pytest.approx([0.8, 1.0]) and guard.steal[0][1] == pytest.approx(0.75)
    quiet = {"cpu_samples": [[t, [0.3, 0.2]] for t in (0.1, 0.2, 0.3, 0.4)],
             "cpu_steal": [[t, s] for t, s in ((0.1, 0.0), (0.2, 0.04), (0.3, 0.0), (0.4, 0.0))]}
    noisy = dict(quiet, cpu_steal=[[t, s] for t, s in ((0.1, 0.1), (0.2, 0.2), (0.3, 0.1), (0.4, 0.0))])
    flows = make_flows([0.3])
    r_quiet = summarize(make_links(EVEN), flows, quiet, META)
    r_noisy = summarize(make_links(EVEN), flows, noisy, META)
    assert r_quiet["cpu_bound"] is False and r_quiet["cpu_steal_mean"] == pytest.approx(0.04 / 3)
    assert r_noisy["cpu_bound"] is True and r_noisy["cpu_steal_max"] == pytest.approx(0.2)
