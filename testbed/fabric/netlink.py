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
import time
from typing import NamedTuple

from pyroute2.netlink import (NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_DONE,
                              NLMSG_ERROR)
from pyroute2.netlink.rtnl import (RTM_GETQDISC, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWNEIGH, RTM_NEWQDISC,
                                   RTM_NEWROUTE, RTM_NEWRULE, RTM_NEWTCLASS, RTM_NEWTFILTER, RTM_SETLINK, TC_H_ROOT)
from pyroute2.netlink.rtnl.fibmsg import FR_ACT_TO_TBL, fibmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg
from pyroute2.netlink.rtnl.tcmsg import plugins as tc_plugins
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from ..errors import TestbedError

CREATE = NLM_F_CREATE | NLM_F_EXCL
TC_H_CLSACT = 0xFFFFFFF1
TCM_IFINDEX_MAGIC_BLOCK = -1      # 0xFFFFFFFF: the request names a shared block, not a device
ETH_P_ALL = 0x0003
NUD_PERMANENT = 0x80
RTNH_F_ONLINK = 4
TCA_BPF_FLAG_ACT_DIRECT = 1
XDP_FLAGS_DRV_MODE = 4
_CHUNK = 192 * 1024
_TCMSG_IFINDEX = 16 + 4          # nlmsghdr, then tcmsg's family + padding
_IFINFO_IFINDEX = 16 + 4         # nlmsghdr, then ifinfomsg's family, pad, type
_TBF_CACHE: dict[tuple, bytes] = {}
# attribute types of the hand-encoded requests (linux/if_link.h, veth.h, if_addr.h, neighbour.h, rtnetlink.h)
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_TXQLEN, IFLA_LINKINFO = 1, 3, 4, 13, 18
IFLA_NET_NS_FD, IFLA_GSO_MAX_SEGS = 28, 40
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL, NDA_DST, NDA_LLADDR = 1, 2, 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PREFSRC, RTA_TABLE = 1, 4, 5, 7, 15
TCA_KIND, TCA_INGRESS_BLOCK, TCA_EGRESS_BLOCK = 1, 13, 14
_TEMPLATES: dict[tuple, bytes] = {}     # requests that differ only in the ifindex, encoded once
IN6_ADDR_GEN_MODE_NONE = 1
HAVE_IPV6 = os.path.isdir("/proc/sys/net/ipv6")   # without it the kernel refuses an AF_INET6 link attribute


class NetlinkError(TestbedError):
    pass


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _rta(rta_type: int, payload: bytes) -> bytes:
    """One netlink attribute: length, type, payload, padded to 4 bytes."""
    n = 4 + len(payload)
    return struct.pack("HH", n, rta_type) + payload + b"\0" * (-n % 4)


QdiscStats = tuple  # (bytes, packets, drops, qlen, backlog) of a port's root qdisc


def dump_root_qdisc_stats(sock: socket.socket, read_at: list | None = None,
                          leaves: dict | None = None) -> dict[int, QdiscStats]:
    """One RTM_GETQDISC dump: ifindex → (bytes, packets, drops, qlen, backlog) of each root qdisc.

    Parsed by hand (tcmsg header + the legacy TCA_STATS struct the kernel still sends): telemetry calls this
    for every switch several times a second, where generic decoding costs more than the kernel's answer.
    ``read_at``: gets the instant the counters were read appended (time.time()). The kernel fills the first
    part of a dump while the request is being sent, so that is the middle of ``send`` — not when ``recv``
    returns, which a descheduled thread may reach milliseconds later (that made a saturated port's sample read
    1.5 % above its rate). ``leaves``: gets (ifindex, parent classid) → backlog of every non-root qdisc (the
    TBF under each HTB class: one priority's real queue)."""
    t0 = time.time()
    sock.send(struct.pack("IHHII", 36, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + bytes(20))
    if read_at is not None:
        read_at.append((t0 + time.time()) / 2)
    out: dict[int, QdiscStats] = {}
    while True:
        data = sock.recv(1 << 20)
        off = 0
        while off + 16 <= len(data):
            length, mtype = struct.unpack_from("IH", data, off)
            if mtype == NLMSG_DONE:
                return out
            if mtype == NLMSG_ERROR:
                code = struct.unpack_from("i", data, off + 16)[0]
                raise NetlinkError(f"qdisc dump: {os.strerror(-code)}")
            if mtype == RTM_NEWQDISC:
                ifindex, _handle, parent = struct.unpack_from("iII", data, off + 20)
                if parent == TC_H_ROOT or leaves is not None:
                    a = off + 36
                    while a + 4 <= off + length:
                        alen, atype = struct.unpack_from("HH", data, a)
                        if atype == 3 and alen >= 4 + 36:            # TCA_STATS: struct tc_stats
                            b, pk, dr, _ov, _bps, _pps, ql, bl = struct.unpack_from("QIIIIIII", data, a + 4)
                            if parent == TC_H_ROOT:
                                out[ifindex] = (b, pk, dr, ql, bl)
                            else:
                                leaves[(ifindex, parent)] = bl
                        a += (alen + 3) & ~3
            off += (length + 3) & ~3


def tbf_options(rate_bps: int, burst: int, limit: int) -> dict:
    return tc_plugins["tbf"].get_parameters({"rate": f"{rate_bps}bit", "burst": burst, "limit": limit})


def tbf_change_message(ifindex: int, handle: int, parent: int, rate_bps: int, burst: int, limit: int,
                       seq: int = 1) -> bytes:
    """A pre-encoded `tc qdisc change … tbf` request (with ACK): what the PFC agent sends to pause/resume."""
    msg = tcmsg()
    msg["index"] = ifindex
    msg["handle"] = handle
    msg["parent"] = parent
    msg["attrs"] = [("TCA_KIND", "tbf"), ("TCA_OPTIONS", tbf_options(rate_bps, burst, limit))]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg["header"]["sequence_number"] = seq
    msg.encode()
    return bytes(msg.data)


class TbfBucket:
    """A pre-encoded `tc qdisc change … tbf` whose bucket (burst) is rewritten in place: the credit meter sets a
    sender's bucket every update, and encoding the whole request (with its rate table) each time cost a
    millisecond. At a fixed rate only the buffer field (the burst as transmission time, in psched ticks) of
    TCA_TBF_PARMS changes."""

    def __init__(self, ifindex: int, handle: int, parent: int, rate_bps: int, limit: int):
        from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime
        self._xmittime, self._rate = calc_xmittime, rate_bps / 8
        self.msg = bytearray(tbf_change_message(ifindex, handle, parent, rate_bps, 1514, limit))
        self.offset = self._buffer_offset()

    def _buffer_offset(self) -> int:
        off = 36                                              # nlmsghdr + tcmsg
        while off + 4 <= len(self.msg):
            ln, ty = struct.unpack_from("HH", self.msg, off)
            if ty & 0x7FFF == 2:                               # TCA_OPTIONS
                sub = off + 4
                while sub + 4 <= off + ln:
                    l2, t2 = struct.unpack_from("HH", self.msg, sub)
                    if t2 & 0x7FFF == 1:                       # TCA_TBF_PARMS: rate, peakrate, limit, buffer, mtu
                        return sub + 4 + 12 + 12 + 4
                    sub += (l2 + 3) & ~3
            off += (ln + 3) & ~3
        raise NetlinkError("tbf change: no TCA_TBF_PARMS in the encoded request")

    def with_burst(self, burst: int) -> bytes:
        struct.pack_into("I", self.msg, self.offset, self._xmittime(self._rate, burst))
        return bytes(self.msg)


def qdisc_get_message(ifindex: int, handle: int, parent: int, seq: int = 1) -> bytes:
    """A pre-encoded RTM_GETQDISC request for one qdisc (the leaf under class ``parent``): its answer carries
    the qdisc's own statistics (parse it with ``qdisc_stats``). The PFC agent reads a class's TBF with it."""
    return (struct.pack("IHHII", 36, RTM_GETQDISC, NLM_F_REQUEST | 0x8, seq, 0)
            + struct.pack("BBHiIII", 0, 0, 0, ifindex, handle, parent, 0))


class QdiscStats(NamedTuple):
    """struct tc_stats. A TBF counts ``bytes`` at dequeue (what its port sent); ``backlog`` is in bytes."""
    bytes: int
    packets: int
    drops: int
    overlimits: int
    bps: int
    pps: int
    qlen: int
    backlog: int


def qdisc_stats(reply: bytes) -> QdiscStats | None:
    """The statistics in the RTM_NEWQDISC answer to ``qdisc_get_message``; None on an error answer."""
    if len(reply) < 16 or struct.unpack_from("H", reply, 4)[0] != RTM_NEWQDISC:
        return None
    length = struct.unpack_from("I", reply, 0)[0]
    a = 36
    while a + 4 <= min(length, len(reply)):
        alen, atype = struct.unpack_from("HH", reply, a)
        if alen < 4:
            break
        if atype == 3 and alen >= 4 + 36:                    # TCA_STATS: struct tc_stats
            return QdiscStats._make(struct.unpack_from("QIIIIIII", reply, a + 4))
        a += (alen + 3) & ~3
    return None


class Batch:
    """Requests for one namespace's socket, sent by ``commit()``."""

    def __init__(self, sock: socket.socket, where: str):
        self.sock, self.where = sock, where
        self._msgs: list[tuple[bytes, str]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._msgs)

    def add(self, msg, mtype: int, flags: int, what: str) -> None:
        msg["header"]["type"] = mtype
        msg["header"]["flags"] = NLM_F_REQUEST | flags
        msg.encode()
        self.add_encoded(bytes(msg.data), what)

    def add_encoded(self, data: bytes, what: str, ifindex_at: int | None = None, ifindex: int = 0) -> None:
        """Queue an already encoded request, giving it this batch's next sequence number (and an ifindex)."""
        self._seq += 1
        buf = bytearray(data)
        struct.pack_into("I", buf, 8, self._seq)
        if ifindex_at is not None:
            struct.pack_into("i", buf, ifindex_at, ifindex)
        self._msgs.append((bytes(buf), what))

    # ---- request builders (what the fabric needs, nothing more)

    def vxlan(self, ifname: str, ifindex: int, mac: str, mtu: int, vni: int, local: str, remote: str,
              ns_fd: int, port: int = 4789) -> None:
        """A VXLAN device (one VNI, unicast to ``remote``, no learning) created from this batch's namespace — the
        machine's underlay, where its UDP socket stays — and placed straight into the namespace of ``ns_fd``
        with the given name, ifindex and MAC (a cut link's switch port, docs/architecture.md 3.11). pyroute2
        encodes it: a fabric has few."""
        msg = ifinfmsg()
        msg["index"] = ifindex
        data = [("IFLA_VXLAN_ID", vni), ("IFLA_VXLAN_LOCAL", local), ("IFLA_VXLAN_GROUP", remote),
                ("IFLA_VXLAN_PORT", port), ("IFLA_VXLAN_LEARNING", 0)]
        msg["attrs"] = [("IFLA_IFNAME", ifname), ("IFLA_ADDRESS", mac), ("IFLA_MTU", mtu), ("IFLA_NET_NS_FD", ns_fd),
                        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "vxlan"),
                                                     ("IFLA_INFO_DATA", {"attrs": data})]})]
        self.add(msg, RTM_NEWLINK, CREATE, f"vxlan {ifname} (VNI {vni} to {remote})")

    def veth(self, ifname: str, ifindex: int, mac: str, mtu: int, peer_ifname: str, peer_ifindex: int,
             peer_mac: str, peer_ns_fd: int, gso_max_segs: int | None = None) -> None:
        """A veth pair, the peer created straight in the namespace of ``peer_ns_fd``. Encoded by hand with
        struct (the same bytes pyroute2 makes, tested): pyroute2 takes ~240 µs per pair, more than the kernel
        needs to create it, and the kernel-floor benchmark must not measure Python."""
        def end(name: str, index: int, address: str) -> bytes:       # ifinfomsg + attributes
            attrs = (_rta(IFLA_IFNAME, name.encode() + b"\0") + _rta(IFLA_ADDRESS, _mac(address))
                     + _rta(IFLA_MTU, struct.pack("I", mtu)) + _rta(IFLA_TXQLEN, struct.pack("I", 1000)))
            if gso_max_segs:
                attrs += _rta(IFLA_GSO_MAX_SEGS, struct.pack("I", gso_max_segs))
            return struct.pack("BBHiII", 0, 0, 0, index, 0, 0) + attrs
        peer = end(peer_ifname, peer_ifindex, peer_mac) + _rta(IFLA_NET_NS_FD, struct.pack("I", peer_ns_fd))
        body = end(ifname, ifindex, mac) + _rta(IFLA_LINKINFO, _rta(IFLA_INFO_KIND, b"veth\0")
                                                + _rta(IFLA_INFO_DATA, _rta(VETH_INFO_PEER, peer)))
        self._request(RTM_NEWLINK, CREATE, body, f"veth {ifname}<->{peer_ifname}")

    def _template(self, key: tuple, build, mtype: int, flags: int, ifindex_at: int, ifindex: int,
                  what: str) -> None:
        """Queue a request that differs from others only in its ifindex: pyroute2 encodes it once (an encode
        costs 20–70 µs, and a 1,024-host fabric sends tens of thousands of them), the ifindex is patched in."""
        data = _TEMPLATES.get(key)
        if data is None:
            msg = build()
            msg["header"]["type"] = mtype
            msg["header"]["flags"] = NLM_F_REQUEST | flags
            msg.encode()
            data = _TEMPLATES[key] = bytes(msg.data)
        self.add_encoded(data, what, ifindex_at=ifindex_at, ifindex=ifindex)

    def link_up(self, ifindex: int, what: str) -> None:
        def build():
            msg = ifinfmsg()
            msg["flags"] = IFF_UP
            msg["change"] = IFF_UP
            return msg
        self._template(("up",), build, RTM_SETLINK, 0, _IFINFO_IFINDEX, ifindex, f"set {what} up")

    def no_ipv6_address(self, ifindex: int, what: str) -> None:
        """addr_gen_mode none on a device that is still down, so that it never gets an IPv6 address: the fabric
        is IPv4, and a link-local address puts DAD, router solicitations and MLD reports on the wire at link-up
        — frames the switches can only discard, which made every port of a lossless run show "drops". A request
        of its own, before ``link_up``: in one request with IFF_UP the kernel applies the mode after the flags,
        and the veth end that comes up second (carrier at once) had its link-local address by then. Per device
        rather than the namespace's disable_ipv6 sysctl: a /proc/sys lookup walks a dentry chain as long as the
        number of namespaces, which cost 0.4 s over a 1,344-namespace build. Nothing to do without IPv6."""
        if not HAVE_IPV6:
            return

        def build():
            msg = ifinfmsg()
            msg["attrs"] = [("IFLA_AF_SPEC", {"attrs": [
                ("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", IN6_ADDR_GEN_MODE_NONE)]})]})]
            return msg
        self._template(("no-ipv6",), build, RTM_SETLINK, 0, _IFINFO_IFINDEX, ifindex, f"no IPv6 address on {what}")

    def xdp(self, ifindex: int, prog_fd: int, what: str) -> None:
        msg = ifinfmsg()
        msg["index"] = ifindex
        msg["attrs"] = [("IFLA_XDP", {"attrs": [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", XDP_FLAGS_DRV_MODE)]})]
        self.add(msg, RTM_SETLINK, 0, f"xdp on {what}")

    def _request(self, mtype: int, flags: int, body: bytes, what: str) -> None:
        self.add_encoded(struct.pack("IHHII", 16 + len(body), mtype, NLM_F_REQUEST | flags, 0, 0) + body, what)

    def address(self, ifindex: int, addr: str, plen: int) -> None:
        a = socket.inet_aton(addr)       # ifaddrmsg, IFA_LOCAL, IFA_ADDRESS (hand-encoded: see veth)
        self._request(RTM_NEWADDR, CREATE, struct.pack("BBBBI", socket.AF_INET, plen, 0, 0, ifindex)
                      + _rta(IFA_LOCAL, a) + _rta(IFA_ADDRESS, a), f"address {addr}/{plen}")

    def neighbour(self, ifindex: int, addr: str, mac: str) -> None:
        ndmsg = struct.pack("BBHiHBB", socket.AF_INET, 0, 0, ifindex, NUD_PERMANENT, 0, 0)
        self._request(RTM_NEWNEIGH, CREATE, ndmsg
                      + _rta(NDA_DST, socket.inet_aton(addr)) + _rta(NDA_LLADDR, _mac(mac)), f"neighbour {addr}")

    def route(self, dst: str, gateway: str, ifindex: int, prefsrc: str | None = None,
              multipath: list[tuple[str, int]] | None = None, table: int = 254) -> None:
        net, _, plen = dst.partition("/")
        what = f"route {dst} via {gateway}" + (f" table {table}" if table != 254 else "")
        if not multipath:                # the hosts' routes: hand-encoded (see veth); rtmsg, then attributes
            dst_len = int(plen or 32)
            body = struct.pack("BBBBBBBBI", socket.AF_INET, dst_len, 0, 0, table if table < 256 else 252,
                               4, 0, 1, RTNH_F_ONLINK) + _rta(RTA_TABLE, struct.pack("I", table))
            if dst_len:
                body += _rta(RTA_DST, socket.inet_aton(net))
            body += _rta(RTA_GATEWAY, socket.inet_aton(gateway)) + _rta(RTA_OIF, struct.pack("i", ifindex))
            if prefsrc:
                body += _rta(RTA_PREFSRC, socket.inet_aton(prefsrc))
            self._request(RTM_NEWROUTE, CREATE, body, what)
            return
        msg = rtmsg()
        msg["family"] = socket.AF_INET
        msg["dst_len"] = int(plen or 32)
        msg["table"] = table if table < 256 else 252      # RT_TABLE_COMPAT; the attribute holds the real one
        msg["proto"] = 4          # static
        msg["scope"] = 0
        msg["type"] = 1           # unicast
        attrs = [("RTA_TABLE", table)]
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
        self.add(msg, RTM_NEWROUTE, CREATE, what)

    def rule(self, src: str, table: int, priority: int) -> None:
        """``ip rule add from SRC/32 lookup TABLE priority PRIORITY``."""
        msg = fibmsg()
        msg["family"] = socket.AF_INET
        msg["src_len"] = 32
        msg["table"] = table if table < 256 else 252
        msg["action"] = FR_ACT_TO_TBL
        msg["attrs"] = [("FRA_SRC", src), ("FRA_TABLE", table), ("FRA_PRIORITY", priority)]
        self.add(msg, RTM_NEWRULE, CREATE, f"rule from {src} lookup {table}")

    def tbf(self, ifindex: int, rate_bps: int, burst: int, limit: int, what: str, handle: int = 0x10000,
            parent: int = TC_H_ROOT) -> None:
        # pyroute2 builds a 1 KB rate table per TBF request (~200 µs): encode once per shape, patch the ifindex
        key = (rate_bps, burst, limit, handle, parent)
        data = _TBF_CACHE.get(key)
        if data is None:
            msg = tcmsg()
            msg["handle"], msg["parent"] = handle, parent
            msg["attrs"] = [("TCA_KIND", "tbf"), ("TCA_OPTIONS", tbf_options(rate_bps, burst, limit))]
            msg["header"]["type"] = RTM_NEWQDISC
            msg["header"]["flags"] = NLM_F_REQUEST | CREATE
            msg.encode()
            data = _TBF_CACHE[key] = bytes(msg.data)
        self.add_encoded(data, f"tbf qdisc on {what}", ifindex_at=_TCMSG_IFINDEX, ifindex=ifindex)

    def htb(self, ifindex: int, default_minor: int, what: str) -> None:
        params = tc_plugins["htb"].get_parameters({"default": default_minor})
        self._qdisc(ifindex, "htb", 0x10000, TC_H_ROOT, params, what)

    def htb_class(self, ifindex: int, classid: int, parent: int, rate_bps: int, ceil_bps: int, burst: int,
                  what: str) -> None:
        params = tc_plugins["htb"].get_class_parameters({"rate": f"{rate_bps}bit", "ceil": f"{ceil_bps}bit",
                                                         "burst": burst, "cburst": burst})
        msg = tcmsg()
        msg["index"] = ifindex
        msg["handle"] = classid
        msg["parent"] = parent
        msg["attrs"] = [("TCA_KIND", "htb"), ("TCA_OPTIONS", params)]
        self.add(msg, RTM_NEWTCLASS, CREATE, f"htb class {classid >> 16:x}:{classid & 0xffff:x} on {what}")

    def netem(self, ifindex: int, delay_us: int, limit_pkts: int, what: str) -> None:
        """netem (handle 10:) as the child of the root TBF (1:), so the shaper's rate and queue stay at the root
        and the delay line sits under it (see fabric.netem_limit)."""
        params = tc_plugins["netem"].get_parameters({"delay": delay_us, "limit": limit_pkts})
        self._qdisc(ifindex, "netem", 0xA0000, 0x10001, params, what)

    def clsact(self, ifindex: int, what: str, ingress_block: int, egress_block: int) -> None:
        """clsact whose ingress and egress filter blocks are the namespace's shared blocks of these indexes (made
        by the first clsact naming them). A filter is then added once per block, not once per port; and every
        separate block costs its bind a scan of a kernel-wide list of all of them (flow_indr_dev_setup_offload:
        54–86 µs a clsact at 10,240 blocks, quadratic in the fabric's size). Hand-encoded (pyroute2 0.9 has no
        name for TCA_INGRESS_BLOCK/TCA_EGRESS_BLOCK)."""
        key = ("clsact", ingress_block, egress_block)
        data = _TEMPLATES.get(key)
        if data is None:
            body = (struct.pack("BxxxiIII", 0, 0, 0xFFFF0000, TC_H_CLSACT, 0) + _rta(TCA_KIND, b"clsact\0")
                    + _rta(TCA_INGRESS_BLOCK, struct.pack("I", ingress_block))
                    + _rta(TCA_EGRESS_BLOCK, struct.pack("I", egress_block)))
            data = _TEMPLATES[key] = struct.pack("IHHII", 16 + len(body), RTM_NEWQDISC, NLM_F_REQUEST | CREATE,
                                                 0, 0) + body
        self.add_encoded(data, f"clsact qdisc on {what}", ifindex_at=_TCMSG_IFINDEX, ifindex=ifindex)

    def _qdisc(self, ifindex, kind, handle, parent, options, what) -> None:
        msg = tcmsg()
        msg["index"] = ifindex
        msg["handle"] = handle
        msg["parent"] = parent
        msg["attrs"] = [("TCA_KIND", kind)] + ([("TCA_OPTIONS", options)] if options else [])
        self.add(msg, RTM_NEWQDISC, CREATE, f"{kind} qdisc on {what}")

    def bpf_filter(self, block: int, prog_fd: int, name: str, what: str) -> None:
        """A direct-action cls_bpf filter (prio 1, every protocol) on shared block ``block``: it runs on every
        port whose clsact has that block (see ``clsact``)."""
        msg = tcmsg()
        msg["index"] = TCM_IFINDEX_MAGIC_BLOCK
        msg["handle"] = 1
        msg["parent"] = block                    # tcm_block_index shares tcm_parent's place
        msg["info"] = (1 << 16) | socket.htons(ETH_P_ALL)
        msg["attrs"] = [("TCA_KIND", "bpf"), ("TCA_OPTIONS", {"attrs": [
            ("TCA_BPF_FD", prog_fd), ("TCA_BPF_NAME", name), ("TCA_BPF_FLAGS", TCA_BPF_FLAG_ACT_DIRECT)]})]
        self.add(msg, RTM_NEWTFILTER, CREATE, f"bpf filter {name} on block {block} ({what})")

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
            try:
                reply = self.sock.recv(1 << 20)
            except TimeoutError:
                raise NetlinkError(f"{self.where}: the kernel did not answer {len(self._msgs)} requests "
                                   f"(last: {self._msgs[-1][1]})") from None
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
