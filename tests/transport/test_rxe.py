"""traffic.engine: rxe — the perftest parser and flow rows are tested everywhere; the end-to-end run needs a
distribution kernel with rdma_rxe and perftest: it is marked ``fullkernel`` and runs in the VM lane."""
from __future__ import annotations

import pytest

from testbed.workloads import WorkloadError, rxe
from testbed.workloads.flows import Flow
from testbed.workloads.rxe.perftest import parse_perftest

WHY = rxe.missing()

# ib_write_bw client, perftest defaults (MB/sec = MiB/s), as perftest 4.5 / rdma-core prints it
WRITE_BW = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : rxe_h0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: ON
 ibv_wr* API     : OFF
 TX depth        : 128
 CQ Moderation   : 1
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0011 PSN 0x6c7c8b RKey 0x000267 VAddr 0x007f1b8a5f1000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:01
 remote address: LID 0000 QPN 0x0012 PSN 0x5be7b2 RKey 0x000368 VAddr 0x007f3ad4a2e000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:01:01
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      5000             52.10              51.87  \t\t   0.000830
---------------------------------------------------------------------------------------
"""

# ib_send_bw client with --report_gbits, duration mode (-D): peak is not measured there
SEND_BW_GBITS = """\
---------------------------------------------------------------------------------------
                    Send BW Test
 Dual-port       : OFF\t\tDevice         : rxe_h2
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 TX depth        : 128
 CQ Moderation   : 1
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1831             0.00               0.39  \t\t   0.000745
---------------------------------------------------------------------------------------
"""

# Real output, VM lane (Debian 12 perftest 4.5, rdma_rxe on 6.1 under TCG, across the eBPF leaf-spine): in
# duration mode (-D) this perftest prints BW 0.00 — goodput then comes from bytes / duration
WRITE_BW_DURATION_VM = """\
Correlation coefficient r^2: 0.470785 < 0.9
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : rxe_h0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: ON
 ibv_wr* API     : OFF
 TX depth        : 128
 CQ Moderation   : 1
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0011 PSN 0xa17d0b RKey 0x0002c9 VAddr 0x007f8e1f55f000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:01
 remote address: LID 0000 QPN 0x0011 PSN 0xf71046 RKey 0x00020b VAddr 0x007f0472dbc000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:01:01
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      78               0.00               0.00   \t\t   0.000000
---------------------------------------------------------------------------------------
"""

# Real output, VM lane: ib_send_bw -D 2 failing mid-run (header printed, no result row)
SEND_BW_FAILED_VM = """\
 Completion with error at client
 Failed status 9: wr_id 0 syndrom 0x0
scnt=133, ccnt=5
---------------------------------------------------------------------------------------
                    Send BW Test
 Dual-port       : OFF\t\tDevice         : rxe_h0
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
"""

FAILED = """\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
Completion with error at client
Failed status 12: wr_id 0 syndrom 0x81
scnt=128, ccnt=0
"""


def test_parse_write_bw_mib_per_second():
    r = parse_perftest(WRITE_BW)
    assert r["msg_bytes"] == 65536 and r["iterations"] == 5000 and r["unit"] == "MB/sec"
    assert r["bw_avg_mbps"] == pytest.approx(51.87 * 1048576 * 8 / 1e6)      # MB/sec is MiB/s in perftest
    assert r["bw_peak_mbps"] == pytest.approx(52.10 * 1048576 * 8 / 1e6)
    assert r["msg_rate_mpps"] == pytest.approx(0.000830)


def test_parse_stores_mbit_per_second_not_the_printed_number():
    """100.00 MB/sec is 100 MiB/s = 838.8608 Mbit/s (the old parser stored 100.0 under a ``_gbps`` key)."""
    text = WRITE_BW.replace("52.10              51.87", "100.00             100.00")
    r = parse_perftest(text)
    assert r["bw_avg_mbps"] == pytest.approx(838.8608, abs=1e-9)
    assert r["bw_peak_mbps"] == pytest.approx(838.8608, abs=1e-9)
    assert not [k for k in r if k.endswith("_gbps")]
    newer = text.replace("[MB/sec]", "[MiB/sec]")                           # perftest ≥ 4.5-0.20 says MiB
    assert parse_perftest(newer)["bw_avg_mbps"] == pytest.approx(838.8608, abs=1e-9)


def test_parse_send_bw_report_gbits():
    r = parse_perftest(SEND_BW_GBITS)
    assert r["iterations"] == 1831 and r["unit"] == "Gb/sec"
    assert r["bw_avg_mbps"] == pytest.approx(390.0) and r["bw_peak_mbps"] == 0.0


def test_parse_takes_the_unit_of_the_header_above_the_row():
    both = SEND_BW_GBITS + WRITE_BW                                    # the last row is in MB/sec
    assert parse_perftest(both)["bw_avg_mbps"] == pytest.approx(51.87 * 1048576 * 8 / 1e6)
    row_only = "\n".join(x for x in WRITE_BW.splitlines() if "#bytes" not in x)
    assert parse_perftest(row_only) is None                           # no header: the unit would be a guess


def test_vm_lane_outputs():
    r = parse_perftest(WRITE_BW_DURATION_VM)
    assert r["iterations"] == 78 and r["bw_avg_mbps"] == 0.0
    row = rxe.to_result(_flow(), r, WRITE_BW_DURATION_VM, 10.0, 12.4, 9.0, seconds=2)
    assert row.bytes == 78 * 65536 and row.goodput_mbps == pytest.approx(78 * 65536 * 8 / 2 / 1e6)
    assert parse_perftest(SEND_BW_FAILED_VM) is None
    bad = rxe.to_result(_flow(), None, SEND_BW_FAILED_VM, 10.0, 12.0, 9.0, seconds=2)
    assert bad.bytes == 0 and bad.error.startswith("perftest: ")


def test_parse_failure_has_no_row():
    assert parse_perftest(FAILED) is None
    assert parse_perftest("") is None


def _flow(size=None):
    return Flow(flow_id=3, src="h0", dst="h1", src_addr="198.18.0.1", dst_addr="198.18.1.1", sport=40000,
                dport=4791, proto="rocev2", size_bytes=size, rate_bps=None, start_s=0.0, engine="rxe")


def test_flow_row_from_perftest():
    r = rxe.to_result(_flow(size=5000 * 65536), parse_perftest(WRITE_BW), WRITE_BW, 10.0, 16.5, 9.0).to_dict()
    assert r["bytes"] == 5000 * 65536 and r["complete"] is True and r["fct_s"] == pytest.approx(6.5)
    assert r["engine"] == "rxe" and r["proto"] == "rocev2" and r["dport"] == 4791 and r["error"] is None
    assert r["start_s"] == pytest.approx(1.0) and r["goodput_mbps"] == pytest.approx(51.87 * 8.388608)
    zero = dict(parse_perftest(WRITE_BW), bw_avg_mbps=0.0)               # ib_send_bw -D client prints 0.00
    assert rxe.to_result(_flow(), zero, "", 10.0, 13.0, 9.0, seconds=2).goodput_mbps == pytest.approx(
        5000 * 65536 * 8 / 2 / 1e6)
    bad = rxe.to_result(_flow(), parse_perftest(FAILED), FAILED, 10.0, 11.0, 9.0).to_dict()
    assert bad["bytes"] == 0 and bad["error"] == "perftest: scnt=128, ccnt=0"


def test_perftest_command_lines():
    assert rxe.perftest_argv("ib_write_bw", "rxe_h1", 1, 18515, 65536, 80, 3) == [
        "ib_write_bw", "-d", "rxe_h1", "-x", "1", "-p", "18515", "-s", "65536", "-F", "-n", "80"]
    assert rxe.perftest_argv("ib_send_bw", "rxe_h0", 2, 18516, 4096, None, 3, "198.18.1.1")[-3:] == [
        "-D", "3", "198.18.1.1"]


def test_plan_and_scenario_for_rxe():
    from testbed import scenario
    from testbed import topology
    from testbed.workloads import plan
    scen = scenario.Scenario.model_validate({
        "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 1},
        "traffic": {"engine": "rxe", "pattern": "pairs", "pairs": [["h0", "h1"]], "rxe": {"test": "send_bw"}}})
    assert scen.traffic.rxe.test == "send_bw" and scen.traffic.rxe.msg_bytes == 65536
    flows = plan(scen.traffic, topology.build(scen.topology), scen.seed, 1.0)
    assert [(f.src, f.dst, f.engine, f.proto) for f in flows] == [("h0", "h1", "rxe", "rocev2")]
    with pytest.raises(ValueError, match="collectives"):
        scenario.Scenario.model_validate({"traffic": {"engine": "rxe", "jobs": [{"pattern": "allreduce",
                                                                                  "bytes": "1MB"}]}})


def test_missing_rxe_is_one_clear_line(tmp_path):
    if WHY is None:
        pytest.skip("rdma_rxe and perftest are present: there is no refusal to test")
    from testbed import runner, scenario
    scen = scenario.Scenario.model_validate({"traffic": {"engine": "rxe", "pattern": "pairs",
                                                         "pairs": [["h0", "h1"]]}})
    with pytest.raises(WorkloadError) as e:
        runner.run(scen, tmp_path / "out")
    assert "\n" not in str(e.value) and str(e.value).startswith("traffic.engine rxe:")
    assert not (tmp_path / "out").exists()                  # refused before building anything


@pytest.mark.fullkernel
@pytest.mark.e2e
@pytest.mark.parametrize("test,size", [("write_bw", None), ("send_bw", "2MB")])
def test_rxe_engine_across_leaf_spine_writes_flows_csv(tmp_path, test, size):
    """Soft-RoCE hosts (NICs in the root namespace, policy-routed) ↔ eBPF leaf–spine: perftest rows in flows.csv.
    write_bw as a duration flow (-D), send_bw as a sized flow (-n: ib_send_bw -D failed once in two runs under
    TCG with "Failed status 9"). Runs in the VM lane (``fullkernel``), whose image has rdma_rxe and perftest."""
    assert WHY is None, WHY
    import pandas as pd

    from testbed import runner, scenario
    scen = scenario.Scenario.model_validate({
        "name": f"rxe-{test}", "duration": "2s", "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 1},
        "traffic": {"engine": "rxe", "pattern": "pairs", "pairs": [["h0", "h1"]], "rxe": {"test": test},
                    "flow_size": size}})
    outdir, row = runner.run(scen, tmp_path / "out", source="test")
    flows = pd.read_csv(outdir / "flows.csv")
    assert len(flows) == 1, flows
    f = flows.iloc[0]
    client = (outdir / "perftest" / "perftest-0-client.txt").read_text()
    print(client)
    assert parse_perftest(client) is not None, client
    assert f["engine"] == "rxe" and f["bytes"] > 0 and f["goodput_mbps"] > 0, (f.to_dict(), client)
