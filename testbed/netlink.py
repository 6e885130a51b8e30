"""Batched rtnetlink requests: pyroute2 encodes the messages, one socket per namespace sends them together.

Building a fabric means tens of thousands of small requests; sending them one call at a time (and letting a
library look up indexes) costs seconds. Here every request of a phase for a namespace goes out in a few large
``send`` calls. Only the last request asks for an ACK; the kernel answers a failing request with an error
regardless, which is matched back to the request by sequence number and reported in one readable line.
"""
from __future__ import annotations

import errno
import os
import socket
import struct

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_ERROR
from pyroute2.netlink.rtnl import (RTM_NEWADDR, RTM_NEWLINK, RTM_NEWNEIGH, RTM_NEWQDISC, RTM_NEWROUTE,
                                   RTM_NEWTFILTER, RTM_SETLINK, TC_H_ROOT)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.ndmsg import ndmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg
from pyroute2.netlink.rtnl.tcmsg import plugins as tc_plugins
from pyroute2.netlink.rtnl.tcmsg import tcmsg

CREATE = NLM_F_CREATE | NLM_F_EXCL
TC_H_CLSACT = 0xFFFFFFF1
TC_H_INGRESS_PARENT = 0xFFFFFFF2   # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
TC_H_EGRESS_PARENT = 0xFFFFFFF3
ETH_P_ALL = 0x0003
NUD_PERMANENT = 0x80
RTNH_F_ONLINK = 4
TCA_BPF_FLAG_ACT_DIRECT = 1
_CHUNK = 192 * 1024


class NetlinkError(Exception):
    pass


class Batch:
    """Requests for one namespace's socket, sent by ``commit()``."""

    def __init__(self, sock: socket.socket, where: str):
        self.sock, self.where = sock, where
        self._msgs: list[tuple[bytes, str]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._msgs)

    def add(self, msg, mtype: int, flags: int, what: str) -> None:
        self._seq += 1
        msg["header"]["type"] = mtype
        msg["header"]["flags"] = NLM_F_REQUEST | flags
        msg["header"]["sequence_number"] = self._seq
        msg.encode()
        self._msgs.append((bytes(msg.data), what))

    # ---- request builders (what the fabric needs, nothing more)

    def veth(self, ifname: str, ifindex: int, mac: str, mtu: int, peer_ifname: str, peer_ifindex: int,
             peer_mac: str, peer_ns_fd: int, gso_max_segs: int | None = None) -> None:
        def ends(name, index, address):
            attrs = [("IFLA_IFNAME", name), ("IFLA_ADDRESS", address), ("IFLA_MTU", mtu),
                     ("IFLA_TXQLEN", 1000)]
            if gso_max_segs:
                attrs.append(("IFLA_GSO_MAX_SEGS", gso_max_segs))
            return index, attrs
        peer_index, peer_attrs = ends(peer_ifname, peer_ifindex, peer_mac)
        peer_attrs.append(("IFLA_NET_NS_FD", peer_ns_fd))
        msg = ifinfmsg()
        msg["index"], attrs = ends(ifname, ifindex, mac)
        msg["attrs"] = attrs + [("IFLA_LINKINFO", {"attrs": [
            ("IFLA_INFO_KIND", "veth"),
            ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", {"index": peer_index, "attrs": peer_attrs})]}),
        ]})]
        self.add(msg, RTM_NEWLINK, CREATE, f"veth {ifname}<->{peer_ifname}")

    def link_up(self, ifindex: int, what: str) -> None:
        msg = ifinfmsg()
        msg["index"] = ifindex
        msg["flags"] = IFF_UP
        msg["change"] = IFF_UP
        self.add(msg, RTM_SETLINK, 0, f"set {what} up")

    def address(self, ifindex: int, addr: str, plen: int) -> None:
        msg = ifaddrmsg()
        msg["family"] = socket.AF_INET
        msg["prefixlen"] = plen
        msg["index"] = ifindex
        msg["attrs"] = [("IFA_LOCAL", addr), ("IFA_ADDRESS", addr)]
        self.add(msg, RTM_NEWADDR, CREATE, f"address {addr}/{plen}")

    def neighbour(self, ifindex: int, addr: str, mac: str) -> None:
        msg = ndmsg()
        msg["family"] = socket.AF_INET
        msg["ifindex"] = ifindex
        msg["state"] = NUD_PERMANENT
        msg["attrs"] = [("NDA_DST", addr), ("NDA_LLADDR", mac)]
        self.add(msg, RTM_NEWNEIGH, CREATE, f"neighbour {addr}")

    def route(self, dst: str, gateway: str, ifindex: int, prefsrc: str | None = None,
              multipath: list[tuple[str, int]] | None = None) -> None:
        net, _, plen = dst.partition("/")
        msg = rtmsg()
        msg["family"] = socket.AF_INET
        msg["dst_len"] = int(plen or 32)
        msg["table"] = 254
        msg["proto"] = 4          # static
        msg["scope"] = 0
        msg["type"] = 1           # unicast
        attrs = [("RTA_TABLE", 254)]
        if msg["dst_len"]:
            attrs.append(("RTA_DST", net))
        if multipath:
            attrs.append(("RTA_MULTIPATH", [{"hops": 0, "oif": i, "flags": RTNH_F_ONLINK,
                                             "attrs": [("RTA_GATEWAY", g)]} for g, i in multipath]))
        else:
            msg["flags"] = RTNH_F_ONLINK
            attrs += [("RTA_GATEWAY", gateway), ("RTA_OIF", ifindex)]
        if prefsrc:
            attrs.append(("RTA_PREFSRC", prefsrc))
        msg["attrs"] = attrs
        self.add(msg, RTM_NEWROUTE, CREATE, f"route {dst} via {gateway}")

    def tbf(self, ifindex: int, rate_bps: int, burst: int, limit: int, what: str) -> None:
        params = tc_plugins["tbf"].get_parameters({"rate": f"{rate_bps}bit", "burst": burst, "limit": limit})
        self._qdisc(ifindex, "tbf", 0x10000, TC_H_ROOT, params, what)

    def netem(self, ifindex: int, delay_us: int, limit_pkts: int, what: str) -> None:
        """netem (handle 10:) as the child of the root TBF (1:), so the shaper's rate and queue stay at the root
        and the delay line sits under it (see fabric.netem_limit)."""
        params = tc_plugins["netem"].get_parameters({"delay": delay_us, "limit": limit_pkts})
        self._qdisc(ifindex, "netem", 0xA0000, 0x10001, params, what)

    def clsact(self, ifindex: int, what: str) -> None:
        self._qdisc(ifindex, "clsact", 0xFFFF0000, TC_H_CLSACT, None, what)

    def _qdisc(self, ifindex, kind, handle, parent, options, what) -> None:
        msg = tcmsg()
        msg["index"] = ifindex
        msg["handle"] = handle
        msg["parent"] = parent
        msg["attrs"] = [("TCA_KIND", kind)] + ([("TCA_OPTIONS", options)] if options else [])
        self.add(msg, RTM_NEWQDISC, CREATE, f"{kind} qdisc on {what}")

    def bpf_filter(self, ifindex: int, prog_fd: int, name: str, ingress: bool, what: str) -> None:
        msg = tcmsg()
        msg["index"] = ifindex
        msg["handle"] = 1
        msg["parent"] = TC_H_INGRESS_PARENT if ingress else TC_H_EGRESS_PARENT
        msg["info"] = (1 << 16) | socket.htons(ETH_P_ALL)
        msg["attrs"] = [("TCA_KIND", "bpf"), ("TCA_OPTIONS", {"attrs": [
            ("TCA_BPF_FD", prog_fd), ("TCA_BPF_NAME", name), ("TCA_BPF_FLAGS", TCA_BPF_FLAG_ACT_DIRECT)]})]
        self.add(msg, RTM_NEWTFILTER, CREATE, f"bpf filter {name} on {what}")

    # ---- sending

    def commit(self) -> None:
        """Send everything; raise NetlinkError naming the first request the kernel refused."""
        if not self._msgs:
            return
        last = len(self._msgs)
        data, what = self._msgs[-1]
        # ask for an ACK on the last request only: it tells when the kernel has processed them all
        flags = struct.unpack_from("H", data, 6)[0] | NLM_F_ACK
        self._msgs[-1] = (data[:6] + struct.pack("H", flags) + data[8:], what)
        buf, size = [], 0
        for data, _ in self._msgs:
            if size + len(data) > _CHUNK and buf:
                self.sock.send(b"".join(buf))
                buf, size = [], 0
            buf.append(data)
            size += len(data)
        if buf:
            self.sock.send(b"".join(buf))
        failures = []
        done = False
        while not done:
            reply = self.sock.recv(1 << 20)
            off = 0
            while off + 16 <= len(reply):
                length, mtype, _flags, seq, _pid = struct.unpack_from("IHHII", reply, off)
                if mtype == NLMSG_ERROR:
                    code = struct.unpack_from("i", reply, off + 16)[0]
                    if code:
                        failures.append((seq, -code))
                    if seq == last:
                        done = True
                off += (length + 3) & ~3
        msgs, self._msgs, self._seq = self._msgs, [], 0
        if failures:
            seq, code = failures[0]
            more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
            raise NetlinkError(f"{self.where}: {msgs[seq - 1][1]}: {os.strerror(code)}"
                               f" [{errno.errorcode.get(code, code)}]{more}")
