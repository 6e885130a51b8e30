"""Benchmarks with baselines measured in the same run (``testbed bench``, ``bench/*.py``).

Two measurements, each printed next to a baseline taken in the same process a moment earlier or later, because
absolute times on a shared 2-core VM move by tens of percent from one minute to the next:

``print_build(sizes)``
    Build + teardown of leaf–spine fabrics of the given host counts — or of fat-trees, sizes ``ft<k>``
    (``ft16``: 1,024 hosts, 320 switches, 3,072 links) — exactly as a lab does it: namespaces,
    veth pairs, TBF on both ends of every link, addresses, routes, offloads off, then the eBPF datapath compiled,
    loaded and attached to every switch port. Per phase (``Fabric.timings``), the datapath compile/load, total
    up and down, and "kernel done": teardown returns once the namespaces are unmounted, but the kernel destroys
    them later on its ``netns`` workqueue (``cleanup_net``); done is when a sentinel namespace deleted right after
    the fabric has lost its veth (see ``Sentinel``). Same-run baseline: the kernel floor (the
    same namespaces and veth pairs, set up, nothing else — no qdisc, address, route, offload, BPF), built twice:
    its up with the kernel's default link-up (IPv6 link-local addresses; no extra request), its down without
    IPv6 addresses (as the fabric; nothing more to remove) — for each direction the faster way.
    The goals (GOAL_*) are printed next to the figures. With ``vs="mininet"`` (``--vs mininet``), Debian's
    Mininet builds and tears down the same shapes right after the testbed at each size, plain and with TCLink
    shaping (``testbed/bench/mininet.py``), and the ratios Mininet ÷ testbed come from those same-run figures.

``print_pps(seconds)``
    Packets/s and CPU per packet through h0 → leaf0 → spine → leaf1 → h1 of a 2 spines × 2 leaves × 1 host
    fabric at 10 Gbit/s (so the CPU, not the shaper, is the limit), (a) with the eBPF switch program and
    (b) with plain kernel IP forwarding (multipath routes), two fabrics built side by side, traffic alternated
    between them for a few rounds, medians compared. A Python ``send`` loop in h0's namespace sends 64-byte UDP
    datagrams; h1 counts them (interface rx counter, read through /proc/thread-self/net/dev in h1's namespace)
    and drops them at a socket that is never read. The sender is pinned to the last CPU, and veth delivers in
    softirq on the sending CPU, so the whole path runs there: CPU per packet = that CPU's (system + irq +
    softirq) time from /proc/stat over the window ÷ packets received ("all CPU" adds user time, i.e. the
    Python sender). It includes the sender's syscall path, which is the same in both modes.
"""
from __future__ import annotations

from .build import BuildResult, Sentinel, measure_build, measure_floor, measure_up_overlapped, print_build
from .common import (FREE_TIMEOUT, GOAL_DOWN, GOAL_FAT_TREE_FLOOR, GOAL_PPS_RATIO, GOAL_UP_1024, GOAL_UP_128,
                     LAB_PREFIX, SHAPES, bench_namespaces, bench_scenario, default_ports, parse_sizes, shape_for)
from .pps import PpsSample, measure_pps, print_pps

__all__ = ["BuildResult", "PpsSample", "bench_namespaces", "bench_scenario", "measure_build", "measure_floor",
           "measure_pps", "parse_sizes", "print_build", "print_pps", "shape_for", "Sentinel"]
