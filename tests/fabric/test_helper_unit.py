"""The helpers' wait on their descriptors: a fat-tree k=16 lab holds thousands of sockets, so the fds a helper
waits on are numbered above 1024, where select(2) raised "filedescriptor out of range" (the link-state watcher
died at k=16)."""
import os
import resource

import pytest

from testbed.helper import wait_readable


def test_wait_readable_takes_descriptors_above_1024():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2100:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 2100")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2100), hard))
    r, w = os.pipe()
    hi_r, hi_w = 2000, 2001
    try:
        os.dup2(r, hi_r)
        os.dup2(w, hi_w)
        assert wait_readable([hi_r], 0.01) == []
        os.write(hi_w, b"x")
        assert sorted(wait_readable([hi_r, r], 0.5)) == [r, hi_r]      # one pipe, two descriptors
    finally:
        for fd in (r, w, hi_r, hi_w):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
