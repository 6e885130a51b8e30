/* The control program's commands (ftb_ctl, run by user space with BPF_PROG_TEST_RUN on a packet holding one
 * struct ctl_cmd): changes to the queue model and the ingress state that must take the same spin locks as the
 * switch program — resync with the real backlog, shift after a pause, Xon reset, a credit grant, an ingress
 * recount. User space
 * never writes `vq` or `ingress_state` directly (a write racing with the program would lose packets). */
#ifndef FTB_CONTROL_H
#define FTB_CONTROL_H

#include "maps.h"
#include "credit.h"
#include "ingress_acct.h"

/* User space's atomic changes to the model (struct ctl_cmd, see common.h). */
FTB_ALWAYS_INLINE int qos_control(const struct ctl_cmd *c)
{
	__u32 key = c->key;
	__u64 f;
	struct ingress_state *st;
	struct vqueue *q;
	int rc = 0;

	if (c->op == CTL_XON_RESET) {
		st = ingress_state.lookup(&key);
		if (!st)
			return -1;
		bpf_spin_lock(&st->lock);
		st->xoff_ns = 0;
		st->xoff_level = 0;
		st->last_ns = 0;
		st->leaked = 0;
		bpf_spin_unlock(&st->lock);
		return 0;
	}
	if (c->op == CTL_INGRESS_RECOUNT) {
		/* drain ingress `key` (port * N_PRIO + prio) to where its egress queues have sent now, for good, and
		 * return the bytes still queued: a credit grant sized on this figure cannot be undone by a later resync
		 * that moves an egress queue's model back (a read-only recount could, and over-granted) */
		st = ingress_state.lookup(&key);
		if (!st)
			return -1;
		return (int)ingress_recount(st, key % N_PRIO, bpf_ktime_get_ns());
	}
	q = vq.lookup(&key);
	if (!q)
		return -1;
	if (c->op == CTL_VQ_CREDIT)
		return credit_grant(q, key, c);
	bpf_spin_lock(&q->lock);
	f = q->finish;
	if (c->op == CTL_VQ_RESYNC) {
		/* the real backlog read at base, plus what the switch program queued since (f − before) */
		__u64 before = c->c > c->a ? c->c : c->a;
		q->finish = c->a + c->b + (f > before ? f - before : 0);
	} else if (c->op == CTL_VQ_SHIFT) {
		if (f > c->a)
			q->finish = f + c->b;
	} else {
		rc = -1;
	}
	bpf_spin_unlock(&q->lock);
	return rc;
}

#endif
