"""Schedule replay, pure parts: the file format, its validation, the export of the built-in collectives, the
flows of a schedule, the per-tag JCT rows, the orchestrator's dependency bookkeeping and the agent's gate."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from testbed import scenario, topology
from testbed.workloads import replay
from testbed.workloads.agent import ANNOUNCE_MAX, Announcer, Gate
from testbed.workloads.collectives import TransferFlows
from testbed.workloads.gating import Dependencies, Waits, parse_announcement
from testbed.workloads.replay import ReplayError, Transfer

from conftest import make_scenario

HOSTS = {f"h{i}" for i in range(8)}


def write(tmp_path, text, name="s.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_with_units_separators_and_defaults(tmp_path):
    p = write(tmp_path, "id,src,dst,bytes,start,deps,delay,tag\n"
                        "a,h0,h1,256KB,,,,\n"
                        "b,h1,h2,1000,5ms,a,,x\n"
                        "c, h2 ,h3,2MB,0.25,a;b,1ms,x\n"
                        "7,h3,h0,10,,a b  c,,\n")
    a, b, c, d = replay.read(p)
    assert a == Transfer("a", "h0", "h1", 256 * 1024)
    assert (b.start_s, b.deps, b.tag) == (0.005, ("a",), "x")
    assert (c.src, c.bytes, c.start_s, c.deps, c.delay_s) == ("h2", 2 << 20, 0.25, ("a", "b"), 0.001)
    assert (d.id, d.deps, d.tag) == ("7", ("a", "b", "c"), "replay")
    replay.check([a, b, c, d], HOSTS)


def test_json_list_or_object_and_roundtrips(tmp_path):
    rows = [{"id": 1, "src": "h0", "dst": "h1", "bytes": "1KB"},
            {"id": 2, "src": "h1", "dst": "h0", "bytes": 5, "deps": [1], "delay": "2ms", "tag": "t"}]
    one = replay.read(write(tmp_path, json.dumps(rows), "a.json"))
    two = replay.read(write(tmp_path, json.dumps({"transfers": rows}), "b.json"))
    assert one == two and one[1] == Transfer("2", "h1", "h0", 5, deps=("1",), delay_s=0.002, tag="t")
    for name in ("out.csv", "out.json"):
        replay.write(tmp_path / name, one)
        assert replay.read(tmp_path / name) == one


@pytest.mark.parametrize("text,where", [
    ("id,src,dst,bytes\na,h0,h1,10x\n", "line 2: expected a size"),
    ("id,src,dst,bytes,colour\na,h0,h1,10,red\n", "line 2: unknown column 'colour'"),
    ("id,src,dst,bytes\na,h0,,10\n", "line 2: dst is missing"),
    ("id,src,dst,bytes\na,h0,h1,10\nb,h0,h1,10,9\n", "line 3: more fields than the header has"),
    ("id,src,dst,bytes,start\na,h0,h1,10,-1\n", "line 2: start must be ≥ 0"),
    ("id,src,dst,bytes,delay\na,h0,h1,10,1 fortnight\n", "line 2: expected a time"),
    ("id,src,dst,bytes\na,h0,h1,0\n", "line 2: bytes must be > 0"),
    ("id,src,dst,bytes\n", ": no transfers"),
    ("", ": empty"),
    ("[1, 2]", ": expected a list of transfer objects"),
    ('[{"id": 1, "src": "h0", "dst": "h1", "bytes": 1, "deps": 3}]', "transfer 1: deps must be a list"),
])
def test_malformed_files_name_the_row(tmp_path, text, where):
    p = write(tmp_path, text, "s.json" if text.startswith("[") else "s.csv")
    with pytest.raises(ReplayError) as e:
        replay.read(p)
    assert str(e.value).startswith(str(p)) and where in str(e.value)


@pytest.mark.parametrize("transfers,msg", [
    ([Transfer("a", "h0", "h9", 1)], "transfer 'a': no host 'h9'"),
    ([Transfer("a", "h0", "h0", 1)], "transfer 'a' goes from h0 to itself"),
    ([Transfer("a", "h0", "h1", 1), Transfer("a", "h1", "h0", 1)], "transfer id 'a' is used twice"),
    ([Transfer("a", "h0", "h1", 1, deps=("z",))], "transfer 'a' depends on 'z', which is not in the file"),
    ([Transfer("a", "h0", "h1", 1, deps=("c",)), Transfer("b", "h1", "h2", 1, deps=("a",)),
      Transfer("c", "h2", "h0", 1, deps=("b",))], "in a cycle: a → b → c → a"),
])
def test_check_refuses_what_cannot_run(transfers, msg):
    with pytest.raises(ReplayError, match=msg):
        replay.check(transfers, HOSTS, "here")


def _ring(jobs, **topo):
    s = make_scenario(topology=topo or {"leaves": 2, "hosts_per_leaf": 2}, traffic={"engine": "roce", "jobs": jobs})
    return s, topology.build(s.topology)


def test_export_of_a_ring_allreduce_waits_for_the_whole_previous_step():
    s, topo = _ring([{"name": "ar", "pattern": "allreduce", "bytes": 4000}])
    ts = replay.from_collectives(s.traffic, topo, s.seed)
    assert len(ts) == 6 * 4 and {t.tag for t in ts} == {"ar"} and all(t.bytes == 1000 for t in ts)
    steps = [ts[4 * k:4 * k + 4] for k in range(6)]
    assert all(t.deps == () for t in steps[0])
    for prev, cur in zip(steps, steps[1:]):
        assert all(set(t.deps) == {p.id for p in prev} for t in cur)
    assert [(t.src, t.dst) for t in steps[0]] == [("h0", "h1"), ("h1", "h2"), ("h2", "h3"), ("h3", "h0")]
    replay.check(ts, set(topo.hosts))


def test_export_of_iterations_carries_the_compute_gap_as_delay():
    s, topo = _ring([{"name": "a", "pattern": "incast", "bytes": 10, "iterations": 3, "gap": "5ms"}])
    ts = replay.from_collectives(s.traffic, topo, s.seed)
    assert [t.tag for t in ts] == ["a.0"] * 3 + ["a.1"] * 3 + ["a.2"] * 3
    assert [t.delay_s for t in ts] == [0.0] * 3 + [0.005] * 6
    assert set(ts[3].deps) == {t.id for t in ts[:3]} and set(ts[6].deps) == {t.id for t in ts[3:6]}


def test_flows_stripe_over_rails_and_wait_for_every_flow_of_a_dependency():
    s = make_scenario(topology={"leaves": 2, "hosts_per_leaf": 2, "rails": 2}, traffic={"engine": "roce"})
    topo = topology.build(s.topology)
    ts = [Transfer("a", "h0", "h1", 1001), Transfer("b", "h1", "h2", 10, deps=("a",), delay_s=0.01),
          Transfer("c", "h2", "h3", 1, start_s=0.5)]
    flows, owner = replay.to_flows(ts, TransferFlows(s.traffic, topo, s.seed))
    assert [(f.flow_id, f.size_bytes, f.rail) for f in flows] == [(0, 501, 0), (1, 500, 1), (2, 5, 0), (3, 5, 1),
                                                                  (4, 1, 0)]
    assert [t.id for t in owner] == ["a", "a", "b", "b", "c"]
    assert flows[2].after == flows[3].after == [0, 1] and flows[2].after_delay_s == 0.01
    assert flows[0].after is None and flows[4].start_s == 0.5 and flows[4].after is None


def test_op_rows_span_first_start_to_last_end_per_tag():
    ts = [Transfer("a", "h0", "h1", 10, tag="x"), Transfer("b", "h1", "h2", 10, tag="x"),
          Transfer("c", "h2", "h3", 10, tag="y")]
    res = [SimpleNamespace(size_bytes=10, complete=True, start_s=1.0, end_s=1.5),
           SimpleNamespace(size_bytes=10, complete=True, start_s=1.6, end_s=2.25),
           SimpleNamespace(size_bytes=10, complete=False, start_s=1.0, end_s=None)]
    x, y = replay.op_rows(ts, res)
    assert x == dict(job="x", iteration=0, op="replay", bytes=20, start_s=1.0, end_s=2.25, jct_ms=1250.0,
                     transfers=2)
    assert y["jct_ms"] is None and y["transfers"] == 1


def _flow(fid, src, dst, after=None, delay=0.0):
    return SimpleNamespace(flow_id=fid, src=src, dst=dst, after=after, after_delay_s=delay)


def test_dependencies_say_who_announces_to_whom():
    d = Dependencies([_flow(0, "h0", "h1"), _flow(1, "h1", "h2"), _flow(2, "h2", "h3", [0, 1], 0.5),
                      _flow(3, "h3", "h1", [0])])
    assert d.gated_hosts == {"h2", "h3"}

    def path(h):
        return f"/g/{h}"
    assert d.notify("h1", path) == {"0": ["/g/h2", "/g/h3"]}       # h1 receives flow 0: both wait for it
    assert d.notify("h2", path) == {"1": ["/g/h2"]} and d.notify("h0", path) == {}


def test_dependencies_refuse_unknown_flows_and_cycles():
    with pytest.raises(ValueError, match="waits for flow 9"):
        Dependencies([_flow(0, "h0", "h1", [9])])
    with pytest.raises(ValueError, match="cycle"):
        Dependencies([_flow(0, "h0", "h1", [1]), _flow(1, "h1", "h0", [0])])


def test_cycle_search_is_fast_on_step_barriers():
    """Three all-to-all barriers of 480 flows (690k edges): checked in seconds (find_cycle alone took minutes)"""
    import time
    from testbed.workloads.gating import cycle_of
    edges = [(base + a, base + 480 + b) for base in (0, 480, 960) for a in range(480) for b in range(480)]
    t = time.monotonic()
    assert cycle_of(edges) is None
    assert time.monotonic() - t < 10
    assert cycle_of(edges + [(1440 + 5, 3)])[0] is not None


def test_waits_release_a_flow_when_its_last_dependency_completes():
    w = Waits([{"flow_id": 2, "after": [0, 1], "after_delay_s": 0.5}, {"flow_id": 3, "after": [0]}])
    assert w.pending == {2, 3}
    assert w.done(0, 10.0) == [(3, 10.0)]
    assert w.done(0, 11.0) == []                                   # announced twice: nothing more
    assert w.done(1, 12.0) == [(2, 12.5)] and w.pending == set()


def test_waits_start_a_flow_after_the_latest_completion_whatever_order_the_announcements_arrive_in():
    """A skipped ring order's flows are announced when the decision comes, possibly after the flows that ran:
    their earlier completion does not pull the start back."""
    w = Waits([{"flow_id": 9, "after": [0, 1, 2], "after_delay_s": 0.1}])
    assert w.done(1, 20.0) == [] and w.done(0, 5.0) == []
    assert w.done(2, 7.0) == [(9, 20.1)]


def test_flows_completed_together_go_to_a_gate_in_one_datagram(tmp_path):
    """Announcer batches per gate: 300 flows completed at once are 2 datagrams (200 each at most), read whole."""
    path = str(tmp_path / "h1")
    senders = [SimpleNamespace(flow={"flow_id": 1000, "after": list(range(300))})]
    gate = Gate(senders, path)
    states = [SimpleNamespace(flow_id=i, complete=True, last_rx=100.0 + i) for i in range(300)]
    ann = Announcer(states, {str(i): [path] for i in range(300)})
    ann.check()
    assert not ann
    got = []
    for _ in range(2):
        got += parse_announcement(gate.sock.recv(ANNOUNCE_MAX))
    assert got == [(i, 100.0 + i) for i in range(300)]
    with pytest.raises(BlockingIOError):
        gate.sock.recv(ANNOUNCE_MAX)
    gate.close()
    ann.close()


def test_gate_and_announcer_over_a_unix_socket(tmp_path):
    """The receiver's Announcer retries a gate that is not bound yet; the gate releases a flow once everything
    it waits for was announced, at the last completion plus its delay."""
    senders = [SimpleNamespace(flow={"flow_id": 5, "after": [1, 2], "after_delay_s": 0.25}),
               SimpleNamespace(flow={"flow_id": 6, "after": [2]})]
    states = [SimpleNamespace(flow_id=i, complete=False, last_rx=None) for i in (1, 2, 3)]
    path = str(tmp_path / "h1")
    ann = Announcer(states, {"1": [path], "2": [path]})
    assert len(ann.watched) == 2
    states[0].complete, states[0].last_rx = True, 100.0
    ann.check()                                                    # no gate yet: kept for later
    assert ann.outbox and len(ann.watched) == 1
    gate = Gate(senders, path)
    assert gate.read() == []
    ann.check()
    assert not ann.outbox
    assert gate.read() == [] and gate.waits.left == {5: {2}, 6: {2}}   # a Unix datagram arrives at once
    states[1].complete, states[1].last_rx = True, 101.0
    ann.check()
    assert not ann and sorted((at, s.flow["flow_id"]) for at, s in gate.read()) == [(101.0, 6), (101.25, 5)]
    assert gate.waiting == set()
    gate.close()
    ann.close()


def test_scenario_replay_key(tmp_path):
    write(tmp_path, "id,src,dst,bytes\na,h0,h1,10\n")
    (tmp_path / "scen.yaml").write_text("traffic: {engine: roce, replay: s.csv}\n")
    s = scenario.load(tmp_path / "scen.yaml")
    assert s.traffic.replay == str(tmp_path / "s.csv") and not s.traffic.runs_collectives
    for extra, msg in [("jobs: [{pattern: incast, bytes: 1}]", "not both"),
                       ("flow_size: 1000", "each transfer's bytes"), ("engine: rxe", "built-in engines")]:
        (tmp_path / "bad.yaml").write_text(f"traffic: {{replay: s.csv, {extra}}}\n")
        with pytest.raises(scenario.ScenarioError, match=msg):
            scenario.load(tmp_path / "bad.yaml")
    write(tmp_path, "id,src,dst,bytes\na,h0,h77,10\n", "far.csv")
    (tmp_path / "far.yaml").write_text("traffic: {replay: far.csv}\n")
    with pytest.raises(scenario.ScenarioError, match=r"traffic\.replay: .*far\.csv: transfer 'a': no host 'h77'"):
        scenario.load(tmp_path / "far.yaml")


def test_shipped_schedule_is_the_export_of_the_shipped_ring():
    """scenarios/schedules/allreduce-ring.csv = `testbed schedule scenarios/allreduce-ring.yaml` (no drift)."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2] / "scenarios"
    ring = scenario.load(root / "allreduce-ring.yaml")
    exported = replay.from_collectives(ring.traffic, topology.build(ring.topology), ring.seed)
    assert replay.read(root / "schedules" / "allreduce-ring.csv") == exported
    rep = scenario.load(root / "replay-allreduce.yaml")
    assert rep.topology == ring.topology and rep.switch == ring.switch and rep.traffic.engine == ring.traffic.engine


def test_schedule_command_writes_the_export_or_refuses_in_one_line(tmp_path):
    from conftest import ROOT, run_cli
    out = tmp_path / "ring.json"
    (tmp_path / "ring.yaml").write_text("traffic: {engine: roce, jobs: [{pattern: allreduce, bytes: 8000}]}\n")
    r = run_cli("schedule", str(tmp_path / "ring.yaml"), "--out", str(out))
    assert r.returncode == 0 and "24 transfers in 1 operation" in r.stdout, r.stderr     # 4 hosts: 6 steps
    assert {t.bytes for t in replay.read(out)} == {2000}
    r = run_cli("schedule", str(ROOT / "scenarios" / "default.yaml"), "--out", str(tmp_path / "x.csv"))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "no collective jobs" in r.stderr
    assert not (tmp_path / "x.csv").exists()
    r = run_cli("schedule", str(ROOT / "scenarios" / "codesign-degraded.yaml"), "--out", str(tmp_path / "y.csv"),
                "--set", "traffic.collective.adapt.policy=ring-order")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "lays out 3 ring orders" in r.stderr
    assert not (tmp_path / "y.csv").exists()


def test_poisson_background_beside_collective_jobs():
    """jobs + pattern: poisson: the jobs' exported schedule and the open-loop flows in one run; background flows
    are numbered after the schedule's, never share a source port with a schedule flow of their host, and have
    no collectives.csv row; the jobs' rows keep job, iteration and op."""
    s = make_scenario(topology={"leaves": 2, "hosts_per_leaf": 2},
                      traffic={"engine": "roce", "pattern": "poisson", "load": 0.3, "size_dist": "websearch",
                               "sport": "sequential", "jobs": [{"name": "ar", "pattern": "allreduce",
                                                                "bytes": 4000, "iterations": 2}]})
    assert s.traffic.scheduled and s.traffic.runs_collectives
    topo = topology.build(s.topology)
    origins: dict = {}
    ts = replay.from_collectives(s.traffic, topo, s.seed, origins)
    assert origins[ts[0].id] == replay.Origin("ar", 0, "allreduce", 0)
    assert origins[ts[-1].id] == replay.Origin("ar", 1, "allreduce", 5) and len(origins) == len(ts) == 48
    flows, owner = replay.to_flows(ts, TransferFlows(s.traffic, topo, s.seed))
    n = len(flows)
    flows[0].sport = s.traffic.sport_base             # the first background flow's port (sequential) is taken
    replay.with_background(flows, owner, s.traffic, topo, s.seed, 4.0)
    bg = flows[n:]
    assert bg and [f.flow_id for f in flows] == list(range(len(flows))) and owner[n:] == [None] * len(bg)
    used = [(f.src, f.sport) for f in flows]
    assert len(set(used)) == len(used)
    res = [SimpleNamespace(size_bytes=f.size_bytes, complete=True, start_s=1.0, end_s=2.0) for f in flows]
    rows = replay.op_rows(owner, res, origins)
    assert [(r["job"], r["iteration"], r["op"], r["transfers"]) for r in rows] == [("ar", 0, "allreduce", 24),
                                                                                   ("ar", 1, "allreduce", 24)]
