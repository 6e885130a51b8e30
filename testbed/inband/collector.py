"""In-band network telemetry reports: the sinks' exports (ring buffer ``int_reports``) → int.csv and int_paths.csv.

The switch program's sink (ebpf/lib/int.h) exports each instrumented packet's stack — every switch's hop record
— as a ``struct int_report``; ``IntCollector`` keeps the raw bytes while the run goes (a few µs per report) and
decodes them afterwards. The wire format and every column are defined in docs/int.md and results/README.md.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import HelperFailed

REPORT = struct.Struct("<Q4s4sHHBBBBII")        # struct int_report up to its stack (common.h)
HOP = struct.Struct(">IHHIIQII")                 # one hop record, big-endian as on the wire (docs/int.md)
FLAG_EXCEEDED = 1
PROBE_PORT = 0xFA7E                              # INT_PROBE_PORT (common.h): the WCMP controller's probes
F_SETPIPE_SZ = 1031
REPORT_PIPE_BYTES = 1 << 20                      # reports waiting for a forked reader (≈ 5000 of them)


class IntFailed(HelperFailed):
    """The INT reader thread died; one line naming it and the cause."""


@dataclass(frozen=True)
class Hop:
    switch_id: int
    ingress: int             # ifindex
    egress: int
    latency_ns: int          # the wait for the egress queue + the packet's serialisation
    queue_id: int            # the priority whose queue it joined
    queue_bytes: int         # that queue's depth when it arrived
    ts_ns: int               # when the switch handled it (CLOCK_MONOTONIC)
    tx_bytes: int            # the egress port's sent bytes, low 32 bits
    rate_kbps: int           # the egress link's rate


@dataclass(frozen=True)
class Report:
    ts_ns: int
    saddr: str
    daddr: str
    sport: int
    dport: int
    proto: int
    exceeded: bool           # a hop found no room (max_hops): the path is longer than the stack
    length: int              # the original packet's IP length
    hops: tuple[Hop, ...]    # in path order: the source leaf first, the sink last

    @property
    def delay_ns(self) -> int:
        """The path's delay: the sum of its hops' latencies (propagation delay of links not included)."""
        return sum(h.latency_ns for h in self.hops)


def decode(data: bytes) -> Report:
    """One ``struct int_report`` → Report (hops reversed from the wire's newest-first into path order)."""
    ts, sa, da, sport, dport, proto, n, flags, _pad, length, _pad2 = REPORT.unpack_from(data)
    hops = []
    for i in range(n):
        sw, ing, eg, lat, q, tsn, tx, rate = HOP.unpack_from(data, REPORT.size + i * HOP.size)
        hops.append(Hop(sw, ing, eg, lat, q >> 24, q & 0xFFFFFF, tsn, tx, rate))
    return Report(ts, socket.inet_ntoa(sa), socket.inet_ntoa(da), sport, dport, proto, bool(flags & FLAG_EXCEEDED),
                  length, tuple(reversed(hops)))


class ReportPipe:
    """The reports as they come, for a forked helper (the WCMP controller, the collective helper): the parent's
    IntCollector writes each to ``w`` (forward_to), the helper drains ``r``. Made before the fork; the parent
    closes ``r`` once the helper runs (``close_read``), the helper closes ``w`` (``close_write``: else no EOF)."""

    def __init__(self):
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):       # room for a burst of reports between two reads
            fcntl.fcntl(self.w, F_SETPIPE_SZ, REPORT_PIPE_BYTES)
        self._pending = b""

    def close_read(self) -> None:
        if self.r is not None:
            os.close(self.r)
            self.r = None

    def close_write(self) -> None:
        if self.w is not None:
            os.close(self.w)
            self.w = None

    def drain(self) -> list[Report]:
        """The reports written since the last drain (2-byte little-endian length, then the report)."""
        while self.r is not None:
            try:
                chunk = os.read(self.r, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._pending += chunk
        out, buf, at = [], self._pending, 0
        while len(buf) - at >= 2:
            n = int.from_bytes(buf[at:at + 2], "little")
            if len(buf) - at - 2 < n:
                break
            out.append(decode(buf[at + 2:at + 2 + n]))
            at += 2 + n
        self._pending = buf[at:]
        return out


class IntCollector:
    """Background thread: reads the sinks' reports while the run goes; ``rows``/``path_rows`` decode them."""

    def __init__(self, datapath, origin: float, poll_ms: int = 20):
        self.dp, self.origin, self.poll_ms = datapath, origin, poll_ms
        self.raw: list[bytes] = []
        self.error: str | None = None
        self._forward: list[int] = []          # pipes every report is also written to (ReportPipe.w)
        self.forward_lost = 0                  # reports a pipe had no room for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="int-reports", daemon=True)
        # the reports' CLOCK_MONOTONIC → the run's clock (seconds since origin)
        self._mono0, self._wall0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.time()

    def forward_to(self, fd: int) -> None:
        """Also write every report to the non-blocking pipe ``fd`` (2-byte little-endian length, then the
        report: one write of less than PIPE_BUF, so whole or not at all), for a process reading them as they come
        (ReportPipe). A full pipe loses the report there (counted); a closed one ends that forwarding."""
        self._forward.append(fd)

    def _take(self, data: bytes) -> None:
        self.raw.append(data)
        frame = len(data).to_bytes(2, "little") + data
        for fd in list(self._forward):
            try:
                os.write(fd, frame)
            except BlockingIOError:
                self.forward_lost += 1
            except OSError:                    # the reader is gone (its death is reported by its own check)
                self._forward.remove(fd)

    def start(self) -> None:
        self.dp.open_int_reports(self._take if self._forward else self.raw.append)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.error is None:
            self.dp.poll_int(0)               # what the sinks exported before the end

    def check(self) -> None:
        if self.error is not None:
            raise IntFailed(self.error)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.dp.poll_int(self.poll_ms)
        except Exception as e:                 # noqa: BLE001 — kept and reported by check() / the run
            self.error = f"INT report reader failed at {time.time() - self.origin:.2f} s: {type(e).__name__}: {e}"

    def time_s(self, mono_ns: int) -> float:
        return run_clock(self._mono0, self._wall0, self.origin)(mono_ns)

    def reports(self) -> list[Report]:
        return [decode(b) for b in self.raw]

    def rows(self, topo, flows) -> list[dict]:
        """int.csv: one row per hop of every report (results/README.md)."""
        return report_rows([(r, self.time_s) for r in self.reports()], topo, flows)

    def export(self) -> dict:
        """The raw reports with this machine's clock, for a driver that merges several machines' (cluster/run.py)."""
        return {"raw": list(self.raw), "mono0_ns": self._mono0, "wall0": self._wall0, "origin": self.origin}


def run_clock(mono0_ns: int, wall0: float, origin: float) -> Callable[[int], float]:
    """One machine's CLOCK_MONOTONIC (ns) → the run's clock (seconds since ``origin``, wall-clock time)."""
    return lambda mono_ns: (mono_ns - mono0_ns) / 1e9 + (wall0 - origin)


def report_rows(reports: list[tuple[Report, Callable[[int], float]]], topo, flows,
                hop_clock: Callable[[Hop], Callable[[int], float]] | None = None) -> list[dict]:
    """int.csv rows of ``reports`` (each with the clock of the machine whose sink exported it), numbered in
    order. ``hop_clock``: the clock of the machine a hop's switch is on (a fabric over several machines: each
    hop's time was stamped by its own machine's CLOCK_MONOTONIC); None: the report's."""
    names = {i: n for n, i in topo.switch_ids.items()}
    fid = flow_ids(flows)
    out = []
    for n, (r, clock) in enumerate(reports):
        path = ">".join(names.get(h.switch_id, str(h.switch_id)) for h in r.hops)
        t, delay = round(clock(r.ts_ns), 6), r.delay_ns
        flow = fid.get((r.saddr, r.daddr, r.sport, r.dport, r.proto))
        for i, h in enumerate(r.hops):
            hop_t = (hop_clock(h) if hop_clock is not None else clock)(h.ts_ns)
            out.append({"time_s": t, "report": n, "flow_id": flow, "path": path, "hop": i,
                        "switch": names.get(h.switch_id, str(h.switch_id)),
                        "ingress_port": _ifname(topo, h.ingress), "egress_port": _ifname(topo, h.egress),
                        "queue_id": h.queue_id, "queue_bytes": h.queue_bytes, "hop_latency_ns": h.latency_ns,
                        "tx_bytes": h.tx_bytes, "link_rate_bps": h.rate_kbps * 1000, "hop_time_s": round(hop_t, 6),
                        "path_delay_ns": delay, "exceeded": int(r.exceeded), "ip_bytes": r.length,
                        "probe": int(r.dport == PROBE_PORT and r.proto == 17)})
    return out


def _ifname(topo, ifindex: int) -> str:
    """A port's name by its fabric-wide ifindex (a part of a fabric over several machines knows them all)."""
    try:
        return topo.port(ifindex).ifname
    except KeyError:
        return str(ifindex)


def flow_ids(flows) -> dict[tuple, int]:
    """(saddr, daddr, sport, dport, IP protocol) → flow_id, for every 5-tuple a flow sends with."""
    out = {}
    for f in flows:
        for sport in f.source_ports():
            out[(f.src_addr, f.dst_addr, sport, f.dport, f.ip_proto)] = f.flow_id
    return out
