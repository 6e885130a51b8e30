/* Ingress accounting: every lossless byte is charged to its ingress (port, priority) until its egress queue has
 * sent it (struct ingress_chunk, one chunk per egress port it fed), as a switch's buffer manager does. PFC's
 * Xoff (pfc.h) and credit flow control's ingress limit (ingress_full) both read it, which is why it is neither's. */
#ifndef FTB_INGRESS_ACCT_H
#define FTB_INGRESS_ACCT_H

#include "maps.h"
#include "vqueue.h"

/* Take out of a chunk what its queue has sent (it has sent everything up to stream position `sent`); returns
 * the bytes that left. Between start and end the chunk's bytes are taken as evenly spread. */
FTB_ALWAYS_INLINE __u64 chunk_drain(struct ingress_chunk *c, __u64 sent)
{
	__u64 rem, gone;

	if (!c->bytes || sent <= c->start)
		return 0;
	if (sent >= c->end || c->end <= c->start) {
		gone = c->bytes;
		c->bytes = 0;
		c->start = c->end;
		return gone;
	}
	rem = c->bytes * (c->end - sent) / (c->end - c->start);
	gone = c->bytes - rem;
	c->bytes = rem;
	c->start = sent;
	return gone;
}

/* Recount ingress state `st` of priority `prio`: every chunk drained to where its egress queue has sent up to.
 * The positions need map lookups, which are not allowed under the lock, so they are read first into per-CPU
 * scratch (a chunk's egress port never changes: slot = the port's index in its switch). Returns the bytes of
 * the ingress still queued; takes and releases st->lock. */
FTB_ALWAYS_INLINE __u64 ingress_recount(struct ingress_state *st, __u64 prio, __u64 now)
{
	__u32 zero = 0;
	struct acct_scratch *sc = acct_scratch.lookup(&zero);
	__u64 total = 0;

	if (!sc)
		return st->bytes;
	for (__u32 s = 0; s < ACCT_SLOTS; s++)
		sc->sent[s] = st->chunks[s].bytes ? qos_sent(st->chunks[s].port, prio, now) : 0;
	bpf_spin_lock(&st->lock);
	for (__u32 s = 0; s < ACCT_SLOTS; s++) {
		chunk_drain(&st->chunks[s], sc->sent[s]);
		total += st->chunks[s].bytes;
	}
	st->bytes = total;
	bpf_spin_unlock(&st->lock);
	return total;
}

/* Whether a lossless packet of `len` bytes arriving on (port `in`, priority `prio`) overflows that ingress's
 * buffer: `limit` bytes still queued in the switch, or with a shared buffer (`dyn` set) its Xoff level — the
 * dynamic threshold `thr`, frozen when Xoff was raised — plus `headroom`. The charged bytes are an upper bound
 * (chunks drain lazily), so only near the limit is the exact figure recounted. Packets of one ingress accounted
 * at once on several CPUs may pass the limit by one frame each. */
FTB_ALWAYS_INLINE int ingress_full(__u32 in, __u64 prio, __u64 len, __u64 limit, int dyn, __u64 thr,
				   __u64 headroom, __u64 now)
{
	__u32 ki = in * N_PRIO + prio;
	struct ingress_state *st = ingress_state.lookup(&ki);
	struct queue_stats *qi;
	__u64 level;

	if (!st)
		return 0;
	if (dyn) {
		level = *(volatile __u64 *)&st->xoff_ns ? *(volatile __u64 *)&st->xoff_level : thr;
		if (level + headroom < limit)
			limit = level + headroom;
	}
	if (*(volatile __u64 *)&st->bytes + len <= limit)
		return 0;
	if (ingress_recount(st, prio, now) + len <= limit)
		return 0;
	qi = queue_stats.lookup(&ki);
	if (qi)
		qi->overflows++;
	return 1;
}

#endif
