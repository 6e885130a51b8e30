"""Mininet baseline for the build benchmark, measured in the same run (``testbed bench build --vs mininet``).

Debian's ``mininet`` package (2.3) builds the same leaf–spine as the testbed (``shape_for``): Linux bridges
(``LinuxBridge``, what ``mn --switch lxbr`` uses, STP off), no controller, no pings; every host links to its
leaf and every leaf to every spine, either plain veth links or ``TCLink(bw=100)`` (HTB at 100 Mbit/s on both
ends, as Mininet users shape). Up = ``Mininet()`` + ``build()`` + ``start()``; down = ``stop()`` returning.

Each measurement runs in its own subprocess (Mininet keeps class-level state and leaves shells and interfaces
behind when it fails) started with ``unshare --net``, so the bridges and the switch-side veth ends live in a
private network namespace that the kernel removes when its last process exits; the hosts are Mininet's usual
shells in unnamed namespaces. Why private: a leaf–spine of bridges without STP has loops, and a single multicast
frame would circle forever — each bridge sends an IGMP report when it comes up (it joins 224.0.0.106), and
every interface with IPv6 sends DAD, MLD and router solicitations. The child turns those off in its private
namespace (IPv6 off, ``igmp_link_local_mcast_reports`` 0) and IPv6 off in every host before any interface
exists — never on the machine — and a watchdog stops the run if the switch ports see traffic anyway. Mininet's
``fixLimits`` is skipped for the same reason (it raises machine-wide sysctls); its per-process rlimits are applied.

Every node is named ``fm<3 base-36 chars><s|l|h><n>`` (the run prefix; interfaces ``<node>-eth<port>`` stay
within 15 characters up to 4,096 hosts). On every path — success, error, timeout, Ctrl-C — the parent kills the
child, then every process whose command line carries ``mininet:<prefix>`` (Mininet's shells), and deletes any
interface in its own namespace named after the prefix; nothing named differently is touched, and ``mn -c``
(which kills every Mininet and Open vSwitch on the machine) is never run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("mininet", "bridge-utils")     # bridge-utils: brctl, which LinuxBridge runs; mininet does not depend on it
VARIANTS = ("plain", "tclink")
LABELS = {"plain": "plain links", "tclink": "TCLink 100M"}
BW_MBIT = 100
DEFAULT_TIMEOUT = 600.0       # s per measurement (one variant at one size)
IFNAMSIZ = 15
EVENT = "FTBM "               # marks the child's result lines on stdout
STORM_FRAMES = 10_000         # frames on switch ports (nothing is sent) that mean a loop storm
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_seq = 0


# ------------------------------------------------------------------ names (pure)

def node_names(prefix: str, spines: int, leaves: int, hpl: int) -> tuple[list[str], list[str], list[str]]:
    """Spine, leaf and host names; host ``h<n>`` sits on leaf ``n // hpl``."""
    return ([f"{prefix}s{i}" for i in range(spines)], [f"{prefix}l{i}" for i in range(leaves)],
            [f"{prefix}h{i}" for i in range(leaves * hpl)])


def longest_ifname(prefix: str, spines: int, leaves: int, hpl: int) -> str:
    """Mininet's longest interface name for the shape: switch ports count from 1, host ports from 0."""
    s, le, h = node_names(prefix, spines, leaves, hpl)
    return max([f"{s[-1]}-eth{leaves}", f"{le[-1]}-eth{spines + hpl}", f"{h[-1]}-eth0"], key=len)


def check_shape(prefix: str, spines: int, leaves: int, hpl: int) -> None:
    name = longest_ifname(prefix, spines, leaves, hpl)
    if len(name) > IFNAMSIZ:
        raise ValueError(f"Mininet baseline: interface name {name} would exceed {IFNAMSIZ} characters "
                         f"({leaves * hpl} hosts is too many for the run prefix)")


def prefix_re(prefix: str) -> re.Pattern:
    """Exactly our nodes and their interfaces — nothing else matches."""
    return re.compile(rf"{re.escape(prefix)}[slh]\d+(-eth\d+)?")


def _b36(n: int, width: int = 3) -> str:
    out = ""
    for _ in range(width):
        n, d = divmod(n, 36)
        out = _B36[d] + out
    return out


# ------------------------------------------------------------------ ratios (pure)

def ratio(mininet: float | None, testbed: float | None, lower_bound: float | None = None) -> str:
    """Mininet ÷ testbed, e.g. ``12.3x``; ``>=`` when Mininet timed out (its time is then a lower bound)."""
    if not testbed or testbed <= 0:
        return "n/a"
    if mininet is not None:
        return _x(mininet / testbed)
    if lower_bound is not None:
        return ">=" + _x(lower_bound / testbed)
    return "n/a"


def _x(v: float) -> str:
    return f"{v:.0f}x" if v >= 100 else f"{v:.1f}x" if v >= 10 else f"{v:.2f}x"


def _t(value: float | None, lower: float | None) -> str:
    if value is not None:
        return f"{value:8.3f} s"
    if lower is not None:
        return f"> {lower:.1f} s (timed out)"
    return f"{'n/a':>8}  "


def format_run(m: MininetRun, testbed_up: float, testbed_down: float,
               testbed_down_kernel: float | None = None) -> str:
    """One line: Mininet's up/down and the ratios to the testbed's figures of the same run. Mininet's stop()
    deletes every link synchronously, so its down is also compared with the testbed's "kernel done"."""
    label = f"{LABELS[m.variant]:<12}"
    if m.up is None and not m.timed_out:
        return f"{label} failed: {m.error or 'no result'}"
    line = (f"{label} up {_t(m.up, m.up_lower)}  down {_t(m.down, m.down_lower)}   Mininet / testbed: "
            f"up {ratio(m.up, testbed_up, m.up_lower)}, down {ratio(m.down, testbed_down, m.down_lower)}"
            + (f" ({ratio(m.down, testbed_down_kernel, m.down_lower)} vs kernel done)"
               if testbed_down_kernel else ""))
    notes = []
    if m.timed_out:
        notes.append(f"timed out after {m.timeout:g} s (--mininet-timeout): that phase and its ratio are lower "
                     f"bounds")
    if m.error:
        notes.append(f"error: {m.error}")
    if m.ipv6_off:
        notes.append(f"{m.ipv6_off:.3f} s of IPv6-off writes excluded from up")
    if m.frames:
        notes.append(f"{m.frames} frames seen on the switch ports")
    if m.leftovers:
        notes.append(f"swept {m.leftovers} leftover shell(s)/interface(s) of run {m.prefix}")
    return line + ("  [" + "; ".join(notes) + "]" if notes else "")


# ------------------------------------------------------------------ installation (the setup step)

def missing() -> list[str]:
    """What the baseline needs and cannot find: the mininet module, mnexec, brctl."""
    importlib.invalidate_caches()
    out = []
    if importlib.util.find_spec("mininet") is None:
        out.append("python module mininet")
    for tool in ("mnexec", "brctl", "unshare"):
        if shutil.which(tool) is None:
            out.append(tool)
    return out


def _apt(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(["apt-get", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                          check=False)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def ensure_installed(say) -> str | None:
    """Install Debian's mininet (+ bridge-utils) when absent; None when ready, else why the baseline is skipped."""
    need = missing()
    if not need:
        return None
    if shutil.which("apt-get") is None:
        return f"{', '.join(need)} not found and there is no apt-get to install {' '.join(PACKAGES)}"
    say(f"Mininet baseline: {', '.join(need)} not found; apt-get install {' '.join(PACKAGES)} …")
    install = ["install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    r = _apt(install)
    if r.returncode != 0 and "Unable to locate package" in r.stdout + r.stderr:
        upd = _apt(["update", "-qq"])
        if upd.returncode != 0:
            return f"apt-get update failed: {_last_line(upd.stderr or upd.stdout)}"
        r = _apt(install)
    if r.returncode != 0:
        if "Unable to locate package" in r.stdout + r.stderr:
            return f"the Debian package {' / '.join(PACKAGES)} is not available from this machine's apt sources"
        return f"apt-get install {' '.join(PACKAGES)} failed: {_last_line(r.stderr or r.stdout)}"
    still = missing()
    if still:
        return f"{', '.join(still)} still missing after installing {' '.join(PACKAGES)}"
    say(f"Mininet baseline: installed {' '.join(PACKAGES)}")
    return None


# ------------------------------------------------------------------ the parent: one measurement, always cleaned

@dataclass
class MininetRun:
    variant: str
    hosts: int
    prefix: str
    timeout: float = DEFAULT_TIMEOUT
    version: str | None = None
    up: float | None = None            # s, None if not finished
    down: float | None = None
    up_lower: float | None = None      # timed out during up: it had run this long (a lower bound)
    down_lower: float | None = None
    error: str | None = None
    ipv6_off: float = 0.0              # s spent turning IPv6 off in the hosts (not Mininet's work: subtracted)
    frames: int | None = None          # frames seen on switch ports after up (should be 0: nothing is sent)
    leftovers: int = 0                 # shells/interfaces the parent swept after the child (0 unless it failed)

    @property
    def timed_out(self) -> bool:
        return self.up_lower is not None or self.down_lower is not None


def _cmdline(pid: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:            # the process exited while we looked
        return []


def shells(prefix: str) -> list[int]:
    """Pids of Mininet shells of this run (``bash … mininet:<prefix><s|l|h><n>``)."""
    pat = re.compile(rf"mininet:{re.escape(prefix)}[slh]\d+")
    return [int(p) for p in os.listdir("/proc") if p.isdigit()
            and any(pat.fullmatch(a) for a in _cmdline(p))]


def _links(prefix: str) -> list[tuple[int, str]]:
    from pyroute2 import IPRoute
    pat = prefix_re(prefix)
    with IPRoute() as ipr:
        return [(ln["index"], ln.get_attr("IFLA_IFNAME")) for ln in ipr.get_links()
                if pat.fullmatch(ln.get_attr("IFLA_IFNAME") or "")]


def sweep(prefix: str, wait: float = 5.0) -> int:
    """Kill this run's Mininet shells and delete its interfaces in our namespace; how many there were."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    found = 0
    for pid in shells(prefix):
        try:
            os.kill(pid, signal.SIGKILL)
            found += 1
        except ProcessLookupError:
            continue
    end = time.monotonic() + wait
    while shells(prefix):
        if time.monotonic() > end:
            raise RuntimeError(f"Mininet baseline: shells {shells(prefix)} of run {prefix} survived SIGKILL")
        time.sleep(0.02)
    links = _links(prefix)
    if links:
        with IPRoute() as ipr:
            for index, _name in links:
                try:
                    ipr.link("del", index=index)
                except NetlinkError as e:
                    if e.code != 19:          # ENODEV: it went with its veth peer
                        raise
    return found + len(links)


def new_prefix() -> str:
    """``fm`` + 3 base-36 chars from our pid and a counter, skipping any prefix that is in use."""
    global _seq
    for _ in range(36 ** 3):
        _seq += 1
        prefix = "fm" + _b36((os.getpid() * 64 + _seq) % 36 ** 3)
        if not shells(prefix) and not _links(prefix):
            return prefix
    raise RuntimeError("Mininet baseline: no free run prefix")


def measure(hosts: int, shape: tuple[int, int, int], variant: str,
            timeout: float = DEFAULT_TIMEOUT) -> MininetRun:
    """Build and tear down Mininet's version of the fabric in a subprocess; a timeout is a result, not an error."""
    if variant not in VARIANTS:
        raise ValueError(f"Mininet variant {variant!r}: use one of {', '.join(VARIANTS)}")
    spines, leaves, hpl = shape
    prefix = new_prefix()
    check_shape(prefix, spines, leaves, hpl)
    run = MininetRun(variant, hosts, prefix, timeout)
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    argv = ["unshare", "--net", "--", sys.executable, "-m", "testbed.bench.mininet", "--prefix", prefix,
            "--shape", f"{spines},{leaves},{hpl}", "--variant", variant,
            "--parent-netns", str(os.stat("/proc/self/ns/net").st_ino)]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env,
                                start_new_session=True, cwd=root)
        try:
            _follow(proc, run, timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            left = sweep(prefix)
        run.leftovers = left
        if run.error is None and not run.timed_out and (proc.returncode != 0 or run.down is None):
            err.seek(0)
            run.error = (f"exited with {proc.returncode} before reporting: "
                         f"{_last_line(err.read().decode(errors='replace'))}")
    return run


def _follow(proc: subprocess.Popen, run: MininetRun, timeout: float) -> None:
    """Read the child's events until it ends or ``timeout`` passes (then the running phase is a lower bound)."""
    deadline = time.monotonic() + timeout
    phase, since = "start", time.monotonic()
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                lower = time.monotonic() - since
                if phase == "down":
                    run.down_lower = lower
                else:                           # not started or building: Mininet's up took at least this
                    run.up_lower = lower
                return
            if not sel.select(min(left, 1.0)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if not text.startswith(EVENT):
                    continue
                ev = json.loads(text[len(EVENT):])
                kind = ev["event"]
                if kind == "start":
                    run.version, phase, since = ev["version"], "up", time.monotonic()
                elif kind == "up":
                    run.up, run.ipv6_off, run.frames = ev["seconds"], ev["ipv6_off"], ev["frames"]
                    phase, since = "down", time.monotonic()
                elif kind == "down":
                    run.down, phase = ev["seconds"], "done"
                elif kind == "error":
                    run.error = f"{run.error}; {ev['message']}" if run.error else ev["message"]


# ------------------------------------------------------------------ the child (runs in a private namespace)

def _emit(**kw) -> None:
    print(EVENT + json.dumps(kw), flush=True)


def _frames(prefix: str) -> int:
    """Frames received by this run's interfaces in this namespace (the switch ports)."""
    pat = prefix_re(prefix)
    total = 0
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, sep, rest = line.partition(":")
            if sep and pat.fullmatch(name.strip()):
                total += int(rest.split()[1])
    return total


def _quiet_here() -> None:
    """Nothing this namespace's devices would send on their own: IPv6 off (DAD, MLD, router solicitations) and
    no IGMP reports for 224.0.0.x groups (each bridge joins 224.0.0.106, all-snoopers, when it comes up)."""
    for path in ("/proc/sys/net/ipv6/conf/default/disable_ipv6", "/proc/sys/net/ipv6/conf/all/disable_ipv6"):
        if os.path.exists(path):            # no IPv6 in the kernel: nothing to turn off
            with open(path, "w") as f:
                f.write("1")
    with open("/proc/sys/net/ipv4/igmp_link_local_mcast_reports", "w") as f:
        f.write("0")


def _watchdog(prefix: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        n = _frames(prefix)
        if n > STORM_FRAMES:
            _emit(event="error", message=f"{n} frames on the switch ports though nothing was sent (a loop storm "
                                         f"in the bridges); stopped")
            os._exit(3)                     # the parent kills the shells; the namespace goes with them


def _child(prefix: str, shape: tuple[int, int, int], variant: str, parent_netns: int) -> int:
    if os.stat("/proc/self/ns/net").st_ino == parent_netns:
        _emit(event="error", message="not in a private network namespace (unshare --net failed); refused")
        return 2
    _quiet_here()
    from resource import RLIMIT_NOFILE, RLIMIT_NPROC

    from mininet.link import Link, TCLink
    from mininet.log import setLogLevel
    from mininet.net import VERSION, Mininet
    from mininet.node import Host
    from mininet.nodelib import LinuxBridge
    from mininet.topo import Topo
    from mininet.util import rlimitTestAndSet

    class QuietHost(Host):
        """A Mininet host whose namespace has IPv6 off before its interface arrives."""
        spent = 0.0

        def __init__(self, name, **params):
            super().__init__(name, **params)
            t = time.perf_counter()
            self.cmd("echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; "
                     "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6")
            QuietHost.spent += time.perf_counter() - t

    class LeafSpine(Topo):
        def build(self, spines, leaves, hpl, linkopts):
            snames, lnames, hnames = node_names(prefix, spines, leaves, hpl)
            ss = [self.addSwitch(n, stp=False) for n in snames]
            for i, ln in enumerate(lnames):
                leaf = self.addSwitch(ln, stp=False)
                for s in ss:
                    self.addLink(leaf, s, **linkopts)
                for h in hnames[i * hpl:(i + 1) * hpl]:
                    self.addLink(self.addHost(h), leaf, **linkopts)

    rlimitTestAndSet(RLIMIT_NPROC, 8192)      # what Mininet.init() → fixLimits() does to this process …
    rlimitTestAndSet(RLIMIT_NOFILE, 16384)
    Mininet.inited = True                     # … without its machine-wide sysctl writes
    setLogLevel("warning")
    link, linkopts = (TCLink, {"bw": BW_MBIT}) if variant == "tclink" else (Link, {})
    stop = threading.Event()
    threading.Thread(target=_watchdog, args=(prefix, stop), daemon=True).start()
    net, stopping = None, False
    _emit(event="start", version=VERSION)
    try:
        t0 = time.perf_counter()
        topo = LeafSpine(*shape, linkopts)
        net = Mininet(topo=topo, switch=LinuxBridge, host=QuietHost, controller=None, link=link, build=False)
        net.build()
        net.start()
        up = time.perf_counter() - t0 - QuietHost.spent
        _emit(event="up", seconds=up, ipv6_off=QuietHost.spent, frames=_frames(prefix))
        stopping = True
        td = time.perf_counter()
        net.stop()
        _emit(event="down", seconds=time.perf_counter() - td)
        end = time.monotonic() + 10             # stop() sent SIGHUP; let the shells exit before the parent sweeps
        while shells(prefix) and time.monotonic() < end:
            time.sleep(0.02)
    except Exception as e:                    # noqa: BLE001 — reported as one line; the parent sweeps
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        _emit(event="error", message=f"{type(e).__name__}: {msg}")
        return 1
    finally:
        stop.set()
        if net is not None and not stopping:
            try:
                net.stop()
            except Exception as e:        # noqa: BLE001 — reported; the parent sweeps what is left
                _emit(event="error", message=f"stop() after the failure failed too: {type(e).__name__}: {e}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One Mininet build + teardown (run by testbed bench; see module doc).")
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--shape", required=True, help="spines,leaves,hosts per leaf")
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--parent-netns", type=int, required=True)
    a = ap.parse_args(argv)
    spines, leaves, hpl = (int(x) for x in a.shape.split(","))
    return _child(a.prefix, (spines, leaves, hpl), a.variant, a.parent_netns)


if __name__ == "__main__":
    sys.exit(main())
