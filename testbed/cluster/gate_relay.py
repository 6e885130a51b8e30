"""Gated flows (collectives, replays) over several machines: the gate sockets of gating.py carried over the underlay.

A gate is a Unix datagram socket, which reaches every namespace of one machine but no other machine. Each machine
gets a gate directory of its own, ``<run's gates dir>/m<i>``, in which path ``<host>`` is either that host's gate
(the host is on this machine: its agent binds it) or a relay socket this machine's actor binds for a host on
another machine. The relay sends every announcement, unchanged, over TCP on the underlay to the actor of the
host's machine, which delivers it to the host's gate there. The agents are those of one machine: the
announcement carries the completion time and the waiting flow starts at that time plus its delay, so the relay's
latency only matters when it exceeds that delay. TCP, not UDP: a lost announcement would hold its flows forever.
"""
from __future__ import annotations

import os
import selectors
import shutil
import socket
import threading

POLL_S = 0.01


def machine_dir(gates: str, machine: int) -> str:
    return os.path.join(gates, f"m{machine}")


def localize(job: dict, gates: str, machine: int) -> dict:
    """A job with its gate paths under machine ``machine``'s own gate directory."""
    here = machine_dir(gates, machine)

    def move(path: str) -> str:
        return os.path.join(here, os.path.relpath(path, gates))
    out = dict(job)
    if "gate" in out:
        out["gate"] = move(out["gate"])
    if "notify" in out:
        out["notify"] = {fid: [move(p) for p in paths] for fid, paths in out["notify"].items()}
    return out


class GateRelay:
    """One machine's gate directory and relay (a thread): relay sockets for the remote hosts its agents announce
    to, and a TCP listener on the underlay delivering other machines' announcements to its own hosts' gates."""

    def __init__(self, gates: str, machine: int, address: str):
        self.dir = machine_dir(gates, machine)
        self.gates = gates
        self.made_gates = not os.path.isdir(gates)    # a real machine's: removed again by close()
        os.makedirs(self.dir, exist_ok=True)
        self.listener = socket.create_server((address, 0))
        self.endpoint = (address, self.listener.getsockname()[1])
        self.error: str | None = None
        self.relayed = 0                              # announcements sent to other machines
        self.delivered = 0                            # announcements from other machines handed to a gate here
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, "accept")
        self._out: dict[tuple, socket.socket] = {}
        self._inbox: list[tuple[str, bytes]] = []     # (gate path, announcement) not deliverable yet
        self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._unix.setblocking(False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, remote: dict[str, tuple[str, int]]) -> None:
        """Relay sockets for ``remote`` (host on another machine → that machine's endpoint), then the thread."""
        for host, endpoint in remote.items():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.bind(os.path.join(self.dir, host))
            s.setblocking(False)
            self._sel.register(s, selectors.EVENT_READ, ("relay", host, tuple(endpoint)))
        self._thread = threading.Thread(target=self._loop, name="gate-relay", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        bufs: dict[socket.socket, bytes] = {}
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(POLL_S):
                    what = key.data
                    if what == "accept":
                        conn, _ = self.listener.accept()
                        self._sel.register(conn, selectors.EVENT_READ, "conn")
                        bufs[conn] = b""
                    elif what == "conn":
                        data = key.fileobj.recv(65536)
                        if not data:
                            self._sel.unregister(key.fileobj)
                            key.fileobj.close()
                            continue
                        *lines, bufs[key.fileobj] = (bufs[key.fileobj] + data).split(b"\n")
                        for line in lines:
                            host, msg = line.split(b" ", 1)
                            self._inbox.append((os.path.join(self.dir, host.decode()), msg))
                    else:
                        _, host, endpoint = what
                        while True:
                            try:
                                msg = key.fileobj.recv(65536)
                            except BlockingIOError:
                                break
                            self._send(endpoint, host.encode() + b" " + msg + b"\n")
                self._deliver()
        except Exception as e:                 # noqa: BLE001 — kept and reported by check()
            self.error = f"gate relay failed: {type(e).__name__}: {e}"

    def _send(self, endpoint: tuple, line: bytes) -> None:
        conn = self._out.get(endpoint)
        if conn is None:
            conn = self._out[endpoint] = socket.create_connection(endpoint, timeout=5)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(line)
        self.relayed += 1

    def _deliver(self) -> None:
        """Hand what arrived to the gates; a gate not bound yet (or full) is retried at the next turn."""
        keep = []
        for path, msg in self._inbox:
            try:
                self._unix.sendto(msg, path)
                self.delivered += 1
            except (FileNotFoundError, ConnectionRefusedError, BlockingIOError):
                keep.append((path, msg))
        self._inbox = keep

    def check(self) -> None:
        if self.error is not None:
            from ..workloads import WorkloadError
            raise WorkloadError(self.error)

    def close(self) -> None:
        """Stop the thread, close every socket, remove the gate directory (after the agents: an announcement
        whose gate has closed is dropped, as an agent's own Announcer drops it on one machine)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()
        for conn in self._out.values():
            conn.close()
        self._unix.close()
        shutil.rmtree(self.dir)
        if self.made_gates and not os.listdir(self.gates):
            os.rmdir(self.gates)


__all__ = ["GateRelay", "localize", "machine_dir"]
