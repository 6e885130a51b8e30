"""Beyond one machine, the pure parts: placement validation, partitioning, the underlay check, restricted
topologies, what a fabric over several machines refuses, the sweep's result archives."""
from __future__ import annotations

import io
import tarfile

import pytest

from testbed import scenario, topology
from testbed.cluster import partition as P
from testbed.cluster.run import unsupported
from testbed.fabric import netns


def _scen(*sets, path="scenarios/default.yaml"):
    return scenario.load(path, tuple(sets))


def test_placement_is_validated_with_its_key_path():
    with pytest.raises(scenario.ScenarioError, match=r"placement\.assign: strategy manual needs assign"):
        _scen("placement.strategy=manual")
    with pytest.raises(scenario.ScenarioError, match=r"placement\.assign: only with strategy: manual"):
        _scen("placement.assign={leaf0: 0}")
    with pytest.raises(scenario.ScenarioError, match=r"placement\.assign\.leaf1: machine 2 out of range"):
        _scen("placement.strategy=manual", "placement.assign={leaf0: 0, leaf1: 2}")
    with pytest.raises(scenario.ScenarioError, match=r"placement\.assign\.leaf9"):
        _scen("placement.strategy=manual", "placement.assign={leaf9: 0}")


def test_auto_keeps_each_leaf_with_its_hosts_and_balances_the_default_fabric():
    s = _scen("placement.partitions=2")
    topo = topology.build(s.topology)
    part = P.partition(topo, s.placement)
    for h in topo.hosts:
        assert part.of[h] == part.of[topo.leaf_of(h)]
    assert part.of["leaf0"] != part.of["leaf1"]
    # each machine: one leaf with 4 hosts and 2 of the 4 spines (load 240 + 2 × 40 Mbit/s of port rates each)
    assert sorted(len([n for n in part.nodes(m) if n.startswith("spine")]) for m in (0, 1)) == [2, 2]
    # every leaf reaches the 2 spines of the other machine through the cut: 2 leaves × 2 = 4 cut links
    assert len(part.cut) == 4 and len({c.vni for c in part.cut}) == 4
    assert all(c.rate_bps == 20_000_000 and {c.a_machine, c.b_machine} == {0, 1} for c in part.cut)
    assert part.cut_rate_bps(0) == 80_000_000


def test_by_leaf_and_manual():
    s = _scen("placement.partitions=2", "placement.strategy=by-leaf")
    topo = topology.build(s.topology)
    part = P.partition(topo, s.placement)
    assert [part.of[n] for n in ("leaf0", "leaf1", "spine0", "spine1", "spine2", "spine3")] == [0, 1, 0, 0, 1, 1]
    s = _scen("placement.strategy=manual", "placement.assign={leaf0: 0, spine0: 0, leaf1: 1, spine1: 1, "
              "spine2: 1, spine3: 1}")
    part = P.partition(topo, s.placement)
    assert part.of["h0"] == 0 and part.of["h7"] == 1 and len(part.cut) == 4      # leaf0→spine1..3, leaf1→spine0
    s = _scen("placement.strategy=manual", "placement.assign={leaf0: 0, leaf1: 1}")
    with pytest.raises(P.PlacementError, match=r"placement\.assign: spine0 is on no machine"):
        P.partition(topo, s.placement)
    s = _scen("placement.strategy=manual", "placement.assign={leaf0: 0, leaf1: 1, spine0: 0, spine1: 0, "
              "spine2: 0, spine3: 0, h0: 1}")
    with pytest.raises(P.PlacementError, match=r"placement\.assign\.h0: machine 1, but its leaf leaf0"):
        P.partition(topo, s.placement)


def test_too_many_partitions_and_fat_tree_units():
    s = _scen("placement.partitions=7")
    with pytest.raises(P.PlacementError, match="only 6 placement units"):
        P.partition(topology.build(s.topology), s.placement)
    s = _scen("placement.partitions=2", path="scenarios/fat-tree-k4.yaml")
    topo = topology.build(s.topology)
    part = P.partition(topo, s.placement)
    assert len(P.units(topo)) == 8 + 8 + 4               # 8 leaf groups, 8 spines, 4 cores
    assert all(part.of[h] == part.of[topo.leaf_of(h)] for h in topo.hosts)
    assert set(part.of.values()) == {0, 1}


def test_underlay_mtu_is_refused_and_rate_warned():
    s = _scen("placement.partitions=2")
    part = P.partition(topology.build(s.topology), s.placement)
    # 1500 + 50 bytes of VXLAN do not fit a 1500-byte underlay; 1550 do
    with pytest.raises(P.PlacementError, match=r"underlay MTU is 1500.*1500-byte packets \+ 50 bytes of VXLAN = 1550"):
        P.check_underlay(part, 1500, [(1500, None), (9000, None)])
    assert P.check_underlay(part, 1500, [(1550, None), (1550, None)]) == []
    # 4 cut links × 20 Mbit/s = 80 Mbit/s through each machine's underlay of 50 Mbit/s: one warning per machine
    w = P.check_underlay(part, 1500, [(9000, 50_000_000), (9000, 100_000_000)])
    assert len(w) == 1 and "machine 0" in w[0] and "80 Mbit/s" in w[0] and "50 Mbit/s" in w[0]


def test_restricted_topology_keeps_ids_and_the_fabric_wide_port_lookup():
    topo = topology.build(_scen().topology)
    part = topo.restrict(["leaf0", "h0", "h1", "h2", "h3", "spine0"])
    assert part.switches == ["leaf0", "spine0"] and len(part.hosts) == 4
    assert part.switch_ids == topo.switch_ids
    assert all(ln.a.node in part.nodes and ln.b.node in part.nodes for ln in part.links)
    assert len(part.links) == 4 + 1                     # 4 host links + leaf0–spine0
    assert {e.switch for e in part.fib} == {"leaf0", "spine0"}
    cut_port = part.port_named("leaf0", "spine1")       # a port whose peer is on another machine …
    assert part.port(cut_port.peer_ifindex).node == "spine1"     # … whose peer can still be looked up


def test_unsupported_features_are_named():
    assert unsupported(_scen()) is None
    assert unsupported(_scen("switch.routing=sm")) is None       # the SM sends the other machines their tables
    for works in (("telemetry.int.enabled=true",), ("capture=[h0]",)):   # these work across the cut
        assert unsupported(_scen(*works)) is None
    assert unsupported(_scen(path="scenarios/incast-credit.yaml")) is None   # credit frames cross it
    assert unsupported(_scen(path="scenarios/allreduce-ring.yaml")) is None
    assert unsupported(_scen(path="scenarios/link-failure.yaml")) is None    # link state is flooded
    assert unsupported(_scen("hosts.docker.image=fabric-testbed/host")) is None   # each machine starts its own
    assert "rxe" in unsupported(_scen("traffic.engine=rxe"))
    assert "WCMP controller" in unsupported(_scen(path="scenarios/int-wcmp-permutation.yaml"))


def test_gate_paths_move_under_each_machines_own_directory():
    from testbed.cluster.gate_relay import localize
    job = {"host": "h0", "gate": "/g/run-1/h0", "notify": {"3": ["/g/run-1/h4", "/g/run-1/h1"]}, "send": []}
    assert localize(job, "/g/run-1", 1) == {"host": "h0", "gate": "/g/run-1/m1/h0", "send": [],
                                            "notify": {"3": ["/g/run-1/m1/h4", "/g/run-1/m1/h1"]}}
    assert localize({"host": "h2", "send": []}, "/g/run-1", 0) == {"host": "h2", "send": []}


def test_an_announcement_to_another_machines_host_reaches_its_gate_through_the_relays(tmp_path):
    """Two machines' relays on loopback (real sockets): h0's agent on m0 announces to h4's gate path in m0's
    directory; m1's relay delivers it, unchanged, to h4's gate in m1's directory — also when the gate is bound
    only after the announcement arrived."""
    import socket
    import time

    from testbed.cluster.gate_relay import GateRelay, machine_dir
    from testbed.workloads.gating import announcement, parse_announcement
    gates = str(tmp_path / "run-1")
    m0, m1 = GateRelay(gates, 0, "127.0.0.1"), GateRelay(gates, 1, "127.0.0.1")
    try:
        m0.start({"h4": m1.endpoint})
        m1.start({})
        agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        agent.sendto(announcement([(7, 12.5)]), f"{machine_dir(gates, 0)}/h4")
        time.sleep(0.1)                                  # arrived at m1 before h4's gate is bound: kept
        gate = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        gate.bind(f"{machine_dir(gates, 1)}/h4")
        gate.settimeout(2)
        assert parse_announcement(gate.recv(256)) == [(7, 12.5)]
        agent.close()
        gate.close()
    finally:
        m0.close()
        m1.close()
    # read once the threads are joined: the relay counts a delivery just after the gate may already have read it
    assert m0.relayed == 1 and m1.delivered == 1 and m0.error is None and m1.error is None
    assert list((tmp_path / "run-1").iterdir()) == []        # both machines' directories removed


def test_machine_namespaces_are_not_labs():
    assert netns.is_machine("ftb-m0") and netns.is_machine("ftb-m12")
    assert not netns.is_machine("ftb-m0x-h0") and not netns.is_machine("ftb-mlab-h0") and not netns.is_machine("ftb-m")


def test_a_result_archive_may_hold_only_its_run_directory(tmp_path):
    from testbed.cluster.distributed_sweep import ClusterError, _unpack
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ClusterError, match="outside the run directory"):
        _unpack(buf.getvalue(), tmp_path, "00-run")
    assert list(tmp_path.iterdir()) == []


def test_routing_and_failure_results_of_two_machines_merge_into_one_runs():
    """Per event: the earliest machine that changed something applied it, until the last was done; a machine
    with nothing to do for it does not count. Change records stay per agent (failures.csv's reaction)."""
    from types import SimpleNamespace

    from testbed.cluster.run import _merge_routing
    used = [SimpleNamespace(name="m0"), SimpleNamespace(name="m1")]
    ch0 = [{"kind": "reroute", "t_detect": 10.002, "t_done": 10.003, "ports": [[5, False]]}]
    ch1 = [{"kind": "reroute", "t_detect": 10.004, "t_done": 10.006, "ports": [[5, False]]}]
    def rt(changes, sent):
        return {"changes": changes, "local": [], "errors": [], "error_count": 0, "changes_dropped": 0,
                "entries": 2, "floods_sent": sent, "floods_taken": 1}
    def fs(applied):
        return {"t0": 9.0, "applied": applied, "errors": [], "error_count": 0, "degradations": []}
    finals = {0: {"routing": rt(ch0, 3), "scheduler": fs([
                  {"index": 0, "applied": 10.0, "took_s": 0.001, "requests": 1},
                  {"index": 1, "applied": 11.0, "took_s": 0.001, "requests": 0}])},
              1: {"routing": rt(ch1, 2), "scheduler": fs([
                  {"index": 0, "applied": 10.0005, "took_s": 0.002, "requests": 1},
                  {"index": 1, "applied": 11.0002, "took_s": 0.001, "requests": 2}])}}
    r, f = _merge_routing(finals, used)
    assert r["agents"] == [ch0, ch1] and [c["machine"] for c in r["changes"]] == ["m0", "m1"]
    assert r["floods_sent"] == 5 and r["entries"] == 4
    (e0, e1) = f["applied"]
    assert e0["applied"] == 10.0 and e0["took_s"] == pytest.approx(0.0025) and e0["requests"] == 2
    assert e1["applied"] == 11.0002 and e1["took_s"] == pytest.approx(0.001) and e1["requests"] == 2


def test_up_over_the_cluster_refuses_a_malformed_metrics_address_before_joining_it():
    from conftest import run_cli
    res = run_cli("up", "scenarios/default.yaml", "--cluster", "auto", "--metrics", "localhost:x")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: --metrics 'localhost:x': expected HOST:PORT"), line


def test_under_sm_routing_the_runs_routing_is_the_subnet_managers():
    """The SM's sweeps, tables and change records are the run's (failures.csv's reaction is its); the other
    machine's agent adds its carrier changes, errors and floods."""
    from types import SimpleNamespace

    from testbed.cluster.run import _merge_routing
    used = [SimpleNamespace(name="m0"), SimpleNamespace(name="m1")]
    sweep = {"kind": "sweep", "t_detect": 5.01, "t_done": 5.012, "ports": [[9, False]]}
    sm = {"mode": "sm", "role": "subnet manager", "engine": "ftree", "sweeps": 300, "entries": 96,
          "changes": [sweep], "local": [], "errors": [], "error_count": 0, "changes_dropped": 0,
          "floods_sent": 4, "floods_taken": 3, "remote_entries": 40}
    sma = {"mode": "sm", "role": "sm agent", "sweeps": 0, "entries": 0, "changes": [],
           "local": [{"t": 5.0, "ifindex": 9, "up": False}], "errors": ["x"], "error_count": 1,
           "changes_dropped": 0, "floods_sent": 3, "floods_taken": 4, "tables_taken": 40}
    r, _ = _merge_routing({0: {"routing": sm}, 1: {"routing": sma}}, used)
    assert r["mode"] == "sm" and r["engine"] == "ftree" and r["sweeps"] == 300 and r["entries"] == 96
    assert r["agents"] == [[sweep]] and [c["machine"] for c in r["changes"]] == ["m0"]
    assert r["local"] == [{"t": 5.0, "ifindex": 9, "up": False, "machine": "m1"}]
    assert r["errors"] == ["m1: x"] and r["error_count"] == 1 and r["floods_taken"] == 7


def test_an_actors_death_cause_is_read_from_the_gcs_protobuf():
    """The GCS reports an actor's DeathCause as a protobuf message (not a mapping): the driver reads its error
    message from it (reading it as a dict raised AttributeError: get when the driver noticed a death first)."""
    gcs_pb2 = pytest.importorskip("ray.core.generated.gcs_pb2")
    from testbed.cluster.run import _death_message
    d = gcs_pb2.ActorTableData()
    assert _death_message(d.death_cause) == "" and _death_message(None) == ""
    d.death_cause.actor_died_error_context.error_message = "The actor died unexpectedly before finishing this task."
    assert _death_message(d.death_cause).startswith("The actor died unexpectedly")


def test_the_pfc_agents_late_pauses_add_up_over_machines_and_keep_the_worst():
    """m0 paused late twice (worst 40 frames after Xoff), m1 once (50): 3 events, the worst m1's."""
    from testbed.cluster.run import _merge_pfc
    m0 = {"reaction_us": [1.0], "late": {"events": 2, "leaked_max": 40, "headroom_frames": 32, "reaction_us": 9e3}}
    m1 = {"reaction_us": [2.0], "late": {"events": 1, "leaked_max": 50, "headroom_frames": 32, "reaction_us": 12e3}}
    got = _merge_pfc([m0, m1])
    assert got["reaction_us"] == [1.0, 2.0]
    assert got["late"] == {"events": 3, "leaked_max": 50, "headroom_frames": 32, "reaction_us": 12e3}
