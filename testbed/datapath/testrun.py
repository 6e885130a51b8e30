"""BPF_PROG_TEST_RUN for tc programs: run a loaded program on one packet without attaching it anywhere.

Used by the unit tests (and usable by `testbed doctor`). BCC 0.26's Python has no wrapper for it, so this calls
the bpf(2) syscall through ctypes. ``ifindex`` sets skb->ifindex through the __sk_buff context: the kernel then
requires a device with that ifindex in the caller's network namespace. The redirect target of bpf_redirect is
only recorded (the verdict is TC_ACT_REDIRECT); nothing is sent.
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
from dataclasses import dataclass

from ..errors import DatapathError
from .objects import BPF_NR, bpf

BPF_PROG_TEST_RUN = 10
SKB_CTX_SIZE = 192            # >= sizeof(struct __sk_buff); the kernel accepts a zero tail
SKB_IFINDEX_OFFSET = 40       # struct __sk_buff: len, pkt_type, mark, queue_mapping, protocol, vlan_present,
                              # vlan_tci, vlan_proto, priority, ingress_ifindex, ifindex
SKB_PRIORITY_OFFSET = 32

TC_ACT_OK = 0
TC_ACT_SHOT = 2
TC_ACT_REDIRECT = 7


class _TestAttr(ct.Structure):
    _fields_ = [("prog_fd", ct.c_uint32), ("retval", ct.c_uint32),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32),
                ("data_in", ct.c_uint64), ("data_out", ct.c_uint64),
                ("repeat", ct.c_uint32), ("duration", ct.c_uint32),
                ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("ctx_in", ct.c_uint64), ("ctx_out", ct.c_uint64),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32),
                ("_pad", ct.c_uint32)]


@dataclass
class RunResult:
    verdict: int          # the program's return value (TC_ACT_*)
    data: bytes           # the packet after the program (rewrites applied)
    duration_ns: int      # average run time per repetition
    priority: int = 0     # skb->priority after the program (with ``ifindex``: the context is passed and read back)


def run(prog_fd: int, packet: bytes, ifindex: int | None = None, repeat: int = 1) -> RunResult:
    """Run the tc program ``prog_fd`` on ``packet`` (an Ethernet frame), as if received on ``ifindex``."""
    if BPF_NR is None:
        raise DatapathError(f"BPF_PROG_TEST_RUN: unknown bpf syscall number on {os.uname().machine}")
    data_in = ct.create_string_buffer(packet, len(packet))
    data_out = ct.create_string_buffer(len(packet) + 512)      # room for what the program adds (INT stacks)
    attr = _TestAttr(prog_fd=prog_fd, data_size_in=len(packet), data_size_out=len(data_out),
                     data_in=ct.addressof(data_in), data_out=ct.addressof(data_out), repeat=repeat)
    ctx_out = ct.create_string_buffer(SKB_CTX_SIZE)
    if ifindex is not None:
        ctx = ct.create_string_buffer(SKB_CTX_SIZE)
        ct.c_uint32.from_buffer(ctx, SKB_IFINDEX_OFFSET).value = ifindex
        attr.ctx_in, attr.ctx_size_in = ct.addressof(ctx), SKB_CTX_SIZE
        attr.ctx_out, attr.ctx_size_out = ct.addressof(ctx_out), SKB_CTX_SIZE
    try:
        bpf(BPF_PROG_TEST_RUN, attr)
    except OSError as e:
        hint = " (no device with that ifindex in this network namespace?)" if e.errno == errno.ENODEV else ""
        raise OSError(e.errno, f"BPF_PROG_TEST_RUN failed: {os.strerror(e.errno)}{hint}") from None
    return RunResult(attr.retval, data_out.raw[:attr.data_size_out], attr.duration,
                     ct.c_uint32.from_buffer(ctx_out, SKB_PRIORITY_OFFSET).value)
