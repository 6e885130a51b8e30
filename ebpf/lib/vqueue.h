/* The virtual queue of each (egress port, priority): the model of the qdisc's backlog the tc hook cannot see
 * (docs/architecture.md, 2.4 and 3.4). `vq` holds the time the queue would be empty draining at the port rate
 * and the bytes it ever enqueued; an arriving packet sees depth = (finish − now) × rate and pushes the finish
 * time by its serialisation time, under the queue's spin lock (packets of one queue arrive on several CPUs). A
 * queue paused by PFC (`egress_paused`) does not drain; one out of credit holds at least what it may not send.
 * Separate from the decisions that read it (tail drop, ECN, PFC, shared buffer, load balancing, INT), which
 * all see the queue through these functions. */
#ifndef FTB_VQUEUE_H
#define FTB_VQUEUE_H

#include "maps.h"

/* Depth now of egress queue (port, prio) in the model, and the bytes it ever enqueued (read under its lock, so
 * they describe the same packets); a queue out of credit holds at least what it may not send yet. */
FTB_ALWAYS_INLINE __u64 vq_read(__u32 port, __u64 prio, __u64 now, __u64 *depth)
{
	__u32 k = port * N_PRIO + prio;
	struct port_qos *pq = port_qos.lookup(&port);
	struct vqueue *q = vq.lookup(&k);
	__u64 *pa = egress_paused.lookup(&k);
	__u64 eff = now, finish, enq, cap;

	*depth = 0;
	if (!pq || !q || !pq->ps_per_byte)
		return 0;
	if (pa && *pa && *pa < now)
		eff = *pa;
	bpf_spin_lock(&q->lock);
	finish = q->finish;
	enq = q->enq;
	cap = q->cap;
	bpf_spin_unlock(&q->lock);
	if (finish > eff)
		*depth = (finish - eff) * 1000 / pq->ps_per_byte;
	if (*depth < vq_capped(enq, cap))
		*depth = vq_capped(enq, cap);
	return enq;
}

/* Bytes egress queue (port, prio) has sent so far in the model: enqueued − depth, never past its credit cap. */
FTB_ALWAYS_INLINE __u64 qos_sent(__u32 port, __u64 prio, __u64 now)
{
	__u64 depth, enq = vq_read(port, prio, now, &depth);
	return enq > depth ? enq - depth : 0;
}

/* Enqueue `len` bytes (`svc` ns of service) into queue `q` at `eff`, under its lock: CPUs race on one queue
 * (veth delivers on the sending CPU), and its finish time and byte count must move together. An idle queue
 * restarts from `eff`. Returns -1 when the packet must be tail-dropped (the queue would pass `limit` bytes),
 * else 0 with the depth the packet saw and its position in the queue's byte stream. */
FTB_ALWAYS_INLINE int vq_enqueue(struct vqueue *q, __u64 eff, __u64 svc, __u64 ps, __u64 len, __u64 limit,
				 __u64 *depth, __u64 *pos)
{
	__u64 base;
	int verdict = 0;

	bpf_spin_lock(&q->lock);
	base = q->finish < eff ? eff : q->finish;
	*depth = (base - eff) * 1000 / ps;
	if (*depth < vq_capped(q->enq, q->cap))   /* out of credit: it holds what it may not send yet */
		*depth = vq_capped(q->enq, q->cap);
	if (*depth + len > limit) {
		verdict = -1;
	} else {
		q->finish = base + svc;
		*pos = q->enq;
		q->enq += len;
	}
	bpf_spin_unlock(&q->lock);
	return verdict;
}

/* The instant queue `k` drains from: now, or when its priority was paused. */
FTB_ALWAYS_INLINE __u64 vq_eff(__u32 k, __u64 now)
{
	__u64 *pa = egress_paused.lookup(&k);
	return pa && *pa && *pa < now ? *pa : now;
}

/* How long queue (port, prio) needs to send what it holds now, in ns, from the model (a racy read: a hint, not
 * accounting). Time, not bytes: on ports of different rates (a degraded link) the same bytes wait longer. */
FTB_ALWAYS_INLINE __u64 ar_queue_ns(__u32 port, __u64 prio, __u64 now)
{
	__u32 k = port * N_PRIO + prio;
	struct vqueue *q = vq.lookup(&k);
	__u64 *pa = egress_paused.lookup(&k);
	struct port_qos *pq = port_qos.lookup(&port);
	__u64 eff = now, finish, ns, held;

	if (!q)
		return 0;
	if (pa && *pa && *pa < now)
		return ~0ULL >> 2;            /* paused: it sends nothing until resumed */
	finish = *(volatile __u64 *)&q->finish;
	ns = finish > eff ? finish - eff : 0;
	held = vq_capped(*(volatile __u64 *)&q->enq, *(volatile __u64 *)&q->cap);    /* out of credit */
	if (pq && held * pq->ps_per_byte / 1000 > ns)
		ns = held * pq->ps_per_byte / 1000;
	return ns;
}

#endif
