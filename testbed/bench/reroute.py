"""Re-route after a link failure (``testbed bench reroute``): the subnet manager against distributed routing.

For each fat-tree size, two real runs of the same scenario (``lifecycle.run``: fabric, eBPF datapath, paced UDP
flows, the failure scheduler): ``routing: distributed`` — the switches' own fast failover, the same-run
baseline — and ``routing: sm`` with the ftree engine. Edge switch leaf0's link to aggregation switch spine0 goes
down 1 s after the traffic starts; flows from every host of leaf0 to hosts in the last pod cross it. Printed
per size: detection and re-route time (failures.csv); for the SM, its own figures for the sweep that handled the
failure (sm.csv: how long the change waited for the sweep, the engine's compute, writing the entries, and from
the sweep's read until every switch forwards by the new tables); packets lost; and the SM ÷ distributed ratio of
the re-route time."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import scenario
from ..runs import lifecycle

FAIL_AT_S = 1.0


def reroute_scenario(k: int, routing: str, sweep: str = "10ms") -> scenario.Scenario:
    """Fat-tree k with low-rate flows from leaf0's hosts to the last pod (so they cross leaf0's uplinks), one
    uplink failing at 1 s. Telemetry samples rarely: at k=16 a sample dumps 320 switches."""
    half = k // 2
    hosts = k ** 3 // 4
    pairs = [[f"h{i}", f"h{hosts - half + i}"] for i in range(half)]
    link = {"rate": "20mbit", "buffer": "64KB"}
    # the SM's first full computation takes seconds at k=16: leave it time before the failure, and after
    duration = "4s" if k <= 8 else "8s"
    return scenario.from_dict({
        "name": f"reroute-ft{k}-{routing}", "duration": duration,
        "topology": {"kind": "fat-tree", "k": k, "host_link": link, "fabric_link": link},
        "switch": {"routing": routing, "sm": {"engine": "ftree", "sweep_interval": sweep}},
        "traffic": {"engine": "udp", "pattern": "pairs", "pairs": pairs, "rate": "2mbit"},
        "telemetry": {"interval": "1s"},
        "failures": [{"at": f"{FAIL_AT_S}s", "link": ["leaf0", "spine0"], "state": "down"}]})


@dataclass
class RerouteResult:
    routing: str
    detected_ms: float
    rerouted_ms: float
    lost: int
    # SM: the sweep that handled the failure, as sm.csv reports it
    sweep_detect_ms: float | None = None  # detect_s: first rtnetlink notification → the sweep's read
    compute_ms: float | None = None       # compute_s: the engine's new tables
    install_ms: float | None = None       # install_s: first to last entry written
    held_ms: float | None = None          # held_s: the sweep's read → every switch forwards by the new tables


def measure(k: int, routing: str, out: Path) -> RerouteResult:
    d, _ = lifecycle.run(reroute_scenario(k, routing), out)
    f = pd.read_csv(d / "failures.csv").iloc[0]
    r = RerouteResult(routing, float(f["detected_s"]) * 1e3, float(f["rerouted_s"]) * 1e3, int(f["lost_packets"]))
    sm = d / "sm.csv"
    if routing == "sm" and sm.exists():
        rows = pd.read_csv(sm)
        rows = rows[rows["kind"] != "initial"] if "kind" in rows.columns else rows
        if len(rows):
            row = rows.iloc[0]
            ms = lambda col: None if pd.isna(row[col]) else float(row[col]) * 1e3   # noqa: E731
            r.sweep_detect_ms, r.compute_ms = ms("detect_s"), ms("compute_s")
            r.install_ms, r.held_ms = ms("install_s"), ms("held_s")
    return r


def print_reroute(ks: list[int]) -> list[tuple[int, RerouteResult, RerouteResult]]:
    out = []
    print("re-route after leaf0–spine0 goes down (fat-tree, ftree SM vs distributed fast failover, same run)")
    print(f"{'size':>6} {'routing':>12} {'detect ms':>10} {'reroute ms':>11} {'lost':>5}   SM sweep (sm.csv): "
          f"{'waited ms':>9} {'compute ms':>10} {'write ms':>9} {'all switches ms':>15}")
    with tempfile.TemporaryDirectory(prefix="ftb-bench-reroute-") as tmp:
        for k in ks:
            base = measure(k, "distributed", Path(tmp) / f"ft{k}-distributed")
            sm = measure(k, "sm", Path(tmp) / f"ft{k}-sm")
            for r in (base, sm):
                f = lambda x: "" if x is None else f"{x:.1f}"     # noqa: E731
                print(f"{'ft' + str(k):>6} {r.routing:>12} {r.detected_ms:>10.2f} {r.rerouted_ms:>11.2f} {r.lost:>5}"
                      f"                     {f(r.sweep_detect_ms):>9} {f(r.compute_ms):>10} {f(r.install_ms):>9} "
                      f"{f(r.held_ms):>15}")
            ratio = sm.rerouted_ms / base.rerouted_ms if base.rerouted_ms > 0 else float("nan")
            print(f"{'':>6} SM re-route ÷ distributed: {ratio:.1f}×")
            out.append((k, base, sm))
    return out
