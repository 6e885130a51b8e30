"""Rows → the pandas frames of links.csv, flows.csv and collectives.csv: contract columns first, in order;
numeric columns numeric (missing = NaN); ``util`` of every link sample computed here from its own bytes and
interval (results/README.md)."""
from __future__ import annotations

import warnings
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .columns import (CC_COLUMNS, COLLECTIVE_COLUMNS, COLLECTIVE_SIGNAL_COLUMNS, CONTROLLER_COLUMNS, FAILURE_COLUMNS, FLOW_COLUMNS, INT_COLUMNS, INT_PATH_COLUMNS, LINK_COLUMNS,
                      LINK_KNOWN_EXTRA, LINK_QOS_COLUMNS, SM_COLUMNS, WEIGHT_COLUMNS)

_LINK_NUMERIC = ["time_s", "bytes", "packets", "util", "rate_bps", "interval_s"]
_FLOW_NUMERIC = ["sport", "dport", "bytes", "start_s", "end_s", "fct_s", "goodput_mbps", "paths_used",
                 "size_bytes", "ideal_fct_s", "slowdown"]


def ordered(df: pd.DataFrame, first: Sequence[str]) -> pd.DataFrame:
    rest = [c for c in df.columns if c not in first]
    return df[list(first) + rest]


def _coerce(df: pd.DataFrame, numeric: Iterable[str]) -> pd.DataFrame:
    for c in numeric:
        if c in df.columns and not pd.api.types.is_numeric_dtype(df[c]):
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def _with_columns(df: pd.DataFrame, cols: Sequence[str], what: str) -> pd.DataFrame:
    missing = [c for c in cols if c not in df.columns]
    if missing and len(df):
        warnings.warn(f"{what}: missing column(s) {', '.join(missing)}; written as empty", stacklevel=3)
    for c in missing:
        df[c] = np.nan
    return df


def _compute_util(df: pd.DataFrame) -> pd.Series:
    denom = df["interval_s"].astype(float) * df["rate_bps"].astype(float)
    util = df["bytes"].astype(float) * 8.0 / denom
    return util.where(denom > 0)


def links_frame(links: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Link samples → the links.csv frame: contract columns first, `util` computed, extra keys kept."""
    df = links.copy() if isinstance(links, pd.DataFrame) else pd.DataFrame(list(links))
    df = _with_columns(df, [c for c in LINK_COLUMNS + LINK_KNOWN_EXTRA if c != "util"], "links")
    df = _coerce(df, _LINK_NUMERIC)
    df["util"] = _compute_util(df) if len(df) else pd.Series(dtype=float)
    _coerce(df, [c for c in LINK_QOS_COLUMNS if c in df.columns])
    return ordered(df, LINK_COLUMNS + LINK_KNOWN_EXTRA + [c for c in LINK_QOS_COLUMNS if c in df.columns])


def flows_frame(flows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Flow records → the flows.csv frame: contract columns first, None → NaN, extra keys kept."""
    df = flows.copy() if isinstance(flows, pd.DataFrame) else pd.DataFrame(list(flows))
    df = _with_columns(df, FLOW_COLUMNS, "flows")
    df = _coerce(df, _FLOW_NUMERIC)
    return ordered(df, FLOW_COLUMNS)


def collectives_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, COLLECTIVE_COLUMNS, "collectives")
    df = _coerce(df, ["iteration", "bytes", "start_s", "end_s", "jct_ms"])
    return ordered(df, COLLECTIVE_COLUMNS)


def failures_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, FAILURE_COLUMNS, "failures")
    df = _coerce(df, ["event", "time_s", "at_s", "detected_s", "rerouted_s", "lost_packets", "affected_flows",
                      "dip_max"])
    return ordered(df, FAILURE_COLUMNS)


def sm_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, SM_COLUMNS, "sm")
    df = _coerce(df, ["sweep", "time_s", "detect_s", "compute_s", "entries", "install_s", "held_s", "switches"])
    return ordered(df, SM_COLUMNS)


def int_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, INT_COLUMNS, "int")
    df = _coerce(df, ["time_s", "report", "flow_id", "hop", "queue_id", "queue_bytes", "hop_latency_ns", "tx_bytes",
                      "link_rate_bps", "hop_time_s", "path_delay_ns", "exceeded", "ip_bytes", "probe"])
    return ordered(df, INT_COLUMNS)


def int_paths_frame(int_df: pd.DataFrame) -> pd.DataFrame:
    """int_paths.csv from int.csv: per path, its reports' path delays (the sum of their hop latencies)."""
    per = int_df.drop_duplicates("report")[["report", "path", "flow_id", "path_delay_ns"]] if len(int_df) else None
    if per is None or not len(per):
        return pd.DataFrame(columns=INT_PATH_COLUMNS)
    g = per.groupby("path", sort=True)
    d = g["path_delay_ns"]
    out = pd.DataFrame({"reports": g.size(), "flows": g["flow_id"].nunique(), "delay_p50_ns": d.quantile(0.5),
                        "delay_p99_ns": d.quantile(0.99), "delay_mean_ns": d.mean(), "delay_max_ns": d.max()})
    return ordered(out.reset_index(), INT_PATH_COLUMNS)


def cc_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, CC_COLUMNS, "cc")
    df = _coerce(df, ["time_s", "cwnd_bytes", "rate_bps"])
    return ordered(df, CC_COLUMNS)


def controller_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, CONTROLLER_COLUMNS, "controller")
    df = _coerce(df, ["time_s"])
    return ordered(df, CONTROLLER_COLUMNS)


def collective_signals_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, COLLECTIVE_SIGNAL_COLUMNS, "collective_signals")
    df = _coerce(df, ["time_s", "capacity_bps", "util", "queue", "ecn", "available_bps"])
    return ordered(df, COLLECTIVE_SIGNAL_COLUMNS)


def weights_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, WEIGHT_COLUMNS, "weights")
    df = _coerce(df, ["time_s", "weight", "signal"])
    return ordered(df, WEIGHT_COLUMNS)
