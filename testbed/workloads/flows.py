"""Traffic patterns → a flat list of flows (pure: no sockets, no kernel calls).

``plan(traffic, topo, seed, duration_s)`` turns a scenario's ``TrafficSpec`` into ``Flow`` records that the
agents (``testbed.workloads.agent``) execute and the report joins with telemetry. Everything random is drawn from
``random.Random(seed)``, so a scenario and a seed always give the same flows.

Patterns (``flows_per_pair`` applies to each):
  pairs        the listed (src, dst) pairs, in order
  permutation  a seeded random derangement: every host sends to exactly one other host and receives from exactly
               one; when the leaves allow it (no leaf holds more than half the hosts) every destination sits on
               another leaf, so all traffic crosses the spines
  all-to-all   every ordered pair of distinct hosts
  incast       senders → receiver; senders = a list of names, a count N (the first N hosts other than the
               receiver, in host order) or None (every other host)
  poisson      open loop: every host starts flows at Poisson arrivals of rate load × its link rate ÷ the mean
               flow size, each to a uniformly drawn other host, its size drawn from ``size_dist`` (sizes.py),
               during ``arrival_window`` after ``start`` (default: half the time left); ``flows_per_pair``
               does not apply

Ports: ``sport: random`` draws distinct ports in [sport_base, 65535] (never one of this plan's destination
ports); ``sequential`` gives flow i the port sport_base + i; a fixed integer gives every flow that source port.
With a fixed source port two flows between the same hosts would share a 5-tuple, so then flow k of a pair goes to
``dport + k`` instead (the other modes keep one ``dport`` for every flow): low entropy, on purpose.

Rails: with R rails, flow k of a pair uses rail k % R (the source and destination addresses of that rail);
with ``rail_shift`` s (rails sharing their spines) it leaves on NIC k % R and goes to the destination's NIC on
rail (k + s) % R — cross-rail traffic, leaf→spine→leaf.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from typing import Optional

SPORT_MAX = 65535
IP_PROTO = {"udp": 17, "rocev2": 17, "tcp": 6}


@dataclass
class Flow:
    flow_id: int
    src: str
    dst: str
    src_addr: str
    dst_addr: str
    sport: int
    dport: int
    proto: str                       # transport on the wire: "udp" | "tcp" | "rocev2"
    size_bytes: Optional[int]        # L4 payload bytes to deliver; None = send for the whole duration
    rate_bps: Optional[int]          # pacing rate (IP bytes); None = as fast as the host link takes it
    start_s: float                   # seconds after t0
    rail: int = 0
    engine: str = ""                 # the engine that runs it (ENGINES key); "" = same as proto
    opts: Optional[dict] = None      # engine options (RoCE: receiver, cc, mtu, entropy, DCQCN parameters, …)
    dscp: int = 0                    # DSCP of its packets (IP_TOS)
    ecn: str = "none"                # ECN codepoint UDP puts on its packets: none | ect0 | ect1
    prio: Optional[int] = None       # host NIC class (SO_PRIORITY → HTB class 1:(0x10+prio)); None = default
    dst_rail: Optional[int] = None   # the destination NIC's rail; None = ``rail`` (same-rail traffic)
    after: Optional[list[int]] = None   # gated: starts once these flows completed (+ after_delay_s), replay.py
    after_delay_s: float = 0.0
    adapt: Optional[str] = None      # the collective operation ("job.iteration") whose policy picks its port
    variant: int = 0                 # … and the ring order it belongs to, when the operation lays out several
    qp: int = 0                      # the queue pair of its connection it goes over (qps_per_connection)

    @property
    def to_rail(self) -> int:
        """The rail of the destination address (differs from ``rail`` for cross-rail flows)."""
        return self.rail if self.dst_rail is None else self.dst_rail

    @property
    def tos(self) -> int:
        return (self.dscp << 2) | {"none": 0, "ect1": 1, "ect0": 2}[self.ecn]

    @property
    def ip_proto(self) -> int:
        """The IP protocol number of its packets (RoCEv2 rides on UDP)."""
        return IP_PROTO[self.proto]

    def source_ports(self) -> range:
        """Every UDP/TCP source port its packets carry: one, or — RoCE with per-packet entropy — a run of
        ``entropy_values`` ports (the requester's sockets, ``roce/rc.py``)."""
        o = self.opts or {}
        n = max(1, int(o.get("entropy_values") or 1)) if o.get("entropy", "qp") != "qp" else 1
        first = min(self.sport, SPORT_MAX - n + 1)
        return range(first, first + n)

    def __post_init__(self):
        if not self.engine:
            self.engine = self.proto

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Flow":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ---------------------------------------------------------------- patterns → (src, dst) pairs

def _host_group(topo, host: str) -> int:
    """The host's edge switch: its leaf position in a leaf-spine (the same on every rail), its leaf in a 3-tier
    fabric — so a permutation's destinations sit behind another leaf and every flow uses the leaf's uplinks."""
    node = topo.nodes[host]
    return node.group if node.group is not None else 0


def derangement(hosts: list[str], rng: random.Random, group: Optional[dict] = None) -> dict[str, str]:
    """A random permutation of ``hosts`` with no fixed point. With ``group`` (host → leaf) and no group holding
    more than half the hosts, no host maps into its own group either. Random start, then random swaps repair the
    conflicts (each swap keeps it a permutation)."""
    n = len(hosts)
    if n < 2:
        raise ValueError(f"permutation needs at least 2 hosts, got {n}")
    cross = False
    if group is not None:
        sizes: dict = {}
        for h in hosts:
            sizes[group[h]] = sizes.get(group[h], 0) + 1
        cross = len(sizes) > 1 and max(sizes.values()) * 2 <= n

    def bad(src: str, dst: str) -> bool:
        return src == dst or (cross and group[src] == group[dst])

    targets = list(hosts)
    rng.shuffle(targets)
    order = list(range(n))
    for _ in range(50 * n + 100):
        conflicts = [i for i in range(n) if bad(hosts[i], targets[i])]
        if not conflicts:
            return dict(zip(hosts, targets))
        i = rng.choice(conflicts)
        rng.shuffle(order)
        for j in order:          # a swap that fixes i and keeps j good
            if j != i and not bad(hosts[i], targets[j]) and not bad(hosts[j], targets[i]):
                break
        else:                    # none: a random swap (random walk out of the dead end)
            j = rng.randrange(n)
        targets[i], targets[j] = targets[j], targets[i]
    # Deterministic fallback (never reached in practice): order by group, rotate by the largest group.
    by = sorted(hosts, key=lambda h: (group[h] if cross else 0, hosts.index(h)))
    shift = max(sizes.values()) if cross else 1
    return {by[k]: by[(k + shift) % n] for k in range(n)}


def _pairs(traffic, topo, rng: random.Random) -> list[tuple[str, str]]:
    return [tuple(p) for p in traffic.pairs]


def _permutation(traffic, topo, rng: random.Random) -> list[tuple[str, str]]:
    hosts = list(topo.hosts)
    perm = derangement(hosts, rng, {h: _host_group(topo, h) for h in hosts})
    return [(h, perm[h]) for h in hosts]


def _all_to_all(traffic, topo, rng: random.Random) -> list[tuple[str, str]]:
    hosts = list(topo.hosts)
    return [(a, b) for a in hosts for b in hosts if a != b]


def _incast(traffic, topo, rng: random.Random) -> list[tuple[str, str]]:
    rx = traffic.incast.receiver
    if rx not in topo.nodes:
        raise ValueError(f"incast receiver {rx} is not a host of this topology")
    others = [h for h in topo.hosts if h != rx]
    senders = traffic.incast.senders
    if senders is None:
        chosen = others
    elif isinstance(senders, int):
        if not 1 <= senders <= len(others):
            raise ValueError(f"incast senders: need 1..{len(others)} senders, got {senders}")
        chosen = others[:senders]
    else:
        chosen = list(dict.fromkeys(senders))
        if rx in chosen:
            raise ValueError(f"incast senders: the receiver {rx} cannot send to itself")
    return [(s, rx) for s in chosen]


#: ``traffic.pattern`` → who sends to whom: (traffic, topology, seeded random) → [(source host, destination host)].
#: A pattern of flows is one function here; ``allreduce`` and ``poisson`` are planned elsewhere (collectives,
#: ``plan``).
PATTERNS = {"pairs": _pairs, "permutation": _permutation, "all-to-all": _all_to_all, "incast": _incast}


def pairs_for(traffic, topo, rng: random.Random) -> list[tuple[str, str]]:
    if traffic.pattern == "allreduce":
        raise ValueError("pattern 'allreduce' is a collective: run it with testbed.workloads.collectives")
    if traffic.pattern not in PATTERNS:
        raise ValueError(f"unknown traffic pattern {traffic.pattern!r}")
    return PATTERNS[traffic.pattern](traffic, topo, rng)


# ---------------------------------------------------------------- the plan

class _RxePlan:
    """What ``plan`` needs of an engine, for ``traffic.engine: rxe`` (RoCEv2 on UDP 4791, run by perftest)."""
    name, proto, dport = "rxe", "rocev2", 4791


class _Iperf3Plan:
    """``traffic.engine: iperf3`` (testbed.workloads.iperf3 runs the flows): UDP or TCP, each flow its own
    server port (set when it runs)."""
    name, dport = "iperf3", None

    def __init__(self, protocol: str):
        self.proto = protocol


def _engine(traffic):
    from .engines import ENGINES          # lazy: keeps this module free of socket code at import
    name = traffic.engine
    if name == "rxe":                     # perftest runs these flows (testbed.workloads.rxe), not the agents
        return name, _RxePlan
    if name == "iperf3":
        return name, _Iperf3Plan(traffic.iperf3.protocol)
    if name not in ENGINES:
        raise ValueError(f"unknown traffic engine {name!r} (known: {', '.join(sorted(ENGINES))})")
    return name, ENGINES[name]


#: the least floor ``rto: auto`` gives: the engine's timers and ACK coalescing work in milliseconds
RTO_FLOOR_S = 0.010


def queueing_bound_s(topo) -> float:
    """The longest a packet can queue on its way between two hosts: over the longest path (NIC, then each
    switch hop), the sum of each hop's largest buffer ÷ its link rate (link overrides included). Rates are the
    emulated ones, so under ``time_dilation: N`` the bound is N × the real fabric's."""
    worst = {}
    for link in topo.links:
        worst[link.tier] = max(worst.get(link.tier, 0.0), link.buffer_bytes * 8 / link.rate_bps)
    fabric_hops = 2 * max(0, len(topo.tiers) - 1)
    return 2 * worst.get("host", 0.0) + fabric_hops * worst.get("fabric", 0.0)


def rto_s(roce, topo, held: bool = False) -> float:
    """``traffic.roce.rto`` in seconds. ``auto`` gives the floor of the estimated RTO: ``queueing_bound_s``, twice
    that when flow control can hold a paused queue (``held``: it drains slower than its rate; the ACK's own
    queueing is left to the RTT estimate), at least ``RTO_FLOOR_S``. A fixed RTO below the queueing delay makes
    go-back-N resend packets that were only late (a hardware NIC's RTO, milliseconds against microseconds of
    queueing, is far above it; emulated queues drain 1000× slower)."""
    if roce.rto == "auto":
        return max(RTO_FLOOR_S, (2 if held else 1) * queueing_bound_s(topo))
    return roce.rto / 1e9


def rto_warning(traffic, topo) -> str | None:
    """One line when RoCE runs with a fixed RTO below the longest queueing on its path: go-back-N's fixed
    timeout fires on packets that are only late; the extended transport's estimate starts from it (4 × before
    the first RTT sample) and can lag a queue that builds at once. ``auto`` never warns."""
    if traffic.engine != "roce" or traffic.roce.rto == "auto":
        return None
    rto, bound = rto_s(traffic.roce, topo), queueing_bound_s(topo)
    if rto >= bound:
        return None
    what = ("the extended transport's RTO floor: timeouts before the RTT estimate rises above it"
            if roce_ext(traffic) else "go-back-N's fixed RTO")
    return (f"traffic.roce.rto: {rto * 1e3:g} ms is below the {bound * 1e3:.0f} ms a packet can queue on its path "
            f"(buffers ÷ link rates): {what} may resend packets that are only late; set traffic.roce.rto: "
            f"auto (or above {bound * 1e3:.0f} ms)")


def roce_ext(traffic) -> bool:
    """Whether the flows use the extended transport (transmit times in data packets, SACK echoes in ACKs): an
    adaptive RTO from the measured RTT, the fixed one only its floor."""
    r = traffic.roce
    from .roce import cc as roce_cc
    cc = roce_cc.maybe_cc(traffic.cc)
    return (cc is not None and cc.extended) or r.entropy in ("reps", "bitmap") or traffic.receiver == "ooo"


def roce_opts(traffic, topo) -> dict:
    """Engine options every RoCE flow of ``traffic`` carries to both agents (see roce.py)."""
    from .roce import wire as rocewire
    from .roce import cc as roce_cc
    spec = topo.spec
    packet_size = traffic.packet_size or spec.mtu
    r = traffic.roce
    line = spec.host_link.rate
    d = traffic.cc_config if traffic.cc == "dcqcn" else traffic.dcqcn
    params = roce_cc.DcqcnParams.scaled(line, **d.overrides())
    cc = roce_cc.maybe_cc(traffic.cc)
    rto = rto_s(r, topo, traffic.queues_held)
    mtu = r.mtu or rocewire.ib_mtu(packet_size)
    if mtu + rocewire.HDR_MAX + rocewire.ICRC_LEN > packet_size:
        raise ValueError(f"traffic.roce.mtu {mtu} does not fit packet_size {packet_size}")
    auto = r.rto == "auto"
    return {"receiver": traffic.receiver, "cc": traffic.cc, "mtu": mtu, "msg_bytes": r.message_size,
            "entropy": r.entropy, "entropy_values": r.values, "rto_s": rto, "rto_auto": auto,
            # ACK requests and a paced sender's look at its ACKs: at least every RTO/8, and with auto every
            # RTO_FLOOR_S/8 (they keep the CC's view fresh, which the fabric's worst queueing says nothing of)
            "ack_every_s": (min(rto, RTO_FLOOR_S) if auto else rto) / 8,
            "ext": roce_ext(traffic),
            "penalty_decay_s": r.penalty_decay / 1e9 if r.penalty_decay is not None else None,
            "reorder_window": r.reorder_window,
            "reorder_time_s": r.reorder_time / 1e9 if r.reorder_time is not None else rto / 4,
            "drop_prob": r.drop_prob, "ce_prob": r.ce_prob, "batch": r.batch, "line_bps": line,
            "cnp_interval_s": params.cnp_interval_s, "dcqcn": params.to_dict(),
            "cnp": cc is not None and cc.cnp,        # receivers send CNPs for CE-marked packets
            # hpcc: the hop records an INT stack has room for (Scenario.host_int_hops; the host links carry them)
            "int_hops": spec.path_switches if traffic.cc == "hpcc" else 0,
            **_cc_params(traffic, topo, packet_size, mtu)}


def _cc_params(traffic, topo, packet_size: int, mtu: int) -> dict:
    """``cc_params``: {family: scaled params dict} of the CC families ``traffic.cc`` uses (roce/cc/), each with
    the base RTT of ``traffic.<cc>.base_rtt`` or estimated from the longest host-to-host path."""
    from .roce import cc as roce_cc
    cc = roce_cc.maybe_cc(traffic.cc)
    if cc is None or traffic.cc == "dcqcn":          # DCQCN's parameters travel as ``dcqcn`` (above)
        return {}
    spec = topo.spec
    fabric = 2 * max(0, len(topo.tiers) - 1)
    rates = [spec.host_link.rate] * 2 + [spec.fabric_link.rate] * fabric
    delay = (2 * spec.host_link.delay + fabric * spec.fabric_link.delay) / 1e9
    cfg = traffic.cc_config
    given = getattr(cfg, "base_rtt", None)
    rtt = given / 1e9 if given else roce_cc.estimate_base_rtt(rates, packet_size, delay)
    scaled = cc.scale(spec.host_link.rate, rtt, cfg, mtu)
    return {"cc_params": scaled if len(cc.sections) > 1 else {traffic.cc: scaled}}


def poisson_arrivals(traffic, topo, rng: random.Random, duration_s: float) -> list[tuple[float, str, str, int]]:
    """(start_s, src, dst, size) of every flow of pattern ``poisson``, by start time. Each host's arrivals are
    drawn in host order, so a seed always gives the same flows."""
    from .sizes import resolve
    cdf = resolve(traffic.size_dist)
    start = traffic.start / 1e9
    window = (traffic.arrival_window / 1e9 if traffic.arrival_window is not None
              else (duration_s - start) / 2)
    hosts = list(topo.hosts)
    if len(hosts) < 2:
        raise ValueError("pattern 'poisson' needs at least two hosts")
    per_host = traffic.load * topo.spec.host_link.rate / 8 / cdf.mean()      # flows per second
    out = []
    for h in hosts:
        others = [x for x in hosts if x != h]
        t = start
        while (t := t + rng.expovariate(per_host)) < start + window:
            out.append((t, h, rng.choice(others), cdf.sample(rng)))
    out.sort()
    return out


def _sports(traffic, n: int, dports: list[int], rng: random.Random) -> list[int]:
    """Source ports of ``n`` flows by ``traffic.sport`` (module docstring)."""
    if isinstance(traffic.sport, int) and not isinstance(traffic.sport, bool):
        return [traffic.sport] * n
    if traffic.sport == "sequential":
        if traffic.sport_base + n - 1 > SPORT_MAX:
            raise ValueError(f"sport sequential: {n} flows from port {traffic.sport_base} exceed {SPORT_MAX}")
        return [traffic.sport_base + i for i in range(n)]
    if traffic.sport == "random":
        pool = [p for p in range(traffic.sport_base, SPORT_MAX + 1) if p not in set(dports)]
        if n > len(pool):
            raise ValueError(f"sport random: {n} flows need distinct ports but only {len(pool)} exist "
                             f"from {traffic.sport_base} to {SPORT_MAX}")
        return rng.sample(pool, n)
    raise ValueError(f"unknown sport mode {traffic.sport!r}")


def plan(traffic, topo, seed: int, duration_s: float) -> list[Flow]:
    """The flows a ``TrafficSpec`` asks for on ``topo``, reproducibly for ``seed``."""
    name, engine = _engine(traffic)
    opts = roce_opts(traffic, topo) if name == "roce" else None
    rng = random.Random(seed)
    if traffic.pattern == "poisson":
        base_dport = engine.dport if engine.dport is not None else traffic.dport
        if isinstance(traffic.sport, int) and not isinstance(traffic.sport, bool):
            raise ValueError("sport: pattern 'poisson' needs distinct source ports (random or sequential)")
        arrivals = poisson_arrivals(traffic, topo, rng, duration_s)
        sports = _sports(traffic, len(arrivals), [base_dport], rng)
        return [Flow(flow_id=i, src=src, dst=dst, src_addr=topo.address(src), dst_addr=topo.address(dst),
                     sport=sports[i], dport=base_dport, proto=engine.proto, size_bytes=size, rate_bps=traffic.rate,
                     start_s=t, engine=name, opts=opts, dscp=traffic.wire_dscp, ecn=traffic.ecn)
                for i, (t, src, dst, size) in enumerate(arrivals)]
    pairs = pairs_for(traffic, topo, rng)
    rails = getattr(topo.spec, "rails", 1)
    shift = getattr(traffic, "rail_shift", 0)
    k_per_pair = traffic.flows_per_pair
    n = len(pairs) * k_per_pair
    start_s = traffic.start / 1e9
    if start_s >= duration_s:
        raise ValueError(f"traffic.start ({start_s:g} s) is not before the end of the run ({duration_s:g} s)")

    fixed = isinstance(traffic.sport, int) and not isinstance(traffic.sport, bool)
    base_dport = engine.dport if engine.dport is not None else traffic.dport
    dports = ([base_dport + k for k in range(k_per_pair)] if fixed else [base_dport] * k_per_pair)
    if max(dports) > SPORT_MAX:
        raise ValueError(f"dport {base_dport} + {k_per_pair - 1} flows per pair exceeds {SPORT_MAX}")
    sports = _sports(traffic, n, dports, rng)

    flows = []
    for p, (src, dst) in enumerate(pairs):
        for k in range(k_per_pair):
            i = p * k_per_pair + k
            rail = k % rails
            to = (rail + shift) % rails
            flows.append(Flow(flow_id=i, src=src, dst=dst, src_addr=topo.address(src, rail),
                              dst_addr=topo.address(dst, to), sport=sports[i], dport=dports[k],
                              proto=engine.proto, size_bytes=traffic.flow_size, rate_bps=traffic.rate,
                              start_s=start_s, rail=rail, engine=name, opts=opts,
                              dscp=traffic.wire_dscp, ecn=traffic.ecn, dst_rail=to if to != rail else None))
    return flows


def offered_mbps(flows: list[Flow], host_rate_bps: int, duration_s: float) -> float:
    """Mean load the flows offer over the run, in Mbit/s: each flow at its rate (or the host link rate), for the
    time from its start to the end of the run, no more than its size; flows leaving a host on one rail share that
    NIC's rate."""
    per_nic: dict[tuple[str, int], float] = {}
    for f in flows:
        window = max(0.0, duration_s - f.start_s)
        rate = f.rate_bps if f.rate_bps else host_rate_bps
        bits = rate * window
        if f.size_bytes is not None:
            bits = min(bits, f.size_bytes * 8)
        key = (f.src, f.rail)
        per_nic[key] = per_nic.get(key, 0.0) + bits
    total = sum(min(bits, host_rate_bps * duration_s) for bits in per_nic.values())
    return total / duration_s / 1e6 if duration_s > 0 else 0.0
