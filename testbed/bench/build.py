"""Build and teardown of whole fabrics against the same-run kernel floor (``testbed bench build``; the
package docstring says what is measured)."""
from __future__ import annotations

import os
import socket
import statistics
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

from .. import topology
from ..fabric import netns
from ..fabric import Fabric
from ..fabric.netlink import Batch
from .common import (FREE_TIMEOUT, GOAL_DOWN, GOAL_FAT_TREE_FLOOR, GOAL_UP_1024, GOAL_UP_128, LAB_PREFIX,
                     bench_scenario, default_ports, shape_for)


RTM_GETLINK = 18


class Sentinel:
    """Tells when the kernel has really destroyed namespaces that were deleted before ``fire()``.

    ``netns.delete`` returns once the namespaces are unmounted; the kernel destroys them later, in batches, on
    its ordered ``netns`` workqueue (``cleanup_net`` takes every namespace queued so far and unregisters all
    their devices in one go). The sentinel is a namespace holding one end of a veth pair whose other end lives
    in a watcher namespace (kept alive by our netlink socket). ``fire()`` deletes the sentinel the same way,
    after the fabric; when the watcher's end has vanished, the kernel has run the device teardown of the batch
    holding the sentinel — and so of every namespace queued before it. Unlike counting namespaces system-wide,
    other processes creating or deleting namespaces at the same time cannot fool it (they can only delay it,
    which is real contention)."""

    IFINDEX = 10

    def __init__(self, lab: str):
        self.watch, self.sent = f"{netns.PREFIX}{lab}-watch", f"{netns.PREFIX}{lab}-sentinel"
        self.sock: socket.socket | None = None
        self._seq = 0
        netns.create([self.watch, self.sent])
        try:
            self.sock = netns.netlink_socket(self.watch)
            ssock = netns.netlink_socket(self.sent)
            fd = os.open(netns.path(self.watch), os.O_RDONLY)
            try:
                b = Batch(ssock, self.sent)
                b.veth("sentinel", self.IFINDEX, "02:fb:ff:00:00:0a", 1500, "watch", self.IFINDEX + 1,
                       "02:fb:ff:00:00:0b", fd)
                b.commit()
            finally:
                os.close(fd)
                ssock.close()
        except BaseException:
            self.close()
            raise

    def _peer_exists(self) -> bool:
        self._seq += 1
        req = struct.pack("IHHII", 32, RTM_GETLINK, 1, self._seq, 0) + struct.pack("BxHiII", 0, 0,
                                                                                    self.IFINDEX + 1, 0, 0)
        self.sock.send(req)
        while True:
            reply = self.sock.recv(65536)
            _len, mtype, _fl, seq, _pid = struct.unpack_from("IHHII", reply, 0)
            if seq != self._seq:
                continue
            if mtype == 2:                                   # NLMSG_ERROR
                return struct.unpack_from("i", reply, 16)[0] == 0
            return True                                      # RTM_NEWLINK: still there

    def fire(self, t0: float, timeout: float = FREE_TIMEOUT) -> float | None:
        """Delete the sentinel now; seconds from ``t0`` until its veth is gone (None after ``timeout``)."""
        netns.delete([self.sent])
        while True:
            now = time.perf_counter()
            if not self._peer_exists():
                return now - t0
            if now - t0 > timeout:
                return None
            time.sleep(0.002)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        netns.delete([self.sent, self.watch])


# ------------------------------------------------------------------ build benchmark
DISTURBED_CORES = 0.15    # others' mean use during an overlapped up beyond which it is not the build's figure
@dataclass
class BuildResult:
    hosts: int
    shape: tuple                # (spines, leaves, hosts per leaf) of a leaf-spine size; () for a fat-tree
    namespaces: int
    veths: int
    size: object = None         # as given: a host count or "ft<k>"
    label: str = ""
    phases: dict[str, float] = field(default_factory=dict)   # Fabric.timings + compile, load
    up: float = 0.0             # build + datapath load + attach
    up_fabric: float = 0.0      # build + attach (datapath compile/load excluded)
    down: float = 0.0           # fabric.teardown() + datapath.close()
    down_kernel: float | None = None   # until the kernel has destroyed the namespaces
    floor_up: float = 0.0       # kernel floor: namespaces + veth pairs (+ up)
    floor_down: float = 0.0
    floor_down_kernel: float | None = None
    up_overlapped: float | None = None   # datapath compiled in a thread while the fabric builds
    others_cores: float | None = None    # cores other processes computed on meanwhile (user time, mean)
    mininet: dict = field(default_factory=dict)   # variant → mininet.MininetRun, measured in the same run
    runs: list = field(default_factory=list)      # a median's runs (print_build with repeat > 1)

    @property
    def disturbed(self) -> bool:
        """Other processes took the second core the overlapped compile needs (≥ DISTURBED_CORES of it): the
        overlapped up measures the machine, not the build; the single-threaded ratios stay comparable."""
        return self.others_cores is not None and self.others_cores >= DISTURBED_CORES

    @property
    def up_lab(self) -> float:
        """Up as a lab does it: the datapath compiled during the build when that was measured."""
        return self.up_overlapped if self.up_overlapped is not None else self.up

    def ratios(self) -> dict[str, float | None]:
        """This run's figures ÷ its own floor (None where either is missing)."""
        def r(x, y):
            return x / y if x and y else None
        return {"up": r(self.up_lab, self.floor_up), "up_sequential": r(self.up, self.floor_up),
                "up_fabric": r(self.up_fabric, self.floor_up), "down": r(self.down, self.floor_down),
                "down_kernel": r(self.down_kernel, self.floor_down_kernel)}

    def ratio_median(self, key: str) -> tuple[float | None, float | None, float | None]:
        """(median, min, max) of the per-run ratios ``key`` (one run: that run's ratio three times)."""
        vals = [x for x in (r.ratios()[key] for r in (self.runs or [self])) if x is not None]
        if not vals:
            return None, None, None
        return statistics.median(vals), min(vals), max(vals)


def measure_floor(topo, lab: str, ipv6_addresses: bool = True) -> tuple[float, float, float | None]:
    """Same namespaces and veth pairs as the fabric, set up, nothing else, built the fabric's fastest way: worker
    threads make the namespaces and each opens its namespace's netlink socket, one batched send per namespace for
    the veth pairs and one for link-up. ``ipv6_addresses``: the kernel's default, a link-local address on every
    port (the faster up: no extra request); False: addr_gen_mode none first, as the fabric (the faster down:
    nothing to remove). Returns (up, down, down until kernel done)."""
    names = {n: f"{netns.PREFIX}{lab}-{n}" for n in topo.nodes}
    netns.raise_nofile(4 * len(names) + 1024)
    socks: dict[str, socket.socket] = {}
    fds: dict[str, int] = {}
    sentinel = Sentinel(lab)
    t0 = time.perf_counter()
    try:
        made = netns.create(names.values(), netlink=True)
        socks = {n: made[name] for n, name in names.items()}
        batches = {n: Batch(socks[n], names[n]) for n in names}
        for link in topo.links:
            a, b = link.a, link.b
            if b.node not in fds:
                fds[b.node] = os.open(netns.path(names[b.node]), os.O_RDONLY)
            batches[a.node].veth(a.ifname, a.ifindex, a.mac, topo.spec.mtu, b.ifname, b.ifindex, b.mac,
                                 fds[b.node])
        for bt in batches.values():
            bt.commit()
        for n, ports in topo.ports.items():
            for p in ports:
                if not ipv6_addresses:
                    batches[n].no_ipv6_address(p.ifindex, p.ifname)
                batches[n].link_up(p.ifindex, p.ifname)
        for bt in batches.values():
            bt.commit()
        up = time.perf_counter() - t0
    finally:
        try:
            for fd in fds.values():
                os.close(fd)
            td = time.perf_counter()
            for s in socks.values():
                s.close()
            netns.delete(names.values())
            down = time.perf_counter() - td
            done = sentinel.fire(td)
        finally:
            sentinel.close()
    return up, down, done


def _build_sequential(size, lab: str, res: BuildResult) -> None:
    """The fabric built, then the datapath compiled, loaded and attached (per-phase times), then torn down."""
    from ..datapath import Datapath
    scen, _shape, _label = bench_scenario(size)
    topo = topology.build(scen.topology)
    fabric = Fabric(topo, lab, default_ports(topo))
    dp = None
    sentinel = Sentinel(lab)
    try:
        t0 = time.perf_counter()
        fabric.build()
        t1 = time.perf_counter()
        dp = Datapath(topo, scen.switch).load()
        t2 = time.perf_counter()
        fabric.attach_ingress(dp.ingress_fd, dp.ingress_name)
        fabric.attach_nic_release(dp.nic_release_fd)
        t3 = time.perf_counter()
        res.up, res.up_fabric = t3 - t0, (t1 - t0) + (t3 - t2)
        res.phases["dp_compile"] = dp.compile_seconds or 0.0
        res.phases["dp_load"] = (t2 - t1) - res.phases["dp_compile"]
    finally:
        try:
            td = time.perf_counter()
            try:
                fabric.teardown()
            finally:
                if dp is not None:
                    dp.close()
            res.down = time.perf_counter() - td
            res.down_kernel = sentinel.fire(td)
        finally:
            sentinel.close()
    res.phases.update(fabric.timings)


def measure_build(size, lab: str | None = None, floor: bool = True, overlap: bool = True,
                  reverse: bool = False) -> BuildResult:
    """One run at ``size`` (a leaf-spine host count or "ft<k>"): the fabric built with the datapath compiled
    after it (per-phase times, up, down), the kernel floor, and the fabric built with the datapath compiled
    during the build as a lab does — in this order, or reversed with ``reverse`` (print_build alternates, so
    neither the fabric nor the floor always comes first). Each waits for the kernel to finish destroying the
    previous one's namespaces."""
    scen, shape, label = bench_scenario(size)
    topo = topology.build(scen.topology)
    lab = lab or f"{LAB_PREFIX}{size}"
    res = BuildResult(len(topo.hosts), shape, len(topo.nodes), len(topo.links), size, label)

    def floor_step():
        # the floor built both ways, each direction taken from the way that is faster by construction: the
        # kernel's default link-up (IPv6 link-local addresses, no extra request) for up, the fabric's way (no
        # IPv6 address: nothing more to remove) for down (measured at ft16: 1.83-1.99 vs 2.01-2.16 s up,
        # 0.44-0.52 vs 0.52-0.59 s down)
        order = (True, False) if not reverse else (False, True)
        ways = {v6: measure_floor(topo, f"{lab}f"[:12], v6) for v6 in order}
        res.floor_up = ways[True][0]
        res.floor_down, res.floor_down_kernel = ways[False][1], ways[False][2]

    def overlap_step():
        res.up_overlapped, res.others_cores = measure_up_overlapped(size, f"{lab}o"[:12])
    steps = [lambda: _build_sequential(size, lab, res)] + ([floor_step] if floor else []) \
        + ([overlap_step] if overlap else [])
    for step in (reversed(steps) if reverse else steps):
        step()
    return res


def user_seconds() -> tuple[float, float]:
    """(the machine's user CPU seconds, this process's and its reaped children's): over a span, their
    difference is what other processes computed (kernel time is left out: the fabric's own work shows there)."""
    from .capacity import cpu_now
    own = os.times()
    return cpu_now()["user"], own.user + own.children_user


def measure_up_overlapped(size, lab: str | None = None) -> tuple[float, float]:
    """(up time, cores other processes used meanwhile) when the datapath is compiled and loaded in a thread
    while the fabric is built (BCC's compile runs in C and releases the GIL), as ``Lab.__enter__`` does."""
    from ..datapath import Datapath
    scen, _shape, _label = bench_scenario(size)
    topo = topology.build(scen.topology)
    fabric = Fabric(topo, lab or f"{LAB_PREFIX}{size}o", default_ports(topo))
    box: dict = {}

    def load():
        try:
            box["dp"] = Datapath(topo, scen.switch).load()
        except BaseException as e:      # noqa: BLE001 — re-raised below
            box["error"] = e
    sentinel = Sentinel(fabric.lab)
    try:
        machine0, own0 = user_seconds()
        t0 = time.perf_counter()
        th = threading.Thread(target=load)
        th.start()
        try:
            fabric.build()
        finally:
            th.join()
        if "error" in box:
            raise box["error"]
        fabric.attach_ingress(box["dp"].ingress_fd, box["dp"].ingress_name)
        fabric.attach_nic_release(box["dp"].nic_release_fd)
        up = time.perf_counter() - t0
        machine1, own1 = user_seconds()
        return up, max(0.0, (machine1 - machine0) - (own1 - own0)) / up
    finally:
        try:
            td = time.perf_counter()
            fabric.teardown()
            if "dp" in box:
                box["dp"].close()
            sentinel.fire(td)            # let the kernel finish before the next measurement
        finally:
            sentinel.close()


PHASES = ("namespaces", "links", "config", "offloads", "dp_compile", "dp_load", "attach", "nic_release",
          "teardown")


def _s(x: float | None, width: int = 7) -> str:
    return f"{'n/a':>{width}}" if x is None else f"{x:>{width}.3f}"


def _r(x: float | None, y: float | None) -> str:
    return "n/a" if not x or not y else f"{x / y:.2f}x"


def _median_result(runs: list[BuildResult]) -> BuildResult:
    """Per-field medians over repeated runs (a phase median need not come from the same run as the total)."""
    if len(runs) == 1:
        return runs[0]
    r0 = runs[0]

    def med(vals):
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None
    out = BuildResult(r0.hosts, r0.shape, r0.namespaces, r0.veths, r0.size, r0.label, runs=list(runs))
    out.phases = {k: med([r.phases.get(k) for r in runs]) for k in r0.phases}
    for name in ("up_overlapped", "others_cores", "up", "up_fabric", "down", "down_kernel", "floor_up", "floor_down",
                 "floor_down_kernel"):
        setattr(out, name, med([getattr(r, name) for r in runs]))
    return out


def print_build(sizes: list, repeat: int = 1, floor: bool = True, overlap: bool = True,
                out=None, vs: str | None = None, mininet_timeout: float | None = None) -> list[BuildResult]:
    """Measure and print the build benchmark; returns the (median) result per size.

    ``vs="mininet"``: install Debian's Mininet if absent (one line says why the baseline is skipped if that
    fails) and measure it at each size right after the testbed, so every ratio printed comes from this run."""
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out, flush=True)     # noqa: E731
    if vs not in (None, "mininet"):
        raise ValueError(f"unknown baseline {vs!r} (use --vs mininet)")
    mn = None
    if vs == "mininet":
        from . import mininet as mn
        timeout = mininet_timeout or mn.DEFAULT_TIMEOUT
        for size in sizes:
            if not isinstance(size, int):
                raise ValueError(f"--vs mininet: the Mininet baseline builds leaf-spine sizes (host counts), "
                                 f"not {size}")
            mn.check_shape("fm000", *shape_for(size))
        why = mn.ensure_installed(p)
        if why:
            p(f"Mininet baseline skipped: {why}; the testbed's own figures follow")
            mn = None
    results = []
    p(f"== build + teardown: TBF on both ends of every link, eBPF on every switch port "
      f"({repeat} run{'s' if repeat > 1 else ''} per size{', median' if repeat > 1 else ''}) ==")
    if mn:
        p(f"   vs Mininet: Debian's mininet builds and tears down the same shape right after the testbed at each "
          f"size (one run each, timeout {timeout:g} s); ratios = Mininet / testbed, both from this run")
    for size in sizes:
        runs = [measure_build(size, floor=floor, overlap=overlap, reverse=i % 2 == 1) for i in range(repeat)]
        r = _median_result(runs)
        results.append(r)
        hosts = r.hosts if isinstance(size, int) else None
        p(f"\n{r.label}: {r.namespaces} namespaces, {r.veths} veth pairs")
        p("  phase (s):  " + "  ".join(f"{k}={r.phases.get(k, 0.0):.3f}" for k in PHASES))
        p(f"  up   {_s(r.up)} s  (fabric+attach {_s(r.up_fabric).strip()} s, datapath compile+load "
          f"{r.phases['dp_compile'] + r.phases['dp_load']:.3f} s)")
        if r.up_overlapped is not None:
            p(f"  up   {_s(r.up_overlapped)} s  with the datapath compiled during the build (a thread, as "
              f"Lab.__enter__ does): {_r(r.up_overlapped, r.up)} of sequential")
        p(f"  down {_s(r.down)} s  returned; kernel done destroying namespaces after {_s(r.down_kernel).strip()} s")
        if floor:
            p(f"  same-run kernel floor (namespaces + veth pairs, up; no qdisc/address/route/BPF; up with IPv6 "
              f"link-local addresses, down without: the faster way each): "
              f"up {r.floor_up:.3f} s, down {r.floor_down:.3f} s (kernel done {_s(r.floor_down_kernel).strip()} s)")
            p(f"    ratio to floor: up {_m(r, 'up')}, sequential {_m(r, 'up_sequential')} (fabric+attach "
              f"{_m(r, 'up_fabric')}), down {_m(r, 'down')}, kernel done {_m(r, 'down_kernel')}"
              + (f"  (median of the {len(runs)} runs' own ratios, min-max)" if len(runs) > 1 else ""))
            if len(runs) > 1:
                for i, x in enumerate(runs):
                    q = x.ratios()
                    p(f"    run {i + 1}{' (floor first)' if i % 2 else ''}: up {_s(x.up_lab).strip()} / floor "
                      f"{_s(x.floor_up).strip()} s = {_f(q['up'])}, down {_s(x.down).strip()} / "
                      f"{_s(x.floor_down).strip()} s = {_f(q['down'])}, kernel done {_f(q['down_kernel'])}"
                      + _others(x))
            elif r.others_cores is not None:
                p(f"   {_others(r)}")

        if size == "ft16" and floor:
            _fat_tree_goal(p, r)
        if hosts == 1024:
            p(f"  goal: up <= {GOAL_UP_1024:.1f} s -> {'met' if r.up <= GOAL_UP_1024 else 'NOT met'} "
              f"({r.up:.2f} s = {r.up / GOAL_UP_1024:.2f}x the goal); down <= {GOAL_DOWN:.1f} s -> "
              f"{'met' if r.down <= GOAL_DOWN else 'NOT met'} ({r.down:.2f} s returned"
              + (f", {r.down_kernel:.2f} s until the kernel is done)" if r.down_kernel else ")"))
        elif hosts == 128:
            p(f"  goal: up <= {GOAL_UP_128:.1f} s -> {'met' if r.up <= GOAL_UP_128 else 'NOT met'} "
              f"({r.up:.3f} s; fabric+attach without compile {r.up_fabric:.3f} s); down <= {GOAL_DOWN:.1f} s -> "
              f"{'met' if r.down <= GOAL_DOWN else 'NOT met'}")
        if mn:
            _print_mininet(p, mn, r, timeout)
    return results


def _others(r: BuildResult) -> str:
    if r.others_cores is None:
        return ""
    return (f"; other processes used {r.others_cores:.2f} cores during the overlapped up"
            + (" (disturbed: the overlap's second core was taken)" if r.disturbed else ""))


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _m(r: BuildResult, key: str) -> str:
    """A ratio to the floor: the run's own, or the median of the runs' own ratios with their range."""
    med, lo, hi = r.ratio_median(key)
    if med is None or len(r.runs) < 2:
        return _f(med)
    return f"{med:.2f}x ({lo:.2f}-{hi:.2f})"


def _fat_tree_goal(p, r: BuildResult) -> None:
    """The goal for fat-tree k=16: up and down within 1.3x the same-run kernel floor (with repeats: the
    median of the runs' own ratios). Up is judged on the lab's own path (datapath compiled while the fabric
    builds); the sequential figure is printed beside."""
    g = GOAL_FAT_TREE_FLOOR

    def verdict(key):
        med = r.ratio_median(key)[0]
        return "met" if med is not None and med <= g else "NOT met"
    p(f"  goal: <= {g:.1f}x the same-run floor -> up {_m(r, 'up')} "
      f"({'compile overlapped, as a lab does' if r.up_overlapped is not None else 'sequential'}) "
      f"{verdict('up')}; sequential up {_m(r, 'up_sequential')}, fabric+attach {_m(r, 'up_fabric')}; "
      f"down {_m(r, 'down')} {verdict('down')}, kernel done {_m(r, 'down_kernel')} {verdict('down_kernel')}"
      + ("; every run disturbed by other processes: the overlapped up measured the machine, judge fabric+attach"
         if r.runs and all(x.disturbed for x in r.runs) else ""))


def _print_mininet(p, mn, r: BuildResult, timeout: float) -> None:
    """Mininet's two variants at this size, measured now, next to the testbed's figures just measured."""
    for variant in mn.VARIANTS:
        m = mn.measure(r.hosts, r.shape, variant, timeout)
        _settle(f"{LAB_PREFIX}{r.hosts}m")
        r.mininet[variant] = m
        if variant == mn.VARIANTS[0]:
            p(f"  Mininet {m.version or '(version not reported)'} same run (Linux bridges, STP off, no controller; "
              f"up = Mininet()+build+start, down = stop() returned) vs the testbed's up {r.up:.3f} s / down "
              f"{r.down:.3f} s "
              f"(kernel done {_s(r.down_kernel).strip()} s) above:")
        p("    " + mn.format_run(m, r.up, r.down, r.down_kernel))


def _settle(lab: str) -> None:
    """Wait until the kernel has destroyed the namespaces a baseline left queued, before the next measurement."""
    sentinel = Sentinel(lab)
    try:
        sentinel.fire(time.perf_counter())
    finally:
        sentinel.close()


# ------------------------------------------------------------------ packets/s benchmark
