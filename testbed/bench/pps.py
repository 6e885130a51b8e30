"""Packets/s and CPU per packet through the eBPF switch program against plain kernel forwarding, measured
side by side (``testbed bench pps``; the package docstring says how)."""
from __future__ import annotations

import os
import socket
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass

from .. import topology
from ..fabric import netns
from ..fabric import Fabric

from .common import GOAL_PPS_RATIO, LAB_PREFIX, default_ports, leaf_spine_scenario


_SENDER = textwrap.dedent("""
    import os, socket, sys, time
    dst, port, size, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    os.sched_setaffinity(0, {int(sys.argv[5])})     # the veth path runs in softirq on the sender's CPU
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 40000)); s.connect((dst, port))
    send, data, clock = s.send, bytes(size), time.monotonic
    end = clock() + secs
    while clock() < end:
        for _ in range(1000):
            try:
                send(data)
            except OSError:
                pass
""")
PPS_PORT = 9
PPS_PAYLOAD = 36          # 64-byte IP packets (20 IP + 8 UDP + 36)
PPS_CPU = (os.cpu_count() or 1) - 1     # the sender is pinned here; only this CPU's time is counted


def _cpu_jiffies(cpu: int) -> tuple[int, int]:
    """(kernel = system+irq+softirq, busy = that + user + nice) of one CPU, in USER_HZ ticks."""
    with open("/proc/stat") as f:
        line = next(ln for ln in f if ln.startswith(f"cpu{cpu} "))
    v = [int(x) for x in line.split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = v[:7]
    return system + irq + softirq, system + irq + softirq + user + nice


def _rx_packets(ifname: str) -> int:
    """Runs inside a namespace: received packets of ``ifname`` (this thread's /proc/net/dev)."""
    with open("/proc/thread-self/net/dev") as f:
        for line in f:
            name, sep, rest = line.partition(":")
            if sep and name.strip() == ifname:
                return int(rest.split()[1])
    raise RuntimeError(f"no interface {ifname}")


@dataclass
class PpsSample:
    mode: str
    pps: float
    kernel_ns: float        # (system+irq+softirq) CPU ns per packet received
    busy_ns: float          # including user time (the Python sender)
    packets: int
    seconds: float


class _PpsFabric:
    """A 2×2×1 fabric at 10 Gbit/s switched by eBPF or by the kernel, with a sink socket on h1."""

    def __init__(self, mode: str, lab: str):
        self.mode, self.lab = mode, lab
        scen = leaf_spine_scenario(2, 2, 1, rate="10gbit")
        self.scen = scen
        self.topo = topology.build(scen.topology)
        self.fabric = Fabric(self.topo, lab, default_ports(self.topo), hooked=None if mode == "ebpf" else [])
        self.dp = None
        self.sink = None

    def up(self) -> "_PpsFabric":
        self.fabric.build()
        if self.mode == "ebpf":
            from ..datapath import Datapath
            self.dp = Datapath(self.topo, self.scen.switch).load()
            self.fabric.attach_ingress(self.dp.ingress_fd, self.dp.ingress_name)
        else:
            self.fabric.enable_kernel_forwarding()
        dst = self.topo.address("h1")

        def sink():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind((dst, PPS_PORT))
            return s
        self.sink = netns.run_in(self.fabric.ns["h1"], sink)     # never read: UDP drops at the socket
        return self

    def rx(self) -> int:
        return netns.run_in(self.fabric.ns["h1"], _rx_packets, "eth0")

    def measure(self, seconds: float, warmup: float = 0.3) -> PpsSample:
        dst = self.topo.address("h1")
        proc = netns.spawn(self.fabric.ns["h0"], [sys.executable, "-c", _SENDER, dst, str(PPS_PORT),
                                                  str(PPS_PAYLOAD), str(warmup + seconds + 30),
                                                  str(PPS_CPU)])
        try:
            time.sleep(warmup)
            if proc.poll() is not None:
                raise RuntimeError(f"pps sender in {self.fabric.ns['h0']} exited with {proc.returncode}")
            r0, (k0, b0), t0 = self.rx(), _cpu_jiffies(PPS_CPU), time.perf_counter()
            time.sleep(seconds)
            r1, (k1, b1), t1 = self.rx(), _cpu_jiffies(PPS_CPU), time.perf_counter()
        finally:
            proc.kill()
            proc.wait()
        n = r1 - r0
        tick_ns = 1e9 / os.sysconf("SC_CLK_TCK")
        per = (lambda j: j * tick_ns / n) if n else (lambda j: float("nan"))
        return PpsSample(self.mode, n / (t1 - t0), per(k1 - k0), per(b1 - b0), n, t1 - t0)

    def check(self) -> dict:
        """Where the packets went (eBPF: per-port counters must show the leaf→spine→leaf path)."""
        if self.dp is None:
            return {}
        c = self.dp.port_counters()
        return {"switch_rx": sum(v.rx_packets for v in c.values()), "drops": sum(v.discards for v in c.values())}

    def down(self) -> None:
        try:
            if self.sink is not None:
                self.sink.close()
            self.fabric.teardown()
        finally:
            if self.dp is not None:
                self.dp.close()
                self.dp = None


def measure_pps(seconds: float = 3.0, rounds: int = 3) -> dict[str, list[PpsSample]]:
    """Alternate traffic between an eBPF-switched and a kernel-routed fabric; samples per mode."""
    fabs = [_PpsFabric("ebpf", f"{LAB_PREFIX}ppse"), _PpsFabric("kernel", f"{LAB_PREFIX}ppsk")]
    samples: dict[str, list[PpsSample]] = {"ebpf": [], "kernel": []}
    try:
        for f in fabs:
            f.up()
        for i in range(rounds):
            order = fabs if i % 2 == 0 else fabs[::-1]
            for f in order:
                samples[f.mode].append(f.measure(seconds))
        samples["_check"] = fabs[0].check()
    finally:
        for f in fabs:
            try:
                f.down()
            except Exception:    # noqa: BLE001 — tear the other one down regardless
                pass
    return samples


def print_pps(seconds: float = 3.0, rounds: int = 3, out=None) -> dict:
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out, flush=True)     # noqa: E731
    p(f"== packets/s h0 -> leaf0 -> spine -> leaf1 -> h1 (2x2x1, 10 Gbit/s, {PPS_PAYLOAD + 28}-byte UDP, "
      f"Python sender; {rounds} alternated rounds x {seconds:g} s, medians) ==")
    samples = measure_pps(seconds, rounds)
    check = samples.pop("_check", {})
    med = {}
    for mode in ("ebpf", "kernel"):
        ss = samples[mode]
        med[mode] = {k: statistics.median(getattr(s, k) for s in ss) for k in ("pps", "kernel_ns", "busy_ns")}
        p(f"  {mode:<6}  pps {med[mode]['pps']:>9,.0f}   kernel CPU {med[mode]['kernel_ns']:>6.0f} ns/pkt   "
          f"all CPU {med[mode]['busy_ns']:>6.0f} ns/pkt   rounds: "
          + ", ".join(f"{s.pps:,.0f}/{s.kernel_ns:.0f}ns" for s in ss))
    ratio = med["ebpf"]["kernel_ns"] / med["kernel"]["kernel_ns"]
    ratio_all = med["ebpf"]["busy_ns"] / med["kernel"]["busy_ns"]
    p(f"  cost per packet eBPF / kernel forwarding: {ratio:.3f}x kernel CPU, {ratio_all:.3f}x all CPU "
      f"(goal <= {GOAL_PPS_RATIO:.2f}x -> {'met' if ratio <= GOAL_PPS_RATIO else 'NOT met'}); "
      f"pps eBPF / kernel {med['ebpf']['pps'] / med['kernel']['pps']:.3f}x")
    if check:
        p(f"  eBPF check: {check['switch_rx']:,} packets seen on switch ports (3 per packet), "
          f"{check['drops']} drops")
    return {"median": med, "ratio_kernel_cpu": ratio, "ratio_all_cpu": ratio_all, "samples": samples}
