"""Every benchmark, as `testbed bench all` runs it (run as root)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testbed import bench  # noqa: E402

bench.print_build([16, 128, 1024])
bench.print_pps(3.0)
