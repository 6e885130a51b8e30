/* Congestion and flow control at a switch's egress port: queue model, tail drop, ECN marking, PFC Xoff.
 *
 * The clsact hooks run before the qdisc enqueues and BCC cannot read the qdisc's backlog (DESIGN §3), so each
 * (egress port, priority) queue is a virtual queue: `vq` holds the time at which it would be empty if it drained
 * at the port rate; an arriving packet sees depth = (vq − now) × rate and pushes vq by its serialisation time.
 * While the port's priority is paused by PFC (`egress_paused`, written by the agent) the queue does not drain.
 * PFC Xoff follows ingress accounting, as in a switch: each lossless byte is charged to its ingress (port,
 * priority) until its egress queue has sent it (struct ingress_chunk); an ingress whose queued bytes pass Xoff
 * is paused, whatever the other ingresses feeding the same egress do. The agent sends Xon when they fall to Xon.
 * Telemetry compares this model with the qdisc's real backlog read from netlink.
 *
 * Called by the ingress program just before bpf_redirect to the egress port (the same point a separate egress
 * program would run: nothing happens to the packet in between), so one program per port suffices.
 */
#ifndef FTB_QOS_H
#define FTB_QOS_H

#include "maps.h"

FTB_ALWAYS_INLINE void qos_count_pause_rx(__u32 port, __u32 vector)
{
	struct queue_stats *qs;
	__u32 k;
#pragma unroll
	for (int i = 0; i < N_PRIO; i++) {
		if (!(vector & (1u << i)))
			continue;
		k = port * N_PRIO + i;
		qs = queue_stats.lookup(&k);
		if (qs)
			qs->pause_rx++;
	}
}

/* MAC control frames: a PFC frame (0x8808, opcode 0x0101) is posted to the agent, which pauses or resumes the
 * classes of this port's egress; the agent's kick frames are dropped. Returns a tc verdict, or -1 for other
 * frames. */
FTB_ALWAYS_INLINE int qos_control_rx(struct __sk_buff *skb, __u32 port)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u16 *w;
	struct pfc_event ev = {};

	if ((void *)(eth + 1) > data_end)
		return -1;
	if (eth->h_proto == ftb_htons(ETH_P_KICK))
		return TC_ACT_SHOT;
	if (eth->h_proto != ftb_htons(ETH_P_MACCTL))
		return -1;
	w = (void *)(eth + 1);
	if ((void *)(w + 2 + N_PRIO) > data_end || w[0] != ftb_htons(PFC_OPCODE))
		return TC_ACT_SHOT;
	ev.ts = bpf_ktime_get_ns();
	ev.kind = EVT_PFC_RX;
	ev.port = port;
	ev.prio = ftb_ntohs(w[1]) & 0xff;
#pragma unroll
	for (int i = 0; i < N_PRIO; i++)
		ev.quanta[i] = ftb_ntohs(w[2 + i]);
	qos_count_pause_rx(port, ev.prio);
	pfc_events.ringbuf_output(&ev, sizeof(ev), 0);
	return TC_ACT_SHOT;
}

/* The priority of a packet at switch `sw` (DSCP map), 0..7. */
FTB_ALWAYS_INLINE __u64 qos_prio(const struct qos_config *cfg, __u8 tos)
{
	__u64 d = (tos >> 2) & 63;
	ftb_opaque(d);
	if (d >= 64)
		return 0;
	return cfg->dscp_prio[d] & (N_PRIO - 1);
}

/* Marking decision of the RED/DCQCN curve for a queue of `depth` bytes; `r` is a uniform 32-bit random. */
FTB_ALWAYS_INLINE int ecn_should_mark(__u64 depth, __u64 kmin, __u64 kmax, __u64 pmax, __u32 r)
{
	if (depth < kmin)
		return 0;
	if (depth >= kmax)
		return 1;
	/* P = pmax × (depth − kmin) / (kmax − kmin), all ×2^32 */
	return (__u64)r < pmax * (depth - kmin) / (kmax - kmin);
}

/* Bytes egress queue (port, prio) has sent so far in the model: enqueued − depth now. */
FTB_ALWAYS_INLINE __u64 qos_sent(__u32 port, __u64 prio, __u64 now)
{
	__u32 k = port * N_PRIO + prio;
	struct port_qos *pq = port_qos.lookup(&port);
	__u64 *vt = vq.lookup(&k), *en = vq_enq.lookup(&k), *pa = egress_paused.lookup(&k);
	__u64 eff = now, depth = 0;

	if (!pq || !vt || !en || !pq->ps_per_byte)
		return 0;
	if (pa && *pa && *pa < now)
		eff = *pa;
	if (*vt > eff)
		depth = (*vt - eff) * 1000 / pq->ps_per_byte;
	return *en > depth ? *en - depth : 0;
}

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

/* Recount every chunk of ingress (port, prio) `ki`: the bytes of it still queued anywhere in the switch. */
FTB_ALWAYS_INLINE __u64 ingress_recount(__u32 ki, __u64 prio, __u64 now)
{
	__u64 total = 0;

	for (__u32 s = 0; s < ACCT_SLOTS; s++) {
		__u32 ck = ki * ACCT_SLOTS + s;
		struct ingress_chunk *c = ingress_acct.lookup(&ck);
		if (!c || !c->bytes)
			continue;
		chunk_drain(c, qos_sent(c->port, prio, now));
		total += c->bytes;
	}
	return total;
}

/* Account a packet of switch `sw`, arrived on `in`, leaving through `out`. Returns 0 to forward it, -1 when it
 * is tail-dropped (lossy priority, queue full). May CE-mark it, may raise Xoff for its ingress (PFC, lossless
 * priorities) and sets skb->priority to its HTB class. */
FTB_ALWAYS_INLINE int qos_egress(struct __sk_buff *skb, __u32 sw, __u32 in, __u32 out, __u8 tos)
{
	struct port_qos *pq = port_qos.lookup(&out);
	struct qos_config *cfg;
	struct queue_stats *qs;
	struct ingress_pause *ip;
	struct ingress_chunk *ch;
	__u64 prio, now, eff, v, depth, len = skb->len, ps, *vt, *pa, *mx, *en, *ib, pos, sent, acc, gone;
	__u32 k, ki, lossless, ecn;

	if (!pq || !pq->ps_per_byte)
		return 0;
	cfg = qos_config.lookup(&sw);
	if (!cfg)
		return 0;
	prio = qos_prio(cfg, tos);
	ftb_opaque(prio);
	if (prio >= N_PRIO)
		prio = 0;
	ps = pq->ps_per_byte;
	k = out * N_PRIO + prio;
	vt = vq.lookup(&k);
	qs = queue_stats.lookup(&k);
	if (!vt || !qs)
		return 0;
	now = bpf_ktime_get_ns();
	eff = now;
	pa = egress_paused.lookup(&k);
	if (pa && *pa && *pa < now)
		eff = *pa;                /* paused: the queue stopped draining then */
	v = *vt;
	if (v < eff) {
		v = eff;
		*vt = eff;                /* idle queue: restart from now (racing CPUs may lose one packet's time) */
	}
	depth = (v - eff) * 1000 / ps;
	lossless = (cfg->lossless >> prio) & 1;

	if (depth + len > (lossless ? pq->lossless_limit : pq->buffer)) {
		qs->drops++;
		return -1;
	}
	ecn = tos & ECN_MASK;
	if (ecn == 1 || ecn == 2) {
		qs->ect_packets++;
		if (((cfg->ecn_on >> prio) & 1) &&
		    ecn_should_mark(depth, cfg->kmin[prio], cfg->kmax[prio], cfg->pmax[prio], bpf_get_prandom_u32())) {
			bpf_skb_ecn_set_ce(skb);
			qs->ecn_marks++;
		}
	}
	__sync_fetch_and_add(vt, len * ps / 1000);
	qs->packets++;
	qs->bytes += len;
	qs->depth_sum += depth;
	mx = queue_max.lookup(&k);
	if (mx && depth > *mx)
		*mx = depth;

	/* PFC by ingress accounting: charge this packet to its ingress (port, priority) at its position in the
	 * egress queue's byte stream; Xoff when the bytes of that ingress still queued in the switch pass Xoff. */
	en = vq_enq.lookup(&k);
	if (en) {
		pos = *en;
		*en = pos + len;
	}
	if (lossless && cfg->pfc && en) {
		ki = in * N_PRIO + prio;
		__u32 ck = ki * ACCT_SLOTS + (pq->local < ACCT_SLOTS ? pq->local : 0);
		ch = ingress_acct.lookup(&ck);
		ib = ingress_bytes.lookup(&ki);
		ip = ingress_pause.lookup(&ki);
		if (ch && ib && ip) {
			sent = pos > depth ? pos - depth : 0;
			gone = chunk_drain(ch, sent);
			if (!ch->bytes)
				ch->start = pos;
			ch->bytes += len;
			ch->end = pos + len;
			ch->port = out;
			acc = *ib > gone ? *ib - gone : 0;
			acc += len;
			if (acc > cfg->xoff && !ip->xoff_ns)
				acc = ingress_recount(ki, prio, now);    /* the other chunks may have drained meanwhile */
			*ib = acc;
			if (ip->xoff_ns) {
				/* frames still arriving after Xoff: the upstream's reaction (a long pause leaks ~1
				 * frame per 1.5 s through the paused TBF; those are not part of the reaction) */
				if (now - ip->xoff_ns < 50000000) {
					ip->last_ns = now;
					ip->leaked++;
				}
			} else if (acc > cfg->xoff) {
				struct pfc_event ev = {};
				struct queue_stats *qi = queue_stats.lookup(&ki);
				ip->xoff_ns = now;
				ip->last_ns = 0;
				ip->leaked = 0;
				ip->cause = out;
				if (qi)
					qi->xoff_events++;
				ev.ts = now;
				ev.kind = EVT_XOFF;
				ev.port = in;
				ev.prio = prio;
				ev.cause = out;
				pfc_events.ringbuf_output(&ev, sizeof(ev), 0);
			}
		}
	}
	if (pq->classes)
		skb->priority = HTB_MAJOR | (HTB_CLASS_BASE + prio);
	return 0;
}

#endif
