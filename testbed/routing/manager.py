"""The routing agent: one forked process per lab that watches the fabric's links and keeps forwarding right.

It learns link state from the kernel, not from the scenario: every switch namespace's rtnetlink socket (a
port is up while it is administratively up and has carrier, IFF_UP | IFF_LOWER_UP — a veth loses carrier on
both ends when either end goes down). Two jobs:

- **Link-state watcher** (both routings): RTMGRP_LINK notifications arrive the moment a port's carrier changes,
  and the agent marks the port in the datapath's ``port_down`` map at once. Every egress choice skips such a
  port (ebpf/lib/lb.h failover_slot, lb/adaptive.h): local fast failover, as a switch's hardware does.
- **Routing**:
  - ``switch.routing: distributed`` — the reaction a routing protocol converges to, computed right after the
    notification: per (switch, leaf prefix) the ECMP group of the shortest valley-free paths over the links that
    are up (algorithms.prefix_groups). Where that differs from the topology's FIB more than the local failover
    already covers (the switch's own dead ports), an override entry (the leaf's /24) is written into ``fib``;
    when the link comes back the override goes. A spine that lost its link to leaf X gets an empty group for X
    (withdrawn) and every other switch stops sending X's traffic to it.
  - ``switch.routing: sm`` — a subnet manager: every ``switch.sm.sweep_interval`` it reads every switch's port
    states (one RTM_GETLINK dump per switch namespace: the sweep), and when they changed it recomputes the
    tables with its engine (algorithms.py: minhop, updn, ftree) and writes the entries that differ — a /32 per
    (switch, destination NIC) with the port(s) the engine chose. Until a sweep has seen a failure, packets for
    a dead single-port entry are dropped (``port_down``), as in an InfiniBand subnet between a link going down
    and the SM's re-route.

**Over several machines** (testbed/cluster/) each machine's agent watches only its own switches; the agents
flood link state to each other over the underlay, as a link-state routing protocol floods its LSAs: after every
change, and every FLOOD_REFRESH_S without one, an agent sends its peers (UDP) the full set of its ports that are
down, with a sequence number — absolute, so a lost datagram is repaired by the next one. A peer's ports enter the view (not ``port_down``: they are
another machine's) and every agent computes the reroute over the whole fabric, writing its own switches' entries.
Under SM routing one agent (the first machine's) is the subnet manager; the others are its agents on their
machines, as an InfiniBand switch's SMA: they watch and flood their ports, and write the tables the SM sends them
(TCP on the underlay, one JSON line per sweep, acknowledged). The SM's sweep reads its own switches and the
latest state the others flooded; a sweep's tables are held once every machine has acknowledged its entries.

Everything it did is reported when it ends: every carrier change it saw (``local``), every reroute or sweep that
changed something (``changes``: when it saw the change, compute and install times, entries written), sweep
counts and durations. A crash fails the run in one line (helper.py).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time

from ..errors import HelperFailed
from ..fabric import netns
from ..topology.fibwalk import Router
from . import algorithms
from ..datapath import fill_group
from ..auth import Channel
from ..helper import ForkedHelper, wait_readable, write_result

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 1, 0x300
RTMGRP_LINK = 1
IFF_UP, IFF_LOWER_UP = 0x1, 0x10000
WATCH_POLL_S = 0.05                  # the longest the agent sleeps between checks for SIGTERM
FLOOD_REFRESH_S = 1.0                # over several machines: link state is flooded again this often unchanged
MAX_CHANGES = 500                    # change records kept (a flapping link must not grow the results unbounded)
TABLES_TIMEOUT_S = 30.0              # the SM waits this long for another machine to acknowledge its tables
MAX_TABLE_LINE = 64 << 20            # an SMA drops a connection whose line grows beyond this (a 1,024-host
                                     # fabric's initial tables are a few MB)


class RoutingAgentFailed(HelperFailed):
    """The routing agent (subnet manager or link-state watcher) died or could not report; one line."""


def link_dump_message(seq: int = 1) -> bytes:
    """RTM_GETLINK dump request (header + an empty ifinfomsg)."""
    return struct.pack("IHHII", 32, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + bytes(16)


def parse_links(data: bytes) -> tuple[list[tuple[int, bool]], bool]:
    """(ifindex, up) of every RTM_NEWLINK / RTM_DELLINK message in ``data``, and whether the dump ended. Only the
    ifinfomsg header is read: its flags say IFF_UP and IFF_LOWER_UP (carrier), nothing else is needed."""
    out, done, off = [], False, 0
    while off + 16 <= len(data):
        length, mtype = struct.unpack_from("IH", data, off)
        if length < 16:
            break
        if mtype == NLMSG_DONE:
            done = True
        elif mtype == NLMSG_ERROR:
            code = struct.unpack_from("i", data, off + 16)[0]
            if code:
                raise OSError(-code, f"link dump: {os.strerror(-code)}")
        elif mtype in (RTM_NEWLINK, RTM_DELLINK) and length >= 32:
            _fam, _pad, _type, ifindex, flags, _change = struct.unpack_from("BBHiII", data, off + 16)
            up = mtype == RTM_NEWLINK and (flags & (IFF_UP | IFF_LOWER_UP)) == (IFF_UP | IFF_LOWER_UP)
            out.append((ifindex, up))
        off += (length + 3) & ~3
    return out, done


def _u32(addr: str) -> int:
    return int.from_bytes(socket.inet_aton(addr), "little")


def _put(t, topo, sid: int, addr: int, plen: int, ports, max_nh: int) -> None:
    k = t.Key()
    k.prefixlen, k.switch_id, k.addr = 32 + plen, sid, addr
    v = t.Leaf()
    fill_group(v, topo, ports, max_nh)
    t[k] = v


def _delete(t, sid: int, addr: int, plen: int) -> None:
    k = t.Key()
    k.prefixlen, k.switch_id, k.addr = 32 + plen, sid, addr
    del t[k]


def table_diff(old: algorithms.Tables, new: algorithms.Tables) -> tuple[dict, set]:
    """What brings the SM tables ``old`` to ``new``: the (switch, destination) entries to write (their ports
    differ or are new) and those to delete."""
    return {k: p for k, p in new.items() if old.get(k) != p}, old.keys() - new.keys()


def tables_of(puts: dict, dels, switches) -> tuple[dict, list]:
    """The part of a table diff that concerns ``switches`` (one machine's)."""
    return {k: p for k, p in puts.items() if k[0] in switches}, [k for k in dels if k[0] in switches]


def apply_tables(bpf, topo, puts: dict, dels, max_nh: int = 16, switches: set | None = None) -> int:
    """Write ``puts`` ((switch, destination) → ports, a /32 each) and delete ``dels`` in the FIB. Returns the
    entries written or deleted; ``switches`` (if given) collects the switches that got any."""
    t = bpf[b"fib"]
    ids = topo.switch_ids
    for (sw, addr), ports in puts.items():
        _put(t, topo, ids[sw], _u32(addr), 32, ports, max_nh)
    for sw, addr in dels:
        _delete(t, ids[sw], _u32(addr), 32)
    if switches is not None:
        switches.update(sw for sw, _ in list(puts) + list(dels))
    return len(puts) + len(dels)


def write_tables(bpf, topo, old: algorithms.Tables, new: algorithms.Tables, max_nh: int = 16,
                 switches: set | None = None) -> int:
    """Bring the FIB from the SM tables ``old`` to ``new``: write every (switch, destination) /32 whose ports
    differ, delete those ``new`` no longer has. Returns the entries written or deleted; ``switches`` (if given)
    collects the switches that got any."""
    return apply_tables(bpf, topo, *table_diff(old, new), max_nh, switches)


class Distributed:
    """What the distributed side adds to the topology's FIB after failures (pure: no maps). ``topo`` is the whole
    fabric; ``local`` the switches whose entries this agent writes (None: all — one machine)."""

    def __init__(self, topo, local: set | None = None):
        self.topo = topo
        self.local = set(topo.switches) if local is None else set(local)
        self.router = Router(topo)
        self.prefixes = algorithms.leaf_prefixes(topo)
        self.exact = {(e.switch, e.prefix, e.plen): tuple(e.ports) for e in topo.fib if e.switch in self.local}
        healthy = algorithms.prefix_groups(algorithms.graph(topo), list(self.prefixes))
        self.reach = {k for k, v in healthy.items() if v}     # pairs that have a route at all (rails: planes)

    def overrides(self, down) -> dict[tuple[str, str, int], tuple[int, ...]]:
        """(switch, prefix, plen) → group, where the valley-free ECMP group over the live links differs from the
        topology's group minus the switch's own dead ports (which the datapath skips by itself)."""
        groups = algorithms.prefix_groups(algorithms.graph(self.topo, down), list(self.prefixes))
        out = {}
        for (s, leaf), ports in groups.items():
            if (s, leaf) not in self.reach or s not in self.local:
                continue
            for net, plen in self.prefixes[leaf]:
                base = self.router.group(s, net) or ()
                if {p for p in base if p not in down} == ports:
                    continue
                out[(s, net, plen)] = tuple(p for p in base if p in ports) + tuple(sorted(ports - set(base)))
        return out

    def write(self, bpf, old: dict, new: dict, max_nh: int = 16, switches: set | None = None) -> int:
        """Install ``new`` overrides over ``old``; an override that goes restores the topology's entry of that
        key (where it had one) or is deleted. Returns entries written or deleted."""
        t = bpf[b"fib"]
        ids = self.topo.switch_ids
        n = 0
        for key in old.keys() | new.keys():
            if key in new and old.get(key) == new[key]:
                continue
            s, net, plen = key
            if key in new:
                _put(t, self.topo, ids[s], _u32(net), plen, new[key], max_nh)
            elif key in self.exact:
                _put(t, self.topo, ids[s], _u32(net), plen, self.exact[key], max_nh)
            else:
                _delete(t, ids[s], _u32(net), plen)
            n += 1
            if switches is not None:
                switches.add(s)
        return n


class RoutingAgent(ForkedHelper):
    """The parent's side (helper.py): ``start()`` once the datapath is loaded and attached — returns
    when the watcher has read every port and, under SM routing, the SM has programmed every switch (over several
    machines: ``set_peers`` returns then)."""

    failure = RoutingAgentFailed

    def __init__(self, datapath, fabric, scen, whole=None, flood_address: str | None = None,
                 key: bytes | None = None):
        """``whole``: the whole fabric when this lab is one machine's part of it (``fabric.topo``); then
        ``flood_address`` is the machine's underlay address, where the agent takes its peers' link state, and
        ``key`` the run's key that seals every flood, table and acknowledgement (testbed/auth.py)."""
        super().__init__()
        if flood_address is not None and key is None:
            raise ValueError("routing agent: over several machines every message on the underlay is sealed; "
                             "the run's key is missing")
        self.key = key
        self.dp, self.fabric, self.scen, self.topo = datapath, fabric, scen, fabric.topo
        self.whole = whole if whole is not None else fabric.topo
        self.sm = scen.switch.routing == "sm"
        self.label = "subnet manager" if self.sm else "link-state watcher"
        self.flood_address = flood_address
        self.flood = None                        # the UDP socket peers send their link state to (the agent's)
        self.flood_endpoint: tuple[str, int] | None = None
        self.tables = None                       # SM over several machines: where the SM sends this one's tables
        self.tables_endpoint: tuple[str, int] | None = None
        self._peers_w = None                     # the pipe the parent hands the peers' endpoints through
        self._done_r = None                      # … and the one the SM says through that it programmed them all

    @property
    def endpoints(self) -> dict | None:
        """Where the other machines' agents reach this one (None on one machine)."""
        if self.flood_endpoint is None:
            return None
        return {"flood": self.flood_endpoint, "tables": self.tables_endpoint,
                "switches": list(self.topo.switches)}

    def set_peers(self, peers: list[dict], master: bool) -> None:
        """The other machines' agents (their ``endpoints``): from now on every change is flooded to them,
        starting with the ports already down. Under SM routing ``master`` makes this agent the subnet manager;
        it returns once the SM has programmed every machine's switches."""
        os.write(self._peers_w, (json.dumps({"peers": peers, "master": master}) + "\n").encode())
        if not (self.sm and master):
            return
        if not wait_readable([self._done_r], TABLES_TIMEOUT_S) or os.read(self._done_r, 1) != b"1":
            self.check()
            raise self.failure(f"{self.label}: the other machines' switches were not programmed within "
                               f"{TABLES_TIMEOUT_S:g} s")

    def _prepare(self) -> None:
        def sockets():
            ev = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
            try:
                ev.setsockopt(socket.SOL_SOCKET, 33, 1 << 20)           # SO_RCVBUFFORCE: a burst of changes
            except OSError:
                ev.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            ev.bind((0, RTMGRP_LINK))
            ev.setblocking(False)
            dump = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
            dump.bind((0, 0))
            dump.settimeout(netns.NETLINK_TIMEOUT_S)
            return ev, dump
        self.ev, self.dump = {}, {}
        for sw in self.topo.switches:
            self.ev[sw], self.dump[sw] = netns.run_in(self.fabric.ns[sw], sockets)
        if self.flood_address is not None:
            self.flood = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.flood.bind((self.flood_address, 0))
            self.flood.setblocking(False)
            self.flood_endpoint = self.flood.getsockname()
            if self.sm:
                self.tables = socket.create_server((self.flood_address, 0))
                self.tables.setblocking(False)   # accepted when readable: a peer gone meanwhile cannot block it
                self.tables_endpoint = self.tables.getsockname()

    def start(self) -> None:
        self._prepare()
        bpf = self.dp.bpf
        peers_r, self._peers_w = os.pipe()
        self._done_r, done_w = os.pipe()

        def close_sockets():
            os.close(peers_r)
            os.close(done_w)
            for d in (self.ev, self.dump):
                for s in d.values():
                    s.close()
            for s in (self.flood, self.tables):  # the agent's now: the parent keeps their addresses
                if s is not None:
                    s.close()
        name = f"ftb-{self.fabric.lab}-{'sm' if self.sm else 'lsw'}"
        try:
            self._fork(lambda wfd, ready: _Agent(self, bpf, wfd, ready, peers_r, done_w).run(), name,
                       after_fork=close_sockets)
        except BaseException:
            self._close_pipes()
            raise

    def _close_pipes(self) -> None:
        for attr in ("_peers_w", "_done_r"):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)

    def stop(self) -> dict:
        self._close_pipes()
        return super().stop()


class _Agent:
    def __init__(self, owner: RoutingAgent, bpf, wfd: int, ready, peers_r: int, done_w: int):
        self.o, self.bpf, self.wfd, self.ready, self.peers_r, self.done_w = owner, bpf, wfd, ready, peers_r, done_w
        self.topo, self.sm, self.whole = owner.topo, owner.sm, owner.whole
        # one machine: this agent is the SM; over several the parent says which one is (set_peers)
        self.master: bool | None = True if owner.flood is None else None
        self.remote_ports = [p.ifindex for sw in self.whole.switches if sw not in self.topo.nodes
                             for p in self.whole.ports[sw]]
        self.smas: list[tuple[tuple[str, int], set]] = []   # the SM's: each other machine's (tables, switches)
        self.sma_files: dict[tuple, object] = {}            # … its connection to each
        self.serving: dict[int, tuple] = {}                 # an SMA's: fd → (socket, file) of the SM's connection
        self.remote_entries = self.tables_taken = 0
        self.max_nh = owner.dp.max_nh
        self.port_down = bpf[b"port_down"]
        self.switch_of = {p.ifindex: sw for sw in self.topo.switches for p in self.topo.ports[sw]}
        self.sock_sw = {s.fileno(): sw for sw, s in owner.ev.items()}
        self.state: dict[int, bool] = {}           # the watcher's view: switch port → up
        self.view: dict[int, bool] = {}            # what routing was last computed from
        self.last_event: dict[int, float] = {}     # switch port → when the watcher saw its last change
        self.local: list[dict] = []
        self.changes: list[dict] = []
        self.changes_dropped = 0
        self.errors: list[str] = []
        self.stop = False
        spec = owner.scen.switch
        self.engine = spec.sm.engine
        self.multipath = spec.sm_multipath
        self.interval = spec.sm.sweep_interval / 1e9
        self.sweeps = 0
        self.late_sweeps = 0
        self.sweep_s: list[float] = []
        self.tables: algorithms.Tables = {}
        self.dist = None if self.sm else Distributed(owner.whole, set(self.topo.switches))
        self.overrides: dict = {}
        self.peers: list[tuple[str, int]] = []     # the other machines' agents (flooding)
        self.flood_seq = 0
        self.peer_seq: dict[tuple, int] = {}       # the last sequence number taken from each peer
        self.peer_down: dict[tuple, set] = {}      # each peer's ports that are down, as it last said
        self.floods_sent = self.floods_taken = 0
        self.flooded_at = 0.0
        key = owner.key               # over several machines every message on the underlay is sealed
        self.channels = {name: Channel(key, name) for name in ("flood", "tables", "tables-ack")} if key else {}

    def _seal(self, name: str, payload: bytes) -> bytes:
        return self.channels[name].seal(payload) if self.channels else payload

    def _open(self, name: str, data: bytes) -> bytes | None:
        """The payload of a message on channel ``name``; None when it is forged, altered or replayed (counted)."""
        return self.channels[name].open(data) if self.channels else data

    # ---- reading the kernel

    def _dump(self, sw: str) -> list[tuple[int, bool]]:
        s = self.o.dump[sw]
        s.send(link_dump_message())
        out = []
        while True:
            links, done = parse_links(s.recv(1 << 20))
            out += links
            if done:
                return [(i, up) for i, up in out if i in self.switch_of]

    def _sweep_read(self) -> dict[int, bool]:
        state = {}
        for sw in self.topo.switches:
            state.update(self._dump(sw))
        if self.smas:                              # the SM over several machines: what the others flooded
            state.update(self._remote_state())
        return state

    def _remote_state(self) -> dict[int, bool]:
        down = set().union(*self.peer_down.values())
        return {i: i not in down for i in self.remote_ports}

    def _events(self, fd: int) -> list[tuple[int, bool]]:
        s = self.o.ev[self.sock_sw[fd]]
        out = []
        while True:
            try:
                data = s.recv(1 << 20)
            except BlockingIOError:
                return out
            out += [(i, up) for i, up in parse_links(data)[0] if i in self.switch_of]

    def _take_events(self, fds, t: float) -> list[tuple[int, bool]]:
        """Apply the link notifications waiting on ``fds`` (seen at ``t``): local fast failover at once, and the
        event time each port's next re-route measures its detection from."""
        changed = []
        for fd in fds:
            for i, up in self._events(fd):
                if self.state.get(i) != up:
                    self.state[i] = up
                    self._mark(i, up)
                    self.last_event[i] = t
                    changed.append((i, up))
                    self.local.append({"t": t, "ifindex": i, "up": up})
        return changed

    def _mark(self, ifindex: int, up: bool) -> None:
        self.port_down[self.port_down.Key(ifindex)] = self.port_down.Leaf(0 if up else 1)

    # ---- flooding link state to the other machines' agents

    def _take_peers(self) -> None:
        """The parent handed the peers' endpoints (a JSON line): flood the current state to them at once."""
        data = os.read(self.peers_r, 65536)
        if not data:                               # the parent closed the pipe (it is stopping us)
            self.fds.remove(self.peers_r)
            return
        msg = json.loads(data.decode().splitlines()[-1])
        self.peers = [tuple(p["flood"]) for p in msg["peers"]]
        if self.sm:
            self.master = msg["master"]
            if self.master:                        # the subnet manager: program every machine's switches now
                self.smas = [(tuple(p["tables"]), set(p["switches"])) for p in msg["peers"]]
                now = time.time()
                self.state.update(self._remote_state())
                self._route(self.state, now, sorted(self.state.items()), "initial")
                os.write(self.done_w, b"1")
        self._flood()

    def _flood(self) -> None:
        """Tell every peer which of this machine's switch ports are down (absolute: a lost datagram is repaired
        by the next one, at the latest FLOOD_REFRESH_S later)."""
        if not self.peers:
            return
        self.flooded_at = time.monotonic()
        self.flood_seq += 1
        msg = json.dumps({"seq": self.flood_seq,
                          "down": sorted(i for i, up in self.state.items() if not up and i in self.switch_of)})
        data = self._seal("flood", msg.encode())
        for peer in self.peers:
            try:
                self.o.flood.sendto(data, peer)
                self.floods_sent += 1
            except OSError as e:                   # the next change's datagram repairs it: reported, not fatal
                self.errors.append(f"flooding to {peer[0]}:{peer[1]}: {e.strerror or e}")

    def _take_floods(self, t: float) -> list[tuple[int, bool]]:
        """A peer's ports whose state its latest message changed (seen at ``t``): they enter the view."""
        changed = []
        while True:
            try:
                data, peer = self.o.flood.recvfrom(65536)
            except BlockingIOError:
                return changed
            payload = self._open("flood", data)
            if payload is None:
                continue                           # not from this run's agents, or a replay: dropped, counted
            msg = json.loads(payload)
            if msg["seq"] <= self.peer_seq.get(peer, 0):
                continue                           # an older message overtaken by a newer one
            self.peer_seq[peer] = msg["seq"]
            self.floods_taken += 1
            down, was = set(msg["down"]), self.peer_down.get(peer, set())
            self.peer_down[peer] = down
            for i, up in [(i, False) for i in sorted(down - was)] + [(i, True) for i in sorted(was - down)]:
                if self.state.get(i, True) != up:
                    self.state[i] = up
                    self.last_event[i] = t
                    changed.append((i, up))

    # ---- the SM's tables over several machines

    def _send_tables(self, endpoint: tuple, puts: dict, dels: list, switches: set, initial: bool) -> int:
        """Send another machine's agent its switches' entries and wait for its acknowledgement; returns the
        entries it wrote. A machine that cannot be reached fails the initial programming (the run cannot go on
        without routes) and is an error of the sweep afterwards."""
        if not puts and not dels:
            return 0
        msg = {"put": [[sw, addr, list(p)] for (sw, addr), p in puts.items()], "del": [list(k) for k in dels]}
        try:
            f = self.sma_files.get(endpoint)
            if f is None:
                conn = socket.create_connection(endpoint, timeout=TABLES_TIMEOUT_S)
                f = self.sma_files[endpoint] = conn.makefile("rwb")
            f.write(self._seal("tables", json.dumps(msg).encode()) + b"\n")
            f.flush()
            line = f.readline()
            ack = self._open("tables-ack", line.rstrip(b"\n")) if line else None
            reply = json.loads(ack) if ack is not None else None
            if reply is None or "entries" not in reply:
                raise OSError(f"no acknowledgement ({reply and reply.get('error')})")
        except (OSError, ValueError) as e:
            if initial:
                raise RuntimeError(f"programming the switches of {endpoint[0]}: {e}") from None
            self.errors.append(f"tables to {endpoint[0]}:{endpoint[1]}: {e}")
            self.sma_files.pop(endpoint, None)
            return 0
        self.remote_entries += reply["entries"]
        switches.update(sw for sw, _ in list(puts) + list(dels))      # as apply_tables does for its own
        return reply["entries"]

    def _serve_tables(self, fd: int) -> None:
        """An SMA: accept a connection to its table port, or take what arrived on one. Each complete line is a
        message: the SM's tables are written and acknowledged; anything else (forged, altered, replayed, or cut
        short by the connection's end) is dropped, counted and never answered. Reads never block, and a reset is
        the connection's end: whoever reaches the port on the underlay can neither hold the agent's loop (a line
        left unfinished) nor end it."""
        if fd == self.o.tables.fileno():
            try:
                conn, _ = self.o.tables.accept()
            except OSError:                        # gone before it was accepted
                return
            conn.setblocking(False)
            self.serving[conn.fileno()] = (conn, bytearray())
            self.fds.append(conn.fileno())
            return
        conn, buf = self.serving[fd]
        ended = False
        while not ended:
            try:
                data = conn.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError:                        # reset by the peer: its end
                data = b""
            ended = not data
            buf += data
            while (cut := buf.find(b"\n")) >= 0:
                line = bytes(buf[:cut])
                del buf[:cut + 1]
                if not self._take_table(conn, line):
                    buf.clear()                    # the connection is dropped: nothing after it was cut
                    ended = True
                    break
            if len(buf) > MAX_TABLE_LINE:
                self.channels["tables"].refuse()
                buf.clear()
                ended = True
        if ended:
            if buf:                                # a message the connection's end cut short
                self.channels["tables"].refuse()
            self.fds.remove(fd)
            del self.serving[fd]
            conn.close()

    def _take_table(self, conn, line: bytes) -> bool:
        """One line from the table port: write and acknowledge it if it is the SM's. False when the
        acknowledgement could not be sent (the connection is then dropped: the SM reconnects)."""
        payload = self._open("tables", line)
        if payload is None:                        # not the run's SM: nothing is written, nothing answered
            return True
        msg = json.loads(payload)
        n = apply_tables(self.bpf, self.whole, {(sw, addr): tuple(p) for sw, addr, p in msg["put"]},
                         [tuple(k) for k in msg["del"]], self.max_nh)
        self.tables_taken += n
        try:
            conn.settimeout(TABLES_TIMEOUT_S)
            conn.sendall(self._seal("tables-ack", json.dumps({"entries": n}).encode()) + b"\n")
            conn.setblocking(False)
        except OSError as e:
            self.errors.append(f"acknowledging tables: {e.strerror or e}")
            return False
        return True

    # ---- routing

    def _down(self, view: dict[int, bool]) -> frozenset:
        return frozenset(i for i, up in view.items() if not up)

    def _route(self, view: dict[int, bool], t_detect: float, changed: list[tuple[int, bool]], kind: str) -> None:
        """Recompute from ``view`` and write what differs; record the change."""
        t0 = time.perf_counter()
        down = self._down(view)
        if self.sm:
            new = algorithms.reroute(self.engine, algorithms.graph(self.whole, down), self.tables,
                                     came_up=any(up for _, up in changed), multipath=self.multipath)
        else:
            new = self.dist.overrides(down)
        t1 = time.perf_counter()
        switches: set = set()
        w0 = time.time()
        if self.sm:
            diff = table_diff(self.tables, new)
            entries = apply_tables(self.bpf, self.whole, *tables_of(*diff, self.topo.nodes), self.max_nh,
                                   switches)
            for endpoint, theirs in self.smas:
                entries += self._send_tables(endpoint, *tables_of(*diff, theirs), switches, kind == "initial")
            self.tables = new
        else:
            entries = self.dist.write(self.bpf, self.overrides, new, self.max_nh, switches)
            self.overrides = new
        done = time.time()
        self.view = dict(view)
        events = [self.last_event[i] for i, _ in changed if i in self.last_event]
        rec = {"kind": kind, "t_detect": t_detect, "t_event": min(events) if events else None,
               "ports": [[i, up] for i, up in changed] if kind != "initial" else [], "port_count": len(changed),
               "compute_s": t1 - t0, "entries": entries,
               "install_s": done - w0, "t_done": done, "switches": len(switches)}
        if len(self.changes) < MAX_CHANGES:
            self.changes.append(rec)
        else:
            self.changes_dropped += 1

    def _sweep(self) -> None:
        t0 = time.time()
        try:
            state = self._sweep_read()
        except OSError as e:
            self.errors.append(f"sweep {self.sweeps}: {e}")
            return
        t_read = time.time()
        # a change the dump shows may have its notification queued: take it now, or the re-route would be timed
        # from the port's previous event (it came after the loop last drained the watcher: timed from this
        # sweep's start). Its notification may also not be queued yet — the kernel sends carrier changes from
        # its deferred linkwatch work, which a busy machine runs late (1.4–1.9 s seen beside a CPU hog): then the
        # sweep saw the change first, at its start, and the port is marked now
        self._take_events(list(self.sock_sw), t0)
        for i, up in state.items():
            if i in self.switch_of and self.state.get(i) != up:
                self.state[i] = up
                self._mark(i, up)
                self.last_event[i] = t0
                self.local.append({"t": t0, "ifindex": i, "up": up})
        self.sweeps += 1
        self.sweep_s.append(t_read - t0)
        changed = [(i, up) for i, up in state.items() if self.view.get(i) != up]
        if changed:
            self._route(state, t_read, changed, "sweep")

    # ---- the loop

    def run(self):
        signal.signal(signal.SIGTERM, self._term)
        self.state = self._sweep_read()
        now = time.time()
        for i in self.switch_of:
            up = self.state.get(i, False)
            self.state[i] = up
            self._mark(i, up)
            self.last_event[i] = now
        if self.master or not self.sm:           # (the SM over several machines: once it knows the others)
            self._route(self.state, now, sorted(self.state.items()), "initial")
        self.ready()
        self.fds = fds = list(self.sock_sw) + [self.peers_r]
        flood_fd = self.o.flood.fileno() if self.o.flood is not None else None
        if flood_fd is not None:
            fds.append(flood_fd)
        if self.o.tables is not None:
            fds.append(self.o.tables.fileno())
        next_sweep = time.monotonic() + self.interval
        while not self.stop:
            sweeping = self.sm and self.master
            timeout = min(WATCH_POLL_S, max(0.0, next_sweep - time.monotonic())) if sweeping else WATCH_POLL_S
            try:
                readable = wait_readable(fds, timeout)
            except InterruptedError:
                continue
            t = time.time()
            if self.peers_r in readable:
                self._take_peers()
                next_sweep = time.monotonic() + self.interval    # the SM's sweeps count from its programming
            changed = self._take_events([fd for fd in readable if fd in self.sock_sw], t)
            if changed or (self.peers and time.monotonic() - self.flooded_at >= FLOOD_REFRESH_S):
                self._flood()
            if flood_fd in readable:
                changed += self._take_floods(t)
            for fd in readable:
                if fd in self.serving or (self.o.tables is not None and fd == self.o.tables.fileno()):
                    self._serve_tables(fd)
            if changed and not self.sm:
                # the routing protocol's part: everything else stops using what the failure cut off
                self._route(self.state, t, changed, "reroute")
            if sweeping and time.monotonic() >= next_sweep:
                self._sweep()
                next_sweep += self.interval
                if next_sweep < time.monotonic():
                    self.late_sweeps += 1
                    next_sweep = time.monotonic() + self.interval
        write_result(self.wfd, {
            "mode": "sm" if self.sm else "distributed", "engine": self.engine if self.sm else None,
            "sweep_interval_s": self.interval if self.sm else None, "sweeps": self.sweeps,
            "late_sweeps": self.late_sweeps, "sweep_s": _stats(self.sweep_s), "local": self.local[:MAX_CHANGES],
            "changes": self.changes, "changes_dropped": self.changes_dropped, "errors": self.errors[:20],
            "error_count": len(self.errors), "entries": len(self.tables) if self.sm else len(self.overrides),
            "role": ("subnet manager" if self.master else "sm agent") if self.sm else "watcher",
            "remote_entries": self.remote_entries, "tables_taken": self.tables_taken,
            "floods_sent": self.floods_sent, "floods_taken": self.floods_taken,
            "rejected": {k: sum(ch.counts()[k] for ch in self.channels.values()) for k in ("forged", "replayed")}})

    def _term(self, *_):
        self.stop = True


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "max": None}
    s = sorted(xs)
    return {"n": len(s), "mean": sum(s) / len(s), "p50": s[len(s) // 2], "max": s[-1]}
