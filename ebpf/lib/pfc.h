/* PFC (802.1Qbb): an ingress whose queued lossless bytes pass Xoff is paused (an EVT_XOFF to the agent, which
 * sends the pause frame upstream and Xon when they fall back), whatever the other ingresses feeding the same
 * egress do; a PFC frame received on a port is counted per priority and handed to the agent, which pauses or
 * resumes that port's classes (egress_paused). The agent is user space (testbed/qos/pfc.py); this is the
 * datapath's half. */
#ifndef FTB_PFC_H
#define FTB_PFC_H

#include "maps.h"
#include "ingress_acct.h"

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

/* A PFC frame (opcode 0x0101) on port `port`, its words `w` after the EtherType (bounds checked by the caller):
 * counted per priority it names and posted to the agent. */
FTB_ALWAYS_INLINE void pfc_frame_rx(const __u16 *w, __u32 port)
{
	struct pfc_event ev = {};

	ev.ts = bpf_ktime_get_ns();
	ev.kind = EVT_PFC_RX;
	ev.port = port;
	ev.prio = ftb_ntohs(w[1]) & 0xff;
#pragma unroll
	for (int i = 0; i < N_PRIO; i++)
		ev.quanta[i] = ftb_ntohs(w[2 + i]);
	qos_count_pause_rx(port, ev.prio);
	pfc_events.ringbuf_output(&ev, sizeof(ev), 0);
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

#endif
