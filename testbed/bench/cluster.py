"""Benchmark of a fabric over several machines, on the local Ray cluster (`testbed cluster up --local 2`):

- build: a 1,024-host leaf–spine (8 spines × 32 leaves × 32 hosts, as `bench build`) built over 2 machines
  (placement auto) vs over 1 machine of the same cluster, in the same run: up (every part built, in parallel)
  and down (every part torn down);
- pps: 64-byte UDP from h0 through leaf0 → spine0 → leaf1 to h1 (10 Gbit/s links) where the spine0–leaf1 link is
  cut (a VXLAN pair over the underlay) vs the same fabric on one machine (every link a veth), alternated rounds,
  medians. The local cluster's machines share this machine's cores: the ratios show what the cut costs, not
  what a second real machine would add.
"""
from __future__ import annotations

import socket
import statistics
import sys
import threading
import time

from .. import scenario as scenario_mod
from ..fabric import netns
from .common import shape_for

PPS_PAYLOAD = 36


def _scen(doc: dict):
    return scenario_mod.from_dict(doc)


def _build_doc(parts: int) -> dict:
    spines, leaves, hpl = shape_for(1024)
    return {"name": "benchcluster", "topology": {"spines": spines, "leaves": leaves, "hosts_per_leaf": hpl,
                                                 "host_link": {"rate": "100mbit"}, "fabric_link": {"rate": "100mbit"}},
            "placement": {"partitions": parts}}


def measure_build(parts: int) -> tuple[float, float, int]:
    """(up s, down s, cut links) of the 1,024-host fabric over ``parts`` machines."""
    from ..cluster.run import ClusterLab
    cl = ClusterLab(_scen(_build_doc(parts)), "auto")
    t = time.perf_counter()
    cl.__enter__()
    up = time.perf_counter() - t
    t = time.perf_counter()
    problems = cl.close()
    down = time.perf_counter() - t
    if problems:
        raise RuntimeError(problems[0])
    return up, down, len(cl.part.cut)


def _pps_doc(cut: bool) -> dict:
    fast = {"rate": "10gbit", "buffer": "1MB"}
    doc = {"name": "benchclusterpps", "topology": {"spines": 1, "leaves": 2, "hosts_per_leaf": 1, "host_link": fast,
                                                   "fabric_link": fast}}
    doc["placement"] = ({"partitions": 2, "strategy": "manual", "assign": {"leaf0": 0, "spine0": 0, "leaf1": 1}}
                        if cut else {"partitions": 1})
    return doc


def _blast(cl, seconds: float) -> float:
    """Packets/s received by h1 while h0 sends 64-byte datagrams as fast as one Python loop can."""
    topo = cl.topo
    dst = topo.address("h1")
    got = [0]
    stop = threading.Event()
    ready = threading.Event()

    def recv():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((dst, 9500))
        s.settimeout(0.2)
        ready.set()
        while not stop.is_set():
            try:
                s.recv(2048)
                got[0] += 1
            except socket.timeout:
                continue
        s.close()

    def send():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((topo.address("h0"), 40000))
        payload = bytes(PPS_PAYLOAD)
        end = time.perf_counter() + seconds + 0.3
        while time.perf_counter() < end:
            s.sendto(payload, (dst, 9500))
        s.close()
    r = threading.Thread(target=netns.run_in, args=(cl.ns_of("h1"), recv))
    r.start()
    ready.wait(5)
    time.sleep(0.1)
    sender = threading.Thread(target=netns.run_in, args=(cl.ns_of("h0"), send))
    sender.start()
    time.sleep(0.3)                      # warm-up
    n0, t0 = got[0], time.perf_counter()
    time.sleep(seconds)
    n1, t1 = got[0], time.perf_counter()
    sender.join()
    stop.set()
    r.join()
    return (n1 - n0) / (t1 - t0)


def print_cluster(seconds: float = 3.0, rounds: int = 3, out=None) -> None:
    from ..cluster import connect
    from ..cluster.run import ClusterLab
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out, flush=True)     # noqa: E731
    connect("auto")
    p("== build: 1,024 hosts (8 spines x 32 leaves x 32 hosts, TBF on every port, eBPF on every switch port) "
      "over the local cluster ==")
    res = {}
    for parts in (1, 2):
        res[parts] = measure_build(parts)
        up, down, cut = res[parts]
        p(f"  {parts} machine(s): up {up:6.2f} s   down {down:6.2f} s   cut links {cut}")
    p(f"  2 machines / 1: up {res[2][0] / res[1][0]:.2f}x, down {res[2][1] / res[1][1]:.2f}x")
    p(f"== packets/s h0 -> leaf0 -> spine0 -> leaf1 -> h1 (10 Gbit/s, {PPS_PAYLOAD + 28}-byte UDP, Python sender; "
      f"{rounds} alternated rounds x {seconds:g} s, medians) ==")
    labs = {cut: ClusterLab(_scen(_pps_doc(cut)), "auto").__enter__() for cut in (False, True)}
    samples: dict[bool, list[float]] = {False: [], True: []}
    try:
        for i in range(rounds):
            for cut in ((False, True) if i % 2 == 0 else (True, False)):
                samples[cut].append(_blast(labs[cut], seconds))
    finally:
        for cl in labs.values():
            cl.close()
    local, cut = statistics.median(samples[False]), statistics.median(samples[True])
    p(f"  local link (veth)     pps {local:>9,.0f}   rounds: " + ", ".join(f"{x:,.0f}" for x in samples[False]))
    p(f"  cut link (VXLAN)      pps {cut:>9,.0f}   rounds: " + ", ".join(f"{x:,.0f}" for x in samples[True]))
    p(f"  cut / local: {cut / local:.3f}x")


__all__ = ["measure_build", "print_cluster"]
