"""``traffic.engine: rxe``: real Soft-RoCE (rdma_rxe) + perftest where the kernel has it (the VM lane).

``require()`` raises WorkloadError with ONE line when rdma_rxe, perftest or the root-namespace set-up helper is
missing (this machine's kernel has no RDMA at all); the runner calls it before building anything.

Where it runs (``run_flows``):
  1. ``testbed.rxe.RootHosts`` (issue 5's helper, reused, not duplicated) moves the NICs of the scenario's hosts
     into the initial network namespace — rxe on Debian's 6.1 kernel opens its UDP socket only there — with
     policy routing that forces host-to-host RoCE onto the wire through the fabric (switches stay in their
     namespaces with eBPF), and adds one rxe device per host.
  2. Per flow one perftest pair (``traffic.rxe.test``: ``write_bw`` → ``ib_write_bw``, ``send_bw`` →
     ``ib_send_bw``): servers first (one TCP port each), then the clients, all at once, each ``-d <rxe device>
     -x <RoCE v2 GID index>``; sized flows run ``-n ceil(size / msg_bytes)`` iterations, duration flows ``-D``.
  3. The client's summary row becomes the flow's FlowResult (flows.csv, same columns); then rxe devices, rules
     and the moved NICs are removed (RootHosts.close), and the lab is torn down as usual.

perftest's summary (client side; perftest ≥ 4.4, rdma-core's ``perftest`` package):
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    " 65536      5000             52.10              51.87                0.000830"
MB/sec there is MiB/s (perftest divides by 0x100000); with ``--report_gbits`` the header says Gb/sec (10^9 bit/s).
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import time

from .. import FlowResult, WorkloadError

TOOLS = {"write_bw": "ib_write_bw", "send_bw": "ib_send_bw"}
HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(MB|Gb)/sec\]\s+BW average\[(MB|Gb)/sec\]")
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", re.M)
MIB = 1 << 20
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
    try:
        from . import softroce as _root  # noqa: F401  (issue 5: testbed/rxe.py)
    except ImportError:
        return ("traffic.engine rxe: testbed/rxe.py (the root-namespace Soft-RoCE set-up from the VM-lane work, "
                "issue 5) is not in this tree")
    return None


def require() -> None:
    why = missing()
    if why:
        raise WorkloadError(why)


def parse_perftest(text: str) -> dict | None:
    """The summary row of ib_write_bw / ib_send_bw output (the last one, if several), or None.

    Returns msg_bytes, iterations, bw_peak_mbps, goodput_mbps (both 10^6 bit/s) and msg_rate_mpps; the unit is
    taken from the header (MB/sec = MiB/s, perftest's default; Gb/sec with --report_gbits)."""
    units = HEADER.findall(text)
    rows = ROW.findall(text)
    if not rows:
        return None
    unit = units[-1][1] if units else "MB"
    scale = 1000.0 if unit == "Gb" else MIB * 8 / 1e6
    size, iters, peak, avg, mpps = rows[-1]
    return {"msg_bytes": int(size), "iterations": int(iters), "bw_peak_mbps": float(peak) * scale,
            "goodput_mbps": float(avg) * scale, "msg_rate_mpps": float(mpps)}


def _last_line(text: str) -> str:
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    return lines[-1] if lines else "no output"


def perftest_argv(tool: str, dev: str, gid: int, port: int, msg_bytes: int, iterations: int | None,
                  seconds: int, server_addr: str | None = None) -> list[str]:
    argv = [tool, "-d", dev, "-x", str(gid), "-p", str(port), "-s", str(msg_bytes), "-F"]
    argv += ["-n", str(iterations)] if iterations else ["-D", str(seconds)]
    return argv + ([server_addr] if server_addr else [])


def to_result(flow, parsed: dict | None, out: str, start: float, end: float, t0: float,
              seconds: float | None = None) -> FlowResult:
    """A FlowResult (flows.csv row) for ``flow`` from the client's parsed perftest summary. ``seconds``: the
    ``-D`` duration of a duration flow. When perftest reports an average of 0 for a run that moved bytes
    (Debian 12's perftest 4.5 prints BW 0.00 in ``-D`` mode, seen in the VM lane), goodput is
    bytes × 8 / (``seconds`` or the client's wall time). Note: ib_send_bw ``-D`` failed once in two VM-lane runs
    ("Failed status 9"): give send_bw flows a ``flow_size`` (``-n``) for dependable results."""
    ok = parsed is not None
    nbytes = parsed["msg_bytes"] * parsed["iterations"] if ok else 0
    if ok and parsed["goodput_mbps"] <= 0 and nbytes:
        parsed = dict(parsed, goodput_mbps=nbytes * 8 / max(seconds or (end - start), 1e-9) / 1e6)
    complete = (nbytes >= flow.size_bytes) if (ok and flow.size_bytes is not None) else None
    return FlowResult(
        flow_id=flow.flow_id, src=flow.src, dst=flow.dst, sport=flow.sport, dport=4791, proto="rocev2",
        bytes=nbytes, packets_sent=None, packets_received=None, lost=None,
        start_s=start - t0, end_s=end - t0, fct_s=(end - start) if complete else None,
        goodput_mbps=parsed["goodput_mbps"] if ok else 0.0, rate_bps=flow.rate_bps, size_bytes=flow.size_bytes,
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
