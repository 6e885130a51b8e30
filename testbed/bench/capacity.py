"""``testbed bench capacity``: the highest link rate at which a run still tells the truth, beside the kernel's own
limit for the same ports on this machine, measured in the same benchmark.

What an emulator's user buys is emulated bandwidth that is still right. A run at rate R (every host and fabric
link at R) is **valid** when it delivers ≥ 95 % of what it offered, the CPU guard does not flag it
(``cpu_bound``), and the queue model's mean error is ≤ 0.05. The benchmark bisects R (geometrically, to 1 Mbit/s)
between ``lo`` and ``hi`` for:

- **the testbed**: the scenario as ``testbed run`` runs it, the engine and MTU as asked, load balancing spraying
  unless ``--set`` says otherwise (ECMP's collisions cap a permutation's goodput whatever the rate);
- **the baseline**: the same topology and the same shaped ports (TBF/HTB as the scenario configures them) with
  plain kernel IP forwarding and no switch program, each host's /32 routed over one of its prefix's equal-cost
  next hops round-robin (destination-based spreading: a permutation gets a path of its own per flow, as spraying
  gives the testbed), and Debian's ``iperf3 -u`` per flow in the host namespaces (a C generator: the kernel's
  cost per packet, not Python's). Valid when it delivers ≥ 95 % of what it offered.

It prints both capacities (per-link rate, aggregate Mbit/s, packets/s and packets/s per core), the ratio testbed
÷ baseline, and where the CPU went per delivered packet at each side's capacity: the machine's /proc/stat over
the traffic window (so: run it on a quiet machine) — softirq + irq (the kernel datapath: veth, shapers, the
switch program), system (the senders' and receivers' syscalls), user (the traffic agents and helpers; iperf3).
"""
from __future__ import annotations

import math
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import scenario, topology
from ..fabric import Fabric, netns
from ..fabric.port import port_configs
from .common import LAB_PREFIX

GOODPUT_SHARE = 0.95
MODEL_ERROR = 0.05
ENGINES = ("udp", "tcp", "roce", "iperf3")
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_now() -> dict[str, float]:
    """Machine-wide CPU seconds since boot from /proc/stat: user (+nice), system, softirq (+irq), busy."""
    with open("/proc/stat") as f:
        v = [int(x) / _TICK for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return {"user": user + nice, "system": system, "softirq": softirq + irq,
            "busy": user + nice + system + irq + softirq}


@dataclass
class Point:
    """One measurement at one link rate."""
    rate_bps: int
    offered_mbps: float
    goodput_mbps: float
    packets: int                      # packets delivered to the receivers
    seconds: float                    # the run's traffic time
    cpu: dict = field(default_factory=dict)     # CPU seconds of the machine over the run, as cpu_now() keys
    why: list[str] = field(default_factory=list)   # what made it invalid; empty: valid

    @property
    def valid(self) -> bool:
        return not self.why

    def per_packet_ns(self, key: str) -> float:
        return self.cpu.get(key, 0.0) * 1e9 / self.packets if self.packets else math.nan

    @property
    def pps(self) -> float:
        return self.packets / self.seconds if self.seconds > 0 else 0.0


def _judge(offered: float, goodput: float) -> list[str]:
    if offered <= 0 or goodput < GOODPUT_SHARE * offered:
        return [f"goodput {goodput:.1f} of {offered:.1f} Mbit/s offered (< {GOODPUT_SHARE:.0%})"]
    return []


def _rate_sets(rate_bps: int) -> tuple[str, ...]:
    return (f"topology.host_link.rate={rate_bps}bit", f"topology.fabric_link.rate={rate_bps}bit")


class CpuTrace:
    """/proc/stat read every ``interval`` s in a thread while a run goes on: the CPU of a window of it."""

    def __init__(self, interval: float = 0.05):
        import threading
        self.interval, self.samples, self._stop = interval, [], threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), cpu_now()))
            self._stop.wait(self.interval)

    def __enter__(self) -> "CpuTrace":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds from the last sample at or before ``t0`` to the first at or after ``t1``."""
        a = max((s for s in self.samples if s[0] <= t0), default=self.samples[0], key=lambda s: s[0])
        b = min((s for s in self.samples if s[0] >= t1), default=self.samples[-1], key=lambda s: s[0])
        return {k: b[1][k] - a[1][k] for k in a[1]}


def testbed_point(path: Path, sets: tuple[str, ...], rate_bps: int, outdir: Path) -> Point:
    """One ``testbed run`` of the scenario at ``rate_bps``; its CPU over the traffic window."""
    import json
    import pandas as pd
    from ..runs.lifecycle import run
    scen = scenario.load(path, sets + _rate_sets(rate_bps))
    with CpuTrace() as trace:
        d, row = run(scen, outdir)
    origin = json.loads((d / "manifest.json").read_text())["origin"]
    flows = pd.read_csv(d / "flows.csv")
    payload = scen.packet_size - (52 if scen.traffic.engine == "tcp" else 28)
    if "packets_received" in flows and flows["packets_received"].notna().any():
        packets = int(flows["packets_received"].fillna(0).sum())
    else:
        packets = int(flows["bytes"].sum() // max(1, payload))
    t0, t1 = float(row["traffic_start_s"]), float(row["traffic_end_s"])
    p = Point(rate_bps, float(row["offered_mbps"]), float(row["goodput_mbps"]), packets, t1 - t0,
              trace.between(origin + t0, origin + t1))
    p.why = _judge(p.offered_mbps, p.goodput_mbps)
    if str(row.get("cpu_bound")) == "True":
        p.why.append(f"cpu_bound ({row.get('cpu_bound_reason') or 'the guard flagged it'})")
    err = row.get("queue_model_error")
    if err is not None and not (isinstance(err, float) and math.isnan(err)) and float(err) > MODEL_ERROR:
        p.why.append(f"queue model error {float(err):.2f} > {MODEL_ERROR}")
    return p


def baseline_point(path: Path, sets: tuple[str, ...], rate_bps: int, workdir: Path) -> Point:
    """The same topology and shaped ports, kernel forwarding with per-host routes, ``iperf3 -u`` per flow."""
    from ..workloads import iperf3, offered_mbps, plan
    scen = scenario.load(path, sets + _rate_sets(rate_bps) + ("traffic.engine=iperf3",))
    topo = topology.build(scen.topology)
    lab = f"{LAB_PREFIX}c{secrets.token_hex(2)}"
    fabric = Fabric(topo, lab, port_configs(topo, scen.switch), hooked=[])
    duration = scen.duration / 1e9
    try:
        fabric.build()
        fabric.enable_kernel_forwarding(per_host=True)
        flows = plan(scen.traffic, topo, scen.seed, duration)
        origin = time.time()
        with CpuTrace() as trace:
            rows, failed = iperf3.run_flows(flows, "udp", scen.packet_size, duration, fabric.ns.__getitem__,
                                            origin, workdir, lambda: None)
    finally:
        fabric.teardown()
    good = sum(r.bytes for r in rows) * 8 / duration / 1e6
    t0 = min((r.start_s for r in rows), default=0.0)
    t1 = max((r.end_s for r in rows), default=duration)
    p = Point(rate_bps, offered_mbps(flows, scen.topology.host_link.rate, duration), good,
              sum(r.packets_received or 0 for r in rows), t1 - t0, trace.between(origin + t0, origin + t1))
    p.why = _judge(p.offered_mbps, p.goodput_mbps) + ([failed] if failed else [])
    return p


def bisect(measure: Callable[[int], Point], lo_bps: int, hi_bps: int, steps: int,
           log: Callable[[str], None]) -> tuple[Point | None, Point | None, list[Point]]:
    """(the highest valid point found, the lowest invalid one above it, every point measured): ``hi`` first (valid:
    the capacity is at least it), then ``lo`` (invalid: below it), then ``steps`` geometric midpoints."""
    seen: list[Point] = []

    def at(rate: int) -> Point:
        p = measure(rate)
        seen.append(p)
        log(f"  {rate / 1e6:8.1f} Mbit/s  {'valid' if p.valid else 'invalid: ' + '; '.join(p.why)}")
        return p
    top = at(hi_bps)
    if top.valid:
        return top, None, seen
    bottom = at(lo_bps)
    if not bottom.valid:
        return None, bottom, seen
    good, bad = bottom, top
    for _ in range(steps):
        mid = int(round(math.sqrt(good.rate_bps * bad.rate_bps) / 1e6)) * 1_000_000
        if mid <= good.rate_bps or mid >= bad.rate_bps:
            break
        p = at(mid)
        good, bad = (p, bad) if p.valid else (good, p)
    return good, bad, seen


def _describe(label: str, p: Point | None, above: Point | None, cores: int, log: Callable[[str], None]) -> None:
    if p is None:
        log(f"{label}: not valid even at {above.rate_bps / 1e6:g} Mbit/s ({'; '.join(above.why)})")
        return
    beyond = (f"; invalid at {above.rate_bps / 1e6:g} Mbit/s ({'; '.join(above.why)})" if above is not None
              else " (valid at the top of the range: the capacity is at least this)")
    log(f"{label}: {p.rate_bps / 1e6:g} Mbit/s per link = {p.goodput_mbps:.1f} Mbit/s delivered, "
        f"{p.pps / 1e3:.1f} kpackets/s ({p.pps / cores / 1e3:.1f} k per core){beyond}")
    log(f"  CPU per delivered packet: softirq+irq {p.per_packet_ns('softirq'):,.0f} ns, system "
        f"{p.per_packet_ns('system'):,.0f} ns, user {p.per_packet_ns('user'):,.0f} ns "
        f"(all {p.per_packet_ns('busy'):,.0f} ns)")


def print_capacity(path: Path, engine: str = "udp", mtu: int | None = None, sets: tuple[str, ...] = (),
                   lo_bps: int = 5_000_000, hi_bps: int = 320_000_000, steps: int = 4, duration: str = "3s",
                   out=None, save: bool = False) -> dict:
    """Measure and print both capacities (module docstring); returns {"testbed": …, "baseline": …, "ratio": …}.
    ``save``: keep the testbed's packets/s per core at its capacity as this machine's budget for the engine,
    which ``time_dilation: auto`` divides by (dilation.budget)."""
    out = out or sys.stdout

    def log(s: str) -> None:
        print(s, file=out, flush=True)
    base = (f"duration={duration}",) + (("switch.load_balancing=spray",)
                                        if not any(s.startswith("switch.load_balancing=") for s in sets) else ())
    base += (f"topology.mtu={mtu}",) if mtu else ()
    tb_sets = base + (f"traffic.engine={engine}",) + tuple(sets)
    bl_sets = base + tuple(s for s in sets if not s.startswith("traffic.engine="))
    scenario.load(path, tb_sets)                   # a bad scenario or --set fails now, in one line
    cores = os.cpu_count() or 1
    log(f"capacity of {path} ({engine}{f', MTU {mtu}' if mtu else ''}; {', '.join(tb_sets)}): valid = goodput ≥ "
        f"{GOODPUT_SHARE:.0%} of offered, not cpu_bound, queue model error ≤ {MODEL_ERROR}")
    with tempfile.TemporaryDirectory(prefix="ftb-capacity-") as tmp:
        runs = iter(range(10_000))
        log("testbed (eBPF switches, the scenario's engine):")
        tb = bisect(lambda r: testbed_point(path, tb_sets, r, Path(tmp) / f"t{next(runs)}"), lo_bps, hi_bps, steps,
                    log)
        log("baseline (kernel forwarding, per-host routes, iperf3 -u per flow; same ports):")
        bl = bisect(lambda r: baseline_point(path, bl_sets, r, Path(tmp) / f"b{next(runs)}"), lo_bps, hi_bps,
                    steps, log)
    _describe("testbed capacity", tb[0], tb[1], cores, log)
    _describe("baseline capacity", bl[0], bl[1], cores, log)
    ratio = (tb[0].rate_bps / bl[0].rate_bps) if tb[0] is not None and bl[0] is not None else math.nan
    log(f"testbed ÷ baseline: {ratio:.2f}" + ("" if bl[1] is not None else " (the baseline was valid at the top "
                                                                          "of the range: a lower bound)"))
    if save and tb[0] is not None and tb[1] is not None:
        from ..dilation import save_budget
        kept = save_budget(engine, tb[0].pps / cores, f"{tb[0].rate_bps / 1e6:g} Mbit/s links, {Path(path).name}"
                                                      + (f", MTU {mtu}" if mtu else ""))
        log(f"time_dilation auto now divides {engine} traffic by {tb[0].pps / cores:,.0f} packets/s per core here "
            f"({kept})")
    return {"testbed": tb, "baseline": bl, "ratio": ratio}
