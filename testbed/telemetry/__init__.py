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

from ..topology import Topology

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

    tx rows count what really left the port (its root qdisc's counters), so a congested port shows what it
    carried; ``offered_bytes`` is what the switch program forwarded towards it. Besides bytes and packets,
    every row carries the congestion columns (see results/README.md): on the ``tx``
    row of a port (its egress) the queue depth arriving packets saw (max, mean), ECN marks, tail drops, PFC
    frames received and time paused, and — when ``fabric`` is given — the qdisc's real backlog from netlink next
    to the queue model's depth at the same instant; on the ``rx`` row (its ingress) the pause frames the port
    sent upstream and the ingress drops."""

    def __init__(self, topo: Topology, datapath, interval_s: float, fabric=None):
        self.topo, self.dp, self.interval = topo, datapath, interval_s
        self.fabric = fabric
        self.model_samples: list[tuple[int, int]] = []     # (model bytes, real backlog bytes)
        self.rows: list[dict] = []
        self.cpu = CpuGuard()
        self._ports = [p for sw in topo.switches for p in topo.ports[sw]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._t0 = 0.0
        self._last = None
        self._last_t = 0.0

    def _queues(self):
        q = self.dp.queue_counters() if hasattr(self.dp, "queue_counters") else {}
        p = self.dp.pfc_counters() if hasattr(self.dp, "pfc_counters") else {}
        return q, p

    def _backlogs(self, model: dict | None = None) -> dict[int, tuple[int, int, int, int, int]]:
        """Root qdisc counters (bytes, packets, drops, qlen, backlog) of every switch port; with ``model``, the
        queue model's depth of each port is read around its switch's dump, so the two describe (nearly) the
        same instant, and a model that drifted from the real backlog is reset to it
        (``Datapath.sync_queue_models``): ``queue_model_bytes`` is the model before that reset, i.e. the drift
        of one interval."""
        out = {}
        if self.fabric is None:
            return out
        for sw in self.topo.switches:
            read = (lambda sw=sw: self.fabric.qdisc_stats([sw]))
            try:
                if model is not None and hasattr(self.dp, "sync_queue_models"):
                    got, depths = self.dp.sync_queue_models([p.ifindex for p in self.topo.ports[sw]], read)
                    model.update(depths)
                else:
                    got = read()
            except OSError:
                continue
            out.update(got)
        return out

    def start(self, t0: float | None = None) -> None:
        self._t0 = time.time() if t0 is None else t0
        self._lastq = self._queues()
        self._last_backlog = self._backlogs()
        self._last = self.dp.port_counters()
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
        model: dict[int, int] = {}
        backlog = self._backlogs(model)
        nowq = self._queues()
        now_counters = self.dp.port_counters()
        now = time.time()
        self.cpu.sample()
        dt = now - self._last_t
        if dt <= 1e-6:
            return
        t_rel = round(now - self._t0, 6)
        last = self._last
        (q1, pf1), (q0, pf0) = nowq, self._lastq
        for p in self._ports:
            c, c0 = now_counters.get(p.ifindex), last.get(p.ifindex)
            if c is None or c0 is None:
                continue
            eg = _port_delta(p.ifindex, q1, q0, pf1, pf0)
            offered = c.tx_bytes - c0.tx_bytes
            qd, qd0 = backlog.get(p.ifindex), self._last_backlog.get(p.ifindex)
            if qd is not None and qd0 is not None:    # what really left the port (its qdisc), not what was offered
                tx_b, tx_p = qd[0] - qd0[0], qd[1] - qd0[1]
            else:
                tx_b, tx_p = offered, c.tx_packets - c0.tx_packets
            for direction, b, pk in (("tx", tx_b, tx_p),
                                     ("rx", c.rx_bytes - c0.rx_bytes, c.rx_packets - c0.rx_packets)):
                tx = direction == "tx"
                row = {"time_s": t_rel, "switch": p.node, "port": p.ifname, "peer": p.peer_node,
                       "bytes": b, "packets": pk, "direction": direction, "role": p.role,
                       "rate_bps": p.rate_bps, "interval_s": round(dt, 6),
                       "drops": eg["drops"] if tx else (c.drops - c0.drops),
                       "queue_bytes_max": eg["qmax"] if tx else 0,
                       "queue_bytes_mean": round(eg["qmean"], 1) if tx else 0.0,
                       "ecn_marks": eg["ecn"] if tx else 0,
                       "pause_tx": 0 if tx else eg["pause_tx"],
                       "pause_rx": eg["pause_rx"] if tx else 0,
                       "paused_s": round(eg["paused_s"], 6) if tx else 0.0}
                if tx:
                    row["offered_bytes"] = offered
                if tx and p.ifindex in backlog:
                    real = backlog[p.ifindex][4]
                    row["queue_model_bytes"] = model.get(p.ifindex, 0)
                    row["backlog_bytes"] = real
                    row["qdisc_drops"] = backlog[p.ifindex][2] - (qd0[2] if qd0 else 0)
                    self.model_samples.append((model.get(p.ifindex, 0), real))
                self.rows.append(row)
        self._last, self._last_t, self._lastq = now_counters, now, nowq
        if backlog:
            self._last_backlog = backlog

    def model_error(self, min_backlog: int = 8192) -> dict:
        """Queue model vs the qdisc's real backlog over samples with a real queue: mean/p90/max relative error."""
        errs = sorted(abs(m - r) / r for m, r in self.model_samples if r >= min_backlog)
        if not errs:
            return {"samples": 0, "mean": None, "p90": None, "max": None}
        return {"samples": len(errs), "mean": sum(errs) / len(errs), "p90": errs[int(0.9 * (len(errs) - 1))],
                "max": errs[-1]}


def _port_delta(ifx: int, q1: dict, q0: dict, pf1: dict, pf0: dict) -> dict:
    """Congestion counters of one port over an interval, summed over its priorities."""
    out = {"drops": 0, "ecn": 0, "qmax": 0, "qmean": 0.0, "pause_rx": 0, "pause_tx": 0, "paused_s": 0.0}
    pk = ds = 0
    for (i, prio), c in q1.items():
        if i != ifx:
            continue
        c0 = q0.get((i, prio))
        out["drops"] += c.drops - (c0.drops if c0 else 0)
        out["ecn"] += c.ecn_marks - (c0.ecn_marks if c0 else 0)
        out["pause_rx"] += c.pause_rx - (c0.pause_rx if c0 else 0)
        out["qmax"] = max(out["qmax"], c.depth_max)
        pk += c.packets - (c0.packets if c0 else 0)
        ds += c.depth_sum - (c0.depth_sum if c0 else 0)
        f1, f0 = pf1.get((i, prio)), pf0.get((i, prio))
        if f1:
            out["pause_tx"] += f1[0] - (f0[0] if f0 else 0)
            out["paused_s"] += (f1[1] - (f0[1] if f0 else 0)) / 1e9
    out["qmean"] = ds / pk if pk else 0.0
    return out


def paths_used(topo: Topology, flow_paths, flows) -> dict[int, int]:
    """flow_id → number of distinct uplinks its packets crossed at its source leaf."""
    seen: dict[tuple, int] = {}
    for fp in flow_paths:
        key = (fp.switch, fp.saddr, fp.daddr, fp.sport, fp.dport, fp.proto)
        seen[key] = sum(1 for n in fp.packets.values() if n > 0)
    out = {}
    for f in flows:
        proto = 17 if f.proto == "udp" else 6
        leaf = topo.leaf_of(f.src, f.rail)
        if topo.leaf_of(f.dst, f.rail) == leaf:
            out[f.flow_id] = 0                 # never leaves its leaf
        else:
            out[f.flow_id] = seen.get((leaf, f.src_addr, f.dst_addr, f.sport, f.dport, proto), 0)
    return out
