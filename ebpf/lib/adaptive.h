/* Adaptive routing (InfiniBand AR / dynamic load balancing style): among the egress ports a group allows, take
 * the least loaded one — by how long the queue the packet would join needs to drain (the queue model), by how
 * busy the port was recently, or both; all in ns, so ports of different rates compare fairly — per packet or per
 * flowlet, ties broken at random. DLB (MODE_DLB, Broadcom style) is the same stage with another cost: a port's
 * quality band from its quantised load and queue (dlb_band), chosen at a flowlet's start (an idle gap above the
 * inactivity time). */
#ifndef FTB_ADAPTIVE_H
#define FTB_ADAPTIVE_H

#include "maps.h"
#include "hash.h"
#include "lb.h"

/* How long queue (port, prio) needs to send what it holds now, in ns, from the model (a racy read: a hint, not
 * accounting). Time, not bytes: on ports of different rates (a degraded link) the same bytes wait longer. */
FTB_ALWAYS_INLINE __u64 ar_queue_ns(__u32 port, __u64 prio, __u64 now)
{
	__u32 k = port * N_PRIO + prio;
	struct vqueue *q = vq.lookup(&k);
	__u64 *pa = egress_paused.lookup(&k);
	struct port_qos *pq = port_qos.lookup(&port);
	__u64 eff = now, finish, ns, held;

	if (!q)
		return 0;
	if (pa && *pa && *pa < now)
		return ~0ULL >> 2;            /* paused: it sends nothing until resumed */
	finish = *(volatile __u64 *)&q->finish;
	ns = finish > eff ? finish - eff : 0;
	held = vq_capped(*(volatile __u64 *)&q->enq, *(volatile __u64 *)&q->cap);    /* out of credit */
	if (pq && held * pq->ps_per_byte / 1000 > ns)
		ns = held * pq->ps_per_byte / 1000;
	return ns;
}

/* How long the port was busy sending over about the last load window, in ns: its decaying byte count (aged to
 * `now`) × its time per byte — its recent utilisation × the window. A racy read. */
FTB_ALWAYS_INLINE __u64 ar_load_ns(__u32 port, __u64 now, __u64 window)
{
	struct port_load *l = port_load.lookup(&port);
	struct port_qos *pq = port_qos.lookup(&port);
	__u64 b, dt;

	if (!l || !pq || !window)
		return 0;
	b = *(volatile __u64 *)&l->bytes;
	dt = now > l->last_ns ? now - l->last_ns : 0;
	if (dt >= window)
		return 0;
	return (b - b * dt / window) * pq->ps_per_byte / 1000;
}

/* Charge `len` sent bytes to the port's load: first-order decay b ← b·(1 − dt/window) + len. */
FTB_ALWAYS_INLINE void ar_load_add(__u32 port, __u64 len, __u64 now, __u64 window)
{
	struct port_load *l = port_load.lookup(&port);
	__u64 dt;

	if (!l || !window)
		return;
	bpf_spin_lock(&l->lock);
	dt = now > l->last_ns ? now - l->last_ns : 0;
	if (dt >= window)
		l->bytes = 0;
	else
		l->bytes -= l->bytes * dt / window;
	l->bytes += len;
	l->last_ns = now;
	bpf_spin_unlock(&l->lock);
}

/* A DLB metric quantised to a level 0 .. bands − 1: floor(ns / full × bands), the top level from `full` on (a
 * paused queue's huge drain time included); 0 when there is no scale (`full` 0). */
FTB_ALWAYS_INLINE __u64 dlb_level(__u64 ns, __u64 full, __u64 bands)
{
	if (!full)
		return 0;
	if (ns >= full)
		return bands - 1;
	return ns * bands / full;
}

/* DLB (Broadcom-style dynamic load balancing): the quality band of egress port `port` for a packet of priority
 * `prio`, 0 best .. bands − 1 worst. The port's recent load as a fraction of the load window (ar_load_ns /
 * window) and its queue's drain time as a fraction of the time its buffer takes to drain (ar_queue_ns /
 * (buffer × time per byte)) are each quantised to a level; the band is their weighted mean (dlb_load_weight,
 * dlb_queue_weight), rounded half up. Both are times, so a degraded port is judged against its own rate.
 * Mirrored by testbed/datapath/hashing.py (dlb_band). */
FTB_ALWAYS_INLINE __u64 dlb_band(const struct sw_config *cfg, __u32 port, __u64 prio, __u64 now)
{
	struct port_qos *pq = port_qos.lookup(&port);
	__u64 bands = cfg->dlb_bands, lw = cfg->dlb_load_weight, qw = cfg->dlb_queue_weight, sum = 0, band;

	if (bands < 2 || bands > 16)          /* the scenario refuses these; 8 keeps a bad write harmless */
		bands = 8;
	if (lw + qw == 0)
		return 0;
	if (lw)
		sum += lw * dlb_level(ar_load_ns(port, now, cfg->load_window_ns), cfg->load_window_ns, bands);
	if (qw && pq)
		sum += qw * dlb_level(ar_queue_ns(port, prio, now), pq->buffer * pq->ps_per_byte / 1000, bands);
	band = (2 * sum + lw + qw) / (2 * (lw + qw));
	return band < bands ? band : bands - 1;
}

/* What ar_choose minimises for a port. Adaptive routing: the time the port needs (queue drain, recent load or
 * their sum, ns). DLB: the quality band in the high 32 bits and, below it, a score drawn for this decision
 * (fmix32 of the decision's random number `r` and the port), so ports of the best band are chosen evenly: the
 * random start alone would favour a tied port that follows a run of worse ones. */
FTB_ALWAYS_INLINE __u64 ar_cost(const struct sw_config *cfg, __u32 port, __u64 prio, __u64 now, __u32 r)
{
	__u64 c = 0;

	if (cfg->mode == MODE_DLB)
		return (dlb_band(cfg, port, prio, now) << 32) | fmix32(r ^ (port * 0x9E3779B9u));
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
				  __u64 now)
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
		sc->cost[c] = port_is_down(g->ports[slot]) ? ~0ULL : ar_cost(cfg, g->ports[slot], prio, now, r);
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

/* The adaptive stage's choice for a packet of flow `p` at switch `sw` among group `g`: per packet, or — with
 * granularity flowlet — at a flowlet's start only (the port is kept while the flow's gaps stay short and it
 * keeps its link). Counts the packet against its slot in the flow's path counters, as lb_choose does; MAX_NH
 * when every candidate has lost its link. */
FTB_ALWAYS_INLINE __u64 ar_slot(const struct sw_config *cfg, __u32 sw, const struct nh_group *g,
				const struct pkt *p, __u64 prio, __u32 len)
{
	__u32 n = g->n < MAX_NH ? g->n : MAX_NH;
	struct flow_state *fs;
	__u64 now = bpf_ktime_get_ns(), slot;

	if (n <= 1)
		return 0;
	fs = flow_state_of(sw, p);
	slot = ar_flowlet_slot(cfg, g, n, fs, now);     /* the entry program sends most of these itself */
	if (slot >= MAX_NH) {
		slot = ar_choose(cfg, g, n, prio, now);
		if (fs && cfg->ar_granularity == AR_FLOWLET)
			fs->flowlets++;
	}
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

#endif
