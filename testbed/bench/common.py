"""What every benchmark shares: the goals, the fabric shapes, the scenarios they build, and the names
of their labs (so a leftover is found and removed)."""
from __future__ import annotations

import re

from .. import scenario
from ..fabric import netns
from ..fabric.port import port_configs


GOAL_UP_1024 = 3.0        # s, 1,024 hosts, shaping + eBPF
GOAL_DOWN = 1.0           # s
GOAL_UP_128 = 0.5         # s
GOAL_PPS_RATIO = 1.10     # eBPF cost per packet ÷ kernel forwarding
GOAL_FAT_TREE_FLOOR = 1.3  # fat-tree k=16, shaping + eBPF, up and down ÷ the same-run kernel floor
SHAPES = {16: (4, 4, 4), 128: (8, 16, 8), 1024: (8, 32, 32)}     # hosts → spines, leaves, hosts per leaf
LAB_PREFIX = "bench"       # every lab this module makes starts with it (netns ftb-bench…)
FREE_TIMEOUT = 60.0


def default_ports(topo) -> dict:
    """Every port of ``topo`` as a scenario's defaults configure it: one queue, the link's rate and buffer."""
    return port_configs(topo, scenario.SwitchSpec())


def shape_for(hosts: int) -> tuple[int, int, int]:
    """(spines, leaves, hosts per leaf) for a host count: the benchmark's fixed shapes (SHAPES), else a square-ish fabric."""
    if hosts in SHAPES:
        return SHAPES[hosts]
    leaves = 1
    while leaves * leaves < hosts:
        leaves *= 2
    if hosts % leaves:
        raise ValueError(f"{hosts} hosts: use a multiple of {leaves} (or one of {sorted(SHAPES)})")
    return min(8, leaves), leaves, hosts // leaves


def leaf_spine_scenario(spines: int, leaves: int, hpl: int, rate: str = "100mbit"):
    link = {"rate": rate, "buffer": "256KB"}
    return scenario.from_dict({"topology": {"spines": spines, "leaves": leaves, "hosts_per_leaf": hpl,
                                            "host_link": link, "fabric_link": link}})


_FAT_TREE = re.compile(r"^ft([0-9]+)$")


def bench_scenario(size) -> tuple:
    """(scenario, shape, label) of a benchmark size: a host count (leaf-spine, ``shape_for``) or ``ft<k>``
    (fat-tree k, same links as the leaf-spine sizes). ValueError in one line for a size that does not exist."""
    if isinstance(size, int):
        spines, leaves, hpl = shape_for(size)
        return (leaf_spine_scenario(spines, leaves, hpl), (spines, leaves, hpl),
                f"{size} hosts = {spines} spines x {leaves} leaves x {hpl} hosts")
    m = _FAT_TREE.match(size)
    if not m:
        raise ValueError(f"size {size!r}: give a host count or ft<k> for a fat-tree (e.g. ft16)")
    link = {"rate": "100mbit", "buffer": "256KB"}
    try:
        scen = scenario.from_dict({"topology": {"kind": "fat-tree", "k": int(m[1]), "host_link": link,
                                                "fabric_link": link}})
    except scenario.ScenarioError as e:
        raise ValueError(f"size {size}: {e}") from None
    k = scen.topology.k
    return (scen, (), f"{size}: fat-tree k={k}, {scen.topology.hosts} hosts, {k} pods x ({k // 2} leaves + "
                      f"{k // 2} spines), {(k // 2) ** 2} cores")


def parse_sizes(text: str) -> list:
    """``16,128,ft16`` → [16, 128, "ft16"], each checked (bench_scenario) before anything is measured."""
    out = []
    for x in (t.strip() for t in text.split(",")):
        size = int(x) if x.isdigit() else x
        bench_scenario(size)
        out.append(size)
    return out


def bench_namespaces() -> list[str]:
    return netns.list_names(f"{netns.PREFIX}{LAB_PREFIX}")


# ------------------------------------------------------------------ "kernel really done" signal
