"""The switch program's queue model, read from user space: depth, bytes sent, PFC ingress accounting, resync.

The model lives in BPF maps (ebpf/lib/qos.h): ``vq`` holds the time at which an (egress port, priority) queue
would be empty if it drained at the port rate, ``vq_enq`` the bytes ever enqueued, ``egress_paused`` when a
paused queue stopped draining, ``ingress_acct`` the chunks of lossless bytes per ingress. The telemetry
sampler and the PFC agent both read it and both resynchronise it with the real qdisc backlog; the arithmetic
they share is here, in one place.
"""
from __future__ import annotations

import time

from ..fabric.port import N_PRIO


def resynced_finish(base_ns: int, backlog: int, ps_per_byte: int, v_before: int, v_after: int) -> int:
    """A queue model's finish time (ns) set to a real backlog of ``backlog`` bytes read at ``base_ns``, keeping
    the bytes the switch program accounted while the backlog was read (the model read ``v_before`` before the
    read and ``v_after`` after it). Used by the agent's pause/resume resync and the drift resyncs below."""
    return base_ns + backlog * ps_per_byte // 1000 + max(0, v_after - max(v_before, base_ns))


def drift_resync(now_ns: int, backlog: int, ps_per_byte: int, v_before: int, v_after: int,
                 slack: int) -> tuple[int, int | None]:
    """A running queue's model against its real backlog read just before ``now_ns``: (the model's depth in
    bytes, the finish time to write when it is more than ``slack`` bytes off, else None). Shared by the
    telemetry sampler (single-queue ports) and the PFC agent's sweep (ports with classes)."""
    depth = max(0, v_after - now_ns) * 1000 // ps_per_byte
    if abs(depth - backlog) <= slack:
        return depth, None
    return depth, resynced_finish(now_ns, backlog, ps_per_byte, v_before, v_after)


def queue_sent(bpf, port: int, prio: int, now: int) -> int:
    """Bytes the model's egress queue (port, prio) has sent so far: enqueued − depth (qos_sent in lib/qos.h)."""
    k = port * N_PRIO + prio
    ps = bpf[b"port_qos"][bpf[b"port_qos"].Key(port)].ps_per_byte
    if not ps:
        return 0
    eff = now
    paused = bpf[b"egress_paused"][bpf[b"egress_paused"].Key(k)].value
    if paused and paused < now:
        eff = paused
    v = bpf[b"vq"][bpf[b"vq"].Key(k)].value
    en = bpf[b"vq_enq"][bpf[b"vq_enq"].Key(k)].value
    depth = (v - eff) * 1000 // ps if v > eff else 0
    return max(0, en - depth)


def ingress_queued(bpf, slots: int, port: int, prio: int, now: int | None = None) -> int:
    """Bytes that arrived on ingress (port, prio) and still sit in some egress queue of its switch: the PFC
    ingress accounting of lib/qos.h (ingress_recount), read without writing (the switch program owns it)."""
    now = now if now is not None else time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    t = bpf[b"ingress_acct"]
    total = 0
    base = (port * N_PRIO + prio) * slots
    for s in range(slots):
        c = t[t.Key(base + s)]
        if not c.bytes:
            continue
        sent = queue_sent(bpf, c.port, prio, now)
        if sent <= c.start:
            total += c.bytes
        elif sent < c.end and c.end > c.start:
            total += c.bytes * (c.end - sent) // (c.end - c.start)
    return total
