"""Flow-size distributions of open-loop datacenter workloads (``traffic.pattern: poisson``, ``traffic.size_dist``).

The named distributions are the published CDF points that the datacenter congestion-control literature uses
(as the HPCC simulator's traffic generator lists them): ``websearch`` (DCTCP's web-search cluster),
``hadoop`` (Facebook's Hadoop cluster) and ``alistorage`` (Alibaba storage, 2019). A point is (flow size in
bytes, cumulative share). A size is drawn by inverting the CDF with linear interpolation between points, so the
distribution's mean is the trapezoid sum over the segments, which is what ``SizeCdf.mean`` returns; the load a
host offers uses that mean.

A file holds the same as two columns per line, ``bytes cumulative`` (cumulative in % when the last is 100, else
a fraction ending at 1), ``#`` comments allowed; both columns non-decreasing.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import TestbedError

NAMED: dict[str, tuple[tuple[int, float], ...]] = {
    "websearch": ((0, 0), (10_000, 15), (20_000, 20), (30_000, 30), (50_000, 40), (80_000, 53), (200_000, 60),
                  (1_000_000, 70), (2_000_000, 80), (5_000_000, 90), (10_000_000, 97), (30_000_000, 100)),
    "hadoop": ((0, 0), (100, 1), (200, 2), (300, 5), (350, 15), (400, 20), (500, 30), (600, 40), (700, 50),
               (1_000, 60), (2_000, 67), (7_000, 70), (30_000, 72), (50_000, 82), (80_000, 87), (120_000, 90),
               (300_000, 95), (1_000_000, 97.5), (2_000_000, 99), (10_000_000, 100)),
    "alistorage": ((0, 0), (4_000, 22.93), (8_000, 69.21), (16_000, 80.61), (32_000, 90.47), (64_000, 93.53),
                   (128_000, 96.77), (256_000, 97.53), (2_000_000, 100)),
}


class SizeDistError(TestbedError, ValueError):
    pass


@dataclass(frozen=True)
class SizeCdf:
    name: str
    sizes: tuple[float, ...]          # bytes, non-decreasing
    cum: tuple[float, ...]            # cumulative share 0 … 1, non-decreasing, last 1

    @classmethod
    def from_points(cls, name: str, points) -> "SizeCdf":
        pts = [(float(s), float(c)) for s, c in points]
        if len(pts) < 2:
            raise SizeDistError(f"size_dist {name}: needs at least two points")
        scale = 100.0 if pts[-1][1] > 1.0 else 1.0
        sizes, cum = zip(*((s, c / scale) for s, c in pts))
        for i in range(1, len(pts)):
            if sizes[i] < sizes[i - 1] or cum[i] < cum[i - 1]:
                raise SizeDistError(f"size_dist {name}: point {i + 1} ({pts[i][0]:g} {pts[i][1]:g}) goes down")
        if sizes[0] < 0 or cum[0] < 0 or abs(cum[-1] - 1.0) > 1e-9:
            raise SizeDistError(f"size_dist {name}: sizes must be ≥ 0 and the CDF must end at 1 (or 100)")
        return cls(name, tuple(sizes), tuple(cum))

    def quantile(self, u: float) -> float:
        """The size at cumulative share ``u`` (0 ≤ u < 1), interpolated linearly within its segment."""
        i = max(1, bisect.bisect_right(self.cum, u))
        i = min(i, len(self.cum) - 1)
        lo, hi = self.cum[i - 1], self.cum[i]
        if hi <= lo:
            return self.sizes[i]
        return self.sizes[i - 1] + (u - lo) / (hi - lo) * (self.sizes[i] - self.sizes[i - 1])

    def sample(self, rng: random.Random) -> int:
        """One flow size in bytes (at least 1)."""
        return max(1, round(self.quantile(rng.random())))

    def mean(self) -> float:
        """The mean size of ``sample`` (bytes): Σ over segments of share × the segment's mid size."""
        return sum((self.cum[i] - self.cum[i - 1]) * (self.sizes[i] + self.sizes[i - 1]) / 2
                   for i in range(1, len(self.cum)))


def read_file(path: Path) -> SizeCdf:
    """A CDF file (module docstring); SizeDistError naming the file and line when it is malformed."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SizeDistError(f"size_dist {path}: {e.strerror}") from None
    points = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            points.append((float(parts[0]), float(parts[1])))
        except ValueError:
            raise SizeDistError(f"size_dist {path}, line {n}: expected 'bytes cumulative', got {line!r}") from None
    return SizeCdf.from_points(str(path), points)


def resolve(spec: str) -> SizeCdf:
    """A named distribution or a CDF file."""
    if spec in NAMED:
        return SizeCdf.from_points(spec, NAMED[spec])
    if not Path(spec).is_file():
        raise SizeDistError(f"size_dist {spec!r}: neither {' | '.join(NAMED)} nor a file")
    return read_file(Path(spec))
