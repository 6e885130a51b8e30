"""The channel between the hosts and the fabric controller (testbed/controller/service.py): its socket, its
messages, and the host's side of it.

A Unix datagram socket (``/run/fabric-testbed/labs/<lab>-ctl.sock``, controller/service.py) — a file, so every
host namespace reaches it (an abstract or an IP socket would be per namespace). The agents import this module
when their job names a controller: it imports nothing heavy, as their start counts towards the traffic's t0. One JSON object per datagram, version 1:

    host → controller   {"v": 1, "op": "plan", "flow": 3, "sport": 31200}      (sport: the host's own choice)
    controller → host   {"v": 1, "flow": 3, "sport": 49877, "reason": "start"}  (to the asking socket's address)
    host → controller   {"v": 1, "op": "end", "flow": 3}                         (no answer)
    controller → host   {"v": 1, "flow": 3, "sport": 50112, "reason": "load"}   (adaptive: unasked, mid-flow;
                                                                                 reason load | queue | failure)

With ``entropy: adaptive`` the host keeps its asking socket open for the whole run (``Steering``): the
controller sends a flow's new port to the address its request came from, and the agent's send loop hands it
to the flow's sender (``steer``), which sends from the new port from its next packet on.
"""
from __future__ import annotations

import json
import os
import select
import socket
import time
from pathlib import Path

VERSION = 1


def request(fid: int, sport: int) -> bytes:
    return json.dumps({"v": VERSION, "op": "plan", "flow": fid, "sport": sport}).encode()


def reply(fid: int, sport: int, reason: str) -> bytes:
    return json.dumps({"v": VERSION, "flow": fid, "sport": sport, "reason": reason}).encode()


class Steering:
    """The host's end kept open for the run (``entropy: adaptive``): the controller's unasked moves arrive on
    it. ``read`` returns them as (flow id, new port, reason); ``close`` removes the socket file."""

    def __init__(self, sock: socket.socket, me: Path):
        self.sock, self.me = sock, me
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[tuple[int, int, str]]:
        out = []
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:                    # nothing more now (BlockingIOError), or the socket is gone
                return out
            try:
                msg = json.loads(data)
                if msg.get("v") == VERSION:
                    out.append((int(msg["flow"]), int(msg["sport"]), str(msg.get("reason", ""))))
            except (ValueError, KeyError, TypeError):
                continue

    def end(self, path: str, flow_ids) -> None:
        """Tell the controller these flows ended (it frees their links); best effort."""
        for fid in flow_ids:
            try:
                self.sock.sendto(json.dumps({"v": VERSION, "op": "end", "flow": fid}).encode(), path)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        self.me.unlink(missing_ok=True)


def ask(path: str, flows: list[dict], timeout_s: float, tag: str, keep: bool = False):
    """A host asks the controller at ``path`` for its flows' source ports (``flows``: an agent's flow dicts with
    ``flow_id`` and ``sport``); returns the ports it got, by flow id. A flow without an answer within
    ``timeout_s`` keeps its own port (it is not in the result). ``tag`` names this host's reply socket. With
    ``keep`` the socket stays open and (ports, Steering) is returned (Steering None when the socket failed).

    The requests go out without blocking, the answers read as they come: a Unix datagram socket queues only
    ``net.unix.max_dgram_qlen`` (10) datagrams, so a host that blocked sending its 36 requests while the
    controller blocked answering into its full queue would wait on each other for ever."""
    me = Path(path).with_name(f"{Path(path).stem}-{tag}-{os.getpid()}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    got: dict[int, int] = {}
    steering = None
    try:
        me.unlink(missing_ok=True)
        sock.bind(str(me))
        sock.setblocking(False)
        todo = [request(f["flow_id"], f["sport"]) for f in flows]
        end = time.monotonic() + timeout_s
        while len(got) < len(flows) and (left := end - time.monotonic()) > 0:
            while todo:
                try:
                    sock.sendto(todo[0], path)
                except BlockingIOError:       # the controller's queue is full: read its answers meanwhile
                    break
                todo.pop(0)
            if select.select([sock], [], [], min(left, 0.005) if todo else left)[0]:
                _read_answers(sock, got)
        if keep:
            steering = Steering(sock, me)
    except OSError:
        pass                                  # no controller listening: every flow keeps its port
    finally:
        if steering is None:
            sock.close()
            me.unlink(missing_ok=True)
    return (got, steering) if keep else got


def _read_answers(sock: socket.socket, got: dict[int, int]) -> None:
    """Every answer waiting on the (non-blocking) socket, into ``got``."""
    while True:
        try:
            msg = json.loads(sock.recv(4096))
        except BlockingIOError:
            return
        except ValueError:
            continue
        try:
            if msg.get("v") == VERSION:
                got[int(msg["flow"])] = int(msg["sport"])
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
