"""Smoke test of the benchmarks: they run, print numbers and leave no namespace behind (no timing asserts)."""
import io
import math
import os

import pytest

from testbed import bench
from testbed.fabric import netns

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, BPF)")]


def test_shape_for():
    assert bench.shape_for(16) == (4, 4, 4)
    assert bench.shape_for(128) == (8, 16, 8)
    assert bench.shape_for(1024) == (8, 32, 32)
    s, le, h = bench.shape_for(64)
    assert le * h == 64


def test_build_bench_16_hosts():
    out = io.StringIO()
    try:
        [r] = bench.print_build([16], out=out)
    finally:
        leftovers = bench.bench_namespaces()
    text = out.getvalue()
    assert "16 hosts" in text and "phase (s)" in text
    assert r.namespaces == 24 and r.veths == 32
    for k in ("namespaces", "links", "config", "offloads", "attach", "teardown", "dp_compile"):
        assert r.phases[k] >= 0
    assert r.up > 0 and r.down > 0 and r.floor_up > 0
    assert r.down_kernel is not None and r.down_kernel >= 0
    assert leftovers == []


def test_pps_bench_1s():
    out = io.StringIO()
    try:
        res = bench.print_pps(1.0, rounds=1, out=out)
    finally:
        leftovers = bench.bench_namespaces()
    for mode in ("ebpf", "kernel"):
        m = res["median"][mode]
        assert m["pps"] > 0 and math.isfinite(m["kernel_ns"]) and m["kernel_ns"] > 0
    assert math.isfinite(res["ratio_kernel_cpu"])
    assert "eBPF / kernel" in out.getvalue()
    assert leftovers == []
    assert not [n for n in netns.list_names() if n.startswith(f"{netns.PREFIX}{bench.LAB_PREFIX}")]
