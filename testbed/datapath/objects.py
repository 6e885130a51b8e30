"""BPF programs by id: which ones a lab loaded (the ids of its program fds) and whether the kernel still holds
them — a lab's state file records its programs' ids, so that removing a lab whose owner was killed can wait until
the kernel has freed them (it frees a namespace, and with it the tc filters holding a program, asynchronously)."""
from __future__ import annotations

import ctypes as ct
import errno
import os
import time

#: the bpf(2) syscall's number on this machine (None where unknown)
BPF_NR = {"x86_64": 321, "amd64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280, "loongarch64": 280,
          "i386": 357, "i686": 357, "armv7l": 386, "ppc64le": 361, "ppc64": 361, "s390x": 351}.get(os.uname().machine)
BPF_PROG_GET_FD_BY_ID = 13
_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


def bpf(cmd: int, attr) -> int:
    """Raw bpf(2) with ``attr`` (a ctypes object: its size is the attr's); the result (an fd, 0) or OSError. BCC's
    Python wraps neither PROG_TEST_RUN nor the by-id calls."""
    if BPF_NR is None:
        raise OSError(errno.ENOSYS, f"bpf syscall number unknown for {os.uname().machine}")
    ret = _libc.syscall(ct.c_long(BPF_NR), ct.c_int(cmd), ct.byref(attr), ct.c_uint(ct.sizeof(attr)))
    if ret < 0:
        e = ct.get_errno()
        raise OSError(e, os.strerror(e))
    return int(ret)


def program_id(fd: int, pid: int | str = "self") -> int | None:
    """The id of the BPF program open as ``fd`` in process ``pid`` (/proc/<pid>/fdinfo); None if it is not one."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("prog_id:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def program_exists(prog_id: int) -> bool:
    """Does the kernel still hold BPF program ``prog_id``? (Ids are allocated cyclically: not reused soon.)"""
    attr = (ct.c_uint8 * 128)()
    ct.c_uint32.from_buffer(attr, 0).value = prog_id
    try:
        os.close(bpf(BPF_PROG_GET_FD_BY_ID, attr))
    except OSError:
        return False
    return True


def wait_freed(prog_ids, timeout_s: float) -> list[int]:
    """Wait until the kernel holds none of ``prog_ids`` (at most ``timeout_s``); returns those it still holds."""
    end = time.monotonic() + timeout_s
    left = [p for p in prog_ids if program_exists(p)]
    while left and time.monotonic() < end:
        time.sleep(0.02)
        left = [p for p in left if program_exists(p)]
    return left
