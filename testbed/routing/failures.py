"""The failure scheduler: applies the scenario's ``failures`` to the running fabric at their times, and the
analysis of what they did (failures.csv).

**Clock.** ``at`` counts from the traffic's t0 — the instant every flow's ``start`` is measured from, chosen by
the workload once every traffic agent is ready (workloads.run) — not from the run's time zero (the sampler's
first reading, a few hundred ms earlier): "1 s into the traffic" is what a failure scenario means. The
scheduler is forked when the lab is built and waits for t0 on a pipe; failures.csv reports both ``at_s`` and
the instant it was applied on the run's clock (``time_s``).

**What an event does** (one netlink request per interface, each acknowledged):
- ``link: [a, b], state: down`` — the link's upper end (b, the end farther from the hosts: a leaf's port to a
  host, a spine's to a leaf, a core's to a spine) is set administratively down. A veth loses carrier on both
  ends then, and its queue is flushed, as a cut cable's would be; the lower end (a host NIC, say) keeps its
  address and routes. ``up`` sets it up again, which brings carrier back on both ends.
- ``node: <switch>, state: down|up`` — every port of the switch, so every link it has.
- ``link: [a, b], rate: R`` — both ends' TBF changed to R (burst as at build time) and, on switch ports, the
  queue model's drain rate with it. Single-queue ports only (refused in the scenario otherwise).
Nothing here tells the fabric what happened: the routing agent (routing.py) must notice it from the kernel.

**Over several machines** (testbed/cluster/) every machine runs a scheduler for its own nodes, all started on
the same t0. A link cut by the partition is a VXLAN port on each machine, and a VXLAN device has no carrier to
lose: both its ends are set down, each by its machine's scheduler (a switch going down also sets down the far
ends of its cut links). A rate change applies to the ends on this machine.
"""
from __future__ import annotations

import math
import os
import signal
import struct
import time

from ..errors import HelperFailed
from ..fabric import netns
from ..fabric.netlink import tbf_change_message
from ..fabric.port import tbf_burst
from ..helper import ForkedHelper, wait_readable, write_result

RTM_SETLINK = 19
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
IFF_UP = 1
TC_H_ROOT = 0xFFFFFFFF
TBF_ROOT = 0x10000
POLL_S = 0.05
DIP_WINDOW_S = 0.25          # a flow's dip is looked for up to this long after the reroute (or the event)
BASELINE_S = 0.5             # … against its rate over this long before the event
DIP_BIN_S = 0.05             # rates are compared over windows of this length
AFFECTED_DIP = 0.1           # a flow whose rate fell by at least this share, or that lost a packet, is affected


class FailureSchedulerFailed(HelperFailed):
    """The failure scheduler died or could not report; one line naming it."""


def setlink_message(ifindex: int, up: bool, seq: int = 1) -> bytes:
    """RTM_SETLINK changing only IFF_UP of one interface, with an ACK."""
    return (struct.pack("IHHII", 32, RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, seq, 0)
            + struct.pack("BBHiII", 0, 0, 0, ifindex, IFF_UP if up else 0, IFF_UP))


def upper_end(topo, a: str, b: str):
    """The port of link a–b that is farther from the hosts (the link's ``b`` end: a leaf's port to a host, a
    spine's to a leaf, a core's to a spine)."""
    return next(ln.b for ln in topo.links if {ln.a.node, ln.b.node} == {a, b})


def state_ports(topo, f, local) -> list:
    """The ports of ``local`` nodes whose administrative state an event sets: a link's upper end (its lower end
    loses carrier), or the switch's every port; where a link is cut (one end elsewhere) the local end too."""
    ports = event_ports(topo, f)
    out = []
    for a, b in zip(ports[::2], ports[1::2]):
        if a.node in local and b.node in local:
            out.append(upper_end(topo, a.node, b.node) if f.link else (a if a.node == f.node else b))
        elif a.node in local or b.node in local:
            out.append(a if a.node in local else b)
    return out


def event_ports(topo, f) -> list:
    """The ports an event concerns: both ends of its link, or both ends of every link of its switch."""
    if f.link:
        a, b = f.link
        p = next(p for p in topo.ports[a] if p.peer_node == b)
        return [p, topo.port(p.peer_ifindex)]
    return [q for p in topo.ports[f.node] for q in (p, topo.port(p.peer_ifindex))]


class FailureScheduler(ForkedHelper):
    """The parent's side (helper.py): ``start()`` forks the scheduler, ``go(t0)`` starts its clock,
    ``stop()`` returns what it applied and when."""

    label = "failure scheduler"
    failure = FailureSchedulerFailed

    def __init__(self, datapath, fabric, scen, whole=None):
        """``whole``: the whole fabric when this lab is one machine's part of it (``fabric.topo``)."""
        super().__init__()
        self.dp, self.fabric, self.scen = datapath, fabric, scen
        self.topo = whole if whole is not None else fabric.topo
        self.local = set(fabric.topo.nodes)
        self.events = list(scen.failures)
        self._cmd_w = None
        self._started = False

    def _prepare(self) -> None:
        topo = self.topo
        nodes = set()
        self.plans = []                  # per event: list of (node, message, what) + model changes
        for f in self.events:
            msgs, model = [], []
            if f.rate is not None:
                for p in event_ports(topo, f):
                    if p.node not in self.local:
                        continue
                    c = self.fabric.ports[p.ifindex]
                    msgs.append((p.node, tbf_change_message(p.ifindex, TBF_ROOT, TC_H_ROOT, f.rate,
                                                            tbf_burst(f.rate, c.mtu), c.queue_limit()),
                                 f"tbf {f.rate} bit/s on {p.node}/{p.ifname}"))
                    if c.is_switch_port:
                        model.append((p.ifindex, max(1, 8 * 10**12 // f.rate)))
                    nodes.add(p.node)
            self.plans.append((msgs, model))
        # link state: which interface each link/node event sets here
        self.ifaces = {}
        for f in self.events:
            if f.state is None:
                continue
            for p in state_ports(topo, f, self.local):
                self.ifaces[p.ifindex] = p
                nodes.add(p.node)
        self.nl = {n: netns.netlink_socket(self.fabric.ns[n]) for n in nodes}

    def start(self) -> None:
        self._prepare()
        cmd_r, cmd_w = os.pipe()
        bpf = self.dp.bpf

        def after():
            os.close(cmd_r)
            for s in self.nl.values():
                s.close()
        self._cmd_w = cmd_w
        try:
            self._fork(lambda wfd, ready: _Scheduler(self, bpf, cmd_r, wfd, ready).run(),
                       f"ftb-{self.fabric.lab}-flt", after_fork=after)
        except BaseException:
            os.close(cmd_w)
            self._cmd_w = None
            raise

    def go(self, t0: float) -> None:
        """Start the clock: events happen at t0 + at (t0: the traffic's, epoch seconds). Only the first call
        counts (collectives start the workload once per step)."""
        if self._started or self._cmd_w is None:
            return
        self._started = True
        os.write(self._cmd_w, f"{t0!r}\n".encode())

    def stop(self) -> dict:
        if self._cmd_w is not None:
            os.close(self._cmd_w)
            self._cmd_w = None
        return super().stop()


class _Scheduler:
    def __init__(self, owner: FailureScheduler, bpf, cmd_r: int, wfd: int, ready):
        self.o, self.bpf, self.cmd_r, self.wfd, self.ready = owner, bpf, cmd_r, wfd, ready
        self.stop = False
        self.down_links: set = set()
        self.down_nodes: set = set()
        self.admin = {i: True for i in owner.ifaces}      # what the scheduler last set each interface to
        self.applied: list[dict] = []
        self.errors: list[str] = []
        self.degradations: list[str] = []
        self.seq = 0

    def _term(self, *_):
        self.stop = True

    def _wait_t0(self) -> float | None:
        buf = b""
        while not self.stop:
            try:
                r = wait_readable([self.cmd_r], POLL_S)
            except InterruptedError:
                continue
            if r:
                chunk = os.read(self.cmd_r, 64)
                if not chunk:
                    return None                      # the parent closed the pipe: no traffic, nothing to do
                buf += chunk
                if b"\n" in buf:
                    return float(buf.split(b"\n", 1)[0])
        return None

    def _sleep_until(self, when: float) -> bool:
        while not self.stop:
            left = when - time.time()
            if left <= 0:
                return True
            time.sleep(min(left, POLL_S))
        return False

    def _send(self, node: str, msg: bytes, what: str) -> None:
        s = self.o.nl[node]
        self.seq += 1
        s.send(msg[:8] + struct.pack("I", self.seq) + msg[12:])
        reply = s.recv(65536)
        if len(reply) >= 20 and struct.unpack_from("H", reply, 4)[0] == NLMSG_ERROR:
            code = struct.unpack_from("i", reply, 16)[0]
            if code:
                self.errors.append(f"{what}: {os.strerror(-code)}")

    def _wanted(self, port) -> bool:
        """An interface is up unless its switch is down, or its link is down (it is the link's upper end or a cut
        link's local end), or it is a cut link's local end and the far switch is down."""
        cut = port.peer_node not in self.o.local          # the far end is on another machine
        if port.node in self.down_nodes or (cut and port.peer_node in self.down_nodes):
            return False
        return frozenset((port.node, port.peer_node)) not in self.down_links

    def _apply(self, i: int, f) -> dict:
        msgs, model = self.o.plans[i]
        t_start = time.time()
        sent = self.seq
        if f.state is not None:
            key = frozenset(f.link) if f.link else f.node
            target = self.down_links if f.link else self.down_nodes
            (target.add if f.state == "down" else target.discard)(key)
            for ifx, port in self.o.ifaces.items():
                want = self._wanted(port)
                if want != self.admin[ifx]:
                    self._send(port.node, setlink_message(ifx, want), f"set {port.node}/{port.ifname} "
                               f"{'up' if want else 'down'}")
                    self.admin[ifx] = want
        for node, msg, what in msgs:
            self._send(node, msg, what)
        pq = self.bpf[b"port_qos"]
        for ifx, ps in model:
            v = pq[pq.Key(ifx)]
            v.ps_per_byte = ps
            pq[pq.Key(ifx)] = v
        done = time.time()
        # "applied" is when the first request went out: the kernel changes the link while it is being answered,
        # and the watcher may hear of it before the acknowledgement is back (took_s: until the last ACK)
        return {"index": i, "at_s": f.at / 1e9, "applied": t_start, "took_s": done - t_start,
                "target": f.target, "change": f.change, "requests": self.seq - sent}

    def run(self):
        signal.signal(signal.SIGTERM, self._term)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        except OSError as e:
            self.degradations.append(f"failure scheduler: SCHED_FIFO refused ({e.strerror}): events may be "
                                     f"applied later than their time under load")
        self.ready()
        t0 = self._wait_t0()
        order = sorted(range(len(self.o.events)), key=lambda i: (self.o.events[i].at, i))
        if t0 is not None:
            for i in order:
                f = self.o.events[i]
                if not self._sleep_until(t0 + f.at / 1e9):
                    break
                rec = self._apply(i, f)
                rec["late_s"] = rec["applied"] - (t0 + f.at / 1e9)
                self.applied.append(rec)
        while not self.stop:
            time.sleep(POLL_S)
        write_result(self.wfd, {"t0": t0, "applied": self.applied, "errors": self.errors[:20],
                                "error_count": len(self.errors), "degradations": self.degradations})


# ---------------------------------------------------------------- what the failures did (failures.csv)

def _queue_delay_s(topo, f) -> float:
    """The longest a packet may have waited in a queue of the event's ports (their buffer at their rate): what
    a flushed queue held was sent that long before the event."""
    return max(((p.buffer_bytes * 8) / p.rate_bps for p in event_ports(topo, f)), default=0.0)


def event_links(topo, f) -> list[tuple[int, ...]]:
    """The event's links, each as its switch ports' ifindexes (one for a host's link, two between switches)."""
    ports = event_ports(topo, f)
    return [tuple(p.ifindex for p in (a, b) if topo.nodes[p.node].is_switch) for a, b in zip(ports[::2], ports[1::2])]


def reaction(applied: float, links: list[tuple[int, ...]], up: bool, agents: list[list[dict]]) -> tuple[float, float]:
    """(detected, rerouted) over every routing agent (one per machine): the first to see the change, the last to
    have rerouted around it (NaN while one has not)."""
    each = [_reaction(applied, links, up, changes) for changes in agents]
    detected = min((d for d, _ in each if not math.isnan(d)), default=math.nan)
    rerouted = max((r for _, r in each), default=math.nan)
    return detected, (math.nan if any(math.isnan(r) for _, r in each) else rerouted)


def _reaction(applied: float, links: list[tuple[int, ...]], up: bool, changes: list[dict]) -> tuple[float, float]:
    """(detected, rerouted) seconds after ``applied``: when the routing agent first saw one of the event's
    switch ports in its new state (distributed: the watcher's notification; SM: a sweep), and when its view had
    every link of the event in the new state — a link is down as soon as one end is, up once both are — with
    the tables of that view written."""
    state = {i: not up for link in links for i in link}
    detected = math.nan
    for c in changes:
        if c["kind"] == "initial" or c["t_detect"] < applied - 0.001:
            continue
        hit = [(i, u) for i, u in c["ports"] if i in state and u == up]
        if not hit:
            continue
        if math.isnan(detected):
            detected = c["t_detect"] - applied
        state.update(hit)
        if all((all(state[i] for i in link) if up else not all(state[i] for i in link)) for link in links):
            return detected, c["t_done"] - applied
    return detected, math.nan


def _rate(bins: list, bin_s: float, t0: float, a: float, b: float) -> float:
    """Mean received bit/s between run times a and b, from per-bin byte counts starting at run time t0."""
    i, j = max(0, int(math.floor((a - t0) / bin_s))), int(math.ceil((b - t0) / bin_s))
    if j <= i:
        return math.nan
    return sum(bins[i:j]) * 8 / ((j - i) * bin_s) if i < len(bins) else 0.0


def rows(scen, topo, applied: list[dict], routing_results: dict, timelines: dict, origin: float) -> list[dict]:
    """One failures.csv row per scheduled event (see results/README.md for every column).

    An event's loss window runs from its time less the longest queueing delay of its ports (a flushed queue
    held packets sent that long before) to its reroute — or, for an event nothing reroutes (a rate change),
    DIP_WINDOW_S after it. A receiver's gap (packets still missing at the end, between the send times of the
    packets around them) is counted once, for the first event, in time order, whose window it overlaps."""
    agents = routing_results.get("agents") or [routing_results.get("changes", [])]
    by_index = {a["index"]: a for a in applied}
    out, windows = [], []
    for i, f in enumerate(scen.failures):
        a = by_index.get(i)
        row = {"event": i, "at_s": f.at / 1e9, "target": f.target, "kind": "link" if f.link else "node",
               "change": f.change, "time_s": math.nan, "detected_s": math.nan, "rerouted_s": math.nan,
               "lost_packets": math.nan, "affected_flows": math.nan, "dip_max": math.nan, "flow_dips": ""}
        out.append(row)
        if a is None:
            continue                       # never applied (the traffic ended first)
        t = a["applied"] - origin
        row["time_s"] = t
        if f.state is not None:
            row["detected_s"], row["rerouted_s"] = reaction(a["applied"], event_links(topo, f), f.state == "up",
                                                            agents)
        rer = row["rerouted_s"]
        end = t + (rer if not math.isnan(rer) else (DIP_WINDOW_S if f.rate is not None else 0.0))
        windows.append((t, i, t - _queue_delay_s(topo, f), end))
    windows.sort()
    lost = {i: 0 for _, i, _, _ in windows}
    flow_lost: dict[tuple[int, int], int] = {}
    measured = any(tl and tl.get("gaps") is not None for tl in timelines.values())
    for fid, tl in timelines.items():
        for g0, g1, n in (tl or {}).get("gaps") or []:
            g0, g1 = g0 - origin, g1 - origin
            for _, i, w0, w1 in windows:
                if g1 >= w0 and g0 <= w1:
                    lost[i] += n
                    flow_lost[(i, int(fid))] = flow_lost.get((i, int(fid)), 0) + n
                    break
    for _, i, _, end in windows:
        row = out[i]
        t = row["time_s"]
        dips = {}
        for fid, tl in timelines.items():
            d = _dip(tl or {}, origin, t, end)
            if d is not None and (d >= AFFECTED_DIP or flow_lost.get((i, int(fid)))):
                dips[int(fid)] = d
        row["lost_packets"] = lost[i] if measured else math.nan
        row["affected_flows"] = len(dips)
        row["dip_max"] = max(dips.values()) if dips else 0.0
        row["flow_dips"] = " ".join(f"{k}:{v:.3f}" for k, v in sorted(dips.items()))
    return out


def _dip(tl: dict, origin: float, t: float, end: float) -> float | None:
    """1 − (the flow's lowest received rate over any DIP_BIN_S window from t to DIP_WINDOW_S after ``end``) /
    (its rate over the BASELINE_S before t); None when it received nothing before t."""
    bins, bin_s = tl.get("bins") or [], tl.get("bin_s")
    if not bins or not bin_s:
        return None
    b0 = tl.get("t0", 0.0) - origin
    base = _rate(bins, bin_s, b0, t - BASELINE_S, t)
    if not base or math.isnan(base):
        return None
    lo, w = math.inf, t
    while w + DIP_BIN_S <= end + DIP_WINDOW_S + 1e-9:
        r = _rate(bins, bin_s, b0, w, w + DIP_BIN_S)
        if not math.isnan(r):
            lo = min(lo, r)
        w += DIP_BIN_S
    if lo is math.inf:
        return None
    return max(0.0, min(1.0, 1 - lo / base))
