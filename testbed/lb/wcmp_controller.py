"""The WCMP controller (``switch.wcmp.source: int | load``): every ``interval``, each source leaf's weights of the
next hops toward every destination, from what the fabric measured — and ``weights.csv``.

For every next-hop group of a leaf (a FIB entry with more than one port: one destination leaf, or a pod) each
member port gets a congestion signal over the interval:

- ``int``: the mean path delay of the INT reports whose first hop left the leaf through that port toward the
  group's destinations (the sum of the hop latencies, inband/collector.py), less the sink's hop (the port to the
  receiving host, the same on every path). A member without a report in the
  interval keeps its weight and is sent a probe: a UDP packet to port ``PROBE_PORT`` carrying an INT stack
  whose first record the controller writes (the leaf's queue from the queue model), sent out of that port's
  real queue; every switch on the way adds its record, and the sink exports it and drops it.
- ``load``: 1 / (1 − u), u the highest utilisation of the member's link and of the next switch's ports toward
  the destination (what its switch program forwarded over the link rate, an EWMA over ~5 intervals, capped at
  0.99): the relative delay of an M/M/1 queue at that load. Nothing is sent.

Then, the goal being equal delay over the used paths: w ← w × clamp((mean signal / signal)^GAIN, 1/STEP, STEP),
normalised, every member keeping at least one slot of the table (so it carries enough to stay measured), and
the group's table is rewritten in one map update (``Datapath.set_group_weights``; its ports stay as routing
left them).
"""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import struct
import threading
import time

from ..errors import HelperFailed
from ..fabric import netns
from ..helper import ForkedHelper, write_result
from ..inband.collector import PROBE_PORT, ReportPipe
from ..telemetry.periodic import run_every

GAIN = 0.1            # exponent of the multiplicative update: a tenth of the log-ratio per interval (damping)
LOAD_EWMA = 0.2       # load: each port's utilisation smoothed over ~5 intervals (one 10 ms interval at 20 Mbit/s
                      # holds ~16 packets: ±1 read ±6 %, and 1/(1 − u) made the weights swing 0.12–0.44)
STEP = 1.5            # a weight changes by at most ×1.5 or ÷1.5 per interval
SCALE = 10_000        # float weights → the integer weights the table is built from
INT_DSCP_BIT = 0x04
INT_INSTRUCTIONS, INT_DS_ID, INT_DS_INSTRUCTIONS = 0xF800, 0x4654, 0xC000


class WcmpFailed(HelperFailed):
    """The controller process died; one line naming it and the cause."""


class Group:
    """One leaf's next-hop group toward a prefix, and the controller's weights of its members."""

    def __init__(self, entry):
        """``entry``: the topology's FibEntry of the group."""
        self.leaf, self.prefix, self.plen, self.net = entry.switch, entry.prefix, entry.plen, entry.network
        self.ports = tuple(entry.ports)
        self.weights = [1.0 / len(self.ports)] * len(self.ports)
        self.targets: list[str] = []           # probe destinations: a host of every leaf the group leads to
        self._next = 0

    def target(self) -> str:
        t = self.targets[self._next % len(self.targets)]
        self._next += 1
        return t

    @property
    def name(self) -> str:
        return f"{self.prefix}/{self.plen}"


def update(weights: list[float], signals: list[float | None], min_share: float) -> list[float]:
    """One step of the controller: members with a signal move towards equal signals (the lower one's weight
    grows), members without one keep their weight; normalised, none below ``min_share``."""
    seen = [s for s in signals if s is not None and s > 0]
    if not seen:
        return list(weights)
    mean = sum(seen) / len(seen)
    out = []
    for w, s in zip(weights, signals):
        if s is not None and s > 0:
            w *= min(STEP, max(1 / STEP, (mean / s) ** GAIN))
        out.append(w)
    total = sum(out)
    out = [w / total for w in out]
    low: set[int] = set()
    while True:                                    # the floor, then the rest scaled into what is left
        new_low = {i for i, w in enumerate(out) if w < min_share} | low
        if new_low == low:
            return out
        low = new_low
        rest = sum(w for i, w in enumerate(out) if i not in low)
        scale = (1 - len(low) * min_share) / rest if rest > 0 else 0.0
        out = [min_share if i in low else w * scale for i, w in enumerate(out)]


class WcmpController(ForkedHelper):
    """The forked process applying ``switch.wcmp`` (source int or load) every interval (helper.py: checked while
    the traffic runs, a death fails the run in one line naming it); ``rows`` → weights.csv, ``health()`` → the
    manifest, both once stopped. With source ``int`` the run's INT collector hands it every report through a
    pipe (``reports``, a ReportPipe: IntCollector.forward_to its ``w``)."""

    label = "WCMP controller"
    failure = WcmpFailed

    def __init__(self, topo, datapath, fabric, scen, origin: float):
        super().__init__()
        self.topo, self.dp, self.fabric, self.origin = topo, datapath, fabric, origin
        self.spec = scen.switch.wcmp
        self.source, self.interval = self.spec.source, self.spec.interval / 1e9
        self.max_hops = scen.telemetry.int.max_hops
        self.min_share = 1.0 / self.spec.slots
        self.rows: list[dict] = []
        self.probes = self.intervals = self.late = 0
        self.error: str | None = None
        self.groups = [Group(e) for e in topo.fib if topo.nodes[e.switch].kind == "leaf" and len(e.ports) > 1]
        for g in self.groups:                          # the first host of every other leaf inside the prefix
            firsts: dict[str, str] = {}
            for h in topo.hosts:
                leaf = topo.leaf_of(h, 0)
                if leaf != g.leaf and leaf not in firsts and ipaddress.IPv4Address(topo.address(h)) in g.net:
                    firsts[leaf] = topo.address(h)
            g.targets = list(firsts.values())
        self.groups = [g for g in self.groups if g.targets]
        self._names = {i: n for n, i in topo.switch_ids.items()}       # switch id → name (INT reports)
        self._by_leaf: dict[str, list[Group]] = {}
        for g in self.groups:
            self._by_leaf.setdefault(g.leaf, []).append(g)
        for gs in self._by_leaf.values():
            gs.sort(key=lambda g: -g.plen)
        # a probe's source address: its leaf's gateway (.254 of the leaf's own prefix)
        self._gateway = {e.switch: str(e.network.network_address + 254)
                         for e in topo.fib if topo.nodes[e.switch].kind == "leaf" and not e.ports and e.plen <= 24}
        # load: the next switch's ports toward each group's destinations, per (group, member)
        self._down: dict[tuple[int, int], list[int]] = {}
        for g in self.groups:
            for p in g.ports:
                nxt = topo.port(p).peer_node
                self._down[(id(g), p)] = [q for e in topo.fib if e.switch == nxt and e.ports
                                          and e.network.overlaps(g.net)
                                          for q in e.ports]
        self._socks: dict[int, socket.socket] = {}
        self._last_c = None
        self._util: dict[int, float] = {}              # load: smoothed utilisation per port
        self.reports: ReportPipe | None = None         # int: the INT reports, as they come

    # ---- life cycle (the parent's side)

    def start(self) -> None:
        """Fork the controller (before the run's threads start: a fork copies only the calling thread)."""
        if self.source == "int":                       # one raw socket per leaf uplink, in the leaf's namespace
            for g in self.groups:
                for p in g.ports:
                    if p not in self._socks:
                        port = self.topo.port(p)
                        self._socks[p] = netns.run_in(self.fabric.ns[g.leaf], _packet_socket, port.ifname)
            self.reports = ReportPipe()

        def after():                                   # the child's now
            for s in self._socks.values():
                s.close()
            self._socks.clear()
            if self.reports is not None:
                self.reports.close_read()
        try:
            self._fork(lambda wfd, ready: self._run(wfd, ready), f"ftb-{self.fabric.lab}-wcm", after_fork=after)
        except BaseException:
            self._close_reports()
            raise

    def stop(self) -> dict:
        """End the controller; its rows and health come back with its results (raises WcmpFailed if it died)."""
        self._close_reports()
        try:
            res = super().stop()
        except WcmpFailed as e:
            self.error = str(e)
            raise
        self.rows = res.get("rows", [])
        for k in ("intervals", "late", "probes"):
            setattr(self, k, res.get(k, 0))
        return res

    def _close_reports(self) -> None:
        if self.reports is not None:
            self.reports.close_write()

    def health(self) -> dict:
        return {"source": self.source, "interval_s": self.interval, "intervals": self.intervals,
                "late_intervals": self.late, "probes": self.probes, "groups": len(self.groups), "error": self.error}

    # ---- the child

    def _run(self, wfd: int, ready) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        if self.reports is not None:
            self.reports.close_write()                 # the parent's end: EOF would never come otherwise
        self._last_c = self.dp.port_counters()
        ready()
        try:
            run_every(self.interval, stop, self.step, self._late)
        except Exception as e:                         # noqa: BLE001 — the one line the parent reports
            raise RuntimeError(f"failed at {time.time() - self.origin:.2f} s: {type(e).__name__}: {e}") from e
        write_result(wfd, {"rows": self.rows, "intervals": self.intervals, "late": self.late,
                           "probes": self.probes})

    def _late(self) -> None:
        self.late += 1

    def _new_reports(self) -> list:
        """The INT reports the collector forwarded since the last interval."""
        return self.reports.drain() if self.reports is not None else []

    # ---- one interval

    def step(self) -> None:
        self.intervals += 1
        signals = self._int_signals() if self.source == "int" else self._load_signals()
        now = round(time.time() - self.origin, 6)
        for g in self.groups:
            sig = signals.get(id(g), [None] * len(g.ports))
            g.weights = update(g.weights, sig, self.min_share)
            self.dp.set_group_weights(g.leaf, g.prefix, g.plen,
                                      {p: max(1, round(w * SCALE)) for p, w in zip(g.ports, g.weights)})
            for p, w, s in zip(g.ports, g.weights, sig):
                port = self.topo.port(p)
                self.rows.append({"time_s": now, "switch": g.leaf, "group": g.name, "next_hop": port.peer_node,
                                  "port": port.ifname, "weight": round(w, 6), "signal": s, "source": self.source})
            if self.source == "int":
                for p, s in zip(g.ports, sig):
                    if s is None:
                        self._probe(g, p)

    def _group_of(self, leaf: str, daddr: str) -> Group | None:
        a = ipaddress.IPv4Address(daddr)
        return next((g for g in self._by_leaf.get(leaf, ()) if a in g.net), None)

    def _int_signals(self) -> dict[int, list[float | None]]:
        """Per group, per member: the mean INT path delay (ns) of the interval's reports through it."""
        acc: dict[tuple[int, int], list[int]] = {}
        for r in self._new_reports():
            if not r.hops:
                continue
            g = self._group_of(self._names.get(r.hops[0].switch_id, ""), r.daddr)
            if g is None or r.hops[0].egress not in g.ports:
                continue
            # the fabric's part of the delay: the sink's hop (its port to the receiving host) is the same on
            # every path to that host, and its queue would only add the receiver's noise to the choice
            fabric = r.delay_ns - (r.hops[-1].latency_ns if len(r.hops) > 1 else 0)
            acc.setdefault((id(g), r.hops[0].egress), []).append(fabric)
        return {id(g): [(sum(v) / len(v)) if (v := acc.get((id(g), p))) else None for p in g.ports]
                for g in self.groups}

    def _load_signals(self) -> dict[int, list[float | None]]:
        """Per group, per member: 1 / (1 − u) of the busiest link on the member's way (its own, then the next
        switch's ports toward the group's destinations)."""
        c, c0 = self.dp.port_counters(), self._last_c
        self._last_c = c
        rates = self.dp.port_rates()                   # a degraded link's rate, not the topology's
        for ifx, a in c.items():
            b = c0.get(ifx)
            if b is not None and a.read_at > b.read_at:
                u = (a.tx_bytes - b.tx_bytes) * 8 / (rates[ifx] * (a.read_at - b.read_at))
                self._util[ifx] = self._util.get(ifx, u) + LOAD_EWMA * (u - self._util.get(ifx, u))

        def util(ifx: int) -> float:
            return self._util.get(ifx, 0.0)
        out = {}
        for g in self.groups:
            sig = []
            for p in g.ports:
                u = max([util(p)] + [util(q) for q in self._down[(id(g), p)]])
                sig.append(1.0 / (1.0 - min(u, 0.99)))
            out[id(g)] = sig
        return out

    # ---- probes

    def _probe(self, g: Group, ifx: int) -> None:
        """A probe out of leaf port ``ifx`` toward one of the group's destinations."""
        frame = probe_frame(self.topo, g.leaf, ifx, self._gateway.get(g.leaf, "198.18.0.254"), g.target(),
                            self.dp.queue_depth(ifx), time.clock_gettime_ns(time.CLOCK_MONOTONIC), self.max_hops)
        self._socks[ifx].send(frame)
        self.probes += 1


def probe_frame(topo, leaf: str, ifx: int, src: str, dst: str, queue_bytes: int, now_ns: int, max_hops: int) -> bytes:
    """The Ethernet frame of a probe leaving ``leaf`` through port ``ifx``: IPv4 with DSCP bit 0, UDP to
    PROBE_PORT (checksum 0), shim + INT-MD header and the leaf's own hop record (docs/int.md) — what the switch
    program's source would have written: the queue it joins, the wait for it + its own serialisation."""
    port = topo.port(ifx)
    stack = 16 + 32
    ip_len = 20 + 8 + stack
    lat = int((queue_bytes + ip_len + 14) * 8e9 / port.rate_bps)
    rec = struct.pack(">IHHIIQII", topo.switch_ids[leaf], 0, ifx & 0xFFFF, min(lat, 2**32 - 1),
                      min(queue_bytes, 0xFFFFFF), now_ns, 0, port.rate_bps // 1000)
    hdr = struct.pack(">BBBBIHHHH", 1 << 4, stack // 4, 0, 0, (2 << 28) | (8 << 8) | (max_hops - 1),
                      INT_INSTRUCTIONS, INT_DS_ID, INT_DS_INSTRUCTIONS, 0)
    udp = struct.pack(">HHHH", PROBE_PORT, PROBE_PORT, 8 + stack, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, INT_DSCP_BIT, ip_len, 0, 0, 64, 17, 0, socket.inet_aton(src),
                     socket.inet_aton(dst))
    ip = ip[:10] + struct.pack(">H", _ip_checksum(ip)) + ip[12:]
    eth = bytes.fromhex(port.peer_mac.replace(":", "")) + bytes.fromhex(port.mac.replace(":", "")) + b"\x08\x00"
    return eth + ip + udp + hdr + rec


def _packet_socket(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    s.bind((ifname, 0))
    return s


def _ip_checksum(hdr: bytes) -> int:
    s = sum(struct.unpack(f">{len(hdr) // 2}H", hdr))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF
