"""The link sampler: switch counters every interval → the rows of links.csv.

One row per switch port, direction and sample: ``tx`` (the switch sent out of the port) counts what really left
the port — its root qdisc's byte counter, read with one netlink dump per switch — and ``rx`` what the switch
program received on it (a BPF per-port counter). Every counter is read with the instant of its own reading,
and a row's ``interval_s`` is the time between two readings *of that counter*: one global interval for counters
read milliseconds apart made samples of a saturated port read 1.28 × the link rate. What remains above 1.0 on
a shaped port is the shaper's bucket (TBF may send ``burst`` bytes on top of rate × time), see
results/README.md.

Nothing is dropped silently: a failed qdisc dump skips that switch's ``tx`` rows for one sample (the next
reading covers both intervals, so no byte is lost) and is recorded in ``degradations``; a sample the thread
could not take on time is counted; an exception in the sampling thread ends it and is kept in ``error``, which
the run checks (``check()``) and turns into a failed run.
"""
from __future__ import annotations

import threading
import time

from ..errors import HelperFailed
from ..topology import Topology
from .cpu import CpuGuard
from .periodic import run_every


class SamplerFailed(HelperFailed):
    """The sampling thread died; the message names it and the cause (one line)."""


class LinkSampler:
    """Background thread: counters every ``interval_s`` → ``rows`` for links.csv. ``origin``: the run's time zero
    (``time.time()``), shared with the flow times. With ``fabric`` (the usual case) tx rows carry the qdisc's
    counters and real backlog next to the queue model's depth; without it, what the switch program forwarded."""

    def __init__(self, topo: Topology, datapath, interval_s: float, fabric=None, origin: float | None = None,
                 cpu: CpuGuard | None = None, resync: bool = True, resync_classes: bool = False):
        self.topo, self.dp, self.interval, self.fabric = topo, datapath, interval_s, fabric
        self.resync = resync                                 # reset drifted queue models (off: to measure drift)
        self.resync_classes = resync_classes                 # … per priority too (no PFC agent in the lab)
        self.origin = origin if origin is not None else time.time()
        self.cpu = cpu if cpu is not None else CpuGuard(origin=self.origin)
        self.rows: list[dict] = []
        self.model_samples: list[tuple[int, int]] = []      # (model bytes, real backlog bytes)
        self.degradations: list[str] = []
        self.failed_dumps = 0
        self.late_samples = 0
        self.samples = 0
        self.error: str | None = None
        self._ports = [p for sw in topo.switches for p in topo.ports[sw]]
        self._switch_ifindexes = [p.ifindex for p in self._ports]
        # credits read at the receiving ports: a cut link's (another machine's) is mirrored here (credits.py)
        self._credit_ifindexes = sorted({i for p in self._ports for i in (p.ifindex, p.peer_ifindex)})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._last_q: dict[str, tuple[float, dict]] = {}     # switch → (read at, qdisc dump)
        self._last_c: dict = {}                               # ifindex → PortCounters (with read_at)
        self._last_queues = ({}, {}, {})
        self.credits = bool(getattr(datapath.switch_spec, "credit_on", False))   # rx rows get credit columns
        # switch → its shared buffer's size (tx rows get the switch's occupancy); empty: buffers per queue
        self.shared = {sw: datapath.qos_for(sw).shared_buffer.size for sw in topo.switches
                       if datapath.ports[topo.ports[sw][0].ifindex].shared_pool}

    # ---- life cycle

    def start(self) -> None:
        self._last_queues = self._queues()
        self._last_q = {sw: r for sw, r in self._qdiscs(None).items()}
        self._last_c = self.dp.port_counters()
        self.cpu.sample()
        self._thread.start()

    def stop(self) -> None:
        """Stop and take one last sample, so the tail of the run is counted."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.error is None:
            self._sample()

    def check(self) -> None:
        """Raise SamplerFailed if the sampling thread died (called by the run while traffic flows)."""
        if self.error is not None:
            raise SamplerFailed(self.error)

    def _loop(self) -> None:
        try:
            run_every(self.interval, self._stop, self._sample, self._late)
        except Exception as e:                 # noqa: BLE001 — kept and reported by check() / the run
            self.error = f"telemetry sampler failed at {time.time() - self.origin:.2f} s: {type(e).__name__}: {e}"

    def _late(self) -> None:                   # fell behind (busy machine): skipped, never burst-sampled
        self.late_samples += 1

    # ---- readings

    def _queues(self):
        return (self.dp.queue_counters(), self.dp.pfc_counters(),
                self.dp.credit_counters(self._credit_ifindexes) if self.credits else {})

    def _qdiscs(self, model: dict | None) -> dict[str, tuple[float, dict]]:
        """switch → (the instant of its dump, root qdisc counters of its ports: ifindex → (bytes, packets, drops,
        qlen, backlog)). With ``model``, the queue model's depth of each port is read around the dump (so the two
        describe the same instant) and a drifted single-queue model is reset to the real backlog
        (``Datapath.sync_queue_models``)."""
        out = {}
        if self.fabric is None:
            return out
        for sw in self.topo.switches:
            read_at: list[float] = []

            def read(leaves=None, sw=sw, read_at=read_at):
                return self.fabric.qdisc_stats([sw], read_at, leaves)
            t0 = time.time()
            try:
                if model is not None:
                    got, depths = self.dp.sync_queue_models([p.ifindex for p in self.topo.ports[sw]], read,
                                                            self.resync, self.resync_classes)
                    model.update(depths)
                else:
                    got = read()
            except OSError as e:
                self.failed_dumps += 1
                if len(self.degradations) < 20:
                    self.degradations.append(f"telemetry: qdisc dump of {sw} failed at {t0 - self.origin:.2f} s "
                                             f"({e}); its tx rows of that sample are merged into the next one")
                continue
            out[sw] = (read_at[0], got)
        return out

    def _sample(self) -> None:
        self.samples += 1
        model: dict[int, int] = {}
        qd = self._qdiscs(model)
        queues = self._queues()
        counters = self.dp.port_counters()
        peaks = self.dp.shared_peaks() if self.shared else {}
        self.cpu.sample()
        (q1, pf1, cr1), (q0, pf0, cr0) = queues, self._last_queues
        prios: dict[int, list[int]] = {}
        for ifx, prio in q1:
            prios.setdefault(ifx, []).append(prio)
        for p in self._ports:
            c, c0 = counters.get(p.ifindex), self._last_c.get(p.ifindex)
            if c is None or c0 is None:
                continue
            eg = _port_delta(p.ifindex, prios.get(p.ifindex, ()), q1, q0, pf1, pf0)
            base = {"switch": p.node, "port": p.ifname, "peer": p.peer_node, "role": p.role,
                    "rate_bps": p.rate_bps}
            tx = self._tx_row(p, base, eg, c, c0, qd, model)
            if tx is not None and self.credits:         # the egress's wait for its receiver's credit
                tx["credit_wait_s"] = _credit_delta(p.peer_ifindex, prios.get(p.ifindex, ()), cr1, cr0)["credit_stall_s"]
            if tx is not None and p.node in self.shared:
                tx.update(_shared_buffer(p.node, self.shared[p.node], qd.get(p.node), peaks))
            if tx is not None:
                self.rows.append(tx)
            rx = dict(base, time_s=round(c.read_at - self.origin, 6), direction="rx",
                      bytes=c.rx_bytes - c0.rx_bytes, packets=c.rx_packets - c0.rx_packets,
                      interval_s=round(c.read_at - c0.read_at, 6), drops=0,
                      discards=c.discards - c0.discards, queue_bytes_max=0, queue_bytes_mean=0.0,
                      ecn_marks=0, pause_tx=eg["pause_tx"], pause_rx=0, paused_s=0.0, trims=0)
            if self.credits:
                rx.update(_credit_delta(p.ifindex, prios.get(p.ifindex, ()), cr1, cr0))
            self.rows.append(rx)
        self._last_c, self._last_queues = counters, queues
        self._last_q.update(qd)

    def _tx_row(self, p, base: dict, eg: dict, c, c0, qd: dict, model: dict) -> dict | None:
        offered = c.tx_bytes - c0.tx_bytes
        row = dict(base, direction="tx", offered_bytes=offered, drops=eg["drops"], discards=0,
                   queue_bytes_max=eg["qmax"], queue_bytes_mean=round(eg["qmean"], 1), ecn_marks=eg["ecn"],
                   pause_tx=0, pause_rx=eg["pause_rx"], paused_s=round(eg["paused_s"], 6), trims=eg["trims"])
        if self.fabric is None:                 # no qdisc counters: what the switch program forwarded
            row.update(time_s=round(c.read_at - self.origin, 6), bytes=offered,
                       packets=c.tx_packets - c0.tx_packets, interval_s=round(c.read_at - c0.read_at, 6))
            return row
        now, last = qd.get(p.node), self._last_q.get(p.node)
        if now is None or last is None or p.ifindex not in now[1] or p.ifindex not in last[1]:
            return None                         # dump failed: the next reading covers this interval too
        (t1, d1), (t0, d0) = now, last
        q, q0 = d1[p.ifindex], d0[p.ifindex]
        row.update(time_s=round(t1 - self.origin, 6), bytes=q[0] - q0[0], packets=q[1] - q0[1],
                   interval_s=round(t1 - t0, 6), queue_model_bytes=model.get(p.ifindex, 0), backlog_bytes=q[4],
                   qdisc_drops=q[2] - q0[2])
        self.model_samples.append((model.get(p.ifindex, 0), q[4]))
        return row

    def model_error(self, min_backlog: int = 8192) -> dict:
        """Queue model vs the qdisc's real backlog over samples with a real queue: mean/p90/max relative error."""
        return model_error(self.model_samples, min_backlog)

    def health(self) -> dict:
        """What the manifest records about the sampler itself."""
        return {"samples": self.samples, "late_samples": self.late_samples, "failed_qdisc_dumps": self.failed_dumps,
                "error": self.error}


def model_error(samples, min_backlog: int = 8192) -> dict:
    """Relative error of (model bytes, real backlog bytes) samples with a real queue: mean/p90/max (also for the
    samples of several machines' samplers, merged)."""
    errs = sorted(abs(m - r) / r for m, r in samples if r >= min_backlog)
    if not errs:
        return {"samples": 0, "mean": None, "p90": None, "max": None}
    return {"samples": len(errs), "mean": sum(errs) / len(errs), "p90": errs[int(0.9 * (len(errs) - 1))],
            "max": errs[-1]}


def _shared_buffer(sw: str, size: int, dump, peaks: dict) -> dict:
    """Occupancy of a switch's shared buffer: what its qdiscs held at the sample (all its ports' backlogs) and
    the highest the switch program computed during the interval, in bytes and as a fraction of ``size``."""
    now = sum(v[4] for v in dump[1].values()) if dump else 0
    peak = max(peaks.get(sw, 0), now)
    return {"switch_buffer_bytes": now, "switch_buffer_peak_bytes": peak,
            "switch_buffer_peak_frac": round(peak / size, 4)}


def _credit_delta(ifx: int, prios, c1: dict, c0: dict) -> dict:
    """Credit counters of one receiving port over an interval, summed over its priorities: how often and how long
    the sender on its link was out of credit, and the credit bytes the port granted it."""
    out = {"credit_stalls": 0, "credit_stall_s": 0.0, "credits_granted": 0}
    for prio in prios:
        a, b = c1.get((ifx, prio)), c0.get((ifx, prio), (0, 0, 0))
        if a:
            out["credit_stalls"] += a[0] - b[0]
            out["credit_stall_s"] += (a[1] - b[1]) / 1e9
            out["credits_granted"] += a[2] - b[2]
    out["credit_stall_s"] = round(out["credit_stall_s"], 6)
    return out


def _port_delta(ifx: int, prios, q1: dict, q0: dict, pf1: dict, pf0: dict) -> dict:
    """Congestion counters of one port over an interval, summed over its priorities."""
    out = {"drops": 0, "ecn": 0, "qmax": 0, "qmean": 0.0, "pause_rx": 0, "pause_tx": 0, "paused_s": 0.0, "trims": 0}
    pk = ds = 0
    for prio in prios:
        i = ifx
        c, c0 = q1[(i, prio)], q0.get((i, prio))
        out["drops"] += c.drops - (c0.drops if c0 else 0)
        out["trims"] += c.trims - (c0.trims if c0 else 0)
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
