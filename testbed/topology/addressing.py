"""The address plan shared by every topology: 198.18.0.0/15 (RFC 2544, reserved for network benchmarking),
MACs derived from fabric-unique ifindexes."""
from __future__ import annotations

import ipaddress

ADDR_BASE = int(ipaddress.IPv4Address("198.18.0.0"))
ADDR_BITS = 17                      # 198.18.0.0/15
FIRST_IFINDEX = 100                 # leave room for lo and anything the kernel creates itself


def rail_block_bits(rails: int) -> int:
    """Prefix length of one rail's block: rails share the /15 in equal power-of-two blocks."""
    return 32 - ADDR_BITS + (rails - 1).bit_length()


def max_leaves_per_rail(rails: int) -> int:
    return 1 << (32 - rail_block_bits(rails) - 8)


def mac_for(ifindex: int) -> str:
    """Locally administered, derived from the fabric-unique ifindex."""
    return "02:fb:%02x:%02x:%02x:%02x" % ((ifindex >> 24) & 255, (ifindex >> 16) & 255,
                                          (ifindex >> 8) & 255, ifindex & 255)


def ip_str(addr: int) -> str:
    return str(ipaddress.IPv4Address(addr))
