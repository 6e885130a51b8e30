"""The traffic agents of one run: one ``python -m testbed.workloads.agent`` process per involved host, inside
its namespace (the protocol is in agent.py).

``AgentSet`` starts them, waits until each has started Python, hands each its job, waits until each has bound
its flows, tells them all t0, collects the one JSON result each prints, and always kills and reaps every process it started — on success, on an agent's failure, on a
helper's failure reported by ``check`` and on Ctrl-C. A failure is one line naming the host and its last
stderr line.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from ..errors import TestbedError

READY_TIMEOUT_S = 30.0
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+), in (\S+)')


class WorkloadError(TestbedError):
    """An agent failed; the message is one line."""


def _exit(rc: int | None) -> str:
    """How a process ended, for a message: ``exit 3``, ``killed by SIGKILL``."""
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


class _Agent:
    def __init__(self, host: str, where: str, proc: subprocess.Popen, container=None):
        self.host, self.where, self.proc = host, where, proc     # where: "namespace …" or "container …"
        self.container = container                              # its host's container (container hosts)
        self.out = bytearray()
        self.err = bytearray()
        self.ready = False

    def last_err_line(self) -> str:
        """The agent's last stderr line; for a Python traceback also where it was raised (file:line in func)."""
        lines = [ln for ln in self.err.decode(errors="replace").splitlines() if ln.strip()]
        if not lines:
            return "(no message)"
        frames = [m for ln in lines if (m := _FRAME.match(ln))]
        where = f" (at {os.path.basename(frames[-1][1])}:{frames[-1][2]} in {frames[-1][3]})" if frames else ""
        return lines[-1].strip() + where

    def fail(self, what: str) -> WorkloadError:
        if self.container is not None and not self.container.alive():     # its host died: that is the news
            return WorkloadError(self.container.death())
        return WorkloadError(f"traffic agent on {self.host} ({self.where}) {what}: {self.last_err_line()}")


class AgentSet:
    """The agents of ``hosts``; use as a context manager (exit kills and reaps every one still running)."""

    start_latency_s = 0.0        # from start() called to the start lines written (RemoteAgents: a Ray call)

    def __init__(self, hosts: list[str], ns_of: Callable[[str], str], containers: Optional[dict] = None):
        """``containers``: host → its Container (container/hosts.py) for container hosts: the agent runs inside
        it, with the container's Python and the package bind-mounted there."""
        self.hosts, self.ns_of, self.containers = hosts, ns_of, containers or {}
        self.agents: list[_Agent] = []
        self.sel = selectors.DefaultSelector()
        self.problems: list[str] = []          # agents that had to be killed or would not die

    def __enter__(self) -> "AgentSet":
        env = dict(os.environ)
        env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            for h in self.hosts:
                self._spawn(h, env)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _spawn(self, host: str, env: dict) -> None:
        from ..fabric import netns        # here, not at import: every agent imports this package (keep it light)
        ns = self.ns_of(host)
        ctr = self.containers.get(host)
        where = f"container {ctr.name}" if ctr is not None else f"namespace {ns}"
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        errors: tuple = (OSError, subprocess.SubprocessError)
        if ctr is not None:
            from ..container.hosts import CODE_DIR, ContainerGone
            errors += (ContainerGone,)
        try:
            if ctr is not None and ctr.python:
                p = ctr.spawn(["python3", "-m", "testbed.workloads.agent"],
                              {"PYTHONPATH": CODE_DIR, "PYTHONDONTWRITEBYTECODE": "1", "FTB_PROC_NAME": ns}, **pipes)
            else:             # a namespace host, or an image without a Python for the agent: its network only
                p = netns.spawn(ns, [sys.executable, "-m", "testbed.workloads.agent"],
                                env=dict(env, FTB_PROC_NAME=ns), **pipes)
        except errors as e:
            raise WorkloadError(f"cannot start the traffic agent on {host} ({where}): {e}") from None
        a = _Agent(host, where, p, ctr)
        self.agents.append(a)
        os.set_blocking(p.stdout.fileno(), False)
        os.set_blocking(p.stderr.fileno(), False)
        self.sel.register(p.stdout.fileno(), selectors.EVENT_READ, (a, "out"))
        self.sel.register(p.stderr.fileno(), selectors.EVENT_READ, (a, "err"))

    def pump(self, timeout: float) -> None:
        """Read whatever the agents printed (waits at most ``timeout``)."""
        for key, _ in self.sel.select(timeout):
            agent, which = key.data
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(key.fd)
                continue
            (agent.out if which == "out" else agent.err).extend(chunk)

    def wait_ready(self, deadline: float, started: float) -> None:
        """Until every agent has started Python and said so (the slow part, before t0 is chosen)."""
        end = min(deadline, time.time() + READY_TIMEOUT_S)
        while not all(a.ready for a in self.agents):
            for a in self.agents:
                if not a.ready and b"\n" in a.out:
                    a.ready = True
                elif not a.ready and a.proc.poll() is not None:
                    self.pump(0.05)
                    raise a.fail(f"exited before it was ready ({_exit(a.proc.returncode)})")
            if all(a.ready for a in self.agents):
                return
            if time.time() > end:
                slow = next(a for a in self.agents if not a.ready)
                raise WorkloadError(f"traffic agent on {slow.host} ({slow.where}) did not start "
                                    f"within {end - started:.0f} s")
            self.pump(0.05)

    def hand_jobs(self, jobs: dict[str, dict]) -> None:
        for a in self.agents:
            self._line(a, jobs[a.host], "stopped before it took its job")

    def wait_bound(self, deadline: float) -> None:
        """Until every agent has bound its receivers and opened its senders (its second line, agent.py)."""
        while True:
            waiting = [a for a in self.agents if a.out.count(b"\n") < 2]
            if not waiting:
                return
            for a in waiting:
                if a.proc.poll() is not None:
                    self.pump(0.05)
                    raise a.fail(f"failed before t0 ({_exit(a.proc.returncode)})")
            if time.time() > deadline:
                raise WorkloadError(f"traffic agent on {waiting[0].host} ({waiting[0].where}) had not bound its "
                                    f"flows by the run's time limit")
            self.pump(0.05)

    def start(self, t0: float) -> None:
        """Tell every agent t0 (the start line), then close its stdin."""
        for a in self.agents:
            self._line(a, {"t0": t0}, "stopped before it was started", last=True)

    def _line(self, a: _Agent, obj: dict, what: str, last: bool = False) -> None:
        try:
            a.proc.stdin.write((json.dumps(obj) + "\n").encode())
            if last:
                a.proc.stdin.close()
            else:
                a.proc.stdin.flush()
        except OSError:
            self.pump(0.1)
            raise a.fail(what) from None

    def collect(self, deadline: float, timeout_s: float,
                check: Optional[Callable[[], None]] = None) -> dict[str, dict]:
        """Every agent's result (host → the JSON it printed last). ``check`` is called a few times a second and
        may raise to abort the run (a helper of the run died)."""
        while self.sel.get_map():
            if time.time() > deadline:
                busy = [a.host for a in self.agents if a.proc.poll() is None]
                raise WorkloadError(f"traffic agents still running after {timeout_s:g} s: {', '.join(busy)}")
            self.pump(0.2)
            if check is not None:
                check()
            for a in self.agents:
                if a.proc.poll() not in (None, 0):
                    self.pump(0.05)
                    raise a.fail(f"failed ({_exit(a.proc.returncode)})")
        out = {}
        for a in self.agents:
            try:
                rc = a.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise WorkloadError(f"traffic agent on {a.host} did not exit") from None
            if rc != 0:
                raise a.fail(f"failed ({_exit(rc)})")
            lines = [ln for ln in a.out.decode(errors="replace").splitlines() if ln.strip()]
            try:
                out[a.host] = json.loads(lines[-1])
                out[a.host]["recv"]
            except (IndexError, ValueError, KeyError):
                raise WorkloadError(f"traffic agent on {a.host} printed no result") from None
        return out

    def __exit__(self, *exc) -> None:
        for a in self.agents:
            if a.proc.poll() is None:
                # its own session: this takes anything it started too; it may exit just before the signal
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(a.proc.pid, signal.SIGKILL)
        for a in self.agents:
            try:
                a.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.problems.append(f"traffic agent on {a.host} (pid {a.proc.pid}) did not die after SIGKILL")
            for pipe in (a.proc.stdin, a.proc.stdout, a.proc.stderr):
                if pipe and not pipe.closed:
                    pipe.close()
        self.sel.close()
