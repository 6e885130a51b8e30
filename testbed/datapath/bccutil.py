"""Small helpers around BCC: importing it with a useful error, and keeping its C++ chatter off the terminal."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from ..errors import DatapathError


def import_bcc():
    """Return bcc.BPF, or raise DatapathError saying how to get it (it is not on PyPI)."""
    try:
        from bcc import BPF
    except ImportError:
        raise DatapathError("python module 'bcc' not importable: install Debian's python3-bpfcc and build the "
                            "venv with --system-site-packages (the PyPI package 'bcc' is unrelated)") from None
    return BPF


class _Captured:
    def __init__(self, f):
        self._f = f

    def text(self) -> str:
        self._f.flush()
        self._f.seek(0)
        return self._f.read().decode(errors="replace")


@contextlib.contextmanager
def quiet_stderr():
    """Send file descriptor 2 to a temporary file while BCC compiles/loads (clang and libbpf write there
    directly, bypassing sys.stderr). The text is available through the yielded object, e.g. to report the first
    compiler error. Note: this briefly silences stderr of every thread of the process.

    LLVM reports a few code-generation errors (e.g. "Invalid usage of the XADD return value") by calling
    exit(1), which would end the process with the message still captured: set FTB_BPF_VERBOSE=1 to let
    BCC's output through while debugging C changes."""
    if os.environ.get("FTB_BPF_VERBOSE"):
        with tempfile.TemporaryFile() as f:
            yield _Captured(f)
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield _Captured(f)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
