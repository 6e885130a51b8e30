"""UDP engine: paced datagrams with a sequence number and a send timestamp (loss, reordering, one-way delay).

Every datagram starts with HDR = (flow_id u32, seq u64, tx time f64, network order); zero padding makes the IP
packet ``packet_size`` bytes (the last datagram of a sized flow is shorter). After its last data packet the
sender sends END_COPIES end markers (seq = END_SEQ, then u64 packets sent) that tell the receiver how many
packets to expect; markers are not counted as data.
"""
from __future__ import annotations

import errno
import socket
import struct
import time

from .engine_api import (BURST, DONE, IP_UDP_HDR, READY, WAIT_TIME, WAIT_WRITE, Pacer, RxFlow, Steerable, _rcvbuf,
                         _reuse, _tos)

HDR = struct.Struct("!IQd")          # flow_id, seq, tx timestamp
END_SEQ = (1 << 64) - 1
END = struct.Struct("!IQdQ")         # flow_id, END_SEQ, tx timestamp, packets sent
END_COPIES = 3
SEQ_LIMIT = 1 << 31                  # larger sequence numbers are garbage (the bitmap would explode)


def udp_payload_max(packet_size: int) -> int:
    p = packet_size - IP_UDP_HDR
    if p < END.size:
        raise ValueError(f"packet_size {packet_size} leaves no room for the {END.size}-byte header")
    return p


def udp_packet_count(size_bytes: int, pmax: int) -> int:
    """Datagrams a sized flow needs (the sender's split keeps every datagram ≥ HDR.size)."""
    return max(1, -(-size_bytes // pmax))


class UdpSender(Steerable):
    def __init__(self, flow: dict, job: dict):
        self.flow = flow
        self.fid = flow["flow_id"]
        self.pmax = udp_payload_max(job["packet_size"])
        self.job = job
        self.remaining = flow["size_bytes"]
        self.sndbuf = job.get("sndbuf_each")
        self.sock = self._socket(flow["sport"])
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

    @property
    def deadline(self) -> float:
        """t0 + duration: t0 comes with the agent's start line, after the sender is made (agent.py)."""
        return self.job["t0"] + self.job["duration_s"]

    def _socket(self, sport: int) -> socket.socket:
        flow = self.flow
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            _reuse(s)
            if self.sndbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4096, self.sndbuf // 2))
            _tos(s, flow)
            s.bind((flow["src_addr"], sport))
            s.connect((flow["dst_addr"], flow["dport"]))
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        return s

    def fileno(self) -> int:
        return self.sock.fileno()

    def begin(self, now: float) -> None:
        self.send_start = now
        self.pacer = Pacer(self.flow["rate_bps"], now)

    def _rebind(self, sport: int) -> None:
        new = self._socket(sport)
        self.sock.close()
        self.sock = new

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
        if self.next_sport is not None:
            self._move()
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
                if st.tl_bin is not None:
                    if seq > st.max_seq + 1:
                        st.jump(ts, seq)
                    st.max_ts = ts
                st.max_seq = seq
            if st.tl_bin is not None:
                st.tick(t, n)
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
    def framing(packet_size: int, opts: dict | None) -> tuple[int, int]:
        """(flow bytes per full packet, IP-level bytes per packet that are not the flow's)."""
        return udp_payload_max(packet_size), IP_UDP_HDR

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
