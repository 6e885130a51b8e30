"""Build + teardown benchmark: 16, 128 and 1,024 hosts with shaping and the eBPF datapath (run as root).

    .venv/bin/python bench/build.py [--sizes 16,128,1024] [--repeat N] [--no-floor]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testbed import bench  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--sizes", default="16,128,1024", help="host counts, comma separated")
ap.add_argument("--repeat", type=int, default=1, help="runs per size (medians are printed)")
ap.add_argument("--no-floor", action="store_true", help="skip the same-run kernel floor")
a = ap.parse_args()
bench.print_build([int(x) for x in a.sizes.split(",")], repeat=a.repeat, floor=not a.no_floor)
