"""Collectives: schedules (pure) and all-to-all JCT with ECMP vs spray + ooo on a real leaf–spine (e2e)."""
from __future__ import annotations

import pytest

from testbed import topology
from testbed.workloads import collectives, replay

from conftest import make_scenario


def _sched(jobs, **topo):
    s = make_scenario(topology=topo or {"leaves": 2, "hosts_per_leaf": 2}, traffic={"engine": "roce", "jobs": jobs})
    return collectives.schedule(s.traffic, topology.build(s.topology), 1), s


def test_ring_allreduce_has_2n_minus_2_steps_of_bytes_over_n():
    rounds, _ = _sched([{"pattern": "allreduce", "bytes": 4000, "hosts": ["h0", "h1", "h2", "h3"]}])
    assert len(rounds) == 2 * (4 - 1)
    for (step,) in rounds:
        assert sorted((a, b) for a, b, _ in step.pairs) == [("h0", "h1"), ("h1", "h2"), ("h2", "h3"), ("h3", "h0")]
        assert all(n == 1000 for *_, n in step.pairs)
    assert rounds[-1][0].last and not rounds[0][0].last


def test_patterns_jobs_iterations_and_gaps():
    rounds, _ = _sched([{"name": "a", "pattern": "all-to-all", "bytes": 10, "iterations": 3, "gap": "5ms"},
                        {"name": "i", "pattern": "incast", "bytes": 20, "hosts": ["h3", "h0", "h1"]},
                        {"name": "p", "pattern": "permutation", "bytes": 30}])
    assert len(rounds) == 3
    a = [s for r in rounds for s in r if s.job == "a"]
    assert [s.iteration for s in a] == [0, 1, 2] and [s.gap_s for s in a] == [0.0, 0.005, 0.005]
    assert len(a[0].pairs) == 12
    inc, = [s for s in rounds[0] if s.job == "i"]
    assert sorted(inc.pairs) == [("h0", "h3", 20), ("h1", "h3", 20)]
    perm, = [s for s in rounds[0] if s.job == "p"]
    assert sorted(a for a, _, _ in perm.pairs) == sorted(b for _, b, _ in perm.pairs) and all(x != y for x, y, _ in perm.pairs)


def test_pairwise_all_to_all_is_n_minus_1_shifted_steps():
    rounds, _ = _sched([{"pattern": "all-to-all", "algorithm": "pairwise", "bytes": 7,
                         "hosts": ["h0", "h1", "h2", "h3"]}])
    assert len(rounds) == 3
    assert [sorted(p[:2] for p in step.pairs) for (step,) in rounds] == [
        [("h0", "h1"), ("h1", "h2"), ("h2", "h3"), ("h3", "h0")],
        [("h0", "h2"), ("h1", "h3"), ("h2", "h0"), ("h3", "h1")],
        [("h0", "h3"), ("h1", "h0"), ("h2", "h1"), ("h3", "h2")]]
    every = sorted(p for (step,) in rounds for p in step.pairs)
    direct, _ = _sched([{"pattern": "all-to-all", "bytes": 7, "hosts": ["h0", "h1", "h2", "h3"]}])
    assert every == sorted(direct[0][0].pairs)          # the same transfers, only scheduled apart
    from testbed.scenario import ScenarioError
    with pytest.raises(ScenarioError, match="traffic.jobs.0.algorithm"):
        make_scenario(traffic={"jobs": [{"pattern": "allreduce", "algorithm": "pairwise", "bytes": 8}]})


def test_pattern_allreduce_shortcut_and_bad_hosts():
    s = make_scenario(traffic={"engine": "roce", "pattern": "allreduce", "flow_size": "1MB"})
    assert s.traffic.runs_collectives and s.traffic.job_list()[0].pattern == "allreduce"
    from testbed.scenario import ScenarioError
    with pytest.raises(ScenarioError, match="traffic.jobs.0.hosts"):
        make_scenario(traffic={"jobs": [{"pattern": "incast", "bytes": 1, "hosts": ["h0", "h99"]}]})


@pytest.mark.e2e
def test_all_to_all_jct_spray_ooo_beats_ecmp(lab, capsys):
    """8 hosts on 2 leaves, 4 × 10 Mbit/s uplinks per leaf under 20 Mbit/s hosts (oversubscribed 2:1): ECMP
    collisions make the slowest flow — and so the all-to-all — late; per-packet spraying with the ooo receiver
    evens the uplinks. Rates light enough that the 2-core machine is not the bottleneck; an RTO above the
    queueing delay (ACKs wait behind data), so that go-back-N resends only what was lost."""
    jct = {}
    retrans = {}
    for mode, receiver in (("ecmp", "gbn"), ("spray", "ooo")):
        topo = {"spines": 4, "leaves": 2, "hosts_per_leaf": 4, "host_link": {"rate": "20mbit", "buffer": "256KB"},
                "fabric_link": {"rate": "10mbit", "buffer": "512KB"}}
        s = make_scenario(topology=topo, switch={"load_balancing": mode, "hash_seed": 5},
                          traffic={"engine": "roce", "receiver": receiver, "roce": {"rto": "500ms"},
                                   "jobs": [{"pattern": "all-to-all", "bytes": "64KB", "iterations": 2}]})
        lb = lab(s)
        played = replay.play(replay.from_collectives(s.traffic, lb.topo, 1), s.traffic, lb.topo, 1,
                             lambda h: lb.fabric.ns[h], 60.0, 1500)
        assert all(r.checksum_ok for r in played.results)
        rows = played.rows
        assert len(rows) == 2 and all(r["jct_ms"] is not None for r in rows)
        jct[mode] = sum(r["jct_ms"] for r in rows) / len(rows)
        retrans[mode] = sum(r.retrans for r in played.results)
    ratio = jct["spray"] / jct["ecmp"]
    with capsys.disabled():
        print(f"\nall-to-all JCT: ecmp {jct['ecmp']:.0f} ms, spray+ooo {jct['spray']:.0f} ms, ratio {ratio:.2f}; "
              f"retransmits {retrans}")
    assert ratio < 0.78, (jct, retrans)          # 0.67–0.68 measured


def test_a_transfer_is_striped_over_the_rails():
    """NCCL style, one channel per NIC: bytes // rails per rail, the remainder on rail 0; none empty."""
    assert collectives.stripes(10, 3) == [4, 3, 3]
    assert collectives.stripes(64 * 1024, 2) == [32 * 1024, 32 * 1024]
    assert collectives.stripes(1, 4) == [1]
    assert collectives.stripes(5, 1) == [5]
