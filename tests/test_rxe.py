"""traffic.engine: rxe — runs only where the kernel has rdma_rxe and perftest is installed; skipped with the
reason otherwise (this machine: no RDMA in the kernel)."""
from __future__ import annotations

import pytest

from testbed.workloads import WorkloadError, rxe

WHY = rxe.missing()

PERFTEST_OUT = """
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      5000             52.10              51.87                0.000830
---------------------------------------------------------------------------------------
"""


def test_parse_perftest_summary():
    r = rxe.parse_perftest(PERFTEST_OUT)
    assert r["msg_bytes"] == 65536 and r["iterations"] == 5000
    assert r["goodput_mbps"] == pytest.approx(51.87 * 8)


def test_missing_rxe_is_one_clear_line():
    if WHY is None:
        pytest.skip("rdma_rxe present: nothing to report")
    with pytest.raises(WorkloadError) as e:
        rxe.require()
    assert "\n" not in str(e.value) and "rdma_rxe" in str(e.value) or "perftest" in str(e.value)


@pytest.mark.e2e
@pytest.mark.skipif(WHY is not None, reason=WHY or "")
def test_rxe_write_bw_between_two_hosts_in_root_namespace():
    import subprocess
    dev = None
    try:
        out = subprocess.run(["rdma", "link", "show"], capture_output=True, text=True).stdout
        assert out is not None
        dev = rxe.add_device(lambda argv: subprocess.run(argv, check=True), "lo")
        rows = rxe.run_pairs([("a", "b", "127.0.0.1")], lambda h: None, lambda h: dev, seconds=2)
        assert rows[0].get("goodput_mbps", 0) > 0, rows
    finally:
        if dev:
            subprocess.run(["rdma", "link", "delete", dev])
