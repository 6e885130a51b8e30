"""Traffic engines: the socket code that sends and receives one kind of flow, run inside a host's agent.

An engine is a class with:
  name, proto      registry key and L4 protocol on the wire
  dport            a fixed destination port (e.g. 4791 for RoCEv2) or None = the scenario's
  sender(flow, job)            → a Sender (one per flow this host sends)
  receivers(flows, job)        → Receivers for the flows this host receives (grouped as the engine likes)

A Sender is driven by the agent's send loop (one thread, non-blocking sockets, poll):
  begin(now)                   called at t0 + flow.start_s
  pump(now) → (status, arg)    do a bounded amount of work; status is READY (call again soon), WAIT_TIME
                               (arg = absolute wake-up time), WAIT_WRITE / WAIT_READ (poll the fileno()), DONE
  stats() → dict               sender-side figures for the result
A Receiver is driven by the receive thread: fileno(), on_readable(now) → list of new Receivers (e.g. accepted
connections) or None, ``closed``; its flows are ``RxFlow`` objects the agent polls for ``finished(now)``.

Wire formats (both engines count L4 payload bytes, so ``size_bytes`` is exactly what the receiver counts):
  UDP  every datagram starts with HDR = (flow_id u32, seq u64, tx time f64, network order), zero padding
       makes the IP packet ``packet_size`` bytes (the last datagram of a sized flow is shorter). After its last
       data packet the sender sends END_COPIES end markers (seq = END_SEQ, then u64 packets sent) that tell the
       receiver how many packets to expect; markers are not counted as data.
  TCP  an 8-byte preamble (b"FTB1", flow_id u32), then ``size_bytes`` (or, for a duration, until the end) of
       zeros; the sender then shuts down its side and waits for the receiver's EOF.
  RoCEv2 (roce.py, proto "rocev2", dport 4791): BTH/RETH/AETH/ICRC over UDP, RC reliability and DCQCN.
"""
from __future__ import annotations

import errno
import socket
import struct
import time

READY, WAIT_TIME, WAIT_WRITE, WAIT_READ, DONE = range(5)

IP_UDP_HDR = 28
IP_TCP_HDR = 40
HDR = struct.Struct("!IQd")          # flow_id, seq, tx timestamp
END_SEQ = (1 << 64) - 1
END = struct.Struct("!IQdQ")         # flow_id, END_SEQ, tx timestamp, packets sent
END_COPIES = 3
PREAMBLE = struct.Struct("!4sI")
MAGIC = b"FTB1"
BURST = 32                           # packets per pump (fairness between flows of one host)
MAX_LAG_S = 0.02                     # a paced flow more than this behind schedule forfeits the excess
SEQ_LIMIT = 1 << 31                  # larger sequence numbers are garbage (the bitmap would explode)
RCVBUF = 8 << 20
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32


def udp_payload_max(packet_size: int) -> int:
    p = packet_size - IP_UDP_HDR
    if p < END.size:
        raise ValueError(f"packet_size {packet_size} leaves no room for the {END.size}-byte header")
    return p


def udp_packet_count(size_bytes: int, pmax: int) -> int:
    """Datagrams a sized flow needs (the sender's split keeps every datagram ≥ HDR.size)."""
    return max(1, -(-size_bytes // pmax))


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
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, 0x10000 | (0x10 + flow["prio"]))


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


# ---------------------------------------------------------------- receive-side per-flow state

class RxFlow:
    __slots__ = ("flow_id", "size", "expected", "bytes", "packets", "dup", "reordered", "max_seq", "first_rx",
                 "last_rx", "bitmap", "owd_sum", "owd_max", "sent_total", "end_at", "eof", "complete_at",
                 "proto", "drain_s", "deadline")

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

    @property
    def complete(self) -> bool:
        return self.size is not None and self.bytes >= self.size

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


# ---------------------------------------------------------------- UDP

class UdpSender:
    def __init__(self, flow: dict, job: dict):
        self.flow = flow
        self.fid = flow["flow_id"]
        self.pmax = udp_payload_max(job["packet_size"])
        self.deadline = job["t0"] + job["duration_s"]
        self.remaining = flow["size_bytes"]
        s = self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _reuse(s)
        if job.get("sndbuf_each"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4096, job["sndbuf_each"] // 2))
        _tos(s, flow)
        s.bind((flow["src_addr"], flow["sport"]))
        s.connect((flow["dst_addr"], flow["dport"]))
        s.setblocking(False)
        self.buf = bytearray(self.pmax)
        self.mv = memoryview(self.buf)
        self.seq = 0
        self.bytes = 0
        self.refused = 0
        self.ends_left = END_COPIES
        self.send_start = self.send_end = None
        self.pacer = None
        self.error = None
        self.done = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def begin(self, now: float) -> None:
        self.send_start = now
        self.pacer = Pacer(self.flow["rate_bps"], now)

    def abort(self, reason: str) -> None:
        self.error = self.error or reason
        if self.send_end is None:
            self.send_end = time.time()
        self.done = True
        self.sock.close()

    def _send_ends(self):
        while self.ends_left:
            END.pack_into(self.buf, 0, self.fid, END_SEQ, time.time(), self.seq)
            try:
                self.sock.send(self.mv[:END.size])
            except BlockingIOError:
                return WAIT_WRITE, None
            except OSError:
                pass                       # e.g. ECONNREFUSED from an earlier ICMP: the marker is best effort
            self.ends_left -= 1
        self.sock.close()
        self.done = True
        return DONE, None

    def pump(self, now: float):
        if self.send_end is not None:
            return self._send_ends()
        rem = self.remaining
        if now >= self.deadline or (rem is not None and rem <= 0):
            self.send_end = now
            return self._send_ends()
        pmax, mv, buf, fid = self.pmax, self.mv, self.buf, self.fid
        budget = BURST
        pacer = self.pacer
        if pacer.rate:
            allow = pacer.allowance(now)
            wire = pmax + IP_UDP_HDR
            if allow < 0:
                return WAIT_TIME, pacer.wake(0)
            budget = min(BURST, int(allow // wire) + 1)
        send, pack, clock = self.sock.send, HDR.pack_into, time.time
        seq, sent_bytes, paced = self.seq, 0, 0
        status = READY
        for _ in range(budget):
            if rem is None:
                n, data = pmax, mv
            else:
                if rem <= 0:
                    break
                if rem > pmax:
                    n = pmax if rem - pmax >= HDR.size else rem - HDR.size
                else:
                    n = rem if rem >= HDR.size else HDR.size
                data = mv if n == pmax else mv[:n]
            pack(buf, 0, fid, seq, clock())
            try:
                send(data)
            except BlockingIOError:
                status = WAIT_WRITE
                break
            except ConnectionRefusedError:      # ICMP port unreachable for an earlier packet; try again
                self.refused += 1
                continue
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    status = WAIT_WRITE
                    break
                self.error = f"send: {e.strerror}"
                self.send_end = clock()
                self.ends_left = 0
                self.sock.close()
                self.done = True
                return DONE, None
            seq += 1
            sent_bytes += n
            paced += n + IP_UDP_HDR
            if rem is not None:
                rem -= n
        self.seq = seq
        self.bytes += sent_bytes
        self.remaining = rem
        pacer.sent += paced
        if rem is not None and rem <= 0:
            self.send_end = clock()
            return self._send_ends()
        return status, None

    def stats(self) -> dict:
        return dict(packets_sent=self.seq, bytes_sent=self.bytes, send_start=self.send_start,
                    send_end=self.send_end, refused=self.refused, error=self.error)


class UdpReceiver:
    """One socket per destination port; demultiplexes flows by the flow_id in the header."""
    closed = False

    def __init__(self, dport: int, flows: dict[int, RxFlow]):
        s = self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _reuse(s, port_too=False)
        _rcvbuf(s)
        s.bind(("0.0.0.0", dport))
        s.setblocking(False)
        self.flows = flows
        self.buf = bytearray(65536)
        self.unknown = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def on_readable(self, now: float):
        recv, buf, unpack, flows, clock = self.sock.recv_into, self.buf, HDR.unpack_from, self.flows, time.time
        for _ in range(256):
            try:
                n = recv(buf)
            except BlockingIOError:
                return None
            except OSError:
                continue
            if n < HDR.size:
                self.unknown += 1
                continue
            fid, seq, ts = unpack(buf)
            st = flows.get(fid)
            t = clock()
            if st is None:
                self.unknown += 1
                continue
            if seq >= SEQ_LIMIT:
                if seq == END_SEQ and n >= END.size and st.end_at is None:
                    st.sent_total = END.unpack_from(buf)[3]
                    st.end_at = t
                continue
            idx, bit = seq >> 3, 1 << (seq & 7)
            bm = st.bitmap
            if idx >= len(bm):
                bm.extend(bytes(idx - len(bm) + 4096))
            if bm[idx] & bit:
                st.dup += 1
                continue
            bm[idx] |= bit
            if st.first_rx is None:
                st.first_rx = t
            st.last_rx = t
            st.bytes += n
            st.packets += 1
            if seq < st.max_seq:
                st.reordered += 1
            else:
                st.max_seq = seq
            d = t - ts
            st.owd_sum += d
            if d > st.owd_max:
                st.owd_max = d
        return None

    def close(self):
        self.sock.close()


class UdpEngine:
    name = "udp"
    proto = "udp"
    dport = None

    @staticmethod
    def sender(flow: dict, job: dict):
        return UdpSender(flow, job)

    @staticmethod
    def receivers(flows: list[dict], job: dict):
        pmax = udp_payload_max(job["packet_size"])
        drain = job.get("drain_s", 0.3)
        by_port: dict[int, dict[int, RxFlow]] = {}
        states = []
        for f in flows:
            exp = udp_packet_count(f["size_bytes"], pmax) if f["size_bytes"] is not None else None
            st = RxFlow(f, "udp", exp, drain)
            by_port.setdefault(f["dport"], {})[f["flow_id"]] = st
            states.append(st)
        return [UdpReceiver(p, fl) for p, fl in by_port.items()], states


# ---------------------------------------------------------------- TCP

class TcpSender:
    CHUNK = 256 * 1024
    _zeros = memoryview(bytes(CHUNK))

    def __init__(self, flow: dict, job: dict):
        self.flow = flow
        self.job = job
        self.deadline = job["t0"] + job["duration_s"]
        self.give_up = self.deadline + job.get("grace_s", 2.0)
        self.remaining = flow["size_bytes"]
        self.bytes = 0
        self.send_start = self.send_end = None
        self.error = None
        self.retrans = None
        self.state = "idle"
        self.connects = 0
        self.pacer = None
        mss = (job.get("packet_size") or 1500) - IP_TCP_HDR
        self.wire = (mss + IP_TCP_HDR) / mss        # pace IP bytes, like UDP
        self._make()

    def _make(self):
        s = self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _reuse(s)
        _tos(s, self.flow)
        ps = self.job.get("packet_size")
        if ps:
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, ps - IP_TCP_HDR)
            except OSError:
                pass
        s.bind((self.flow["src_addr"], self.flow["sport"]))
        s.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def begin(self, now: float) -> None:
        self.pacer = Pacer(self.flow["rate_bps"], now)
        self._connect()

    @property
    def done(self) -> bool:
        return self.state == "done"

    def abort(self, reason: str) -> None:
        self._finish(time.time(), reason)

    def _connect(self):
        self.connects += 1
        self.state = "connecting"
        self.sock.connect_ex((self.flow["dst_addr"], self.flow["dport"]))

    def _finish(self, now, error=None):
        if error and not self.error:
            self.error = error
        if self.send_end is None:
            self.send_end = now
        try:
            self.sock.close()
        except OSError:
            pass
        self.state = "done"
        return DONE, None

    def _tcp_retrans(self):
        try:   # struct tcp_info: tcpi_total_retrans is the u32 at offset 100
            info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            return struct.unpack_from("I", info, 100)[0]
        except (OSError, struct.error):
            return None

    def pump(self, now: float):
        st = self.state
        if st == "retry":
            self._make()
            self._connect()
            return WAIT_WRITE, None
        if st == "connecting":
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err == errno.EINPROGRESS or err == errno.EALREADY:
                return WAIT_WRITE, None
            if err:
                self.sock.close()
                if err in (errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH) and now + 0.05 < self.deadline:
                    self.state = "retry"        # the receiver may not listen yet: try again shortly
                    return WAIT_TIME, now + 0.05
                return self._finish(now, f"connect: {errno.errorcode.get(err, err)}")
            try:
                self.sock.getpeername()
            except OSError:                     # still in progress (woken by a timer, not by poll)
                if now >= self.deadline:
                    return self._finish(now, "connect: timed out")
                return WAIT_WRITE, None
            self.state = "sending"
            self.send_start = now
            self.head = memoryview(PREAMBLE.pack(MAGIC, self.flow["flow_id"]))
        if st == "closing":
            if now > self.give_up:
                return self._finish(now, "no EOF from the receiver")
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return WAIT_READ, None
            except OSError as e:
                return self._finish(self.send_end, f"close: {e.strerror}")
            if data:
                return WAIT_READ, None
            return self._finish(self.send_end)
        # sending
        if self.head is not None:
            try:
                k = self.sock.send(self.head)
            except BlockingIOError:
                return WAIT_WRITE, None
            except OSError as e:
                return self._finish(now, f"send: {e.strerror}")
            self.head = self.head[k:] if k < len(self.head) else None
            if self.head is not None:
                return WAIT_WRITE, None
        rem = self.remaining
        if now >= self.deadline or (rem is not None and rem <= 0):
            return self._shutdown(now)
        n = self.CHUNK if rem is None else min(rem, self.CHUNK)
        pacer = self.pacer
        if pacer.rate:
            allow = pacer.allowance(now) / self.wire
            if allow < 1:
                return WAIT_TIME, pacer.wake(1)
            n = min(n, max(1, int(allow)))
        try:
            k = self.sock.send(self._zeros[:n])
        except BlockingIOError:
            return WAIT_WRITE, None
        except OSError as e:
            return self._finish(now, f"send: {e.strerror}")
        self.bytes += k
        pacer.sent += k * self.wire
        if rem is not None:
            self.remaining = rem - k
            if self.remaining <= 0:
                return self._shutdown(time.time())
        return READY, None

    def _shutdown(self, now):
        self.send_end = now
        self.retrans = self._tcp_retrans()
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            return self._finish(now, f"shutdown: {e.strerror}")
        self.state = "closing"
        return WAIT_READ, None

    def stats(self) -> dict:
        return dict(packets_sent=None, bytes_sent=self.bytes, send_start=self.send_start,
                    send_end=self.send_end, retrans=self.retrans, connects=self.connects, error=self.error)


class TcpConn:
    closed = False

    def __init__(self, sock: socket.socket, flows: dict[int, RxFlow], buf: bytearray):
        sock.setblocking(False)
        self.sock = sock
        self.flows = flows
        self.buf = buf
        self.head = b""
        self.st: RxFlow | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def on_readable(self, now: float):
        for _ in range(16):
            try:
                n = self.sock.recv_into(self.buf)
            except BlockingIOError:
                return None
            except OSError:
                n = 0
            t = time.time()
            if n == 0:
                if self.st is not None:
                    self.st.eof = True
                self.close()
                return None
            data_n = n
            if self.st is None:
                need = PREAMBLE.size - len(self.head)
                self.head += bytes(self.buf[:min(n, need)])
                if len(self.head) < PREAMBLE.size:
                    continue
                magic, fid = PREAMBLE.unpack(self.head)
                self.st = self.flows.get(fid) if magic == MAGIC else None
                if self.st is None:
                    self.close()
                    return None
                data_n = n - need
            if data_n:
                st = self.st
                if st.first_rx is None:
                    st.first_rx = t
                st.last_rx = t
                st.bytes += data_n
        return None

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


class TcpListener:
    closed = False

    def __init__(self, dport: int, flows: dict[int, RxFlow]):
        s = self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _reuse(s, port_too=False)
        s.bind(("0.0.0.0", dport))
        s.listen(1024)
        s.setblocking(False)
        self.flows = flows
        self.buf = bytearray(256 * 1024)

    def fileno(self) -> int:
        return self.sock.fileno()

    def on_readable(self, now: float):
        new = []
        while True:
            try:
                c, _ = self.sock.accept()
            except BlockingIOError:
                return new
            except OSError:
                return new
            new.append(TcpConn(c, self.flows, self.buf))

    def close(self):
        self.sock.close()


class TcpEngine:
    name = "tcp"
    proto = "tcp"
    dport = None

    @staticmethod
    def sender(flow: dict, job: dict):
        return TcpSender(flow, job)

    @staticmethod
    def receivers(flows: list[dict], job: dict):
        by_port: dict[int, dict[int, RxFlow]] = {}
        states = []
        for f in flows:
            st = RxFlow(f, "tcp", None, job.get("drain_s", 0.3))
            by_port.setdefault(f["dport"], {})[f["flow_id"]] = st
            states.append(st)
        return [TcpListener(p, fl) for p, fl in by_port.items()], states


ENGINES = {"udp": UdpEngine, "tcp": TcpEngine}

from .roce import RoceEngine  # noqa: E402 — roce.py imports the status constants above

ENGINES["roce"] = RoceEngine
