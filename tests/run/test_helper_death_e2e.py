"""Every helper's death is survived and cleaned: kill -9, mid-run, each process a run depends on — the
flow-control agent (PFC, credits), the routing agent (link-state watcher, subnet manager), the failure
scheduler, the WCMP controller, the fabric controller, the collective helper, the metrics exporter, one traffic
agent, a container host, one Ray part of a split run — and the run fails with one line naming it, writes what it
collected so far with manifest ``failed``, and after ``testbed clean <its lab>`` nothing of it is left
(conftest.leftovers: namespaces, links, BPF programs, processes, containers, cgroups, Ray actors). The same after
kill -9 of ``testbed run`` and of ``testbed up`` themselves.

Each case runs a tiny scenario (2 hosts, a few seconds of UDP) through the CLI; the helper is found through the
lab's state file (every helper is recorded there the moment it is forked, testbed/lab.py) or by the process
name of its agent (testbed/procname.py).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from testbed.fabric import netns

from conftest import (ROOT, TESTBED, bpf_programs_held, free_port, leftovers, processes_named, run_cli,
                      wait_for)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LINK = {"rate": "20mbit", "buffer": "256KB"}
BASE = {"name": "helperdeath", "seed": 1, "duration": "5s",
        "topology": {"spines": 1, "leaves": 2, "hosts_per_leaf": 1, "host_link": LINK, "fabric_link": LINK},
        "traffic": {"engine": "udp", "pattern": "permutation", "rate": "5mbit"},
        "telemetry": {"interval": "100ms"}}
LOSSLESS = {"buffer": "100KB", "traffic_classes": {"dscp": {26: 3}, "default": 0, "lossless": [3]}}
PFC = {"switch": dict(LOSSLESS, pfc={"enabled": True, "xoff": "30KB", "xon": "15KB", "headroom": "128KB"}),
       "hosts": {"pfc": True}, "traffic": {"dscp": 26}}
CREDIT = {"switch": dict(LOSSLESS, credit={"enabled": True, "buffer": "16KB", "block": 64,
                                           "update_interval": "1ms"}), "traffic": {"dscp": 26}}
LATE_FAILURE = {"failures": [{"at": "4s", "link": ["leaf0", "spine0"], "rate": "10mbit"}]}   # after the kill
WCMP = {"topology": {"spines": 2},
        "switch": {"load_balancing": "wcmp", "wcmp": {"source": "load", "granularity": "packet", "interval": "10ms"}}}
ADAPT = {"topology": {"spines": 2},
         "traffic": {"qps_per_connection": 2, "collective": {"adapt": {"policy": "weighted-split"}},
                     "jobs": [{"name": "ring", "pattern": "allreduce", "bytes": "2MB", "iterations": 20}]}}
DOCKER = {"hosts": {"docker": {"image": "fabric-testbed/host"}}}
SPLIT = {"placement": {"partitions": 2}}


def merged(*docs: dict) -> dict:
    out: dict = {}
    for d in docs:
        for k, v in d.items():
            out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass(frozen=True)
class Case:
    id: str
    doc: dict
    victim: str                 # a helper's name in the lab's state file, or "agent", "container", "part", "cli"
    label: str = ""             # what the one error line must name
    needs: str = ""             # "docker", "ray"
    metrics: bool = False
    command: str = "run"        # the killed CLI's: run, up
    when: str = "traffic"       # up: "helper" (its first helper is forked), "build" (namespaces, no helper yet)
    extra: dict = field(default_factory=dict)


HELPER_CASES = [
    Case("pfc-agent", PFC, "pfc-agent", "PFC agent"),
    Case("credit-agent", CREDIT, "credit-agent", "credit agent"),
    Case("link-state-watcher", LATE_FAILURE, "link-state-watcher", "link-state watcher"),
    Case("subnet-manager", {"switch": {"routing": "sm"}}, "subnet-manager", "subnet manager"),
    Case("failure-scheduler", LATE_FAILURE, "failure-scheduler", "failure scheduler"),
    Case("wcmp-controller", WCMP, "wcmp-controller", "WCMP controller"),
    Case("fabric-controller", {"topology": {"spines": 2}, "controller": {"entropy": "plan"}}, "fabric-controller",
         "fabric controller"),
    Case("collective-helper", ADAPT, "collective-helper", "collective helper"),
    Case("metrics-exporter", {}, "metrics-exporter", "metrics exporter", metrics=True),
    Case("traffic-agent", {}, "agent", "traffic agent on h1"),
    Case("container-host", DOCKER, "container", "container host h1", needs="docker"),
    Case("ray-part", merged(PFC, SPLIT), "part", "machine m1", needs="ray"),
]
CLI_CASES = [
    Case("testbed-run", PFC, "cli"),
    Case("testbed-run-docker", DOCKER, "cli", needs="docker"),
    Case("testbed-up-helpers", merged(PFC, {"switch": {"routing": "sm"}}), "cli", command="up", when="helper",
         metrics=True),
    Case("testbed-up-building", PFC, "cli", command="up", when="build"),
]


@pytest.fixture(scope="module")
def docker_hosts():
    """A running Docker daemon (started if need be) with the host image; skips where Docker cannot run."""
    from testbed.container.daemon import DockerError, client
    try:
        client(log=print)
    except DockerError as e:
        pytest.skip(f"Docker cannot run here: {e}")
    res = run_cli("image", "build", timeout=300)            # cached when current
    assert res.returncode == 0, res.stderr


def _needs(request, case: Case) -> str | None:
    """Bring up what the case needs; the Ray cluster's address for a split run."""
    if case.needs == "docker":
        request.getfixturevalue("docker_hosts")
    if case.needs == "ray":
        return request.getfixturevalue("cluster")["address"]
    return None


def _scenario(tmp_path: Path, case: Case) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(merged(BASE, case.doc)))
    return path


def _start(tmp_path: Path, case: Case, ray_address: str | None) -> tuple[subprocess.Popen, Path, list[str]]:
    """`testbed run|up` of the case's scenario: (process, result directory, extra arguments)."""
    out = tmp_path / "run"
    args = []
    if case.metrics:
        args += ["--metrics", f"127.0.0.1:{free_port()}"]
    if ray_address is not None:
        args += ["--cluster", "auto"]
    if case.command == "up":
        args += ["--name", case.extra.get("name", "")]
    else:
        args += ["--out", str(out)]
    proc = subprocess.Popen(TESTBED + [case.command, str(_scenario(tmp_path, case)), *args], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, out, args


def _labs_of(proc: subprocess.Popen, split: bool) -> list[dict]:
    """The state files of ``proc``'s run: its lab, or over a cluster its two machine parts (``c<hex>m<i>``,
    owned by the parts' actors)."""
    from testbed.lab import all_labs
    if split:
        return [st for st in all_labs() if re.fullmatch(r"c[0-9a-f]{4}m\d+", st["name"])]
    return [st for st in all_labs() if st.get("pid") == proc.pid]


def _agents(lab: str) -> dict[int, str]:
    return processes_named(f"{netns.PREFIX}{lab}")


def _victim(case: Case, labs: list[dict]) -> int | None:
    """The pid to kill, once the case's process is up (None: not yet)."""
    if case.victim == "agent":
        return next((pid for pid, comm in _agents(labs[0]["name"]).items() if comm.endswith("-h1")), None)
    if case.victim == "container":
        ctr = (labs[0].get("containers") or {}).get("h1")
        return ctr["pid"] if isinstance(ctr, dict) else None
    if case.victim == "part":
        part = next((st for st in labs if st["name"].endswith("m1")), None)
        return part["pid"] if part else None
    st = labs[0]
    return next((h["pid"] for h in st.get("helpers", []) if h["name"] == case.victim), None)


def _one_error_line(stderr: str, label: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and label in lines[0], stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


def _clean(lab: str) -> None:
    res = run_cli("clean", lab, timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("case", HELPER_CASES, ids=[c.id for c in HELPER_CASES])
def test_a_helper_killed_mid_run_fails_the_run_in_one_line_and_leaves_nothing(case, tmp_path, request):
    ray_address = _needs(request, case)
    split = ray_address is not None
    t0 = time.monotonic()
    proc, out, _ = _start(tmp_path, case, ray_address)
    try:
        labs: list[dict] = []

        def up() -> bool:                     # built, the victim known and the traffic's agents running
            labs[:] = _labs_of(proc, split)
            return (len(labs) == (2 if split else 1) and _victim(case, labs) is not None
                    and all(_agents(st["name"]) for st in labs))
        assert wait_for(up, timeout=120, step=0.05), f"not up: {labs}"
        time.sleep(1.0)                       # the traffic runs
        owners = [st["pid"] for st in labs] + [h["pid"] for st in labs for h in st.get("helpers", [])]
        programs = bpf_programs_held(owners)
        assert programs, "the run holds no BPF program?"
        victim = _victim(case, labs)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    line = _one_error_line(err, case.label)
    m = json.loads((out / "manifest.json").read_text())
    assert m["failed"] and case.label in m["failed"][0], m["failed"]
    assert len(m["failed"]) == 1, m["failed"]                  # one death, said once
    assert (out / "links.csv").stat().st_size > 0 and (out / "flows.csv").is_file()
    lab = labs[0]["name"][:-2] if split else labs[0]["name"]
    _clean(lab)
    left = leftovers(lab, programs, ray_address)
    if split:                                 # no VXLAN device left on either machine or here
        for ns in ("ftb-m0", "ftb-m1", None):
            cmd = ["ip", "-d", "-o", "link", "show", "type", "vxlan"]
            if ns:
                cmd[1:1] = ["-n", ns]
            vx = subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
            if vx:
                left.setdefault("vxlan", []).append(f"{ns}: {vx}")
    assert left == {}, left
    print(f"\n[{case.id}] {line}\n  killed {killed_at - t0:.1f} s after start, run ended {ended - killed_at:.1f} s "
          f"after the kill; {len(programs)} BPF programs checked")


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_a_killed_testbed_command_is_cleaned_by_testbed_clean(case, tmp_path, request):
    """kill -9 of `testbed run` mid-traffic (its helpers die with it, its agents, namespaces, containers and
    cgroup stay) and of `testbed up` while it builds or starts its helpers (they are detached: they live on):
    `testbed clean <lab>` removes everything."""
    _needs(request, case)
    if case.command == "up":
        case = Case(**{**case.__dict__, "extra": {"name": "k" + secrets.token_hex(4)}})
    proc, _, _ = _start(tmp_path, case, None)
    name = case.extra.get("name")
    try:
        from testbed.lab import read_state
        st: dict = {}
        programs: set[int] = set()

        def ready() -> bool:
            nonlocal st
            if case.command == "run":
                labs = _labs_of(proc, False)
                st = labs[0] if labs else {}
                return bool(st) and bool(_agents(st["name"]))
            st = read_state(name) or {}
            if case.when == "build":          # every namespace made, the switch program still compiling
                return bool(st) and len(netns.list_names(f"{netns.PREFIX}{name}-")) == len(st["nodes"])
            return bool(st.get("helpers"))
        assert wait_for(ready, timeout=120, step=0.002), "not up"
        if case.command == "run":
            time.sleep(1.0)                   # the traffic runs
        programs = bpf_programs_held([proc.pid] + [h["pid"] for h in st.get("helpers", [])])
        assert proc.poll() is None, f"`testbed {case.command}` ended before it was killed: {proc.communicate()}"
        proc.kill()                           # SIGKILL: no clean-up at all
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lab = st.get("name") or name
    before = leftovers(lab, programs)
    assert before.get("namespaces"), f"a killed `testbed {case.command}` leaves its namespaces: {before}"
    if case.needs == "docker":
        assert before.get("containers"), before
    _clean(lab)
    assert leftovers(lab, programs) == {}
    print(f"\n[{case.id}] left before clean: {({k: len(v) for k, v in before.items()})}")
