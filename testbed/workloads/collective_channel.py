"""The channel between the hosts and the collective helper (collective/decider.py): Unix datagram sockets
(path-named, so they reach across network namespaces), one JSON object per datagram, version 1.

  host → helper   {"v": 1, "op": "decide", "key": "<job>.<iteration>", "host": "h3"}
  helper → host   {"v": 1, "key": "<job>.<iteration>", "sport": {"<flow id>": port, ...}, "skip": [flow id, ...],
                   "delay": {"<flow id>": seconds, ...}}
The helper answers with the source port of every flow of that operation the host sends that the policy moved
(an empty map: send it as the static collective would), the flows it sends or receives that do not run (the
ring orders the policy did not pick): the sender drops them, the receiver counts them as done; and how long the
host holds back each of its flows that the policy paces (absent: none), counted from when the flow could start. ``Decisions`` is
the agent's end: the send loop parks a flow of an operation it has no answer for, asks once per operation and
starts the parked flows when the answer comes — or, past the timeout, with their own ports (counted). Light:
every agent imports it.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

VERSION = 1


def request(key: str, host: str) -> bytes:
    return json.dumps({"v": VERSION, "op": "decide", "key": key, "host": host}).encode()


def answer(key: str, sports: dict[int, int], skip=(), delay: dict[int, float] | None = None) -> bytes:
    msg = {"v": VERSION, "key": key, "sport": {str(k): v for k, v in sports.items()}, "skip": sorted(skip)}
    if delay:
        msg["delay"] = {str(k): round(float(v), 6) for k, v in delay.items()}
    return json.dumps(msg).encode()


class Decisions:
    """A host's end: asks for an operation's decision once, holds the answers and the flows waiting for them."""

    def __init__(self, path: str, timeout_s: float, host: str, receivers: dict | None = None):
        self.path, self.timeout_s = path, timeout_s
        self.me = Path(path).with_name(f"{Path(path).stem}-{host}-{os.getpid()}.sock")
        self.host = host
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.me.unlink(missing_ok=True)
        self.sock.bind(str(self.me))
        self.sock.setblocking(False)
        self.known: dict[str, dict[int, int]] = {}
        self.skip: set[int] = set()                 # flows (sent or received here) that do not run
        self.delay: dict[int, float] = {}          # flows sent here that the policy holds back, seconds
        # flow id → (its operation, its ring order, its receive state here: ``skip(now)`` ends it)
        self.receivers: dict[int, tuple] = dict(receivers or {})
        self.to_end: list = []                      # receive states of skipped flows, not ended yet
        self.parked: dict[str, list] = {}
        self.asked: dict[str, float] = {}          # key → give-up time
        self.undecided: set[str] = set()            # operations that got no answer in time

    def fileno(self) -> int:
        return self.sock.fileno()

    def park(self, key: str, item) -> None:
        """Hold ``item`` until ``key`` is decided; ask the helper the first time."""
        self.parked.setdefault(key, []).append(item)
        if key not in self.asked:
            self.asked[key] = time.time() + self.timeout_s
            try:
                self.sock.sendto(request(key, self.host), self.path)
            except OSError:
                self.asked[key] = 0.0               # no helper: the timeout releases it at once

    def read(self) -> list[tuple[str, list]]:
        """(key, parked items) of every operation whose answer arrived."""
        out = []
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return out
            try:
                msg = json.loads(data)
                if msg.get("v") != VERSION:
                    continue
                key = str(msg["key"])
                sports = {int(k): int(v) for k, v in msg["sport"].items()}
                skip = {int(x) for x in msg.get("skip", ())}
                delay = {int(k): float(v) for k, v in (msg.get("delay") or {}).items()}
                self.known[key] = sports
                self.delay.update(delay)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            self._skip(skip)
            out.append((key, self.parked.pop(key, [])))

    def _skip(self, fids) -> None:
        """Flows that do not run: senders check ``skip`` as they start; the receive states here are ended by
        ``end_skipped``, which the agent calls once it has started the operation's flows (ending a RoCE
        responder takes its endpoint's lock, which the receive thread holds while it drains)."""
        self.skip |= set(fids)
        for fid in fids:
            got = self.receivers.pop(fid, None)
            if got is not None:
                self.to_end.append(got[2])

    def end_skipped(self) -> None:
        now = time.time()
        for st in self.to_end:
            st.skip(now)
        self.to_end.clear()

    def next_timeout(self) -> float | None:
        waiting = [self.asked[k] for k in self.parked if k not in self.known]
        return min(waiting) if waiting else None

    def expired(self, now: float) -> list[tuple[str, list]]:
        """(key, parked senders) of operations asked for longer than the timeout: they go undecided (static:
        each flow on its own QP, the job's own ring order)."""
        out = []
        for key in [k for k in self.parked if k not in self.known and self.asked[k] <= now]:
            self.known[key] = {}
            self.undecided.add(key)
            parked = self.parked.pop(key)
            # undecided: only the job's own ring order runs (its other orders' flows, here, are skipped)
            self._skip([fid for fid, (k, v, _) in self.receivers.items() if k == key and v]
                       + [s.flow["flow_id"] for s in parked if s.flow.get("variant")])
            out.append((key, parked))
        return out

    def close(self) -> None:
        self.sock.close()
        self.me.unlink(missing_ok=True)
