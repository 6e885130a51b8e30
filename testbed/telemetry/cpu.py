"""The CPU fidelity guard: was any core saturated by the emulation itself?

The emulated fabric forwards in softirq (veth → tc → bpf_redirect → qdisc), mostly on the core of the process
that sent the packet, and the traffic agents are Python processes. When one core saturates, packets wait for
CPU rather than for the emulated links, and the run measures the emulator, not the fabric. A whole-machine mean
hides one saturated core of two, and counting every process on the machine blames the run for other people's
work; so the guard measures **per core** and only what belongs to the lab:

    lab busy of core c in a sample = min(busy_c, softirq_c + irq_c + lab_c) / interval

busy/softirq/irq from /proc/stat (tick-sampled; HZ=250 here: 4 % steps over 100 ms), lab_c the CPU time the
lab's processes spent on core c, from a
cgroup-v1 ``cpuacct`` group the run's processes join (``LabCpuAccount``; agents, the PFC agent and captures are
forked into it). The min() absorbs softirq served in a lab process's context, which the kernel (no
IRQ_TIME_ACCOUNTING) counts in both. Without cpuacct (cgroup v2 hosts) the guard falls back to the cores' total
busy time and says so (``cpu_accounting``: "core-total").

In a virtual machine the hypervisor may run someone else on a core (``steal`` in /proc/stat): that time is lost
to the emulated links as surely as a saturated core, yet no process here used it. The lab's load is therefore
a share of the time the core actually had, ``(interval − steal_c)``, and the machine's steal share of every
sample is kept too (``cpu_steal``), so a run on a contended host is flagged rather than silently slow.
"""
from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_TICK = os.sysconf("SC_CLK_TCK")


def read_cores() -> list[tuple[float, float, float, float]]:
    """(busy, softirq + irq, total, steal) seconds since boot for every core, from /proc/stat (busy excludes
    steal)."""
    out = []
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                if out:
                    break
                continue
            v = [int(x) / _TICK for x in line.split()[1:9]]
            user, nice, system, idle, iowait, irq, softirq, steal = v
            total = sum(v)
            out.append((total - idle - iowait - steal, irq + softirq, total, steal))
    return out


def group_names() -> list[str]:
    """The labs that have a cpuacct cgroup (``ftb-<lab>``): running runs, and killed ones' leftovers."""
    try:
        return sorted(p.name[4:] for p in CPUACCT.iterdir() if p.is_dir() and p.name.startswith("ftb-"))
    except OSError:
        return []


def remove_group(name: str, timeout_s: float = 5.0) -> bool:
    """Remove lab ``name``'s cpuacct cgroup, which a killed ``testbed run`` leaves behind. The processes still in
    it are the lab's (a traffic agent entered into a container stays in it) and are SIGKILLed first; a group
    that holds the calling process is the caller's own run and is left alone. True when one was removed."""
    path = CPUACCT / f"ftb-{name}"
    if not path.is_dir():
        return False

    def procs() -> list[int]:
        try:
            return [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return []
    if os.getpid() in procs():
        return False
    end = time.monotonic() + timeout_s
    while (left := procs()) and time.monotonic() < end:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    try:
        path.rmdir()
    except FileNotFoundError:
        return False
    return True


class LabCpuAccount:
    """A cpuacct cgroup that this process (and everything it forks afterwards) joins for the life of a run, so
    the guard can tell the lab's CPU time per core from other processes'. ``available`` is False where there
    is no cgroup-v1 cpuacct (then ``why`` says so)."""

    def __init__(self, name: str, shared: bool = False):
        self.path = CPUACCT / f"ftb-{name}"
        self.shared = shared            # the parts of a split run on one machine share it: the last out removes it
        self.available = False          # this process is in the group now
        self.joined = False             # it was, for the run (stays True after leaving)
        self.why = ""
        self._home: Path | None = None

    def __enter__(self) -> "LabCpuAccount":
        if not (CPUACCT / "cpuacct.usage_percpu").exists():
            self.why = "no cgroup-v1 cpuacct hierarchy: per-core load includes other processes"
            return self
        home = next((ln.split(":", 2)[2].strip() for ln in Path("/proc/self/cgroup").read_text().splitlines()
                     if ln.split(":", 2)[1] == "cpuacct" or "cpuacct" in ln.split(":", 2)[1].split(",")), "/")
        try:
            self.path.mkdir(exist_ok=True)
            (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError as e:
            self.why = f"cannot join a cpuacct cgroup ({e.strerror}): per-core load includes other processes"
            return self
        self._home = CPUACCT / home.lstrip("/")
        self.available = self.joined = True
        return self

    def usage(self) -> list[float]:
        """CPU seconds the group's processes used on each core so far."""
        return [int(x) / 1e9 for x in (self.path / "cpuacct.usage_percpu").read_text().split()]

    def __exit__(self, *exc) -> None:
        if not self.available:
            return
        (self._home / "cgroup.procs").write_text(f"{os.getpid()}\n")
        try:
            self.path.rmdir()
        except OSError as e:         # a process of the run still in it: leave the group, say why
            if self.shared and e.errno == errno.EBUSY:  # another part of the run: it removes the group
                self.available = False
                return
            self.why = f"cgroup {self.path} not removed ({e.strerror}); `testbed clean` removes it"
        self.available = False


@dataclass
class CpuGuard:
    """Samples the per-core load of the lab; ``result()`` is the guard's verdict for the summary."""
    account: LabCpuAccount | None = None
    origin: float = 0.0                                   # time.time() of the run's start
    samples: list[tuple[float, list[float]]] = field(default_factory=list)   # (time_s, lab busy per core)
    steal: list[tuple[float, float]] = field(default_factory=list)           # (time_s, machine steal share)
    _last: tuple | None = None

    def sample(self) -> None:
        now = time.time()
        cores = read_cores()
        lab = self.account.usage() if self.account is not None and self.account.available else None
        if self._last is not None:
            t0, c0, l0 = self._last
            busy, stolen, span = [], 0.0, 0.0
            for i, ((b, si, tot, st), (b0, si0, tot0, st0)) in enumerate(zip(cores, c0)):
                dt, lost = tot - tot0, st - st0
                stolen, span = stolen + lost, span + max(dt, 0.0)
                if dt - lost <= 0:
                    busy.append(0.0 if dt <= 0 else 1.0)      # the whole interval stolen: nothing ran
                    continue
                own = (si - si0) + (lab[i] - l0[i]) if lab is not None else b - b0
                busy.append(min(min(b - b0, own) / (dt - lost), 1.0))
            self.samples.append((now - self.origin, busy))
            self.steal.append((now - self.origin, stolen / span if span > 0 else 0.0))
        self._last = (now, cores, lab)

    def result(self) -> dict:
        """The samples, for the summary (report/summary.py judges them over the traffic window)."""
        accounting = "cgroup" if self.account is not None and self.account.joined else "core-total"
        return {"cpu_accounting": accounting,
                "cpu_samples": [[round(t, 4), [round(b, 4) for b in busy]] for t, busy in self.samples],
                "cpu_steal": [[round(t, 4), round(f, 4)] for t, f in self.steal]}
