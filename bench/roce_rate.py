"""RoCE engine send rate on one core vs a plain Python UDP sendto loop, in the same run (goal ≥ 0.9×).

Both send to 127.0.0.1, each to a bound sink socket with a tiny receive buffer (loopback does not rate-limit ICMP,
so an unbound port would make the kernel answer every packet with port unreachable), pinned to one core. The plain loop sends 1068-byte UDP payloads (the size of an engine packet's UDP payload: BTH + 1024 B +
ICRC) with ``sendto``. The engine side drives the real ``Requester._pump`` (the agent's send path: DataTemplate,
ICRC, one ``sendmsg`` per packet on its UDP data socket) for a duration flow with 1024-byte IB MTU, with no
endpoint (no ACKs: the RTO is set beyond the run). The plain loop runs before and after the engine, so load drift
shows. Usage:
    PYTHONPATH=. python bench/roce_rate.py [seconds] [rounds]
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

from testbed.workloads import roce

GOAL = 0.9


def sink(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind(("127.0.0.1", port))
    return s


def plain(seconds: float) -> float:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(12 + 1024 + 4)
    k = sink(0)
    n, end = 0, time.perf_counter() + seconds
    dst = k.getsockname()
    while time.perf_counter() < end:
        for _ in range(64):
            s.sendto(payload, dst)
        n += 64
    k.close()
    return n / seconds


class _NoEndpoint:
    """Stands in for the host's Endpoint (no receive socket on :4791, no ACK processing)."""
    users = 0
    lock = threading.RLock()

    def __init__(self):
        self.req = {}

    def drain(self, limit):
        pass

    def release(self):
        pass


def engine(seconds: float, sport: int = 49152) -> float:
    real = roce.endpoint
    roce.endpoint = _NoEndpoint
    try:
        flow = {"flow_id": 1, "size_bytes": None, "sport": sport, "src_addr": "127.0.0.1", "dst_addr": "127.0.0.1",
                "opts": {"mtu": 1024, "msg_bytes": 1 << 20, "rto_s": 3600}}
        now = time.time()
        req = roce.Requester(flow, {"t0": now, "duration_s": seconds + 3600})
    finally:
        roce.endpoint = real
    k = sink(roce.w.ROCE_PORT)
    req.begin(now)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        req._pump(time.time())                       # BURST packets per call, one clock read per burst
    n = req.sent
    req.abort("bench done")
    k.close()
    return n / seconds


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})       # one core for both
    ratios = []
    for _ in range(rounds):
        base = plain(seconds)
        eng = engine(seconds)
        base2 = plain(seconds)                                      # bracket the engine: load drift shows
        ratio = eng / ((base + base2) / 2)
        ratios.append(ratio)
        print(f"plain sendto: {base:,.0f} / {base2:,.0f} pkt/s; roce engine: {eng:,.0f} pkt/s; "
              f"ratio {ratio:.2f} (goal ≥ {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})")
    if rounds > 1:
        ratios.sort()
        print(f"median ratio over {rounds} rounds: {ratios[rounds // 2]:.2f} (goal ≥ {GOAL})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
