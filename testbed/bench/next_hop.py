"""Per-packet cost of the switch program's next-hop choices and of INT, against baselines in the same run
(`testbed bench select`; the unit tests assert on the same functions).

BPF_PROG_TEST_RUN runs the loaded program on one crafted packet as if it arrived on a leaf port, in a throwaway
namespace holding a veth with the ifindex of every switch port (the kernel resolves ``skb->ifindex`` there).
Choices: batches of repetitions on one skb (TTL 255, so it never expires), the uplinks' queue models emptied
before every batch (a full queue's tail drop would skip the egress work); modes alternate within each round and
the median of the per-round ratios is printed, so a busy neighbour's drift cancels. INT: a repetition would push
onto the same skb again, so every run is one packet and the kernel's own per-run time is averaged.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct

from ..datapath import testrun
from ..fabric import netns

ROUNDS = 7


@contextlib.contextmanager
def port_namespace(ports, tag: str):
    """Move the calling thread into a throwaway namespace ``ftb-<tag>-<pid>`` holding a veth with the ifindex of
    every given port (BPF_PROG_TEST_RUN resolves ``skb->ifindex`` in the caller's namespace); always removed."""
    from pyroute2 import IPRoute
    name = f"{netns.PREFIX}{tag}-{os.getpid()}"
    orig = os.open("/proc/self/ns/net", os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    netns.create([name])
    entered = False
    try:
        netns.enter(name)
        entered = True
        with IPRoute() as ipr:
            for p in ports:
                ipr.link("add", ifname=f"p{p.ifindex}", index=p.ifindex, kind="veth", peer={"ifname": f"q{p.ifindex}"})
        yield name
    finally:
        if entered:
            libc.setns(orig, netns.CLONE_NEWNET)
        os.close(orig)
        netns.delete([name])


def udp_frame(topo, src: str, dst: str, sport: int = 4242, dport: int = 5001, payload: int = 64,
              ttl: int = 255) -> tuple[int, bytes]:
    """(ingress ifindex, frame): a UDP packet from host ``src`` to ``dst`` as it arrives at src's leaf (UDP
    checksum 0)."""
    inp = topo.port(topo.port_named(src, "eth0").peer_ifindex)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 28 + payload, 0, 0, ttl, 17, 0, socket.inet_aton(topo.address(src)),
                     socket.inet_aton(topo.address(dst)))
    s = sum(struct.unpack(">10H", ip))
    s = (s & 0xFFFF) + (s >> 16)
    ip = ip[:10] + struct.pack(">H", ~((s & 0xFFFF) + (s >> 16)) & 0xFFFF) + ip[12:]
    eth = bytes.fromhex(inp.mac.replace(":", "")) + bytes.fromhex(inp.peer_mac.replace(":", "")) + b"\x08\x00"
    return inp.ifindex, eth + ip + struct.pack(">HHHH", sport, dport, 8 + payload, 0) + bytes(payload)


def mode_costs(dp, topo, modes: dict, rounds: int = ROUNDS) -> dict[str, tuple[float, float]]:
    """name → (median ns per packet, median per-round ratio to the first mode) for each SwitchSpec of ``modes``
    on the same packet h0 → h1 at h0's leaf."""
    ifx, frame = udp_frame(topo, topo.hosts[0], topo.hosts[-1])
    leaf = topo.port(ifx).node
    vq = dp.bpf[b"vq"]
    keys = [vq.Key(p.ifindex * 8) for p in topo.ports[leaf]]

    def batch():
        for k in keys:
            v = vq[k]
            v.finish = 0
            vq[k] = v
        return testrun.run(dp.ingress_fd, frame, ifindex=ifx, repeat=250).duration_ns

    ns: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for m, spec in modes.items():
            dp.set_mode(spec)
            ns[m].append(sum(batch() for _ in range(20)) / 20)
    base = next(iter(modes))
    mid = rounds // 2
    return {m: (sorted(v)[mid], sorted(a / b for a, b in zip(v, ns[base]))[mid]) for m, v in ns.items()}


def int_costs(dp, topo, rounds: int = ROUNDS) -> dict[str, tuple[float, float]]:
    """INT role → (ns per packet with INT on, with it off) on the packets of one path h0 → the last host, in the
    same program: source (h0's leaf), transit (the spine), sink (the last leaf). Leaves INT as it was."""
    t = dp.bpf[b"int_config"]
    was = t[t.Key(0)].enabled

    def enable(on):
        v = t[t.Key(0)]
        v.enabled = on
        t[t.Key(0)] = v

    def cost(i, f, on):
        enable(on)
        return sorted(sum(testrun.run(dp.ingress_fd, f, ifindex=i).duration_ns for _ in range(400)) / 400
                      for _ in range(rounds))[rounds // 2]
    try:
        enable(1)                              # the frames each hop receives, stacks included
        ifx, frame = udp_frame(topo, topo.hosts[0], topo.hosts[-1], payload=100, ttl=64)
        cases = {}
        for role in ("source", "transit", "sink"):
            cases[role] = (ifx, frame)
            r = testrun.run(dp.ingress_fd, frame, ifindex=ifx)
            out = next(p for p in topo.ports[topo.port(ifx).node] if p.mac == r.data[6:12].hex(":"))
            ifx, frame = out.peer_ifindex, r.data
        return {role: (cost(i, f, 1), cost(i, f, 0)) for role, (i, f) in cases.items()}
    finally:
        enable(was)


def print_select(rounds: int = ROUNDS) -> None:
    """`testbed bench select`: WCMP, DLB and adaptive choices vs ECMP, INT per hop vs INT off."""
    from .. import scenario, topology
    from ..datapath import Datapath
    from ..fabric.port import port_configs
    scen = scenario.from_dict({"topology": {"spines": 4, "leaves": 2, "hosts_per_leaf": 1,
                                            "links": [{"between": ["leaf0", "spine0"], "weight": 3}]},
                               "telemetry": {"int": {"enabled": True}}})
    topo = topology.build(scen.topology)

    def sw(lb, **kw):
        return scenario.from_dict({"switch": {"load_balancing": lb, **kw}}).switch
    modes = {"ECMP (baseline)": sw("ecmp"), "WCMP per flow": sw("wcmp", wcmp={"granularity": "flow"}),
             "WCMP per packet": sw("wcmp", wcmp={"granularity": "packet"}),
             "flowlet": sw("flowlet", flowlet_timeout="1s"), "spray": sw("spray"),
             "DLB within a flowlet": sw("dlb", dlb={"inactivity": "1s"}),
             "DLB within a flowlet, queue metric only": sw("dlb", dlb={"inactivity": "1s", "load_weight": 0}),
             "DLB, a new flowlet every packet": sw("dlb", dlb={"inactivity": 0}),
             "adaptive per packet (queue)": sw("adaptive")}
    with port_namespace([p for s in topo.switches for p in topo.ports[s]], "bsel"):
        dp = Datapath(topo, scen.switch, port_configs(topo, scen.switch, fabric_mtu=scen.fabric_mtu),
                      scen.telemetry.int).load()
        try:
            t = dp.bpf[b"int_config"]
            v = t[t.Key(0)]
            v.enabled = 0                      # the choices without INT (its lookups stay, as in every run)
            t[t.Key(0)] = v
            sel = mode_costs(dp, topo, modes, rounds)
            ints = int_costs(dp, topo, rounds)
        finally:
            dp.close()
    print(f"next-hop choice, ns per packet at a leaf with 4 uplinks (PROG_TEST_RUN, {rounds} alternated rounds, "
          f"medians; goal ≤ 1.2× ECMP):")
    for m, (ns, r) in sel.items():
        print(f"  {m:<42} {ns:7.0f} ns  {r:5.2f}×")
    print("INT per hop, ns per packet vs the same packet with INT off (one packet per run):")
    for role, (on, off) in ints.items():
        print(f"  {role:<42} {on:7.0f} ns  vs {off:5.0f}  {on / off:5.2f}×")
