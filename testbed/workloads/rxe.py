"""``traffic.engine: rxe``: real Soft-RoCE (rdma_rxe) + perftest where the kernel has it (the VM).

``require()`` raises WorkloadError with ONE line when rdma_rxe or perftest is missing (this machine's kernel has
no RDMA at all); the runner calls it before any traffic. Where both exist, ``run_pairs`` adds an rxe device on
each host NIC (``rdma link add rxe_<if> type rxe netdev <if>``), runs ``ib_write_bw`` / ``ib_send_bw`` servers on
the destinations and clients on the sources (through the fabric), and parses the perftest summary line into
flow rows. Note (DESIGN §3): rxe on Debian 6.1 works only in the initial network namespace, so in the VM the
hosts' NICs must live there (policy routing per host address); namespaced hosts make rxe fail to connect.
"""
from __future__ import annotations

import re
import shutil
import subprocess

from . import WorkloadError

BW_LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", re.M)


def missing() -> str | None:
    """Why rxe workloads cannot run here (one line), or None."""
    from ..doctor import _probe_rdma_rxe
    cap = _probe_rdma_rxe()
    if not cap.ok:
        return f"traffic.engine rxe: the kernel has no Soft-RoCE (rdma_rxe): {cap.detail}"
    if not shutil.which("ib_write_bw"):
        return "traffic.engine rxe: perftest is not installed (ib_write_bw missing; apt-get install perftest)"
    return None


def require() -> None:
    why = missing()
    if why:
        raise WorkloadError(why)


def parse_perftest(text: str) -> dict | None:
    """The summary row of ib_write_bw / ib_send_bw: #bytes, #iterations, BW peak, BW average (MB/s), MsgRate."""
    rows = BW_LINE.findall(text)
    if not rows:
        return None
    size, iters, peak, avg, mpps = rows[-1]
    return {"msg_bytes": int(size), "iterations": int(iters), "bw_peak_mbps": float(peak) * 8,
            "goodput_mbps": float(avg) * 8, "msg_rate_mpps": float(mpps)}


def add_device(ns_run, ifname: str) -> str:
    dev = f"rxe_{ifname}"[:15]
    ns_run(["rdma", "link", "add", dev, "type", "rxe", "netdev", ifname])
    return dev


def run_pairs(pairs, ns_of, dev_of, test: str = "ib_write_bw", size: int = 65536, seconds: int = 3,
              port_base: int = 18515) -> list[dict]:
    """Run perftest between (src, dst, dst_addr) pairs at once; return one row per pair."""
    from .. import netns

    def spawn(ns, argv, **kw):             # ns None = the initial namespace (where rxe works on 6.1)
        return netns.spawn(ns, argv, **kw) if ns else subprocess.Popen(argv, **kw)
    servers, clients = [], []
    try:
        for i, (src, dst, addr) in enumerate(pairs):
            servers.append(spawn(ns_of(dst), [test, "-d", dev_of(dst), "-s", str(size), "-D", str(seconds),
                                                    "-p", str(port_base + i), "-F"],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for i, (src, dst, addr) in enumerate(pairs):
            clients.append(spawn(ns_of(src), [test, "-d", dev_of(src), "-s", str(size), "-D", str(seconds),
                                                    "-p", str(port_base + i), "-F", addr],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        rows = []
        for (src, dst, _), c in zip(pairs, clients):
            out, _ = c.communicate(timeout=seconds + 30)
            r = parse_perftest(out) or {"error": (out.strip().splitlines() or ["no output"])[-1]}
            rows.append({"src": src, "dst": dst, "engine": "rxe", "proto": "rocev2", "dport": 4791, **r})
        return rows
    finally:
        for p in servers + clients:
            if p.poll() is None:
                p.kill()
                p.wait()
