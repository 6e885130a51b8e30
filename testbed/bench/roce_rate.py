"""RoCE engine send rate on one core vs a plain Python UDP sendto loop, in the same run.

Where: by default over a veth pair between two fresh namespaces (``ftb-benchroce<pid>-a`` → ``-b``), the sending end
configured like a fabric host NIC (gso_max_segs 1: a GSO send is segmented on the sending side, so every packet
costs the kernel its own skb, as in the testbed; a permanent neighbour entry for the peer, as the fabric installs
for every host gateway); ``--lo`` sends to 127.0.0.1 instead. Each side sends to a bound sink socket with a tiny
receive buffer (no ICMP port-unreachable storm). Everything runs pinned to one core.

What: the plain loop sends 1068-byte UDP payloads (an engine packet's UDP payload: BTH + 1024 B + ICRC) with
``sendto``. The engine side drives the real ``Requester._pump`` (the agent's send path) for a duration flow with a
1024-byte IB MTU and no endpoint (no ACKs: the RTO is beyond the run): with ``batch 1`` (one sendmsg per packet,
for reference), with the default batch (``entropy: qp``: UDP GSO runs of same-size packets; goal ≥ 1.2×), and with
``entropy: packet`` over 8 source ports (the batched sender, roce/batch.py: one sendmmsg per burst of frames with
any source port; goal ≥ 1.0×). The plain loop runs before and after the engine, so load drift shows. Usage:
    testbed bench roce [--seconds S] [--rounds N]     (or: python -m testbed.bench.roce_rate [seconds] [rounds] [--lo])
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

from testbed.fabric import netns
from testbed.fabric.netlink import Batch
from testbed.scenario import RoceSpec
from testbed.workloads.roce import requester as roce      # its endpoint() and resolve() are patched below

BATCH = RoceSpec().batch
ENTROPY = "entropy: packet (8 ports)"
GOALS = {"batch 1": None, f"batch {BATCH}": 1.2, ENTROPY: 1.0}       # ratio to the same-run plain loop
A_ADDR, B_ADDR = "10.213.0.1", "10.213.0.2"


def sink(addr: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((addr, port))
    return s


def plain(seconds: float, src: str, dst: tuple) -> float:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    payload = bytes(12 + 1024 + 4)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            s.sendto(payload, dst)
        n += 64
    s.close()
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


def engine(seconds: float, src: str, dst: str, batch: int, entropy_values: int = 1, sport: int = 49152) -> float:
    real = roce.endpoint
    roce.endpoint = _NoEndpoint
    try:
        flow = {"flow_id": 1, "size_bytes": None, "sport": sport, "src_addr": src, "dst_addr": dst,
                "opts": {"mtu": 1024, "msg_bytes": 1 << 20, "rto_s": 3600, "batch": batch,
                         "entropy": "packet" if entropy_values > 1 else "qp", "entropy_values": entropy_values}}
        now = time.time()
        req = roce.Requester(flow, {"t0": now, "duration_s": seconds + 3600})
    finally:
        roce.endpoint = real
    req.begin(now)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        req._pump(time.time())                       # up to BURST packets per call, one clock read per burst
    n = req.sent
    req.abort("bench done")
    return n / seconds


class Veth:
    """Two namespaces joined by a veth pair; the sending end like a fabric host NIC (gso_max_segs 1)."""

    def __init__(self):
        self.a, self.b = f"{netns.PREFIX}benchroce{os.getpid()}-a", f"{netns.PREFIX}benchroce{os.getpid()}-b"

    def __enter__(self):
        socks = netns.create([self.a, self.b], netlink=True)
        fd = os.open(netns.path(self.b), os.O_RDONLY)
        try:
            ba, bb = Batch(socks[self.a], self.a), Batch(socks[self.b], self.b)
            ba.veth("va", 2, "02:fb:ee:00:00:01", 1500, "vb", 2, "02:fb:ee:00:00:02", fd, gso_max_segs=1)
            ba.address(2, A_ADDR, 24)
            ba.neighbour(2, B_ADDR, "02:fb:ee:00:00:02")     # permanent, as the fabric's host gateways are
            ba.link_up(2, "va")
            ba.commit()
            bb.address(2, B_ADDR, 24)
            bb.link_up(2, "vb")
            bb.commit()
            netns.wait_running(self.a, "va")
            netns.wait_running(self.b, "vb")
        except BaseException:
            self.__exit__()
            raise
        finally:
            os.close(fd)
            for s in socks.values():
                s.close()
        return self

    def __exit__(self, *exc):
        netns.delete([self.a, self.b])


def print_roce_rate(seconds: float = 2.0, rounds: int = 1, lo: bool = False, out=None) -> dict[str, float]:
    """Measure and print the send-rate ratios (engine ÷ plain sendto, same run); returns the median per variant."""
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out, flush=True)     # noqa: E731
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})               # one core for everything (threads inherit it)
    ratios: dict[str, list[float]] = {k: [] for k in GOALS}
    if lo:
        ctx, src, dst = None, "127.0.0.1", "127.0.0.1"
        here = (lambda fn, *a: fn(*a))
        sinks = (sink(dst, 0), sink(dst, roce.w.ROCE_PORT))
    else:
        ctx, src, dst = Veth().__enter__(), A_ADDR, B_ADDR
        here = (lambda fn, *a: netns.run_in(ctx.a, fn, *a))
        sinks = tuple(netns.run_in(ctx.b, sink, dst, port) for port in (0, roce.w.ROCE_PORT))
    try:
        pdst = sinks[0].getsockname()
        p(f"== RoCE engine send rate vs a plain sendto loop, over "
          f"{'loopback' if lo else 'a veth pair between two namespaces (gso_max_segs 1)'}, one core, "
          f"{seconds:g} s per measurement ==")
        for _ in range(rounds):
            base = here(plain, seconds, src, pdst)
            e1 = here(engine, seconds, src, dst, 1)
            eb = here(engine, seconds, src, dst, BATCH)
            ep = here(engine, seconds, src, dst, BATCH, 8)
            base2 = here(plain, seconds, src, pdst)                 # bracket the engine: load drift shows
            ref = (base + base2) / 2
            for (key, r), v in zip(ratios.items(), (e1, eb, ep)):
                r.append(v / ref)
            p(f"plain sendto: {base:,.0f} / {base2:,.0f} pkt/s; roce engine: batch 1 {e1:,.0f} pkt/s "
              f"(ratio {e1 / ref:.2f}), batch {BATCH} = entropy: qp {eb:,.0f} pkt/s (ratio {eb / ref:.2f}), "
              f"entropy per packet {ep:,.0f} pkt/s (ratio {ep / ref:.2f})")
        medians = {}
        for b, r in ratios.items():
            r.sort()
            medians[b] = r[len(r) // 2]
            goal = GOALS[b]
            verdict = "no goal (reference)" if goal is None else \
                f"goal ≥ {goal} {'met' if medians[b] >= goal else 'NOT met'}"
            p(f"median ratio, {b}: {medians[b]:.2f} (spread {r[0]:.2f}–{r[-1]:.2f}) over {rounds} round(s) — "
              f"{verdict}")
        return medians
    finally:
        for s in sinks:
            s.close()
        if ctx is not None:
            ctx.__exit__()
        os.sched_setaffinity(0, saved)


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    print_roce_rate(float(args[0]) if args else 2.0, int(args[1]) if len(args) > 1 else 1, "--lo" in sys.argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
