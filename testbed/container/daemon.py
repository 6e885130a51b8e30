"""The Docker engine that container hosts run on: the ``docker`` SDK client against the local daemon.

Docker is optional — namespace hosts need none of it — so it is installed and started on first use instead of by
the quick start: ``client()`` runs ``scripts/docker-setup.sh`` (Debian's docker.io + the pip extra ``.[docker]``)
when the SDK or ``dockerd`` is missing, and starts ``dockerd --iptables=false --bridge=none`` when no daemon
answers (a daemon that creates no bridge and touches no firewall: container hosts have no Docker network, their
NICs are the fabric's). A daemon that is already running, e.g. the distribution's service, is used as it is.
Anything that cannot work is one line (``DockerError``) before a lab builds anything.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from ..errors import TestbedError

ROOT = Path(__file__).resolve().parent.parent.parent
SETUP = ROOT / "scripts" / "docker-setup.sh"
DOCKERD_ARGS = ("--iptables=false", "--bridge=none")
DOCKERD_LOG = Path("/var/log/fabric-testbed/dockerd.log")
START_TIMEOUT_S = 30.0


class DockerError(TestbedError):
    """Docker cannot be used (not installed, daemon not running or refusing); the message is one line."""


def _setup(what: str, log) -> None:
    """Install what container hosts need (idempotent): only as root and only from a source tree that has the
    script; ``FTB_DOCKER_NO_SETUP=1`` turns it off (then a missing part is an error)."""
    if os.geteuid() != 0 or not SETUP.exists() or os.environ.get("FTB_DOCKER_NO_SETUP") == "1":
        return
    log(f"docker: {what} missing: running scripts/docker-setup.sh")
    r = subprocess.run(["bash", str(SETUP)], env=dict(os.environ, FTB_PY=sys.executable),
                       stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode:
        raise DockerError(f"scripts/docker-setup.sh failed (exit {r.returncode}) while installing {what}")
    importlib.invalidate_caches()


def sdk(install: bool = True, log=lambda s: None):
    """The ``docker`` module (installing the pip extra on first use when ``install``)."""
    try:
        import docker
        return docker
    except ImportError:
        if install:
            _setup("the docker SDK (pip extra .[docker])", log)
    try:
        import docker
        return docker
    except ImportError:
        raise DockerError("the docker SDK is not installed: bash scripts/docker-setup.sh (or pip install "
                          "-e '.[docker]')") from None


def _connect(docker):
    """A client whose daemon answered a ping, or the reason there is none."""
    try:
        c = docker.from_env(timeout=60)
        c.ping()
        return c, ""
    except docker.errors.DockerException as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, why


def _default_socket() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    return host in ("", "unix:///var/run/docker.sock", "unix:///run/docker.sock")


def client(start: bool = True, install: bool = True, log=lambda s: None):
    """A ``docker.DockerClient`` of the local daemon. ``install``: run the set-up script when the SDK or dockerd
    is missing; ``start``: start dockerd when no daemon answers on the default socket."""
    docker = sdk(install, log)
    c, why = _connect(docker)
    if c is not None:
        return c
    if not start or not _default_socket():
        raise DockerError(f"the Docker daemon is not reachable ({why}); start it: "
                          f"dockerd {' '.join(DOCKERD_ARGS)} & (see README, Docker hosts)")
    if shutil.which("dockerd") is None and install:
        _setup("dockerd (Debian's docker.io)", log)
    if shutil.which("dockerd") is None:
        raise DockerError("dockerd is not installed: apt-get install docker.io (or bash scripts/docker-setup.sh)")
    if os.geteuid() != 0:
        raise DockerError(f"the Docker daemon is not running ({why}) and only root can start it")
    start_daemon(log)
    c, why = _connect(docker)
    if c is None:
        raise DockerError(f"dockerd started but does not answer ({why}); see {DOCKERD_LOG}")
    return c


def start_daemon(log=lambda s: None) -> int:
    """Start dockerd as a service would run it and wait until it answers; returns its pid. A shell starts it in
    the background in a session of its own and exits, so the daemon is re-parented to init: it is no child of this
    process (nothing of ours to reap, and a test's check for leftover children does not see it), and Ctrl-C here
    does not reach it. Its output goes to DOCKERD_LOG; a daemon that exits is one line with its last log line."""
    DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
    log(f"docker: starting dockerd {' '.join(DOCKERD_ARGS)} (log: {DOCKERD_LOG})")
    # the shell opens the log itself; close_fds (the default) keeps our locks and pipes out of the daemon
    started = subprocess.run(["sh", "-c", 'setsid dockerd "$@" </dev/null >>"$0" 2>&1 & echo $!',
                              str(DOCKERD_LOG), *DOCKERD_ARGS], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, check=True)
    pid = int(started.stdout.strip())
    docker = sdk(install=False)
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        c, _ = _connect(docker)
        if c is not None:
            c.close()
            return pid
        if not _alive(pid):
            raise DockerError(f"dockerd exited: {_last_log_line()}")
        time.sleep(0.2)
    raise DockerError(f"dockerd did not answer within {START_TIMEOUT_S:g} s: {_last_log_line()}")


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (init reaps the daemon, so an exited one is gone, not a zombie of ours)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _last_log_line() -> str:
    try:
        lines = [ln for ln in DOCKERD_LOG.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"(no log at {DOCKERD_LOG})"
    return lines[-1].strip() if lines else "(empty log)"


def status() -> tuple[tuple[bool, str], tuple[bool, str]]:
    """For ``testbed doctor``: ((SDK ok, detail), (daemon ok, detail)), found without installing or starting
    anything."""
    try:
        import docker
    except ImportError:
        return (False, "the docker Python SDK is not installed (pip extra .[docker]; installed on first use)"), \
               (False, "not checked: no SDK" + ("" if shutil.which("dockerd") else "; dockerd not installed "
                                                "(Debian's docker.io; installed on first use)"))
    sdk_ok = (True, f"docker SDK {docker.__version__}")
    c, why = _connect(docker)
    if c is None:
        where = "installed" if shutil.which("dockerd") else "not installed (Debian's docker.io)"
        return sdk_ok, (False, f"no daemon answers ({why}); dockerd {where}, started on first use")
    try:
        info = c.info()
        return sdk_ok, (True, f"Docker {info.get('ServerVersion')}, storage {info.get('Driver')}, "
                              f"cgroup v{info.get('CgroupVersion', '?')}")
    finally:
        c.close()
