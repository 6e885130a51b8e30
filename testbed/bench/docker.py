"""``testbed bench docker``: what Docker containers as hosts cost, against namespace hosts in the same run.

For each size (a leaf–spine host count, ``shape_for``), the same fabric is built and torn down with namespace
hosts (the baseline) and with every host a container of ``fabric-testbed/host``, alternated for ``rounds``
rounds; medians are printed with the ratios. Measured: up = the containers started (container hosts only) +
``Fabric.build`` (namespaces, veths, shaping, addresses, routes, offloads); down = ``Fabric.teardown`` + the
containers removed. The eBPF datapath is left out: it is the same for both and compiled while the fabric is
built. Then the host image's build (``docker import`` of the package root filesystem) into a scratch tag,
removed afterwards, so the image labs use is untouched.
"""
from __future__ import annotations

import statistics
import time

from .. import topology
from ..fabric import Fabric
from .common import LAB_PREFIX, bench_scenario, default_ports


def measure(size: int, docker: bool) -> tuple[float, float, dict]:
    """(up s, down s, phases) of one build + teardown of ``size`` hosts, containers as hosts when ``docker``."""
    from ..container.hosts import ContainerHosts
    from ..container.image import IMAGE
    scen, _shape, _label = bench_scenario(size)
    topo = topology.build(scen.topology)
    lab = f"{LAB_PREFIX}{'d' if docker else 'n'}{size}"
    fabric = Fabric(topo, lab, default_ports(topo))
    ctrs = ContainerHosts(lab, {h: IMAGE for h in topo.hosts}) if docker else None
    t0 = time.perf_counter()
    try:
        adopt = ctrs.start() if ctrs is not None else None
        fabric.build(adopt)
        up = time.perf_counter() - t0
    finally:
        td = time.perf_counter()
        try:
            fabric.teardown()
        finally:
            if ctrs is not None:
                ctrs.remove()
        down = time.perf_counter() - td
    phases = dict(fabric.timings)
    if ctrs is not None:
        phases.update(ctrs.timings)
    return up, down, phases


def print_docker(sizes: list[int], rounds: int = 3, out=print) -> dict:
    """Measure and print; returns {size: {"ns": (up, down), "docker": (up, down), "containers": s}, "image": s}."""
    from ..container import image
    from ..container.daemon import client
    client(log=out)
    image.build(log=out)                              # the image the labs use, built once if missing
    res: dict = {}
    out(f"container hosts vs namespace hosts: fabric build + teardown (no datapath), median of {rounds} "
        f"alternated round(s)")
    out(f"{'size':<40} {'ns up':>8} {'docker up':>10} {'ratio':>7} {'ns down':>8} {'docker down':>12} "
        f"{'ratio':>7} {'start/host':>11}")
    for size in sizes:
        ns, dk, start = [], [], []
        for _ in range(rounds):
            up, down, _ = measure(size, docker=False)
            ns.append((up, down))
            up, down, ph = measure(size, docker=True)
            dk.append((up, down))
            start.append(ph.get("containers", 0.0))
        med = lambda xs, i: statistics.median(x[i] for x in xs)      # noqa: E731
        r = res[size] = {"ns": (med(ns, 0), med(ns, 1)), "docker": (med(dk, 0), med(dk, 1)),
                         "containers": statistics.median(start)}
        _scen, _shape, label = bench_scenario(size)
        out(f"{label:<40} {r['ns'][0]:>7.3f}s {r['docker'][0]:>9.3f}s {r['docker'][0] / r['ns'][0]:>6.1f}x "
            f"{r['ns'][1]:>7.3f}s {r['docker'][1]:>11.3f}s {r['docker'][1] / r['ns'][1]:>6.1f}x "
            f"{r['containers'] / size * 1000:>8.0f} ms")
    tag = "bench"
    try:
        b = image.build(force=True, tag=tag)
        res["image"] = b.seconds
        out(f"host image build: {b.seconds:.2f} s ({b.packages} Debian packages + "
            f"{', '.join(image.PY_PACKAGES)}, {b.size_bytes / 1e6:.0f} MB; docker import into {b.image}, "
            f"removed after)")
    finally:
        c = client(start=False, install=False)
        cur = image.current(c, tag)
        if cur is not None:
            c.images.remove(f"{image.IMAGE}:{tag}", force=True)
    return res
