"""``traffic.engine: iperf3``: Debian's iperf3 as the traffic, one client/server pair per planned flow.

A real, well-known client in the host namespaces — what Mininet users run with ``iperf`` — and a C traffic
generator whose cost per packet is the kernel's, not Python's (the capacity benchmark's baseline uses it). The
flows are planned as for the udp and tcp engines (pattern, pairs, sizes, rates, start, source ports, DSCP/ECN,
rails); ``traffic.iperf3.protocol`` picks UDP or TCP. Per flow:

- a one-off server (``iperf3 -s -1 -J``) bound to the destination's address on port ``PORT_BASE`` + the flow's
  id (the flow's ``dport``: iperf3 needs a listening port per concurrent test), waited for until it listens;
- at the flow's start, the client (``iperf3 -c … -B SRC --cport SPORT -J``): ``-n`` bytes for sized flows,
  ``-t`` the rest of the run otherwise, ``-b`` the flow's rate (UDP without a rate: ``-b 0``, as fast as the
  shaped host link back-pressures it), ``-l`` the UDP payload of ``traffic.packet_size``, ``-S`` the TOS byte;
- its JSON report becomes the flow's flows.csv row (report.py); client and server output are kept in the run
  directory (``iperf3/``).

iperf3 missing: one line naming the Debian package, before anything is built. A client that fails (or a server
that never listens): the run fails in one line naming the flow and iperf3's own error. iperf3 cannot choose its
sockets' priority, so it is refused where host NICs have traffic classes (``hosts.pfc``, credits).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from ...fabric import netns
from ..agent_set import WorkloadError
from .report import to_result

PORT_BASE = 5201
LISTEN_TIMEOUT_S = 10.0


def missing() -> str | None:
    if shutil.which("iperf3") is None:
        return "traffic.engine iperf3: iperf3 is not installed (apt-get install iperf3)"
    return None


def require() -> None:
    why = missing()
    if why:
        raise WorkloadError(why)


def _listening(port: int) -> bool:
    """Runs inside a namespace: a TCP socket listens on ``port`` (this thread's /proc/net/tcp)."""
    with open("/proc/thread-self/net/tcp") as f:
        next(f)
        return any(int(ln.split()[1].split(":")[1], 16) == port and ln.split()[3] == "0A" for ln in f)


def client_argv(flow, protocol: str, packet_size: int, seconds: float) -> list[str]:
    """The client's command line for one flow (see the module docstring)."""
    argv = ["iperf3", "-c", flow.dst_addr, "-p", str(flow.dport), "-B", flow.src_addr, "--cport", str(flow.sport),
            "-J", "-S", str(flow.tos)]
    argv += ["-n", str(flow.size_bytes)] if flow.size_bytes is not None else ["-t", f"{max(1, round(seconds))}"]
    if protocol == "udp":
        argv += ["-u", "-l", str(packet_size - 28), "-b", str(flow.rate_bps or 0)]
    elif flow.rate_bps:
        argv += ["-b", str(flow.rate_bps)]
    return argv


def _error_of(out: str, rc: int) -> str:
    """iperf3's own error (its JSON report's ``error``), else the last line it wrote."""
    try:
        err = json.JSONDecoder().raw_decode(out.lstrip())[0].get("error")
    except (ValueError, AttributeError):
        err = None
    if err:
        return f"iperf3: {err}"
    lines = [s.strip() for s in out.splitlines() if s.strip()]
    return f"iperf3 exited with {rc}: {lines[-1][:200] if lines else 'no output'}"


def run_flows(flows, protocol: str, packet_size: int, duration_s: float, ns_of: Callable[[str], str],
              origin: float, log_dir: Path, check: Callable[[], None]) -> tuple[list, str | None]:
    """Run every flow as an iperf3 pair (module docstring): (their FlowResults, None) or, when a client failed,
    (the rows all the same, one line naming the first flow that failed)."""
    require()
    log_dir.mkdir(parents=True, exist_ok=True)
    for f in flows:
        f.dport = PORT_BASE + f.flow_id
    servers, clients, results = {}, {}, {}
    try:
        for f in flows:
            servers[f.flow_id] = netns.spawn(ns_of(f.dst), ["iperf3", "-s", "-1", "-J", "-B", f.dst_addr, "-p",
                                                            str(f.dport)],
                                             stdout=open(log_dir / f"server-{f.flow_id}.json", "w"),
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + LISTEN_TIMEOUT_S
        for f in flows:
            while not netns.run_in(ns_of(f.dst), _listening, f.dport):
                if servers[f.flow_id].poll() is not None or time.monotonic() > end:
                    raise WorkloadError(f"iperf3: flow {f.flow_id} ({f.src} → {f.dst}): its server on "
                                        f"{f.dst_addr}:{f.dport} never listened (iperf3/server-{f.flow_id}.json)")
                time.sleep(0.02)
        t0 = time.time()
        pending = sorted(flows, key=lambda f: f.start_s)
        while len(results) < len(flows):
            now = time.time()
            while pending and t0 + pending[0].start_s <= now:
                f = pending.pop(0)
                argv = client_argv(f, protocol, packet_size, duration_s - f.start_s)
                clients[f.flow_id] = (netns.spawn(ns_of(f.src), argv, stdout=subprocess.PIPE, text=True,
                                                  stderr=open(log_dir / f"client-{f.flow_id}.err", "w"),
                                                  stdin=subprocess.DEVNULL), time.time())
            for fid, (p, started) in list(clients.items()):
                if fid not in results and p.poll() is not None:
                    out = p.stdout.read()
                    (log_dir / f"client-{fid}.json").write_text(out)
                    results[fid] = (out, p.returncode, started, time.time())
            if time.time() - t0 > duration_s + 30:
                raise WorkloadError(f"iperf3: {sum(p.poll() is None for p, _ in clients.values())} client(s) still "
                                    f"running 30 s after the run's duration")
            check()
            time.sleep(0.02)
    finally:
        for p in [p for p, _ in clients.values()] + list(servers.values()):
            if p.poll() is None:
                p.kill()
            p.wait()
    rows, failed = [], None
    for f in flows:
        out, rc, started, ended = results[f.flow_id]
        report, error = None, None
        if rc != 0:
            error = _error_of(out + "\n" + (log_dir / f"client-{f.flow_id}.err").read_text(), rc)
        else:
            try:
                report = json.loads(out)
            except ValueError:
                error = f"iperf3: its report is not JSON ({out[:100]!r})"
            else:
                if report.get("error"):               # iperf3 -J exits 0 even when it could not run the test
                    error, report = f"iperf3: {report['error']}", None
        if error and failed is None:
            failed = f"iperf3: flow {f.flow_id} ({f.src} → {f.dst}) failed: {error.removeprefix('iperf3: ')}"
        rows.append(to_result(f, report, error, started, ended, origin))
    return rows, failed


__all__ = ["PORT_BASE", "WorkloadError", "client_argv", "missing", "require", "run_flows", "to_result"]
