"""The traffic agent: ``python -m testbed.workloads.agent`` runs inside ONE host namespace.

Protocol on stdio (the orchestrator is ``testbed.workloads.run``):
  1. the agent prints ``{"ready": pid}`` as soon as Python has started (so t0 can be chosen after the slow part);
  2. it reads one JSON job line from stdin:
       {"duration_s", "packet_size",
        "send": [flow dicts this host sends], "recv": [flow dicts this host receives],
        optional "grace_s" (2.0), "drain_s" (0.3), "sndbuf_bytes" (a budget shared by this host's UDP sockets),
        "host", "controller" (the fabric controller's socket: controller_channel.py), "adapt" (the collective
        helper's: a flow with ``adapt`` waits for its operation's decision, collective_channel.py)}
  3. binds every receiver and opens every sender, then prints ``{"bound": epoch s}`` and reads the start line
     ``{"t0": epoch s}`` (CLOCK_REALTIME, shared by every namespace): the driver picks t0 once every agent is
     bound, so no sender starts before its receivers exist however slowly a busy machine parsed the jobs;
  4. starts each sender at t0 + flow.start_s — except a gated flow
     (``after``: flow ids it waits for), which starts once the agents receiving those flows have announced
     their completion on this host's gate socket (job ``gate``; gating.py), at the last completion +
     ``after_delay_s`` or at t0 + start_s, whichever is later; the receivers of the flows in the job's
     ``notify`` (flow id → gate paths) announce them the moment their last byte arrives (replay.py);
  5. prints ONE JSON object on its last stdout line: {"host", "t0", "bound_at", "started_at" (when it read t0),
     "send": {flow_id: sender
     stats}, "recv": {flow_id: receiver stats}, "unknown_packets"} and exits 0.
A sender stops when its size is sent or at t0 + duration_s. Receivers stop when every flow finished (sized flow
complete, TCP EOF, or a UDP end marker seen and its packets in or ``drain_s`` passed), at the latest at
t0 + duration_s + grace_s. Failures exit non-zero with a one-line reason as the last stderr line.

Threads: the send loop runs in the main thread (non-blocking sockets + poll: a full socket buffer means the
shaped host link is back-pressuring, exactly as a blocking sendto would wait), receivers in a second thread.
"""
from __future__ import annotations

import errno
import gc
import heapq
import json
import os
import select
import socket
import sys
import threading
import time
from typing import Callable

from ..procname import set_process_name
from .engine_api import DONE, READY, WAIT_READ, WAIT_TIME, WAIT_WRITE
from .engines import ENGINES
from .gating import Waits, announcement, parse_announcement

POLLIN, POLLOUT = select.POLLIN, select.POLLOUT
CHECK_EVERY_S = 0.02
ANNOUNCE_BATCH = 200          # flows per announcement datagram (≈ 6 KB)
ANNOUNCE_MAX = 65536          # a gate's receive size: a whole batch
NEVER_STARTED = "never started: a flow it depends on did not complete"


def _poll_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000 + 0.999))


def _where(e: BaseException) -> str:
    """ (at file:line in function) of the innermost frame: enough to find an engine bug from one line."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    c = tb.tb_frame.f_code
    return f" (at {os.path.basename(c.co_filename)}:{tb.tb_lineno} in {c.co_name})"


def _forget(poller, fd: int) -> None:
    """Unregister ``fd``; a socket closed meanwhile by the other thread has left the epoll set already."""
    try:
        poller.unregister(fd)
    except OSError as e:
        if e.errno not in (errno.EBADF, errno.ENOENT):
            raise


def receive(handlers, states, give_up: float, result: dict, notify: dict | None = None) -> None:
    """The receive thread: serve readable handlers, run due handler timers (``next_wake``/``on_timer``: the RoCE
    endpoint's EQDS credit pacer), check which flows finished. epoll, for sub-millisecond timer waits. The
    flows in ``notify`` are checked after every wake-up and announced the moment they complete (Announcer)."""
    poller = select.epoll()
    announcer = Announcer(states, notify or {})
    fdmap = {}
    for h in handlers:
        fdmap[h.fileno()] = h
        poller.register(h, select.EPOLLIN)
    timed = [h for h in handlers if hasattr(h, "next_wake")]
    pending = list(states)
    next_check = 0.0

    def serve(events, now):
        for fd, _ev in events:
            h = fdmap.get(fd)
            if h is None:
                continue
            new = h.on_readable(now)
            if new:
                for c in new:
                    fdmap[c.fileno()] = c
                    poller.register(c, select.EPOLLIN)
            if h.closed:
                _forget(poller, fd)
                del fdmap[fd]

    def wait(now, until):
        """Poll until ``until`` at most — or the first due timer — then run the timers that are due."""
        for h in timed:
            t = h.next_wake()
            if t is not None and t < until:
                until = t
        serve(poller.poll(max(0.0, until - now)), time.time())
        if announcer:
            announcer.check()
        if timed:
            t = time.time()
            for h in timed:
                w = h.next_wake()
                if w is not None and w <= t:
                    h.on_timer(t)

    try:
        while True:
            now = time.time()
            if now >= next_check:
                pending = [s for s in pending if not s.finished(now)]
                next_check = now + CHECK_EVERY_S
                if not pending or now >= give_up:
                    break
            wait(now, now + min(CHECK_EVERY_S, give_up - now))
        end = time.time() + 0.05                      # final drain: late duplicates, stray packets
        while (now := time.time()) < end:
            wait(now, end)
    except BaseException as e:                        # noqa: BLE001 — reported by the main thread
        result["error"] = f"receiver: {type(e).__name__}: {e}{_where(e)}"
    finally:
        poller.close()
        announcer.close()
        for h in fdmap.values():
            h.close()
        result["unknown"] = sum(getattr(h, "unknown", 0) for h in handlers)


class Gate:
    """The gated senders (``flow.after``), released as the announcements of the flows they wait for arrive on
    this host's gate socket (gating.py). Bound before t0: nothing can complete earlier."""

    def __init__(self, senders, path: str):
        self.by_id = {s.flow["flow_id"]: s for s in senders}
        self.waits = Waits([s.flow for s in senders])
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()

    @property
    def waiting(self) -> set[int]:
        return self.waits.pending

    def read(self) -> list:
        """(start time, sender) of every flow the announcements that arrived release."""
        out = []
        while True:
            try:
                data = self.sock.recv(ANNOUNCE_MAX)
            except BlockingIOError:
                return out
            for fid, t in parse_announcement(data):
                out += [(at, self.by_id[w]) for w, at in self.waits.done(fid, t)]

    def close(self) -> None:
        self.sock.close()


class Announcer:
    """Each watched flow, once complete, announced to every gate waiting for it: checked by the receive thread
    after every wake-up, and at once by a receive state that reports its own completion (``on_complete``: the
    RoCE responder, whose packets the send loop's thread may drain); a gate not bound yet or full is retried at
    the next wake-up."""

    def __init__(self, states, notify: dict):
        self.watched = [st for st in states if str(st.flow_id) in notify]
        self.notify = notify
        self.outbox: dict[str, list[tuple[int, float]]] = {}   # gate path → (flow id, completion time)
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if self.watched else None
        if self.sock is not None:
            self.sock.setblocking(False)
        for st in self.watched:
            if hasattr(st, "on_complete"):
                st.on_complete = self.completed

    def __bool__(self) -> bool:
        return bool(self.watched or self.outbox)

    def completed(self, st) -> None:
        """``st`` has just completed (any thread)."""
        with self.lock:
            if st in self.watched:
                self.watched.remove(st)
                self._queue(st)
            self._flush()

    def check(self) -> None:
        with self.lock:
            left = []
            for st in self.watched:
                if st.complete:
                    self._queue(st)
                else:
                    left.append(st)
            self.watched = left
            self._flush()

    def _queue(self, st) -> None:
        at = getattr(st, "complete_at", None) or st.last_rx or time.time()
        for path in self.notify[str(st.flow_id)]:
            self.outbox.setdefault(path, []).append((st.flow_id, at))

    def _flush(self) -> None:
        """One datagram per gate for what completed together (a skipped ring order's flows all at once)."""
        keep = {}
        for path, pairs in self.outbox.items():
            for i in range(0, len(pairs), ANNOUNCE_BATCH):
                try:
                    self.sock.sendto(announcement(pairs[i:i + ANNOUNCE_BATCH]), path)
                except (FileNotFoundError, ConnectionRefusedError, BlockingIOError):
                    keep[path] = pairs[i:]
                    break
        self.outbox = keep

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


NOT_PICKED = "not run: its collective operation's policy picked another ring order"


def _begin(s, now: float, ready: list, decisions, later=None) -> int:
    """Start sender ``s`` — unless it belongs to a collective operation that reads the network
    (``flow.adapt``) and the decision is not known yet: then it waits for it (workloads/collective_channel.py).
    Returns 1 if the decision says the flow does not run (it is done), else 0."""
    key = s.flow.get("adapt")
    if decisions is not None and key is not None:
        if key not in decisions.known:
            decisions.park(key, s)
            return 0
        return _start_decided([s], decisions.known[key], now, ready, decisions, later)
    s.begin(now)
    ready.append(s)
    return 0


def _start_decided(senders, sports: dict, now: float, ready: list, decisions, later=None) -> int:
    """Start flows of a decided operation from the ports its policy chose (before they send: not a move);
    ``sports`` empty: sent as the static collective would (no decision in time). A flow the decision skips is
    done at once without sending; returns how many. A flow the policy paces is handed to ``later(sender, at)``
    and comes back here when its time comes."""
    skipped = 0
    for s in senders:
        if s.flow["flow_id"] in decisions.skip:
            s.flow["skipped"] = True
            s.abort(NOT_PICKED)
            skipped += 1
            continue
        wait = decisions.delay.pop(s.flow["flow_id"], 0.0)
        if wait > 0 and later is not None:
            s.flow["held_s"] = wait
            later(s, now + wait)
            continue
        got = sports.get(s.flow["flow_id"])
        if got is not None and got != s.flow["sport"]:
            s.steer(got, count=False)
        s.flow["entropy_first"] = got or s.flow["sport"]
        s.flow["entropy_from"] = "static" if s.flow["adapt"] in decisions.undecided else "collective"
        s.begin(now)
        ready.append(s)
    return skipped


def send(senders, t0: float, deadline: float, give_up: float, gate: Gate | None = None, steering=None,
         ctl_path: str | None = None, decisions=None) -> None:
    """The send loop: start each flow at its time, pump the ready senders, wait on timers and sockets. ``gate``:
    flows released by others' completion (gating.py). ``steering``: the fabric controller's moves (adaptive
    entropy, controller_channel.Steering), handed to the flow's sender; a flow that ends is reported to
    ``ctl_path`` so that the controller frees its links. ``decisions``: the collective helper's answers
    (workloads/collective_channel.py) that flows of adapted operations wait for."""
    gated = set(gate.by_id.values()) if gate is not None else set()
    starts = [(t0 + s.flow["start_s"], i, s) for i, s in enumerate(senders) if s not in gated]
    heapq.heapify(starts)
    order = len(senders)
    ready: list = []
    timers: list = []                 # (wake, seq, sender)
    waiting: dict = {}                # fd → sender
    poller = select.poll()
    seq = 0
    past_deadline = False
    alive = len(senders)
    listening = gate is not None
    if listening:
        poller.register(gate.fd, POLLIN)
    by_id = {s.flow["flow_id"]: s for s in senders}

    def later(s, at: float) -> None:                  # a paced flow: back in the start heap at its time
        nonlocal order
        order += 1
        heapq.heappush(starts, (at, order, s))
    if steering is not None:
        poller.register(steering.fileno(), POLLIN)
    if decisions is not None:
        poller.register(decisions.fileno(), POLLIN)
    while alive:
        now = time.time()
        while starts and starts[0][0] <= now:
            alive -= _begin(heapq.heappop(starts)[2], now, ready, decisions, later)
        if decisions is not None and decisions.parked:
            for _key, parked in decisions.expired(now):
                alive -= _start_decided(parked, {}, now, ready, decisions, later)
        if now >= give_up:
            break
        if not past_deadline and now >= deadline:
            past_deadline = True
            for fd, s in waiting.items():
                poller.unregister(fd)
                ready.append(s)
            waiting.clear()
        while timers and timers[0][0] <= now:
            ready.append(heapq.heappop(timers)[2])
        again = []
        for s in ready:
            status, arg = s.pump(time.time())
            if status == READY:
                again.append(s)
            elif status == WAIT_TIME:
                seq += 1
                heapq.heappush(timers, (arg, seq, s))
            elif status in (WAIT_WRITE, WAIT_READ):
                fd = s.fileno()
                waiting[fd] = s
                poller.register(fd, POLLOUT if status == WAIT_WRITE else POLLIN)
            elif status == DONE:
                alive -= 1
                if steering is not None:
                    steering.end(ctl_path, [s.flow["flow_id"]])
        ready = again
        if decisions is not None and decisions.to_end:     # after the decided flows' first burst went out
            decisions.end_skipped()
        if not alive:
            break
        asking = decisions is not None and bool(decisions.parked)
        if ready and not waiting and not listening and steering is None and not asking:
            continue
        now = time.time()
        wake = give_up if past_deadline else deadline
        if timers:
            wake = min(wake, timers[0][0])
        if starts:
            wake = min(wake, starts[0][0])
        if asking:
            wake = min(wake, decisions.next_timeout() or wake)
        timeout = 0.0 if ready else max(0.0, wake - now)
        if waiting or listening or steering is not None or asking:
            for fd, _ev in poller.poll(_poll_ms(timeout)):
                if decisions is not None and fd == decisions.fileno():
                    for key, parked in decisions.read():
                        alive -= _start_decided(parked, decisions.known[key], time.time(), ready, decisions,
                                                later)
                    continue
                if steering is not None and fd == steering.fileno():
                    for fid, sport, _why in steering.read():
                        s = by_id.get(fid)
                        if s is not None and not s.done:
                            s.steer(sport)
                    continue
                if listening and fd == gate.fd:
                    for at, s in gate.read():
                        order += 1
                        heapq.heappush(starts, (max(at, t0 + s.flow["start_s"]), order, s))
                    if not gate.waiting:                  # every gated flow released
                        poller.unregister(fd)
                        listening = False
                    continue
                s = waiting.pop(fd, None)
                if s is not None:
                    poller.unregister(fd)
                    ready.append(s)
        elif timeout > 0:
            time.sleep(timeout)
    for s in senders:                 # gave up at t0 + duration + grace: close what is left
        if not s.done:
            s.abort(NEVER_STARTED if gate is not None and s.flow["flow_id"] in gate.waiting
                    else "never started: its collective operation was never decided"
                    if decisions is not None and any(s in p for p in decisions.parked.values())
                    else "still running at the end of the grace period")


def _rx_result(st) -> dict:
    out = st.result()
    if getattr(st, "tl_bin", None):
        out["timeline"] = st.timeline()
    return out


def run_job(job: dict, start: Callable[[], float] | None = None) -> dict:
    """Run one host's job; ``start`` is called once everything is bound and returns t0 (None: the job's own
    ``t0``)."""
    job.setdefault("drain_s", 0.3)
    for f in job["send"] + job["recv"]:
        if f.get("engine", f["proto"]) not in ENGINES:
            raise SystemExit(f"agent: unknown engine {f.get('engine')!r} for flow {f['flow_id']}")
    n_udp = sum(1 for f in job["send"] if f["proto"] in ("udp", "rocev2"))
    if job.get("sndbuf_bytes") and n_udp:
        job["sndbuf_each"] = int(job["sndbuf_bytes"]) // n_udp

    handlers, states = [], []
    by_engine: dict[str, list] = {}
    for f in job["recv"]:
        by_engine.setdefault(f.get("engine") or f["proto"], []).append(f)
    for name, fl in by_engine.items():
        try:
            h, st = ENGINES[name].receivers(fl, job)
        except OSError as e:
            raise SystemExit(f"agent: cannot open {name} receivers on ports "
                             f"{sorted({f['dport'] for f in fl})}: {e.strerror}") from None
        handlers += h
        states += st
    bound_at = time.time()
    ctl = job.get("controller")
    steering = None
    if ctl and job["send"]:                   # the fabric controller picks the source ports (controller_channel)
        from .controller_channel import ask
        if ctl.get("adaptive"):               # … and may move them mid-flow: the asking socket stays open
            got, steering = ask(ctl["path"], job["send"], float(ctl["timeout_s"]), str(job.get("host")), keep=True)
        else:
            got = ask(ctl["path"], job["send"], float(ctl["timeout_s"]), str(job.get("host")))
        for f in job["send"]:
            f["entropy_from"] = "controller" if f["flow_id"] in got else "own"
            f["sport"] = f["entropy_first"] = got.get(f["flow_id"], f["sport"])
    senders = []
    for f in job["send"]:
        try:
            senders.append(ENGINES[f.get("engine") or f["proto"]].sender(f, job))
        except OSError as e:
            raise SystemExit(f"agent: flow {f['flow_id']}: cannot bind {f['src_addr']}:{f['sport']} → "
                             f"{f['dst_addr']}:{f['dport']}: {e.strerror}") from None

    adapt = job.get("adapt")
    decisions = None
    by_id = {st.flow_id: st for st in states}
    if adapt and any(f.get("adapt") for f in job["send"]):   # a collective that reads the network
        from .collective_channel import Decisions
        decisions = Decisions(adapt["path"], float(adapt["timeout_s"]), str(job.get("host")),
                              receivers={f["flow_id"]: (f["adapt"], f.get("variant", 0), by_id[f["flow_id"]])
                                         for f in job["recv"] if f.get("adapt")})
    gated = [s for s in senders if s.flow.get("after")]
    gate = Gate(gated, job["gate"]) if gated else None
    t0 = job["t0"] = float(job["t0"]) if start is None else start()    # the senders' deadlines read it
    started_at = time.time()
    duration = float(job["duration_s"])
    deadline, give_up = t0 + duration, t0 + duration + float(job.get("grace_s", 2.0))
    for st in states:
        st.deadline = deadline
        if job.get("timeline_bin_s") and hasattr(st, "timeline_on"):    # (the RoCE responder keeps none)
            st.timeline_on(t0, float(job["timeline_bin_s"]))
    rx_result: dict = {}
    rx = None
    if handlers:
        rx = threading.Thread(target=receive, args=(handlers, states, give_up, rx_result, job.get("notify")),
                              daemon=True)
        rx.start()
    if senders:
        delay = t0 - time.time()
        if delay > 0:
            time.sleep(delay)
        try:
            send(senders, t0, deadline, give_up, gate, steering, ctl["path"] if ctl else None, decisions)
        finally:
            if steering is not None:
                steering.close()
            if decisions is not None:
                decisions.close()
    if gate is not None:
        gate.close()
    if rx is not None:
        rx.join()
    if "error" in rx_result:
        raise SystemExit(f"agent: {rx_result['error']}")
    return {
        "host": job.get("host"),
        "t0": t0,
        "bound_at": bound_at,
        "started_at": started_at,
        "send": {str(s.flow["flow_id"]): dict(s.stats(), sport=s.flow["sport"],
                                              entropy_from=s.flow.get("entropy_from"),
                                              entropy_first=s.flow.get("entropy_first"),
                                              entropy_changes=s.flow.get("entropy_changes", 0),
                                              skipped=bool(s.flow.get("skipped")))
                 for s in senders},
        "recv": {str(st.flow_id): _rx_result(st) for st in states},
        "unknown_packets": rx_result.get("unknown", 0),
    }


def _start_line() -> float:
    """Say everything is bound; wait for the driver's start line; its t0."""
    print(json.dumps({"bound": time.time()}), flush=True)
    line = sys.stdin.readline()
    try:
        return float(json.loads(line)["t0"])
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"agent: no start line on stdin (got {line.strip()[:80]!r})") from None


def main() -> int:
    if os.environ.get("FTB_PROC_NAME"):                # ftb-<lab>-<host>, set by agents.py
        set_process_name(os.environ["FTB_PROC_NAME"])
    # what the imports made lives as long as the process: out of the collector's full scans, which otherwise pause
    # the send loop for the whole heap (12 ms with the CC modules' pydantic models loaded; the RTO floor is 10 ms)
    gc.freeze()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        print("agent: no job on stdin", file=sys.stderr)
        return 2
    try:
        job = json.loads(line)
    except ValueError as e:
        print(f"agent: job is not JSON: {e}", file=sys.stderr)
        return 2
    try:
        out = run_job(job, _start_line)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 1
        raise
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
