"""Build a topology into the kernel: namespaces, veth pairs, shaping qdiscs, addresses, routes.

One pass per phase, one batched netlink socket per namespace (see netlink.py), nothing looked up: the topology
already fixed every name, ifindex and MAC. Every namespace is ``ftb-<lab>-<node>``; the fabric touches nothing
outside the namespaces it made, and ``teardown()`` (always called by the lab) removes them, which frees the
veths, qdiscs and attached BPF programs with them.
"""
from __future__ import annotations

import array
import ipaddress
import os
import socket
import time
from dataclasses import dataclass

from ..errors import TestbedError
from . import netns
from .netlink import Batch, NetlinkError, dump_root_qdisc_stats
from .port import PortConfig
from ..qos_classes import HTB_MAJOR, HTB_ROOT_CLASS
from ..topology import Topology
from .offloads import ethtool, feature_names, offloads_off_request

# the shared tc filter blocks every hooked node's ports are bound to (block indexes are per namespace)
INGRESS_BLOCK, EGRESS_BLOCK = 1, 2


class FabricError(TestbedError):
    pass


@dataclass(frozen=True)
class Tunnel:
    """A switch port whose link crosses to another machine (testbed/cluster/): a VXLAN device with the port's
    name, ifindex and MAC, made in this machine's underlay namespace (the process's own) so its UDP socket stays
    there, carrying ``vni`` between the two machines' underlay addresses."""
    vni: int
    local: str
    remote: str


def ns_name(lab: str, node: str) -> str:
    return f"{netns.PREFIX}{lab}-{node}"


class Fabric:
    def __init__(self, topo: Topology, lab: str, ports: dict[int, PortConfig],
                 tunnels: dict[int, Tunnel] | None = None, hooked: list[str] | None = None):
        """``ports``: every port's egress configuration (port.port_configs).
        ``tunnels``: ifindex → Tunnel for the ports of ``topo`` whose link leaves this machine (one machine's
        part of a fabric: ``topo`` is restricted to it, Topology.restrict). ``hooked``: the nodes whose ports get
        a clsact qdisc at build time, for the eBPF programs attached later (default: the switches; add the hosts
        for ``attach_host_ingress``)."""
        self.topo, self.lab, self.ports = topo, lab, ports
        self.tunnels = tunnels or {}
        self.hooked = frozenset(topo.switches if hooked is None else hooked)
        self.ns = {node: ns_name(lab, node) for node in topo.nodes}
        self._socks: dict[str, socket.socket] = {}
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ build

    def build(self, adopt: dict[str, str] | None = None) -> None:
        """Create everything; on failure remove what was made and raise FabricError. ``adopt``: node → an
        existing network namespace file (a container host's ``/proc/<pid>/ns/net``) that becomes the node's
        namespace instead of a new one; the fabric builds into it like into any other."""
        try:
            self._build(adopt or {})
        except BaseException:
            self.teardown()
            raise

    def _phase(self, name: str, t0: float) -> float:
        t = time.perf_counter()
        self.timings[name] = t - t0
        return t

    def _build(self, adopt: dict[str, str]) -> None:
        topo, spec = self.topo, self.topo.spec
        netns.raise_nofile(4 * len(self.ns) + 1024)
        t = time.perf_counter()
        taken = [n for n in self.ns.values() if os.path.lexists(netns.path(n))]
        if taken:
            raise FabricError(f"lab '{self.lab}': namespace {taken[0]} already exists "
                              f"(a lab of that name is running; `testbed down {self.lab}` or `testbed clean`)")
        socks = netns.create([name for node, name in self.ns.items() if node not in adopt], netlink=True)
        self._socks = {node: socks[name] for node, name in self.ns.items() if node not in adopt}
        if adopt:
            adopted = netns.adopt({self.ns[node]: source for node, source in adopt.items()})
            self._socks.update({node: adopted[self.ns[node]] for node in adopt})
        t = self._phase("namespaces", t)

        # veth pairs, created from the end nearer the hosts, peer placed straight into its namespace
        gso = None if spec.offloads else 1
        batches = {node: Batch(self._socks[node], self.ns[node]) for node in self.ns}
        fds = {}
        try:
            for link in topo.links:
                a, b = link.a, link.b
                if b.node not in fds:
                    fds[b.node] = os.open(netns.path(self.ns[b.node]), os.O_RDONLY)
                batches[a.node].veth(a.ifname, a.ifindex, a.mac, self.ports[a.ifindex].mtu, b.ifname, b.ifindex, b.mac,
                                     fds[b.node], gso_max_segs=gso if a.role == "nic" else None)
            self._commit(batches)
        finally:
            for fd in fds.values():
                os.close(fd)
        t = self._phase("links", t)
        if self.tunnels:
            self._add_tunnels()
            t = self._phase("tunnels", t)

        # shaping and the clsact hooks (the node's shared filter blocks) while every port is still down: grafting
        # a qdisc onto a running device first deactivates it and waits for an RCU grace period (a clsact cost
        # 77 µs on an up device, 13 µs on a down one); then up, addresses, neighbours, routes (an on-link route
        # needs its device up). Before up too: no IPv6 address on any port (Batch.no_ipv6_address)
        for node, ports in topo.ports.items():
            bt = batches[node]
            hooked = node in self.hooked
            for p in ports:
                bt.no_ipv6_address(p.ifindex, p.ifname)
                if hooked:
                    bt.clsact(p.ifindex, p.ifname, INGRESS_BLOCK, EGRESS_BLOCK)
                self._shaper(bt, p)
            bt.link_up(1, "lo")
            for p in ports:
                bt.link_up(p.ifindex, p.ifname)
                if p.address:
                    bt.address(p.ifindex, p.address, 32)
        neighbours = set()
        for r in topo.routes:
            bt = batches[r.node]
            if (r.node, r.ifindex) not in neighbours:       # a NIC with its own table has two routes
                neighbours.add((r.node, r.ifindex))
                bt.neighbour(r.ifindex, r.gateway, r.gateway_mac)
            bt.route(r.dst, r.gateway, r.ifindex, prefsrc=r.prefsrc, table=r.table)
        for rule in topo.rules:
            batches[rule.node].rule(rule.src, rule.table, rule.priority)
        self._commit(batches)
        t = self._phase("config", t)
        self._add_delays(batches)
        t = self._phase("delay", t)

        if not spec.offloads:
            self._offloads_off({h: [p.ifname for p in topo.ports[h]] for h in topo.hosts})
        self._phase("offloads", t)

    def _offloads_off(self, ifnames: dict[str, list[str]]) -> None:
        """TSO/GSO/GRO/SG off on these devices (node → names), so that switches see wire-sized frames: one
        ETHTOOL_SFEATURES per device, through the node's own netlink socket (no thread has to enter it)."""
        request = None
        for node, names in ifnames.items():
            for ifname in names:
                try:
                    if request is None:
                        request = offloads_off_request(feature_names(self._socks[node], ifname))
                    ethtool(self._socks[node], ifname, array.array("I", request))
                except OSError as e:
                    raise FabricError(f"{self.ns[node]}: offloads off on {ifname}: {e.strerror}") from None

    def _add_tunnels(self) -> None:
        """The VXLAN ports of cut links, from this process's namespace (the underlay) into their switches';
        GRO/GSO off on them like on host NICs, so the switch program sees the frames the peer port sent."""
        sock = netns.netlink_socket_here()
        b = Batch(sock, "underlay")
        fds: dict[str, int] = {}
        try:
            for ifx, tun in self.tunnels.items():
                p = self.topo.port(ifx)
                if p.node not in fds:
                    fds[p.node] = os.open(netns.path(self.ns[p.node]), os.O_RDONLY)
                b.vxlan(p.ifname, ifx, p.mac, self.ports[ifx].mtu, tun.vni, tun.local, tun.remote, fds[p.node])
            try:
                b.commit()
            except NetlinkError as e:
                raise FabricError(str(e)) from None
        finally:
            sock.close()
            for fd in fds.values():
                os.close(fd)
        by_node: dict[str, list[str]] = {}
        for ifx in self.tunnels:
            p = self.topo.port(ifx)
            by_node.setdefault(p.node, []).append(p.ifname)
        self._offloads_off(by_node)

    def _shaper(self, bt: Batch, p) -> None:
        """The port's serialiser as its PortConfig says: a TBF root at the link rate, or HTB with one class per
        priority and a TBF leaf under each (the PFC agent pauses a priority by changing its TBF)."""
        c = self.ports[p.ifindex]
        if not c.classes:
            bt.tbf(p.ifindex, c.rate_bps, c.burst_bytes, c.queue_limit(), p.ifname)
            return
        bt.htb(p.ifindex, c.minor(c.default_prio), p.ifname)
        bt.htb_class(p.ifindex, HTB_ROOT_CLASS, HTB_MAJOR, c.rate_bps, c.rate_bps, c.burst_bytes, p.ifname)
        for prio in c.classes:
            bt.htb_class(p.ifindex, c.class_id(prio), HTB_ROOT_CLASS, c.class_rate(), c.rate_bps, c.burst_bytes,
                         p.ifname)
            bt.tbf(p.ifindex, c.rate_bps, c.burst_bytes, c.queue_limit(prio), p.ifname,
                   handle=c.leaf_handle(prio), parent=c.class_id(prio))

    def attach_host_ingress(self, prog_fd: int, prog_name: str) -> None:
        """hosts.pfc: the pause-frame receiver on clsact ingress of every host NIC."""
        self._attach_clsact_ingress(self.topo.hosts, prog_fd, prog_name)

    def _add_delays(self, batches: dict[str, Batch]) -> None:
        """Link ``delay``: netem under each delayed port's TBF. Refused with one line where netem is missing."""
        delayed = [(node, p) for node, ports in self.topo.ports.items() for p in ports if p.delay_ns]
        if not delayed:
            return
        if any(self.ports[p.ifindex].classes for _, p in delayed):
            raise FabricError("topology.*_link.delay: link delay with switch traffic classes / PFC (HTB per "
                              "priority) is not supported yet; use one or the other")
        for node, p in delayed:
            batches[node].netem(p.ifindex, p.delay_ns // 1000, self.ports[p.ifindex].netem_limit, p.ifname)
        try:
            for b in batches.values():
                b.commit()
        except NetlinkError as e:
            if "ENOENT" in str(e) or "EOPNOTSUPP" in str(e):
                from ..capability import Capability, MissingFeature, kernel_release
                keys = sorted({self._delay_key(p) for _, p in delayed})
                raise MissingFeature(
                    f"{' and '.join(keys)}: link delay needs the netem qdisc, which this kernel "
                    f"({kernel_release()}) does not have (`testbed doctor`: netem absent); remove the delay "
                    f"or run on a distribution kernel (the VM: `testbed vm run -- …`, see README)",
                    [Capability("netem", False, str(e), "link delay (netem)")]) from None
            raise FabricError(str(e)) from None

    def _delay_key(self, p) -> str:
        """The scenario key a port's delay came from: its link kind's, or a ``topology.links`` override."""
        spec = self.topo.spec
        kind = "host" if p.role in ("nic", "down") else "fabric"
        if p.delay_ns != getattr(spec, f"{kind}_link").delay:
            return "topology.links.*.delay"
        return f"topology.{kind}_link.delay"

    def _commit(self, batches: dict[str, Batch]) -> None:
        for b in batches.values():
            try:
                b.commit()
            except NetlinkError as e:
                raise FabricError(str(e)) from None

    # ------------------------------------------------------------------ datapath hooks

    def attach_ingress(self, prog_fd: int, prog_name: str) -> None:
        """Attach the switching program (direct action) to clsact ingress of every switch port."""
        t = time.perf_counter()
        self._attach_clsact_ingress(self.topo.switches, prog_fd, prog_name)
        self.timings["attach"] = time.perf_counter() - t

    def _attach_clsact_ingress(self, nodes, prog_fd: int, prog_name: str) -> None:
        """A direct-action cls_bpf filter on the ingress block that every port of each of ``nodes`` shares (made
        by ``build``): one request per node. (By then a grace period has passed since the clsacts were made: a
        filter on a clsact made in the same batch waits for one, about 65 µs.)"""
        missing = [n for n in nodes if n not in self.hooked]
        if missing:
            raise FabricError(f"lab '{self.lab}': {missing[0]} has no clsact hook (Fabric(hooked=…) leaves it out)")
        batches = {}
        for node in nodes:
            b = batches[node] = Batch(self._socks[node], self.ns[node])
            b.bpf_filter(INGRESS_BLOCK, prog_fd, prog_name, f"{node}'s ports")
        self._commit(batches)

    def attach_nic_release(self, prog_fd: int) -> None:
        """XDP on the leaf end of every host link, so a host's socket is released when its frame leaves the NIC
        rather than when it leaves the fabric (see ebpf/switch.c, ftb_nic_release)."""
        t = time.perf_counter()
        batches = {}
        for sw in self.topo.switches:
            for p in self.topo.ports[sw]:
                if p.role == "down":
                    b = batches.setdefault(sw, Batch(self._socks[sw], self.ns[sw]))
                    b.xdp(p.ifindex, prog_fd, p.ifname)
        self._commit(batches)
        self.timings["nic_release"] = time.perf_counter() - t

    def enable_kernel_forwarding(self, per_host: bool = False) -> None:
        """Baseline without eBPF: switches route with the kernel's own multipath FIB (for benchmarks). With
        ``per_host`` every host's /32 also gets one next hop of its prefix's equal-cost set, round-robin by host
        number (an InfiniBand subnet manager's destination-based spreading): a permutation then has a path of its
        own per flow, where the kernel's flow hash would collide some (the capacity benchmark's baseline)."""
        t = time.perf_counter()
        batches = {}
        host_no = {self.topo.address(h, r): i for i, h in enumerate(self.topo.hosts)
                   for r in range(getattr(self.topo.spec, "rails", 1))}
        best: dict = {}                     # (switch, host address) → its longest-matching FIB entry
        if per_host:
            for fe in self.topo.fib:
                for addr in host_no:
                    cur = best.get((fe.switch, addr))
                    if ipaddress.IPv4Address(addr) in fe.network and (cur is None or fe.plen > cur.plen):
                        best[(fe.switch, addr)] = fe
        for fe in self.topo.fib:
            if not fe.ports:
                continue
            b = batches.setdefault(fe.switch, Batch(self._socks[fe.switch], self.ns[fe.switch]))
            hops = []
            for ifx in fe.ports:
                p = self.topo.port(ifx)
                peer = self.topo.port(p.peer_ifindex)
                gw = peer.address or f"169.254.{(p.peer_ifindex >> 8) & 255}.{p.peer_ifindex & 255}"
                hops.append((gw, ifx))
                b.neighbour(ifx, gw, p.peer_mac)
            if len(hops) == 1:
                b.route(f"{fe.prefix}/{fe.plen}", hops[0][0], hops[0][1])
            else:
                b.route(f"{fe.prefix}/{fe.plen}", hops[0][0], hops[0][1], multipath=hops)
                if per_host:                 # the hosts this entry is the longest match for on its switch
                    for addr, i in host_no.items():
                        if best.get((fe.switch, addr)) is fe:
                            gw, ifx = hops[i % len(hops)]
                            b.route(f"{addr}/32", gw, ifx)
        self._commit(batches)
        for sw in self.topo.switches:
            netns.write_sysctl(self.ns[sw], "net.ipv4.ip_forward", 1)
            netns.write_sysctl(self.ns[sw], "net.ipv4.fib_multipath_hash_policy", 1)
        self.timings["kernel_forwarding"] = time.perf_counter() - t

    def qdisc_stats(self, nodes: list[str] | None = None, read_at: list | None = None,
                    leaves: dict | None = None) -> dict[int, tuple]:
        """Root qdisc counters of every port of ``nodes`` (default: switches): what really left each port.
        ``read_at`` gets the instant of each node's reading appended, ``leaves`` the backlog of every priority's
        qdisc (netlink.dump_root_qdisc_stats)."""
        out: dict[int, tuple] = {}
        for node in nodes if nodes is not None else self.topo.switches:
            out.update(dump_root_qdisc_stats(self._socks[node], read_at, leaves))
        return out

    # ------------------------------------------------------------------ teardown

    def teardown(self) -> None:
        t = time.perf_counter()
        for s in self._socks.values():
            s.close()
        self._socks.clear()
        netns.delete(self.ns.values())
        self.timings["teardown"] = time.perf_counter() - t
