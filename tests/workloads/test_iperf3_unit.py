"""traffic.engine iperf3, pure logic: its JSON report read into flows.csv's columns (UDP and TCP, sized and
duration flows), the client's command line, and the scenario's one-line refusals."""
from __future__ import annotations

import pytest

from testbed import scenario
from testbed.spec_types import ScenarioError
from testbed.workloads.flows import Flow
from testbed.workloads.iperf3 import client_argv, to_result


def _flow(proto="udp", size=None, rate=None, start=0.0) -> Flow:
    return Flow(3, "h0", "h5", "198.18.0.1", "198.18.1.2", 30003, 5204, proto, size, rate, start, dscp=26,
                ecn="ect0")


def _report(sent: dict, recv: dict) -> dict:
    return {"end": {"sum_sent": sent, "sum_received": recv}}


def test_a_udp_report_counts_the_tail_it_never_saw_as_lost():
    """Sent 100 datagrams; the receiver saw sequence numbers up to 90 with 5 missing among them: 85 received,
    15 lost (not iperf3's 5); goodput = received bytes over iperf3's 2 s data phase."""
    r = to_result(_flow(), _report({"packets": 100, "bytes": 147_200},
                                   {"packets": 90, "lost_packets": 5, "bytes": 125_120, "seconds": 2.0,
                                    "jitter_ms": 0.25}), None, 100.0, 102.5, 99.0)
    assert (r.packets_sent, r.packets_received, r.lost) == (100, 85, 15)
    assert r.goodput_mbps == pytest.approx(125_120 * 8 / 2.0 / 1e6) and r.jitter_ms == 0.25
    assert (r.start_s, r.end_s, r.fct_s, r.complete, r.retrans) == (1.0, 3.5, 2.0, None, None)
    assert (r.engine, r.proto, r.dport, r.bytes_sent) == ("iperf3", "udp", 5204, 147_200)


def test_a_sized_tcp_flow_is_complete_when_every_byte_arrived():
    done = to_result(_flow("tcp", size=1_000_000), _report({"bytes": 1_000_000, "retransmits": 7},
                                                           {"bytes": 1_000_000, "seconds": 0.5}), None, 10, 11, 10)
    assert done.complete and done.fct_s == 0.5 and done.retrans == 7 and done.lost is None
    short = to_result(_flow("tcp", size=1_000_000), _report({"bytes": 900_000, "retransmits": 0},
                                                            {"bytes": 600_000, "seconds": 4.0}), None, 10, 14, 10)
    assert short.complete is False and short.fct_s is None and short.goodput_mbps == pytest.approx(1.2)
    failed = to_result(_flow("tcp", size=1_000_000), None, "iperf3: unable to connect", 10, 11, 10)
    assert (failed.bytes, failed.goodput_mbps, failed.error) == (0, 0.0, "iperf3: unable to connect")


def test_the_client_sends_the_flow_as_planned():
    a = client_argv(_flow("udp", rate=5_000_000), "udp", 1500, 4.2)
    assert a[:3] == ["iperf3", "-c", "198.18.1.2"] and a[a.index("--cport") + 1] == "30003"
    assert a[a.index("-B") + 1] == "198.18.0.1" and a[a.index("-p") + 1] == "5204"
    assert a[a.index("-S") + 1] == str(26 << 2 | 2) and a[a.index("-t") + 1] == "4"
    assert a[a.index("-l") + 1] == "1472" and a[a.index("-b") + 1] == "5000000" and "-u" in a
    t = client_argv(_flow("tcp", size=2048), "tcp", 1500, 4.0)
    assert t[t.index("-n") + 1] == "2048" and "-u" not in t and "-b" not in t and "-t" not in t
    assert client_argv(_flow("udp"), "udp", 1500, 1.0)[-1] == "0"        # no rate: as fast as the link takes


@pytest.mark.parametrize("traffic,extra,line", [
    ({"iperf3": {"protocol": "tcp"}}, {}, "traffic.iperf3: applies to traffic.engine iperf3"),
    ({"engine": "iperf3", "jobs": [{"pattern": "allreduce", "bytes": "1MB"}]}, {},
     "traffic.engine: iperf3 runs pattern flows"),
    ({"engine": "iperf3"}, {"hosts": {"pfc": True}}, "traffic.engine: iperf3 cannot choose its sockets' priority"),
])
def test_what_iperf3_cannot_do_is_refused_in_one_line(traffic, extra, line):
    with pytest.raises(ScenarioError) as e:
        scenario.from_dict({"traffic": traffic, **extra})
    assert str(e.value).startswith(line), str(e.value)
