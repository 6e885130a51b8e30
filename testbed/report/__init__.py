"""Run data → result files (the contract in results/README.md), one-row summary, plots.

The run orchestrator hands over plain Python (manifest dict, link samples, flow records, the CPU fidelity
guard, run metadata); :func:`write_run` turns it into ``manifest.json``, ``links.csv``, ``flows.csv``,
``summary.csv`` and PNG plots. :func:`report` recomputes the summary and plots of an existing result
directory from its files alone, and :func:`sweep_table` / :func:`write_sweep` join the summaries of several
runs into one comparison table.

Every file is written atomically (a temporary file in the same directory, fsync, ``os.replace``), so a crash
leaves either the old file or the new one, never half a file. ``manifest.json`` is written last: its
``files`` list names what was written.

Plots use matplotlib's Agg canvas directly (no pyplot, no global backend switch), so this module is safe to
import from the CLI and from tests without a display.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "ReportError",
    "LINK_COLUMNS",
    "FLOW_COLUMNS",
    "SUMMARY_COLUMNS",
    "SUMMARY_EXTRA_COLUMNS",
    "PLOT_FILES",
    "links_frame",
    "flows_frame",
    "summarize",
    "plots",
    "write_run",
    "report",
    "sweep_table",
    "write_sweep",
]


class ReportError(Exception):
    """A result-directory problem, already phrased for the user (one line, path first)."""


# --- the contract: column names and order --------------------------------------------------------------

#: links.csv: these first, in this order; then LINK_KNOWN_EXTRA, then any other key seen, in first-seen order.
LINK_COLUMNS = ["time_s", "switch", "port", "peer", "bytes", "packets", "util"]
LINK_KNOWN_EXTRA = ["direction", "role", "rate_bps", "interval_s"]
#: links.csv congestion columns (issue 3), kept in this order after LINK_KNOWN_EXTRA when present.
LINK_QOS_COLUMNS = ["queue_bytes_max", "queue_bytes_mean", "ecn_marks", "drops", "pause_tx", "pause_rx",
                    "paused_s"]
#: flows.csv: these first, in this order; then any other key seen, in first-seen order.
FLOW_COLUMNS = ["flow_id", "src", "dst", "sport", "dport", "proto", "bytes", "start_s", "end_s", "fct_s",
                "goodput_mbps", "paths_used"]
#: summary.csv: these first, in this order.
SUMMARY_COLUMNS = ["run_id", "scenario", "load_balancing", "seed", "duration_s", "offered_mbps", "goodput_mbps",
                   "mean_uplink_util", "max_uplink_util", "uplink_imbalance", "fct_p50_ms", "fct_p99_ms",
                   "cpu_bound"]
#: summary.csv: always present after SUMMARY_COLUMNS, in this order; extra scalar meta keys follow.
SUMMARY_EXTRA_COLUMNS = ["flows", "flows_completed", "fct_mean_ms", "fct_max_ms", "lost_packets", "uplinks",
                         "uplink_tx_bytes", "cpu_busy_mean", "cpu_busy_max",
                         "jct_mean_ms", "jct_p99_ms", "retransmits", "ooo_packets", "cnps",
                         "drops", "ecn_marks", "pause_frames", "paused_s_total", "queue_p99_bytes"]
#: collectives.csv (runs with collective jobs): one row per job iteration.
COLLECTIVE_COLUMNS = ["job", "iteration", "op", "bytes", "start_s", "end_s", "jct_ms"]

_META_KEYS = SUMMARY_COLUMNS[:6]
_LINK_NUMERIC = ["time_s", "bytes", "packets", "util", "rate_bps", "interval_s"]
_FLOW_NUMERIC = ["sport", "dport", "bytes", "start_s", "end_s", "fct_s", "goodput_mbps", "paths_used"]
_LINK_STR = ["switch", "port", "peer", "direction", "role"]
_FLOW_STR = ["src", "dst", "proto"]

MANIFEST = "manifest.json"
LINKS_CSV = "links.csv"
FLOWS_CSV = "flows.csv"
SUMMARY_CSV = "summary.csv"
COLLECTIVES_CSV = "collectives.csv"
SWEEP_CSV = "sweep.csv"
SWEEP_PNG = "sweep.png"
#: plot name → file name.
PLOT_FILES = {"uplink_util": "uplink_util.png", "uplink_bytes": "uplink_bytes.png", "fct_cdf": "fct_cdf.png"}
_RESULT_FILES = [MANIFEST, LINKS_CSV, FLOWS_CSV, SUMMARY_CSV, COLLECTIVES_CSV, *PLOT_FILES.values()]
#: manifest key under which write_run stores the summary inputs, so `report` can recompute the same row.
_MANIFEST_INPUTS = "report_inputs"


# --- atomic writes --------------------------------------------------------------------------------------

def _atomic_write(path: Path, write: Callable[[Any], None], *, binary: bool = False) -> Path:
    """Write `path` via a temp file in the same directory + fsync + os.replace. `write(fh)` fills the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if binary:
            fh = os.fdopen(fd, "wb")
        else:
            fh = os.fdopen(fd, "w", encoding="utf-8", newline="")
        with fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are read by other users (runs are often root)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_csv(path: Path, df: pd.DataFrame) -> Path:
    # NaN/None are written as empty cells; floats use repr precision, so a re-read gives the same values.
    return _atomic_write(path, lambda fh: df.to_csv(fh, index=False, na_rep="", lineterminator="\n"))


def _jsonable(obj: Any) -> Any:
    """Plain JSON: NaN/inf → null, numpy scalars → Python, paths/sets/other objects → str/list."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if hasattr(obj, "model_dump"):  # pydantic models (the resolved scenario)
        return _jsonable(obj.model_dump(mode="json"))
    return str(obj)


def _write_json(path: Path, obj: Any) -> Path:
    text = json.dumps(_jsonable(obj), indent=2, sort_keys=False, allow_nan=False) + "\n"
    return _atomic_write(path, lambda fh: fh.write(text))


# --- frames ---------------------------------------------------------------------------------------------

def _ordered(df: pd.DataFrame, first: Sequence[str]) -> pd.DataFrame:
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
    return _ordered(df, LINK_COLUMNS + LINK_KNOWN_EXTRA + [c for c in LINK_QOS_COLUMNS if c in df.columns])


def flows_frame(flows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Flow records → the flows.csv frame: contract columns first, None → NaN, extra keys kept."""
    df = flows.copy() if isinstance(flows, pd.DataFrame) else pd.DataFrame(list(flows))
    df = _with_columns(df, FLOW_COLUMNS, "flows")
    df = _coerce(df, _FLOW_NUMERIC)
    return _ordered(df, FLOW_COLUMNS)


# --- summary --------------------------------------------------------------------------------------------

def _num(x: Any) -> Any:
    """numpy scalar → Python scalar (so the summary row is plain Python)."""
    return x.item() if isinstance(x, np.generic) else x


def _uplinks(links_df: pd.DataFrame) -> pd.DataFrame:
    """Per uplink (leaf, port) of the leaves that sent traffic: tx bytes, average util over the run."""
    if links_df is None or not len(links_df):
        return pd.DataFrame(columns=["switch", "port", "tx_bytes", "util"])
    up = links_df[(links_df["role"] == "up") & (links_df["direction"] == "tx")].copy()
    if not len(up):
        return pd.DataFrame(columns=["switch", "port", "tx_bytes", "util"])
    up["_bits"] = up["bytes"].astype(float) * 8.0
    up["_cap"] = up["interval_s"].astype(float) * up["rate_bps"].astype(float)
    g = up.groupby(["switch", "port"], sort=True, dropna=False).agg(
        tx_bytes=("bytes", "sum"), _bits=("_bits", "sum"), _cap=("_cap", "sum")).reset_index()
    g["util"] = (g["_bits"] / g["_cap"]).where(g["_cap"] > 0)
    sent = g.groupby("switch")["tx_bytes"].transform("sum") > 0
    return g.loc[sent, ["switch", "port", "tx_bytes", "util"]].reset_index(drop=True)


def collectives_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df = _with_columns(df, COLLECTIVE_COLUMNS, "collectives")
    df = _coerce(df, ["iteration", "bytes", "start_s", "end_s", "jct_ms"])
    return _ordered(df, COLLECTIVE_COLUMNS)


def _col_sum(df: pd.DataFrame, col: str) -> Any:
    if col in df.columns and df[col].notna().any():
        return _num(pd.to_numeric(df[col], errors="coerce").sum())
    return math.nan


def summarize(links_df: pd.DataFrame, flows_df: pd.DataFrame, cpu: Mapping[str, Any] | None,
              meta: Mapping[str, Any], collectives_df: pd.DataFrame | None = None) -> dict:
    """The one summary row (see results/README.md for every definition). Plain Python values, NaN if undefined."""
    cpu = dict(cpu or {})
    meta = dict(meta or {})
    links_df = links_frame(links_df if links_df is not None else [])
    flows_df = flows_frame(flows_df if flows_df is not None else [])
    row: dict[str, Any] = {k: _num(meta.get(k)) for k in _META_KEYS}

    duration = pd.to_numeric(pd.Series([meta.get("duration_s")]), errors="coerce").iloc[0]
    total_bytes = float(flows_df["bytes"].sum()) if len(flows_df) else 0.0
    row["goodput_mbps"] = (total_bytes * 8.0 / float(duration) / 1e6
                           if pd.notna(duration) and duration > 0 else math.nan)

    up = _uplinks(links_df)
    util = up["util"].astype(float).dropna()
    row["mean_uplink_util"] = float(util.mean()) if len(util) else math.nan
    row["max_uplink_util"] = float(util.max()) if len(util) else math.nan
    tx = up["tx_bytes"].astype(float)
    row["uplink_imbalance"] = float(tx.max() / tx.mean()) if len(tx) and tx.mean() > 0 else math.nan

    fct_ms = flows_df["fct_s"].astype(float).dropna() * 1e3 if len(flows_df) else pd.Series(dtype=float)
    row["fct_p50_ms"] = float(fct_ms.quantile(0.50)) if len(fct_ms) else math.nan
    row["fct_p99_ms"] = float(fct_ms.quantile(0.99)) if len(fct_ms) else math.nan
    row["cpu_bound"] = bool(cpu["cpu_bound"]) if cpu.get("cpu_bound") is not None else None

    row["flows"] = int(len(flows_df))
    row["flows_completed"] = int(len(fct_ms))
    row["fct_mean_ms"] = float(fct_ms.mean()) if len(fct_ms) else math.nan
    row["fct_max_ms"] = float(fct_ms.max()) if len(fct_ms) else math.nan
    if "lost" in flows_df.columns and flows_df["lost"].notna().any():
        row["lost_packets"] = _num(pd.to_numeric(flows_df["lost"], errors="coerce").sum())
    else:
        row["lost_packets"] = math.nan
    row["uplinks"] = int(len(up))
    row["uplink_tx_bytes"] = _num(up["tx_bytes"].sum()) if len(up) else 0
    for k in ("cpu_busy_mean", "cpu_busy_max"):
        v = cpu.get(k)
        row[k] = float(v) if v is not None else math.nan
    jct = (pd.to_numeric(collectives_df["jct_ms"], errors="coerce").dropna()
           if collectives_df is not None and "jct_ms" in collectives_df.columns else pd.Series(dtype=float))
    row["jct_mean_ms"] = float(jct.mean()) if len(jct) else math.nan
    row["jct_p99_ms"] = float(jct.quantile(0.99)) if len(jct) else math.nan
    row["retransmits"] = _col_sum(flows_df, "retrans")
    row["ooo_packets"] = _col_sum(flows_df, "reordered")
    row["cnps"] = _col_sum(flows_df, "cnps")
    def col_sum(c):
        return _num(pd.to_numeric(links_df[c], errors="coerce").fillna(0).sum()) if c in links_df.columns else 0
    tx_rows = links_df[links_df["direction"] == "tx"] if "direction" in links_df.columns else links_df.iloc[:0]
    row["drops"] = (_num(pd.to_numeric(tx_rows["drops"], errors="coerce").fillna(0).sum())
                    if "drops" in tx_rows.columns else 0) + col_sum("qdisc_drops")
    row["ecn_marks"] = col_sum("ecn_marks")
    row["pause_frames"] = col_sum("pause_tx")
    row["paused_s_total"] = float(col_sum("paused_s"))
    if "queue_bytes_max" in links_df.columns and len(links_df):
        q = pd.to_numeric(links_df.loc[links_df["direction"] == "tx", "queue_bytes_max"], errors="coerce").dropna()
        q = q[q > 0]
        row["queue_p99_bytes"] = float(q.quantile(0.99)) if len(q) else 0.0
    else:
        row["queue_p99_bytes"] = math.nan
    for k, v in meta.items():  # extra scalar metadata (e.g. topology name) after the contract columns
        if k not in row and (v is None or isinstance(v, (str, int, float, bool, np.generic))):
            row[k] = _num(v)
    return row


# --- plots ----------------------------------------------------------------------------------------------

def _figure(w: float = 9.0, h: float = 5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    return _atomic_write(path, lambda fh: fig.savefig(fh, format="png", metadata={"Software": None}),
                         binary=True)


def plots(outdir: str | os.PathLike, links_df: pd.DataFrame, flows_df: pd.DataFrame) -> list[str]:
    """Write the PNG plots that have data; returns the file names written (skipped plots are absent)."""
    outdir = Path(outdir)
    links_df = links_frame(links_df if links_df is not None else [])
    flows_df = flows_frame(flows_df if flows_df is not None else [])
    written: list[str] = []
    up = _uplinks(links_df)
    keys = set(zip(up["switch"], up["port"]))

    # (1) uplink utilisation over time, one line per uplink of the leaves that sent traffic
    series = links_df[(links_df["role"] == "up") & (links_df["direction"] == "tx")] if len(links_df) else links_df
    if len(keys) and len(series):
        fig = _figure()
        ax = fig.add_subplot()
        n = 0
        for (sw, port), g in series.groupby(["switch", "port"], sort=True):
            if (sw, port) not in keys:
                continue
            g = g.sort_values("time_s")
            ax.plot(g["time_s"], g["util"] * 100.0, lw=1.2, marker="." if len(g) < 40 else None,
                    label=f"{sw}→{port}")
            n += 1
        ax.axhline(100.0, color="grey", lw=0.8, ls="--")
        ax.set_title("Leaf uplink utilisation over time (tx, leaf → spine)")
        ax.set_xlabel("time since run start (s)")
        ax.set_ylabel("utilisation (% of link rate)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if n <= 16:
            ax.legend(fontsize="small", ncol=2 if n > 8 else 1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        _save(fig, outdir / PLOT_FILES["uplink_util"])
        written.append(PLOT_FILES["uplink_util"])

    # (2) bytes per uplink: ECMP collisions show as tall and empty bars, spraying as an even row
    if len(up) and float(up["tx_bytes"].sum()) > 0:
        fig = _figure(max(6.0, min(24.0, 0.35 * len(up) + 3.0)), 5.0)
        ax = fig.add_subplot()
        leaves = list(dict.fromkeys(up["switch"]))
        colors = {leaf: f"C{i % 10}" for i, leaf in enumerate(leaves)}
        mb = up["tx_bytes"].astype(float) / 1e6
        ax.bar(range(len(up)), mb, color=[colors[s] for s in up["switch"]])
        ax.set_xticks(range(len(up)), [f"{s}→{p}" for s, p in zip(up["switch"], up["port"])],
                      rotation=90 if len(up) > 8 else 0, fontsize="small")
        mean = float(mb.mean())
        ax.axhline(mean, color="black", lw=0.9, ls="--", label=f"mean {mean:.3g} MB")
        imb = float(mb.max() / mb.mean()) if mean > 0 else math.nan
        ax.set_title(f"Bytes sent per leaf uplink (imbalance max/mean = {imb:.2f})")
        ax.set_xlabel("leaf uplink (leaf → spine)")
        ax.set_ylabel("bytes sent (MB, 10^6 bytes)")
        ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
        _save(fig, outdir / PLOT_FILES["uplink_bytes"])
        written.append(PLOT_FILES["uplink_bytes"])

    # (3) CDF of flow completion times (completed flows only)
    fct_ms = np.sort(flows_df["fct_s"].astype(float).dropna().to_numpy() * 1e3) if len(flows_df) else np.array([])
    if len(fct_ms):
        fig = _figure(7.0, 5.0)
        ax = fig.add_subplot()
        y = np.arange(1, len(fct_ms) + 1) / len(fct_ms)
        ax.step(np.concatenate([[fct_ms[0]], fct_ms]), np.concatenate([[0.0], y]), where="post")
        p50, p99 = np.quantile(fct_ms, [0.5, 0.99])
        ax.axvline(p50, color="C1", ls="--", lw=0.9, label=f"p50 {p50:.3g} ms")
        ax.axvline(p99, color="C3", ls="--", lw=0.9, label=f"p99 {p99:.3g} ms")
        ax.set_title(f"Flow completion time CDF ({len(fct_ms)} of {len(flows_df)} flows completed)")
        ax.set_xlabel("flow completion time (ms)")
        ax.set_ylabel("fraction of completed flows")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
        _save(fig, outdir / PLOT_FILES["fct_cdf"])
        written.append(PLOT_FILES["fct_cdf"])
    return written


# --- run directory --------------------------------------------------------------------------------------

def _summary_frame(row: Mapping[str, Any]) -> pd.DataFrame:
    return _ordered(pd.DataFrame([dict(row)]), SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS)


def _present(outdir: Path) -> list[str]:
    return [f for f in _RESULT_FILES if (outdir / f).is_file()]


def write_run(outdir: str | os.PathLike, manifest: Mapping[str, Any], links: Iterable[Mapping[str, Any]],
              flows: Iterable[Mapping[str, Any]], cpu: Mapping[str, Any] | None,
              meta: Mapping[str, Any], collectives: Iterable[Mapping[str, Any]] | None = None) -> dict:
    """Write a run's result directory (created if needed) and return its summary row.

    Order: links.csv, flows.csv, summary.csv, plots, then manifest.json (with `files` and the summary inputs
    under `report_inputs`), so a manifest always describes files that exist.
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    links_df = links_frame(links)
    flows_df = flows_frame(flows)
    _write_csv(outdir / LINKS_CSV, links_df)
    _write_csv(outdir / FLOWS_CSV, flows_df)
    coll_df = None
    if collectives is not None:
        coll_df = collectives_frame(collectives)
        _write_csv(outdir / COLLECTIVES_CSV, coll_df)
    row = summarize(links_df, flows_df, cpu, meta, coll_df)
    _write_csv(outdir / SUMMARY_CSV, _summary_frame(row))
    plots(outdir, links_df, flows_df)
    m = dict(manifest or {})
    m[_MANIFEST_INPUTS] = {"meta": dict(meta or {}), "cpu": dict(cpu or {})}
    m["files"] = sorted(set(_present(outdir)) | {MANIFEST})
    _write_json(outdir / MANIFEST, m)
    return row


def _read_csv(path: Path) -> pd.DataFrame:
    # Only empty cells are missing values: a node called "NA" or "null" stays a name.
    try:
        return pd.read_csv(path, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None


def _read_manifest(d: Path) -> dict | None:
    p = d / MANIFEST
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(m, dict):
        raise ReportError(f"{p}: expected a JSON object")
    return m


def _inputs(d: Path, manifest: dict | None) -> tuple[dict, dict]:
    """(meta, cpu) for the summary: from the manifest's report_inputs, else the old summary.csv, else top-level."""
    if manifest and isinstance(manifest.get(_MANIFEST_INPUTS), dict):
        inp = manifest[_MANIFEST_INPUTS]
        return dict(inp.get("meta") or {}), dict(inp.get("cpu") or {})
    if (d / SUMMARY_CSV).is_file():
        old = _read_csv(d / SUMMARY_CSV)
        if len(old):
            r = {k: _num(v) for k, v in old.iloc[0].items()}
            meta = {k: r.get(k) for k in _META_KEYS}
            cpu = {"cpu_bound": r.get("cpu_bound"), "cpu_busy_mean": r.get("cpu_busy_mean"),
                   "cpu_busy_max": r.get("cpu_busy_max")}
            return meta, {k: v for k, v in cpu.items() if v is not None and not _isnan(v)}
    if manifest:
        meta = {k: manifest.get(k) for k in _META_KEYS}
        cpu = manifest.get("cpu") if isinstance(manifest.get("cpu"), dict) else {}
        return meta, dict(cpu)
    raise ReportError(f"{d}: not a result directory (no {MANIFEST} or {SUMMARY_CSV} to take the run metadata from)")


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _load(d: str | os.PathLike) -> tuple[Path, dict | None, pd.DataFrame, pd.DataFrame, dict, dict]:
    d = Path(d)
    if not d.is_dir():
        raise ReportError(f"{d}: no such directory")
    missing = [f for f in (LINKS_CSV, FLOWS_CSV) if not (d / f).is_file()]
    if missing:
        raise ReportError(f"{d}: not a result directory (missing {', '.join(missing)})")
    manifest = _read_manifest(d)
    links_df = links_frame(_read_csv(d / LINKS_CSV))
    flows_df = flows_frame(_read_csv(d / FLOWS_CSV))
    meta, cpu = _inputs(d, manifest)
    return d, manifest, links_df, flows_df, meta, cpu


def report(outdir: str | os.PathLike) -> dict:
    """Recompute summary.csv and the plots of an existing result directory from its files; returns the row."""
    d, manifest, links_df, flows_df, meta, cpu = _load(outdir)
    coll_df = collectives_frame(_read_csv(d / COLLECTIVES_CSV)) if (d / COLLECTIVES_CSV).is_file() else None
    row = summarize(links_df, flows_df, cpu, meta, coll_df)
    _write_csv(d / SUMMARY_CSV, _summary_frame(row))
    plots(d, links_df, flows_df)
    if manifest is not None:
        manifest["files"] = sorted(set(_present(d)) | {MANIFEST})
        _write_json(d / MANIFEST, manifest)
    return row


# --- sweeps ---------------------------------------------------------------------------------------------

def sweep_table(dirs: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row per run directory (its summary.csv; recomputed in memory if absent), plus a `run_dir` column."""
    rows = []
    for d in dirs:
        d = Path(d)
        if (d / SUMMARY_CSV).is_file():
            s = _read_csv(d / SUMMARY_CSV)
            if len(s) != 1:
                raise ReportError(f"{d / SUMMARY_CSV}: expected exactly one row, found {len(s)}")
            row = {k: _num(v) for k, v in s.iloc[0].items()}
        else:
            _, _, links_df, flows_df, meta, cpu = _load(d)
            row = summarize(links_df, flows_df, cpu, meta)
        row["run_dir"] = str(d)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS + ["run_dir"])
    df = pd.DataFrame(rows)
    for c in SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    return _ordered(df, SUMMARY_COLUMNS + SUMMARY_EXTRA_COLUMNS).reset_index(drop=True)


def write_sweep(outdir: str | os.PathLike, df: pd.DataFrame) -> list[str]:
    """Write sweep.csv and sweep.png (goodput and uplink imbalance per run); returns the file names written."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    _write_csv(outdir / SWEEP_CSV, df)
    written = [SWEEP_CSV]
    if len(df) and {"goodput_mbps", "uplink_imbalance"} <= set(df.columns):
        labels = []
        for i, r in df.reset_index(drop=True).iterrows():
            rid = r.get("run_id")
            rid = str(rid) if rid is not None and not _isnan(rid) else f"run {i}"
            lb = r.get("load_balancing")
            labels.append(f"{rid}\n{lb}" if isinstance(lb, str) and lb else rid)
        x = np.arange(len(df))
        fig = _figure(max(7.0, min(24.0, 0.6 * len(df) + 4.0)), 7.0)
        ax1, ax2 = fig.subplots(2, 1, sharex=True)
        cb = df["cpu_bound"] if "cpu_bound" in df.columns else pd.Series([False] * len(df))
        colors = ["C3" if str(v) == "True" else "C0" for v in cb]
        ax1.bar(x, pd.to_numeric(df["goodput_mbps"], errors="coerce"), color=colors)
        ax1.set_ylabel("goodput (Mbit/s)")
        ax1.set_title("Goodput and uplink imbalance by run (red = CPU-bound run, not trustworthy)")
        ax1.grid(True, axis="y", alpha=0.3)
        ax2.bar(x, pd.to_numeric(df["uplink_imbalance"], errors="coerce"), color=colors)
        ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax2.set_ylabel("uplink imbalance (max/mean bytes, 1 = even)")
        ax2.set_xlabel("run")
        ax2.set_xticks(x, labels, rotation=90 if len(df) > 6 else 0, fontsize="small")
        ax2.grid(True, axis="y", alpha=0.3)
        _save(fig, outdir / SWEEP_PNG)
        written.append(SWEEP_PNG)
    return written
