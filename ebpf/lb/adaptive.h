/* Adaptive routing (InfiniBand AR / dynamic load balancing style): among the egress ports a group allows, take
 * the least loaded one — by how long the queue the packet would join needs to drain (the queue model), by how
 * busy the port was recently, or both; all in ns, so ports of different rates compare fairly — per packet or per
 * flowlet, ties broken at random. Runs in the adaptive stage (a program of its own: reading every candidate's
 * state exceeded the verifier's budget inside the entry program); the entry program keeps a flowlet's port
 * itself (ar_kept_slot). DLB (lb/dlb.h) is this scan with another cost. */
#ifndef FTB_LB_ADAPTIVE_H
#define FTB_LB_ADAPTIVE_H

#include "choose.h"

/* DLB's cost of a port (lb/dlb.h): the scan below serves both modes, each with its own cost. */
FTB_ALWAYS_INLINE __u64 dlb_cost(const struct sw_config *cfg, __u32 port, __u64 prio, __u64 now, __u32 r);

/* What ar_choose minimises for a port. Adaptive routing: the time the port needs (queue drain, recent load or
 * their sum, ns). DLB (`dlb`, a constant at each call): the quality band in the high 32 bits and, below it, a
 * score drawn for this decision (dlb_cost). */
FTB_ALWAYS_INLINE __u64 ar_cost(const struct sw_config *cfg, __u32 port, __u64 prio, __u64 now, __u32 r, int dlb)
{
	__u64 c = 0;

	if (dlb)
		return dlb_cost(cfg, port, prio, now, r);
	if (cfg->ar_metric != AR_LOAD)
		c += ar_queue_ns(port, prio, now);
	if (cfg->ar_metric != AR_QUEUE)
		c += ar_load_ns(port, now, cfg->load_window_ns);
	return c;
}

/* The slot of the least costly port of group `g` (n ports; ar_cost: adaptive routing's least loaded, DLB's best
 * band): the candidates are AR_CANDIDATES consecutive slots (all of them in a group no larger) from a random
 * start, the first minimum wins, so equal costs are chosen at random. Two passes: the
 * costs go to per-CPU scratch first, then the minimum is taken from there — the verifier then carries no
 * branch-dependent values from one iteration to the next (one pass over 16 ports exceeded its 1M-instruction
 * budget). */
FTB_ALWAYS_INLINE __u64 ar_choose(const struct sw_config *cfg, const struct nh_group *g, __u32 n, __u64 prio,
				  __u64 now, int dlb)
{
	__u32 zero = 0, r = bpf_get_prandom_u32();
	struct ar_scratch *sc = ar_scratch.lookup(&zero);
	__u64 best = 0, best_cost = ~0ULL, start = pick_slot(r, n), slot;

	if (!sc)
		return start;
	/* not unrolled, and each index checked where it is used: clang's rewritten loops (an unrolled remainder,
	 * a `!=` exit test on Debian 6.1's headers) index the array in ways the verifier cannot bound */
#pragma clang loop unroll(disable)
	for (__u64 i = 0; i < AR_CANDIDATES; i++) {
		__u64 c = i;

		ftb_opaque(c);                /* the verifier must see the bound checked on the index it uses */
		if (c >= n || c >= AR_CANDIDATES)
			break;
		slot = start + c;
		if (slot >= n)
			slot -= n;
		ftb_opaque(slot);
		if (slot >= MAX_NH)
			break;
		/* a port that lost its link costs the most: never taken while a live candidate remains */
		sc->cost[c] = port_is_down(g->ports[slot]) ? ~0ULL : ar_cost(cfg, g->ports[slot], prio, now, r, dlb);
	}
#pragma clang loop unroll(disable)
	for (__u64 i = 0; i < AR_CANDIDATES; i++) {
		__u64 c = i;

		ftb_opaque(c);
		if (c >= n || c >= AR_CANDIDATES)
			break;
		if (sc->cost[c] < best_cost) {
			best_cost = sc->cost[c];
			best = c;
		}
	}
	slot = start + best;
	return slot >= n ? slot - n : slot;
}

/* With granularity flowlet (DLB always): the slot flow state `fs` keeps at `now` — its port while the flow's gap
 * since its last packet stays within the flowlet timeout (DLB: the inactivity) and the port keeps its link —
 * or MAX_NH when a new choice is due. */
FTB_ALWAYS_INLINE __u64 ar_flowlet_slot(const struct sw_config *cfg, const struct nh_group *g, __u32 n,
					const struct flow_state *fs, __u64 now)
{
	__u64 slot;

	if (cfg->ar_granularity != AR_FLOWLET || !fs || !fs->last_ns || now - fs->last_ns > cfg->flowlet_timeout_ns)
		return MAX_NH;
	slot = fs->slot;
	ftb_opaque(slot);
	if (slot >= n || slot >= MAX_NH || port_is_down(g->ports[slot]))
		return MAX_NH;
	return slot;
}

/* The entry program's shortcut for a packet inside a flowlet (granularity flowlet, or DLB): the slot it keeps
 * (ar_flowlet_slot), with the flow's time stamp advanced — the caller counts the packet (lb_count) and sends it
 * without the adaptive stage (two tail calls, a second FIB and flow lookup: DLB cost 1.22× ECMP per packet
 * through the stage, 1.10× with this shortcut, on packets a full queue drops); MAX_NH when the stage has to
 * choose. `*fsp` gets the flow state where it was looked up. */
FTB_ALWAYS_INLINE __u64 ar_kept_slot(const struct sw_config *cfg, __u32 sw, const struct nh_group *g,
				     const struct pkt *p, struct flow_state **fsp)
{
	__u32 n = g->n < MAX_NH ? g->n : MAX_NH;
	struct flow_state *fs;
	__u64 now, slot;

	*fsp = 0;
	if (cfg->ar_granularity != AR_FLOWLET || !cfg->flowlet_timeout_ns || n <= 1)
		return MAX_NH;              /* (a timeout of 0 makes every packet a new flowlet) */
	now = bpf_ktime_get_ns();
	fs = flow_state_of(sw, p);
	*fsp = fs;
	slot = ar_flowlet_slot(cfg, g, n, fs, now);
	if (slot < MAX_NH && fs)
		fs->last_ns = now;
	return slot;
}

/* The choice of adaptive routing (`dlb` 0) or DLB (`dlb` 1): per packet or — with granularity flowlet — at a
 * flowlet's start only (the port is kept while the flow's gaps stay short and it keeps its link). */
FTB_ALWAYS_INLINE __u64 ar_mode_choose(struct lb_args *a, int dlb)
{
	__u64 now = lb_now(a), slot;

	slot = ar_flowlet_slot(a->cfg, a->g, a->n, a->fs, now);   /* the entry program sends most of these itself */
	if (slot >= MAX_NH) {
		slot = ar_choose(a->cfg, a->g, a->n, lb_prio(a), now, dlb);
		if (a->fs && a->cfg->ar_granularity == AR_FLOWLET)
			a->fs->flowlets++;
	}
	return slot;
}

FTB_ALWAYS_INLINE __u64 lb_adaptive_choose(struct lb_args *a)
{
	return ar_mode_choose(a, 0);
}

#endif
