"""RoCE engine send rate on one core vs a plain Python UDP sendto loop, in the same run (goal ≥ 0.9×).

Both send 1040-byte UDP payloads to 127.0.0.1 (discard port / raw loopback), pinned to one core; the engine
builds each packet exactly as the agent does (header template, RETH on message starts, ICRC, sendmsg on a raw
IP_HDRINCL socket). The plain loop runs before and after the engine, so load drift shows. Usage:
    PYTHONPATH=. python bench/roce_rate.py [seconds]
"""
from __future__ import annotations

import os
import socket
import sys
import time

from testbed.workloads import rocewire as w
from testbed.workloads.roce import PADS, Layout, flow_data


def plain(seconds: float) -> float:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(1024 + 12 + 4)
    n, end = 0, time.perf_counter() + seconds
    dst = ("127.0.0.1", 9)
    while time.perf_counter() < end:
        for _ in range(64):
            s.sendto(payload, dst)
        n += 64
    return n / seconds


def engine(seconds: float) -> float:
    flow = {"flow_id": 1, "size_bytes": 64 << 20, "opts": {"mtu": 1024}}
    lay = Layout(flow)
    data = memoryview(flow_data(flow, flow["size_bytes"]))
    t = w.Template("127.0.0.1", "127.0.0.1", 0x100)
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    hmv = t.hmv
    n, idx, end = 0, 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            m, j, n_in, off, ln = lay.where(idx % lay.npk)
            first, last = j == 0, j == n_in - 1
            op = (w.OP_WRITE_ONLY if last else w.OP_WRITE_FIRST) if first else (
                w.OP_WRITE_LAST if last else w.OP_WRITE_MIDDLE)
            hl, pad = t.build(op, idx, 49152, ln, ackreq=last, reth=(m, 1, lay.msg) if first else None)
            src = data[off:off + ln]
            sock.sendmsg([hmv[:hl], src, PADS[pad], t.crc(hl, src, PADS[pad])], (), 0, ("127.0.0.1", 0))
            idx += 1
        n += 64
    return n / seconds


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})       # one core for both
    base = plain(seconds)
    eng = engine(seconds)
    base2 = plain(seconds)                                          # bracket the engine: load drift shows
    ref = (base + base2) / 2
    print(f"plain sendto: {base:,.0f} / {base2:,.0f} pkt/s; roce engine: {eng:,.0f} pkt/s; "
          f"ratio {eng / ref:.2f} (goal ≥ 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
