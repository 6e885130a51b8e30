/* The per-flow state at a switch with a choice (n > 1; under SM routing, with sw_config.track, single-port
 * groups too): an LRU entry in `flows` per (switch, 5-tuple) holding the flowlet clock and kept slot the modes
 * use, and the packets per next-hop slot that tell how many paths a flow used and in what ratio. */
#ifndef FTB_FLOW_STATE_H
#define FTB_FLOW_STATE_H

#include "maps.h"

FTB_ALWAYS_INLINE struct flow_state *flow_state_get(struct flow_key *k)
{
	struct flow_state *fs = flows.lookup(k);
	if (!fs) {
		__u32 zero_key = 0;
		struct flow_state *zero = flow_zero.lookup(&zero_key);
		if (!zero)
			return 0;
		flows.update(k, zero);
		fs = flows.lookup(k);
	}
	return fs;
}

/* The flow state of the packet's 5-tuple at switch `sw` (created zeroed). */
FTB_ALWAYS_INLINE struct flow_state *flow_state_of(__u32 sw, const struct pkt *p)
{
	struct flow_key k = {};

	k.switch_id = sw;
	k.saddr = p->saddr;
	k.daddr = p->daddr;
	k.sport = p->sport;
	k.dport = p->dport;
	k.proto = p->proto;
	return flow_state_get(&k);
}

/* Count a packet against the slot it left through, in its flow's path counters. */
FTB_ALWAYS_INLINE void lb_count(struct flow_state *fs, __u64 slot, __u32 len)
{
	ftb_opaque(slot);
	if (fs && slot < MAX_NH) {
		__sync_fetch_and_add(&fs->pkts[slot], 1);
		__sync_fetch_and_add(&fs->bytes, len);
	}
}

#endif
