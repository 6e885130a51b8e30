"""Parse the human units scenarios are written in (100mbit, 256KB, 500us) into integers.

Rates become bits per second, sizes bytes, times nanoseconds. Decimal prefixes follow tc's convention
for rates (k = 1000) and the IEC/JEDEC convention for buffer sizes (KB = 1024), as switch data sheets do.
"""
from __future__ import annotations

import re

_NUM = r"\s*([0-9]+(?:\.[0-9]+)?)\s*"

_RATE = {
    "": 1, "bit": 1, "bps": 1,
    "k": 10**3, "kbit": 10**3, "kbps": 10**3,
    "m": 10**6, "mbit": 10**6, "mbps": 10**6,
    "g": 10**9, "gbit": 10**9, "gbps": 10**9,
}
_SIZE = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1024, "kib": 1024,
    "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1024**3, "gib": 1024**3,
}
_TIME = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "": 10**9}


def _parse(value, table: dict[str, int], what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected a {what}, got {value!r}")
    if isinstance(value, (int, float)):
        return int(round(value * table[""]))
    m = re.fullmatch(_NUM + r"([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in table:
        units = ", ".join(sorted(k for k in table if k))
        raise ValueError(f"expected a {what} like {_EXAMPLE[what]} (units: {units}), got {value!r}")
    return int(round(float(m.group(1)) * table[m.group(2).lower()]))


_EXAMPLE = {"rate": "'100mbit'", "size": "'256KB'", "time": "'500us'"}


def rate_bps(value) -> int:
    """'100mbit' → 100_000_000 (bits per second)."""
    return _parse(value, _RATE, "rate")


def size_bytes(value) -> int:
    """'256KB' → 262144 (bytes)."""
    return _parse(value, _SIZE, "size")


def time_ns(value) -> int:
    """'500us' → 500_000 (nanoseconds); a bare number is seconds."""
    return _parse(value, _TIME, "time")


def fmt_rate(bps: int) -> str:
    for unit, div in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= div and bps % div == 0:
            return f"{bps // div}{unit}"
    return f"{bps}bit"
