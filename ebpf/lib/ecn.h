/* ECN marking of ECT packets by the RED/DCQCN curve at the depth the packet saw in its queue (kmin, kmax, pmax
 * per priority). A decision of its own: it only reads the depth vq_enqueue returned. */
#ifndef FTB_ECN_H
#define FTB_ECN_H

#include "maps.h"

/* Marking decision of the RED/DCQCN curve for a queue of `depth` bytes; `r` is a uniform 32-bit random. */
FTB_ALWAYS_INLINE int ecn_should_mark(__u64 depth, __u64 kmin, __u64 kmax, __u64 pmax, __u32 r)
{
	if (depth < kmin)
		return 0;
	if (depth >= kmax)
		return 1;
	/* P = pmax × (depth − kmin) / (kmax − kmin), all ×2^32 */
	return (__u64)r < pmax * (depth - kmin) / (kmax - kmin);
}

/* CE-mark an ECT packet with the RED/DCQCN probability at `depth`. */
FTB_ALWAYS_INLINE void ecn_mark(struct __sk_buff *skb, const struct qos_config *cfg, struct queue_stats *qs,
				__u64 prio, __u8 tos, __u64 depth)
{
	__u32 ecn = tos & ECN_MASK;

	if (ecn != 1 && ecn != 2)
		return;
	qs->ect_packets++;
	if (((cfg->ecn_on >> prio) & 1) &&
	    ecn_should_mark(depth, cfg->kmin[prio], cfg->kmax[prio], cfg->pmax[prio], bpf_get_prandom_u32())) {
		bpf_skb_ecn_set_ce(skb);
		qs->ecn_marks++;
	}
}

#endif
