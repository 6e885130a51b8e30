"""Exact Python mirror of the ECMP hash in ebpf/lib/hash.h, so tests and analyses can predict path choices.

The flow hash is MurmurHash3 (x86, 32-bit) of four 32-bit words — saddr, daddr, sport<<16|dport, proto, all in
host byte order — with a per-switch seed. Murmur3's finaliser mixes every input bit into every output bit, so
neighbouring source ports spread evenly. The per-switch seed mixes the scenario's hash_seed with the switch id:
if every stage used the same function, a leaf's choice would correlate with the spine's (polarisation).
The index is chosen by multiply-shift (hash * n) >> 32, which is even over n paths and needs no division.
"""
from __future__ import annotations

import ipaddress

M32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_GOLDEN = 0x9E3779B9


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def fmix32(h: int) -> int:
    """Murmur3's finaliser: a bijective avalanche of 32 bits."""
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    h ^= h >> 16
    return h


def murmur3_words(seed: int, words) -> int:
    """MurmurHash3_x86_32 of a sequence of 32-bit little-endian words."""
    h = seed & M32
    n = 0
    for k in words:
        k = (k & M32) * _C1 & M32
        k = _rotl(k, 15) * _C2 & M32
        h ^= k
        h = (_rotl(h, 13) * 5 + 0xE6546B64) & M32
        n += 4
    return fmix32(h ^ n)


def switch_seed(hash_seed: int, switch_id: int) -> int:
    """The seed one switch hashes with (what the datapath stores in its config map)."""
    return fmix32((hash_seed & M32) ^ fmix32((switch_id * _GOLDEN + 1) & M32))


def _addr(a) -> int:
    return int(ipaddress.IPv4Address(a)) if not isinstance(a, int) else a


def flow_hash(seed: int, saddr, daddr, sport: int, dport: int, proto: int) -> int:
    """Hash of a 5-tuple; addresses as dotted strings or host-order ints, ``seed`` as from switch_seed()."""
    return murmur3_words(seed, (_addr(saddr), _addr(daddr), ((sport & 0xFFFF) << 16) | (dport & 0xFFFF),
                                proto & 0xFF))


HASH_FIELDS = {"src_ip": 0x01, "dst_ip": 0x02, "sport": 0x04, "dport": 0x08, "proto": 0x10, "roce_qp": 0x20}


def hash_mask(fields) -> int:
    """The sw_config.hash_fields bits of a list of field names (switch.hash_fields)."""
    m = 0
    for f in fields:
        m |= HASH_FIELDS[f]
    return m


def pkt_hash(seed: int, fields: int, saddr, daddr, sport: int, dport: int, proto: int, dqp: int = 0) -> int:
    """The switch program's pkt_hash: the flow hash over the fields in ``fields`` (hash_mask; 0 = the 5-tuple),
    the RoCE destination QP mixed into the seed."""
    f = fields or 0x1F
    if f & 0x20:
        seed ^= (dqp * 0x9E3779B1) & M32
    return flow_hash(seed, _addr(saddr) if f & 0x01 else 0, _addr(daddr) if f & 0x02 else 0,
                     sport if f & 0x04 else 0, dport if f & 0x08 else 0, proto if f & 0x10 else 0)


def pick(h: int, n: int) -> int:
    """Map a 32-bit hash (or random number) to a slot in 0..n-1, as the datapath does."""
    return (h * n) >> 32


def ecmp_index(seed: int, saddr, daddr, sport: int, dport: int, proto: int, n: int) -> int:
    """The next-hop slot (0..n-1) ECMP chooses at a switch whose seed is ``seed``."""
    return pick(flow_hash(seed, saddr, daddr, sport, dport, proto), n)


def failover_index(h: int, ports, down) -> int | None:
    """The slot local fast failover takes when a flow's chosen port has lost its link: of the group's live
    ports, the one with the highest fmix32(h ^ port · golden) (rendezvous hashing, as ebpf/lib/lb.h
    failover_slot); None when every port is down. ``h``: the flow hash (flow_hash) or, spraying, a random
    number."""
    best, best_score = None, 0
    for i, port in enumerate(ports):
        if port in down:
            continue
        score = fmix32((h ^ (port * _GOLDEN)) & M32) + 1
        if score > best_score:
            best, best_score = i, score
    return best


def wcmp_table(weights, slots: int) -> list[int]:
    """The weighted table of a WCMP group (nh_group.wslot): member indexes, each repeated in proportion to its
    weight, spread out (smooth weighted round robin order) so that neighbouring slots differ. Exact
    proportions when the weights add up to at most ``slots`` (the table is then the largest multiple of their
    sum that fits); else largest-remainder apportionment, every member keeping at least one slot."""
    total = sum(weights)
    n = len(weights)
    if n == 0 or total <= 0:
        return []
    if total <= slots:
        counts = [w * (slots // total) for w in weights]
    else:
        quota = [w * slots / total for w in weights]
        counts = [max(1, int(q)) for q in quota]
        for i in sorted(range(n), key=lambda i: quota[i] - int(quota[i]), reverse=True):
            if sum(counts) >= slots:
                break
            counts[i] += 1
        while sum(counts) > slots:                  # the minimum of one slot each overshot: take from the largest
            counts[max(range(n), key=lambda i: counts[i])] -= 1
    size = sum(counts)
    current, table = [0] * n, []
    for _ in range(size):                           # smooth weighted round robin over the counts
        for i in range(n):
            current[i] += counts[i]
        best = max(range(n), key=lambda i: current[i])
        current[best] -= size
        table.append(best)
    return table


def wcmp_index(seed: int, saddr, daddr, sport: int, dport: int, proto: int, table) -> int:
    """The member (index into the group's ports) WCMP picks per flow: the flow hash into the weighted table."""
    return table[pick(flow_hash(seed, saddr, daddr, sport, dport, proto), len(table))]


def dlb_level(ns: int, full: int, bands: int) -> int:
    """A DLB metric quantised to 0 .. bands − 1: floor(ns / full × bands), the top level from ``full`` on; 0
    without a scale (ebpf/lb/dlb.h dlb_level)."""
    if not full:
        return 0
    return bands - 1 if ns >= full else ns * bands // full


def dlb_band(load_ns: int, load_window_ns: int, queue_ns: int, buffer_ns: int, bands: int, load_weight: int,
             queue_weight: int) -> int:
    """The quality band of a port under DLB (0 best), exactly as ebpf/lb/dlb.h dlb_band: its load (ns busy
    over the load window) and queue (drain time, ns, against its buffer's drain time ``buffer_ns``) quantised to
    levels, their weighted mean rounded half up."""
    w = load_weight + queue_weight
    if not w:
        return 0
    s = (load_weight * dlb_level(load_ns, load_window_ns, bands) if load_weight else 0) \
        + (queue_weight * dlb_level(queue_ns, buffer_ns, bands) if queue_weight else 0)
    return min((2 * s + w) // (2 * w), bands - 1)
