/* Forwarding: ports by ifindex, and the per-switch longest-prefix-match FIB. */
#ifndef FTB_FIB_H
#define FTB_FIB_H

#include "maps.h"

/* The port behind an ifindex, or NULL when it is not a switch port. */
FTB_ALWAYS_INLINE struct port_info *port_lookup(__u32 ifindex)
{
	struct port_info *pi = ports.lookup(&ifindex);
	if (!pi || !(pi->flags & PORT_VALID))
		return 0;
	return pi;
}

/* The port has lost its link (the watcher's port_down map). */
FTB_ALWAYS_INLINE int port_is_down(__u32 ifindex)
{
	__u32 *d = port_down.lookup(&ifindex);
	return d && *d;
}

FTB_ALWAYS_INLINE struct nh_group *fib_lookup(__u32 switch_id, __u32 daddr)
{
	struct fib_key key = { .prefixlen = 64, .switch_id = switch_id, .addr = daddr };
	return fib.lookup(&key);
}

#endif
