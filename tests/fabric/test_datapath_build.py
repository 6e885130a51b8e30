"""Building the BCC header stub and compiling the switch program for topologies of every shape."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import scenario, topology
from testbed.datapath import Datapath, DatapathError, kheaders, source
from testbed.datapath.program import _first_error

root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF)")


def test_render_inlines_each_header_once():
    text = source.render(source.EBPF_DIR / "switch.c")
    assert '#include "' not in text
    assert text.count("#define FTB_COMMON_H") == 1
    assert "int ftb_switch_ingress(" in text


def test_first_error_prefers_verifier_complaint():
    log = "0: (b7) r1 = 0\nR0 unbounded memory access\nprocessed 35 insns (limit 1000000)\n"
    assert _first_error(log) == "verifier: R0 unbounded memory access"
    assert _first_error("x.c:3:1: error: unknown type name 'u99'\n1 error generated.\n").startswith("x.c:3:1")
    # a log with only warnings names nothing: the exception's own text is the error (BCC's "Unknown program …")
    assert _first_error("x.h:1:2: warning: discards qualifiers\n1 warning generated.\n") == ""


def test_stub_built_atomically_by_concurrent_runs(tmp_path):
    """Several processes building the stub at once all succeed and leave one complete tree, no leftovers."""
    code = ("import os; os.environ.pop('BCC_KERNEL_SOURCE', None);"
            "from testbed.datapath import kheaders as k; k._real_tree = lambda: None; print(k.ensure())")
    env = dict(os.environ, FTB_CACHE_DIR=str(tmp_path))
    env.pop("BCC_KERNEL_SOURCE", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2]) for _ in range(6)]
    outs = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outs) == 1
    tree = Path(outs.pop())
    assert [p.name for p in tmp_path.iterdir()] == [tree.name]
    assert (tree / "include/linux/kconfig.h").is_file()
    assert (tree / "include/uapi/linux/pkt_cls.h").is_file()


def test_missing_uapi_headers_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    monkeypatch.setattr(kheaders, "_real_tree", lambda: None)
    monkeypatch.setattr(kheaders, "CACHE_ROOT", tmp_path)
    monkeypatch.setattr(kheaders, "UAPI", tmp_path / "nonexistent")
    with pytest.raises(DatapathError) as e:
        kheaders.ensure()
    assert "linux-libc-dev" in str(e.value) and "\n" not in str(e.value)


@root
def test_compile_probe():
    ok, detail = kheaders.compile_probe()
    assert ok, detail


@root
@pytest.mark.parametrize("topo", [
    {},
    {"spines": 64, "leaves": 4, "hosts_per_leaf": 2, "rails": 2},     # groups of 64 next hops
    {"spines": 8, "leaves": 32, "hosts_per_leaf": 32},                # 1,024 hosts
    {"kind": "fat-tree", "k": 16},                                    # 1,024 hosts, 320 switches, 3 tiers
])
def test_loads_for_every_shape(topo):
    scen = scenario.from_dict({"topology": topo})
    t = topology.build(scen.topology)
    with Datapath(t, scen.switch) as dp:
        assert dp.ingress_fd > 0
        assert dp.compile_seconds < 10
        assert dp.max_nh >= max(len(e.ports) for e in t.fib)
        counters = dp.port_counters()
        assert set(counters) == {p.ifindex for sw in t.switches for p in t.ports[sw]}
        assert all(c.rx_packets == 0 for c in counters.values())
        for mode in ("flowlet", "spray"):
            dp.set_mode(scenario.SwitchSpec(load_balancing=mode))
        assert dp.flow_paths() == []
