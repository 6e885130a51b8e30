"""The switch program's queue model, read from user space: depth, bytes sent, PFC ingress accounting, resync.

The model lives in BPF maps (ebpf/lib/vqueue.h): ``vq`` holds the time at which an (egress port, priority) queue
would be empty if it drained at the port rate and the bytes ever enqueued, ``egress_paused`` when a
paused queue stopped draining, ``ingress_state`` the chunks of lossless bytes per ingress. The telemetry
sampler and the PFC agent both read it and both resynchronise it with the real qdisc backlog; the arithmetic
they share is here, in one place.
"""
from __future__ import annotations

import struct
import time

from ..fabric.port import N_PRIO
from . import testrun

CTL_VQ_RESYNC, CTL_VQ_SHIFT, CTL_XON_RESET, CTL_VQ_CREDIT, CTL_INGRESS_RECOUNT = 1, 2, 3, 4, 5   # ebpf/lib/common.h
CTL_CMD = struct.Struct("=IIQQQ")                          # struct ctl_cmd


def drift_resync(now_ns: int, backlog: int, ps_per_byte: int, v_after: int, slack: int) -> tuple[int, bool]:
    """A running queue's model (finish time ``v_after``, read just after the backlog) against its real backlog
    read just before ``now_ns``: (the model's depth in
    bytes, whether it is more than ``slack`` bytes off and must be resynchronised — ``CTL_VQ_RESYNC`` with base
    ``now_ns``). Shared by the telemetry sampler (single-queue ports) and the PFC agent's sweep (classes)."""
    depth = max(0, v_after - now_ns) * 1000 // ps_per_byte
    return depth, abs(depth - backlog) > slack


def control(prog_fd: int, op: int, key: int, a: int = 0, b: int = 0, c: int = 0) -> int:
    """Run one command of the control program (ftb_ctl, struct ctl_cmd in ebpf/lib/common.h) with
    BPF_PROG_TEST_RUN. The switch program updates the model under a per-queue (and per-ingress) spin lock; a
    plain map write from user space would race with it (a packet accounted between our read and our write
    would be lost), so every change goes through the same locks in the kernel. Returns the program's verdict
    (0 = done, < 0 = refused: unknown command or key); one syscall, a few µs."""
    r = testrun.run(prog_fd, CTL_CMD.pack(op, key, a, b, c))
    return struct.unpack("i", struct.pack("I", r.verdict))[0]


def queue_state(bpf, port: int, prio: int, now: int) -> tuple[int, int]:
    """(depth now, bytes ever enqueued) of the model's egress queue (port, prio); a queue out of credit holds at
    least what it may not send yet (vq_read in lib/vqueue.h)."""
    k = port * N_PRIO + prio
    ps = bpf[b"port_qos"][bpf[b"port_qos"].Key(port)].ps_per_byte
    if not ps:
        return 0, 0
    eff = now
    paused = bpf[b"egress_paused"][bpf[b"egress_paused"].Key(k)].value
    if paused and paused < now:
        eff = paused
    q = bpf[b"vq"][bpf[b"vq"].Key(k)]
    v, en = q.finish, q.enq
    return max((v - eff) * 1000 // ps if v > eff else 0, capped(en, q.cap)), en


def queue_sent(bpf, port: int, prio: int, now: int) -> int:
    """Bytes the model's egress queue (port, prio) has sent so far: enqueued − depth, never past its credit cap
    (qos_sent in lib/vqueue.h)."""
    depth, en = queue_state(bpf, port, prio, now)
    return max(0, en - depth)


def shared_used(bpf, keys, now: int) -> int:
    """Occupancy of a switch's shared buffer: the depths of its queues (vq indexes ``keys``) added up
    (shared_used in lib/shared_buffer.h)."""
    return sum(queue_state(bpf, k // N_PRIO, k % N_PRIO, now)[0] for k in keys)


def shared_threshold(pool: int, alpha_q10: int, used: int) -> int:
    """A shared buffer's dynamic threshold: alpha (scaled by 2^10) × the free pool (shared_threshold in
    lib/shared_buffer.h)."""
    return (pool - used) * alpha_q10 >> 10 if pool > used else 0


def capped(enq: int, cap: int) -> int:
    """Bytes a queue holds by its credit cap (vq_capped in lib/common.h)."""
    return enq - cap if cap and enq > cap else 0


def ingress_queued(bpf, slots: int, port: int, prio: int, now: int | None = None) -> int:
    """Bytes that arrived on ingress (port, prio) and still sit in some egress queue of its switch: the PFC
    ingress accounting of lib/ingress_acct.h (ingress_recount), read without writing (the switch program owns it)."""
    now = now if now is not None else time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    t = bpf[b"ingress_state"]
    st = t[t.Key(port * N_PRIO + prio)]
    total = 0
    for s in range(slots):
        c = st.chunks[s]
        if not c.bytes:
            continue
        sent = queue_sent(bpf, c.port, prio, now)
        if sent <= c.start:
            total += c.bytes
        elif sent < c.end and c.end > c.start:
            total += c.bytes * (c.end - sent) // (c.end - c.start)
    return total
