/* Credit-based flow control: a lossless queue may send only up to the stream position its receiver granted
 * (vqueue.cap; what it holds beyond is vq_capped). Grants arrive from the agent through the control program
 * (CTL_VQ_CREDIT) or, over a link between two machines, as a credit frame the agent applies; the accounting
 * that sizes them is the ingress accounting (ingress_acct.h). */
#ifndef FTB_CREDIT_H
#define FTB_CREDIT_H

#include "maps.h"

/* A credit frame (MAC control opcode 0xFC01) on port `port`, its words `w` after the EtherType (bounds checked
 * by the caller): opcode, flags << 8 | prio, stalled µs (u32), limit (u64), all big-endian — what the receiving
 * port's agent on the other machine grants this port's egress (control/credits.py, remote links); posted to
 * the agent, which applies it. */
FTB_ALWAYS_INLINE void credit_frame_rx(const __u16 *w, __u32 port)
{
	struct pfc_event ev = {};

	ev.ts = bpf_ktime_get_ns();
	ev.kind = EVT_CREDIT_RX;
	ev.port = port;
	ev.prio = ftb_ntohs(w[1]) & (N_PRIO - 1);
	ev.quanta[0] = ftb_ntohs(w[1]) >> 8;
	ev.cause = ((__u32)ftb_ntohs(w[2]) << 16) | ftb_ntohs(w[3]);
	ev.limit = ((__u64)ftb_ntohs(w[4]) << 48) | ((__u64)ftb_ntohs(w[5]) << 32) |
		   ((__u64)ftb_ntohs(w[6]) << 16) | ftb_ntohs(w[7]);
	pfc_events.ringbuf_output(&ev, sizeof(ev), 0);
}

/* CTL_VQ_CREDIT on queue `q` (vq index `key`): a grant — the queue may send up to stream position c->c; it has
 * really sent c->b bytes (what its receiver got), so it holds enq − b, draining at the port rate from c->a until
 * the cap. */
FTB_ALWAYS_INLINE int credit_grant(struct vqueue *q, __u32 key, const struct ctl_cmd *c)
{
	__u32 port = key / N_PRIO;
	struct port_qos *pq = port_qos.lookup(&port);
	if (!pq)
		return -1;
	bpf_spin_lock(&q->lock);
	q->cap = c->c;
	q->finish = c->a + (q->enq > c->b ? q->enq - c->b : 0) * pq->ps_per_byte / 1000;
	bpf_spin_unlock(&q->lock);
	return 0;
}

#endif
