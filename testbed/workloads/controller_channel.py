"""The channel between the hosts and the fabric controller (testbed/controller/service.py): its socket, its
messages, and the host's side of it.

A Unix datagram socket (``/run/fabric-testbed/labs/<lab>-ctl.sock``, controller/service.py) — a file, so every
host namespace reaches it (an abstract or an IP socket would be per namespace). The agents import this module
when their job names a controller: it imports nothing heavy, as their start counts towards the traffic's t0. One JSON object per datagram, version 1:

    host → controller   {"v": 1, "op": "plan", "flow": 3, "sport": 31200}      (sport: the host's own choice)
    controller → host   {"v": 1, "flow": 3, "sport": 49877, "reason": "start"}  (to the asking socket's address)
    host → controller   {"v": 1, "op": "end", "flow": 3}                         (no answer)
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


def ask(path: str, flows: list[dict], timeout_s: float, tag: str) -> dict[int, int]:
    """A host asks the controller at ``path`` for its flows' source ports (``flows``: an agent's flow dicts with
    ``flow_id`` and ``sport``); returns the ports it got, by flow id. A flow without an answer within
    ``timeout_s`` keeps its own port (it is not in the result). ``tag`` names this host's reply socket."""
    me = Path(path).with_name(f"{Path(path).stem}-{tag}-{os.getpid()}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    got: dict[int, int] = {}
    try:
        me.unlink(missing_ok=True)
        sock.bind(str(me))
        for f in flows:
            sock.sendto(request(f["flow_id"], f["sport"]), path)
        end = time.monotonic() + timeout_s
        while len(got) < len(flows):
            left = end - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                break
            try:
                msg = json.loads(sock.recv(4096))
                if msg.get("v") == VERSION:
                    got[int(msg["flow"])] = int(msg["sport"])
            except (ValueError, KeyError, TypeError):
                continue
    except OSError:
        pass                                  # no controller listening: every flow keeps its port
    finally:
        sock.close()
        me.unlink(missing_ok=True)
    return got
