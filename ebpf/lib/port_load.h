/* A switch port's recent load: a decaying count of the bytes it sent over about the last load window
 * (`port_load`, under a per-port lock). Kept only for the modes that read it (adaptive routing by load, DLB with
 * a load weight: counters.h count_load); apart from the queue model because it measures the past, not the
 * backlog. */
#ifndef FTB_PORT_LOAD_H
#define FTB_PORT_LOAD_H

#include "maps.h"

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

#endif
