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


PF_EXITING = 0x4              # the process is exiting (set as soon as it begins to: a SIGKILL delivered)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def proc_running(pid: int, start: int | None) -> bool:
    """The process ``pid`` started at ``start`` still runs: not gone, not another process that took its pid, not
    exiting and not a zombie. (A container's init that is SIGKILLed first ends every process of its PID namespace
    and only then becomes a zombie: it is already exiting when they are seen dead.)"""
    f = _stat(pid)
    return (f is not None and start is not None and int(f[19]) == start and f[0] not in ("Z", "X")
            and not int(f[6]) & PF_EXITING)


def proc_gone(pid: int, start: int | None) -> bool:
    """The process ``pid`` started at ``start`` holds nothing any more: it is gone (or its pid is another's), or a
    zombie — an exiting process may still be closing its files."""
    f = _stat(pid)
    return f is None or start is None or int(f[19]) != start or f[0] in ("Z", "X")
