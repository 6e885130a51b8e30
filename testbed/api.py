"""The Python API for scripted experiments: ``from testbed import load_scenario, Lab, run``.

A thin layer over what the CLI uses: ``run`` wraps ``lifecycle.run`` (the same teardown, manifest and CSVs) and
returns a :class:`Result` whose tables are pandas frames read from the run's files; ``Lab`` is the lab of
``testbed up`` as a context manager with a generated name and a helper to run commands on its nodes.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from . import lab as lab_mod
from . import scenario as scenario_mod
from .report import columns
from .report.files import ReportError, read_csv, read_manifest
from .scenario import Scenario


def load_scenario(source: str | os.PathLike | Mapping | Scenario, *sets: str,
                  overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A validated scenario from a YAML file, a mapping (the YAML's structure) or a Scenario (re-validated with
    the overrides). ``sets``: ``"key.path=value"`` strings as after ``--set``; ``overrides``: ``{"key.path":
    value}`` with Python values. Raises ScenarioError with the CLI's one-line message."""
    over = tuple(sets) + tuple(f"{k}={json.dumps(v)}" for k, v in (overrides or {}).items())
    if isinstance(source, Scenario):
        return scenario_mod.from_dict(scenario_mod.to_dict(source, roundtrip=True), over)
    if isinstance(source, Mapping):
        return scenario_mod.from_dict(dict(source), over)
    return scenario_mod.load(source, over)


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PermissionError(f"{what} needs root (network namespaces, tc and eBPF): run Python with sudo")


class Result:
    """One run's result directory: ``summary`` (dict), ``links``, ``flows`` (and ``collectives``,
    ``failures`` when the run wrote them) as DataFrames, ``manifest`` (dict); files are read on first use."""

    def __init__(self, directory: str | os.PathLike, summary: Mapping[str, Any] | None = None):
        self.dir = Path(directory)
        if not (self.dir / columns.MANIFEST).is_file() and not (self.dir / columns.SUMMARY_CSV).is_file():
            raise ReportError(f"{self.dir}: not a result directory (no {columns.MANIFEST} or {columns.SUMMARY_CSV})")
        if summary is not None:
            self.summary = dict(summary)

    def __repr__(self) -> str:
        s = self.summary
        return (f"Result({str(self.dir)!r}, load_balancing={s.get('load_balancing')!r}, "
                f"goodput_mbps={s.get('goodput_mbps')}, cpu_bound={s.get('cpu_bound')})")

    @cached_property
    def summary(self) -> dict:
        from . import report
        return report.sweep_table([self.dir]).drop(columns="run_dir").iloc[0].to_dict()

    @cached_property
    def manifest(self) -> dict:
        return read_manifest(self.dir) or {}

    @property
    def failed(self) -> str | None:
        """What stopped the run early (the manifest's ``failed``), None when it completed."""
        f = self.manifest.get("failed")
        return "; ".join(f) if isinstance(f, list) else f

    def _frame(self, name: str, make: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame | None:
        p = self.dir / name
        return make(read_csv(p)) if p.is_file() else None

    @cached_property
    def links(self) -> pd.DataFrame:
        from .report import links_frame
        return self._frame(columns.LINKS_CSV, links_frame)

    @cached_property
    def flows(self) -> pd.DataFrame:
        from .report import flows_frame
        return self._frame(columns.FLOWS_CSV, flows_frame)

    @cached_property
    def collectives(self) -> pd.DataFrame | None:
        from .report import collectives_frame
        return self._frame(columns.COLLECTIVES_CSV, collectives_frame)

    @cached_property
    def failures(self) -> pd.DataFrame | None:
        from .report import failures_frame
        return self._frame(columns.FAILURES_CSV, failures_frame)


def run(scen: Scenario | str | os.PathLike | Mapping, out: str | os.PathLike | None = None, *,
        sets: Sequence[str] = (), log: Callable[[str], None] | None = None, check: bool = True) -> Result:
    """Run a scenario like ``testbed run`` (build, traffic, telemetry, teardown, CSVs) and return its Result.

    ``scen``: a Scenario, or what :func:`load_scenario` takes (``sets`` apply either way); ``out``: the result
    directory (default results/<run-id>); ``log``: a callable for progress lines (default: silent). A run that
    failed part-way still writes its results: with ``check`` it raises RunFailed, else the Result says why in
    ``failed``."""
    from .runs import lifecycle
    source = "" if isinstance(scen, (Scenario, Mapping)) else str(scen)
    if not isinstance(scen, Scenario) or sets:
        scen = load_scenario(scen, *sets)
    _need_root("testbed.run")
    out = Path(out) if out is not None else lifecycle.RESULTS_DIR / lifecycle.new_run_id(scen)
    try:
        outdir, row = lifecycle.run(scen, out, source=source, log=log or (lambda s: None))
    except lifecycle.RunFailed:
        if check:
            raise
        return Result(out)
    return Result(outdir, row)


class Lab(lab_mod.Lab):
    """A lab for interactive use: ``with Lab(scen) as lab: lab.exec("h0", "ping", "-c1", lab.address("h3"))``.

    Built on enter (fabric, switch program, helper agents), torn down on exit; the name is generated (``p`` +
    6 hex digits) unless given. ``scen`` and ``sets`` as for :func:`run`."""

    def __init__(self, scen: Scenario | str | os.PathLike | Mapping, name: str | None = None, *,
                 sets: Sequence[str] = ()):
        if not isinstance(scen, Scenario) or sets:
            scen = load_scenario(scen, *sets)
        super().__init__(scen, name or "p" + secrets.token_hex(3), kind="run")

    def __enter__(self) -> "Lab":
        _need_root("testbed.Lab")
        lab_mod.reap_stale()
        super().__enter__()
        return self

    @property
    def hosts(self) -> list[str]:
        return self.topo.hosts

    @property
    def switches(self) -> list[str]:
        return self.topo.switches

    def address(self, host: str, rail: int = 0) -> str:
        """A host's fabric address on ``rail``."""
        return self.topo.address(host, rail)

    def namespace(self, node: str) -> str:
        """The network namespace of ``node`` (for ``ip netns exec``)."""
        try:
            return self.fabric.ns[node]
        except KeyError:
            raise lab_mod.LabError(f"lab '{self.name}' has no node {node!r} (hosts: "
                                   f"{', '.join(self.hosts[:8])} …)") from None

    def exec(self, node: str, *argv: str, timeout: float | None = 60.0, check: bool = False
             ) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``node``'s namespace (a container host: inside its container) and wait;
        stdout/stderr captured as text."""
        from .fabric import netns
        ns = self.namespace(node)
        ctr = self.containers.containers.get(node) if self.containers is not None else None
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc = ctr.spawn(list(argv), **pipes) if ctr is not None else netns.spawn(ns, list(argv), **pipes)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        res = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            res.check_returncode()
        return res


def load_result(directory: str | os.PathLike) -> Result:
    """An existing result directory (of `testbed run`, a sweep's run, or :func:`run`) as a Result."""
    return Result(directory)


def load_sweep(directory: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A sweep directory's (sweep.csv, comparison.csv) as frames."""
    d = Path(directory)
    missing = [f for f in (columns.SWEEP_CSV, columns.COMPARISON_CSV) if not (d / f).is_file()]
    if missing:
        raise ReportError(f"{d}: not a sweep directory (missing {', '.join(missing)})")
    return read_csv(d / columns.SWEEP_CSV), read_csv(d / columns.COMPARISON_CSV)


__all__ = ["Lab", "Result", "load_result", "load_scenario", "load_sweep", "run"]
