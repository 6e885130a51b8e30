/* A switch's egress decision for one packet, composed from the concerns in their own headers: the priority
 * (classify.h), the virtual queue it joins (vqueue.h), tail drop or trimming (trim.h), ECN (ecn.h), the shared
 * buffer's dynamic threshold (shared_buffer.h), and for lossless priorities the ingress accounting that drives
 * PFC Xoff (pfc.h) and credit limits (ingress_acct.h, credit.h). MAC control frames are macctl.h, the control
 * program control.h.
 *
 * Called by the ingress program just before bpf_redirect to the egress port (the same point a separate egress
 * program would run: nothing happens to the packet in between), so one program per port suffices.
 */
#ifndef FTB_QOS_H
#define FTB_QOS_H

#include "maps.h"
#include "trim.h"
#include "classify.h"
#include "vqueue.h"
#include "ecn.h"
#include "shared_buffer.h"
#include "ingress_acct.h"
#include "pfc.h"
#include "credit.h"
#include "macctl.h"
#include "control.h"

/* Account a packet of switch `sw`, arrived on `in`, leaving through `out`. Returns 0 to forward it, -1 when it
 * is tail-dropped (lossy priority, queue full). May CE-mark it, may raise Xoff for its ingress (PFC, lossless
 * priorities) and sets skb->priority to its HTB class. With trimming (lib/trim.h) a lossy RoCEv2 packet that
 * would pass the tail-drop limit or the trim threshold is cut to its headers and accounted on the trim
 * priority instead (trims counted on its own queue; a drop on the trim queue when that is full too), and a
 * trimmed header is classified to the trim priority. */
FTB_ALWAYS_INLINE int qos_egress(struct __sk_buff *skb, __u32 sw, __u32 in, __u32 out, __u8 tos)
{
	struct port_qos *pq = port_qos.lookup(&out), *pin;
	struct qos_config *cfg;
	struct queue_stats *qs, *cut;
	struct vqueue *q;
	__u64 prio, now, depth = 0, len = skb->len, *mx, pos = 0, thr = 0, limit, lossy_limit;
	__u32 k, lossless;
	int shared, trim;

	if (!pq || !pq->ps_per_byte)
		return 0;
	cfg = qos_config.lookup(&sw);
	if (!cfg)
		return 0;
	trim = trim_kind(skb, cfg);
	prio = trim == TRIM_FLAGGED ? cfg->trim_prio : qos_prio(cfg, tos);
	ftb_opaque(prio);
	if (prio >= N_PRIO)
		prio = 0;
	if (trim == TRIM_CANDIDATE && prio == cfg->trim_prio)
		trim = TRIM_NO;           /* already on the trim queue: trimming could not help it */
	k = out * N_PRIO + prio;
	q = vq.lookup(&k);
	qs = queue_stats.lookup(&k);
	if (!q || !qs)
		return 0;
	now = bpf_ktime_get_ns();
	lossless = (cfg->lossless >> prio) & 1;
	shared = cfg->shared_pool != 0;
	if (shared)               /* one buffer for the switch: the queue's share is alpha × the free pool */
		thr = shared_threshold(cfg, sw, len, now);
	lossy_limit = shared && thr < pq->buffer ? thr : pq->buffer;
	if (lossless) {           /* the ingress's own buffer first: PFC headroom or credits exhausted → lost */
		trim = TRIM_NO;
		pin = port_qos.lookup(&in);
		if (pin && pin->ingress_limit &&
		    ingress_full(in, prio, len, pin->ingress_limit, shared, thr, cfg->headroom, now)) {
			qs->drops++;
			return -1;
		}
		limit = pq->lossless_limit;
	} else {
		limit = lossy_limit;
		if (trim == TRIM_CANDIDATE && cfg->trim_threshold && cfg->trim_threshold < limit)
			limit = cfg->trim_threshold;
	}
	if (vq_enqueue(q, vq_eff(k, now), len * pq->ps_per_byte / 1000, pq->ps_per_byte, len, limit, &depth,
		       &pos) < 0) {
		if (trim != TRIM_CANDIDATE) {
			qs->drops++;
			return -1;
		}
		/* trim: the header goes on the trim priority's queue (lossy: Scenario refuses a lossless one) */
		cut = qs;
		prio = cfg->trim_prio & (N_PRIO - 1);
		k = out * N_PRIO + prio;
		q = vq.lookup(&k);
		qs = queue_stats.lookup(&k);
		if (!q || !qs || trim_cut(skb) < 0) {
			cut->drops++;
			return -1;
		}
		len = skb->len;
		lossless = 0;
		if (vq_enqueue(q, vq_eff(k, now), len * pq->ps_per_byte / 1000, pq->ps_per_byte, len, lossy_limit,
			       &depth, &pos) < 0) {
			qs->drops++;
			return -1;
		}
		cut->trims++;
		trim = TRIM_FLAGGED;
	}
	if (trim != TRIM_FLAGGED)         /* a trimmed header is not CE-marked: its loss signal is the trim */
		ecn_mark(skb, cfg, qs, prio, tos, depth);
	qs->packets++;
	qs->bytes += len;
	qs->depth_sum += depth;
	mx = queue_max.lookup(&k);
	if (mx && depth > *mx)
		*mx = depth;
	if (lossless && (cfg->pfc || cfg->credit))        /* credits read the same per-ingress accounting */
		pfc_charge(cfg, pq, in, out, prio, pos, pos > depth ? pos - depth : 0, len,
			   shared ? thr : cfg->xoff, now);
	if (pq->classes)
		skb->priority = HTB_MAJOR | (HTB_CLASS_BASE + prio);
	return 0;
}

#endif
