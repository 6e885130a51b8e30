"""The collective helper: a forked helper of the run (``ftb-<lab>-ccl``) that decides each adapted operation.

It knows the run's collective flows (the schedule is deterministic: the same flows the traffic makes) grouped
into operations (policy.Operation, one per job iteration). When the first host of an operation asks
(workloads/collective_channel.py), it reads the switch program's counters into a NetworkView (view.py; at most
every ``adapt.interval``, else the last reading), runs the policy, keeps the decision, and answers every host of
the operation from it. Its results: one row per operation (the flows the policy moved: collectives.csv
``adapt_decisions``), the signals each decision read (``collective_signals.csv``) and counts for the manifest.
"""
from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from ..errors import HelperFailed
from ..fabric.netns import STATE_DIR
from ..helper import SocketHelper, next_message, send_to, write_result
from ..workloads.collective_channel import VERSION, answer
from .view import IntDepths, NetworkView, PortReading, signals_between

WIRE_HDR = {"udp": 14 + 28 + 20, "rocev2": 14 + 28 + 12 + 4}   # Ethernet + IP/UDP + the engine's own header


def socket_path(lab: str) -> Path:
    return Path(STATE_DIR) / "labs" / f"{lab}-ccl.sock"


class CollectiveHelperFailed(HelperFailed):
    """The collective helper died or could not report; one line naming it."""


def operations(flows, owner, origins, topo) -> dict:
    """key → policy.Operation of every flow with ``adapt`` set (``owner``: each flow's transfer, ``origins``:
    transfer id → its job step, as replay.from_collectives gives them)."""
    from ..controller.connections import plan_flow
    from .policy import OpFlow, Operation
    ops: dict[str, Operation] = {}
    for f, t in zip(flows, owner):
        if not f.adapt:
            continue
        o = origins[t.id]
        op = ops.setdefault(f.adapt, Operation(f.adapt, o.job, o.iteration, o.op))
        op.flows.append(OpFlow(f.flow_id, o.step, f.size_bytes, f.sport, plan_flow(f, topo), (f.src, f.dst, f.rail),
                               o.variant))
    return ops


def scheduled_operations(scen, topo) -> tuple[list, dict]:
    """The run's adapted flows and operations: the same schedule the traffic plays (it is deterministic). With
    the fabric controller planning, each flow's port is the one the controller gives its QP (the same plan:
    controller/connections.py), so that the policies weigh the paths the traffic takes."""
    from ..workloads import replay
    origins: dict = {}
    transfers = replay.from_collectives(scen.traffic, topo, scen.seed, origins)
    flows, owner = replay.flows_of(transfers, scen.traffic, topo, scen.seed, origins=origins)
    if scen.controller.entropy != "off":
        from ..controller.connections import planned_run
        run = planned_run(scen, topo, flows)
        for f in flows:
            f.sport = run.port(f.flow_id) or f.sport
    return [f for f in flows if f.adapt], operations(flows, owner, origins, topo)


def wire_ratio(f, packet_size: int) -> float:
    """Bits a switch port sends per payload bit of flow ``f`` (headers of every packet)."""
    payload = (f.opts or {}).get("mtu") if f.proto == "rocev2" else packet_size - 48
    return (payload + WIRE_HDR.get(f.proto, 62)) / payload


class CollectiveHelper(SocketHelper):
    """The parent's side: ``start()`` binds the socket and forks the helper, ``stop()`` returns its results."""

    label = "collective helper"
    failure = CollectiveHelperFailed

    def __init__(self, topo, scen, lab: str, origin: float, datapath):
        super().__init__(socket_path(lab))
        self.topo, self.scen, self.lab, self.origin, self.datapath = topo, scen, lab, origin, datapath
        self.flows, self.ops = scheduled_operations(scen, topo)
        self.proc_name = f"ftb-{lab}-ccl"
        self.reports = None                      # signal int: the INT reports as they come (ReportPipe)

    def start(self) -> None:
        if "int" in self.scen.traffic.collective.adapt.signals:
            from ..inband.collector import ReportPipe
            self.reports = ReportPipe()
        try:
            super().start()
        except BaseException:
            if self.reports is not None:
                self.reports.close_write()
            raise

    def after_fork(self) -> None:
        if self.reports is not None:
            self.reports.close_read()

    def stop(self) -> dict:
        if self.reports is not None:
            self.reports.close_write()
        return super().stop()

    def serve(self, sock, wfd: int, ready) -> None:
        if self.reports is not None:
            self.reports.close_write()           # the parent's end
        _serve(self, sock, wfd, ready)


def read_ports(dp, ports) -> dict[int, PortReading]:
    """The counters of ``ports`` now (the queue model's summed over priorities; depth maxima left alone: the
    link sampler resets those)."""
    at = time.monotonic()
    rates = dp.port_rates()
    tx = dp.port_counters()
    q: dict[int, list[int]] = {}
    for (ifx, _prio), c in dp.queue_counters(ports, reset_max=False).items():
        s = q.setdefault(ifx, [0, 0, 0, 0])
        s[0] += c.packets
        s[1] += c.depth_sum
        s[2] += c.ect_packets
        s[3] += c.ecn_marks
    return {p: PortReading(at, tx[p].tx_bytes, *q.get(p, (0, 0, 0, 0)), capacity_bps=float(rates[p]),
                           buffer_bytes=dp.port_buffer(dp.topo.port(p)))
            for p in ports if p in tx and p in rates}


class Reader:
    """NetworkViews from the datapath: each one over the span since the previous reading, the adapted
    operations' own planned bits taken out of the links' utilisation."""

    def __init__(self, dp, model, topo, signals, origin: float, reports=None):
        self.dp, self.model, self.topo, self.signals, self.origin = dp, model, topo, tuple(signals), origin
        self.ports = sorted(p.ifindex for sw in topo.switches for p in topo.ports[sw])
        self.last = read_ports(dp, self.ports)
        self.own: dict[int, float] = {}            # port → bits the operations decided since `last` put on it
        self.view: NetworkView | None = None
        self.reports = reports                     # a ReportPipe (signal int), drained by take_reports
        self.depths = IntDepths()
        self.int_reports = 0

    def take_reports(self) -> None:
        """Fold the INT reports that came into the depths of the span (often: the pipe must not fill)."""
        if self.reports is not None:
            got = self.reports.drain()
            self.int_reports += len(got)
            self.depths.add(got)

    def read(self) -> NetworkView:
        down = frozenset(self.dp.ports_down())
        now = read_ports(self.dp, self.ports)
        self.take_reports()
        links = {p: signals_between(self.last[p], r, self.own.get(p, 0.0), p in down,
                                    self.depths.share(p, r.buffer_bytes))
                 for p, r in now.items() if p in self.last}
        self.last, self.own = now, {}
        self.depths.reset()
        self.model.down = down
        self.view = NetworkView(self.model, links, self.signals, time.time() - self.origin)
        return self.view

    def planned(self, bits: dict[int, float]) -> None:
        for p, b in bits.items():
            self.own[p] = self.own.get(p, 0.0) + b


def _serve(o: CollectiveHelper, sock: socket.socket, wfd: int, ready) -> None:
    from ..controller.planner import PathModel
    from .policy import get_policy
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    scen, a = o.scen, o.scen.traffic.collective.adapt
    ops = o.ops
    ratio = {f.flow_id: wire_ratio(f, scen.packet_size) for f in o.flows}
    policy = get_policy(a.policy)()
    model = PathModel(o.topo, scen.switch.hash_seed, scen.switch.hash_fields)
    reader = Reader(o.datapath, model, o.topo, a.signals, o.origin, o.reports)
    interval = a.interval / 1e9
    read_at = -1.0
    decided: dict[str, dict[int, int]] = {}
    rows, signal_rows = [], []
    stats = {"requests": 0, "decisions": 0, "bad_messages": 0, "unknown_operations": 0, "decide_s_max": 0.0}
    ready()
    while not stop:
        msg, addr = next_message(sock, 0.05 if o.reports is not None else 0.2, VERSION, ("decide",))
        reader.take_reports()
        if msg is None:
            continue
        if "key" not in msg or "host" not in msg:
            stats["bad_messages"] += 1
            continue
        key, host = str(msg["key"]), str(msg["host"])
        stats["requests"] += 1
        op = ops.get(key)
        if op is None:
            stats["unknown_operations"] += 1
            send_to(sock, answer(key, {}), addr)
            continue
        if key not in decided:
            t = time.monotonic()
            fresh = t - read_at >= interval
            view = reader.read() if fresh else reader.view
            if fresh:
                read_at = t
                signal_rows += _signal_rows(view, o.topo, op)
            d = policy.decide(op, view)
            held = {k: v for k, v in policy.delays(op, view, d).items() if v > 0}
            decided[key] = d, held
            reader.planned(_bits(op, d, view, ratio))
            stats["decisions"] += 1
            stats["decide_s_max"] = max(stats["decide_s_max"], time.monotonic() - t)
            stats["paced_flows"] = stats.get("paced_flows", 0) + len(held)
            ran = [f for f in op.flows if d.get(f.flow_id, f.sport) is not None]
            rows.append({"key": key, "time_s": time.time() - o.origin, "flows": len(ran), "read": view.at,
                         "moved": sum(1 for f in ran if d.get(f.flow_id, f.sport) != f.sport or f.variant
                                      or f.flow_id in held),
                         "variant": min((f.variant for f in ran), default=None)})
        d, held = decided[key]
        mine = [f for f in op.flows if host in f.conn[:2]]
        sent = [f for f in mine if f.conn[0] == host]
        send_to(sock, answer(key, {f.flow_id: d[f.flow_id] for f in sent if d.get(f.flow_id) is not None},
                             [f.flow_id for f in mine if f.flow_id in d and d[f.flow_id] is None],
                             {f.flow_id: held[f.flow_id] for f in sent if f.flow_id in held}), addr)
    if o.reports is not None:
        stats["int_reports"] = reader.int_reports
    write_result(wfd, {"rows": rows, "signals": signal_rows, "policy": a.policy, "ring_orders": ring_orders(ops),
                       **stats})


def ring_orders(ops: dict) -> dict[str, list[list[str]]] | None:
    """Each job's ring orders as laid out (job → order k's hosts from its first), read from its first
    operation's first step; None when no job lays out more than one."""
    out: dict[str, list[list[str]]] = {}
    for op in ops.values():
        if op.job in out or op.pattern != "allreduce":
            continue
        rings = []
        for flows in op.variants().values():
            succ = {f.conn[0]: f.conn[1] for f in flows if f.step == 0}
            ring = [flows[0].conn[0]]
            while len(ring) < len(succ):
                ring.append(succ[ring[-1]])
            rings.append(ring)
        out[op.job] = rings
    return out if any(len(r) > 1 for r in out.values()) else None


def _bits(op, moved: dict[int, int], view, ratio) -> dict[int, float]:
    """The bits each link carries for ``op`` as decided (headers included)."""
    out: dict[int, float] = {}
    for f in op.flows:
        sport = moved.get(f.flow_id, f.sport)
        if sport is None:                                  # not run
            continue
        for p in view.path(f.plan, sport):
            out[p] = out.get(p, 0.0) + f.bytes * 8 * ratio[f.flow_id]
    return out


def _signal_rows(view, topo, op) -> list[dict]:
    """collective_signals.csv rows: every switch port on a path the operation's QPs may take."""
    qps = op.qp_ports()
    ports = sorted({p for f in op.flows for sp in qps[f.conn] for p in view.path(f.plan, sp) if p in view.links})
    out = []
    for p in ports:
        s, port = view.links[p], topo.port(p)
        out.append({"time_s": view.at, "job": op.job, "iteration": op.iteration, "switch": port.node,
                    "port": port.ifname, "peer": port.peer_node, "capacity_bps": s.capacity_bps, "util": s.util,
                    "queue": s.queue, "ecn": s.ecn, "available_bps": view.available_bps(p), "int": s.int})
    return out
