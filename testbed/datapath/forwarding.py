"""The forwarding maps: ports, the FIB and its next-hop groups (WCMP weights), each switch's load-balancing
mode and seed, and the ports that lost their link."""
from __future__ import annotations

import ctypes as ct
import functools
import ipaddress

from . import hashing
from ..errors import DatapathError
from .names import (ADAPTIVE_STAGE, AR_GRANULARITY, AR_METRICS, MODES, PORT_EDGE, PORT_VALID, SPRAY_KINDS,
                    WCMP_GRANULARITY, mac_bytes, net_u32)


@functools.lru_cache(maxsize=1024)
def _wcmp_bytes(weights: tuple[int, ...], slots: int) -> tuple[int, bytes]:
    table = hashing.wcmp_table(weights, slots)
    return len(table), bytes(table) + bytes(slots - len(table))


def fill_group(v, topo, ports, max_nh: int, weights=None) -> None:
    """Fill an ``nh_group`` map value: the egress ports (at most ``max_nh``) and the WCMP table of their
    weights (``weights``, integers, else the ``topology.links`` weight of each port's link;
    hashing.wcmp_table), which the switch program reads under ``load_balancing: wcmp``. One home for the group
    layout: the loader, the SM, the distributed re-route and the WCMP controller all write groups through it.
    Tables are cached per weight tuple (an SM install at k=16 writes 327,680 groups)."""
    ports = tuple(ports)[:max_nh]
    v.n = len(ports)
    for i, p in enumerate(ports):
        v.ports[i] = p
    w = tuple(weights)[:len(ports)] if weights is not None else tuple(topo.port(p).weight for p in ports)
    v.nslots, table = _wcmp_bytes(w, len(v.wslot))
    ct.memmove(v.wslot, table, len(table))


class ForwardingMaps:
    """A part of Datapath (datapath/program.py): forwarding maps: ports, the FIB and its next-hop groups (WCMP weights), each switch's load-balancing."""

    def _fill_ports(self):
        t = self._bpf[b"ports"]
        for sw in self.topo.switches:
            sid = self.topo.switch_ids[sw]
            for p in self.topo.ports[sw]:
                v = t.Leaf()
                v.switch_id, v.flags = sid, PORT_VALID | (PORT_EDGE if p.role == "down" else 0)
                ct.memmove(v.mac, mac_bytes(p.mac), 6)
                ct.memmove(v.peer_mac, mac_bytes(p.peer_mac), 6)
                t[t.Key(p.ifindex)] = v

    def _fill_fib(self):
        t = self._bpf[b"fib"]
        for e in self.topo.fib:
            v = t.Leaf()
            fill_group(v, self.topo, e.ports, self.max_nh)
            t[self._fib_key(t, e.switch, e.prefix, e.plen)] = v

    def port_rates(self) -> dict[int, int]:
        """ifindex → the rate (bit/s) the queue model drains each switch port at now: the link rate, or what a
        failure's rate change set (``port_qos.ps_per_byte``; the topology keeps the original rates)."""
        self._need()
        t = self._bpf[b"port_qos"]
        out = {}
        for ifx in self._switch_ports:
            ps = t[t.Key(ifx)].ps_per_byte
            out[ifx] = 8 * 10**12 // ps if ps else self.topo.port(ifx).rate_bps
        return out

    def set_group_weights(self, switch: str, prefix: str, plen: int, weights: dict[int, int]) -> tuple[int, ...]:
        """Give the FIB entry (switch, prefix/plen) a new WCMP table from integer ``weights`` (egress ifindex →
        weight). Its ports stay as they are — a re-route's change of members is kept; a member without a weight
        gets 1. One map update: a packet sees the old table or the new one. Returns the ports."""
        self._need()
        t = self._bpf[b"fib"]
        k = self._fib_key(t, switch, prefix, plen)
        v = t[k]
        ports = tuple(v.ports[i] for i in range(min(v.n, self.max_nh)))
        fill_group(v, self.topo, ports, self.max_nh, [weights.get(p, 1) for p in ports])
        t[k] = v
        return ports

    def _fib_key(self, t, switch: str, prefix: str, plen: int):
        k = t.Key()
        k.prefixlen, k.switch_id, k.addr = 32 + plen, self.topo.switch_ids[switch], net_u32(prefix)
        return k

    def set_mode(self, switch_spec, switches=None) -> None:
        """Apply a SwitchSpec (load balancing, flowlet timeout, spray kind, hash seed) live, to every switch or
        to the named ones. Existing flowlet state stays; call clear_flows() for a clean slate."""
        self._need()
        if switch_spec.load_balancing == "plugin" and self.plugin is None:
            raise DatapathError("load_balancing plugin: this switch program was built without one "
                                "(Datapath(plugin=...))")
        if self._stage_needed(ADAPTIVE_STAGE, switch_spec):
            self._ensure_stage(ADAPTIVE_STAGE)
        if switches is None:
            self.switch_spec = switch_spec
        t = self._bpf[b"sw_config"]
        for sw in (switches if switches is not None else self.topo.switches):
            sid = self.topo.switch_ids[sw]
            v = t.Leaf()
            v.mode = MODES[switch_spec.load_balancing]
            v.spray = SPRAY_KINDS[switch_spec.spray]
            v.seed = hashing.switch_seed(switch_spec.hash_seed, sid)
            v.flowlet_timeout_ns = int(switch_spec.flowlet_timeout)
            ar = switch_spec.adaptive
            v.ar_metric = AR_METRICS[ar.metric]
            v.ar_granularity = AR_GRANULARITY[ar.granularity]
            v.load_window_ns = int(ar.load_window)
            v.track = 1 if self.track_flows or getattr(switch_spec, "routing", "distributed") == "sm" else 0
            v.wcmp_granularity = WCMP_GRANULARITY[switch_spec.wcmp.granularity]
            v.hash_fields = hashing.hash_mask(switch_spec.hash_fields)
            if switch_spec.load_balancing == "adaptive" and ar.flowlet_timeout is not None:
                v.flowlet_timeout_ns = int(ar.flowlet_timeout)
            dlb = switch_spec.dlb
            v.dlb_bands, v.dlb_load_weight, v.dlb_queue_weight = dlb.bands, dlb.load_weight, dlb.queue_weight
            if switch_spec.load_balancing == "dlb":
                # DLB is the adaptive stage choosing per flowlet (the inactivity gap) with the band as its cost
                v.ar_granularity = AR_GRANULARITY["flowlet"]
                v.flowlet_timeout_ns = int(dlb.inactivity)
                v.load_window_ns = int(dlb.load_window)
            t[t.Key(sid)] = v

    def switch_seed(self, switch: str) -> int:
        """The ECMP seed a switch uses (for hashing.ecmp_index)."""
        return hashing.switch_seed(self.switch_spec.hash_seed, self.topo.switch_ids[switch])

    def next_hops(self, switch: str, daddr: str) -> tuple[int, ...]:
        """The next-hop group (egress ifindexes) the FIB gives ``switch`` for ``daddr`` now: the live map (the
        subnet manager or a reroute may have changed it), or the topology's FIB before the program is loaded."""
        if self._bpf is not None:
            t = self._bpf[b"fib"]
            k = t.Key()
            k.prefixlen, k.switch_id, k.addr = 64, self.topo.switch_ids[switch], net_u32(daddr)
            try:
                v = t[k]
            except KeyError:
                return ()
            return tuple(int(v.ports[i]) for i in range(min(v.n, self.max_nh)))
        a = int(ipaddress.IPv4Address(daddr))
        for net, plen, ports in self._fib_by_switch.get(switch, ()):
            mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
            if (a & mask) == net:
                return ports
        return ()

    def set_port_down(self, ifindex: int, down: bool) -> None:
        """Mark a switch port as having lost (or regained) its link; every egress choice skips a down port.
        The link-state watcher (routing/manager.py) keeps this map in a running lab; tests set it directly."""
        self._need()
        t = self._bpf[b"port_down"]
        t[t.Key(ifindex)] = t.Leaf(1 if down else 0)

    def ports_down(self) -> set[int]:
        """Switch ports the datapath currently treats as down."""
        self._need()
        t = self._bpf[b"port_down"]
        return {i for i in self._switch_ports if t[t.Key(i)].value}
