"""The queue model, ECN, PFC, credit and shared-buffer maps of the switch program, read and changed
from user space (ebpf/lib/vqueue.h, pfc.h, credit.h, shared_buffer.h; the model itself in queue_model.py)."""
from __future__ import annotations

import time

from ..fabric.port import N_PRIO
from . import queue_model
from .queue_model import drift_resync, ingress_queued, queue_state
from .records import QueueCounters


class QosMaps:
    """A part of Datapath (datapath/program.py): queue model, ECN, PFC, credit and shared-buffer maps of the switch program, read and changed."""

    def qos_for(self, switch: str):
        return self.switch_spec.qos(self.topo.nodes[switch].kind)

    def priorities(self) -> list[int]:
        """Priorities any switch uses (the queues worth reading)."""
        return sorted({p for t in self.topo.tiers for p in self.switch_spec.qos(t).priorities()})

    def _fill_qos(self):
        cfg_t, pq_t = self._bpf[b"qos_config"], self._bpf[b"port_qos"]
        trim_prio = self.switch_spec.trim_priority(self.topo.tiers)
        for sw in self.topo.switches:
            q = self.qos_for(sw)
            v = cfg_t.Leaf()
            tc = q.traffic_classes
            for d in range(64):          # with INT, DSCP bit 0 marks a stack: d | 1 is classified as d
                v.dscp_prio[d] = tc.dscp.get(d & ~1 if self.int_on else d, tc.default)
            v.pfc = 1 if (q.pfc.enabled and tc.lossless) else 0
            v.credit = 1 if (q.credit.enabled and tc.lossless) else 0
            v.lossless = sum(1 << p for p in q.lossless)       # without PFC or credits nothing is lossless
            v.xoff = q.pfc.xoff
            if trim_prio is not None:    # trimming (lib/trim.h): flagged headers go to its priority everywhere
                v.trim_classify, v.trim_prio = 1, trim_prio
                v.trim_on = 1 if q.trim.enabled else 0
                v.trim_threshold = (q.trim.threshold or 0) if q.trim.enabled else 0
            for prio, e in q.ecn.items():
                v.ecn_on |= 1 << prio
                v.kmin[prio], v.kmax[prio] = e.kmin, e.kmax
                v.pmax[prio] = min(int(round(e.pmax * 2**32)), 2**32)
            pool = self.ports[self.topo.ports[sw][0].ifindex].shared_pool
            if pool:                     # one buffer for the switch: dynamic thresholds over its queues
                v.shared_pool, v.alpha, v.headroom = pool, int(round(q.shared_buffer.alpha * 1024)), q.headroom
                keys = self.shared_queues(sw)
                sq = self._bpf[b"sw_queues"].Leaf()
                sq.n = len(keys)
                for i, k in enumerate(keys):
                    sq.key[i], sq.ps_per_byte[i] = k, self.ports[k // N_PRIO].ps_per_byte
                self._bpf[b"sw_queues"][self._bpf[b"sw_queues"].Key(self.topo.switch_ids[sw])] = sq
            cfg_t[cfg_t.Key(self.topo.switch_ids[sw])] = v
            for local, p in enumerate(self.topo.ports[sw]):
                c = self.ports[p.ifindex]
                w = pq_t.Leaf()
                w.local = local
                w.ps_per_byte = c.ps_per_byte
                w.buffer = c.buffer_bytes
                w.classes = 1 if c.classes else 0
                w.lossless_limit = c.lossless_limit
                w.ingress_limit = c.ingress_buffer
                pq_t[pq_t.Key(p.ifindex)] = w

    def port_buffer(self, port) -> int:
        """Bytes one queue of a switch port may hold (switch.buffer or its tier's, else the link's buffer)."""
        return self.ports[port.ifindex].buffer_bytes

    def queue_counters(self, ports=None, reset_max: bool = True) -> dict[tuple[int, int], QueueCounters]:
        """(ifindex, priority) → counters, for switch ports (or ``ports``) and the priorities in use."""
        self._need()
        t, mt = self._bpf[b"queue_stats"], self._bpf[b"queue_max"]
        prios = self.priorities()
        out = {}
        for ifx in (ports if ports is not None else self._all_ports):
            for prio in prios:
                k = ifx * N_PRIO + prio
                c = QueueCounters()
                for cpu in t.getvalue(t.Key(k)):
                    c.packets += cpu.packets
                    c.bytes += cpu.bytes
                    c.depth_sum += cpu.depth_sum
                    c.ecn_marks += cpu.ecn_marks
                    c.ect_packets += cpu.ect_packets
                    c.drops += cpu.drops
                    c.pause_rx += cpu.pause_rx
                    c.xoff_events += cpu.xoff_events
                    c.overflows += cpu.overflows
                    c.trims += cpu.trims
                c.depth_max = int(max(mt.getvalue(mt.Key(k))))
                out[(ifx, prio)] = c
        if reset_max:
            mt.clear()
        return out

    def pfc_counters(self, ports=None) -> dict[tuple[int, int], tuple[int, int]]:
        """(ifindex, priority) → (PFC frames sent out of the port, ns its egress was paused, including an
        ongoing pause), from the agent's map."""
        self._need()
        st, pa = self._bpf[b"pfc_stats"], self._bpf[b"egress_paused"]
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        out = {}
        for ifx in (ports if ports is not None else self._all_ports):
            for prio in self.priorities():
                k = ifx * N_PRIO + prio
                v = st[st.Key(k)]
                since = pa[pa.Key(k)].value
                out[(ifx, prio)] = (int(v.pause_tx), int(v.paused_ns) + (now - since if 0 < since < now else 0))
        return out

    def credit_counters(self, ports=None) -> dict[tuple[int, int], tuple[int, int, int]]:
        """(receiving ifindex, priority) → (times its sender ran out of credit, ns it was stalled, including an
        ongoing stall, credit bytes granted), from the credit meter's map (testbed/qos/credits.py)."""
        self._need()
        st = self._bpf[b"credit_stats"]
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        out = {}
        for ifx in (ports if ports is not None else self._all_ports):
            for prio in self.priorities():
                v = st[st.Key(ifx * N_PRIO + prio)]
                since = int(v.since)
                out[(ifx, prio)] = (int(v.stalls), int(v.stall_ns) + (now - since if 0 < since < now else 0),
                                    int(v.granted))
        return out

    def ingress_queued(self, ifindex: int, prio: int) -> int:
        """PFC ingress accounting: bytes that arrived on (ifindex, prio) and still sit in the switch's egress
        queues (what Xoff/Xon compare against)."""
        self._need()
        return ingress_queued(self._bpf, self.sizes["ACCT_SLOTS"], ifindex, prio)

    def queue_depth(self, ifindex: int, prio: int | None = None) -> int:
        """The model's depth of a port's queue (one priority, or all) now, in bytes."""
        self._need()
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return sum(queue_state(self._bpf, ifindex, p, now)[0]
                   for p in ([prio] if prio is not None else self.priorities()))

    def shared_queues(self, switch: str) -> list[int]:
        """vq indexes of every queue of a switch (its ports × the priorities in use): what its shared buffer
        holds."""
        return [p.ifindex * N_PRIO + prio for p in self.topo.ports[switch] for prio in self.priorities()]

    def shared_peaks(self, reset: bool = True) -> dict[str, int]:
        """Switch → highest shared-buffer occupancy the switch program computed since the last reading (bytes),
        for switches with a shared buffer."""
        self._need()
        t = self._bpf[b"shared_peak"]
        out = {sw: int(max(t.getvalue(t.Key(self.topo.switch_ids[sw]))))
               for sw in self.topo.switches if self.ports[self.topo.ports[sw][0].ifindex].shared_pool}
        if reset:
            t.clear()
        return out

    @property
    def control_fd(self) -> int:
        """The control program (ftb_ctl): see ``control``. Also usable from a forked child (the PFC agent)."""
        self._need()
        return self._ctl.fd

    def control(self, op: int, key: int, a: int = 0, b: int = 0, c: int = 0) -> int:
        """Change the queue model atomically with the switch program's updates (queue_model.control)."""
        self._need()
        return queue_model.control(self._ctl.fd, op, key, a, b, c)

    def sync_queue_models(self, ifindexes, read_backlogs, resync: bool = True,
                          classes: bool = False) -> tuple[dict, dict[int, int]]:
        """Read the real backlogs (``read_backlogs(leaves)``: a root-qdisc dump, ifindex → (bytes, packets, drops,
        qlen, backlog), filling ``leaves`` with the backlog of each priority's qdisc) between two reads of the
        models of ``ifindexes``; return the dump and each port's model depth at that instant, and reset a model
        that is more than a frame off to the real backlog: the single queue of a port without traffic classes,
        and — with ``classes`` (a lab without a PFC agent, which would do it) — each running priority's queue.

        Why: the model drains at the nominal rate, but the real shaper can fall a few ms behind (a late timer or
        softirq, even on a quiet machine). On a queue that never empties that lag never comes back: the real
        queue stayed 10–20 KB (10–30 %) above the model for the rest of the run, so the switch's tail drop and
        ECN acted on the wrong depth. With PFC, the agent resynchronises the classes at each pause and resume and
        in its sweep."""
        self._need()
        vq, pq, pa = self._bpf[b"vq"], self._bpf[b"port_qos"], self._bpf[b"egress_paused"]
        single = not self.switch_spec.classes_on
        prios = [0] if single else (self.priorities() if classes else [])
        keys = {(i, prio): vq.Key(i * N_PRIO + prio) for i in ifindexes for prio in prios}
        before = {q: vq[k].finish for q, k in keys.items()}
        leaves: dict = {}
        dump = read_backlogs(leaves)
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        depths = {i: self.queue_depth(i) for i in ifindexes if i in dump and not single}
        for (i, prio), k in keys.items():
            c = self.ports.get(i)
            if i not in dump or c is None:
                continue
            backlog = dump[i][4] if single else leaves.get((i, c.class_id(prio)))
            if backlog is None or pa[pa.Key(i * N_PRIO + prio)].value:     # no such class, or paused
                continue
            ps = pq[pq.Key(i)].ps_per_byte
            if not ps:
                continue
            depth, fix = drift_resync(now, backlog, ps, vq[k].finish, self.topo.spec.mtu)
            if single:
                depths[i] = depth
            if fix and resync:
                self.control(queue_model.CTL_VQ_RESYNC, i * N_PRIO + prio, now, backlog * ps // 1000,
                             before[(i, prio)])
                self.resyncs += 1
        return dump, depths
