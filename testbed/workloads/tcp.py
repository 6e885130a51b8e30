"""TCP engine: the kernel's TCP, one connection per flow.

The sender writes an 8-byte preamble (b"FTB1", flow_id u32), then ``size_bytes`` (or, for a duration, until the
end) of zeros; it then shuts down its side and waits for the receiver's EOF.
"""
from __future__ import annotations

import errno
import socket
import struct
import time

from .engine_api import (DONE, IP_TCP_HDR, READY, WAIT_READ, WAIT_TIME, WAIT_WRITE, Pacer, RxFlow, _reuse, _tos)

TCP_TIMESTAMPS = 12              # the timestamp option (with padding) in every segment Linux sends

PREAMBLE = struct.Struct("!4sI")
MAGIC = b"FTB1"


class TcpSender:
    CHUNK = 256 * 1024
    _zeros = memoryview(bytes(CHUNK))

    def __init__(self, flow: dict, job: dict):
        self.flow = flow
        self.job = job
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

    @property
    def deadline(self) -> float:
        """t0 + duration: t0 comes with the agent's start line, after the sender is made (agent.py)."""
        return self.job["t0"] + self.job["duration_s"]

    @property
    def give_up(self) -> float:
        return self.deadline + self.job.get("grace_s", 2.0)

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
                if st.tl_bin is not None:
                    st.tick(t, data_n)
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
    def framing(packet_size: int, opts: dict | None) -> tuple[int, int]:
        """(flow bytes per full segment, IP-level bytes per segment that are not the flow's): the MSS is set to
        packet_size − 40 and Linux's timestamps take 12 of it."""
        return packet_size - IP_TCP_HDR - TCP_TIMESTAMPS, IP_TCP_HDR + TCP_TIMESTAMPS

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
