/* Flow hash: MurmurHash3 (x86, 32-bit) over four words. Mirrored exactly by testbed/datapath/hashing.py. */
#ifndef FTB_HASH_H
#define FTB_HASH_H

#include "common.h"

FTB_ALWAYS_INLINE __u32 rotl32(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

FTB_ALWAYS_INLINE __u32 fmix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

FTB_ALWAYS_INLINE __u32 murmur3_round(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

/* Words in host byte order: saddr, daddr, sport << 16 | dport, proto. */
FTB_ALWAYS_INLINE __u32 flow_hash(__u32 seed, __u32 saddr, __u32 daddr, __u16 sport, __u16 dport, __u8 proto)
{
	__u32 h = seed;
	h = murmur3_round(h, saddr);
	h = murmur3_round(h, daddr);
	h = murmur3_round(h, ((__u32)sport << 16) | dport);
	h = murmur3_round(h, proto);
	return fmix32(h ^ 16);
}

/* What a switch's flow hash covers (sw_config.hash_fields; scenario switch.hash_fields). */
#define HASH_SRC_IP  0x01
#define HASH_DST_IP  0x02
#define HASH_SPORT   0x04
#define HASH_DPORT   0x08
#define HASH_PROTO   0x10
#define HASH_ROCE_QP 0x20
#define HASH_5TUPLE  0x1f

/* The flow hash of a parsed packet over the switch's fields: fields left out count as 0, the RoCE destination QP
 * (a field some switches add for RoCEv2, whose UDP source port may carry no entropy) enters through the seed.
 * With the 5-tuple it is flow_hash exactly. Mirrored by testbed/datapath/hashing.py (pkt_hash). */
FTB_ALWAYS_INLINE __u32 pkt_hash(__u32 seed, __u32 fields, const struct pkt *p)
{
	__u32 f = fields ? fields : HASH_5TUPLE;

	if (f & HASH_ROCE_QP)
		seed ^= p->dqp * 0x9e3779b1u;
	return flow_hash(seed, f & HASH_SRC_IP ? ftb_ntohl(p->saddr) : 0, f & HASH_DST_IP ? ftb_ntohl(p->daddr) : 0,
			 f & HASH_SPORT ? p->sport : 0, f & HASH_DPORT ? p->dport : 0, f & HASH_PROTO ? p->proto : 0);
}

/* A 32-bit hash or random number → slot 0..n-1 (multiply-shift: even, no division). */
FTB_ALWAYS_INLINE __u32 pick_slot(__u32 r, __u32 n)
{
	return (__u32)(((__u64)r * n) >> 32);
}

#endif
