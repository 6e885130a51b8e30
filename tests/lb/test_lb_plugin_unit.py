"""Load-balancing plugins (switch.load_balancing: plugin) on crafted scapy packets with BPF_PROG_TEST_RUN:
examples/plugins/two_choices.h compiled into the switch program, its choice following the queue model written
into `vq` and the load in `port_load`, its parameters read from `plugin_params`; and a plugin that does not
compile failing in one line that names its own file and line.

Two-choices' two candidates of a flow are mirrored here (hashing.pkt_hash with the switch's seed, and with the
seed ^ fmix32(salt)), so each test knows which two uplinks a flow may take."""
import os
import time
from collections import Counter

import pytest

from conftest import ROOT, inside_port_namespace

from testbed import scenario, topology
from testbed.datapath import Datapath, DatapathError, hashing, testrun
from testbed.datapath.testrun import TC_ACT_REDIRECT
from testbed.lb.plugin import for_datapath

scapy_all = pytest.importorskip("scapy.all")
Ether, IP, UDP, Raw = scapy_all.Ether, scapy_all.IP, scapy_all.UDP, scapy_all.Raw

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF, namespaces)")

TWO_CHOICES = ROOT / "examples" / "plugins" / "two_choices.h"
DEFAULT_SALT = 0x2C1B3C6D


def plugin_scenario(params=None, source=TWO_CHOICES, flowlet_timeout="200ms"):
    return scenario.from_dict({
        "topology": {"spines": 4, "leaves": 2, "hosts_per_leaf": 1,
                     "fabric_link": {"rate": "100mbit", "buffer": "4MB"}},
        "switch": {"load_balancing": "plugin", "flowlet_timeout": flowlet_timeout,
                   "adaptive": {"load_window": "1s"},          # the load tie-break's memory: far above test delays
                   "plugin": {"source": str(source), "params": params or {}}}})


@pytest.fixture(scope="module")
def scen():
    return plugin_scenario({"per_flowlet": 0, "salt": 99})


@pytest.fixture(scope="module")
def topo(scen):
    return topology.build(scen.topology)


@pytest.fixture(scope="module")
def dp(topo, scen):
    with inside_port_namespace([p for sw in topo.switches for p in topo.ports[sw]], "lbp"):
        try:
            d = Datapath(topo, scen.switch, plugin=for_datapath(scen.switch)).load()
        except DatapathError as e:
            pytest.skip(str(e))
        try:
            yield d
        finally:
            d.close()


def ups(topo):
    return topo.uplinks("leaf0")


def params(dp, **values):
    """Write plugin parameters by name (the indexes the loader defined: the scenario's order)."""
    names = list(dp.switch_spec.plugin.params)
    t = dp.bpf[b"plugin_params"]
    for k, v in values.items():
        t[t.Key(names.index(k))] = t.Leaf(v)


def candidates(dp, topo, sport, salt):
    """The two uplinks (indexes) two_choices.h hashes flow h0 → h1 from ``sport`` to."""
    seed = dp.switch_seed("leaf0")
    fields = hashing.hash_mask(dp.switch_spec.hash_fields)
    key = (topo.address("h0"), topo.address("h1"), sport, 5001, 17)
    c1 = hashing.pick(hashing.pkt_hash(seed, fields, *key), 4)
    c2 = hashing.pick(hashing.pkt_hash(seed ^ hashing.fmix32(salt), fields, *key), 3)
    return c1, c2 + (c2 >= c1)


def set_queues(dp, topo, levels):
    """Give each uplink's queue (priority 0) a backlog of ``levels`` × 50 ms now (far apart: the milliseconds a
    loaded machine takes between writing the state and running the packet must not reorder them); no recent
    load."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    vq, pl = dp.bpf[b"vq"], dp.bpf[b"port_load"]
    for p, m in zip(ups(topo), levels):
        k = vq.Key(p.ifindex * 8)
        q = vq[k]
        q.finish, q.enq, q.cap = now + m * 50_000_000, 0, 0
        vq[k] = q
        v = pl[pl.Key(p.ifindex)]
        v.bytes, v.last_ns = 0, 0
        pl[pl.Key(p.ifindex)] = v


def send(dp, topo, sport):
    """One packet h0 → h1 from UDP source port ``sport``; the uplink (index) it left through."""
    inp = topo.port(topo.port_named("h0", "eth0").peer_ifindex)
    f = Ether(src=inp.peer_mac, dst=inp.mac) / IP(src=topo.address("h0"), dst=topo.address("h1")) \
        / UDP(sport=sport, dport=5001) / Raw(b"x" * 32)
    r = testrun.run(dp.ingress_fd, bytes(f), ifindex=inp.ifindex)
    assert r.verdict == TC_ACT_REDIRECT
    src = Ether(r.data[:14]).src.lower()
    return next(i for i, p in enumerate(ups(topo)) if p.mac == src)


def test_a_new_flow_takes_the_candidate_with_the_shorter_queue(dp, topo):
    """200 flows, uplink queues of 50–200 ms in a rotating order: each flow's first packet leaves through the one of
    its two candidates whose queue is shorter — whichever of the two that is."""
    params(dp, per_flowlet=0, salt=99)
    dp.clear_flows()
    for i in range(200):
        sport = 10_000 + i
        c1, c2 = candidates(dp, topo, sport, 99)
        ms = [1 + (j + i) % 4 for j in range(4)]
        set_queues(dp, topo, ms)
        assert send(dp, topo, sport) == (c1 if ms[c1] < ms[c2] else c2), (sport, c1, c2, ms)


def metric(scen, m):
    """The scenario's switch spec with switch.adaptive.metric ``m`` (what two_choices.h compares)."""
    return scen.switch.model_copy(update={"adaptive": scen.switch.adaptive.model_copy(update={"metric": m})})


def test_by_load_the_less_busy_candidate_wins_and_forwarding_charges_it(dp, topo, scen):
    """switch.adaptive.metric load: the candidate that sent less over the load window wins whatever the queues
    say; and the switch charges the load of a plugin's ports only with a load metric (count_load)."""
    dp.set_mode(metric(scen, "load"))
    try:
        params(dp, per_flowlet=0, salt=99)
        dp.clear_flows()
        pl = dp.bpf[b"port_load"]
        for i in range(50):
            sport = 20_000 + i
            c1, c2 = candidates(dp, topo, sport, 99)
            busy = c1 if i % 2 else c2
            ms = [4, 4, 4, 4]
            ms[busy] = 1                               # the busy one has the shorter queue: load decides
            set_queues(dp, topo, ms)
            v = pl[pl.Key(ups(topo)[busy].ifindex)]
            v.bytes, v.last_ns = 1_000_000, time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            pl[pl.Key(ups(topo)[busy].ifindex)] = v
            assert send(dp, topo, sport) == (c2 if busy == c1 else c1)
        set_queues(dp, topo, [0, 0, 0, 0])
        out = send(dp, topo, 20_100)
        assert pl[pl.Key(ups(topo)[out].ifindex)].bytes > 0
    finally:
        dp.set_mode(scen.switch)
    set_queues(dp, topo, [0, 0, 0, 0])
    out = send(dp, topo, 20_101)
    assert pl[pl.Key(ups(topo)[out].ifindex)].bytes == 0     # metric queue: nothing charged


def test_equal_queues_split_at_random_over_the_two_candidates(dp, topo):
    """Both candidates' queues empty: 300 flows split over their two candidates at random (binomial 150 ± 9:
    100–200 holds at 5σ) and never leave them."""
    params(dp, per_flowlet=0, salt=99)
    dp.clear_flows()
    got = Counter()
    for i in range(300):
        sport = 30_000 + i
        c1, c2 = candidates(dp, topo, sport, 99)
        set_queues(dp, topo, [0, 0, 0, 0])
        u = send(dp, topo, sport)
        assert u in (c1, c2)
        got[u == c1] += 1
    assert 100 <= got[True] <= 200, got


def _kept_while_the_queues_reverse(dp, topo, sport: int, packets: int):
    """A new flow's first packet takes the shorter of its two candidates' queues (c2); then, with the queues
    reversed, ``packets`` more stay on it. Returns (c1, c2, the reversed queue depths)."""
    dp.clear_flows()
    c1, c2 = candidates(dp, topo, sport, 99)
    ms = [4, 4, 4, 4]
    ms[c1], ms[c2] = 3, 1
    set_queues(dp, topo, ms)
    assert send(dp, topo, sport) == c2
    ms[c1], ms[c2] = 1, 3
    for _ in range(packets):
        set_queues(dp, topo, ms)
        assert send(dp, topo, sport) == c2
    return c1, c2, ms


def test_per_flow_the_choice_is_kept_whatever_the_queues_do(dp, topo):
    """per_flowlet 0: a flow's first packet picks the shorter queue; 20 more packets (with the queues reversed,
    and after an idle gap longer than the flowlet timeout) stay on it."""
    params(dp, per_flowlet=0, salt=99)
    sport = 40_000
    c1, c2, ms = _kept_while_the_queues_reverse(dp, topo, sport, 20)
    time.sleep(0.25)
    set_queues(dp, topo, ms)
    assert send(dp, topo, sport) == c2
    (fp,) = dp.flow_paths()
    assert fp.packets == {ups(topo)[c2].ifindex: 22} and fp.flowlets == 1


def test_the_per_flowlet_parameter_rechooses_after_an_idle_gap(dp, topo):
    """per_flowlet 1 (written into plugin_params while loaded): within a flowlet the port is kept; after a gap
    above the 200 ms flowlet timeout the flow takes the now shorter queue."""
    params(dp, per_flowlet=1, salt=99)
    try:
        sport = 41_000
        c1, c2, ms = _kept_while_the_queues_reverse(dp, topo, sport, 5)
        time.sleep(0.25)
        set_queues(dp, topo, ms)
        assert send(dp, topo, sport) == c1
        (fp,) = dp.flow_paths()
        assert fp.flowlets == 2
    finally:
        params(dp, per_flowlet=0)


def test_the_salt_parameter_moves_the_second_candidate(dp, topo):
    """The second hash's salt is a parameter: with salt 7 instead of 99 the flows whose second candidate differs
    follow the new one (the first candidate given the longer queue, so the second is always taken)."""
    moved = 0
    for salt in (99, 7):
        params(dp, salt=salt)
        dp.clear_flows()
        for i in range(40):
            sport = 50_000 + i
            c1, c2 = candidates(dp, topo, sport, salt)
            ms = [4, 4, 4, 4]
            ms[c1], ms[c2] = 3, 1
            set_queues(dp, topo, ms)
            assert send(dp, topo, sport) == c2
            moved += salt == 7 and c2 != candidates(dp, topo, sport, 99)[1]
    params(dp, salt=99)
    assert moved >= 10


def test_a_lost_link_is_never_kept(dp, topo):
    """A flow's port loses its link: its next packet takes its other candidate (the plugin sees port_down)."""
    params(dp, per_flowlet=0, salt=99)
    dp.clear_flows()
    sport = 60_000
    c1, c2 = candidates(dp, topo, sport, 99)
    ms = [4, 4, 4, 4]
    ms[c1], ms[c2] = 1, 3
    set_queues(dp, topo, ms)
    assert send(dp, topo, sport) == c1
    dp.set_port_down(ups(topo)[c1].ifindex, True)
    try:
        assert send(dp, topo, sport) == c2
    finally:
        dp.set_port_down(ups(topo)[c1].ifindex, False)


def test_defaults_apply_without_params(topo):
    """Without switch.plugin.params the header's defaults hold (per flow, its own salt): it compiles and a
    flow's first packet takes the shorter of the candidates the default salt gives."""
    s = plugin_scenario()
    with inside_port_namespace([p for sw in topo.switches for p in topo.ports[sw]], "lbq"):
        with Datapath(topo, s.switch, plugin=for_datapath(s.switch)) as d:
            for i in range(20):
                c1, c2 = candidates(d, topo, 61_000 + i, DEFAULT_SALT)
                ms = [4, 4, 4, 4]
                ms[c1], ms[c2] = 3, 1
                set_queues(d, topo, ms)
                assert send(d, topo, 61_000 + i) == c2


@pytest.mark.parametrize("body, line, words", [
    ("\tint x = ;\n\treturn 0;\n", 4, "expected expression"),
    ("\treturn nosuch(a);\n", 4, "nosuch"),
])
def test_a_plugin_that_does_not_compile_is_one_line_naming_its_file_and_line(tmp_path, topo, body, line, words):
    """A broken header: DatapathError in one line, `switch.plugin.source: FILE:LINE: clang's message`, the file
    being the plugin's own (its #line markers); nothing is loaded."""
    h = tmp_path / "broken.h"
    h.write_text("/* a broken plugin */\nFTB_ALWAYS_INLINE __u64 ftb_plugin_choose(struct lb_args *a)\n{\n"
                 + body + "}\n")
    s = plugin_scenario(source=h)
    d = Datapath(topo, s.switch, plugin=for_datapath(s.switch))
    with pytest.raises(DatapathError) as e:
        d.load()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"switch.plugin.source: {h.resolve()}:{line}: ") and words in msg, msg
    assert d._bpf is None


def test_a_plugin_without_the_function_names_itself(tmp_path, topo):
    h = tmp_path / "empty.h"
    h.write_text("/* defines nothing */\n")
    s = plugin_scenario(source=h)
    with pytest.raises(DatapathError) as e:
        Datapath(topo, s.switch, plugin=for_datapath(s.switch)).load()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"switch.plugin.source {h.resolve()}: ") and "ftb_plugin_choose" in msg


def test_plugin_mode_needs_a_plugin_compiled_in(dp, topo):
    d = Datapath(topo, scenario.from_dict({}).switch)
    assert d.plugin is None
    with pytest.raises(DatapathError, match="built without one"):
        dp.set_mode(dp.switch_spec)      # fine: this one has a plugin
        d._bpf = dp._bpf                  # a loaded program without a plugin
        d.set_mode(dp.switch_spec)


def test_cost_of_two_choices(dp, topo, scen, capsys):
    """Per-packet cost of the two-choices plugin against ECMP on the same packets, same run (queue models emptied
    before each batch: testbed.bench.next_hop.mode_costs). Within a kept choice (flowlet timeout 1 s) it is a
    flow-state check like flowlet switching's; a new choice on every packet (timeout 0) adds the second hash and
    two queue reads — no tail call, it runs in the entry program."""
    from testbed.bench.next_hop import mode_costs
    params(dp, per_flowlet=1, salt=99)
    try:
        c = mode_costs(dp, topo, {
            "ecmp": scen.switch.model_copy(update={"load_balancing": "ecmp"}),
            "kept": scen.switch.model_copy(update={"flowlet_timeout": 10**9}),
            "new": scen.switch.model_copy(update={"flowlet_timeout": 0})})
    finally:
        params(dp, per_flowlet=0)
        dp.set_mode(scen.switch)
    with capsys.disabled():
        print(f"\n[plugin cost] ns/pkt ECMP {c['ecmp'][0]:.0f}; two choices kept {c['kept'][0]:.0f} "
              f"({c['kept'][1]:.2f}×), a new choice every packet {c['new'][0]:.0f} ({c['new'][1]:.2f}×)")
    assert c["kept"][1] < 1.3 and c["new"][1] < 1.6, c
