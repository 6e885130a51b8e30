"""The fast request encodings (hand-made veth, ifindex-patched templates) give exactly pyroute2's bytes."""
from __future__ import annotations

import socket
import struct

import pytest
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.fabric import netlink as nl


def _bytes(batch: nl.Batch) -> list[bytes]:
    return [data for data, _ in batch._msgs]


def _pyroute2(msg, mtype: int, flags: int, seq: int) -> bytes:
    msg["header"]["type"], msg["header"]["flags"] = mtype, nl.NLM_F_REQUEST | flags
    msg.encode()
    data = bytearray(msg.data)
    struct.pack_into("I", data, 8, seq)
    return bytes(data)


def test_templates_patch_only_the_ifindex():
    b = nl.Batch(None, "x")
    for ifx in (1234, 77):
        b.link_up(ifx, "a")
        b.clsact(ifx, "a", 1, 2)
    want = []
    for seq, ifx in ((1, 1234), (3, 77)):
        up = ifinfmsg()
        up["index"], up["flags"], up["change"] = ifx, IFF_UP, IFF_UP
        cls = tcmsg()
        cls["index"], cls["handle"], cls["parent"] = ifx, 0xFFFF0000, nl.TC_H_CLSACT
        cls["attrs"] = [("TCA_KIND", "clsact")]
        # pyroute2 has no names for TCA_INGRESS_BLOCK (13) / TCA_EGRESS_BLOCK (14): append them by hand
        blocks = struct.pack("HHI", 8, 13, 1) + struct.pack("HHI", 8, 14, 2)
        clsact = bytearray(_pyroute2(cls, nl.RTM_NEWQDISC, nl.CREATE, seq + 1) + blocks)
        struct.pack_into("I", clsact, 0, len(clsact))
        want += [_pyroute2(up, nl.RTM_SETLINK, 0, seq), bytes(clsact)]
    assert _bytes(b) == want


def test_no_ipv6_address_is_a_request_of_its_own():
    """addr_gen_mode none without IFF_UP (a request before link-up: in the same one the kernel applied it after
    the flags, too late for a veth end whose carrier came up at once)."""
    b = nl.Batch(None, "x")
    b.no_ipv6_address(42, "a")
    if not nl.HAVE_IPV6:
        assert _bytes(b) == []
        return
    msg = ifinfmsg()
    msg["index"] = 42
    msg["attrs"] = [("IFLA_AF_SPEC", {"attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", 1)]})]})]
    assert _bytes(b) == [_pyroute2(msg, nl.RTM_SETLINK, 0, 1)]
    assert struct.unpack_from("II", _bytes(b)[0], 24) == (0, 0)          # ifi_flags, ifi_change: up untouched


def test_block_filter_names_the_shared_block():
    b = nl.Batch(None, "x")
    b.bpf_filter(1, 7, "ftb_switch_ingress", "leaf0")
    flt = tcmsg()
    flt["index"], flt["handle"], flt["parent"] = -1, 1, 1          # TCM_IFINDEX_MAGIC_BLOCK, tcm_block_index 1
    flt["info"] = (1 << 16) | socket.htons(nl.ETH_P_ALL)
    flt["attrs"] = [("TCA_KIND", "bpf"), ("TCA_OPTIONS", {"attrs": [
        ("TCA_BPF_FD", 7), ("TCA_BPF_NAME", "ftb_switch_ingress"), ("TCA_BPF_FLAGS", 1)]})]
    assert _bytes(b) == [_pyroute2(flt, nl.RTM_NEWTFILTER, nl.CREATE, 1)]
    assert struct.unpack_from("I", _bytes(b)[0], 20)[0] == 0xFFFFFFFF


def _veth_reference(ifname, ifindex, mac, mtu, peer_ifname, peer_ifindex, peer_mac, peer_ns_fd, gso_max_segs):
    """The veth request as pyroute2 encodes it (what the hand encoding must equal)."""
    def ends(name, index, address):
        attrs = [("IFLA_IFNAME", name), ("IFLA_ADDRESS", address), ("IFLA_MTU", mtu), ("IFLA_TXQLEN", 1000)]
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
    return _pyroute2(msg, nl.RTM_NEWLINK, nl.CREATE, 1)


@pytest.mark.parametrize("args", [
    ("eth0", 100, "02:fb:00:00:00:64", 1500, "h0", 101, "02:fb:00:00:00:65", 5, 1),
    ("spine120", 4000, "02:fb:00:00:0f:a0", 9000, "core63", 4001, "02:fb:00:00:0f:a1", 1023, None),
    ("h1023", 7, "02:fb:00:00:00:07", 576, "sentinel", 70000, "02:fb:ff:00:00:0a", 9, None),
])
def test_veth_is_pyroute2s_bytes(args):
    b = nl.Batch(None, "x")
    b.veth(*args[:8], gso_max_segs=args[8])
    assert _bytes(b) == [_veth_reference(*args)]


def test_address_neighbour_route_are_pyroute2s_bytes():
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ndmsg import ndmsg
    from pyroute2.netlink.rtnl.rtmsg import rtmsg
    b = nl.Batch(None, "x")
    b.address(100, "198.18.0.1", 32)
    b.neighbour(100, "198.18.0.254", "02:fb:00:00:00:65")
    b.route("0.0.0.0/0", "198.18.0.254", 100, prefsrc="198.18.0.1")
    b.route("198.18.0.0/15", "198.18.0.254", 4242, prefsrc="198.18.0.1", table=101)
    b.route("198.18.4.0/24", "169.254.1.2", 300, table=1000)
    a = ifaddrmsg()
    a["family"], a["prefixlen"], a["index"] = socket.AF_INET, 32, 100
    a["attrs"] = [("IFA_LOCAL", "198.18.0.1"), ("IFA_ADDRESS", "198.18.0.1")]
    n = ndmsg()
    n["family"], n["ifindex"], n["state"] = socket.AF_INET, 100, nl.NUD_PERMANENT
    n["attrs"] = [("NDA_DST", "198.18.0.254"), ("NDA_LLADDR", "02:fb:00:00:00:65")]

    def route(dst, plen, gw, oif, prefsrc, table):
        r = rtmsg()
        r["family"], r["dst_len"], r["table"] = socket.AF_INET, plen, table if table < 256 else 252
        r["proto"], r["scope"], r["type"], r["flags"] = 4, 0, 1, nl.RTNH_F_ONLINK
        attrs = [("RTA_TABLE", table)] + ([("RTA_DST", dst)] if plen else [])
        attrs += [("RTA_GATEWAY", gw), ("RTA_OIF", oif)] + ([("RTA_PREFSRC", prefsrc)] if prefsrc else [])
        r["attrs"] = attrs
        return r
    want = [_pyroute2(a, nl.RTM_NEWADDR, nl.CREATE, 1), _pyroute2(n, nl.RTM_NEWNEIGH, nl.CREATE, 2),
            _pyroute2(route("0.0.0.0", 0, "198.18.0.254", 100, "198.18.0.1", 254), nl.RTM_NEWROUTE, nl.CREATE, 3),
            _pyroute2(route("198.18.0.0", 15, "198.18.0.254", 4242, "198.18.0.1", 101), nl.RTM_NEWROUTE,
                      nl.CREATE, 4),
            _pyroute2(route("198.18.4.0", 24, "169.254.1.2", 300, None, 1000), nl.RTM_NEWROUTE, nl.CREATE, 5)]
    assert _bytes(b) == want
