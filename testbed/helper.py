"""What every forked helper of a lab shares (the PFC agent, the routing agent, the failure scheduler).

A helper is a child forked by the lab after the datapath is loaded, so it inherits the BPF map fds; the parent
prepares every socket inside the right namespace before the fork. The child reports through a pipe: one JSON
object when it ends (its measurements), or ``{"crashed": "<one line>"}`` when it dies of an exception. The
parent checks it while traffic runs (``check``: a dead helper fails the run in one line naming it) and ends it
with SIGTERM (``stop``: returns what it measured, or raises its one-line failure).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys

from .errors import HelperFailed
from .procname import set_process_name


def wait_readable(fds: list[int], timeout_s: float) -> list[int]:
    """The fds of ``fds`` that are readable within ``timeout_s``. select(2) cannot hold a descriptor ≥ 1024 (a
    fat-tree k=16 lab holds thousands of sockets), so those wait in poll(2) — whose timeout is whole
    milliseconds, too coarse for the credit meter's sub-millisecond waits, hence select below 1024. Raises
    InterruptedError when a signal arrives, like both."""
    timeout_s = max(0.0, timeout_s)
    if max(fds, default=0) < 1024:
        return select.select(fds, [], [], timeout_s)[0]
    p = select.poll()
    for fd in fds:
        p.register(fd, select.POLLIN)
    return [fd for fd, _ in p.poll(timeout_s * 1000)]


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL this helper when the process (the thread) that forked it dies. A helper inherits its parent's
    descriptors; a Ray actor killed while its part's PFC agent lived on was never seen dead by Ray, whose
    sockets the agent still held (cluster/part.py). A `testbed up` lab's detached helpers are exempt."""
    ppid = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != ppid:          # the parent died before the request took effect
        os._exit(1)


def child(body, wfd: int, name: str, detach: bool = False) -> None:
    """Run a helper's body in the forked child and leave with os._exit, never returning into the parent's
    code, whatever happens. A crash is written to the result pipe as {"crashed": "<one line>"} (and the
    traceback to stderr). The child's stdin and stdout are /dev/null — a helper of a `testbed up` lab outlives
    the command and must not hold its output pipe open — and with ``detach`` stderr too."""
    code = 0
    try:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2) if detach else (0, 1):
                os.dup2(null, fd)
            os.close(null)
            set_process_name(name)
            if not detach:
                _die_with_parent()
            body()
        except BaseException as e:                            # noqa: BLE001 — reported through the pipe
            import traceback
            traceback.print_exc()
            code = 1
            _deliver(wfd, json.dumps({"crashed": f"{type(e).__name__}: {e}"[:300]}).encode())
    finally:
        os._exit(code)


def _deliver(wfd: int, data: bytes) -> None:
    """Write ``data`` to the result pipe. If the parent is gone (a `testbed up` lab: the command that made it has
    returned; `testbed down` ends the helper), there is no one to read it: said on stderr, not raised."""
    view = memoryview(data)
    try:
        while view:
            n = os.write(wfd, view)
            view = view[n:]
    except BrokenPipeError:
        print(f"helper {os.getpid()}: results not delivered, the lab's owner is gone", file=sys.stderr)


def write_result(wfd: int, out: dict) -> None:
    """The child's last word: its results as one JSON object (the pipe is then closed)."""
    _deliver(wfd, json.dumps(out).encode())
    os.close(wfd)


class ForkedHelper:
    """The parent's side of one helper process: fork, readiness, health check, stop and results. Subclasses
    set ``label`` (how messages name it, e.g. "PFC agent") and ``failure`` (a HelperFailed subclass)."""

    label = "helper"
    failure = HelperFailed
    detach = False               # the lab outlives this command (`testbed up`): no stderr for the helper
    on_fork = None               # called with the child's pid at once, before it is ready (the lab's state file)

    def __init__(self):
        self.pid = None
        self._rfd = None
        self.results: dict = {}
        self._dead_pid: int | None = None      # set once the child is reaped, with its exit status
        self._status = ""
        self._buffered = b""
        self._failed: str | None = None         # the line check() raised: stop() repeats it, not a second one

    def _fork(self, body, name: str, after_fork=None) -> None:
        """Fork the child running ``body(wfd, ready)`` (``ready()`` tells the parent it is up) and wait until it
        is ready; raise ``failure`` if it dies before. ``after_fork`` runs in the parent once the child is
        ready or dead (close what only the child needs)."""
        rfd, wfd = os.pipe()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:                                          # the helper
            os.close(rfd)
            os.close(ready_r)

            def ready():
                os.write(ready_w, b"1")
                os.close(ready_w)
            child(lambda: body(wfd, ready), wfd, name, self.detach)
        os.close(wfd)
        os.close(ready_w)
        self.pid, self._rfd = pid, rfd
        try:
            if self.on_fork is not None:      # recorded before it is ready: a killed owner's helper is still found
                self.on_fork(pid)
            ok = os.read(ready_r, 1)
        finally:
            os.close(ready_r)
            if after_fork is not None:
                after_fork()
        if not ok:
            self._reap(block=True)
            raise self.failure(f"{self.label} (pid {pid}) exited before it was ready: {self._crash()}")

    def check(self) -> None:
        """Raise ``failure`` (one line) if the helper has died; called while traffic runs."""
        if self.pid is not None and self._reap(block=False):
            self._failed = (f"{self.label} (pid {self._dead_pid}) died during the run ({self._status}): "
                            f"{self._crash()}")
        if self._failed is not None:
            raise self.failure(self._failed)

    def stop(self) -> dict:
        """End the helper and return what it measured; raise ``failure`` if it crashed or its results are
        unreadable (what it measured is then lost, the run's other results are not)."""
        if self.pid is None and self._dead_pid is None:
            return self.results
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):     # it may have just exited by itself
                os.kill(self.pid, signal.SIGTERM)
        data = self._drain()
        if self.pid is not None:
            self._reap(block=True)
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None
        if self._failed is not None:              # seen dead while the run went: the same one line
            raise self.failure(self._failed)
        if self._status != "exit 0":
            raise self.failure(f"{self.label} (pid {self._dead_pid}) ended with {self._status}: "
                               f"{self._crash(data)}")
        try:
            self.results = json.loads(data.decode())
        except ValueError as e:
            raise self.failure(f"{self.label} (pid {self._dead_pid}) wrote unreadable results ({e}): "
                               f"{data[:80]!r}") from None
        return self.results

    def _reap(self, block: bool) -> bool:
        pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        self._dead_pid, self.pid = self.pid, None
        self._status = (f"exit {os.waitstatus_to_exitcode(status)}" if os.WIFEXITED(status)
                        else f"signal {signal.Signals(os.WTERMSIG(status)).name}")
        return True

    def _drain(self) -> bytes:
        data = self._buffered
        while self._rfd is not None:
            chunk = os.read(self._rfd, 1 << 20)
            if not chunk:
                break
            data += chunk
        self._buffered = data
        return data

    def _crash(self, data: bytes | None = None) -> str:
        """The one-line reason the child wrote before it died, if any."""
        if data is None:
            data = self._drain() if self._rfd is not None else self._buffered
        try:
            return json.loads(data.decode()).get("crashed") or "no message"
        except ValueError:
            return "no message (killed?)"


class SocketHelper(ForkedHelper):
    """A forked helper the hosts talk to over a Unix datagram socket at ``path`` (a file of this machine, so it
    reaches every host namespace; mode 0600): the parent binds it, the child serves it (``serve(sock, wfd,
    ready)``), ``stop()`` removes it. A crash is kept in ``error`` as well as raised."""

    proc_name = ""                 # the child's process name (ftb-<lab>-…)

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.error: str | None = None

    def serve(self, sock, wfd: int, ready) -> None:
        raise NotImplementedError

    def after_fork(self) -> None:
        """In the parent once the child runs (or died): close what only the child needs."""

    def start(self) -> None:
        import socket
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        try:
            self._fork(lambda wfd, ready: self.serve(sock, wfd, ready), self.proc_name, after_fork=self.after_fork)
        finally:
            sock.close()

    def stop(self) -> dict:
        try:
            return super().stop()
        except HelperFailed as e:
            self.error = str(e)
            raise
        finally:
            self.path.unlink(missing_ok=True)


def next_message(sock, timeout_s: float, version: int, ops: tuple[str, ...]) -> tuple[dict | None, object]:
    """A socket helper's next datagram, within ``timeout_s``: (the message, its sender's address) when it is a
    JSON object of ``version`` whose ``op`` is one of ``ops``; ({}, address) when it is anything else (count it);
    (None, None) when nothing came."""
    try:
        if not wait_readable([sock.fileno()], timeout_s):
            return None, None
        data, addr = sock.recvfrom(4096)
    except InterruptedError:
        return None, None
    try:
        msg = json.loads(data)
        ok = isinstance(msg, dict) and msg.get("v") == version and msg.get("op") in ops
    except ValueError:
        ok = False
    return (msg if ok else {}), addr


def send_to(sock, data: bytes, addr) -> bool:
    """Best effort: a host that asked and left since is not an error."""
    if not addr:
        return False
    try:
        sock.sendto(data, addr)
        return True
    except OSError:
        return False
