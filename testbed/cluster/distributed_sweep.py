"""Distributed sweeps: every run of a sweep (testbed/sweep.py plans, records and tabulates them) goes to a free
machine of the Ray cluster, one run per machine at a time (the ``ftb_machine`` resource), and its result
directory comes back, as a tar in Ray's object store, under the sweep's ``--out``.

A run is a whole ``lifecycle.run`` on its machine (lab built and torn down there). A run whose *machine* failed —
the node died, the worker crashed — is run again once on another machine, and the sweep says so (the log line,
the ``retried`` column); a run that failed by itself is recorded as failed, as in a local sweep.
"""
from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path
from typing import Callable

from ..sweep import FAILED, OK, PlannedRun
from . import MACHINE_RESOURCE, ClusterError, Machine, connect, machines, pin

CANCEL_WAIT_S = 60.0           # Ctrl-C: how long the runs under way get to tear their labs down


def _execute(scen, name: str, source: str) -> dict:
    """Runs on the machine: one ``lifecycle.run`` into a scratch directory, returned as a tar with the run's log
    lines and its one-line error (None when it completed)."""
    import shutil
    import tempfile

    from ..runs import lifecycle
    lines: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="ftb-sweep-"))
    error = None
    try:
        try:
            lifecycle.run(scen, tmp / name, source=source, log=lines.append)
        except Exception as e:                    # noqa: BLE001 — the run's failure, reported to the driver
            error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        buf = io.BytesIO()
        if (tmp / name).exists():
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                tar.add(tmp / name, arcname=name)
        return {"tar": buf.getvalue(), "log": lines, "error": error}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unpack(blob: bytes, outdir: Path, name: str) -> None:
    if not blob:
        return
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for m in tar.getmembers():                # only the run's own directory, nothing outside it
            if not (m.name == name or m.name.startswith(name + "/")) or m.issym() or m.islnk():
                raise ClusterError(f"run {name}: its result archive holds {m.name!r}, outside the run directory")
        tar.extractall(outdir)           # members checked above (Python 3.11.2 has no extraction filters)


class ClusterPool:
    """Runs a sweep's runs on the cluster's machines (``sweep.execute(pool=…)``)."""

    def __init__(self, address: str):
        self.ray = connect(address)
        self.machines = machines()
        if not self.machines:
            raise ClusterError(f"the Ray cluster at {address} has no machine (a node started with "
                               f"--resources='{{\"{MACHINE_RESOURCE}\": 1}}')")
        self._remote = self.ray.remote(num_cpus=0, resources={MACHINE_RESOURCE: 1}, max_retries=0)(_execute)

    def _alive(self) -> list[Machine]:
        alive = {m.node_id for m in machines()}
        return [m for m in self.machines if m.node_id in alive]

    def run_all(self, todo: list[PlannedRun], outdir: Path, source: str, log: Callable[[str], None],
                begin: Callable, record: Callable, check: Callable[[], None]) -> None:
        """Run ``todo``: ``begin(run, machine name)`` as each starts, ``record(run, status, error, extra)`` as each
        ends (extra: ``node``, ``retried``); ``check()`` raises on Ctrl-C, which cancels what runs (the runs tear
        down their labs) before it propagates."""
        from ray.exceptions import RayError, TaskCancelledError
        queue: list[tuple[PlannedRun, str | None, str | None]] = [(r, None, None) for r in todo]  # run, failed on, why
        free = list(self.machines)
        running: dict = {}
        try:
            while queue or running:
                check()
                for item in list(queue):
                    r, avoid, why = item
                    choice = next((m for m in free if m.node_id != avoid), None)
                    if choice is None:
                        continue
                    free.remove(choice)
                    queue.remove(item)
                    ref = self._remote.options(**pin(choice)).remote(r.scen, r.name, source)
                    running[ref] = (r, choice, why)
                    begin(r, choice.name)
                if not running:
                    if queue:                 # retries waiting for another machine, and none is left
                        for r, avoid, why in queue:
                            record(r, FAILED, f"{why}; no other machine to retry on", {"retried": why})
                        queue.clear()
                    break
                ready, _ = self.ray.wait(list(running), num_returns=1, timeout=0.5)
                for ref in ready:
                    r, m, why = running.pop(ref)
                    try:
                        res = self.ray.get(ref)
                    except TaskCancelledError:
                        raise KeyboardInterrupt from None
                    except RayError as e:     # the machine or its worker failed, not the run
                        alive = {a.node_id for a in self._alive()}
                        what = (f"machine {m.name} ({m.address}) died" if m.node_id not in alive
                                else f"the worker on machine {m.name} died")
                        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                        line = f"{what} during run {r.name} ({type(e).__name__}: {detail[:120]})"
                        if m.node_id in alive:
                            free.append(m)
                        if why is None:
                            log(f"warning: {line}; retrying it once on another machine")
                            queue.insert(0, (r, m.node_id, line))
                        else:
                            log(f"error: run {r.name} failed again: {line}")
                            record(r, FAILED, line, {"node": m.name, "retried": why})
                        continue
                    free.append(m)
                    for ln in res["log"]:
                        log(f"  {m.name}: {ln}")
                    _unpack(res["tar"], outdir, r.name)
                    extra = {"node": m.name, "retried": why}
                    if res["error"]:
                        log(f"error: run {r.name} failed: {res['error']}")
                        record(r, FAILED, res["error"], extra)
                    else:
                        if why:
                            log(f"run {r.name} completed on {m.name} after its retry ({why})")
                        record(r, OK, None, extra)
        except BaseException:
            self._cancel(running)
            raise

    def _cancel(self, running: dict) -> None:
        """Ctrl-C: interrupt every run under way (KeyboardInterrupt inside it: its lab is torn down), then wait a
        bounded time for them to end."""
        if not running:
            return
        for ref in running:
            self.ray.cancel(ref, force=False)
        end = time.monotonic() + CANCEL_WAIT_S
        pending = list(running)
        while pending and time.monotonic() < end:
            _, pending = self.ray.wait(pending, num_returns=len(pending), timeout=1.0)


__all__ = ["ClusterPool"]
