"""Time dilation (``time_dilation: N | auto``): a scenario written in real units — 400gbit links, µs timers, MB
buffers — is emulated N times slower: every rate it gives ÷ N, every time it gives × N, sizes (buffers, flows,
MTU) unchanged, so bandwidth-delay products and queue depths in bytes are the real ones. Only what the scenario
states is scaled: keys it leaves out (and keys a profile fills) keep the testbed's defaults, which are emulation
values (the DCQCN and CC defaults already follow the emulated link rate). Results keep emulated units and gain
real-unit columns (``*_real_*``: times ÷ N, rates × N; results/README.md).

``auto`` picks the smallest N from 1, 2, 5, 10, 20, 50, … at which the hosts' links, all at line rate, stay
within what this machine's engines emulate without the CPU guard firing (``PPS_BUDGET``, measured here).
Refused in one line: an emulated rate below ``MIN_RATE_BPS`` (the shapers' floor) and an emulated time below
1 µs (the kernel's qdisc and netem resolution), naming the key.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import math
import os
import platform
import re
from pathlib import Path

from .errors import TestbedError
from . import units
from .spec_types import Quantity

#: packets per second per core the traffic engines sustain with the fidelity guard quiet, when this machine has
#: no measurement of its own (a 2-core VM: 8 RoCE flows at 10 Mbit/s, 6.7k packets/s of 1,500 bytes, kept the
#: CPUs 58 % busy)
PPS_BUDGET = {"udp": 6000, "tcp": 6000, "roce": 3000, "rxe": 3000, "iperf3": 6000, "mpi": 6000}
#: where `testbed bench capacity` keeps what it measured, one file per machine, kernel and core count
BUDGET_DIR = Path(os.environ.get("FTB_CACHE_DIR", "/var/cache/fabric-testbed")) / "capacity"


def machine_key() -> str:
    """This machine, kernel and core count, as a file name (a measurement holds for them only)."""
    raw = f"{platform.node()}-{platform.release()}-{os.cpu_count() or 1}cpu"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def budget(engine: str) -> tuple[float, str]:
    """(packets/s per core ``engine`` sustains here, where that figure comes from): what `testbed bench capacity`
    measured on this machine and kernel, else the built-in ``PPS_BUDGET``."""
    try:
        got = json.loads((BUDGET_DIR / f"{machine_key()}.json").read_text())["engines"][engine]
        return float(got["pps_per_core"]), (f"measured by testbed bench capacity on {got['date']} "
                                            f"({got['note']})")
    except (OSError, ValueError, KeyError, TypeError):
        return float(PPS_BUDGET.get(engine, PPS_BUDGET["udp"])), ("built-in (testbed bench capacity has not "
                                                                   "measured this machine and kernel)")


def save_budget(engine: str, pps_per_core: float, note: str) -> Path:
    """Record what `testbed bench capacity` measured for ``engine`` here (atomically, beside the other engines')."""
    path = BUDGET_DIR / f"{machine_key()}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {"machine": machine_key(), "engines": {}}
    data.setdefault("engines", {})[engine] = {"pps_per_core": round(pps_per_core, 1), "note": note,
                                              "date": dt.date.today().isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return path
MIN_RATE_BPS = 100_000


class DilationError(TestbedError, ValueError):
    """A scenario that cannot be dilated; the message is one line naming the key."""


def nice_factors():
    """1, 2, 5, 10, 20, 50, … (the factors ``auto`` chooses from)."""
    k = 1
    while True:
        for m in (1, 2, 5):
            yield m * k
        k *= 10


def auto_factor(doc: dict, cores: int, per_core: float | None = None) -> int:
    """The smallest nice N at which every host NIC sending at line rate stays within the engine's budget,
    ``per_core`` packets/s per core (default: ``budget``'s) (``doc``: the scenario as written; its topology and
    traffic sections are read in real units)."""
    from .topology import build
    from .topology.spec import TopologySpec
    topo = TopologySpec.model_validate((doc or {}).get("topology") or {})
    traffic = (doc or {}).get("traffic")
    traffic = traffic if isinstance(traffic, dict) else {}     # not a mapping: the validation after says so
    try:
        pkt = int(traffic.get("packet_size") or topo.mtu)
    except (TypeError, ValueError):
        raise DilationError(f"traffic.packet_size: a whole number of bytes, got {traffic.get('packet_size')!r} "
                            f"(time_dilation auto reads it)") from None
    pps = len(build(topo).hosts) * topo.rails * topo.host_link.rate / (8 * pkt)
    if per_core is None:
        per_core = budget(traffic.get("engine", "udp"))[0]
    limit = per_core * max(1, cores)
    for n in nice_factors():
        if pps / n <= limit:
            return n
    raise AssertionError("unreachable")


def _kind(meta) -> str | None:
    return next((m.kind for m in meta if isinstance(m, Quantity)), None)


def dilate(doc: dict, model, n: int, skip: frozenset = frozenset()) -> tuple[dict, list[str]]:
    """``doc`` (the scenario as written, overrides and profile applied) with every rate it gives ÷ ``n`` and every
    time × ``n``, found by walking it beside the schema (``model``: the Scenario class); ``skip``: dotted keys a
    profile filled. Returns the new mapping and the dotted keys scaled."""
    from typing import Annotated, Literal, Union, get_args, get_origin
    from types import UnionType

    from pydantic import BaseModel
    out = copy.deepcopy(doc)
    scaled: list[str] = []

    def scale(value, kind: str, where: str):
        if isinstance(value, bool) or value is None:
            return value
        if kind == "rate":
            real = units.rate_bps(value)
            new = round(real / n)
            if new < MIN_RATE_BPS:
                raise DilationError(f"{where}: {units.fmt_rate(real)} ÷ time_dilation {n} = "
                                    f"{units.fmt_rate(new)}, below the {units.fmt_rate(MIN_RATE_BPS)} the shapers "
                                    f"keep accurate: use a smaller time_dilation")
            scaled.append(where)
            return f"{new}bit"
        real = units.time_ns(value)
        if real and real * n < 1000:
            raise DilationError(f"{where}: {real} ns × time_dilation {n} = {real * n} ns, below the kernel's "
                                f"1 µs timer resolution (qdiscs, netem): use a larger time_dilation")
        scaled.append(where)
        return f"{real * n}ns"

    def walk(ann, meta, value, where):
        """The value at ``where``, scaled where the schema says rate or time."""
        if where in skip:
            return value
        kind = _kind(meta)
        if kind is not None and not isinstance(value, (dict, list)):
            return scale(value, kind, where)
        origin = get_origin(ann)
        if origin is Annotated:
            base, *more = get_args(ann)
            return walk(base, list(more), value, where)
        if origin in (Union, UnionType):
            for arg in get_args(ann):
                if arg is type(None):
                    continue
                a_meta = list(get_args(arg)[1:]) if get_origin(arg) is Annotated else []
                a_base = get_args(arg)[0] if get_origin(arg) is Annotated else arg
                if get_origin(a_base) is Literal and value in get_args(a_base):
                    return value                   # a word such as `auto`: nothing to scale
                fits = ((isinstance(value, dict) and (get_origin(a_base) is dict or
                                                      (isinstance(a_base, type) and issubclass(a_base, BaseModel))))
                        or (isinstance(value, list) and get_origin(a_base) in (list, tuple))
                        or (not isinstance(value, (dict, list)) and _kind(a_meta) is not None))
                if fits:
                    return walk(a_base, a_meta, value, where)
            return value
        if origin in (list, tuple) and isinstance(value, list):
            args = get_args(ann)
            each = (lambda i: args[0]) if origin is list or (len(args) == 2 and args[1] is Ellipsis) else \
                (lambda i: args[i] if i < len(args) else None)
            return [walk(each(i), [], v, f"{where}.{i}") if each(i) is not None else v for i, v in enumerate(value)]
        if origin is dict and isinstance(value, dict):
            vt = get_args(ann)[1]
            return {k: walk(vt, [], v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, dict):
            fields = ann.model_fields
            return {k: (walk(fields[k].annotation, fields[k].metadata, v, f"{where}.{k}" if where else k)
                        if k in fields else v) for k, v in value.items()}
        return value

    tr = out.get("traffic")
    if isinstance(tr, dict) and isinstance(tr.get("cc_params"), dict):   # schema-less in the model: the CC's own
        from .workloads.roce.cc import UnknownCC, get_cc
        try:
            own = get_cc(str(tr.get("cc", "none"))).params_model
        except UnknownCC:
            own = None                                # the scenario's validation says so, in one line
        if own is not None:
            tr["cc_params"] = walk(own, [], tr["cc_params"], "traffic.cc_params")
    out = walk(model, [], out, "")
    return out, scaled


def real_columns(df, n: int, columns: dict):
    """Add the real-unit twin of each column present: ``columns`` maps name → (real name, "time" | "rate")."""
    for col, (name, kind) in columns.items():
        if col in df.columns:
            v = df[col].astype(float)
            df[name] = v / n if kind == "time" else v * n
    return df


FLOW_REAL = {"start_s": ("start_real_s", "time"), "end_s": ("end_real_s", "time"), "fct_s": ("fct_real_s", "time"),
             "ideal_fct_s": ("ideal_fct_real_s", "time"), "goodput_mbps": ("goodput_real_mbps", "rate")}
LINK_REAL = {"time_s": ("time_real_s", "time"), "rate_bps": ("rate_real_bps", "rate")}
COLLECTIVE_REAL = {"start_s": ("start_real_s", "time"), "end_s": ("end_real_s", "time"),
                   "jct_ms": ("jct_real_ms", "time")}
SUMMARY_REAL = {"duration_s": ("duration_real_s", "time"), "offered_mbps": ("offered_real_mbps", "rate"),
                "goodput_mbps": ("goodput_real_mbps", "rate"), "fct_p50_ms": ("fct_p50_real_ms", "time"),
                "fct_p99_ms": ("fct_p99_real_ms", "time"), "jct_mean_ms": ("jct_mean_real_ms", "time"),
                "jct_p99_ms": ("jct_p99_real_ms", "time"), "traffic_window_s": ("traffic_window_real_s", "time")}


def real_summary(row: dict, n: int) -> dict:
    """The summary row with the real-unit twins of its time and rate columns."""
    for col, (name, kind) in SUMMARY_REAL.items():
        v = row.get(col)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v)):
            row[name] = v / n if kind == "time" else v * n
        elif col in row:
            row[name] = math.nan
    return row
