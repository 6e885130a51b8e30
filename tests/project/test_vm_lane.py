"""Normal-suite tests of the VM lane's pieces that need no VM: the link ``delay`` key (and its refusal where netem
is missing), netem sizing, the image key, the guest run script, perftest parsing, clear errors of `testbed vm`.
The VM smoke test boots the image from the host: scripts/vm-lane.sh runs it with FTB_VM_SMOKE=1."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from testbed import scenario, vm
from testbed.fabric import netns
from testbed.fabric.port import netem_limit
from testbed.workloads.rxe.perftest import parse_perftest

from conftest import ROOT, _distribution_kernel, make_scenario, run_cli


def test_delay_key_parses_and_defaults():
    s = make_scenario(topology={"host_link": {"delay": "50us"}, "fabric_link": {"delay": "2ms"}})
    assert s.topology.host_link.delay == 50_000 and s.topology.fabric_link.delay == 2_000_000
    assert make_scenario().topology.host_link.delay == 0


@pytest.mark.parametrize("value,msg", [("500ns", "whole microseconds"), ("-1us", "time"), ("2s", "≤")])
def test_delay_key_refuses_bad_values(value, msg):
    with pytest.raises(scenario.ScenarioError) as e:
        make_scenario(topology={"fabric_link": {"delay": value}})
    assert str(e.value).startswith("topology.fabric_link.delay") and msg in str(e.value)


def test_delay_reaches_ports():
    from testbed import topology
    topo = topology.build(make_scenario(topology={"fabric_link": {"delay": "50us"}}).topology)
    for node, ports in topo.ports.items():
        for p in ports:
            assert p.delay_ns == (50_000 if p.role in ("up", "spine") else 0), (node, p.ifname)


def test_netem_limit_covers_buffer_and_in_flight():
    # 256 KB of 1514-byte frames = 174 (ceil), + 100 Mbit/s × 50 µs in 64-byte frames = 10, + 1
    assert netem_limit(100_000_000, 262144, 50_000, 1500) == 174 + 10 + 1
    assert netem_limit(100_000_000, 262144, 1_000, 1500) == 174 + 1 + 1


@pytest.mark.e2e
def test_delay_refused_without_netem(lab):
    if _distribution_kernel():
        pytest.skip("this kernel has loadable modules (netem may exist): the refusal is tested on the CI kernel")
    from testbed.doctor import MissingFeature
    scen = make_scenario(topology={"spines": 1, "leaves": 1, "hosts_per_leaf": 2, "host_link": {"delay": "50us"}})
    before = set(netns.list_names())
    with pytest.raises(MissingFeature) as e:
        lab(scen)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("topology.host_link.delay: link delay needs the netem qdisc")
    assert "`testbed doctor`: netem" in msg and "testbed vm run" in msg
    assert set(netns.list_names()) == before, "namespaces left behind after the refusal"


@pytest.mark.e2e
def test_delay_refused_by_cli_in_one_line(tmp_path):
    if _distribution_kernel():
        pytest.skip("this kernel has loadable modules (netem may exist)")
    r = run_cli("run", "scenarios/default.yaml", "--out", str(tmp_path / "out"),
                "--set", "topology.fabric_link.delay=50us", "--set", "duration=1s")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "topology.fabric_link.delay" in lines[0] and "netem" in lines[0], r.stderr


# ---------------------------------------------------------------- vm.py pieces that need no VM

def _fake_root(tmp_path, provision="echo v1\n"):
    for rel, text in (("vagrant/provision.sh", provision), ("scripts/setup.sh", "echo setup\n"),
                      ("pyproject.toml", "[project]\n")):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_image_key_follows_provisioning(tmp_path, monkeypatch):
    monkeypatch.setattr(vm, "ROOT", _fake_root(tmp_path / "a"))
    k1 = vm.image_key()
    assert k1 == vm.image_key() and len(k1) == 16
    monkeypatch.setattr(vm, "ROOT", _fake_root(tmp_path / "b", provision="echo v2\n"))
    assert vm.image_key() != k1


def test_run_script_quotes_command_and_reports_exit():
    s = vm._run_script(["sh", "-c", "echo 'a b'; exit 3"], "/work/x y", {"FOO": "1 2"})
    assert "sh -c 'echo '\"'\"'a b'\"'\"'; exit 3'" in s
    assert "cd '/work/x y'" in s and "export FOO='1 2'" in s
    assert "echo $rc > /ftbctl/exit" in s and vm.EXIT in s and vm.START in s


def test_vm_run_without_image_is_one_clear_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), FTB_VM_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "vm", "run", "--", "true"], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("error: no VM image for the current provisioning") and "testbed vm build" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.environ.get("FTB_VM_SMOKE") != "1",
                    reason="boots the VM: scripts/vm-lane.sh runs it on the host with FTB_VM_SMOKE=1")
def test_vm_run_exit_code_and_output_smoke():
    """Boots the cached image (~10-30 s under TCG) from the host: CMD's output and exit code come back. It cannot
    run inside the guest, so the lane runs it after the guest's tests."""
    assert shutil.which("qemu-system-x86_64"), "qemu-system-x86_64 missing (bash scripts/vm-setup.sh)"
    assert vm.cached_image(), f"no VM image for key {vm.image_key()} (testbed vm build)"
    out = []
    res = vm.run(["sh", "-c", "echo hello-from-$(uname -r); exit 7"], stream=out.append, timeout=300)
    assert res.returncode == 7
    assert any(x.startswith("hello-from-6.") for x in out), out


def test_parse_perftest():
    """The parser the full-kernel tests use (the same as the rxe engine's): Gb/sec → Mbit/s."""
    text = """
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      200              0.41               0.39               0.000748
---------------------------------------------------------------------------------------
"""
    r = parse_perftest(text)
    assert r == pytest.approx({"msg_bytes": 65536, "iterations": 200, "bw_peak_mbps": 410.0, "bw_avg_mbps": 390.0,
                               "msg_rate_mpps": 0.000748, "unit": "Gb/sec"})
    assert parse_perftest("Failed status 2") is None
