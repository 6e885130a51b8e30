"""Pure tests of the Python mirror of the datapath's flow hash (no kernel needed)."""
import collections
import random

from testbed.datapath import hashing


def test_murmur3_reference_vectors():
    # Published MurmurHash3_x86_32 vectors (bytes as little-endian 32-bit words).
    assert hashing.murmur3_words(0, []) == 0
    assert hashing.murmur3_words(1, []) == 0x514E28B7
    assert hashing.murmur3_words(0, [0]) == 0x2362F9DE
    assert hashing.murmur3_words(0, [0xFFFFFFFF]) == 0x76293B50
    assert hashing.murmur3_words(0, [0x87654321]) == 0xF55B516B
    assert hashing.murmur3_words(0x5082EDEE, [0x87654321]) == 0x2362F9DE


def test_addresses_as_text_or_int():
    a = hashing.flow_hash(7, "198.18.0.1", "198.18.1.2", 20000, 5001, 17)
    b = hashing.flow_hash(7, 0xC6120001, 0xC6120102, 20000, 5001, 17)
    assert a == b


def test_every_field_matters():
    base = ("198.18.0.1", "198.18.1.2", 20000, 5001, 17)
    h0 = hashing.flow_hash(1, *base)
    for i, alt in enumerate(("198.18.0.2", "198.18.1.3", 20001, 5002, 6)):
        t = list(base)
        t[i] = alt
        assert hashing.flow_hash(1, *t) != h0
    assert hashing.flow_hash(2, *base) != h0


def test_pick_in_range_and_even():
    rng = random.Random(1)
    for n in (1, 2, 3, 4, 7, 16, 64):
        counts = collections.Counter(hashing.pick(rng.getrandbits(32), n) for _ in range(4000))
        assert set(counts) <= set(range(n))
    assert hashing.pick(0, 4) == 0 and hashing.pick(0xFFFFFFFF, 4) == 3


def test_ecmp_spreads_consecutive_source_ports():
    seed = hashing.switch_seed(1, 0)
    counts = collections.Counter(hashing.ecmp_index(seed, "198.18.0.1", "198.18.1.1", sp, 4791, 17, 4)
                                 for sp in range(20000, 24000))
    assert len(counts) == 4
    assert all(900 <= c <= 1100 for c in counts.values()), counts


def test_switch_seeds_differ_and_decorrelate():
    seeds = [hashing.switch_seed(1, i) for i in range(64)]
    assert len(set(seeds)) == 64
    assert hashing.switch_seed(1, 0) != hashing.switch_seed(2, 0)
    a, b = seeds[0], seeds[1]
    same = sum(hashing.ecmp_index(a, "198.18.0.1", "198.18.1.1", sp, 5001, 17, 2)
               == hashing.ecmp_index(b, "198.18.0.1", "198.18.1.1", sp, 5001, 17, 2) for sp in range(2000))
    assert 800 <= same <= 1200       # independent choices agree half the time; polarised ones always
