/* Flowlet switching: a fresh random member when the flow's previous packet at this switch is older than the
 * flowlet timeout (or on its first packet); otherwise the current one. A new path only after an idle gap longer
 * than the timeout: it never reorders within a burst. */
#ifndef FTB_LB_FLOWLET_H
#define FTB_LB_FLOWLET_H

#include "choose.h"
#include "ecmp.h"

FTB_ALWAYS_INLINE __u64 lb_flowlet_choose(struct lb_args *a)
{
	struct flow_state *fs = a->fs;
	__u64 now;

	if (!fs)
		return lb_ecmp_choose(a);     /* no flow state (full table): hashed, so the flow still keeps a path */
	now = lb_now(a);
	if (fs->last_ns == 0 || now - fs->last_ns > a->cfg->flowlet_timeout_ns || fs->slot >= a->n) {
		fs->slot = pick_slot(bpf_get_prandom_u32(), a->n);
		fs->flowlets++;
	}
	fs->last_ns = now;
	return fs->slot;
}

#endif
