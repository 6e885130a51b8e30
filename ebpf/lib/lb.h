/* Choosing a next hop among a group's n ports: ECMP hash, flowlet switching, packet spraying (adaptive routing,
 * which reads queue state, is a stage of its own: lib/adaptive.h), and the failover to a live port when the
 * chosen one has lost its link.
 *
 * At switches with a choice (n > 1) every flow also gets an LRU entry in `flows`: flowlet state and packet
 * counts per next-hop slot, which tell how many paths a flow used and in what ratio (under SM routing, with
 * sw_config.track, on single-port groups too). */
#ifndef FTB_LB_H
#define FTB_LB_H

#include "maps.h"
#include "fib.h"
#include "hash.h"
#include "parse.h"

FTB_ALWAYS_INLINE struct flow_state *flow_state_get(struct flow_key *k)
{
	struct flow_state *fs = flows.lookup(k);
	if (!fs) {
		__u32 zero_key = 0;
		struct flow_state *zero = flow_zero.lookup(&zero_key);
		if (!zero)
			return 0;
		flows.update(k, zero);
		fs = flows.lookup(k);
	}
	return fs;
}

/* The flow state of the packet's 5-tuple at switch `sw` (created zeroed). */
FTB_ALWAYS_INLINE struct flow_state *flow_state_of(__u32 sw, const struct pkt *p)
{
	struct flow_key k = {};

	k.switch_id = sw;
	k.saddr = p->saddr;
	k.daddr = p->daddr;
	k.sport = p->sport;
	k.dport = p->dport;
	k.proto = p->proto;
	return flow_state_get(&k);
}

/* Count a packet against the slot it left through, in its flow's path counters. */
FTB_ALWAYS_INLINE void lb_count(struct flow_state *fs, __u64 slot, __u32 len)
{
	ftb_opaque(slot);
	if (fs && slot < MAX_NH) {
		__sync_fetch_and_add(&fs->pkts[slot], 1);
		__sync_fetch_and_add(&fs->bytes, len);
	}
}

/* WCMP: a member of group `g` drawn from its weighted table — by the flow's hash, per flowlet (a new draw after
 * an idle gap above the flowlet timeout) or per packet — so each member gets its weight's share of the draws. */
FTB_ALWAYS_INLINE __u64 wcmp_slot(const struct sw_config *cfg, const struct nh_group *g, const struct pkt *p,
				  struct flow_state *fs)
{
	__u32 ns = g->nslots < WCMP_SLOTS ? g->nslots : WCMP_SLOTS;
	__u64 s, now;

	if (cfg->wcmp_granularity == WCMP_PACKET) {
		s = pick_slot(bpf_get_prandom_u32(), ns);
	} else if (cfg->wcmp_granularity == WCMP_FLOWLET && fs) {
		now = bpf_ktime_get_ns();
		if (fs->last_ns == 0 || now - fs->last_ns > cfg->flowlet_timeout_ns || fs->slot >= g->n) {
			s = pick_slot(bpf_get_prandom_u32(), ns);
			ftb_opaque(s);
			fs->slot = s < WCMP_SLOTS ? g->wslot[s] : 0;
			fs->flowlets++;
		}
		fs->last_ns = now;
		return fs->slot;
	} else {
		s = pick_slot(pkt_hash(cfg->seed, cfg->hash_fields, p), ns);
	}
	ftb_opaque(s);
	return s < WCMP_SLOTS ? g->wslot[s] : 0;
}

/* The slot a packet of flow `p` takes in group `g` by the switch's mode; `*fsp` gets the flow's state where the
 * switch keeps one (the caller counts the packet there once the port is known to be up: lb_count).
 * Slots are __u64: with 32-bit values clang bounds-checks one zero-extended copy and indexes with another,
 * which the verifier cannot follow. */
FTB_ALWAYS_INLINE __u64 lb_choose(__u32 sw, const struct nh_group *g, const struct pkt *p, struct flow_state **fsp)
{
	struct sw_config *cfg;
	struct flow_state *fs;
	__u32 n = g->n, mode, *rr;
	__u64 slot;
	__u64 now;

	*fsp = 0;
	if (n > MAX_NH)
		n = MAX_NH;
	if (n == 0)
		return 0;
	cfg = sw_config.lookup(&sw);
	if (!cfg)
		return 0;
	if (n == 1 && !cfg->track)
		return 0;
	mode = cfg->mode;

	fs = flow_state_of(sw, p);
	*fsp = fs;
	if (n == 1)
		return 0;

	if (mode == MODE_SPRAY) {
		if (cfg->spray == SPRAY_ROUND_ROBIN) {
			/* BCC's LLVM targets BPF v1/v2, which has no fetch-and-add: read, then add atomically.
			 * Two CPUs racing may pick the same slot; the counter itself never loses a step. */
			rr = rr_next.lookup(&sw);
			slot = 0;
			if (rr) {
				slot = *(volatile __u32 *)rr % n;
				__sync_fetch_and_add(rr, 1);
			}
		} else {
			slot = pick_slot(bpf_get_prandom_u32(), n);
		}
	} else if (mode == MODE_WCMP && g->nslots) {
		slot = wcmp_slot(cfg, g, p, fs);
	} else if (mode == MODE_FLOWLET && fs) {
		/* A new path only after an idle gap longer than the timeout: never reorders within a burst. */
		now = bpf_ktime_get_ns();
		if (fs->last_ns == 0 || now - fs->last_ns > cfg->flowlet_timeout_ns || fs->slot >= n) {
			fs->slot = pick_slot(bpf_get_prandom_u32(), n);
			fs->flowlets++;
		}
		fs->last_ns = now;
		slot = fs->slot;
	} else {
		slot = pick_slot(pkt_hash(cfg->seed, cfg->hash_fields, p), n);
	}
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		slot = 0;
	return slot;
}

/* Local fast failover: the chosen port has lost its link, so take another live port of the group — the one
 * with the highest score fmix32(h ^ port · golden) (rendezvous hashing: a flow hash `h` keeps a flow on one
 * live port, and only the flows of the dead port move). Returns MAX_NH when no port of the group is alive.
 * The best so far lives in per-CPU scratch memory: kept in registers it would make the verifier explore every
 * combination of iterations. Mirrored by testbed/datapath/hashing.py (failover_index). */
FTB_ALWAYS_INLINE __u64 failover_slot(const struct nh_group *g, __u32 n, __u32 h)
{
	__u32 zero = 0, port;
	struct fo_scratch *sc = fo_scratch.lookup(&zero);
	__u64 score;

	if (!sc)
		return MAX_NH;
	sc->best = MAX_NH;
	sc->score = 0;
	/* not unrolled, and the index checked where it is used (as in lib/adaptive.h: clang's rewritten loops can
	 * index the array in ways the verifier cannot bound) */
#pragma clang loop unroll(disable)
	for (__u64 i = 0; i < MAX_NH; i++) {
		__u64 c = i;

		ftb_opaque(c);
		if (c >= n || c >= MAX_NH)
			break;
		port = g->ports[c];
		if (port_is_down(port))
			continue;
		score = (__u64)fmix32(h ^ (port * 0x9E3779B9u)) + 1;   /* + 1: a live port always beats "none" */
		if (score > sc->score) {
			sc->score = score;
			sc->best = c;
		}
	}
	return sc->best;
}

#endif
