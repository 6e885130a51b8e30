"""Forwarding as the switches will do it, computed from the topology alone (no kernel): longest-prefix match
over each switch's FIB entries, every equal-cost branch followed.

Why: a layout's FIB is only right if every host reaches every other host along every branch ECMP may take;
checking that on paper for all pairs of a 1,024-host fat-tree is what this is for (tests, and anyone adding a
layout).
"""
from __future__ import annotations

import ipaddress
from functools import lru_cache

from ..errors import TestbedError
from .model import Topology


class RoutingError(TestbedError):
    """A destination some branch cannot reach (no route, empty group, a loop, the wrong host)."""


def _u32(addr: str) -> int:
    return int(ipaddress.IPv4Address(addr))


class Router:
    """Longest-prefix match per switch, and the set of every path ECMP may take between two hosts."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self._fib: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}
        for e in topo.fib:
            self._fib.setdefault(e.switch, []).append((_u32(e.prefix), e.plen, e.ports))
        for rows in self._fib.values():
            rows.sort(key=lambda r: -r[1])
        self._host_of = {_u32(p.address): p.node for ps in topo.ports.values() for p in ps if p.address}
        self.reaches = lru_cache(maxsize=None)(self._reaches)

    def group(self, switch: str, addr: str | int) -> tuple[int, ...] | None:
        """The egress ifindexes of the longest matching entry (None: no entry at all)."""
        a = _u32(addr) if isinstance(addr, str) else addr
        for net, plen, ports in self._fib.get(switch, ()):
            mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
            if a & mask == net:
                return ports
        return None

    def _reaches(self, switch: str, addr: int, ttl: int = 16) -> int:
        """Number of distinct paths from ``switch`` to the host owning ``addr``; RoutingError if any branch fails."""
        if ttl == 0:
            raise RoutingError(f"{switch}: loop towards {ipaddress.IPv4Address(addr)}")
        ports = self.group(switch, addr)
        if not ports:
            what = "no route" if ports is None else "empty group"
            raise RoutingError(f"{switch}: {what} for {ipaddress.IPv4Address(addr)}")
        total = 0
        for ifx in ports:
            peer = self.topo.port(ifx).peer_node
            if self.topo.nodes[peer].kind == "host":
                if peer != self._host_of.get(addr):
                    raise RoutingError(f"{switch}: {ipaddress.IPv4Address(addr)} delivered to {peer}")
                total += 1
            else:
                total += self.reaches(peer, addr, ttl - 1)
        return total

    def paths(self, src: str, dst: str, src_rail: int = 0, dst_rail: int = 0) -> list[tuple[str, ...]]:
        """Every node sequence a packet from ``src``'s NIC on ``src_rail`` to ``dst``'s address on ``dst_rail``
        may take (the host sends to its leaf; each switch may pick any member of its group)."""
        addr = _u32(self.topo.address(dst, dst_rail))
        out: list[tuple[str, ...]] = []

        def walk(node: str, path: tuple[str, ...]) -> None:
            if len(path) > 16:
                raise RoutingError(f"{src}→{dst}: loop at {node}")
            ports = self.group(node, addr)
            if not ports:
                raise RoutingError(f"{node}: {'no route' if ports is None else 'empty group'} for {dst}")
            for ifx in ports:
                peer = self.topo.port(ifx).peer_node
                if peer == dst:
                    out.append(path + (peer,))
                elif self.topo.nodes[peer].kind == "host":
                    raise RoutingError(f"{node}: {dst}'s address delivered to {peer}")
                else:
                    walk(peer, path + (peer,))
        leaf = self.topo.leaf_of(src, src_rail)
        walk(leaf, (src, leaf))
        return out
