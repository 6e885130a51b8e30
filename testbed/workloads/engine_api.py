"""What every traffic engine shares: the send loop's status codes, pacing, socket options, per-flow receive state.

The agent (agent.py) drives engines through these status codes; udp.py, tcp.py and roce/ implement them. The
interface an engine offers is described in engines.py.
"""
from __future__ import annotations

import socket

from ..qos_classes import skb_priority

READY, WAIT_TIME, WAIT_WRITE, WAIT_READ, DONE = range(5)

IP_UDP_HDR = 28
IP_TCP_HDR = 40
BURST = 32                           # packets per pump (fairness between flows of one host)
MAX_LAG_S = 0.02                     # a paced flow more than this behind schedule forfeits the excess
RCVBUF = 8 << 20
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32


def _rcvbuf(sock: socket.socket, size: int = RCVBUF) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def _tos(sock: socket.socket, flow: dict) -> None:
    """DSCP/ECN of the flow's packets (IP_TOS; TCP keeps the ECN bits to itself) and its host NIC class."""
    tos = (flow.get("dscp", 0) << 2) | {"none": 0, "ect1": 1, "ect0": 2}.get(flow.get("ecn", "none"), 0)
    if tos:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    if flow.get("prio") is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, skb_priority(flow["prio"]))


def _reuse(sock: socket.socket, port_too: bool = True) -> None:
    """Senders share a source port when the scenario fixes it (SO_REUSEPORT); receivers must not share theirs
    (a stale process on the port would silently take half the packets), so they only get SO_REUSEADDR."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if port_too:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)


class Pacer:
    """Send schedule for a rate in IP bytes per second: the byte at offset b may leave at origin + b/rate.
    A sender that falls more than MAX_LAG_S behind (blocked, descheduled) drops the excess credit, so it
    catches up in bursts of at most that much."""

    def __init__(self, rate_bps: int | None, now: float):
        self.rate = rate_bps / 8.0 if rate_bps else None
        self.origin = now
        self.sent = 0

    def allowance(self, now: float) -> float:
        """Bytes that may go now (may be negative: wait)."""
        credit = (now - self.origin) * self.rate - self.sent
        if credit > MAX_LAG_S * self.rate:
            self.origin += (credit - MAX_LAG_S * self.rate) / self.rate
            credit = MAX_LAG_S * self.rate
        return credit

    def wake(self, need: int) -> float:
        return self.origin + (self.sent + need) / self.rate



class Steerable:
    """A sender whose source port — its ECMP path — may change: the fabric controller's moves mid-flow, or a
    collective policy's choice before it starts (``count=False``: not a move). ``_rebind(sport)`` makes the
    engine send from the new port (or raises OSError: the port is taken, the flow stays put)."""
    next_sport = None
    count_move = True

    def steer(self, sport: int, count: bool = True) -> None:
        """Send from ``sport`` from the next burst on; the receiver knows the flow by its header, not this."""
        self.next_sport, self.count_move = sport, count

    def _move(self) -> None:
        sport, self.next_sport = self.next_sport, None
        if sport == self.flow["sport"]:
            return
        try:
            self._rebind(sport)
        except OSError:
            self.flow["entropy_refused"] = self.flow.get("entropy_refused", 0) + 1
            return
        self.flow["sport"] = sport
        if self.count_move:
            self.flow["entropy_changes"] = self.flow.get("entropy_changes", 0) + 1

    def _rebind(self, sport: int) -> None:
        raise NotImplementedError


TIMELINE_JUMPS = 20000               # sequence jumps a flow's timeline keeps (a spraying flow reorders a lot)


class RxFlow:
    __slots__ = ("flow_id", "size", "expected", "bytes", "packets", "dup", "reordered", "max_seq", "first_rx",
                 "last_rx", "bitmap", "owd_sum", "owd_max", "sent_total", "end_at", "eof", "complete_at",
                 "proto", "drain_s", "deadline", "tl_bin", "tl_t0", "bins", "jumps", "max_ts", "jumps_dropped")

    def __init__(self, flow: dict, proto: str, expected: int | None, drain_s: float):
        self.flow_id = flow["flow_id"]
        self.size = flow["size_bytes"]
        self.proto = proto
        self.expected = expected          # packets, when the size says so
        self.bytes = 0
        self.packets = 0
        self.dup = 0
        self.reordered = 0
        self.max_seq = -1
        self.first_rx = None
        self.last_rx = None
        self.bitmap = bytearray(1024)
        self.owd_sum = 0.0
        self.owd_max = 0.0
        self.sent_total = None            # from the UDP end marker
        self.end_at = None
        self.eof = False
        self.complete_at = None
        self.drain_s = drain_s
        self.deadline = None              # t0 + duration: UDP flows idle for drain_s after it are over
        self.tl_bin = None                # timeline (runs with failures): bytes received per bin from tl_t0 …
        self.tl_t0 = 0.0
        self.bins: list[int] = []
        self.jumps: list[tuple] = []      # … and UDP sequence jumps: (tx time before, tx time after, seq a, seq b)
        self.max_ts = None
        self.jumps_dropped = 0

    def timeline_on(self, t0: float, bin_s: float) -> None:
        """Record the receive rate over time and where packets went missing (failures.csv: dips and losses)."""
        self.tl_t0, self.tl_bin = t0, bin_s

    def tick(self, t: float, n: int) -> None:
        """``n`` bytes arrived at ``t`` (timeline on)."""
        i = int((t - self.tl_t0) / self.tl_bin)
        if i < 0:
            i = 0
        b = self.bins
        if i >= len(b):
            b.extend([0] * (i - len(b) + 64))
        b[i] += n

    def jump(self, ts: float, seq: int) -> None:
        """A UDP packet ``seq`` (sent at ``ts``) arrived above the highest sequence seen + 1: the packets in
        between are late or lost; ``timeline()`` tells which from the bitmap at the end."""
        if len(self.jumps) < TIMELINE_JUMPS:
            self.jumps.append((self.max_ts if self.max_ts is not None else ts, ts, self.max_seq, seq))
        else:
            self.jumps_dropped += 1

    def timeline(self) -> dict:
        """Bytes per bin (trailing empty bins cut) and, for UDP, the gaps still missing at the end: (tx time of
        the packet before, tx time of the packet after, packets missing), times in epoch seconds."""
        b = self.bins
        n = len(b)
        while n and not b[n - 1]:
            n -= 1
        out = {"t0": self.tl_t0, "bin_s": self.tl_bin, "bins": b[:n]}
        if self.proto == "udp":
            gaps, bm = [], self.bitmap
            for ta, tb, a, z in self.jumps:
                missing = sum(1 for s in range(a + 1, z) if not (s >> 3 < len(bm) and bm[s >> 3] & (1 << (s & 7))))
                if missing:
                    gaps.append((ta, tb, missing))
            expect = self.sent_total if self.sent_total is not None else self.expected
            if expect is not None and expect > self.max_seq + 1 and self.max_ts is not None:
                gaps.append((self.max_ts, self.end_at or self.max_ts, expect - self.max_seq - 1))   # the tail
            out["gaps"] = gaps
            out["jumps_dropped"] = self.jumps_dropped
        return out

    @property
    def complete(self) -> bool:
        return self.size is not None and self.bytes >= self.size

    def skip(self, now: float) -> None:
        """The flow will not run (a collective policy skipped it): done, with nothing to receive."""
        self.size, self.expected, self.complete_at = 0, 0, now

    def finished(self, now: float) -> bool:
        if self.complete or self.eof:
            return True
        if self.end_at is not None:
            return self.packets >= self.sent_total or now - self.end_at > self.drain_s
        if self.proto == "udp" and self.deadline is not None and now > self.deadline:
            return now - max(self.deadline, self.last_rx or 0.0) > self.drain_s   # end markers lost
        return False

    def result(self) -> dict:
        if self.proto == "udp":
            expect = self.sent_total if self.sent_total is not None else (
                self.expected if self.expected is not None else self.max_seq + 1)
            lost = max(0, expect - self.packets)
            owd = self.owd_sum / self.packets if self.packets else None
            return dict(bytes=self.bytes, packets=self.packets, first_rx=self.first_rx, last_rx=self.last_rx,
                        complete=self.complete, dup=self.dup, reordered=self.reordered, lost=lost,
                        sent_reported=self.sent_total, owd_mean_s=owd,
                        owd_max_s=self.owd_max if self.packets else None)
        return dict(bytes=self.bytes, packets=None, first_rx=self.first_rx, last_rx=self.last_rx,
                    complete=self.complete, eof=self.eof)
