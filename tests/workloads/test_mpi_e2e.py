"""traffic.engine mpi end to end: Open MPI's collectives, one rank per host namespace, over the eBPF fabric.

Each test fails if its feature breaks: an allreduce and an alltoall over the TCP BTL move their bytes over the
fabric's NICs (the switch counters see them; the management network carries under 1 % of them) at a bus
bandwidth within the link rate; UCX's own TCP transport runs the same; a rank killed mid-run fails the run in
one line naming its host, and nothing of the run is left (namespaces, mpirun, orted, ranks); Open MPI missing
is one line naming the Debian packages, before anything is built."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import scenario
from testbed.fabric import netns
from testbed.workloads.mpi import launcher

from conftest import ROOT, guarded_run, killed_run_error, leftovers

pytestmark = pytest.mark.e2e              # Open MPI and mpi4py: scripts/test-setup.sh installs them

RATE = 20e6


def mpi_doc(**mpi) -> dict:
    """2 leaves × 2 hosts under 2 spines, 20 Mbit/s links, ECMP (TCP, which spraying reorders)."""
    return {
        "name": "mpi", "duration": "60s",
        "topology": {"kind": "leaf-spine", "spines": 2, "leaves": 2, "hosts_per_leaf": 2,
                     "host_link": {"rate": "20mbit", "buffer": "256KB"},
                     "fabric_link": {"rate": "20mbit", "buffer": "256KB"}},
        "switch": {"load_balancing": "ecmp"},
        "traffic": {"engine": "mpi", "mpi": {"iterations": 3, "warmup": 1, **mpi}}}


def mpi_scenario(**mpi) -> scenario.Scenario:
    return scenario.from_dict(mpi_doc(**mpi))


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def fabric_rx_bytes(d) -> float:
    """Bytes the leaves received from their hosts (links.csv rx rows of the host-facing ports)."""
    return sum(float(r["bytes"]) for r in _rows(d / "links.csv")
               if r["switch"].startswith("leaf") and r["role"] == "down" and r["direction"] == "rx")


def no_mpi_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"orted|{launcher.RANK_PROGRAM}"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "pgrep" not in ln]


def descends(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor``'s descendant (a rank of this test's run, not of another on the machine)."""
    while pid > 1:
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
    return False


@pytest.mark.parametrize("bench,factor", [("allreduce", 2 * 3 / 4), ("alltoall", 3 / 4)])
def test_a_collective_over_tcp_crosses_the_fabric_at_a_bus_bandwidth_within_the_link(tmp_path, bench, factor):
    """4 ranks, 256 KB and 1 MB: every call's busbw is > 0 and within the 20 Mbit/s link (5 % for the counters'
    rounding); the leaves received at least each rank's share of every call (busbw's bytes: factor × size per
    rank, warm-up calls included) and the management network under 1 % of that."""
    sizes = [256 * 1024, 1 << 20]
    d, row = guarded_run(mpi_scenario(benchmark=bench, sizes=sizes), tmp_path / bench)
    calls = _rows(d / "collectives.csv")
    man = json.loads((d / "manifest.json").read_text())["mpi"]
    fabric = fabric_rx_bytes(d)
    need = sum(4 * factor * s * (3 + 1) for s in sizes)
    print(f"\n[mpi {bench}] busbw " + ", ".join(f"{int(c['bytes']) >> 10} KB {float(c['busbw_mbps']):.1f}"
                                                for c in calls)
          + f" Mbit/s; fabric {fabric / 1e6:.2f} MB (≥ {need / 1e6:.2f}), management {man['mgmt_bytes']} B; "
            f"tcp retransmits {row['tcp_retransmits']}")
    assert [int(c["bytes"]) for c in calls] == [sizes[0]] * 3 + [sizes[1]] * 3
    assert all(0 < float(c["busbw_mbps"]) <= 1.05 * RATE / 1e6 for c in calls), calls
    assert all(c["op"] == bench and c["ranks"] == "4" and c["transport"] == "tcp" for c in calls)
    assert row["mpi_busbw_mbps"] > 0 and row["mpi_bytes"] == sizes[1]
    assert fabric >= need
    assert man["mgmt_bytes"] < 0.01 * fabric
    assert man["hosts"] == ["h0", "h1", "h2", "h3"] and man["nics"] == ["eth0"]
    assert no_mpi_processes() == [] and not netns.list_names(f"{netns.PREFIX}{json.loads((d / 'manifest.json').read_text())['lab']}")


def test_ucx_transport_runs_the_benchmark_over_the_fabric(tmp_path):
    """transport ucx: Open MPI's UCX PML with UCX's own TCP transport on the fabric NICs (rxe in the VM)."""
    d, row = guarded_run(mpi_scenario(benchmark="allreduce", sizes=[1 << 20], transport="ucx", algorithm="ring"),
                         tmp_path / "ucx")
    calls = _rows(d / "collectives.csv")
    man = json.loads((d / "manifest.json").read_text())["mpi"]
    print(f"\n[mpi ucx] busbw {[round(float(c['busbw_mbps']), 1) for c in calls]} Mbit/s, management "
          f"{man['mgmt_bytes']} B of {fabric_rx_bytes(d):.0f}")
    assert all(0 < float(c["busbw_mbps"]) <= 1.05 * RATE / 1e6 for c in calls)
    assert "UCX_TLS=tcp,self" in man["argv"] and "ucx" in man["argv"]
    assert fabric_rx_bytes(d) >= 4 * 1.5 * (1 << 20) * 4 and man["mgmt_bytes"] < 0.01 * fabric_rx_bytes(d)


def test_a_rank_killed_mid_run_fails_the_run_in_one_line_naming_its_host(tmp_path):
    """SIGKILL the rank on h2 while it runs a 16 MB allreduce: the run exits non-zero with one error line naming
    rank 2 on h2, keeps what it collected (links.csv, manifest failed), and leaves no namespace, mpirun, orted or
    rank behind."""
    path = tmp_path / "mpi.yaml"
    path.write_text(json.dumps(mpi_doc()))
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(path), "--out", str(out),
                             "--set", "traffic.mpi.sizes=[16MB]"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    victim, end = None, time.monotonic() + 60
    while victim is None and time.monotonic() < end and proc.poll() is None:
        for line in no_mpi_processes():
            pid = int(line.split()[0])
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"OMPI_COMM_WORLD_RANK=2" in env and str(launcher.RANK_PROGRAM) in line and descends(pid, proc.pid):
                victim, tmpdir = pid, Path(next(e for e in env if e.startswith(b"TMPDIR=")).decode()[7:])
        time.sleep(0.2)
    if victim is None:
        proc.kill()
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"rank 2 never started (run exit {proc.returncode}): {err[-2000:]}")
    # h2's daemon keeps its session in a directory of its own, apart from mpirun's (they raced in one)
    assert tmpdir.name == "h2" and list(tmpdir.glob("ompi.*/jf.*")), tmpdir
    assert {p.name for p in tmpdir.parent.iterdir()} == {"mpirun", "h0", "h1", "h2", "h3"}
    time.sleep(1.0)
    line, _ = killed_run_error(proc, victim)
    assert "mpi: rank 2 on h2 failed" in line, line
    man = json.loads((out / "manifest.json").read_text())
    assert man["failed"] and (out / "links.csv").is_file()
    assert leftovers(man["lab"]) == {k: [] for k in leftovers(man["lab"])}
    assert no_mpi_processes() == []


def test_open_mpi_missing_is_one_line_naming_the_packages_before_anything_is_built(tmp_path):
    path = tmp_path / "mpi.yaml"
    path.write_text(json.dumps(mpi_doc()))
    res = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(path), "--out", str(tmp_path / "r")],
                         cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PATH="/nonexistent"),
                         timeout=120)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "error: traffic.engine mpi: Open MPI is not installed (mpirun missing; apt-get install openmpi-bin "
        "python3-mpi4py)"), res.stderr
    assert not (tmp_path / "r").exists()
