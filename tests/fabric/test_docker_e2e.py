"""Docker containers as hosts (hosts.docker): real containers whose network namespaces the fabric builds into.

The daemon is started when it is not running (as `testbed` does on first use); the tests are skipped, saying why,
only where Docker cannot run. The host image is built once per session (`testbed image build --force`, timed),
and a second, Python-less "user" image is made from a few Debian packages to show that any image can be a host.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import tempfile
import time

import pytest

from testbed.fabric import netns

from conftest import ROOT, TESTBED, make_scenario, processes_named, run_cli, wait_for

pytestmark = pytest.mark.e2e

NOPYTHON = "ftb-test/nopython:latest"        # a user's image without Python: dash, coreutils, ping
SMALL_TOPO = {"spines": 2, "leaves": 2, "hosts_per_leaf": 2}


@pytest.fixture(scope="session")
def docker():
    """A Docker client of a running daemon (started if need be) with fabric-testbed/host built in this session
    and the Python-less test image; skips the module where Docker cannot run, with the reason."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Docker, namespaces)")
    from testbed.container import image
    from testbed.container.daemon import DockerError, client
    try:
        c = client(log=print)
    except DockerError as e:
        pytest.skip(f"Docker cannot run here: {e}")
    # a daemon started here is a service, not our child (tests elsewhere check that nothing of ours is left)
    assert not [p for p in processes_named("dockerd") if _ppid(p) == os.getpid()]
    t = time.monotonic()
    res = run_cli("image", "build", "--force", timeout=300)
    assert res.returncode == 0, res.stderr
    print(f"\nimage build: {time.monotonic() - t:.1f} s wall ({res.stdout.strip()})")
    again = run_cli("image", "build", timeout=120)                      # cached: nothing to do
    assert again.returncode == 0 and "is current" in again.stdout, again.stdout + again.stderr
    with tempfile.NamedTemporaryFile(suffix=".tar", dir="/var/tmp") as tar:
        image.write_rootfs(tar, image.closure(("dash", "coreutils", "iputils-ping")), py_packages=())
        tar.flush()
        repo, tag = NOPYTHON.split(":")
        c.api.import_image_from_file(tar.name, repository=repo, tag=tag)
    yield c
    c.images.remove(NOPYTHON, force=True)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _containers(c, lab: str) -> list:
    return c.containers.list(all=True, filters={"label": f"fabric-testbed={lab}"})


def _agents_of(lab: str) -> dict[int, str]:
    """pid → host of the traffic agents of ``lab`` (their process names are the hosts' namespace names)."""
    return {pid: comm.rsplit("-", 1)[1] for pid, comm in processes_named(f"{netns.PREFIX}{lab}-h").items()}


def _ns(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def test_every_host_pair_pings_across_container_hosts(docker, lab):
    scen = make_scenario(topology=SMALL_TOPO, hosts={"docker": {"per_host": {"h3": NOPYTHON}}})
    lb = lab(scen)
    ctrs = lb.containers.containers
    assert sorted(ctrs) == lb.topo.hosts
    for h, ctr in ctrs.items():
        info = docker.containers.get(ctr.name).attrs
        assert ctr.name == f"ftb-{lb.name}-{h}"
        assert info["HostConfig"]["NetworkMode"] == "none"
        assert info["Config"]["Labels"]["fabric-testbed"] == lb.name
        assert info["Config"]["Image"] == (NOPYTHON if h == "h3" else "fabric-testbed/host")
        # the host's namespace is the container's: its NIC was moved into the container
        assert os.stat(netns.path(lb.fabric.ns[h])).st_ino == os.stat(ctr.netns_file).st_ino
        assert ctr.python == (h != "h3")
    failed = []
    for src, ctr in ctrs.items():
        for dst in lb.topo.hosts:
            if dst != src:
                r = ctr.run(["ping", "-c1", "-W2", lb.topo.address(dst)])
                if r.returncode != 0:
                    failed.append(f"{src}→{dst}: {r.stdout.strip().splitlines()[-1:]}")
    assert not failed, failed
    lb.close(force=True)
    assert _containers(docker, lb.name) == []
    assert netns.list_names(f"{netns.PREFIX}{lb.name}-") == []


def _flows(path) -> tuple[list[str], list[dict]]:
    with open(path / "flows.csv") as f:
        rows = list(csv.DictReader(f))
    with open(path / "flows.csv") as f:
        header = next(csv.reader(f))
    return header, rows


def test_permutation_in_containers_gives_the_same_flows(docker, tmp_path):
    sets = ["--set", "duration=1.5s", "--set", "topology.spines=2", "--set", "topology.hosts_per_leaf=2"]
    plain = run_cli("run", "scenarios/default.yaml", "--out", str(tmp_path / "ns"), *sets)
    assert plain.returncode == 0, plain.stderr
    proc = subprocess.Popen(TESTBED + ["run", "scenarios/default.yaml", "--out", str(tmp_path / "docker"), *sets,
                                       "--set", f"hosts.docker.per_host.h3={NOPYTHON}", "--set", "capture=[h0]"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        from testbed.lab import all_labs
        labs = []
        assert wait_for(lambda: labs.extend(st for st in all_labs() if st.get("pid") == proc.pid) or labs, 60)
        lab = labs[0]["name"]
        agents = {}
        assert wait_for(lambda: agents.update(_agents_of(lab)) or len(set(agents.values())) == 4, 60, 0.02)
        state = next(st for st in all_labs() if st["name"] == lab)
        where = {}
        for pid, host in agents.items():
            ctr_pid = state["containers"][host]["pid"]
            try:
                inside = _ns(pid, "mnt") == _ns(ctr_pid, "mnt") and _ns(pid, "pid") == _ns(ctr_pid, "pid")
                where[host] = (inside, _ns(pid, "net") == _ns(ctr_pid, "net"))
            except FileNotFoundError:        # nsenter's parent half, or an agent that just ended
                continue
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    # agents run inside their containers (files, processes, network); h3's image has no Python: its network only
    assert where == {"h0": (True, True), "h1": (True, True), "h2": (True, True), "h3": (False, True)}, where
    header_ns, rows_ns = _flows(tmp_path / "ns")
    header, rows = _flows(tmp_path / "docker")
    assert header == header_ns
    key = ("src", "dst", "sport", "dport", "proto")
    assert [tuple(r[k] for k in key) for r in rows] == [tuple(r[k] for k in key) for r in rows_ns]
    assert all(int(r["bytes"]) > 0 for r in rows), [(r["src"], r["bytes"]) for r in rows]
    manifest = json.loads((tmp_path / "docker" / "manifest.json").read_text())
    assert {h: d["agent"] for h, d in manifest["docker"]["hosts"].items()} == {
        "h0": "container", "h1": "container", "h2": "container", "h3": "network namespace"}
    assert "containers" in manifest["build_timings_s"]
    pcap = tmp_path / "docker" / "pcap" / "h0-eth0.pcap"             # tcpdump in h0's (the container's) namespace
    assert pcap.stat().st_size > 10_000, pcap.stat().st_size
    assert "agents run in the container's network namespace" in err
    assert _containers(docker, lab) == []


def test_exec_in_a_container_reaches_another_container(docker, tmp_path):
    scen = tmp_path / "dk.yaml"
    scen.write_text("topology: {spines: 1, leaves: 2, hosts_per_leaf: 1}\nhosts: {docker: {}}\n")
    server = None
    try:
        res = run_cli("up", str(scen), "--name", "tdock1")
        assert res.returncode == 0, res.stderr
        st = run_cli("status", "tdock1")
        assert "ftb-tdock1-h0" in st.stdout and "fabric-testbed/host" in st.stdout, st.stdout
        assert run_cli("exec", "--lab", "tdock1", "h0", "--", "uname", "-n").stdout.strip() == "h0"
        init = run_cli("exec", "--lab", "tdock1", "h0", "--", "cat", "/proc/1/cmdline").stdout
        assert "docker-init" in init and "sleep" in init           # the container's own processes
        ping = run_cli("exec", "--lab", "tdock1", "h0", "--", "ping", "-c1", "-W2", "198.18.1.1")
        assert ping.returncode == 0, ping.stdout + ping.stderr
        # a user's program in h1's container, reached from a program in h0's
        server = subprocess.Popen(TESTBED + ["exec", "--lab", "tdock1", "h1", "--", "python3", "-c",
                                             "import socket; s = socket.create_server(('198.18.1.1', 7000)); "
                                             "print('listening', flush=True); c, a = s.accept(); "
                                             "print(c.recv(100).decode(), a[0], flush=True)"],
                                  cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "listening"
        client = run_cli("exec", "--lab", "tdock1", "h0", "--", "python3", "-c",
                         "import socket; socket.create_connection(('198.18.1.1', 7000)).sendall(b'hello from h0')")
        assert client.returncode == 0, client.stderr
        out, _ = server.communicate(timeout=10)
        assert out.strip() == "hello from h0 198.18.0.1"
        assert run_cli("exec", "--lab", "tdock1", "h0", "--", "no-such-program").returncode != 0
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.communicate()
        res = run_cli("down", "tdock1")
    assert res.returncode == 0, res.stderr
    assert _containers(docker, "tdock1") == [] and netns.list_names("ftb-tdock1-") == []


def _start_run(tmp_path, name):
    """A 30 s `testbed run` with container hosts, once its agents run: (process, lab name)."""
    from testbed.lab import all_labs
    proc = subprocess.Popen(TESTBED + ["run", "scenarios/default.yaml", "--out", str(tmp_path / name), "--set",
                                       "duration=30s", "--set", "hosts.docker.image=fabric-testbed/host"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    labs = []
    assert wait_for(lambda: labs.extend(st["name"] for st in all_labs() if st.get("pid") == proc.pid) or labs, 60)
    assert wait_for(lambda: len(set(_agents_of(labs[0]).values())) == 8, 60)
    return proc, labs[0]


def test_an_interrupted_run_leaves_no_container(docker, tmp_path):
    """Ctrl-C mid-run: the run removes its containers, namespaces and agents itself (kill -9 of the run, and of a
    container host, then `testbed clean`: tests/run/test_helper_death_e2e.py)."""
    proc, lab = _start_run(tmp_path, "interrupted")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err and "error: " in err, err
    assert _containers(docker, lab) == [] and netns.list_names(f"{netns.PREFIX}{lab}-") == []
    assert _agents_of(lab) == {}


def test_docker_that_cannot_run_is_one_line_before_anything_is_built(docker, tmp_path):
    from testbed.lab import all_labs
    env = dict(os.environ, PYTHONPATH=str(ROOT), DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock",
               FTB_DOCKER_NO_SETUP="1")
    before = (netns.list_names(), [st["name"] for st in all_labs()])
    res = subprocess.run(TESTBED + ["run", "scenarios/default.yaml", "--out", str(tmp_path / "r"),
                                    "--set", "hosts.docker.image=fabric-testbed/host"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: the Docker daemon is not reachable"), lines[0]
    assert (netns.list_names(), [st["name"] for st in all_labs()]) == before
    assert not (tmp_path / "r").exists()
    doc = json.loads(subprocess.run(TESTBED + ["doctor", "--json"], cwd=ROOT, env=env, capture_output=True,
                                    text=True, timeout=120).stdout)["capabilities"]
    assert doc["docker-sdk"]["ok"] and not doc["docker"]["ok"], doc["docker"]
    here = json.loads(run_cli("doctor", "--json").stdout)["capabilities"]
    assert here["docker"]["ok"] and "storage" in here["docker"]["detail"], here["docker"]


def test_bench_docker_measures_both_and_leaves_nothing(docker):
    from testbed.bench.docker import print_docker
    lines = []
    res = print_docker([8], rounds=1, out=lines.append)
    ns_up, dk_up = res[8]["ns"][0], res[8]["docker"][0]
    assert 0 < ns_up < dk_up and res[8]["containers"] > 0 and res["image"] > 0, res
    assert any(ln.startswith("8 hosts") for ln in lines) and any("host image build" in ln for ln in lines), lines
    assert netns.list_names("ftb-bench") == []
    assert docker.containers.list(all=True, filters={"label": "fabric-testbed"}) == []
    assert [t for i in docker.images.list("fabric-testbed/host") for t in i.tags] == ["fabric-testbed/host:latest"]
