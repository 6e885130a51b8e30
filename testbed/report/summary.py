"""The one summary row of a run: every headline number, each defined exactly in results/README.md.

The definitions that need care:

- **Traffic window**: from the first flow's start to the last byte any flow delivered (flows.csv ``start_s``,
  ``end_s``, on the same clock as links.csv ``time_s``). Utilisation is measured over it, not over the whole
  sampling window: the idle set-up time before the first packet and the tail after the last say nothing about
  the fabric.
- **Source leaves and counted uplinks**: a source leaf is a leaf that is the ``src_leaf`` of at least one flow
  whose destination is behind another leaf (``dst_leaf``); the counted uplinks are all uplinks of the source
  leaves, idle ones included (an uplink an ECMP collision left idle is exactly what must show). A leaf that
  only carries ACKs of other leaves' flows is not a source leaf.
- **Imbalance** is computed per source leaf (busiest / mean uplink bytes of that leaf), then averaged weighted by
  each leaf's uplink bytes; so leaves that send different amounts (incast, skewed patterns) do not look
  imbalanced, only uneven spreading does. ``uplink_imbalance_max`` is the worst leaf.
- **Starved samples**: the direct sign that the emulator, not the fabric, was the bottleneck: a port that had a
  full interval of work (backlog at the start + bytes offered ≥ rate × interval), was still backlogged at the
  end, was neither paused nor waiting for credit, yet delivered less than 95 % of its rate, and short of it by
  more than one of its frames — its shaper was starved of CPU. A starved sample is *stolen* when the hypervisor took ≥ 5 % of the machine's time in a CPU
  guard sample overlapping its interval (``cpu_steal``): then the shortfall is the host's, not the lab's load.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .columns import META_KEYS
from .frames import flows_frame, links_frame

FULL_FRAME = 1514              # bytes: a full Ethernet frame at MTU 1500 (backlog thresholds below)
STARVED_UTIL = 0.95            # a backlogged, unpaused port below this share of its rate was starved of CPU …
STARVED_SHARE = 0.05           # … and the run is flagged when more than this share of backlogged samples was
STARVED_MIN = 3                # … and at least this many: a short run has few backlogged samples, and one or two
                               # descheduled intervals (1 of 1 has a Wilson lower bound of 21 %) are not its result
CORE_SATURATED = 0.95          # a core this busy with the lab's work in a sample is saturated …
SATURATED_SHARE = 0.2          # … and the run is cpu_bound when this share of its samples has a saturated core
STEAL_SHARE = 0.1              # … or when the hypervisor took this share of the machine's time (mean, window)
STOLEN_STEAL = 0.05            # a starved sample overlapping a CPU sample with this much steal is "stolen"


def wilson_lower(k: int, n: int, z: float = 1.96) -> float:
    """Lower bound of the 95 % Wilson score interval of a share k/n (0 when n = 0). The starved-share flag uses
    it so that one or two starved samples among a short run's 20–30 backlogged ones (4–8 %) are not taken as
    evidence that more than 5 % were: that flagged healthy runs on this 2-core machine."""
    if n <= 0:
        return 0.0
    p = k / n
    zz = z * z
    return max(0.0, (p + zz / (2 * n) - z * math.sqrt(p * (1 - p) / n + zz / (4 * n * n))) / (1 + zz / n))


def _num(x: Any) -> Any:
    """numpy scalar → Python scalar (so the summary row is plain Python)."""
    return x.item() if isinstance(x, np.generic) else x


def _f(x) -> float:
    return float(x) if x is not None and not (isinstance(x, float) and math.isnan(x)) else math.nan


def traffic_window(flows_df: pd.DataFrame) -> tuple[float, float]:
    """(first flow start, last byte delivered) in run seconds; NaN when no flow delivered anything."""
    if not len(flows_df):
        return math.nan, math.nan
    starts = pd.to_numeric(flows_df["start_s"], errors="coerce").dropna()
    ends = pd.to_numeric(flows_df["end_s"], errors="coerce").dropna()
    if not len(starts) or not len(ends):
        return math.nan, math.nan
    return float(starts.min()), float(ends.max())


def source_leaves(flows_df: pd.DataFrame, up: pd.DataFrame) -> list[str]:
    """Leaves that source at least one flow leaving the leaf (see the module docstring). Results written before
    flows.csv had ``dst_leaf`` count every ``src_leaf``; before ``src_leaf``, every leaf whose uplinks sent."""
    if "src_leaf" in flows_df.columns and flows_df["src_leaf"].notna().any():
        f = flows_df[flows_df["src_leaf"].notna()]
        if "dst_leaf" in f.columns:
            f = f[f["dst_leaf"] != f["src_leaf"]]
        return sorted(set(f["src_leaf"].astype(str)))
    sent = up.groupby("switch")["bytes"].sum()
    return sorted(sent[sent > 0].index)


def uplinks(links_df: pd.DataFrame, flows_df: pd.DataFrame, window: tuple[float, float]) -> pd.DataFrame:
    """Per counted uplink (switch, port): tx bytes in the traffic window and utilisation over it.

    A sample counts when its interval (``time_s − interval_s`` … ``time_s``) overlaps the window; no flow sends
    outside the window, so this is every byte of the traffic."""
    cols = ["switch", "port", "tx_bytes", "util"]
    if links_df is None or not len(links_df):
        return pd.DataFrame(columns=cols)
    up = links_df[(links_df["role"] == "up") & (links_df["direction"] == "tx")]
    leaves = set(source_leaves(flows_df, up))
    up = up[up["switch"].isin(leaves)]
    if not len(up):
        return pd.DataFrame(columns=cols)
    t0, t1 = window
    if not math.isnan(t0):
        end = up["time_s"].astype(float)
        up = up[(end > t0) & (end - up["interval_s"].astype(float) < t1)]
    g = up.groupby(["switch", "port"], sort=True).agg(tx_bytes=("bytes", "sum"),
                                                       rate_bps=("rate_bps", "max")).reset_index()
    span = t1 - t0
    g["util"] = (g["tx_bytes"].astype(float) * 8.0 / (g["rate_bps"].astype(float) * span)
                 if span > 0 else math.nan)
    return g[cols]


def imbalance(up: pd.DataFrame) -> tuple[float, float]:
    """(uplink_imbalance, uplink_imbalance_max): per leaf max/mean of its uplinks' bytes, averaged weighted by the
    leaf's uplink bytes; and the worst leaf. Leaves whose uplinks carried nothing have no imbalance."""
    per_leaf = []
    for _, g in up.groupby("switch"):
        b = g["tx_bytes"].astype(float)
        if b.sum() > 0:
            per_leaf.append((float(b.max() / b.mean()), float(b.sum())))
    if not per_leaf:
        return math.nan, math.nan
    total = sum(w for _, w in per_leaf)
    return sum(i * w for i, w in per_leaf) / total, max(i for i, _ in per_leaf)


def interval_steal(steal: list, t0: float, t1: float) -> float:
    """The largest machine steal share of the CPU guard samples overlapping [t0, t1] (0 when none does)."""
    prev, most = -math.inf, 0.0
    for t, f in steal:
        if t > t0 and prev < t1:
            most = max(most, f)
        prev = t
    return most


def stolen_interval(steal: list, t0: float, t1: float) -> bool:
    """Did a CPU guard sample overlapping [t0, t1] see at least STOLEN_STEAL of steal?"""
    return interval_steal(steal, t0, t1) >= STOLEN_STEAL


def starved(links_df: pd.DataFrame, steal: list | None = None) -> tuple[int, int, int]:
    """(backlogged samples, starved samples, stolen starved samples) over the tx rows (module docstring);
    ``steal`` is the CPU guard's ``cpu_steal`` ([time_s, share] per sample)."""
    need = {"backlog_bytes", "offered_bytes", "paused_s"}
    if not len(links_df) or not need <= set(links_df.columns):
        return 0, 0, 0
    tx = links_df[(links_df["direction"] == "tx") & links_df["backlog_bytes"].notna()]
    backlogged = starving = stolen = 0
    for _, g in tx.groupby(["switch", "port"], sort=False):
        g = g.sort_values("time_s")
        prev = g["backlog_bytes"].shift(1)
        cap = g["rate_bps"].astype(float) * g["interval_s"].astype(float) / 8.0
        waited = g["credit_wait_s"].fillna(0) if "credit_wait_s" in g.columns else 0.0   # out of credit: not starved
        busy = ((prev >= 2 * FULL_FRAME) & (g["backlog_bytes"] >= 2 * FULL_FRAME) & (g["paused_s"] <= 0)
                & (waited <= 0)
                & (prev + g["offered_bytes"] >= cap))
        backlogged += int(busy.sum())
        # one frame short is the sample's boundary cutting a frame, not a starved shaper: at 1 Mbit/s and 100 ms
        # a sample holds 5.6 frames of 2,214 B, so 5 whole ones read 0.89 (the frame: this port's mean)
        frame = (g["bytes"].astype(float) / g["packets"].where(g["packets"] > 0)).fillna(FULL_FRAME)
        hungry = busy & (g["util"] < STARVED_UTIL) & (g["bytes"].astype(float) + frame < STARVED_UTIL * cap)
        starving += int(hungry.sum())
        if steal:
            stolen += sum(stolen_interval(steal, t - iv, t) for t, iv in zip(g.loc[hungry, "time_s"].astype(float),
                                                                     g.loc[hungry, "interval_s"].astype(float)))
    return backlogged, starving, stolen


def _in_window(samples: list, window: tuple[float, float]) -> list:
    """The samples whose interval's middle lies in the window (all of them when the window is unknown)."""
    t0, t1 = window
    inside, prev = [], 0.0
    for s in samples:
        if math.isnan(t0) or t0 <= (prev + s[0]) / 2 <= t1:
            inside.append(s)
        prev = s[0]
    return inside


def steal_verdict(cpu: Mapping[str, Any], window: tuple[float, float]) -> tuple[float, float]:
    """(mean, max) over the traffic window of the share of the machine's CPU time the hypervisor took."""
    inside = [f for _, f in _in_window(cpu.get("cpu_steal") or [], window)]
    return (sum(inside) / len(inside), max(inside)) if inside else (math.nan, math.nan)


def cpu_verdict(cpu: Mapping[str, Any], window: tuple[float, float]) -> dict:
    """The CPU guard over the traffic window: per sample the busiest core's lab load (telemetry/cpu.py); mean,
    max, which core and when, and the share of samples with a saturated core. Samples outside the window (the
    agents starting, the drain) are not the emulated traffic. Results from before per-core samples carry the
    verdict itself."""
    samples = cpu.get("cpu_samples")
    if not isinstance(samples, list):
        return {k: cpu.get(k) for k in ("cpu_bound", "cpu_busy_mean", "cpu_busy_max", "cpu_worst_core",
                                        "cpu_worst_time_s", "cpu_saturated_share")}
    inside = [(t, b) for t, b in _in_window(samples, window) if b]
    if not inside:
        return {"cpu_bound": False if samples is not None else None, "cpu_busy_mean": math.nan,
                "cpu_busy_max": math.nan, "cpu_worst_core": None, "cpu_worst_time_s": math.nan,
                "cpu_saturated_share": math.nan}
    worst = [max(b) for _, b in inside]
    i = max(range(len(inside)), key=worst.__getitem__)
    saturated = sum(1 for w in worst if w >= CORE_SATURATED) / len(inside)
    return {"cpu_bound": saturated >= SATURATED_SHARE, "cpu_busy_mean": sum(worst) / len(worst),
            "cpu_busy_max": worst[i], "cpu_worst_core": inside[i][1].index(worst[i]),
            "cpu_worst_time_s": inside[i][0], "cpu_saturated_share": saturated}


def guard_reasons(guard: Mapping[str, Any], backlogged: int, starving: int, stolen: int,
                  steal_mean: float, pfc_late: Mapping[str, Any] | None = None) -> tuple[bool | None, str]:
    """(cpu_bound, cpu_bound_reason): the guard's verdict and, when it flags the run, every rule that fired in
    one line, so whoever re-runs it (a test, a sweep) can say why. None without CPU samples. ``pfc_late``: the
    PFC agent's pauses that let more frames in after Xoff than the headroom holds (qos/pfc.py), which a
    hardware switch, pausing within microseconds, would not have."""
    if guard["cpu_bound"] is None:
        return None, ""
    why = []
    if pfc_late and pfc_late.get("events"):
        why.append(f"the PFC agent paused too late {pfc_late['events']} time(s): up to {pfc_late['leaked_max']} "
                   f"frames arrived after Xoff where the headroom holds {pfc_late['headroom_frames']} (reaction "
                   f"{pfc_late['reaction_us'] / 1e3:.1f} ms)")
    if guard["cpu_bound"]:
        share = _f(guard.get("cpu_saturated_share"))       # results from before per-core samples: the verdict only
        why.append(f"core {guard.get('cpu_worst_core')} saturated by the lab in {share:.0%} of the samples (flagged "
                   f"from {SATURATED_SHARE:.0%})" if not math.isnan(share) else "a core saturated by the lab")
    low = wilson_lower(starving, backlogged)
    if low > STARVED_SHARE and starving >= STARVED_MIN:
        why.append(f"shapers starved of CPU in {starving} of {backlogged} backlogged samples ({stolen} during "
                   f"steal; 95 % lower bound {low:.1%} > {STARVED_SHARE:.0%})")
    if steal_mean >= STEAL_SHARE:
        why.append(f"the hypervisor took {steal_mean:.0%} of the machine's CPU time (flagged from "
                   f"{STEAL_SHARE:.0%})")
    return bool(why), "; ".join(why)


def _col_sum(df: pd.DataFrame, col: str) -> Any:
    """Sum of a column, NaN when no row has a value (the engine does not report it)."""
    if col in df.columns and df[col].notna().any():
        return _num(pd.to_numeric(df[col], errors="coerce").sum())
    return math.nan


def _links_sum(df: pd.DataFrame, col: str, direction: str | None = None) -> Any:
    if col not in df.columns:
        return 0
    if direction is not None:
        df = df[df["direction"] == direction]
    return _num(pd.to_numeric(df[col], errors="coerce").fillna(0).sum())


def _links_max(df: pd.DataFrame, col: str) -> Any:
    """Largest value of a links.csv column (0 when absent: the run had no such quantity)."""
    if col not in df.columns:
        return 0
    v = pd.to_numeric(df[col], errors="coerce").dropna()
    return _num(v.max()) if len(v) else 0


def _quantile(s: pd.Series, q: float) -> float:
    return float(s.quantile(q)) if len(s) else math.nan


def failure_figures(failures_df: pd.DataFrame | None) -> tuple[Any, Any]:
    """(failure_lost_packets, reroute_ms_max) from failures.csv: the packets lost over every event's window
    (NaN when no event's loss was measured: no failures, or no UDP flow), and the slowest reroute in ms (NaN
    when no event was rerouted)."""
    if failures_df is None or not len(failures_df):
        return math.nan, math.nan
    lost = pd.to_numeric(failures_df["lost_packets"], errors="coerce").dropna()
    rer = pd.to_numeric(failures_df["rerouted_s"], errors="coerce").dropna()
    return (_num(lost.sum()) if len(lost) else math.nan, float(rer.max() * 1e3) if len(rer) else math.nan)


def int_figures(int_df: pd.DataFrame | None) -> dict:
    """The summary's INT columns: reports, distinct paths, path delay p50/p99 over all reports, and the p99 of
    the worst path (NaN without INT reports)."""
    out = {"int_reports": 0, "int_paths": 0, "int_path_delay_p50_ns": math.nan, "int_path_delay_p99_ns": math.nan,
           "int_path_delay_p99_max_ns": math.nan}
    if int_df is None or not len(int_df):
        return out
    per = int_df.drop_duplicates("report")
    d = pd.to_numeric(per["path_delay_ns"], errors="coerce").dropna()
    out.update(int_reports=int(len(per)), int_paths=int(per["path"].nunique()),
               int_path_delay_p50_ns=_quantile(d, 0.5), int_path_delay_p99_ns=_quantile(d, 0.99),
               int_path_delay_p99_max_ns=float(per.groupby("path")["path_delay_ns"].quantile(0.99).max()))
    return out


def mpi_figures(collectives_df: pd.DataFrame | None) -> dict:
    """engine mpi: the largest size's mean algbw and busbw over its calls (workloads/mpi/busbw.py); empty for
    other runs."""
    if collectives_df is None or "busbw_mbps" not in collectives_df.columns or not len(collectives_df):
        return {}
    from ..workloads.mpi.busbw import summary as mpi_summary
    return mpi_summary(collectives_df.to_dict("records"))


def summarize(links_df: pd.DataFrame, flows_df: pd.DataFrame, cpu: Mapping[str, Any] | None,
              meta: Mapping[str, Any], collectives_df: pd.DataFrame | None = None,
              failures_df: pd.DataFrame | None = None, int_df: pd.DataFrame | None = None) -> dict:
    """The one summary row (see results/README.md for every definition). Plain Python values, NaN if undefined."""
    cpu, meta = dict(cpu or {}), dict(meta or {})
    links_df = links_frame(links_df if links_df is not None else [])
    flows_df = flows_frame(flows_df if flows_df is not None else [])
    row: dict[str, Any] = {k: _num(meta.get(k)) for k in META_KEYS}

    duration = _f(pd.to_numeric(pd.Series([meta.get("duration_s")]), errors="coerce").iloc[0])
    total_bytes = float(flows_df["bytes"].sum()) if len(flows_df) else 0.0
    row["goodput_mbps"] = total_bytes * 8.0 / duration / 1e6 if duration > 0 else math.nan

    window = traffic_window(flows_df)
    if len(flows_df) == 0 and collectives_df is not None and len(collectives_df):
        window = traffic_window(collectives_df)      # engine mpi: no flows, the benchmark's calls are the traffic
    up = uplinks(links_df, flows_df, window)
    util = up["util"].astype(float).dropna()
    row["mean_uplink_util"] = float(util.mean()) if len(util) else math.nan
    row["max_uplink_util"] = float(util.max()) if len(util) else math.nan
    imb, imb_max = imbalance(up)
    row["uplink_imbalance"] = imb

    fct_ms = flows_df["fct_s"].astype(float).dropna() * 1e3 if len(flows_df) else pd.Series(dtype=float)
    row["fct_p50_ms"] = _quantile(fct_ms, 0.50)
    row["fct_p99_ms"] = _quantile(fct_ms, 0.99)
    backlogged, starving, stolen = starved(links_df, cpu.get("cpu_steal"))
    starved_share = starving / backlogged if backlogged else math.nan
    guard = cpu_verdict(cpu, window)
    steal_mean, steal_max = steal_verdict(cpu, window)
    row["cpu_bound"], why = guard_reasons(guard, backlogged, starving, stolen, steal_mean, cpu.get("pfc_late"))

    row["flows"] = int(len(flows_df))
    row["flows_completed"] = int(len(fct_ms))
    row["fct_mean_ms"] = float(fct_ms.mean()) if len(fct_ms) else math.nan
    row["fct_max_ms"] = float(fct_ms.max()) if len(fct_ms) else math.nan
    row["lost_packets"] = _col_sum(flows_df, "lost")
    row["uplinks"] = int(len(up))
    row["uplink_tx_bytes"] = _num(up["tx_bytes"].sum()) if len(up) else 0
    for k in ("cpu_busy_mean", "cpu_busy_max"):
        row[k] = _f(guard.get(k))
    jct = (pd.to_numeric(collectives_df["jct_ms"], errors="coerce").dropna()
           if collectives_df is not None and "jct_ms" in collectives_df.columns else pd.Series(dtype=float))
    row["jct_mean_ms"] = float(jct.mean()) if len(jct) else math.nan
    row["jct_p99_ms"] = _quantile(jct, 0.99)
    row["retransmits"] = _col_sum(flows_df, "retrans")
    row["spurious_retransmits"] = _col_sum(flows_df, "spurious_retransmits")
    row["ooo_packets"] = _col_sum(flows_df, "reordered")
    row["cnps"] = _col_sum(flows_df, "cnps")
    row["drops"] = _links_sum(links_df, "drops", "tx") + _links_sum(links_df, "qdisc_drops")
    row["ecn_marks"] = _links_sum(links_df, "ecn_marks")
    row["pause_frames"] = _links_sum(links_df, "pause_tx")
    row["paused_s_total"] = float(_links_sum(links_df, "paused_s"))
    if "queue_bytes_max" in links_df.columns:
        q = pd.to_numeric(links_df.loc[links_df["direction"] == "tx", "queue_bytes_max"], errors="coerce").dropna()
        q = q[q > 0]
        row["queue_p99_bytes"] = float(q.quantile(0.99)) if len(q) else 0.0
    else:
        row["queue_p99_bytes"] = math.nan
    row["uplink_imbalance_max"] = imb_max
    row["traffic_start_s"], row["traffic_end_s"] = window
    row["traffic_window_s"] = window[1] - window[0]
    row["discards"] = _links_sum(links_df, "discards")
    row["ctl_lost"] = _col_sum(flows_df, "ctl_lost")
    row["cpu_worst_core"] = guard.get("cpu_worst_core")
    row["cpu_worst_time_s"] = _f(guard.get("cpu_worst_time_s"))
    row["cpu_saturated_share"] = _f(guard.get("cpu_saturated_share"))
    row["cpu_steal_mean"], row["cpu_steal_max"] = steal_mean, steal_max
    row["backlogged_samples"] = backlogged
    row["starved_samples"] = starving
    row["starved_stolen_samples"] = stolen
    row["starved_share"] = starved_share
    row["cpu_bound_reason"] = why
    row["failed"] = meta.get("failed")
    row["failure_lost_packets"], row["reroute_ms_max"] = failure_figures(failures_df)
    row["credit_stalls"] = _links_sum(links_df, "credit_stalls")
    row["credit_stall_s_total"] = float(_links_sum(links_df, "credit_stall_s", "rx"))
    row["switch_buffer_peak_bytes"] = _links_max(links_df, "switch_buffer_peak_bytes")
    row["switch_buffer_peak_frac"] = float(_links_max(links_df, "switch_buffer_peak_frac"))
    row["trims"] = _links_sum(links_df, "trims", "tx")      # switch.trim: packets cut to their headers
    slow = (flows_df["slowdown"].astype(float).dropna() if len(flows_df) and "slowdown" in flows_df
            else pd.Series(dtype=float))
    row["slowdown_p50"] = _quantile(slow, 0.50)
    row["slowdown_p99"] = _quantile(slow, 0.99)
    row["profile"] = meta.get("profile")          # scenario `profile` (infiniband, rocev2); empty without one
    row.update(mpi_figures(collectives_df))
    row.update(int_figures(int_df))
    for k, v in meta.items():  # extra scalar metadata (e.g. topology name) after the contract columns
        if k not in row and (v is None or isinstance(v, (str, int, float, bool, np.generic))):
            row[k] = _num(v)
    if int(meta.get("time_dilation") or 1) > 1:   # a dilated scenario: the real-unit twins (dilation.py)
        from ..dilation import real_summary
        real_summary(row, int(meta["time_dilation"]))
    return row
