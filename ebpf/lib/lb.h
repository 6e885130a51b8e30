/* Choosing a next hop among a group's n ports: the dispatch by the switch's load-balancing mode to the mode's
 * header under lb/ (one signature for all: lb/choose.h), and the failover to a live port when the chosen one
 * has lost its link.
 *
 * Two dispatch points, because adaptive routing and DLB read every candidate's state and so run in a stage of
 * their own (verifier budget): lb_choose in the entry program (ecmp, flowlet, spray, wcmp, plugin) and
 * lb_stage_choose in the adaptive stage (adaptive, dlb). */
#ifndef FTB_LB_H
#define FTB_LB_H

#include "maps.h"
#include "fib.h"
#include "hash.h"
#include "parse.h"
#include "flow_state.h"
#include "../lb/choose.h"
#include "../lb/ecmp.h"
#include "../lb/flowlet.h"
#include "../lb/spray.h"
#include "../lb/wcmp.h"
#include "../lb/adaptive.h"
#include "../lb/dlb.h"
#include "../lb/plugin.h"

/* The slot a packet of flow `p` takes in group `g` by the switch's mode (the entry program's modes); `*fsp` gets
 * the flow's state where the switch keeps one (the caller counts the packet there once the port is known to be
 * up: lb_count). MAX_NH: a plugin gave no valid slot.
 * Slots are __u64: with 32-bit values clang bounds-checks one zero-extended copy and indexes with another,
 * which the verifier cannot follow. */
FTB_ALWAYS_INLINE __u64 lb_choose(__u32 sw, const struct nh_group *g, const struct pkt *p, struct flow_state **fsp)
{
	struct lb_args a = {};
	struct sw_config *cfg;
	struct flow_state *fs;
	__u32 n = g->n, mode;
	__u64 slot;

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

	a.cfg = cfg;
	a.g = g;
	a.p = p;
	a.fs = fs;
	a.prio = LB_PRIO_UNSET;
	a.sw = sw;
	a.n = n;
	if (mode == MODE_SPRAY) {
		slot = lb_spray_choose(&a);
	} else if (mode == MODE_WCMP) {
		slot = lb_wcmp_choose(&a);
	} else if (mode == MODE_FLOWLET) {
		slot = lb_flowlet_choose(&a);
#ifdef FTB_PLUGIN
	} else if (mode == MODE_PLUGIN) {
		slot = ftb_plugin_choose(&a);
		ftb_opaque(slot);
		if (slot >= n)
			return MAX_NH;
#endif
	} else {
		slot = lb_ecmp_choose(&a);
	}
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		slot = 0;
	return slot;
}

/* The adaptive stage's choice for a packet of flow `p` at switch `sw` among group `g` (adaptive routing or DLB,
 * lb/adaptive.h, lb/dlb.h). Counts the packet against its slot in the flow's path counters, as lb_choose's
 * caller does; MAX_NH when every candidate has lost its link. */
FTB_ALWAYS_INLINE __u64 lb_stage_choose(const struct sw_config *cfg, __u32 sw, const struct nh_group *g,
					const struct pkt *p, __u64 prio, __u32 len)
{
	struct lb_args a = {};
	__u32 n = g->n < MAX_NH ? g->n : MAX_NH;
	struct flow_state *fs;
	__u64 now = bpf_ktime_get_ns(), slot;

	if (n <= 1)
		return 0;
	fs = flow_state_of(sw, p);
	a.cfg = cfg;
	a.g = g;
	a.p = p;
	a.fs = fs;
	a.now = now;
	a.prio = prio;
	a.sw = sw;
	a.n = n;
	if (cfg->mode == MODE_DLB)
		slot = lb_dlb_choose(&a);
	else
		slot = lb_adaptive_choose(&a);
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		slot = 0;
	if (port_is_down(g->ports[slot]))
		return MAX_NH;
	if (fs) {
		fs->slot = slot;
		fs->last_ns = now;
		__sync_fetch_and_add(&fs->pkts[slot], 1);
		__sync_fetch_and_add(&fs->bytes, len);
	}
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
	/* not unrolled, and the index checked where it is used (as in lb/adaptive.h: clang's rewritten loops can
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
