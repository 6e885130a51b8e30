/* DLB (Broadcom-style dynamic load balancing): adaptive routing's scan (lb/adaptive.h) with another cost — a
 * port's quality band from its quantised load and queue (dlb_band) — chosen at a flowlet's start only (an idle
 * gap above the inactivity time: the loader sets ar_granularity flowlet and the flowlet timeout to it). */
#ifndef FTB_LB_DLB_H
#define FTB_LB_DLB_H

#include "choose.h"
#include "adaptive.h"

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

/* The quality band of egress port `port` for a packet of priority `prio`, 0 best .. bands − 1 worst. The port's
 * recent load as a fraction of the load window (ar_load_ns / window) and its queue's drain time as a fraction of
 * the time its buffer takes to drain (ar_queue_ns / (buffer × time per byte)) are each quantised to a level; the
 * band is their weighted mean (dlb_load_weight, dlb_queue_weight), rounded half up. Both are times, so a
 * degraded port is judged against its own rate. Mirrored by testbed/datapath/hashing.py (dlb_band). */
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

/* What the scan minimises under DLB: the band in the high 32 bits and, below it, a score drawn for this
 * decision (fmix32 of the decision's random number `r` and the port), so ports of the best band are chosen
 * evenly: the random start alone would favour a tied port that follows a run of worse ones. */
FTB_ALWAYS_INLINE __u64 dlb_cost(const struct sw_config *cfg, __u32 port, __u64 prio, __u64 now, __u32 r)
{
	return (dlb_band(cfg, port, prio, now) << 32) | fmix32(r ^ (port * 0x9E3779B9u));
}

FTB_ALWAYS_INLINE __u64 lb_dlb_choose(struct lb_args *a)
{
	return ar_mode_choose(a, 1);
}

#endif
