/* Adaptive routing (InfiniBand AR / dynamic load balancing style): among the egress ports a group allows, take
 * the least loaded one — by how long the queue the packet would join needs to drain (the queue model), by how
 * busy the port was recently, or both; all in ns, so ports of different rates compare fairly — per packet or per
 * flowlet, ties broken at random. */
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

FTB_ALWAYS_INLINE __u64 ar_cost(const struct sw_config *cfg, __u32 port, __u64 prio, __u64 now)
{
	__u64 c = 0;

	if (cfg->ar_metric != AR_LOAD)
		c += ar_queue_ns(port, prio, now);
	if (cfg->ar_metric != AR_QUEUE)
		c += ar_load_ns(port, now, cfg->load_window_ns);
	return c;
}

/* The slot of the least loaded port of group `g` (n ports): the candidates are AR_CANDIDATES consecutive slots
 * (all of them in a group no larger) from a random start, so equal costs are chosen evenly. Two passes: the
 * costs go to per-CPU scratch first, then the minimum is taken from there — the verifier then carries no
 * branch-dependent values from one iteration to the next (one pass over 16 ports exceeded its 1M-instruction
 * budget). */
FTB_ALWAYS_INLINE __u64 ar_choose(const struct sw_config *cfg, const struct nh_group *g, __u32 n, __u64 prio,
				  __u64 now)
{
	__u32 zero = 0;
	struct ar_scratch *sc = ar_scratch.lookup(&zero);
	__u64 best = 0, best_cost = ~0ULL, start = pick_slot(bpf_get_prandom_u32(), n), slot;

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
		sc->cost[c] = port_is_down(g->ports[slot]) ? ~0ULL : ar_cost(cfg, g->ports[slot], prio, now);
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

/* The adaptive stage's choice for a packet of flow `p` at switch `sw` among group `g`: per packet, or — with
 * granularity flowlet — at a flowlet's start only (the port is kept while the flow's gaps stay short and it
 * keeps its link). Counts the packet against its slot in the flow's path counters, as lb_choose does; MAX_NH
 * when every candidate has lost its link. */
FTB_ALWAYS_INLINE __u64 ar_slot(const struct sw_config *cfg, __u32 sw, const struct nh_group *g,
				const struct pkt *p, __u64 prio)
{
	__u32 n = g->n < MAX_NH ? g->n : MAX_NH;
	struct flow_state *fs;
	__u64 now = bpf_ktime_get_ns(), slot;

	if (n <= 1)
		return 0;
	fs = flow_state_of(sw, p);
	slot = MAX_NH;
	if (cfg->ar_granularity == AR_FLOWLET && fs && fs->last_ns && now - fs->last_ns <= cfg->flowlet_timeout_ns) {
		slot = fs->slot;
		ftb_opaque(slot);
		if (slot >= n || slot >= MAX_NH || port_is_down(g->ports[slot]))
			slot = MAX_NH;
	}
	if (slot >= MAX_NH)
		slot = ar_choose(cfg, g, n, prio, now);
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		slot = 0;
	if (port_is_down(g->ports[slot]))
		return MAX_NH;
	if (fs) {
		fs->slot = slot;
		fs->last_ns = now;
		__sync_fetch_and_add(&fs->pkts[slot], 1);
	}
	return slot;
}

#endif
