/* Packet spraying: every packet on its own member, random (bpf_get_prandom_u32) or round robin (a per-switch
 * counter read and then advanced atomically). */
#ifndef FTB_LB_SPRAY_H
#define FTB_LB_SPRAY_H

#include "choose.h"

FTB_ALWAYS_INLINE __u64 lb_spray_choose(struct lb_args *a)
{
	__u32 sw = a->sw, *rr;
	__u64 slot = 0;

	if (a->cfg->spray == SPRAY_ROUND_ROBIN) {
		/* BCC's LLVM targets BPF v1/v2, which has no fetch-and-add: read, then add atomically.
		 * Two CPUs racing may pick the same slot; the counter itself never loses a step. */
		rr = rr_next.lookup(&sw);
		if (rr) {
			slot = *(volatile __u32 *)rr % a->n;
			__sync_fetch_and_add(rr, 1);
		}
		return slot;
	}
	return pick_slot(bpf_get_prandom_u32(), a->n);
}

#endif
