"""Packets/s and CPU per packet: eBPF switching vs plain kernel forwarding, same run (run as root).

    .venv/bin/python bench/pps.py [--seconds 3] [--rounds 3]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testbed import bench  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--seconds", type=float, default=3.0, help="traffic time per measurement")
ap.add_argument("--rounds", type=int, default=3, help="alternated rounds per mode (medians are printed)")
a = ap.parse_args()
bench.print_pps(a.seconds, rounds=a.rounds)
