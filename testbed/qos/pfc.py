"""The PFC agent: turns Xoff/Xon of the switch program into real 802.1Qbb frames and paused serialisers.

The kernel cannot hold packets inside BPF, so a pause stops the upstream port's serialiser
(docs/architecture.md, 2.7): every
port has HTB with one class per priority and a TBF leaf under each; pausing a priority changes that TBF to a
tiny rate, resuming changes it back and sends one small "kick" frame so HTB dequeues at once.

One forked process (SCHED_FIFO when allowed) does all of it, blocked on the BPF ring buffer:
- EVT_XOFF (the bytes that came in on port P at a lossless priority and still sit in the switch's egress queues
  passed Xoff — ingress accounting, lib/pfc.h): send a PFC frame out of P (quanta 0xffff for that priority).
  Then watch that ingress's queued bytes (``ingress_queued``); when they fall to Xon, send a PFC frame with
  quanta 0 (Xon) and record how long after Xoff the last lossless frame still arrived on P (the reaction).
- EVT_PFC_RX (a PFC frame arrived on port Q, switch or host NIC): pause/resume Q's classes as the frame says,
  with pre-encoded netlink messages on a raw socket per namespace, and tell the queue model (egress_paused).
PFC frames leave through AF_PACKET with PACKET_QDISC_BYPASS: like MAC control frames in hardware they do not
wait behind the data queued on the port.
"""
from __future__ import annotations

import ctypes as ct
import os
import signal
import socket
import struct
import time

from ..datapath.queue_model import (CTL_VQ_RESYNC, CTL_VQ_SHIFT, CTL_XON_RESET, control, drift_resync,
                                    ingress_queued, shared_threshold, shared_used)
from ..errors import HelperFailed
from ..fabric import netns
from ..helper import ForkedHelper, wait_readable, write_result
from ..fabric.netlink import QdiscStats, qdisc_get_message, qdisc_stats, tbf_change_message
from ..fabric.port import ETH_HLEN, N_PRIO, PortConfig
from .mac_control import ETH_P_KICK, ETH_P_MACCTL, KICK_LEN, PFC_DST, PFC_OPCODE

SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
PAUSE_RATE_BPS = 8000          # ≥ 4 kbit/s: lower rates make the kernel cap the bucket below a frame
                               # (docs/architecture.md, 3.7)
EVT_XOFF, EVT_PFC_RX, EVT_CREDIT_RX = 1, 2, 3
XON_POLL_S = 0.0002
SHARED_LEVEL_S = 0.001          # a shared buffer's Xon level is recomputed at most this often (it reads every
                                # queue of the switch: ~80 µs at 8 queues; at every 0.2 ms poll that was a core)
SWEEP_S = 0.02              # drift resync of the running queues: a sweep every 20 ms …
SWEEP_BATCH = 32            # … in batches of this many queues, so a sweep never delays a pause for long


def pfc_frame(src_mac: bytes, vector: int, quanta: int) -> bytes:
    """An 802.1Qbb frame: MAC control, opcode 0x0101, class-enable vector, 8 pause quanta, padded to 60 bytes."""
    q = [quanta if vector & (1 << i) else 0 for i in range(N_PRIO)]
    body = struct.pack("!HHH8H", ETH_P_MACCTL, PFC_OPCODE, vector, *q)
    return (PFC_DST + src_mac + body).ljust(60, b"\0")


def _pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summarize_reactions(samples: dict) -> dict:
    """p50/p99/max of the agent's timings, in microseconds."""
    out = {}
    for key in ("reaction_us", "apply_us", "leaked"):
        xs = samples.get(key) or []
        out[key] = {"n": len(xs), "p50": _pct(xs, 50), "p99": _pct(xs, 99), "max": max(xs) if xs else None}
    out["late"] = samples.get("late") or {"events": 0, "leaked_max": 0, "headroom_frames": None, "reaction_us": None}
    return out


class PfcAgentFailed(HelperFailed):
    """The PFC agent process died or could not report; the message is one line naming it."""


class PfcEvent(ct.Structure):                       # struct pfc_event (ebpf/lib/common.h)
    _fields_ = [("ts", ct.c_uint64), ("kind", ct.c_uint32), ("port", ct.c_uint32), ("prio", ct.c_uint32),
                ("cause", ct.c_uint32), ("quanta", ct.c_uint16 * N_PRIO), ("limit", ct.c_uint64)]


class PfcAgent(ForkedHelper):
    """Owns the forked agent process (helper.py). ``start()`` after the datapath is loaded and attached;
    ``stop()`` returns the timings it measured (lists of µs)."""

    label = "PFC agent"
    failure = PfcAgentFailed

    def __init__(self, datapath, fabric, scen):
        super().__init__()
        self.dp, self.fabric, self.scen, self.topo = datapath, fabric, scen, fabric.topo
        sw = scen.switch
        pfc = any(sw.qos(t).pfc.enabled and sw.qos(t).traffic_classes.lossless for t in self.topo.tiers)
        if sw.credit_on:                 # one process runs the flow control of every tier: named after what it runs
            self.label = "PFC and credit agent" if pfc else "credit agent"

    # ---- set-up in the parent (sockets must be made inside each namespace)

    def _prepare(self):
        topo, scen = self.topo, self.scen
        self.nl = {}              # node → netlink socket
        self.pkt = {}             # ifindex → AF_PACKET socket (bypass) for PFC frames
        self.kick = {}            # ifindex → AF_PACKET socket (through the qdisc) for kick frames
        self.msgs = {}            # (ifindex, prio) → (pause bytes, resume bytes)
        self.getq = {}            # (ifindex, prio) → RTM_GETQDISC of that class's TBF (read_qdisc)
        ports = [p for sw in topo.switches for p in topo.ports[sw]]
        if scen.hosts.pfc or scen.switch.credit_on:         # host NICs obey PFC (hosts.pfc) or credits
            ports += [p for h in topo.hosts for p in topo.ports[h]]
        self.ports = {p.ifindex: p for p in ports}
        for node in {p.node for p in ports}:
            self.nl[node] = netns.netlink_socket(self.fabric.ns[node])
        for p in ports:
            def make(_p=p):
                a = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                a.bind((_p.ifname, 0))
                a.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
                k = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                k.bind((_p.ifname, 0))
                return a, k
            self.pkt[p.ifindex], self.kick[p.ifindex] = netns.run_in(self.fabric.ns[p.node], make)
            c = self.fabric.ports[p.ifindex]
            for prio in c.classes:
                limit = c.queue_limit(prio)
                self.msgs[(p.ifindex, prio)] = (
                    tbf_change_message(p.ifindex, c.leaf_handle(prio), c.class_id(prio), PAUSE_RATE_BPS,
                                       c.mtu + ETH_HLEN, limit),
                    tbf_change_message(p.ifindex, c.leaf_handle(prio), c.class_id(prio), c.rate_bps,
                                       c.burst_bytes, limit))
                self.getq[(p.ifindex, prio)] = qdisc_get_message(p.ifindex, c.leaf_handle(prio), c.class_id(prio))

    def start(self) -> None:
        """Fork the agent and wait until its ring buffer is open; raise PfcAgentFailed if it dies before."""
        self._prepare()
        bpf = self.dp.bpf
        ring = bpf[b"pfc_events"]

        def close_sockets():
            for d in (self.pkt, self.kick):
                for s in d.values():
                    s.close()
            for s in self.nl.values():
                s.close()
        self._fork(lambda wfd, ready: _Agent(self, bpf, ring, wfd, ready).run(), f"ftb-{self.fabric.lab}-pfc",
                   after_fork=close_sockets)


class _Agent:
    def __init__(self, owner: PfcAgent, bpf, ring, wfd: int, ready):
        self.o, self.bpf, self.ring, self.wfd, self.ready = owner, bpf, ring, wfd, ready
        self.vq, self.paused = bpf[b"vq"], bpf[b"egress_paused"]
        self.ingress, self.stats, self.pq = bpf[b"ingress_state"], bpf[b"pfc_stats"], bpf[b"port_qos"]
        self.ctl_fd = owner.dp.control_fd
        self.watch: dict[tuple[int, int], tuple[int, int]] = {}     # (in port, prio) → (xoff ns, cause port)
        self.xoff_at: dict[tuple[int, int], int] = {}                # (downstream port, prio) → xoff ns
        self.egress_since: dict[tuple[int, int], int] = {}
        self.kicked: dict[tuple[int, int], int] = {}                 # (port, prio) → kick frames sent through it
        self.samples = {"reaction_us": [], "apply_us": [], "leaked": []}
        self.late = {"events": 0, "leaked_max": 0, "headroom_frames": None, "reaction_us": None}  # see _judge
        self.errors: list[str] = []
        self.degradations: list[str] = []
        self.resyncs = 0
        self.drift_resyncs = 0
        self.sweep_keys = sorted(k for k in owner.getq if owner.ports[k[0]].role != "nic")   # NICs: no model
        self.sweep_pos = 0
        self.sweep_next = 0.0
        self.mtu = owner.topo.spec.mtu
        self.slots = owner.dp.sizes["ACCT_SLOTS"]
        self.stop = False
        sw = owner.scen.switch
        self.credits = None
        if sw.credit_on:
            from .credits import CreditMeter
            interval = min(sw.qos(t).credit.update_interval for t in owner.topo.tiers if sw.qos(t).credit.enabled)
            self.credits = CreditMeter(self, interval)
        self.xon = {}
        self.headroom = {}        # switch → bytes a lossless ingress holds after Xoff (what covers the reaction)
        self.shared = {}          # switch → (pool, alpha × 2^10, Xon offset, its queues): dynamic Xon
        self.shared_level: dict[str, tuple[int, int]] = {}          # switch → (computed at ns, Xon level)
        for sw in owner.topo.switches:
            q = owner.scen.switch.qos(owner.topo.nodes[sw].kind)
            self.xon[sw] = q.pfc.xon
            self.headroom[sw] = q.headroom if q.shared_buffer else q.pfc.headroom
            pool = owner.dp.ports[owner.topo.ports[sw][0].ifindex].shared_pool
            if pool:
                self.shared[sw] = (pool, int(round(q.shared_buffer.alpha * 1024)), q.shared_buffer.xon_offset,
                                   owner.dp.shared_queues(sw))

    def run(self):
        signal.signal(signal.SIGTERM, self._term)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        except OSError as e:
            self.degradations.append(f"PFC agent: SCHED_FIFO refused ({e.strerror}): it runs at normal priority, "
                                     f"so pause reactions may be slower under load")
        self.ring.open_ring_buffer(self._event)
        fd = self.ring.map_fd
        self.ready()
        while not self.stop:
            timeout = XON_POLL_S if self.watch else max(0.0, min(0.05, self.sweep_next - time.monotonic()))
            if self.credits is not None:
                timeout = min(timeout, max(0.0, (self.credits.next_ns - self._now()) / 1e9))
            try:
                r = wait_readable([fd], timeout)
            except InterruptedError:
                continue
            if r:
                self.bpf.ring_buffer_consume()
            if self.watch:
                self._check_xon()
            if self.credits is not None:
                self.credits.tick()
            if time.monotonic() >= self.sweep_next:
                self._sweep()
        self._finish()

    def _sweep(self):
        """Resynchronise the next batch of running (not paused) queues with their real backlog, when the model is
        more than a frame off. Why: a shaper that falls a few ms behind its timers (even on a quiet machine)
        leaves the real queue above the model, and a queue PFC keeps busy never empties to correct it. On the
        incast receiver's port — never paused itself, so never resynchronised at a pause — the lag piled up until
        the lossless class overflowed its 4 × buffer limit (drops in 4 of 10 runs); per-ingress Xon also trusts
        the model's drain."""
        keys = self.sweep_keys[self.sweep_pos:self.sweep_pos + SWEEP_BATCH]
        self.sweep_pos += len(keys)
        if self.sweep_pos >= len(self.sweep_keys):
            self.sweep_pos = 0
            self.sweep_next = time.monotonic() + SWEEP_S
        for key in keys:
            if key not in self.egress_since:
                self._resync(key[0], key[1], None)

    def _term(self, *_):
        self.stop = True

    def _now(self) -> int:
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC)

    # ---- events

    def _event(self, ctx, data, size):
        ev = ct.cast(data, ct.POINTER(PfcEvent)).contents
        if ev.kind == EVT_XOFF:
            key = (ev.port, ev.prio)
            if key in self.watch:
                return
            self.watch[key] = (ev.ts, ev.cause)
            self.xoff_at[key] = ev.ts
            self._send_pfc(ev.port, 1 << ev.prio, 0xFFFF)
        elif ev.kind == EVT_CREDIT_RX:
            if self.credits is not None:
                self.credits.on_grant(ev.port, ev.prio, ev.limit, bool(ev.quanta[0] & 1), ev.cause, ev.ts)
        elif ev.kind == EVT_PFC_RX:
            for prio in range(N_PRIO):
                if ev.prio & (1 << prio):
                    if ev.quanta[prio]:
                        self._pause(ev.port, prio, ev.ts)
                    else:
                        self._resume(ev.port, prio)

    def _send_pfc(self, port: int, vector: int, quanta: int):
        p = self.o.ports.get(port)
        s = self.o.pkt.get(port)
        if p is None or s is None:
            return
        try:
            s.send(pfc_frame(bytes.fromhex(p.mac.replace(":", "")), vector, quanta))
        except OSError as e:
            self.errors.append(f"pfc tx on {p.node}/{p.ifname}: {e}")
            return
        for prio in range(N_PRIO):
            if vector & (1 << prio):
                k = self.stats.Key(port * N_PRIO + prio)
                v = self.stats[k]
                v.pause_tx += 1
                self.stats[k] = v

    def netlink(self, port: int, msg: bytes):
        p = self.o.ports[port]
        s = self.o.nl[p.node]
        s.send(msg)
        reply = s.recv(65536)
        code = struct.unpack_from("i", reply, 16)[0] if len(reply) >= 20 else 0
        if code:
            self.errors.append(f"tbf change on {p.node}/{p.ifname}: {os.strerror(-code)}")

    def _pause(self, port: int, prio: int, rx_ts: int):
        key = (port, prio)
        if key in self.egress_since or key not in self.o.msgs:
            return
        self.netlink(port, self.o.msgs[key][0])
        now = self._now()
        self._freeze(port, prio, now)
        down = self.o.ports[port].peer_ifindex
        t_xoff = self.xoff_at.get((down, prio))
        if t_xoff:
            self.samples["apply_us"].append((now - t_xoff) / 1000)

    def _resume(self, port: int, prio: int):
        key = (port, prio)
        if key not in self.egress_since:
            return
        self.netlink(port, self.o.msgs[key][1])
        now = self._now()
        since = self._thaw(port, prio, now)
        sk = self.stats.Key(port * N_PRIO + prio)
        st = self.stats[sk]
        st.paused_ns += now - since
        self.stats[sk] = st
        self.kick(port, prio)

    def _freeze(self, port: int, prio: int, now: int) -> None:
        """Tell the queue model that (port, prio) stopped sending at ``now`` (paused by PFC, or out of credit)
        and set it to the class's real backlog."""
        self.paused[self.paused.Key(port * N_PRIO + prio)] = self.paused.Leaf(now)
        self.egress_since[(port, prio)] = now
        self._resync(port, prio, now)

    def _thaw(self, port: int, prio: int, now: int) -> int:
        """The queue of (port, prio) sends again from ``now``: the model drains again (shifted by the time it
        stood still, or resynchronised); returns when it had stopped."""
        since = self.egress_since.pop((port, prio))
        idx = port * N_PRIO + prio
        if not self._resync(port, prio, now):                  # the queue did not drain while stopped
            self.control(CTL_VQ_SHIFT, idx, since, now - since)
        self.paused[self.paused.Key(idx)] = self.paused.Leaf(0)
        return since

    def _resync(self, port: int, prio: int, eff: int | None) -> bool:
        """Set the queue model of (port, prio) to the class's real backlog, read while its serialiser is stopped
        (just after a pause, or after a resume but before the kick that restarts HTB): the queue is frozen, so
        the reading is exact. ``eff`` is the model's drain time base (pause start, or now at a resume); None: a
        running queue (``_sweep``), based at the time of the reading and only corrected when a frame off.

        Why: the model drains at the nominal rate and stops for the recorded pause, but the real shaper lets
        extra bytes out around each pause (a TBF change refills its bucket: one frame leaks at the pause, a
        burst leaves at the resume) and may fall behind its timers on a busy CPU. Under PFC the queue never
        empties, so these errors accumulated (the model read 20–60 % high); resynchronising at every pause
        and resume bounds the error to what one pause cycle adds. Packets the switch program accounts
        between the two map accesses are kept (the difference of the two reads is added back)."""
        if (port, prio) not in self.o.getq:
            return False
        ps = self.pq[self.pq.Key(port)].ps_per_byte
        if not ps:                                           # a host NIC: no queue model
            return False
        vk = self.vq.Key(port * N_PRIO + prio)
        v0 = self.vq[vk].finish
        st = self.read_qdisc(port, prio)
        if st is None:
            return False
        backlog = st.backlog
        if eff is None:
            eff = self._now()
            if not drift_resync(eff, backlog, ps, self.vq[vk].finish, self.mtu)[1]:
                return True
            self.drift_resyncs += 1
        else:
            self.resyncs += 1
        self.control(CTL_VQ_RESYNC, port * N_PRIO + prio, eff, backlog * ps // 1000, v0)
        return True

    def read_qdisc(self, port: int, prio: int, required: bool = False) -> QdiscStats | None:
        """The statistics of the TBF leaf of (port, prio), read with its prepared RTM_GETQDISC: the one place
        that asks, for the queue model's resync (its backlog) and the credit meter (the bytes it sent). None if
        the socket fails (recorded as an error) or the answer has no statistics (recorded too if ``required``;
        a resync just skips that queue)."""
        p = self.o.ports[port]
        s = self.o.nl[p.node]
        try:
            s.send(self.o.getq[(port, prio)])
            st = qdisc_stats(s.recv(65536))
        except OSError as e:
            self.errors.append(f"qdisc get on {p.node}/{p.ifname}: {e}")
            return None
        if st is None and required:
            self.errors.append(f"qdisc get on {p.node}/{p.ifname}: no statistics in the answer")
        return st

    def control(self, op: int, key: int, a: int = 0, b: int = 0, c: int = 0) -> None:
        """An atomic change to the queue model (the switch program updates it from other CPUs meanwhile)."""
        rc = control(self.ctl_fd, op, key, a, b, c)
        if rc != 0:
            self.errors.append(f"queue model control {op} on key {key}: {rc}")

    def kick(self, port: int, prio: int):
        """Send a frame through the port's qdisc: HTB dequeues again now rather than when the stopped TBF's
        watchdog (set for its old, near-zero rate) would fire."""
        p = self.o.ports[port]
        s = self.o.kick[port]
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, PortConfig.skb_priority(prio))
            s.send(bytes.fromhex(p.peer_mac.replace(":", "")) + bytes.fromhex(p.mac.replace(":", ""))
                   + struct.pack("!H", ETH_P_KICK) + bytes(KICK_LEN - 14))
        except OSError as e:
            self.errors.append(f"kick on {p.node}/{p.ifname}: {e}")
            return
        self.kicked[(port, prio)] = self.kicked.get((port, prio), 0) + 1

    # ---- Xon

    def _xon_level(self, sw: str, now: int) -> int:
        """Bytes an ingress of ``sw`` must fall to for Xon: pfc.xon, or with a shared buffer the dynamic
        threshold less the Xon offset (the Xoff rule of lib/pfc.h with hysteresis), at most SHARED_LEVEL_S old
        (the queues drain meanwhile: the level only rises, so a cached one resumes a little late, never early)."""
        if sw not in self.shared:
            return self.xon[sw]
        at, level = self.shared_level.get(sw, (0, 0))
        if now - at < SHARED_LEVEL_S * 1e9:
            return level
        pool, alpha, offset, keys = self.shared[sw]
        level = max(0, shared_threshold(pool, alpha, shared_used(self.bpf, keys, now)) - offset)
        self.shared_level[sw] = (now, level)
        return level

    def _check_xon(self):
        levels: dict[str, int] = {}
        for key, (t_xoff, cause) in list(self.watch.items()):
            port, prio = key
            sw = self.o.topo.port(port).node
            now = self._now()
            if sw not in levels:
                levels[sw] = self._xon_level(sw, now)
            if ingress_queued(self.bpf, self.slots, port, prio, now) > levels[sw]:
                continue
            self._send_pfc(port, 1 << prio, 0)
            del self.watch[key]
            idx = port * N_PRIO + prio
            st = self.ingress[self.ingress.Key(idx)]
            reaction_us = (st.last_ns - t_xoff) / 1000 if st.last_ns and st.last_ns > t_xoff else 0.0
            self.samples["reaction_us"].append(reaction_us)
            self._judge(sw, int(st.leaked), reaction_us)
            self.samples["leaked"].append(int(st.leaked))
            self.control(CTL_XON_RESET, idx)                # Xon: the next crossing raises Xoff again

    def _judge(self, sw: str, leaked: int, reaction_us: float) -> None:
        """More frames arrived after Xoff than the headroom holds: a hardware switch, pausing within
        microseconds, lets one frame through; this agent, late for CPU, let these (the guard's rule)."""
        room = self.headroom[sw] // (self.mtu + ETH_HLEN)
        if leaked > max(1, room):
            self.late["events"] += 1
            if leaked > self.late["leaked_max"]:
                self.late.update(leaked_max=leaked, headroom_frames=room, reaction_us=round(reaction_us, 1))

    def _finish(self):
        now = self._now()
        for (port, prio), since in self.egress_since.items():   # still paused at the end: count it
            sk = self.stats.Key(port * N_PRIO + prio)
            st = self.stats[sk]
            st.paused_ns += now - since
            self.stats[sk] = st
        out = dict(self.samples)
        if self.credits is not None:
            out["credits"] = self.credits.finish()
        out["errors"] = self.errors[:20]
        out["error_count"] = len(self.errors)
        out["degradations"] = self.degradations
        out["resyncs"] = self.resyncs
        out["drift_resyncs"] = self.drift_resyncs
        out["late"] = self.late
        write_result(self.wfd, out)
