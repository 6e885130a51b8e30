"""Shared fixtures: real labs (namespaces + eBPF) that are always torn down, and helpers that send packets."""
from __future__ import annotations

import contextlib
import csv
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cpu_guard
from testbed import scenario, topology
from testbed.fabric import netns

ROOT = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]

# The suite's runs draw no plots and write no HTML report (--no-plots; report/plots.py): about 0.2 s a PNG, six
# a run, over a few hundred runs. Tests of the plots and the report are marked `plots` and draw them.
from testbed.report.plots import PLOTS_ENV   # noqa: E402
os.environ.setdefault(PLOTS_ENV, "0")


@pytest.fixture(autouse=True)
def _plots_when_marked(request, monkeypatch):
    if request.node.get_closest_marker("plots") is not None:
        monkeypatch.setenv(PLOTS_ENV, "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "plots: draws its runs' plots and reports (the suite's other runs do not: "
                                       "FTB_PLOTS=0)")


def pytest_sessionstart(session):
    if cpu_guard.Hog.wanted():
        cpu_guard.HOG.start()


def pytest_sessionfinish(session, exitstatus):
    if (line := cpu_guard.HOG.stop()) is not None:
        print(f"\n{line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if cpu_guard.RERUNS:                 # printed as they happen too, but captured unless the test fails
        terminalreporter.section("cpu guard re-runs")
        for test, label, why in cpu_guard.RERUNS:
            terminalreporter.write_line(f"{test} [{label}]: {why}")
    terminalreporter.write_line(cpu_guard.summary_line())


def guarded_run(scen: scenario.Scenario, out: Path, **kw) -> tuple[Path, dict]:
    """``runner.run(scen, out)`` until the CPU guard calls the run valid (tests/cpu_guard.py): a flagged run is
    run again into ``out``-rerun1, -rerun2. For runs whose figures a test asserts."""
    from testbed import runner
    return cpu_guard.valid(lambda k: runner.run(scen, out if k == 0 else out.with_name(f"{out.name}-rerun{k}"), **kw),
                           out.name)


def guarded_cli(out: Path, *args, timeout=300, **kw) -> tuple[subprocess.CompletedProcess, dict]:
    """``testbed run … --out OUT`` (``args``) until the CPU guard calls the run valid; (the completed process,
    summary.csv's row). Asserts each run exited 0."""
    def once(k):
        d = out if k == 0 else out.with_name(f"{out.name}-rerun{k}")
        res = run_cli("run", *args, "--out", str(d), timeout=timeout, **kw)
        assert res.returncode == 0, res.stderr
        with open(next(d.rglob("summary.csv"))) as f:
            return res, next(csv.DictReader(f))
    return cpu_guard.valid(once, out.name)


def _distribution_kernel() -> bool:
    """Loadable modules (rdma_rxe, sch_netem, sch_red …) — a distribution kernel, e.g. the VM lane's."""
    return os.environ.get("FTB_FULLKERNEL") == "1" or os.path.exists("/proc/modules")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (network namespaces, tc, eBPF)")
        for item in items:
            if "e2e" in item.keywords:
                item.add_marker(skip)
    if not _distribution_kernel():
        skip = pytest.mark.skip(reason="needs a distribution kernel (rxe, netem, red): run `testbed vm test`")
        for item in items:
            if "fullkernel" in item.keywords:
                item.add_marker(skip)


def _machine_times() -> tuple[float, float, float]:
    """(steal, busy outside this test process and its children, total) CPU seconds of the whole machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    tick = os.sysconf("SC_CLK_TCK")
    own = os.times()
    mine = own.user + own.system + own.children_user + own.children_system
    return steal / tick, (user + nice + system) / tick - mine, sum(v) / tick


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Record how much of the machine this test had: a timing assertion that fails while the hypervisor stole
    CPU (steal) or other processes ran says so in its report (section "machine")."""
    before = _machine_times()
    try:
        return (yield)
    finally:
        after = _machine_times()
        steal, other, total = (a - b for a, b in zip(after, before))
        if total > 0:
            item.user_properties.append(("machine", f"steal {steal / total:.1%} of CPU time, busy outside "
                                                    f"the test {max(other, 0) / total:.1%} (user+system, "
                                                    f"{total:.1f} CPU-s in {total / os.cpu_count():.1f} s)"))


def pytest_runtest_logreport(report):
    if report.when == "call" and report.failed:
        for k, v in report.user_properties:
            if k == "machine":
                report.sections.append(("machine", v))


class Machine:
    """The share of the machine's CPU time the hypervisor left this VM since ``start()`` (1 − steal). Time it
    stole, the emulated links lost too: a test that expects a link's full rate over a window asks for at least
    its rate × ``available()`` (never more than the rate: steal on the other core may not have touched it)."""

    def __init__(self):
        self.start()

    def start(self) -> None:
        self._t0 = _machine_times()

    def available(self) -> float:
        steal, _, total = (a - b for a, b in zip(_machine_times(), self._t0))
        return 1.0 - steal / total if total > 0 else 1.0


@pytest.fixture
def machine() -> Machine:
    return Machine()


def run_had(row) -> float:
    """The share of a run's traffic window the hypervisor left the machine (1 − the summary's cpu_steal_mean):
    rates and times compared with the link's are scaled by it — a stolen 10 % stopped the emulated links too."""
    return 1.0 - float(row["cpu_steal_mean"])


def lab_load_ok(row: dict) -> tuple[bool, dict]:
    """Was the run light enough for the emulator, whatever the host did? No core saturated by the lab in ≥ 20 %
    of the samples, and the starved shapers that the hypervisor's steal does not explain within the 95 %
    confidence rule of ``cpu_bound`` (results/README.md). Returns (verdict, the figures behind it)."""
    from testbed.report.summary import SATURATED_SHARE, STARVED_SHARE, wilson_lower
    seen = {k: row[k] for k in ("cpu_busy_max", "cpu_saturated_share", "starved_samples", "starved_stolen_samples",
                                "backlogged_samples", "cpu_steal_mean")}
    own = row["starved_samples"] - row["starved_stolen_samples"]
    ok = row["cpu_saturated_share"] < SATURATED_SHARE and wilson_lower(own, row["backlogged_samples"]) <= STARVED_SHARE
    return ok, seen


def inside_port_namespace(ports, tag: str):
    """A throwaway namespace with a veth of every port's ifindex, entered by the calling thread (for
    PROG_TEST_RUN): testbed.bench.next_hop.port_namespace, which the selection benchmark uses too."""
    from testbed.bench.next_hop import port_namespace
    return port_namespace(ports, tag)


@contextlib.contextmanager
def loaded_datapath(topo, switch_spec, ports, tag: str, scen: scenario.Scenario | None = None):
    """The switch program loaded for ``topo`` inside :func:`inside_port_namespace` (ports, tag), for a
    PROG_TEST_RUN module; the module is skipped with BCC's one-line reason if it cannot be built here. With
    ``scen`` whose INT is on (telemetry.int, or HPCC's host stacks): its port configurations (fabric and host MTU)
    and INT settings too."""
    from testbed.datapath import Datapath, DatapathError
    from testbed.fabric.port import port_configs
    extra, kw = (), {}
    if scen is not None and (scen.telemetry.int.enabled or scen.host_int_hops):
        extra = (port_configs(topo, switch_spec, scen.hosts.pfc, scen.fabric_mtu, scen.host_mtu), scen.telemetry.int)
        kw = {"host_stacks": scen.host_int_hops > 0}
    with inside_port_namespace(ports, tag):
        try:
            dp = Datapath(topo, switch_spec, *extra, **kw).load()
        except DatapathError as e:
            pytest.skip(str(e))
        try:
            yield dp
        finally:
            dp.close()


def datapath_fixtures(scenario_dict: dict, tag: str, *, host_ports: bool = False, name: str = "dp"):
    """Module-scoped fixtures of a PROG_TEST_RUN module, to bind at its top level:
    ``scen, topo, dp = datapath_fixtures({...}, "tag")``. ``scen`` is the scenario of ``scenario_dict``, ``topo``
    its topology, and the fixture called ``name`` the switch program loaded for it by :func:`loaded_datapath` with
    a veth for every switch port (``host_ports``: every host NIC's port too); skipped without root. Per-test
    resets of the loaded program stay with the module (each clears what its own tests touch)."""
    @pytest.fixture(scope="module", name="scen")
    def scen_():
        return scenario.from_dict(scenario_dict)

    @pytest.fixture(scope="module", name="topo")
    def topo_(scen):
        return topology.build(scen.topology)

    @pytest.fixture(scope="module", name=name)
    def loaded_(topo, scen):
        if os.geteuid() != 0:
            pytest.skip("needs root (BPF, namespaces)")
        ports = ([p for ps in topo.ports.values() for p in ps] if host_ports
                 else [p for sw in topo.switches for p in topo.ports[sw]])
        with loaded_datapath(topo, scen.switch, ports, tag, scen) as dp:
            yield dp

    return scen_, topo_, loaded_


def fresh_queues(dp):
    """A loaded datapath with zeroed counters and an empty queue model (queues, pauses, PFC ingress state), for
    PROG_TEST_RUN tests of the egress logic."""
    dp.reset_counters()
    for name in (b"vq", b"egress_paused", b"ingress_state"):
        dp.bpf[name].clear()
    return dp


def make_scenario(**sections) -> scenario.Scenario:
    return scenario.from_dict(sections)


@pytest.fixture
def lab():
    """lab(scenario) → a built Lab (fabric + datapath attached); everything is removed after the test."""
    from testbed.lab import Lab
    made = []

    def build(scen: scenario.Scenario):
        lb = Lab(scen, "t" + secrets.token_hex(4))
        lb.__enter__()
        made.append(lb)
        return lb

    yield build
    for lb in made:
        lb.close(force=True)
        assert not netns.list_names(f"{netns.PREFIX}{lb.name}-"), "lab namespaces left behind"


def udp_send(lab, src: str, dst: str, count: int, sport: int, dport: int = 9000, size: int = 64,
             rail: int = 0, gap_s: float = 0.0) -> None:
    """Send ``count`` UDP datagrams from host ``src`` to ``dst`` (blocking socket: the shaped link paces it)."""
    topo = lab.topo
    saddr, daddr = topo.address(src, rail), topo.address(dst, rail)

    def go():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((saddr, sport))
        payload = bytes(size)
        for _ in range(count):
            s.sendto(payload, (daddr, dport))
            if gap_s:
                time.sleep(gap_s)
        s.close()
    netns.run_in(lab.fabric.ns[src], go)


def run_cli(*args, timeout=120, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(TESTBED + list(args), capture_output=True, text=True, timeout=timeout, cwd=kw.pop("cwd", ROOT),
                          env=env, **kw)


def killed_run_error(proc: subprocess.Popen, victim: int) -> tuple[str, str]:
    """SIGKILL ``victim`` (a process ``proc``'s run depends on), wait for ``proc`` (a `testbed run`), and check that
    it failed with exactly one ``error:`` line and no traceback; (that line, its whole stderr)."""
    import signal
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0], err


def wait_for(pred, timeout=10.0, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def processes_named(prefix: str) -> dict[int, str]:
    """pid → process name of every process whose name (``/proc/<pid>/comm``) starts with ``prefix``: the lab's
    traffic agents and helpers carry their namespace's or lab's name (testbed/procname.py)."""
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                comm = open(f"/proc/{pid}/comm").read().strip()
            except OSError:
                continue
            if comm.startswith(prefix):
                out[int(pid)] = comm
    return out


# ---- live metrics (telemetry/live.py): scraping an exporter over loopback

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(address: str) -> dict[tuple, float]:
    """(sample name, sorted labels) → value of every sample served at ``address``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def scrape_while_running(args: list[str], address: str, timeout: float = 120) -> tuple[list[dict], str]:
    """Run the CLI with ``args``, scraping ``address`` every 0.5 s while it runs; (the scrapes, its stderr).
    Asserts it exited 0."""
    proc = subprocess.Popen(TESTBED + args, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scrapes = []
    try:
        deadline = time.time() + timeout
        while proc.poll() is None and time.time() < deadline:
            try:
                scrapes.append(scrape(address))
            except OSError:                  # not listening yet, or already gone
                time.sleep(0.2)
                continue
            time.sleep(0.5)
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
    assert proc.returncode == 0, stderr
    return scrapes, stderr


# ---- a local Ray cluster (testbed/cluster/local.py) for a module

@pytest.fixture(scope="module")
def cluster():
    """A local 2-machine Ray cluster for the module (its state: address, machines); skipped without Ray."""
    pytest.importorskip("ray", reason="the cluster extra (scripts/test-setup.sh installs it)")
    from testbed.cluster import local
    if local.read_state() is not None:
        pytest.fail("a local cluster is already up: these tests start and remove their own")
    res = run_cli("cluster", "up", "--local", "2", timeout=180)
    assert res.returncode == 0, res.stderr
    try:
        yield local.read_state()
    finally:
        res = run_cli("cluster", "down", timeout=120)
        assert res.returncode == 0, res.stderr
        assert not [n for n in netns.list_names() if netns.is_machine(n)]
        assert local.read_state() is None and not local.machine_pids("m0") and not local.machine_pids("m1")


# ---- what a run leaves behind (the run's prefix: its lab name, testbed/lab.py)

def bpf_programs_held(pids) -> set[int]:
    """The ids of the BPF programs these processes hold open (/proc/<pid>/fdinfo ``prog_id``): a run's programs,
    read while it runs (their names, ftb_switch_ingress …, are the same in every lab)."""
    from testbed.datapath.objects import program_id
    out = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fdinfo")
        except OSError:
            continue
        out |= {i for fd in fds if (i := program_id(int(fd), pid)) is not None}
    return out


def _ray_actors_alive(address: str, prefix: str) -> list[str]:
    """Names of the live actors of the Ray cluster at ``address`` whose name starts with ``prefix`` (asked from a
    driver of its own: this process stays out of Ray)."""
    code = ("import json, sys; from testbed.cluster import connect; ray = connect(sys.argv[1]); "
            "from ray._private import state; "
            "print(json.dumps(sorted(a.get('Name') or '' for a in state.actors().values() "
            "if (a.get('Name') or '').startswith(sys.argv[2]) and a.get('State') != 'DEAD')))")
    res = subprocess.run([sys.executable, "-c", code, address, prefix], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr
    import json
    return json.loads(res.stdout.strip().splitlines()[-1])


def _zombie(pid: int) -> bool:
    """Exited, not reaped yet: it holds nothing any more."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def leftovers(lab: str, bpf_programs=(), ray_address: str | None = None) -> dict[str, list]:
    """What of lab ``lab`` (a run's or a `testbed up` lab's name, and its machine parts ``<lab>m<i>``) is still
    on this machine — empty lists when nothing: its state file, namespaces (``ftb-<lab>-*``), links named after it
    in the root and the local cluster's machine namespaces, the BPF programs of ``bpf_programs`` (read while it ran,
    bpf_programs_held), processes named after it (helpers, agents: testbed/procname.py), containers labelled with
    it, cgroups named after it (the CPU accounting's, under every hierarchy), and with ``ray_address`` the live
    Ray actors named after it."""
    from testbed.lab import LABS_DIR
    out: dict[str, list] = {}
    out["state"] = (sorted(p.name for p in LABS_DIR.glob(f"{lab}*") if p.suffix in (".json", ".sock"))
                    if LABS_DIR.exists() else [])                    # the state file, the controller's sockets
    out["namespaces"] = netns.list_names(f"{netns.PREFIX}{lab}")
    links = []
    for ns in [None] + [n for n in netns.list_names() if netns.is_machine(n)]:
        cmd = ["ip", "-o", "link", "show"] if ns is None else ["ip", "-n", ns, "-o", "link", "show"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        links += [f"{ns or 'root'}: {ln.split(':')[1].strip()}" for ln in res.stdout.splitlines()
                  if lab in ln.split(":")[1]]
    out["links"] = links
    from testbed.datapath.objects import program_exists
    out["bpf_programs"] = sorted(p for p in bpf_programs if program_exists(p))
    out["processes"] = sorted(f"{pid} {comm}" for pid, comm in processes_named(f"{netns.PREFIX}{lab}"[:15]).items()
                              if not _zombie(pid))
    containers = []
    try:
        import docker
        c = docker.from_env(timeout=10)
        containers = sorted(x.name for x in c.containers.list(all=True)
                            if (x.labels or {}).get("fabric-testbed", "").startswith(lab)
                            or x.name.startswith(f"{netns.PREFIX}{lab}"))
    except Exception:                       # noqa: BLE001 — no SDK or no daemon: no container can be left
        pass
    out["containers"] = containers
    cgroups = []
    root = Path("/sys/fs/cgroup")
    for d in [root] + [p for p in root.iterdir() if p.is_dir()]:
        with contextlib.suppress(OSError):
            cgroups += [str(p) for p in d.iterdir() if p.is_dir() and p.name.startswith(f"{netns.PREFIX}{lab}")]
    out["cgroups"] = sorted(cgroups)
    if ray_address is not None:
        out["ray_actors"] = _ray_actors_alive(ray_address, f"{netns.PREFIX}{lab}")
    return {k: v for k, v in out.items() if v}
