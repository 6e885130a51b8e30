"""Soft-RoCE (rdma_rxe) set-up that works on a distribution kernel — for the ``traffic.engine: rxe`` driver.

Why hosts leave their namespaces
    On Debian's 6.1 kernel (the VM lane's, and what most users run) rxe opens its UDP socket (port 4791) in the
    **initial** network namespace only. An rxe device can be created on a veth inside a namespace, but its
    packets are then never sent ("Failed status 2" in ib_write_bw) and the namespace answers 4791 with ICMP
    port unreachable; ``rdma system set netns exclusive`` + ``rdma dev set … netns`` returns "Operation not
    supported". Per-namespace rxe sockets (drivers/infiniband/sw/rxe/rxe_ns.c) are newer upstream work; the
    6.12 kernels Debian ships for bookworm were not tried, so the lane does not rely on them.
What works (verified in the VM lane, tests/project/test_fullkernel.py)
    The rxe host's NIC is moved into the initial namespace (renamed, its address/shaping/neighbour re-applied);
    the rest of the fabric (switches, eBPF, other hosts) stays in namespaces. Because every rxe host's address is
    then local to the same namespace, the kernel would short-cut host-to-host traffic through ``lo``. Policy
    routing forces it onto the wire: one rule per rxe host ``from <addr> iif lo lookup <table>`` whose table
    routes everything out of that host's NIC, the ``local`` table moved behind those rules, and
    ``accept_local=1`` / ``rp_filter=0`` so packets whose source is (also) a local address are accepted when they
    come back in on the peer NIC. rxe's route lookup uses the GID's address as source, so RoCE traffic takes the
    fabric; perftest's out-of-band TCP handshake (no source bound) goes through ``lo``, which must be up.

Public API (the ``traffic.engine: rxe`` driver and the full-kernel tests call these; everything is undone by
``close()`` / the context manager):
    ``available()`` → (ok, detail)               rdma_rxe present/loadable and the ``rdma`` tool installed
    ``RootHosts(lab, hosts)``                      context manager: hosts' NICs in the root ns + rxe devices
        ``.device(host)`` → "rxe_h0"             the ibverbs device name for perftest ``-d``
        ``.gid_index(host)`` → int               the RoCE v2 GID index of the host address, for ``-x``
        ``.address(host)`` → "198.18.0.1"
    ``pair_on_veth(addr_a, addr_b)``               context manager: the smallest set-up (two rxe devices on the
                                                   two ends of one veth pair, policy-routed), for self-tests
    ``gid_index(dev, addr)``
Commands run in the root namespace run as plain subprocesses; perftest (``-d <device> -x <gid index>``), its
parser and a server + client pair are in ``perftest.py``.
"""
from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import TestbedError

TABLE_BASE = 4790          # routing tables 4791… (one per rxe host)
RULE_PREF_BASE = 100       # rules at 100…; the local table is moved to LOCAL_PREF
LOCAL_PREF = 32000


class RxeError(TestbedError):
    pass


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise RxeError(f"{' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r


def _sysctl(key: str, value) -> None:
    Path("/proc/sys/" + key.replace(".", "/")).write_text(f"{value}\n")


def available() -> tuple[bool, str]:
    """Is Soft-RoCE usable here? Loads rdma_rxe when it is a module."""
    if not shutil.which("rdma"):
        return False, "the `rdma` tool (iproute2) is missing"
    if not Path("/sys/module/rdma_rxe").exists():
        r = subprocess.run(["modprobe", "rdma_rxe"], capture_output=True, text=True)
        if r.returncode or not Path("/sys/module/rdma_rxe").exists():
            return False, f"kernel has no rdma_rxe ({(r.stderr or '').strip() or 'modprobe failed'})"
    return True, "rdma_rxe loaded"


def gid_index(dev: str, addr: str, timeout: float = 5.0) -> int:
    """Index of the RoCE v2 GID for IPv4 ``addr`` on ibverbs device ``dev`` (waits for the GID table)."""
    want = ipaddress.IPv6Address("::ffff:" + addr).exploded
    base = Path(f"/sys/class/infiniband/{dev}/ports/1")
    end = time.monotonic() + timeout
    while True:
        for g in sorted(base.glob("gids/*"), key=lambda p: int(p.name)):
            try:
                gid = g.read_text().strip()
                typ = (base / "gid_attrs/types" / g.name).read_text().strip()
            except OSError:
                continue
            if ipaddress.IPv6Address(gid).exploded == want and "v2" in typ.lower():
                return int(g.name)
        if time.monotonic() > end:
            raise RxeError(f"{dev}: no RoCE v2 GID for {addr}")
        time.sleep(0.1)


@dataclass
class _Policy:
    """Rules/tables/sysctls added in the root namespace, undone in reverse."""
    rules: list[list[str]] = field(default_factory=list)
    tables: list[int] = field(default_factory=list)
    local_moved: bool = False

    def move_local(self) -> None:
        out = _run("ip", "-4", "rule", "show").stdout
        if not re.search(rf"^{LOCAL_PREF}:.*lookup local", out, re.M):
            _run("ip", "-4", "rule", "add", "pref", str(LOCAL_PREF), "lookup", "local")
        if re.search(r"^0:.*lookup local", out, re.M):
            _run("ip", "-4", "rule", "del", "pref", "0", "lookup", "local")
            self.local_moved = True
        for k in ("net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"):
            _sysctl(k, 0)
        _sysctl("net.ipv4.conf.all.accept_local", 1)

    def host(self, n: int, ifname: str, addr: str, gateway: str | None, gw_mac: str | None,
             peer: str | None = None) -> None:
        table = TABLE_BASE + 1 + n
        for k, v in (("rp_filter", 0), ("accept_local", 1)):
            _sysctl(f"net.ipv4.conf.{ifname}.{k}", v)
        if gateway:
            _run("ip", "neigh", "replace", gateway, "lladdr", gw_mac, "dev", ifname, "nud", "permanent")
            _run("ip", "route", "replace", f"{gateway}/32", "dev", ifname, "table", str(table))
            _run("ip", "route", "replace", "default", "via", gateway, "dev", ifname, "table", str(table))
        else:                   # directly connected peer (pair_on_veth)
            _run("ip", "neigh", "replace", peer, "lladdr", gw_mac, "dev", ifname, "nud", "permanent")
            _run("ip", "route", "replace", "default", "dev", ifname, "table", str(table))
        self.tables.append(table)
        rule = ["pref", str(RULE_PREF_BASE + n), "from", addr, "iif", "lo", "lookup", str(table)]
        _run("ip", "-4", "rule", "add", *rule)
        self.rules.append(rule)

    def close(self) -> None:
        for rule in reversed(self.rules):
            _run("ip", "-4", "rule", "del", *rule, check=False)
        for t in self.tables:
            _run("ip", "route", "flush", "table", str(t), check=False)
        if self.local_moved:
            _run("ip", "-4", "rule", "add", "pref", "0", "lookup", "local", check=False)
            _run("ip", "-4", "rule", "del", "pref", str(LOCAL_PREF), "lookup", "local", check=False)
        self.rules, self.tables, self.local_moved = [], [], False


def _rxe_add(dev: str, ifname: str) -> None:
    _run("rdma", "link", "add", dev, "type", "rxe", "netdev", ifname)


def _rxe_del(dev: str) -> None:
    _run("rdma", "link", "delete", dev, check=False)


@contextmanager
def pair_on_veth(addr_a: str = "10.79.0.1", addr_b: str = "10.79.0.2", prefix: str = "ftbrx"):
    """Two rxe devices (``{prefix}a``/``{prefix}b`` on veths of the same names) across one veth pair in the root
    namespace, policy-routed so RoCE crosses the veth. Yields dict(dev_a, dev_b, addr_a, addr_b, gid_a, gid_b)."""
    ok, why = available()
    if not ok:
        raise RxeError(why)
    va, vb = f"{prefix}a", f"{prefix}b"
    pol = _Policy()
    devs: list[str] = []
    try:
        _run("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        for v, a in ((va, addr_a), (vb, addr_b)):
            _run("ip", "addr", "add", f"{a}/32", "dev", v)
            _run("ip", "link", "set", v, "up")
        _run("ip", "link", "set", "lo", "up")
        mac = {v: Path(f"/sys/class/net/{v}/address").read_text().strip() for v in (va, vb)}
        pol.move_local()
        pol.host(0, va, addr_a, None, mac[vb], peer=addr_b)
        pol.host(1, vb, addr_b, None, mac[va], peer=addr_a)
        for v in (va, vb):
            _rxe_add(f"rxe_{v}", v)
            devs.append(f"rxe_{v}")
        yield {"dev_a": devs[0], "dev_b": devs[1], "addr_a": addr_a, "addr_b": addr_b,
               "gid_a": gid_index(devs[0], addr_a), "gid_b": gid_index(devs[1], addr_b), "if_a": va, "if_b": vb}
    finally:
        for d in devs:
            _rxe_del(d)
        pol.close()
        _run("ip", "link", "del", va, check=False)


class RootHosts:
    """Move the NICs of ``hosts`` of a built ``testbed.lab.Lab`` into the root namespace and give each an rxe
    device; the switches keep forwarding with eBPF. Single-rail host NICs only (``eth0``).

    Use as a context manager (or call ``close()``): devices, rules, tables and the moved NICs are removed (the
    NIC is deleted, which also frees its peer on the leaf; tear the lab down afterwards as usual).
    """

    def __init__(self, lab, hosts: list[str]):
        ok, why = available()
        if not ok:
            raise RxeError(why)
        self.lab, self.hosts = lab, list(hosts)
        self.ifname = {h: f"rx{h}" for h in self.hosts}
        self._pol = _Policy()
        self._moved: list[str] = []
        self._devs: list[str] = []

    def __enter__(self) -> "RootHosts":
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def device(self, host: str) -> str:
        return f"rxe_{host}"

    def address(self, host: str) -> str:
        return self.lab.topo.address(host)

    def gid_index(self, host: str) -> int:
        return gid_index(self.device(host), self.address(host))

    def _setup(self) -> None:
        topo = self.lab.topo
        _run("ip", "link", "set", "lo", "up")
        self._pol.move_local()
        for n, h in enumerate(self.hosts):
            port = next(p for p in topo.ports[h] if p.rail == 0)
            route = next(r for r in topo.routes if r.node == h and r.ifindex == port.ifindex)
            ns, new = self.lab.fabric.ns[h], self.ifname[h]
            _run("ip", "-n", ns, "link", "set", port.ifname, "netns", "1", "name", new)
            self._moved.append(new)
            _run("ip", "addr", "add", f"{port.address}/32", "dev", new)
            _run("ip", "link", "set", new, "up")
            c = self.lab.ports[port.ifindex]         # the NIC's shaping as the fabric configured it
            _run("tc", "qdisc", "replace", "dev", new, "root", "handle", "1:", "tbf", "rate",
                 f"{c.rate_bps}bit", "burst", str(c.burst_bytes), "limit", str(c.queue_limit()))
            if c.delay_ns:
                _run("tc", "qdisc", "replace", "dev", new, "parent", "1:1", "handle", "10:", "netem", "delay",
                     f"{c.delay_ns // 1000}us", "limit", str(c.netem_limit))
            for k in ("tso", "gso", "gro"):
                _run("ethtool", "-K", new, k, "off", check=False)
            self._pol.host(n, new, port.address, route.gateway, route.gateway_mac)
            _rxe_add(self.device(h), new)
            self._devs.append(self.device(h))

    def close(self) -> None:
        for d in self._devs:
            _rxe_del(d)
        self._devs = []
        self._pol.close()
        for ifname in self._moved:
            _run("ip", "link", "del", ifname, check=False)
        self._moved = []


__all__ = ["RootHosts", "RxeError", "available", "gid_index", "pair_on_veth"]
