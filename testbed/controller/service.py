"""The fabric controller as a helper process of the run.

The controller is a forked helper (``ftb-<lab>-ctl``, helper.py) holding a ``Planner`` over the fabric's real
ECMP hashes. At start it plans every flow the run will send — for a schedule, every queue pair it sends over
(connections.py) — as a job scheduler or a collective library knows its communication pattern: largest first,
then repaired until no link carries two flows where paths of their own exist. The hosts ask for their flows' source ports when their flows start, over
the channel of ``workloads/controller_channel.py`` (a Unix datagram socket, JSON messages, version 1); a host
that gets no answer within ``controller.timeout`` keeps its own port, and the run's results count it. A flow the
controller was not told of gets the best path left at that moment.

With ``entropy: adaptive`` it also wakes every ``controller.interval``, reads from the switch program's maps
which ports are down, each port's rate now and its queue model's depth, and moves flows (controller/adaptive.py)
by sending their hosts a new port unasked, to the address their request came from.

Its results: one row per decision for ``controller.csv`` (time_s since the run's time zero, flow, old = the
host's own port, new, reason) and the manifest's ``controller`` section (requests, ``planned_shared_links``: links
the plan put more than one flow on, 0 where paths of their own exist).
"""
from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from ..errors import HelperFailed
from ..helper import SocketHelper, next_message, send_to, write_result
from ..fabric.netns import STATE_DIR
from ..workloads.controller_channel import VERSION, reply
from .connections import planned_run


def socket_path(lab: str) -> Path:
    """The controller's socket: a file of this machine, reachable from every host namespace."""
    return Path(STATE_DIR) / "labs" / f"{lab}-ctl.sock"


class ControllerFailed(HelperFailed):
    """The fabric controller died or could not report; one line naming it."""


class FabricController(SocketHelper):
    """The parent's side: ``start()`` binds the socket and forks the controller (it plans every flow before it
    says it is ready), ``stop()`` returns its decisions."""

    label = "fabric controller"
    failure = ControllerFailed

    def __init__(self, topo, scen, lab: str, flows, origin: float, datapath=None):
        super().__init__(socket_path(lab))
        self.topo, self.scen, self.lab, self.flows, self.origin = topo, scen, lab, list(flows), origin
        self.datapath = datapath                # adaptive: the switch program whose maps it reads
        self.proc_name = f"ftb-{lab}-ctl"

    def serve(self, sock, wfd: int, ready) -> None:
        _serve(self, sock, wfd, ready)


def _serve(o: FabricController, sock: socket.socket, wfd: int, ready) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    run = planned_run(o.scen, o.topo, o.flows)
    planner, known = run.planner, run.known
    planned = dict(planner.chosen)
    shared = planner.shared_links()
    rows, stats = [], {"requests": 0, "unknown_flows": 0, "bad_messages": 0, "ticks": 0, "moves_unsent": 0}
    addrs: dict[int, str] = {}                       # flow → the socket its host asked from
    adapter, interval, next_tick = None, 0.2, float("inf")
    if o.scen.controller.entropy == "adaptive":
        from .adaptive import Adapter
        adapter = Adapter(planner, {k: known[k] for k in planned})
        interval = o.scen.controller.interval_ns / 1e9
        next_tick = time.monotonic() + interval
        stats["tick_s_max"] = 0.0
    ready()
    while not stop:
        now = time.monotonic()
        if now >= next_tick:
            moves = _tick(o.datapath, adapter, stats)
            next_tick = max(next_tick + interval, time.monotonic() + interval / 2)
            for fid, sport, reason in moves:
                rows.append({"time_s": time.time() - o.origin, "flow": fid, "old": None, "new": sport,
                             "reason": reason})
                if not send_to(sock, reply(fid, sport, reason), addrs.get(fid)):
                    stats["moves_unsent"] += 1
            continue
        msg, addr = next_message(sock, min(0.2, max(0.0, next_tick - now)), VERSION, ("plan", "end"))
        if msg is None:
            continue
        try:
            fid = int(msg["flow"])
        except (ValueError, KeyError, TypeError):
            stats["bad_messages"] += 1
            continue
        if msg["op"] == "end":
            if run.scheduled:
                continue                             # a QP lives as long as the job: its links stay planned
            if adapter is not None:
                adapter.end(fid)
            else:
                planner.release(fid)
            continue
        stats["requests"] += 1
        if run.port(fid) is not None:
            sport = run.port(fid)
        else:
            stats["unknown_flows"] += 1
            sport = planner.assign(known[fid]) if fid in known else int(msg.get("sport") or 0)
            if adapter is not None and fid in known:
                adapter.flows[fid] = known[fid]
        if addr:
            addrs[fid] = addr
        rows.append({"time_s": time.time() - o.origin, "flow": fid, "old": msg.get("sport"), "new": sport,
                     "reason": "start"})
        send_to(sock, reply(fid, sport, "start"), addr)
    write_result(wfd, {"rows": _with_old(rows), "planned_shared_links": shared, "planned_flows": len(planned),
                       **stats})


def _tick(dp, adapter, stats: dict) -> list[tuple[int, int, str]]:
    """One adaptive step: the datapath's readings (only the ports the plan uses are asked for their queues:
    each map read costs CPU the traffic needs), then the adapter's moves."""
    t = time.monotonic()
    down = dp.ports_down()
    rates = dp.port_rates()
    used = [p for p, u in adapter.planner.users.items() if u and p in rates]
    queues = {p: dp.queue_depth(p) for p in used}
    moves = adapter.tick(down, rates, queues)
    if adapter.changed:                              # the instants it saw the fabric's ports change
        stats.setdefault("replanned_at", []).append(time.time())
    stats["ticks"] += 1
    stats["tick_s_max"] = max(stats["tick_s_max"], time.monotonic() - t)
    return moves


def _with_old(rows: list[dict]) -> list[dict]:
    """Fill each move's ``old``: the port the flow had before it (its start row's ``new``, or its last move's)."""
    last: dict[int, int] = {}
    for r in rows:
        if r["old"] is None and r["flow"] in last:
            r["old"] = last[r["flow"]]
        last[r["flow"]] = r["new"]
    return rows
