"""``traffic.engine: rxe``: real Soft-RoCE (rdma_rxe) + perftest where the kernel has it (the VM lane).

``require()`` raises WorkloadError with ONE line when rdma_rxe or perftest is missing (this machine's kernel has
no RDMA at all); the runner calls it before building anything.

Where it runs (``run_flows``):
  1. ``softroce.RootHosts`` moves the NICs of the scenario's hosts into the initial network namespace — rxe on
     Debian's 6.1 kernel opens its UDP socket only there — with policy routing that forces host-to-host RoCE
     onto the wire through the fabric (switches stay in their namespaces with eBPF), and adds one rxe device
     per host.
  2. Per flow one perftest pair (``traffic.rxe.test``: ``write_bw`` → ``ib_write_bw``, ``send_bw`` →
     ``ib_send_bw``): servers first (one TCP port each), then the clients, all at once, each ``-d <rxe device>
     -x <RoCE v2 GID index>``; sized flows run ``-n ceil(size / msg_bytes)`` iterations, duration flows ``-D``.
  3. The client's summary row becomes the flow's FlowResult (flows.csv, same columns); then rxe devices, rules
     and the moved NICs are removed (RootHosts.close), and the lab is torn down as usual.

perftest's command lines and the one parser of its summary row (MB/sec = MiB/s or Gb/sec, stored as Mbit/s)
are in ``perftest.py``; the NIC/namespace set-up in ``softroce.py``.
"""
from __future__ import annotations

import math
import shutil
import subprocess
import time

from .. import FlowResult, WorkloadError
from .perftest import parse_perftest, perftest_argv

TOOLS = {"write_bw": "ib_write_bw", "send_bw": "ib_send_bw"}
PORT_BASE = 18515


def missing() -> str | None:
    """Why rxe workloads cannot run here (one line), or None."""
    from ...doctor import _probe_rdma_rxe
    cap = _probe_rdma_rxe()
    if not cap.ok:
        return f"traffic.engine rxe: the kernel has no Soft-RoCE (rdma_rxe): {cap.detail}"
    for tool in TOOLS.values():
        if not shutil.which(tool):
            return f"traffic.engine rxe: perftest is not installed ({tool} missing; apt-get install perftest)"
    return None


def require() -> None:
    why = missing()
    if why:
        raise WorkloadError(why)


def _last_line(text: str) -> str:
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    return lines[-1] if lines else "no output"


def to_result(flow, parsed: dict | None, out: str, start: float, end: float, t0: float,
              seconds: float | None = None) -> FlowResult:
    """A FlowResult (flows.csv row) for ``flow`` from the client's parsed perftest summary (goodput_mbps = its
    average, Mbit/s: see perftest.parse_perftest). ``seconds``: the ``-D`` duration of a duration flow. When
    perftest reports an average of 0 for a run that moved bytes (Debian 12's perftest 4.5 prints BW 0.00 in
    ``-D`` mode, seen in the VM lane), goodput is bytes × 8 / (``seconds`` or the client's wall time). Note:
    ib_send_bw ``-D`` failed once in two VM-lane runs ("Failed status 9"): give send_bw flows a ``flow_size``
    (``-n``) for dependable results."""
    ok = parsed is not None
    nbytes = parsed["msg_bytes"] * parsed["iterations"] if ok else 0
    goodput = parsed["bw_avg_mbps"] if ok else 0.0
    if ok and goodput <= 0 and nbytes:
        goodput = nbytes * 8 / max(seconds or (end - start), 1e-9) / 1e6
    complete = (nbytes >= flow.size_bytes) if (ok and flow.size_bytes is not None) else None
    return FlowResult(
        flow_id=flow.flow_id, src=flow.src, dst=flow.dst, sport=flow.sport, dport=4791, proto="rocev2",
        bytes=nbytes, packets_sent=None, packets_received=None, lost=None,
        start_s=start - t0, end_s=end - t0, fct_s=(end - start) if complete else None,
        goodput_mbps=goodput, rate_bps=flow.rate_bps, size_bytes=flow.size_bytes,
        rail=flow.rail, engine="rxe", complete=complete, bytes_sent=nbytes if ok else None,
        error=None if ok else f"perftest: {_last_line(out)[:200]}")


def _keep(log_dir, name: str, text: str) -> None:
    from pathlib import Path
    d = Path(log_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)


def run_flows(lab, flows, duration_s: float, test: str = "write_bw", msg_bytes: int = 65536,
              timeout_s: float | None = None, info: dict | None = None, log_dir=None) -> list[FlowResult]:
    """Run every flow as one perftest pair between its hosts across the fabric (see the module docstring).
    ``log_dir``: if given, each flow's client and server output is kept there (``perftest-<flow>-client.txt``)."""
    from . import softroce as root
    tool = TOOLS[test]
    hosts = sorted({h for f in flows for h in (f.src, f.dst)})
    seconds = max(1, math.ceil(duration_s))
    timeout_s = timeout_s or (seconds + 60 + 5 * len(flows))
    try:
        with root.RootHosts(lab, hosts) as rh:
            gid = {h: rh.gid_index(h) for h in hosts}
            servers, clients = [], []
            try:
                for i, f in enumerate(flows):
                    iters = math.ceil(f.size_bytes / msg_bytes) if f.size_bytes else None
                    servers.append(subprocess.Popen(
                        perftest_argv(tool, rh.device(f.dst), gid[f.dst], PORT_BASE + i, msg_bytes, iters, seconds),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                time.sleep(1.0)                          # servers listening on their TCP ports
                t0 = time.time()
                if info is not None:
                    info["t0"] = t0
                for i, f in enumerate(flows):
                    iters = math.ceil(f.size_bytes / msg_bytes) if f.size_bytes else None
                    clients.append((time.time(), subprocess.Popen(
                        perftest_argv(tool, rh.device(f.src), gid[f.src], PORT_BASE + i, msg_bytes, iters, seconds,
                                      rh.address(f.dst)),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
                results, deadline = [], time.time() + timeout_s
                for f, (start, c) in zip(flows, clients):
                    try:
                        out, _ = c.communicate(timeout=max(1.0, deadline - time.time()))
                    except subprocess.TimeoutExpired:
                        c.kill()
                        out = (c.communicate()[0] or "") + "\ntimed out"
                    end = time.time()
                    results.append(to_result(f, parse_perftest(out), out, start, end, t0,
                                             None if f.size_bytes else seconds))
                    if log_dir is not None:
                        _keep(log_dir, f"perftest-{f.flow_id}-client.txt", " ".join(c.args) + "\n" + out)
                if log_dir is not None:
                    for f, sp in zip(flows, servers):
                        try:
                            sout = sp.communicate(timeout=10)[0] or ""
                        except subprocess.TimeoutExpired:
                            sout = "(server still running; killed)"
                        _keep(log_dir, f"perftest-{f.flow_id}-server.txt", " ".join(sp.args) + "\n" + sout)
                return results
            finally:
                for p in servers + [c for _, c in clients]:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
    except root.RxeError as e:
        raise WorkloadError(f"traffic.engine rxe: {e}") from None
