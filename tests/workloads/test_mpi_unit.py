"""traffic.engine mpi, pure logic: the scenario keys, nccl-tests' algbw/busbw on hand-computed calls (symmetric,
one-way and many-to-one operations), the size rounding of the rank program, mpirun's command line (no shared
memory, only the fabric NICs) and the one-line failure of a rank."""
from __future__ import annotations

import importlib.util
import os

import pytest

from testbed import scenario
from testbed.spec_types import ScenarioError
from testbed.workloads.mpi import launcher
from testbed.workloads.mpi.busbw import rows, summary
from testbed.workloads.mpi.spec import ALGORITHMS, MpiSpec

_rank = importlib.util.spec_from_file_location("mpi_rank", launcher.RANK_PROGRAM)
rank = importlib.util.module_from_spec(_rank)
_rank.loader.exec_module(rank)


def _report(bench: str, size: int, spans: list[float], start: float = 100.0) -> dict:
    """One timed call at ``size`` where rank r left the barrier at ``start`` + r ms and took ``spans[r]`` s."""
    call = [[start + r / 1000, start + r / 1000 + s] for r, s in enumerate(spans)]
    return {"ranks": len(spans), "results": [{"benchmark": bench, "bytes": size, "times": [call]}]}


def test_allreduce_bandwidths_follow_nccl_tests():
    """4 ranks, 1,000,000 bytes; the slowest rank took 0.5 s: algbw = 8e6 bit / 0.5 s = 16 Mbit/s, busbw =
    16 × 2(4−1)/4 = 24 Mbit/s; time mean 300 ms; the call spans 3 ms of start skew + 0.5 s."""
    [r] = rows(_report("allreduce", 1_000_000, [0.1, 0.2, 0.4, 0.5]), origin=90.0, algorithm="ring",
               transport="tcp")
    assert r["algbw_mbps"] == pytest.approx(16.0) and r["busbw_mbps"] == pytest.approx(24.0)
    assert (r["time_min_ms"], r["time_mean_ms"], r["time_max_ms"]) == pytest.approx((100.0, 300.0, 500.0))
    assert r["start_s"] == pytest.approx(10.0) and r["jct_ms"] == pytest.approx(503.0)
    assert (r["job"], r["op"], r["ranks"], r["algorithm"], r["transport"]) == ("mpi", "allreduce", 4, "ring", "tcp")


def test_one_way_and_many_to_many_factors():
    """bcast is one-way (rank 0 to all): busbw = algbw; alltoall over 2 ranks is one exchange each way: factor
    1/2; allgather and reduce_scatter over 8 ranks: 7/8."""
    [b] = rows(_report("bcast", 500_000, [0.2, 0.25]), 0, "auto", "tcp")
    assert b["algbw_mbps"] == pytest.approx(16.0) and b["busbw_mbps"] == pytest.approx(16.0)
    [a] = rows(_report("alltoall", 500_000, [0.25, 0.25]), 0, "auto", "tcp")
    assert a["busbw_mbps"] == pytest.approx(8.0)
    for op in ("allgather", "reduce_scatter"):
        [g] = rows(_report(op, 1_000_000, [1.0] * 8), 0, "auto", "tcp")
        assert g["algbw_mbps"] == pytest.approx(8.0) and g["busbw_mbps"] == pytest.approx(7.0)


def test_summary_is_the_largest_size_mean():
    small = rows(_report("allreduce", 1000, [0.001, 0.001]), 0, "auto", "tcp")
    big = rows(_report("allreduce", 1_000_000, [0.5, 1.0]), 0, "auto", "tcp") + rows(
        _report("allreduce", 1_000_000, [0.5, 0.5]), 0, "auto", "tcp")
    s = summary(small + big)
    assert s["mpi_bytes"] == 1_000_000
    assert s["mpi_algbw_mbps"] == pytest.approx((8 + 16) / 2) and s["mpi_busbw_mbps"] == pytest.approx(12.0)
    assert summary([]) == {}


@pytest.mark.parametrize("bench,ranks,size,used", [
    ("allreduce", 6, 1_000_003, 1_000_000),      # float32: multiples of 4
    ("reduce_scatter", 6, 1_048_576, 1_048_560),  # 4 × 6 = 24
    ("allgather", 6, 1_048_576, 1_048_572),       # 6
    ("alltoall", 4, 1_000_001, 1_000_000),
    ("bcast", 5, 7, 7),
    ("reduce_scatter", 8, 16, 0),                # smaller than one unit: nothing to run
])
def test_rank_program_rounds_sizes_down_to_whole_units(bench, ranks, size, used):
    assert rank.used_bytes(bench, ranks, size) == used


def test_scenario_keys_and_their_one_line_errors():
    s = scenario.from_dict({"traffic": {"engine": "mpi", "mpi": {"benchmark": "alltoall", "algorithm": "pairwise",
                                                                "sizes": ["64KB", "1MB"], "ranks": 3}}})
    m = s.traffic.mpi
    assert m.sizes == [65536, 1 << 20] and m.hosts(["h0", "h1", "h2", "h3"]) == ["h0", "h1", "h2"]
    assert m.mca_algorithm() == {"coll_tuned_use_dynamic_rules": "1", "coll_tuned_alltoall_algorithm": "2"}
    assert MpiSpec().mca_algorithm() == {}
    bad = {
        "traffic.mpi.algorithm: Open MPI has no allreduce algorithm 'bruck'": {"engine": "mpi",
                                                                            "mpi": {"algorithm": "bruck"}},
        "traffic.mpi: applies to traffic.engine mpi": {"mpi": {"sizes": ["1MB"]}},
        "traffic.jobs: engine mpi runs the benchmark of traffic.mpi": {
            "engine": "mpi", "jobs": [{"pattern": "allreduce", "bytes": "1MB"}]},
        "traffic.mpi.ranks: leaf0 is a switch": {"engine": "mpi", "mpi": {"ranks": ["h0", "leaf0"]}},
        "traffic.mpi.ranks: 9 ranks, the topology has 4 hosts": {"engine": "mpi", "mpi": {"ranks": 9}},
        "traffic.mpi.ranks: no node 'h9'": {"engine": "mpi", "mpi": {"ranks": ["h0", "h9"]}},
        "traffic.mpi.ranks: a collective needs at least 2 ranks": {"engine": "mpi", "mpi": {"ranks": 1}},
    }
    for want, traffic in bad.items():
        with pytest.raises(ScenarioError) as e:
            scenario.from_dict({"traffic": traffic})
        assert str(e.value).startswith(want) and "\n" not in str(e.value), str(e.value)


def test_every_algorithm_name_is_open_mpis():
    """The table against Open MPI's own list where ompi_info is installed (names of coll_tuned_<op>_algorithm)."""
    import shutil
    import subprocess
    if shutil.which("ompi_info") is None:
        pytest.skip("Open MPI not installed: scripts/test-setup.sh installs openmpi-bin")
    out = subprocess.run(["ompi_info", "--param", "coll", "tuned", "--level", "9"], capture_output=True,
                         text=True, check=True).stdout
    for bench, (op, names) in ALGORITHMS.items():
        lines = out.split(f'"coll_tuned_{op}_algorithm"')[1].splitlines()
        valid = next(ln for ln in lines if "Valid values" in ln)
        assert ", ".join(f'{i}:"{n}"' for i, n in enumerate(names)) in valid, (bench, valid)


def test_mpirun_uses_only_the_fabric_nics_and_never_shared_memory(tmp_path):
    argv = launcher.mpirun_argv(["h0", "h1"], tmp_path / "hosts", tmp_path / "agent", ["eth0", "eth1"], "tcp",
                                {"coll_tuned_use_dynamic_rules": "1"}, {"benchmark": "allreduce"})
    mca = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert mca["btl"] == "tcp,self" and mca["btl_tcp_if_include"] == "eth0,eth1" and mca["pml"] == "ob1"
    assert mca["oob_tcp_if_include"] == str(launcher.MGMT_SUBNET) and mca["coll_tuned_use_dynamic_rules"] == "1"
    ucx = launcher.mpirun_argv(["h0", "h1"], tmp_path / "hosts", tmp_path / "agent", ["eth0"], "ucx", {}, {})
    assert "UCX_TLS=tcp,self" in ucx and "UCX_NET_DEVICES=eth0" in ucx
    assert ucx[ucx.index("btl") + 1].startswith("^vader")


def test_management_addresses_avoid_the_fabric():
    hnp, addrs = launcher.mgmt_addresses(3, ["198.18.0.1", "198.18.1.1"])
    assert hnp == "198.19.254.254" and addrs == ["198.19.254.1", "198.19.254.2", "198.19.254.3"]
    with pytest.raises(launcher.WorkloadError, match="inside the management network"):
        launcher.mgmt_addresses(2, ["198.19.254.7"])
    with pytest.raises(launcher.WorkloadError, match="at most 253"):
        launcher.mgmt_addresses(300, [])


def test_a_failed_rank_is_named_with_its_host_and_mpis_own_line():
    """The rank mpirun saw die of a signal (not the peer that then lost its connection), the first to exit
    non-zero (with its last error line), else the first that complained."""
    dash = "-" * 74 + "\n"
    killed = (dash + "Primary job  terminated normally, but 1 process returned\na non-zero exit code.\n" + dash
              + "[1,3]<stderr>:[vm][[10408,1],3][btl_tcp_frag.c:135] writev failed: Connection reset by peer (104)\n"
              + dash + "mpirun noticed that process rank 2 with PID 17518 on node h2 exited on signal 9 (Killed).\n")
    assert launcher.failure_line(137, killed, ["h0", "h1", "h2", "h3"]) == (
        "mpi: rank 2 on h2 failed: killed by signal 9 (Killed)")
    raised = ("[1,1]<stderr>:Traceback (most recent call last):\n[1,1]<stderr>:MemoryError: cannot allocate\n" + dash
              + "mpirun detected that one or more processes exited with non-zero status, thus causing\nthe job to "
              "be terminated. The first process to do so was:\n\n  Process name: [[52323,1],1]\n  Exit code:    1\n")
    assert launcher.failure_line(1, raised, ["h0", "h5"]) == (
        "mpi: rank 1 on h5 failed: exit code 1: MemoryError: cannot allocate")
    said = "[1,0]<stdout>:\n[1,2]<stderr>:PML ucx cannot be selected\n"
    assert launcher.failure_line(1, said, ["h0", "h1", "h7"]) == "mpi: rank 2 on h7 failed: PML ucx cannot be selected"
    assert launcher.failure_line(1, "", ["h0"]) == "mpi: mpirun exited with 1: no output"


def test_the_rsh_agent_enters_the_hosts_namespace_with_a_session_directory_of_its_own(tmp_path):
    """Every "node" is this machine: one session directory per host, or the daemons' clean-ups collide."""
    agent = launcher.agent_script(tmp_path / "agent.sh", {"h0": "ftb-x-h0", "h1": "ftb-x-h1"}, tmp_path / "s")
    text = agent.read_text()
    assert os.access(agent, os.X_OK)
    assert 'h1) ns="/run/netns/ftb-x-h1" ;;' in text and 'TMPDIR="' + str(tmp_path / "s") in text
    assert text.rstrip().endswith('nsenter --net="$ns" sh -c "$*"')
