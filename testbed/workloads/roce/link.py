"""Which host NIC a packet from ``src`` to ``dst`` leaves by, and the Ethernet addresses it gets there.

Why: the batched sender (batch.py) can hand whole Ethernet frames to the NIC (AF_PACKET), which skips the IP output
path per packet, if it knows what the kernel would have chosen. One RTM_GETROUTE (policy rules included, as the
fabric's per-NIC tables need) gives the output interface and gateway; the neighbour's MAC comes from the kernel's
neighbour table (SIOCGARP; the fabric installs permanent entries for every host gateway). Hand-encoded so an agent does not pay
for importing a netlink library before t0.
"""
from __future__ import annotations

import errno
import fcntl
import socket
import struct
from typing import NamedTuple

RTM_NEWROUTE, RTM_GETROUTE, NLMSG_ERROR = 24, 26, 2
NLM_F_REQUEST = 1
RTA_OIF, RTA_GATEWAY = 4, 5
ARPHRD_ETHER = 1
ATF_COM = 0x02
NLMSG = struct.Struct("=IHHII")
RTMSG = struct.Struct("=BBBBBBBBI")
RTATTR = struct.Struct("=HH")
SIOCGIFHWADDR, SIOCGARP = 0x8927, 0x8954
# struct arpreq: arp_pa (sockaddr_in), arp_ha (sockaddr), arp_flags, arp_netmask (sockaddr), arp_dev[16]
ARPREQ = struct.Struct("=HH4s8sH14siH14s16s")


class Link(NamedTuple):
    ifindex: int
    ifname: str
    src_mac: bytes
    dst_mac: bytes


def _rta(kind: int, data: bytes) -> bytes:
    return RTATTR.pack(4 + len(data), kind) + data + bytes(-len(data) & 3)


def route(src: str, dst: str) -> tuple[int, str | None]:
    """(output ifindex, gateway or None when on-link) of the kernel's route for src → dst."""
    body = RTMSG.pack(socket.AF_INET, 32, 32, 0, 0, 0, 0, 0, 0) + _rta(1, socket.inet_aton(dst)) + _rta(
        2, socket.inet_aton(src))
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.send(NLMSG.pack(NLMSG.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, 1, 0) + body)
        msg = s.recv(65536)
    _ln, kind, _fl, _seq, _pid = NLMSG.unpack_from(msg)
    if kind == NLMSG_ERROR:
        err = -struct.unpack_from("=i", msg, NLMSG.size)[0]
        raise OSError(err, f"no route from {src} to {dst}")
    if kind != RTM_NEWROUTE:
        raise OSError(f"unexpected rtnetlink reply {kind} to a route lookup for {dst}")
    off, oif, gw = NLMSG.size + RTMSG.size, None, None
    while off + 4 <= len(msg):
        ln, t = RTATTR.unpack_from(msg, off)
        if ln < 4:
            break
        if t == RTA_OIF:
            oif = struct.unpack_from("=I", msg, off + 4)[0]
        elif t == RTA_GATEWAY:
            gw = socket.inet_ntoa(msg[off + 4:off + 8])
        off += (ln + 3) & ~3
    if oif is None:
        raise OSError(f"route lookup for {dst} named no output interface")
    return oif, gw


def neighbour(addr: str, ifname: str) -> bytes | None:
    """The resolved MAC of ``addr`` on ``ifname`` in the calling thread's namespace (SIOCGARP), or None."""
    req = bytearray(ARPREQ.size)
    ARPREQ.pack_into(req, 0, socket.AF_INET, 0, socket.inet_aton(addr), b"", 0, b"", 0, 0, b"", ifname.encode())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            fcntl.ioctl(s, SIOCGARP, req)
        except OSError as e:
            if e.errno == errno.ENXIO:               # no entry
                return None
            raise
    _f, _p, _a, _z, _hf, mac, flags, *_ = ARPREQ.unpack(req)
    return mac[:6] if flags & ATF_COM else None


def hw_address(ifname: str) -> tuple[int, bytes]:
    """(ARPHRD type, MAC) of ``ifname`` in the calling thread's namespace (SIOCGIFHWADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        r = fcntl.ioctl(s, SIOCGIFHWADDR, struct.pack("16sH14s8x", ifname.encode(), 0, b""))
    _n, kind, data = struct.unpack("16sH14s8x", r)
    return kind, data[:6]


def resolve(src: str, dst: str) -> Link | None:
    """The Link src → dst, or None when it is not an Ethernet NIC with a resolved next hop (e.g. loopback, an
    on-link peer not yet in the ARP table, or no route: its sends then fail the way a UDP socket's would): the
    caller then sends through the IP layer. Ioctls and netlink, not /proc or /sys, so that it answers for the
    namespace of the calling thread."""
    try:
        oif, gw = route(src, dst)
    except OSError:
        return None
    name = socket.if_indextoname(oif)
    kind, own = hw_address(name)
    if kind != ARPHRD_ETHER:
        return None
    mac = neighbour(gw or dst, name)
    if mac is None:
        return None
    return Link(oif, name, own, mac)
