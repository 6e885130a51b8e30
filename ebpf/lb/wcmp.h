/* WCMP: a member drawn from the group's weighted table (each member replicated by its weight, as switch ASICs
 * do: nh_group.wslot) — by the flow's hash, per flowlet (a new draw after an idle gap above the flowlet
 * timeout) or per packet — so each member gets its weight's share of the draws. A group without a table is
 * plain ECMP. */
#ifndef FTB_LB_WCMP_H
#define FTB_LB_WCMP_H

#include "choose.h"
#include "ecmp.h"

FTB_ALWAYS_INLINE __u64 lb_wcmp_choose(struct lb_args *a)
{
	const struct sw_config *cfg = a->cfg;
	const struct nh_group *g = a->g;
	struct flow_state *fs = a->fs;
	__u32 ns = g->nslots < WCMP_SLOTS ? g->nslots : WCMP_SLOTS;
	__u64 s, now;

	if (!g->nslots)
		return lb_ecmp_choose(a);
	if (cfg->wcmp_granularity == WCMP_PACKET) {
		s = pick_slot(bpf_get_prandom_u32(), ns);
	} else if (cfg->wcmp_granularity == WCMP_FLOWLET && fs) {
		now = lb_now(a);
		if (fs->last_ns == 0 || now - fs->last_ns > cfg->flowlet_timeout_ns || fs->slot >= g->n) {
			s = pick_slot(bpf_get_prandom_u32(), ns);
			ftb_opaque(s);
			fs->slot = s < WCMP_SLOTS ? g->wslot[s] : 0;
			fs->flowlets++;
		}
		fs->last_ns = now;
		return fs->slot;
	} else {
		s = pick_slot(lb_hash(a), ns);
	}
	ftb_opaque(s);
	return s < WCMP_SLOTS ? g->wslot[s] : 0;
}

#endif
