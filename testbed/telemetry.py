"""Samplers that turn BPF counters and /proc/stat into tidy time series while traffic runs.

``LinkSampler`` reads the datapath's per-port counters every ``interval`` and emits one row per switch port and
direction with the bytes and packets of that interval (tx = the switch sent out of the port, rx = it received).
``CpuGuard`` is the fidelity guard: the emulation measures the fabric only while the machine has CPU to spare;
when softirq and the generators saturate the cores, the results measure the emulator, and the run is flagged.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .topology import Topology

CPU_BOUND_BUSY = 0.95          # a sample this busy (all cores) counts as saturated
CPU_BOUND_SHARE = 0.2          # … and the run is cpu_bound when this share of samples is saturated


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies over all cores since boot."""
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0.0)
    total = sum(parts[:8])          # guest time is already counted in user
    return total - idle, total


@dataclass
class CpuGuard:
    samples: list[float] = field(default_factory=list)
    _last: tuple[float, float] | None = None

    def sample(self) -> None:
        now = _cpu_times()
        if self._last is not None:
            busy = now[0] - self._last[0]
            total = now[1] - self._last[1]
            if total > 0:
                self.samples.append(busy / total)
        self._last = now

    def result(self) -> dict:
        s = self.samples
        if not s:
            return {"cpu_bound": False, "cpu_busy_mean": None, "cpu_busy_max": None, "cpu_samples": 0}
        saturated = sum(1 for x in s if x >= CPU_BOUND_BUSY) / len(s)
        return {"cpu_bound": saturated >= CPU_BOUND_SHARE, "cpu_busy_mean": round(sum(s) / len(s), 4),
                "cpu_busy_max": round(max(s), 4), "cpu_saturated_share": round(saturated, 4),
                "cpu_samples": len(s)}


class LinkSampler:
    """Background thread: counters every ``interval_s`` → rows for links.csv.

    tx rows count what really left the port (its root qdisc's counters, read over netlink), so a congested
    port shows what it carried, not what was offered to it; ``offered_bytes`` is what the switch program sent
    towards the port and ``drops`` what the port's queue dropped. rx rows come from the switch program.
    """

    def __init__(self, topo: Topology, datapath, interval_s: float, fabric=None):
        self.topo, self.dp, self.interval, self.fabric = topo, datapath, interval_s, fabric
        self.rows: list[dict] = []
        self.cpu = CpuGuard()
        self._ports = [p for sw in topo.switches for p in topo.ports[sw]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._t0 = 0.0
        self._last = None
        self._last_t = 0.0

    def _read(self):
        q = self.fabric.qdisc_stats() if self.fabric is not None else {}
        return self.dp.port_counters(), q

    def start(self, t0: float | None = None) -> None:
        self._t0 = time.time() if t0 is None else t0
        self._last = self._read()
        self._last_t = time.time()
        self.cpu.sample()
        self._thread.start()

    def stop(self) -> None:
        """Stop and take one last sample, so the tail of the run is counted."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._sample()

    def _loop(self) -> None:
        nxt = time.time() + self.interval
        while not self._stop.wait(max(0.0, nxt - time.time())):
            self._sample()
            nxt += self.interval
            if nxt < time.time():             # fell behind (busy machine): skip, never burst-sample
                nxt = time.time() + self.interval

    def _sample(self) -> None:
        now_counters, now_q = self._read()
        now = time.time()
        self.cpu.sample()
        dt = now - self._last_t
        if dt <= 1e-6:
            return
        t_rel = round(now - self._t0, 6)
        last, last_q = self._last
        for p in self._ports:
            c, c0 = now_counters.get(p.ifindex), last.get(p.ifindex)
            if c is None or c0 is None:
                continue
            q, q0 = now_q.get(p.ifindex), last_q.get(p.ifindex)
            offered = c.tx_bytes - c0.tx_bytes
            if q is not None and q0 is not None:
                tx_b, tx_p, tx_drops, backlog = q[0] - q0[0], q[1] - q0[1], q[2] - q0[2], q[4]
            else:                                   # no qdisc counters: what the program sent out
                tx_b, tx_p, tx_drops, backlog = offered, c.tx_packets - c0.tx_packets, 0, None
            common = {"time_s": t_rel, "switch": p.node, "port": p.ifname, "peer": p.peer_node}
            rest = {"role": p.role, "rate_bps": p.rate_bps, "interval_s": round(dt, 6)}
            self.rows.append({**common, "bytes": tx_b, "packets": tx_p, "direction": "tx", **rest,
                              "offered_bytes": offered, "drops": tx_drops, "backlog_bytes": backlog})
            self.rows.append({**common, "bytes": c.rx_bytes - c0.rx_bytes, "packets": c.rx_packets - c0.rx_packets,
                              "direction": "rx", **rest, "offered_bytes": None, "drops": c.drops - c0.drops,
                              "backlog_bytes": None})
        self._last, self._last_t = (now_counters, now_q), now


def paths_used(topo: Topology, flow_paths, flows) -> dict[int, int]:
    """flow_id → number of distinct uplinks its packets crossed at its source leaf."""
    seen: dict[tuple, int] = {}
    for fp in flow_paths:
        key = (fp.switch, fp.saddr, fp.daddr, fp.sport, fp.dport, fp.proto)
        seen[key] = sum(1 for n in fp.packets.values() if n > 0)
    out = {}
    for f in flows:
        proto = 6 if f.proto == "tcp" else 17
        leaf = topo.leaf_of(f.src, f.rail)
        if topo.leaf_of(f.dst, f.rail) == leaf:
            out[f.flow_id] = 0                 # never leaves its leaf
        else:
            out[f.flow_id] = seen.get((leaf, f.src_addr, f.dst_addr, f.sport, f.dport, proto), 0)
    return out
