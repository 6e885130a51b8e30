"""BPF programs by id: which ones a lab loaded (the ids of its program fds) and whether the kernel still holds
them — a lab's state file records its programs' ids, so that removing a lab whose owner was killed can wait until
the kernel has freed them (it frees a namespace, and with it the tc filters holding a program, asynchronously)."""
from __future__ import annotations

import ctypes as ct
import os
import time

_NR_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}
BPF_PROG_GET_FD_BY_ID = 13
_libc = ct.CDLL(None, use_errno=True)


def program_id(fd: int) -> int | None:
    """The id of the BPF program open as ``fd`` in this process (/proc/self/fdinfo)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("prog_id:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def program_exists(prog_id: int) -> bool:
    """Does the kernel still hold BPF program ``prog_id``? (Ids are allocated cyclically: not reused soon.)"""
    nr = _NR_BPF.get(os.uname().machine)
    if nr is None:
        return False
    attr = (ct.c_uint8 * 128)()
    ct.c_uint32.from_buffer(attr, 0).value = prog_id
    fd = _libc.syscall(nr, BPF_PROG_GET_FD_BY_ID, attr, 128)
    if fd >= 0:
        os.close(fd)
        return True
    return False


def wait_freed(prog_ids, timeout_s: float) -> list[int]:
    """Wait until the kernel holds none of ``prog_ids`` (at most ``timeout_s``); returns those it still holds."""
    end = time.monotonic() + timeout_s
    left = [p for p in prog_ids if program_exists(p)]
    while left and time.monotonic() < end:
        time.sleep(0.02)
        left = [p for p in left if program_exists(p)]
    return left
