"""Process names with the lab's prefix, so `ps` and `top` show which lab a process belongs to, and a process's
start time, which with its pid names one process for good."""
from __future__ import annotations

import ctypes
from pathlib import Path

PR_SET_NAME = 15
COMM_LEN = 15                 # the kernel keeps 15 characters of a process name


def set_process_name(name: str) -> None:
    """Name the calling thread (the main thread names the process), e.g. ``ftb-r1a2b3c-pfc``."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:COMM_LEN], 0, 0, 0)


def proc_start(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid, it names one
    process for good (a pid alone may be reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])
