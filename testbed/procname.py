"""Process names with the lab's prefix, so `ps` and `top` show which lab a process belongs to."""
from __future__ import annotations

import ctypes

PR_SET_NAME = 15
COMM_LEN = 15                 # the kernel keeps 15 characters of a process name


def set_process_name(name: str) -> None:
    """Name the calling thread (the main thread names the process), e.g. ``ftb-r1a2b3c-pfc``."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:COMM_LEN], 0, 0, 0)
