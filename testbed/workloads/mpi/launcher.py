"""Open MPI on the lab: a management network for its wire-up, mpirun with an rsh agent that enters the host
namespaces, the benchmark's output parsed, and nothing left running.

- **Management network.** mpirun's daemons (orted) and the ranks exchange their out-of-band wire-up over TCP,
  and orted also spawns orted (``--tree-spawn``). That traffic must not cross the fabric nor be counted in its
  telemetry, so it has a network of its own: a namespace ``ftb-<lab>-mgmt`` holding a bridge, and a veth
  ``mgmt0`` into every rank's host namespace, in a /24 of the benchmarking range no fabric address uses
  (``MgmtNet``). mpirun runs in the management namespace; the data goes only over the fabric NICs
  (``btl_tcp_if_include`` / ``UCX_NET_DEVICES`` name them), which ``mgmt_bytes`` lets a test prove.
- **Launch.** mpirun starts one orted per host through an rsh agent, a script written for the run that runs
  the command it is given inside that host's namespace (as ssh would on a real cluster); one rank per host
  (``--map-by node``, ``--bind-to none``: every "node" is this machine). Ranks run ``rank.py``.
- **Ranks wait without keeping a core busy.** Open MPI and UCX poll; the ranks get ``idle.c`` preloaded, which
  makes the ``sched_yield()`` of their idle progress passes a 50 µs sleep, so that the emulated fabric keeps its
  CPU (built once with the machine's C compiler and cached; without one the ranks poll, and the manifest says so).
- **Shared memory is never used**: every rank is on the same machine, so Open MPI's vader BTL and UCX's shared
  memory transports would bypass the fabric; only ``tcp,self`` (ob1) or UCX's ``tcp,self`` are allowed.
- **Failure.** A rank that fails makes mpirun exit non-zero: the run fails in one line naming the rank's host
  and MPI's own error line (``--tag-output`` prefixes every line with its rank). mpirun's own output is kept in
  the run directory (``mpi/mpirun.log``). Whatever happens, mpirun is ended, then every process left in the
  rank and management namespaces, and the management namespace is removed.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ...fabric import netns
from ..agent_set import WorkloadError

MGMT_SUBNET = ipaddress.IPv4Network("198.19.254.0/24")     # RFC 2544's range, beside the cluster underlay (.255)
MGMT_IF = "mgmt0"
RANK_PROGRAM = Path(__file__).with_name("rank.py")
IDLE_SOURCE = Path(__file__).with_name("idle.c")
CACHE = Path(os.environ.get("FTB_CACHE_DIR", "/var/cache/fabric-testbed")) / "mpi"
KILL_GRACE_S = 2.0
_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$")


def missing(transport: str = "tcp") -> str | None:
    """Why the MPI engine cannot run here (one line naming the Debian packages), or None."""
    if shutil.which("mpirun") is None:
        return ("traffic.engine mpi: Open MPI is not installed (mpirun missing; apt-get install openmpi-bin "
                "python3-mpi4py)")
    import importlib.util
    if importlib.util.find_spec("mpi4py") is None:
        return (f"traffic.engine mpi: mpi4py does not import in {sys.executable} (apt-get install python3-mpi4py; "
                f"the virtual environment needs the system site packages)")
    if transport == "ucx" and not _has_ucx_pml():
        return "traffic.engine mpi: transport ucx needs Open MPI's UCX PML (apt-get install openmpi-bin libucx0)"
    return None


def _has_ucx_pml() -> bool:
    try:
        out = subprocess.run(["ompi_info", "--parsable"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.startswith("mca:pml:ucx:") for line in out.splitlines())


def idle_shim() -> tuple[Path | None, str | None]:
    """(the preload library built from idle.c, None) — built once per source, cached — or (None, why not)."""
    src = IDLE_SOURCE.read_bytes()
    lib = CACHE / f"idle-{hashlib.sha256(src).hexdigest()[:16]}.so"
    if lib.is_file():
        return lib, None
    cc = shutil.which("cc") or shutil.which("gcc")
    why = "the MPI ranks busy-poll (the CPU guard may flag the run): "
    if cc is None:
        return None, why + "no C compiler (cc) to build their idle shim (apt-get install gcc)"
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f"{lib.name}.{os.getpid()}.tmp")
    res = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(IDLE_SOURCE)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None, why + f"building their idle shim failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}"
    os.replace(tmp, lib)
    return lib, None


def mgmt_addresses(n: int, fabric_addresses: list[str]) -> tuple[str, list[str]]:
    """(mpirun's address, one per rank) in MGMT_SUBNET; refused (WorkloadError) when a fabric address falls in
    it or the ranks do not fit."""
    taken = [a for a in fabric_addresses if ipaddress.IPv4Address(a) in MGMT_SUBNET]
    if taken:
        raise WorkloadError(f"traffic.engine mpi: the fabric uses {taken[0]}, inside the management network "
                            f"{MGMT_SUBNET}; use a smaller topology")
    hosts = list(MGMT_SUBNET.hosts())
    if n > len(hosts) - 1:
        raise WorkloadError(f"traffic.mpi.ranks: {n} ranks; the management network holds at most {len(hosts) - 1}")
    return str(hosts[-1]), [str(h) for h in hosts[:n]]


class MgmtNet:
    """The management network of an MPI run (module docstring): ``with MgmtNet(...) as m`` builds it, the exit
    removes it."""

    def __init__(self, lab: str, rank_ns: list[str], addresses: list[str], hnp: str):
        self.ns = f"{netns.PREFIX}{lab}-mgmt"
        self.session = Path("/tmp") / f"{netns.PREFIX}{lab}-mpi"     # mpirun's and every daemon's session files
        self.rank_ns, self.addresses, self.hnp = rank_ns, addresses, hnp

    def __enter__(self) -> "MgmtNet":
        netns.create([self.ns])
        try:
            netns.run_in(self.ns, self._build)
        except BaseException:
            netns.delete([self.ns])
            raise
        return self

    def _build(self) -> None:
        from pyroute2 import IPRoute
        plen = MGMT_SUBNET.prefixlen
        with IPRoute() as ip:
            ip.link("set", index=1, state="up")
            ip.link("add", ifname="br0", kind="bridge")
            br = ip.link_lookup(ifname="br0")[0]
            ip.addr("add", index=br, address=self.hnp, prefixlen=plen)
            ip.link("set", index=br, state="up")
            for i, (ns, addr) in enumerate(zip(self.rank_ns, self.addresses)):
                port = f"m{i}"
                ip.link("add", ifname=port, kind="veth", peer={"ifname": MGMT_IF, "net_ns_fd": netns.path(ns)})
                idx = ip.link_lookup(ifname=port)[0]
                ip.link("set", index=idx, master=br, state="up")
                netns.run_in(ns, _rank_side, addr, plen)

    def bytes(self) -> int:
        """Bytes the management network carried (received by its bridge ports, i.e. sent by the ranks' hosts,
        plus sent to them)."""
        def count():
            from pyroute2 import IPRoute
            total = 0
            with IPRoute() as ip:
                for link in ip.get_links():
                    name = link.get_attr("IFLA_IFNAME")
                    if name.startswith("m") and name[1:].isdigit():
                        st = link.get_attr("IFLA_STATS64")
                        total += st["rx_bytes"] + st["tx_bytes"]
            return total
        return netns.run_in(self.ns, count)

    def __exit__(self, *exc) -> None:
        kill_in([self.ns])
        kill_in(self.rank_ns, only=("orted", str(RANK_PROGRAM)))
        netns.delete([self.ns])
        shutil.rmtree(self.session, ignore_errors=True)


def _rank_side(addr: str, plen: int) -> None:
    from pyroute2 import IPRoute
    with IPRoute() as ip:
        idx = ip.link_lookup(ifname=MGMT_IF)[0]
        ip.addr("add", index=idx, address=addr, prefixlen=plen)
        ip.link("set", index=idx, state="up")


def kill_in(names: list[str], only: tuple[str, ...] = ()) -> None:
    """SIGKILL the processes left in these namespaces — with ``only``, those whose command line holds one of
    these words (in a host's namespace: this run's orted and ranks, not a capture's tcpdump)."""
    for pid in netns.pids_in(names):
        if only:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if not any(w in cmd for w in only):
                continue
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def agent_script(path: Path, ns_of: dict[str, str], session: Path) -> Path:
    """The rsh agent mpirun calls as ``agent HOST COMMAND…``: runs COMMAND in HOST's namespace with sh, as ssh's
    remote shell would, with a session directory of HOST's own under ``session`` (every "node" has this machine's
    hostname and /tmp: the daemons' default session directories collide, and one's clean-up broke another's
    start in 1 of 9 runs). The directory is given as TMPDIR, never as the MCA parameter orte_tmpdir_base: mpirun
    forwards that one on every daemon's command line, where it overrides the agent's, and a daemon and mpirun
    then raced to create the same job directory (1 in 12 runs beside a CPU hog)."""
    cases = "\n".join(f'  {h}) ns="{netns.path(ns)}" ;;' for h, ns in ns_of.items())
    path.write_text(f'#!/bin/sh\n# mpirun\'s rsh agent for this run: enter the host\'s network namespace\n'
                    f'host="$1"; shift\ncase "$host" in\n{cases}\n  *) echo "no host $host" >&2; exit 1 ;;\nesac\n'
                    f'mkdir -p "{session}/$host"\n'
                    f'exec env TMPDIR="{session}/$host" nsenter --net="$ns" sh -c "$*"\n')
    path.chmod(0o755)
    return path


def mpirun_argv(hosts: list[str], hostfile: Path, agent: Path, nics: list[str], transport: str,
                mca: dict[str, str], program_args: dict, preload: Path | None = None) -> list[str]:
    """The mpirun command line: one rank per host over the fabric NICs ``nics`` only (``preload``: the ranks'
    idle shim)."""
    argv = ["mpirun", "--allow-run-as-root", "--hostfile", str(hostfile), "-np", str(len(hosts)),
            "--map-by", "node", "--bind-to", "none", "--tag-output",
            "--mca", "plm_rsh_agent", str(agent), "--mca", "oob_tcp_if_include", str(MGMT_SUBNET),
            "--mca", "mpi_yield_when_idle", "1",
            # no topology in shared memory: every daemon is on this machine, and one crashed writing it (1 in 24)
            "--mca", "rtc_hwloc_vmhole", "none"]
    if transport == "tcp":
        argv += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", ",".join(nics)]
    else:
        # pml_ucx_tls/devices any: Open MPI 4.1 selects the UCX PML only for RDMA devices unless told otherwise
        argv += ["--mca", "pml", "ucx", "--mca", "btl", "^vader,tcp,openib,uct", "--mca", "pml_ucx_tls", "any",
                 "--mca", "pml_ucx_devices", "any",
                 "-x", f"UCX_NET_DEVICES={','.join(nics)}", "-x", "UCX_TLS=tcp,self"]
    for k, v in mca.items():
        argv += ["--mca", k, v]
    if preload is not None:
        argv += ["-x", f"LD_PRELOAD={preload}"]
    return argv + [sys.executable, str(RANK_PROGRAM), json.dumps(program_args)]


def rank_errors(text: str) -> dict[int, list[str]]:
    """Every rank's stderr lines, from mpirun's tagged output."""
    err: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = _TAG.match(line)
        if m and m.group(2) == "stderr" and m.group(3).strip():
            err.setdefault(int(m.group(1)), []).append(m.group(3).strip())
    return err


def failure_line(rc: int, text: str, hosts: list[str]) -> str:
    """One line for a failed mpirun, naming the rank that failed first and its host: the one mpirun saw die of
    a signal, or the first to exit non-zero (with its last error line), else the first that complained (the
    others' "connection reset" follows a peer's death), else mpirun's own first complaint."""
    err = rank_errors(text)

    def last(rank: int) -> str | None:
        lines = [s for s in err.get(rank, []) if not s.startswith("warnings.warn")]
        return lines[-1][:300] if lines else None
    m = re.search(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+) \(([^)]*)\)", text)
    if m:
        return f"mpi: rank {m.group(1)} on {m.group(2)} failed: killed by signal {m.group(3)} ({m.group(4)})"
    m = re.search(r"Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)", text)
    if m and int(m.group(1)) < len(hosts):
        r = int(m.group(1))
        return f"mpi: rank {r} on {hosts[r]} failed: exit code {m.group(2)}" + (f": {last(r)}" if last(r) else "")
    for rank in sorted(err):
        if last(rank) and rank < len(hosts):
            return f"mpi: rank {rank} on {hosts[rank]} failed: {last(rank)}"
    own = [s.strip() for s in text.splitlines() if s.strip() and not _TAG.match(s) and not set(s.strip()) <= {"-"}]
    return f"mpi: mpirun exited with {rc}: {own[0][:300] if own else 'no output'}"


def run(mgmt: MgmtNet, argv: list[str], hosts: list[str], log_dir: Path, report: Path, deadline_s: float,
        check: Callable[[], None]) -> dict:
    """Run mpirun in the management namespace until it ends, ``deadline_s`` passes (WorkloadError) or
    ``check`` raises (a helper died); returns rank 0's report (the file ``report``). mpirun's output is kept in
    ``log_dir/mpirun.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "mpirun.log"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TMPDIR=str(mgmt.session / "mpirun"))     # not orte_tmpdir_base: agent_script says why
    (mgmt.session / "mpirun").mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = netns.spawn(mgmt.ns, argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           env=env, start_new_session=True)
        try:
            end = time.monotonic() + deadline_s
            while proc.poll() is None:
                if time.monotonic() > end:
                    raise WorkloadError(f"mpi: the benchmark did not finish within the scenario's duration "
                                        f"({deadline_s:g} s); raise duration or lower traffic.mpi.sizes/iterations")
                check()
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                _end(proc)
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise WorkloadError(failure_line(proc.returncode, text, hosts))
    try:
        return json.loads(report.read_text())
    except (OSError, ValueError) as e:
        raise WorkloadError(f"mpi: rank 0 wrote no results ({e}; mpi/mpirun.log has MPI's output)") from None


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM mpirun's session (it tells its daemons to stop), SIGKILL it after KILL_GRACE_S."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
