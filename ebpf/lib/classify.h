/* The priority of a packet at a switch: its DSCP through the switch's map (qos_config.dscp_prio). One place,
 * because the egress queue it joins, its HTB class, PFC's lossless set, adaptive routing's queue read and INT's
 * queue record must all agree on it. */
#ifndef FTB_CLASSIFY_H
#define FTB_CLASSIFY_H

#include "maps.h"

/* The priority of a packet at switch `sw` (DSCP map), 0..7. */
FTB_ALWAYS_INLINE __u64 qos_prio(const struct qos_config *cfg, __u8 tos)
{
	__u64 d = (tos >> 2) & 63;
	ftb_opaque(d);
	if (d >= 64)
		return 0;
	return cfg->dscp_prio[d] & (N_PRIO - 1);
}

/* The priority of a packet with TOS `tos` at switch `sw` (0 where the switch has no QoS configuration). */
FTB_ALWAYS_INLINE __u64 packet_prio(__u32 sw, __u8 tos)
{
	struct qos_config *cfg = qos_config.lookup(&sw);
	return cfg ? qos_prio(cfg, tos) : 0;
}

#endif
