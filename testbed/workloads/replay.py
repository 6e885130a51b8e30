"""Schedules: transfers that start at a time, or when the transfers they depend on have completed. A replayed
file (``traffic.replay: FILE``: a communication schedule exported from a training run, NCCL's algorithm or a
simulator such as ASTRA-sim or SimAI) and the built-in collective jobs (``from_collectives``) both run as one
(``play``).

The file is CSV with a header row, or JSON (a list of objects, or ``{"transfers": [...]}``); one transfer each:
  id      unique name (text or number)
  src     sending host (h0, h1, …)
  dst     receiving host
  bytes   payload bytes: an integer or a size such as 256KB
  start   earliest start after the traffic's t0: seconds or a time such as 5ms (default 0)
  deps    the ids it waits for (CSV: separated by spaces or ';'; JSON: a list): it starts once each of them has
          completed — its last byte arrived at its receiver — and ``start`` has passed
  delay   wait this long after its last dependency completed (compute between phases; default 0)
  tag     the operation it belongs to: one collectives.csv row per tag (default ``replay``)
Every transfer becomes one flow per rail and QP (collectives.TransferFlows). ``from_collectives`` writes the
scenario's own collective jobs in this format, step k + 1 of a job waiting for every transfer of step k, and
that is how the built-in collectives run too (``testbed schedule`` exports it). With ``pattern: poisson``
beside a schedule or collective jobs, the open-loop flows run in the same run as background
(``with_background``). Everything but ``play`` is pure; ``play`` runs the flows in one ``workloads.run`` (the
agents start the gated flows themselves, gating.py).
"""
from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TestbedError
from .. import units

COLUMNS = ("id", "src", "dst", "bytes", "start", "deps", "delay", "tag")
DEFAULT_TAG = "replay"


class ReplayError(TestbedError, ValueError):
    """A schedule file that cannot be replayed; the message is one line naming the file and the row."""


@dataclass(frozen=True)
class Transfer:
    id: str
    src: str
    dst: str
    bytes: int
    start_s: float = 0.0
    deps: tuple[str, ...] = ()
    delay_s: float = 0.0
    tag: str = DEFAULT_TAG


def _seconds(v, what: str) -> float:
    if v is None or v == "":
        return 0.0
    ns = units.time_ns(float(v) if isinstance(v, str) and re.fullmatch(r"\s*[0-9.eE+-]+\s*", v) else v)
    if ns < 0:
        raise ValueError(f"{what} must be ≥ 0, got {v!r}")
    return ns / 1e9


def _transfer(d: dict, where: str) -> Transfer:
    unknown = sorted(set(d) - set(COLUMNS))
    if unknown:
        raise ReplayError(f"{where}: unknown column {unknown[0]!r} (columns: {', '.join(COLUMNS)})")
    for key in ("id", "src", "dst", "bytes"):
        if d.get(key) in (None, ""):
            raise ReplayError(f"{where}: {key} is missing")
    deps = d.get("deps") or ()
    if isinstance(deps, str):
        deps = [x for x in re.split(r"[\s;]+", deps) if x]
    elif not isinstance(deps, (list, tuple)):
        raise ReplayError(f"{where}: deps must be a list of ids, got {deps!r}")
    try:
        nbytes = units.size_bytes(int(d["bytes"]) if str(d["bytes"]).strip().isdigit() else d["bytes"])
        if nbytes <= 0:
            raise ValueError(f"bytes must be > 0, got {d['bytes']!r}")
        return Transfer(id=str(d["id"]).strip(), src=str(d["src"]).strip(), dst=str(d["dst"]).strip(),
                        bytes=nbytes, start_s=_seconds(d.get("start"), "start"),
                        deps=tuple(str(x).strip() for x in deps), delay_s=_seconds(d.get("delay"), "delay"),
                        tag=str(d.get("tag") or DEFAULT_TAG).strip())
    except ValueError as e:
        raise ReplayError(f"{where}: {e}") from None


def read(path: str | Path) -> list[Transfer]:
    """The transfers of a schedule file (CSV or JSON, by content), in file order."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ReplayError(f"{path}: cannot read it ({e.strerror})") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ReplayError(f"{path}: not valid JSON ({e})") from None
        rows = doc.get("transfers") if isinstance(doc, dict) else doc
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ReplayError(f"{path}: expected a list of transfer objects (or {{\"transfers\": [...]}})")
        out = [_transfer(r, f"{path}, transfer {i + 1}") for i, r in enumerate(rows)]
    else:
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None:
            raise ReplayError(f"{path}: empty (expected a header row: {','.join(COLUMNS)})")
        reader.fieldnames = [c.strip() for c in reader.fieldnames]
        out = []
        for row in reader:
            if None in row:
                raise ReplayError(f"{path}, line {reader.line_num}: more fields than the header has")
            out.append(_transfer({k: v for k, v in row.items() if v not in (None, "")},
                                 f"{path}, line {reader.line_num}"))
    if not out:
        raise ReplayError(f"{path}: no transfers")
    return out


def dilated(transfers: list[Transfer], n: int) -> list[Transfer]:
    """A schedule written in real units, its start times and delays × ``n`` (time_dilation; bytes unchanged)."""
    if n == 1:
        return transfers
    from dataclasses import replace
    return [replace(t, start_s=t.start_s * n, delay_s=t.delay_s * n) for t in transfers]


def check(transfers: list[Transfer], hosts: set[str], where: str = "replay") -> None:
    """Hosts exist, ids are unique, every dependency names a transfer, and nothing waits in a cycle."""
    from .gating import cycle_of
    seen: dict[str, int] = {}
    for i, t in enumerate(transfers):
        for end in (t.src, t.dst):
            if end not in hosts:
                raise ReplayError(f"{where}: transfer {t.id!r}: no host {end!r} in this topology "
                                  f"({len(hosts)} hosts h0..h{len(hosts) - 1})")
        if t.src == t.dst:
            raise ReplayError(f"{where}: transfer {t.id!r} goes from {t.src} to itself")
        if t.id in seen:
            raise ReplayError(f"{where}: transfer id {t.id!r} is used twice")
        seen[t.id] = i
    edges = []
    for t in transfers:
        for d in t.deps:
            if d not in seen:
                raise ReplayError(f"{where}: transfer {t.id!r} depends on {d!r}, which is not in the file")
            edges.append((d, t.id))
    cycle = cycle_of(edges, seen)
    if cycle:
        raise ReplayError(f"{where}: transfers wait for each other in a cycle: {' → '.join(cycle)}")


def write(path: str | Path, transfers: list[Transfer]) -> None:
    """The schedule as CSV, or as JSON when ``path`` ends in .json."""
    path = Path(path)
    rows = [{"id": t.id, "src": t.src, "dst": t.dst, "bytes": t.bytes, "start": t.start_s or "",
             "deps": " ".join(t.deps), "delay": t.delay_s or "", "tag": t.tag} for t in transfers]
    if path.suffix == ".json":
        for r, t in zip(rows, transfers):
            r.update(start=t.start_s, deps=list(t.deps), delay=t.delay_s)
        path.write_text(json.dumps({"transfers": rows}, indent=1) + "\n")
        return
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue())


@dataclass(frozen=True)
class Origin:
    """The collective step an exported transfer belongs to (flows.csv ``job``, ``iteration``, ``step``)."""
    job: str
    iteration: int
    op: str
    step: int
    variant: int = 0          # the ring order it belongs to (traffic.collective.adapt.rings; 0: the job's own)


def from_collectives(traffic, topo, seed: int, origins: dict | None = None) -> list[Transfer]:
    """The scenario's collective jobs as a schedule: step k + 1 of a job iteration waits for every transfer of
    step k, an iteration's first step for the previous iteration's last (plus the job's compute ``gap``);
    tag = the job (``job.iteration`` when it repeats). ``origins`` (if given) gets transfer id → Origin."""
    from .collectives import schedule
    out: list[Transfer] = []
    origins = {} if origins is None else origins
    prev: dict[str, tuple[str, ...]] = {}
    iterations = {(job.name or f"job{i}"): job.iterations for i, job in enumerate(traffic.job_list())}
    for rnd in schedule(traffic, topo, seed):
        for s in rnd:
            tag = s.job if iterations.get(s.job, 1) == 1 else f"{s.job}.{s.iteration}"
            ids = []
            for i, (src, dst, nbytes) in enumerate(s.pairs):
                v = s.variants[i] if s.variants else 0
                tid = f"{s.job}.{s.iteration}.{s.index}.{src}-{dst}" + (f".r{v}" if v else "")
                out.append(Transfer(tid, src, dst, nbytes, deps=prev.get(s.job, ()), delay_s=s.gap_s, tag=tag))
                origins[tid] = Origin(s.job, s.iteration, s.op, s.index, v)
                ids.append(tid)
            prev[s.job] = tuple(ids)
    return out


def to_flows(transfers: list[Transfer], make) -> tuple[list, list[Transfer]]:
    """The flows of every transfer (``make``: collectives.TransferFlows) and, per flow, its transfer; a flow
    waits for every flow of the transfers its transfer depends on."""
    flows, owner, ids_of = [], [], {}
    for t in transfers:
        mine = make(t.src, t.dst, t.bytes, t.start_s)
        ids_of[t.id] = [f.flow_id for f in mine]
        flows += mine
        owner += [t] * len(mine)
    for f, t in zip(flows, owner):
        if t.deps:
            f.after = sorted(fid for d in t.deps for fid in ids_of[d])
            f.after_delay_s = t.delay_s
    return flows, owner


def flows_of(transfers: list[Transfer], traffic, topo, seed: int, prio=None,
             origins: dict | None = None) -> tuple[list, list[Transfer]]:
    """A schedule's flows (to_flows over collectives.TransferFlows). With ``traffic.collective.adapt`` each
    connection's QPs keep their source ports, and every flow of a collective operation names it (``Flow.adapt``:
    "job.iteration") so that its host asks the collective helper how to send it."""
    from .collectives import TransferFlows
    adapt = traffic.collective.adapt is not None
    flows, owner = to_flows(transfers, TransferFlows(traffic, topo, seed, prio, persistent=adapt))
    if adapt:
        for f, t in zip(flows, owner):
            o = (origins or {}).get(t.id)
            if o is not None:
                f.adapt, f.variant = f"{o.job}.{o.iteration}", o.variant
    return flows, owner


def schedule_flows(traffic, topo, seed: int) -> list:
    """A schedule's flows as its run makes them (ids, pairs, rails, QPs; times undilated): what the fabric
    controller plans before they start."""
    origins: dict = {}
    transfers = read(traffic.replay) if traffic.replay is not None else from_collectives(traffic, topo, seed, origins)
    return flows_of(transfers, traffic, topo, seed, origins=origins)[0]


def with_background(flows: list, owner: list, traffic, topo, seed: int, duration_s: float) -> None:
    """Add the pattern's open-loop flows (``pattern: poisson``) to a schedule's flows as background: numbered
    after them, a source port a schedule flow of the same host already uses moved to the next free one; their
    owner is None."""
    from .flows import SPORT_MAX, plan
    taken = {(f.src, p) for f in flows for p in f.source_ports()}
    first = len(flows)
    for i, f in enumerate(plan(traffic, topo, seed, duration_s)):
        f.flow_id = first + i
        while any((f.src, p) in taken for p in f.source_ports()):
            f.sport = traffic.sport_base + (f.sport + 1 - traffic.sport_base) % (SPORT_MAX + 1 - traffic.sport_base)
        taken.update((f.src, p) for p in f.source_ports())
        flows.append(f)
        owner.append(None)


def op_rows(owner: list, results, origins: dict | None = None) -> list[dict]:
    """collectives.csv rows: per tag, its bytes, first start, last end and ``jct_ms`` = last end − first start
    (the whole span, waits for dependencies included) when every transfer completed. ``origins``: transfer id →
    Origin of exported collective jobs (then job, iteration and op are the job's; else job = tag, iteration 0,
    op ``replay``); background flows (owner None) have no row."""
    tags: dict[str, dict] = {}
    for t, r in zip(owner, results):
        if t is None:
            continue
        o = (origins or {}).get(t.id)
        job, it, op = (o.job, o.iteration, o.op) if o is not None else (t.tag, 0, "replay")
        row = tags.setdefault(t.tag, dict(job=job, iteration=it, op=op, bytes=0, start_s=None,
                                          end_s=None, jct_ms=None, transfers=set(), complete=True))
        row["bytes"] += r.size_bytes or 0
        row["transfers"].add(t.id)
        row["complete"] &= bool(r.complete)
        if r.start_s is not None:
            row["start_s"] = r.start_s if row["start_s"] is None else min(row["start_s"], r.start_s)
        if r.end_s is not None:
            row["end_s"] = r.end_s if row["end_s"] is None else max(row["end_s"], r.end_s)
    out = []
    for row in tags.values():
        if row.pop("complete") and row["start_s"] is not None and row["end_s"] is not None:
            row["jct_ms"] = (row["end_s"] - row["start_s"]) * 1e3
        row["transfers"] = len(row["transfers"])
        out.append(row)
    return out


@dataclass
class Played:
    """What a schedule's run produced: its flows, each flow's transfer (None: background), their results (times
    since the run's origin) and the collectives.csv rows."""
    flows: list
    owner: list
    results: list
    rows: list = field(default_factory=list)


def play(transfers: list[Transfer], traffic, topo, seed: int, ns_of, duration_s: float, packet_size: int, *,
         prio=None, origins: dict | None = None, background: bool = False, **run_kw) -> Played:
    """Run a schedule (and, ``background``, the pattern's open-loop flows beside it) in one ``workloads.run``;
    ``run_kw`` goes to it (sndbuf_bytes, info, origin, check, on_t0, timeline_bin_s). Flows a collective policy
    skipped (ring orders it did not pick) are left out of what it returns: they never ran."""
    from . import run
    flows, owner = flows_of(transfers, traffic, topo, seed, prio, origins)
    if background:
        n = len(flows)
        with_background(flows, owner, traffic, topo, seed, duration_s)
        for f in flows[n:]:                  # the schedule's flows got it from TransferFlows
            f.prio = prio
    info = run_kw.get("info")
    if info is None:
        info = run_kw["info"] = {}
    results = run(flows, ns_of, duration_s, packet_size, **run_kw)
    skipped = set(info.get("skipped", ()))          # ring orders a collective policy did not pick: never ran
    if skipped:
        keep = [i for i, f in enumerate(flows) if f.flow_id not in skipped]
        flows, owner, results = [flows[i] for i in keep], [owner[i] for i in keep], [results[i] for i in keep]
    return Played(flows, owner, results, op_rows(owner, results, origins))
