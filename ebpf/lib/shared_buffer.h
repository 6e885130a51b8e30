/* A switch's shared buffer with dynamic thresholds: a queue (or a lossless ingress, for Xoff) may hold alpha ×
 * the free pool, the pool's occupancy being the sum of the switch's queue depths now (sw_queues lists them).
 * Apart from the per-queue model because it reads every queue of the switch per packet. */
#ifndef FTB_SHARED_BUFFER_H
#define FTB_SHARED_BUFFER_H

#include "maps.h"

/* Occupancy of switch `sw`'s shared buffer: the sum of its queues' depths now (sw_queues lists them). Read
 * without the queues' locks: each finish time is one aligned word, and a queue that moves meanwhile is off by the
 * packet that moved it, as it would be a moment later anyway. */
FTB_ALWAYS_INLINE __u64 shared_used(__u32 sw, __u64 now)
{
	struct sw_queues *sq = sw_queues.lookup(&sw);
	struct vqueue *q;
	__u64 used = 0, depth, eff, finish, ps, *pa;
	__u32 k;

	if (!sq)
		return 0;
	for (__u32 i = 0; i < SWQ_MAX; i++) {
		if (i >= sq->n)
			break;
		k = sq->key[i];
		ps = sq->ps_per_byte[i];
		q = vq.lookup(&k);
		if (!q || !ps)
			continue;
		pa = egress_paused.lookup(&k);
		eff = pa && *pa && *pa < now ? *pa : now;
		finish = *(volatile __u64 *)&q->finish;
		depth = finish > eff ? (finish - eff) * 1000 / ps : 0;
		if (depth < vq_capped(*(volatile __u64 *)&q->enq, *(volatile __u64 *)&q->cap))
			depth = vq_capped(q->enq, q->cap);
		used += depth;
	}
	return used;
}

/* Dynamic threshold of a shared buffer: a queue (or a lossless ingress, for Xoff) may hold alpha × the free
 * pool. Records the switch's peak occupancy (`used` + this packet). */
FTB_ALWAYS_INLINE __u64 shared_threshold(const struct qos_config *cfg, __u32 sw, __u64 len, __u64 now)
{
	__u64 used = shared_used(sw, now), *peak = shared_peak.lookup(&sw);

	if (peak && used + len > *peak)
		*peak = used + len;
	return cfg->shared_pool > used ? (cfg->shared_pool - used) * cfg->alpha >> 10 : 0;
}

#endif
