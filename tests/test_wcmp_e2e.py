"""End-to-end static WCMP: real namespaces, shaped links, the eBPF switch. leaf0's uplink to spine0 has
`topology.links` weight 3, the other three weight 1: per packet (and per flowlet over many flows) leaf0's
uplinks carry bytes 3:1:1:1, where ECMP/spray would split them evenly."""
from __future__ import annotations

import pytest

from testbed import workloads

from conftest import make_scenario

pytestmark = pytest.mark.e2e

WEIGHTS = {"spine0": 3, "spine1": 1, "spine2": 1, "spine3": 1}


def uplink_bytes(lab, granularity, flows=1, rate=24e6):
    link = {"rate": "40mbit", "buffer": "256KB"}
    scen = make_scenario(topology={"spines": 4, "leaves": 2, "hosts_per_leaf": 1, "host_link": link,
                                   "fabric_link": link,
                                   "links": [{"between": ["leaf0", s], "weight": w} for s, w in WEIGHTS.items()]},
                         switch={"load_balancing": "wcmp", "wcmp": {"granularity": granularity},
                                 "flowlet_timeout": "200us"})
    lb = lab(scen)
    t = lb.topo
    fl = [workloads.Flow(i, "h0", "h1", t.address("h0"), t.address("h1"), 30000 + i, 5001, "udp", None,
                         int(rate / flows), 0.0) for i in range(flows)]
    before = lb.datapath.port_counters()
    # small packets, many draws: ~40k packets, so a 1/6 share's sampling error (1σ ≈ 1.1 % of it) sits far
    # inside the 5 % asserted
    res = workloads.run(fl, lambda h: lb.fabric.ns[h], 3.0, 200)
    after = lb.datapath.port_counters()
    ups = {p.peer_node: p.ifindex for p in t.uplinks("leaf0")}
    out = {s: after[i].tx_bytes - before[i].tx_bytes for s, i in ups.items()}
    lb.close(force=True)
    return out, res


@pytest.mark.parametrize("granularity,flows", [("packet", 1), ("flowlet", 16)])
def test_static_wcmp_splits_bytes_by_weight(lab, granularity, flows):
    out, res = uplink_bytes(lab, granularity, flows)
    total = sum(out.values())
    shares = {s: b / total for s, b in out.items()}
    print(f"\n[wcmp {granularity}, {flows} flow(s)] uplink shares {({s: round(v, 3) for s, v in shares.items()})}, "
          f"lost {sum(r.lost for r in res)}")
    assert total > 6_000_000                              # 3 s at 24 Mbit/s ≈ 9 MB
    for s, w in WEIGHTS.items():
        want = w / sum(WEIGHTS.values())
        assert abs(shares[s] - want) <= 0.05 * want, (s, shares[s], want)
    assert sum(r.lost for r in res) == 0
