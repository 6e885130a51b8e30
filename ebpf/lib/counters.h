/* Per-port counters (per CPU, summed by the reader) and drop accounting. */
#ifndef FTB_COUNTERS_H
#define FTB_COUNTERS_H

#include "maps.h"
#include "port_load.h"

FTB_ALWAYS_INLINE void count_rx(__u32 ifindex, __u32 bytes)
{
	struct port_stats *s = port_stats.lookup(&ifindex);
	if (s) {
		s->rx_packets++;
		s->rx_bytes += bytes;
	}
}

FTB_ALWAYS_INLINE void count_tx(__u32 ifindex, __u32 bytes)
{
	struct port_stats *s = port_stats.lookup(&ifindex);
	if (s) {
		s->tx_packets++;
		s->tx_bytes += bytes;
	}
}

/* Adaptive routing with a load metric, DLB with a load weight (a plugin like adaptive routing: with
 * switch.adaptive.metric load or queue+load): charge the bytes to the egress port's recent load. */
FTB_ALWAYS_INLINE void count_load(__u32 sw, __u32 out, __u32 bytes)
{
	struct sw_config *cfg = sw_config.lookup(&sw);
	if (cfg && ((cfg->mode == MODE_ADAPTIVE && cfg->ar_metric != AR_QUEUE) ||
#ifdef FTB_PLUGIN
		    (cfg->mode == MODE_PLUGIN && cfg->ar_metric != AR_QUEUE) ||
#endif
		    (cfg->mode == MODE_DLB && cfg->dlb_load_weight)))
		ar_load_add(out, bytes, bpf_ktime_get_ns(), cfg->load_window_ns);
}

/* Count a drop (globally, and on the ingress port when it is one) and return the tc verdict. */
FTB_ALWAYS_INLINE int drop(__u32 ifindex, int reason)
{
	__u32 key = reason;
	__u64 r = reason, *g;     /* 64-bit: an index spilled to the stack as 32 bits loses its bounds */
	struct port_stats *s;

	ftb_opaque(r);
	if (r >= DROP_MAX)
		r = DROP_MALFORMED;
	key = r;
	g = drop_reason_counts.lookup(&key);
	if (g)
		(*g)++;
	if (r != DROP_NO_PORT) {
		s = port_stats.lookup(&ifindex);
		if (s)
			s->drops[r]++;
	}
	return TC_ACT_SHOT;
}

#endif
