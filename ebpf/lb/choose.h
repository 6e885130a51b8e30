/* The one signature every load-balancing mode implements — the built-in ones (lb/<mode>.h) and a plugin
 * (switch.plugin.source, compiled in at lb/plugin.h's place):
 *
 *     __u64 lb_<mode>_choose(struct lb_args *a);      a plugin: __u64 ftb_plugin_choose(struct lb_args *a)
 *
 * Given the decision's inputs in `a` (below), return the chosen member: a slot 0 .. a->n − 1 of the group, whose
 * egress port is a->g->ports[slot]. lib/lb.h builds `a` once per decision and dispatches by sw_config.mode; the
 * caller counts the packet against the slot, and if that port has lost its link the failover stage takes
 * another (a mode may also avoid down ports itself: lb_port_down). A plugin's value ≥ a->n drops the packet
 * (counted as bad_egress). Only groups with a choice (2 ≤ n ≤ MAX_NH) reach a mode.
 *
 * Why one struct: the modes need different subsets (ECMP the hash, flowlets the flow's clock, adaptive routing
 * and DLB the candidates' queues), and what costs something per packet — the flow hash, the clock, the packet's
 * priority — is computed on first use through an accessor (lb_hash, lb_now, lb_prio) and kept, so a mode pays
 * only for what it reads (computing the hash for every mode cost spraying and flowlets 6–10 % per packet).
 * Everything is inlined: the struct lives in registers and on the stack of the calling program.
 */
#ifndef FTB_LB_CHOOSE_H
#define FTB_LB_CHOOSE_H

#include "../lib/maps.h"
#include "../lib/hash.h"
#include "../lib/fib.h"
#include "../lib/classify.h"
#include "../lib/vqueue.h"
#include "../lib/port_load.h"
#include "../lib/flow_state.h"

#define LB_PRIO_UNSET 0xffffffffffffffffULL

struct lb_args {
	const struct sw_config *cfg;  /* the switch's configuration: mode parameters, hash seed and fields,
	                               * flowlet_timeout_ns, load_window_ns (common.h struct sw_config) */
	const struct nh_group *g;     /* the candidates: g->ports[0 .. n − 1] egress ifindexes (and WCMP's
	                               * weighted table g->wslot[0 .. g->nslots − 1]) */
	const struct pkt *p;          /* the packet's parsed fields, the hash inputs: addresses (network order),
	                               * ports (host order), protocol, TOS, RoCEv2 destination QP */
	struct flow_state *fs;        /* the flow's state at this switch (`flows`: last_ns, slot, flowlets; the
	                               * caller counts packets in pkts[]), or 0 when the table is full */
	__u64 now;                    /* ns (CLOCK_MONOTONIC); 0 until read: use lb_now(a) */
	__u64 prio;                   /* the packet's priority (which of a port's queues it joins); LB_PRIO_UNSET
	                               * until read: use lb_prio(a) */
	__u32 sw;                     /* switch id (index of sw_config, qos_config, rr_next) */
	__u32 n;                      /* candidates, 2 .. MAX_NH */
	__u32 hash;                   /* the flow's hash: pkt_hash over the switch's hash fields and seed — what
	                               * ECMP takes modulo n (pick_slot); valid once `hashed`: use lb_hash(a) */
	__u32 hashed;
};

/* The flow's hash (the switch's fields and seed: what ECMP picks by), computed once. */
FTB_ALWAYS_INLINE __u32 lb_hash(struct lb_args *a)
{
	if (!a->hashed) {
		a->hash = pkt_hash(a->cfg->seed, a->cfg->hash_fields, a->p);
		a->hashed = 1;
	}
	return a->hash;
}

/* The decision's clock, read once. */
FTB_ALWAYS_INLINE __u64 lb_now(struct lb_args *a)
{
	if (!a->now)
		a->now = bpf_ktime_get_ns();
	return a->now;
}

/* The packet's priority at this switch (its DSCP through the switch's map), read once. */
FTB_ALWAYS_INLINE __u64 lb_prio(struct lb_args *a)
{
	if (a->prio == LB_PRIO_UNSET)
		a->prio = packet_prio(a->sw, a->p->tos);
	return a->prio;
}

/* Another hash of the same flow key (the switch's fields), independent of lb_hash(a) for salt ≠ 0. */
FTB_ALWAYS_INLINE __u32 lb_hash2(const struct lb_args *a, __u32 salt)
{
	return pkt_hash(a->cfg->seed ^ fmix32(salt), a->cfg->hash_fields, a->p);
}

/* The egress port of slot `slot` (0 when out of range). */
FTB_ALWAYS_INLINE __u32 lb_port(const struct lb_args *a, __u64 slot)
{
	ftb_opaque(slot);
	return slot < a->n && slot < MAX_NH ? a->g->ports[slot] : 0;
}

/* Whether slot `slot`'s port has lost its link. */
FTB_ALWAYS_INLINE int lb_port_down(const struct lb_args *a, __u64 slot)
{
	return port_is_down(lb_port(a, slot));
}

/* How long the queue this packet would join at slot `slot`'s port needs to drain what it holds now, in ns —
 * the virtual queue adaptive routing reads (vqueue.h ar_queue_ns: a paused queue counts as huge). */
FTB_ALWAYS_INLINE __u64 lb_queue_ns(struct lb_args *a, __u64 slot)
{
	return ar_queue_ns(lb_port(a, slot), lb_prio(a), lb_now(a));
}

/* How long slot `slot`'s port was busy over about the last load window (switch.adaptive.load_window), in ns
 * (port_load.h). Kept only while the switch's mode charges it (counters.h count_load: adaptive routing and a
 * plugin with switch.adaptive.metric load or queue+load, DLB with a load weight); else 0. */
FTB_ALWAYS_INLINE __u64 lb_load_ns(struct lb_args *a, __u64 slot)
{
	return ar_load_ns(lb_port(a, slot), lb_now(a), a->cfg->load_window_ns);
}

#ifdef FTB_PLUGIN
/* Parameter `i` of the plugin (switch.plugin.params: the loader defines PLUGIN_PARAM_<NAME> as its index and
 * PLUGIN_NPARAMS), 0 when out of range. */
FTB_ALWAYS_INLINE __u64 ftb_plugin_param(__u32 i)
{
	__u64 *v = plugin_params.lookup(&i);
	return v ? *v : 0;
}
#endif

#endif
