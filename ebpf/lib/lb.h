/* Choosing a next hop among a group's n ports: ECMP hash, flowlet switching, packet spraying (adaptive routing,
 * which reads queue state, is a stage of its own: lib/adaptive.h).
 *
 * At switches with a choice (n > 1) every flow also gets an LRU entry in `flows`: flowlet state and packet
 * counts per next-hop slot, which tell how many paths a flow used and in what ratio. */
#ifndef FTB_LB_H
#define FTB_LB_H

#include "maps.h"
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

/* Slots are __u64: with 32-bit values clang bounds-checks one zero-extended copy and indexes with another,
 * which the verifier cannot follow. */
FTB_ALWAYS_INLINE __u64 lb_choose(__u32 sw, const struct nh_group *g, const struct pkt *p)
{
	struct sw_config *cfg;
	struct flow_state *fs;
	__u32 n = g->n, mode, *rr;
	__u64 slot;
	__u64 now;

	if (n > MAX_NH)
		n = MAX_NH;
	if (n <= 1)
		return 0;
	cfg = sw_config.lookup(&sw);
	if (!cfg)
		return 0;
	mode = cfg->mode;

	fs = flow_state_of(sw, p);

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
	} else if (mode == MODE_FLOWLET && fs) {
		/* A new path only after an idle gap longer than the timeout: never reorders within a burst. */
		now = bpf_ktime_get_ns();
		if (fs->last_ns == 0 || now - fs->last_ns > cfg->flowlet_timeout_ns || fs->slot >= n)
			fs->slot = pick_slot(bpf_get_prandom_u32(), n);
		fs->last_ns = now;
		slot = fs->slot;
	} else {
		slot = pick_slot(flow_hash(cfg->seed, ftb_ntohl(p->saddr), ftb_ntohl(p->daddr), p->sport, p->dport,
					   p->proto), n);
	}
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		slot = 0;
	if (fs)
		__sync_fetch_and_add(&fs->pkts[slot], 1);
	return slot;
}

#endif
