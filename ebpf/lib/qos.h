/* Congestion and flow control at a switch's egress port: queue model, tail drop, ECN marking, PFC Xoff.
 *
 * The clsact hooks run before the qdisc enqueues and BCC cannot read the qdisc's backlog (docs/architecture.md, 3.4), so each
 * (egress port, priority) queue is a virtual queue: `vq` holds the time at which it would be empty if it drained
 * at the port rate (and the bytes ever enqueued); an arriving packet sees depth = (finish − now) × rate and
 * pushes the finish time by its serialisation time. Packets of one queue arrive on several CPUs at once, so
 * every update of the model is made under a per-queue (or per-ingress) spin lock.
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
#include "trim.h"

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
 * classes of this port's egress; so is a credit frame (opcode 0xFC01), whose grant the agent applies to this
 * port's meter; the agent's kick frames are dropped. Returns a tc verdict, or -1 for other
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
	if ((void *)(w + 2 + N_PRIO) > data_end)
		return TC_ACT_SHOT;
	if (w[0] == ftb_htons(CREDIT_OPCODE)) {
		/* opcode, flags << 8 | prio, stalled µs (u32), limit (u64), all big-endian: what the receiving
		 * port's agent on the other machine grants this port's egress (control/credits.py, remote links) */
		ev.ts = bpf_ktime_get_ns();
		ev.kind = EVT_CREDIT_RX;
		ev.port = port;
		ev.prio = ftb_ntohs(w[1]) & (N_PRIO - 1);
		ev.quanta[0] = ftb_ntohs(w[1]) >> 8;
		ev.cause = ((__u32)ftb_ntohs(w[2]) << 16) | ftb_ntohs(w[3]);
		ev.limit = ((__u64)ftb_ntohs(w[4]) << 48) | ((__u64)ftb_ntohs(w[5]) << 32) |
			   ((__u64)ftb_ntohs(w[6]) << 16) | ftb_ntohs(w[7]);
		pfc_events.ringbuf_output(&ev, sizeof(ev), 0);
		return TC_ACT_SHOT;
	}
	if (w[0] != ftb_htons(PFC_OPCODE))
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

/* The priority of a packet with TOS `tos` at switch `sw` (0 where the switch has no QoS configuration). */
FTB_ALWAYS_INLINE __u64 packet_prio(__u32 sw, __u8 tos)
{
	struct qos_config *cfg = qos_config.lookup(&sw);
	return cfg ? qos_prio(cfg, tos) : 0;
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

/* Occupancy of switch `sw`'s shared buffer: the sum of its queues' depths now (sw_queues lists them). Read
 * without the queues' locks: each finish time is one aligned word, and a queue that moves meanwhile is off by the
 * packet that moved it, as it would be a moment later anyway. */
FTB_ALWAYS_INLINE __u64 shared_used(__u32 sw, __u64 now)
{
	struct sw_queues *sq = sw_queues.lookup(&sw);
	struct vqueue *q;
	__u64 used = 0, depth, eff, finish, ps, *pa;
	__u32 k;

	if (!sq)
		return 0;
	for (__u32 i = 0; i < SWQ_MAX; i++) {
		if (i >= sq->n)
			break;
		k = sq->key[i];
		ps = sq->ps_per_byte[i];
		q = vq.lookup(&k);
		if (!q || !ps)
			continue;
		pa = egress_paused.lookup(&k);
		eff = pa && *pa && *pa < now ? *pa : now;
		finish = *(volatile __u64 *)&q->finish;
		depth = finish > eff ? (finish - eff) * 1000 / ps : 0;
		if (depth < vq_capped(*(volatile __u64 *)&q->enq, *(volatile __u64 *)&q->cap))
			depth = vq_capped(q->enq, q->cap);
		used += depth;
	}
	return used;
}

/* Dynamic threshold of a shared buffer: a queue (or a lossless ingress, for Xoff) may hold alpha × the free
 * pool. Records the switch's peak occupancy (`used` + this packet). */
FTB_ALWAYS_INLINE __u64 shared_threshold(const struct qos_config *cfg, __u32 sw, __u64 len, __u64 now)
{
	__u64 used = shared_used(sw, now), *peak = shared_peak.lookup(&sw);

	if (peak && used + len > *peak)
		*peak = used + len;
	return cfg->shared_pool > used ? (cfg->shared_pool - used) * cfg->alpha >> 10 : 0;
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

/* CE-mark an ECT packet with the RED/DCQCN probability at `depth`. */
FTB_ALWAYS_INLINE void ecn_mark(struct __sk_buff *skb, const struct qos_config *cfg, struct queue_stats *qs,
				__u64 prio, __u8 tos, __u64 depth)
{
	__u32 ecn = tos & ECN_MASK;

	if (ecn != 1 && ecn != 2)
		return;
	qs->ect_packets++;
	if (((cfg->ecn_on >> prio) & 1) &&
	    ecn_should_mark(depth, cfg->kmin[prio], cfg->kmax[prio], cfg->pmax[prio], bpf_get_prandom_u32())) {
		bpf_skb_ecn_set_ce(skb);
		qs->ecn_marks++;
	}
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

/* PFC by ingress accounting: charge a lossless packet of `len` bytes, at position `pos` of egress queue `out`
 * (whose queue had sent up to `sent`), to its ingress (port `in`, priority `prio`); raise Xoff when the bytes
 * of that ingress still queued in the switch pass `xoff` (static, or a shared buffer's dynamic threshold). */
FTB_ALWAYS_INLINE void pfc_charge(const struct qos_config *cfg, const struct port_qos *pq, __u32 in, __u32 out,
				  __u64 prio, __u64 pos, __u64 sent, __u64 len, __u64 xoff, __u64 now)
{
	__u32 ki = in * N_PRIO + prio, slot = pq->local < ACCT_SLOTS ? pq->local : 0;
	struct ingress_state *st = ingress_state.lookup(&ki);
	struct ingress_chunk *ch;
	struct queue_stats *qi;
	struct pfc_event ev = {};
	__u64 acc, gone, xoff_at;
	int recount = 0, raise = 0;

	if (!st)
		return;
	bpf_spin_lock(&st->lock);
	ch = &st->chunks[slot];
	gone = chunk_drain(ch, sent);
	if (!ch->bytes)
		ch->start = pos;
	ch->bytes += len;
	ch->end = pos + len;
	ch->port = out;
	acc = (st->bytes > gone ? st->bytes - gone : 0) + len;
	st->bytes = acc;
	st->arrived += len;
	xoff_at = st->xoff_ns;
	if (xoff_at) {
		/* frames still arriving after Xoff: the upstream's reaction (a long pause leaks ~1 frame per 1.5 s
		 * through the paused TBF; those are not part of the reaction) */
		if (now - xoff_at < 50000000) {
			st->last_ns = now;
			st->leaked++;
		}
	} else if (cfg->pfc && acc > xoff) {
		recount = 1;              /* the other chunks may have drained meanwhile */
	}
	bpf_spin_unlock(&st->lock);
	if (!recount || (acc = ingress_recount(st, prio, now)) <= xoff)
		return;
	bpf_spin_lock(&st->lock);
	if (!st->xoff_ns) {
		st->xoff_ns = now;
		st->xoff_level = acc;
		st->last_ns = 0;
		st->leaked = 0;
		st->cause = out;
		raise = 1;
	}
	bpf_spin_unlock(&st->lock);
	if (!raise)
		return;                   /* another CPU raised it first */
	qi = queue_stats.lookup(&ki);
	if (qi)
		qi->xoff_events++;
	ev.ts = now;
	ev.kind = EVT_XOFF;
	ev.port = in;
	ev.prio = prio;
	ev.cause = out;
	pfc_events.ringbuf_output(&ev, sizeof(ev), 0);
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

/* The instant queue `k` drains from: now, or when its priority was paused. */
FTB_ALWAYS_INLINE __u64 vq_eff(__u32 k, __u64 now)
{
	__u64 *pa = egress_paused.lookup(&k);
	return pa && *pa && *pa < now ? *pa : now;
}

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
	q = vq.lookup(&key);
	if (!q)
		return -1;
	if (c->op == CTL_VQ_CREDIT) {
		/* a grant: the queue may send up to stream position c; it has really sent b bytes (what its receiver
		 * got), so it holds enq − b, draining at the port rate from a until the cap */
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
