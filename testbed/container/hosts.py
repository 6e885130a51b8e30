"""The containers of one lab's hosts (``hosts.docker``), and entering them.

Each host is a container ``ftb-<lab>-<node>`` (label ``fabric-testbed=<lab>``) started with ``--network none``
and ``--init``, running ``sleep infinity``: it is only a set of namespaces and a root filesystem. Its network
namespace becomes the host's namespace (``Fabric.build(adopt=…)`` bind-mounts ``/proc/<pid>/ns/net`` at
``/run/netns/ftb-<lab>-<node>``), so the fabric moves the host's NICs into it and configures them exactly as for a
namespace host, and everything that enters a host's namespace by name (captures, PFC host ingress, sysctls,
teardown) works unchanged.

Processes are put *into* a container with ``nsenter`` (mount, UTS, IPC, network and PID namespaces of its init):
they see the container's files and processes, die with the container, yet stay in the lab's cgroup (so the CPU
guard counts them) and keep the caller's privileges, as an agent in a namespace host does. The traffic agent
runs that way with the container's ``python3`` and the project's package bind-mounted read-only at CODE_DIR
(an image without Python ≥ 3.11 and ``isal`` gets its agents in the container's network namespace with the
testbed's own Python instead — said in the log and the manifest). ``Container`` records what entering needs (pid
and start time, the image's environment) in the lab's state file, so ``testbed exec`` needs no Docker SDK.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .daemon import DockerError, client
from .image import IMAGE, TAG
from ..errors import HelperFailed
from ..procname import proc_running, proc_start

LABEL = "fabric-testbed"                   # value: the lab's name; every container of this tool carries it
NODE_LABEL = "fabric-testbed.node"
CODE_DIR = "/opt/fabric-testbed"           # PYTHONPATH in the container: the package is CODE_DIR/testbed
PACKAGE = Path(__file__).resolve().parent.parent
ENTRYPOINT, COMMAND = ["sleep"], ["infinity"]
PYTHON_CHECK = "import sys; assert sys.version_info >= (3, 11), sys.version; import isal, pydantic"
_NSENTER = ("--mount", "--uts", "--ipc", "--net", "--pid")
START_THREADS = 8                          # containers started at once (8: 120–155 ms a host here; fewer: slower)


class ContainerGone(DockerError):
    pass


class ContainerHostFailed(HelperFailed):
    """A host's container died while the lab ran; the message is one line naming it."""


@dataclass
class Container:
    """One host's running container: what entering it needs, as the lab's state file keeps it."""
    node: str
    name: str
    image: str
    pid: int                               # its init process (host pid)
    start: int | None                      # that process's start time: the pid names it for good
    env: list[str] = field(default_factory=list)   # the image's environment (KEY=VALUE), for commands run in it
    python: bool = True                    # the image can run the traffic agent (PYTHON_CHECK passed)

    @classmethod
    def from_dict(cls, d: dict) -> "Container":
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def netns_file(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def alive(self) -> bool:
        return proc_running(self.pid, self.start)

    def death(self) -> str:
        """The one line of a container host that died under a run (its init killed, the container stopped)."""
        return f"container host {self.node} (container {self.name}) died during the run (its init, pid {self.pid}, is gone)"

    def environ(self, extra: dict | None = None) -> dict:
        env = dict(e.split("=", 1) for e in self.env if "=" in e)
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env.update(extra or {})
        return env

    def argv(self, argv: list[str]) -> list[str]:
        nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
        return [nsenter, f"--target={self.pid}", *_NSENTER, "--", *argv]

    def spawn(self, argv: list[str], env: dict | None = None, **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside the container (its files, network, processes), with the image's environment
        plus ``env``. ``FileNotFoundError`` when the container's filesystem has no such program."""
        if not self.alive():
            raise ContainerGone(f"container {self.name} of {self.node} is not running (pid {self.pid} is gone)")
        return subprocess.Popen(self.argv(list(argv)), env=self.environ(env), **popen_kwargs)

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        p = self.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
        return subprocess.CompletedProcess(argv, p.returncode, out, err)


def names(lab: str, hosts) -> dict[str, str]:
    from ..fabric import ns_name
    return {h: ns_name(lab, h) for h in hosts}


class ContainerHosts:
    """The containers of a lab's hosts. Made before anything is built: it connects to Docker (installing and
    starting it on first use) and checks that every image is there (building fabric-testbed/host when it is
    the one missing), so that Docker that cannot run is one line before the fabric exists."""

    def __init__(self, lab: str, images: dict[str, str], log=lambda s: None, start_daemon: bool = True,
                 shared_dirs: tuple[str, ...] = ()):
        """``start_daemon``: install and start Docker when it is missing (False: one machine's part of a fabric
        over several — its actor may run inside a machine namespace, no place for the machine's daemon).
        ``shared_dirs``: folders of this machine every container sees at the same path, read-write (the
        workloads' gates)."""
        self.lab, self.images, self.log = lab, dict(images), log
        self.shared_dirs = tuple(shared_dirs)
        self.names = names(lab, images)
        self.containers: dict[str, Container] = {}
        self.timings: dict[str, float] = {}
        self.notes: list[str] = []         # what the user should know (an image that cannot run the agent)
        self.client = client(start=start_daemon, install=start_daemon, log=log)
        self._check_images()

    def _check_images(self) -> None:
        docker = __import__("docker")
        for img in sorted(set(self.images.values())):
            try:
                self.client.images.get(img)
            except docker.errors.ImageNotFound:
                if img in (IMAGE, f"{IMAGE}:{TAG}"):
                    from .image import build
                    b = build(log=self.log)
                    self.log(f"image: built {b.image} in {b.seconds:.1f} s")
                    continue
                hosts = sorted(h for h, i in self.images.items() if i == img)
                raise DockerError(f"hosts.docker: image {img!r} (for {', '.join(hosts[:4])}"
                                  f"{' …' if len(hosts) > 4 else ''}) is not in the local Docker daemon; no "
                                  f"registry is used: `docker load`/`docker import` it, or use {IMAGE} "
                                  f"(`testbed image build`)") from None
            except docker.errors.APIError as e:
                raise DockerError(f"hosts.docker: image {img!r}: {e.explanation or e}") from None

    def start(self) -> dict[str, str]:
        """Start every host's container (a few at a time; the daemon does the work) and return node → its
        network namespace file. A container that fails to start fails the lab with one line."""
        t = time.perf_counter()
        for d in self.shared_dirs:
            os.makedirs(d, exist_ok=True)
        volumes = {str(PACKAGE): {"bind": f"{CODE_DIR}/testbed", "mode": "ro"},
                   **{d: {"bind": d, "mode": "rw"} for d in self.shared_dirs}}
        with ThreadPoolExecutor(max_workers=START_THREADS) as ex:
            done = list(ex.map(lambda h: self._start_one(h, volumes), self.images))
        self.containers = dict(done)
        self._check_python()
        self.timings["containers"] = time.perf_counter() - t
        return {h: c.netns_file for h, c in self.containers.items()}

    def _start_one(self, host: str, volumes: dict) -> tuple[str, Container]:
        docker = __import__("docker")
        name = self.names[host]
        try:
            ctr = self.client.containers.run(
                self.images[host], entrypoint=ENTRYPOINT, command=COMMAND, name=name, hostname=host,
                network_mode="none", init=True, detach=True, labels={LABEL: self.lab, NODE_LABEL: host},
                volumes=volumes)
            ctr.reload()
        except docker.errors.APIError as e:
            raise DockerError(f"container {name} ({self.images[host]}) for {host} did not start: "
                              f"{(e.explanation or str(e)).strip().splitlines()[0]}") from None
        state = ctr.attrs["State"]
        pid = state.get("Pid") or 0
        if not state.get("Running") or not pid:
            raise DockerError(f"container {name} ({self.images[host]}) for {host} exited at once (status "
                              f"{state.get('ExitCode')}, {state.get('Error') or 'no error'}): its image needs "
                              f"`sleep` (coreutils or busybox)")
        return host, Container(host, name, self.images[host], pid, proc_start(pid),
                               list(ctr.attrs["Config"].get("Env") or []))

    def _check_python(self) -> None:
        """Per image: can the traffic agent run in it (Python ≥ 3.11 with isal and pydantic)? If not, its hosts' agents run
        in their network namespace with this Python, which ``notes`` says (logged once the fabric is up: while
        BCC compiles, stderr is not the terminal's)."""
        verdict: dict[str, bool] = {}
        for c in self.containers.values():
            if c.image not in verdict:
                try:
                    r = c.run(["python3", "-c", PYTHON_CHECK])
                    ok, why = r.returncode == 0, (r.stderr.strip().splitlines() or ["?"])[-1]
                except FileNotFoundError:
                    ok, why = False, "no python3"
                verdict[c.image] = ok
                if not ok:
                    self.notes.append(f"docker: image {c.image} cannot run the traffic agent ({why}; it needs python3 ≥ "
                                      f"3.11 with isal and pydantic): its hosts' agents run in the container's network "
                                      f"namespace with the testbed's Python")
            c.python = verdict[c.image]

    def check(self) -> None:
        """Raise ContainerHostFailed (one line) if a host's container has died; polled while traffic runs."""
        for c in self.containers.values():
            if not c.alive():
                raise ContainerHostFailed(c.death())

    def remove(self) -> int:
        """Remove every container of the lab (those started and any other carrying its label)."""
        t = time.perf_counter()
        n = remove_lab(self.lab, self.client)
        self.timings["containers_down"] = time.perf_counter() - t
        return n

    def manifest(self) -> dict:
        return {"hosts": {h: {"container": c.name, "image": c.image,
                              "agent": "container" if c.python else "network namespace"}
                          for h, c in self.containers.items()},
                "notes": self.notes}


def _remove(ctrs) -> int:
    docker = __import__("docker")
    n = 0

    def one(ctr):
        try:
            ctr.remove(force=True)
            return 1
        except docker.errors.NotFound:      # removed meanwhile
            return 0
    with ThreadPoolExecutor(max_workers=START_THREADS) as ex:
        n = sum(ex.map(one, ctrs))
    return n


def remove_lab(lab: str, c=None) -> int:
    """Remove the containers labelled with ``lab`` (running or not); returns how many."""
    c = c or client(start=False, install=False)
    return _remove(c.containers.list(all=True, filters={"label": f"{LABEL}={lab}"}))


def remove_leftovers(keep: set[str]) -> int | None:
    """``testbed clean``: remove every container of this tool whose lab is not in ``keep``; None when Docker is
    not there to ask (no SDK, or no daemon: nothing is installed or started for this)."""
    try:
        c = client(start=False, install=False)
    except DockerError:
        return None
    ctrs = [x for x in c.containers.list(all=True, filters={"label": LABEL})
            if (x.labels or {}).get(LABEL) not in keep and x.name.startswith("ftb-")]
    return _remove(ctrs)
