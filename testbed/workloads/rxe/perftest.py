"""perftest (``ib_write_bw``, ``ib_send_bw``) for the rxe engine and the full-kernel tests: command lines, the one
parser of its summary row, and a server + client pair in the root namespace.

Units. perftest prints its bandwidth columns in one of two units, named in the header above the row:
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"   the default
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"   with --report_gbits
``MB/sec`` is MiB/s (perftest divides bytes by 0x100000; newer versions print ``MiB/sec``), ``Gb/sec`` is 10^9
bit/s. :func:`parse_perftest` stores both as **Mbit/s (10^6 bit/s)** under ``*_mbps`` keys, the unit of
``goodput_mbps`` in flows.csv: 100.00 MB/sec → 838.8608 Mbit/s, 0.39 Gb/sec → 390 Mbit/s.
"""
from __future__ import annotations

import re
import subprocess
import time

from .softroce import RxeError

# Mbit/s per one unit of the header's bandwidth columns
UNITS = {"MB": (1 << 20) * 8 / 1e6, "MiB": (1 << 20) * 8 / 1e6, "Gb": 1e9 / 1e6}
HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(MB|MiB|Gb)/sec\]\s+BW average\[(?:MB|MiB|Gb)/sec\]")
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
NO_CLOCK = "Can't produce a report"     # perftest could not calibrate its cycle counter (r² < 0.9: TCG jitter)
WC_ERROR = "Completion with error"      # the QP went to error (the guest's rxe under TCG, now and then: status 9)
RETRIED = {NO_CLOCK: "perftest could not calibrate its clock",
           WC_ERROR: "a work completion came back with an error status (rxe under emulation)"}


def parse_perftest(text: str) -> dict | None:
    """The last summary row of ib_write_bw / ib_send_bw output that follows a bandwidth header, or None.

    Returns msg_bytes, iterations, bw_peak_mbps, bw_avg_mbps (both Mbit/s = 10^6 bit/s, converted from the
    header's unit: MB/sec = MiB/s, Gb/sec = 10^9 bit/s), msg_rate_mpps and unit (the header's, as printed).
    A row before any header is not taken: its unit would be a guess."""
    unit, found = None, None
    for line in text.splitlines():
        h = HEADER.search(line)
        if h:
            unit = h.group(1)
            continue
        m = ROW.match(line)
        if m and unit:
            size, iters, peak, avg, mpps = m.groups()
            found = {"msg_bytes": int(size), "iterations": int(iters), "bw_peak_mbps": float(peak) * UNITS[unit],
                     "bw_avg_mbps": float(avg) * UNITS[unit], "msg_rate_mpps": float(mpps), "unit": f"{unit}/sec"}
    return found


def perftest_argv(tool: str, dev: str, gid: int, port: int, msg_bytes: int, iterations: int | None,
                  seconds: int, server_addr: str | None = None) -> list[str]:
    """One side of a pair: ``-n iterations`` for a sized run, else ``-D seconds``; the client names the server."""
    argv = [tool, "-d", dev, "-x", str(gid), "-p", str(port), "-s", str(msg_bytes), "-F"]
    argv += ["-n", str(iterations)] if iterations else ["-D", str(seconds)]
    return argv + ([server_addr] if server_addr else [])


def perftest_pair(dev_srv: str, gid_srv: int, dev_cli: str, gid_cli: int, server_addr: str,
                  tool: str = "ib_write_bw", msg_bytes: int = 65536, iterations: int = 200,
                  timeout: float = 120, port: int = 18515, attempts: int = 3) -> tuple[dict, str]:
    """Run ``tool`` server + client in the root namespace; returns (parsed client row, client output).

    perftest turns cycles into time with a CPU frequency it measures by linear regression; under emulation
    (the VM lane runs QEMU TCG) that fit fails now and then (r² < 0.9) and perftest prints ``NO_CLOCK`` after
    a complete transfer; and the guest kernel's rxe, slowed by TCG, now and then moves a QP to error (perftest
    prints ``WC_ERROR``: "Failed status 9", remote invalid request). Only these two are run again, on a fresh
    QP, up to ``attempts`` times in all, and the output says which; any other failure raises at once."""
    once = (lambda: _pair_once(dev_srv, gid_srv, dev_cli, gid_cli, server_addr, tool, msg_bytes, iterations,
                               timeout, port))
    notes = []
    for attempt in range(1, attempts):
        try:
            res, out = once()
            return res, "".join(notes) + out
        except RxeError as e:
            reason = next((why for mark, why in RETRIED.items() if mark in str(e)), None)
            if reason is None:
                raise
            notes.append(f"[testbed] {tool} attempt {attempt}: {reason}; again\n")
            print(f"[testbed] {tool} attempt {attempt}: {reason}; again", flush=True)
    res, out = once()
    return res, "".join(notes) + out


def _pair_once(dev_srv, gid_srv, dev_cli, gid_cli, server_addr, tool, msg_bytes, iterations, timeout, port):
    srv = subprocess.Popen(perftest_argv(tool, dev_srv, gid_srv, port, msg_bytes, iterations, 0),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.0)
        cli = subprocess.run(perftest_argv(tool, dev_cli, gid_cli, port, msg_bytes, iterations, 0, server_addr),
                             check=False, capture_output=True, text=True, timeout=timeout)
        out = cli.stdout + cli.stderr
        srv_out = srv.communicate(timeout=30)[0]
        if cli.returncode:
            raise RxeError(f"{tool} client failed ({cli.returncode}): {out.strip()[-400:]} | server: "
                           f"{srv_out.strip()[-200:]}")
        parsed = parse_perftest(out)
        if parsed is None:
            raise RxeError(f"{tool}: no result row after a bandwidth header in its output: {out.strip()[-300:]}")
        return parsed, out
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


__all__ = ["NO_CLOCK", "WC_ERROR", "parse_perftest", "perftest_argv", "perftest_pair"]
