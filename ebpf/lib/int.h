/* In-band network telemetry: INT-MD over UDP — the P4.org INT 2.1 shim for UDP, with the packet's DSCP bit 0
 * telling that a stack follows (so the UDP ports, and every switch's hash of the flow, stay as they were).
 * The exact format is in docs/int.md.
 *
 * Two kinds of stack. Leaf stacks (telemetry.int) are started and ended in the fabric, as below. Host stacks
 * (traffic.cc: hpcc, host_stacks in int_config) are started by the sending host — an empty stack with the
 * shim's INT_SHIM_HOST flag — and every switch on the way, the first and the last leaf included, adds its record
 * as a transit hop; the destination host is the sink (HPCC's receiver NIC copies the records into its ACK).
 *
 * An instrumented packet: Ethernet | IPv4 (20 B, DSCP bit 0 set) | UDP | shim | INT-MD header | hop records,
 * newest first | the original UDP payload. The leaf a host's packet enters (the source) inserts shim, header
 * and its own record after the UDP header; every switch on the way inserts its record under the header while
 * the remaining hop count allows (else it sets the E bit); the leaf whose egress faces the receiving host (the
 * sink) exports the stack with its own record to user space (ring buffer int_reports) and removes it, so the
 * host receives the packet it was sent (TTL and MACs as any router leaves them). IP length and checksum, UDP
 * length and checksum stay valid at every hop (the UDP checksum incrementally, also for checksum-offloaded
 * packets; a zero one stays zero); the sink restores the original UDP checksum from the header's
 * domain-specific flags. Packets with IP options, fragments, and packets whose stack would not fit the fabric
 * MTU are not instrumented (the last counted in int_stats). Runs in a stage of its own (STAGE_INT).
 */
#ifndef FTB_INT_H
#define FTB_INT_H

#include <linux/udp.h>
#include "maps.h"
#include "classify.h"
#include "vqueue.h"

#define INT_IP_OFF ETH_HLEN
#define INT_UDP_OFF (ETH_HLEN + 20)
#define INT_CSUM_OFF (INT_UDP_OFF + 6)
#define INT_SHIM_OFF (INT_UDP_OFF + 8)
#define INT_STACK_OFF (INT_SHIM_OFF + INT_HDR_BYTES)
#define INT_BLOCK 56              /* what a hop rewrites after the IP header, in 4-byte words below: the source
                                   * UDP header (8) + shim + header + its record (48); a transit hop UDP header,
                                   * shim and header (24) + its record (32) */
#define INT_TYPE_MD 1
#define INT_VERSION 2
#define INT_HOP_WORDS (INT_HOP_BYTES / 4)
#define INT_INSTRUCTIONS 0xF800   /* bits 0–4 of the INT 2.1 bitmap: node id, L1 ingress + egress port ids, hop
                                   * latency, queue id + occupancy, ingress timestamp */
#define INT_DS_ID 0x4654          /* "FT": this testbed's domain */
#define INT_DS_INSTRUCTIONS 0xC000 /* egress port tx bytes (low 32 bits), egress link rate (kbit/s) */
#define INT_E_BIT (1u << 26)      /* header word 0: a hop had no room left (max hop count exceeded) */
#define INT_CONSUMED (-2)         /* int_hop: the packet (a probe) ends here */

struct int_hdr {                  /* shim + INT-MD header: 16 bytes as on the wire */
	__u8 type_npt;            /* type (1: INT-MD) << 4 | NPT (0: the UDP payload follows) << 2 */
	__u8 len;                 /* shim + header + stack, in 4-byte words */
	__u8 flags;               /* INT_SHIM_HOST: a host stack, delivered to the destination host */
	__u8 tos;                 /* the packet's TOS before the source marked it */
	__u32 w0;                 /* version 2 | E | HopML (8 words) | remaining hop count (network order) */
	__u16 instructions;
	__u16 ds_id;
	__u16 ds_instructions;
	__u16 ds_flags;           /* the original UDP checksum (as on the wire) */
};

/* What a hop rewrites after the IP header (INT_BLOCK bytes): the UDP header, shim + header and its record —
 * the source writes all three anew, a transit hop changes the first two. One type for every access, so the
 * compiler's aliasing rules cannot reorder a field's read before the copy that fills it. */
struct int_block {
	struct udphdr udp;
	struct int_hdr hdr;
	__u32 rec[INT_HOP_WORDS];
};

struct int_head {                 /* what a hop reads: the UDP header and shim + header */
	struct udphdr udp;
	struct int_hdr hdr;
};

struct ip_w0 {                    /* the first word of the IPv4 header */
	__u8 vihl;
	__u8 tos;
	__u16 tot_len;            /* network order */
};

FTB_ALWAYS_INLINE void int_count(__u32 what)
{
	__u64 *c = int_stats.lookup(&what);
	if (c)
		*c += 1;
}

FTB_ALWAYS_INLINE int port_is_edge(__u32 ifindex)
{
	struct port_info *pi = ports.lookup(&ifindex);
	return pi && (pi->flags & PORT_EDGE);
}

/* This switch's record for a packet of `len` bytes leaving through `out` (queue `prio`) now: the queue it joins
 * (the model's depth, bytes), its hop latency (the wait for that queue + its own serialisation, ns), the port's
 * tx byte count and link rate. */
FTB_ALWAYS_INLINE void int_hop_record(__u32 *w, __u32 sw, __u32 in, __u32 out, __u64 prio, __u64 len, __u64 now)
{
	struct port_qos *pq = port_qos.lookup(&out);
	__u64 *tx = port_tx.lookup(&out);
	__u64 ps = pq ? pq->ps_per_byte : 0, wait = 0, q = 0, lat = 0;

	if (ps) {
		wait = ar_queue_ns(out, prio, now);
		if (wait > 0xffffffffULL)
			wait = 0xffffffffULL;
		q = wait * 1000 / ps;
		lat = wait + len * ps / 1000;
	}
	if (q > 0xffffff)
		q = 0xffffff;
	if (lat > 0xffffffffULL)
		lat = 0xffffffffULL;
	w[0] = ftb_htonl(sw);
	w[1] = ftb_htonl((in << 16) | (out & 0xffff));
	w[2] = ftb_htonl((__u32)lat);
	w[3] = ftb_htonl((__u32)((prio << 24) | q));
	w[4] = ftb_htonl((__u32)(now >> 32));
	w[5] = ftb_htonl((__u32)now);
	w[6] = ftb_htonl(tx ? (__u32)*tx : 0);
	w[7] = ftb_htonl(ps ? (__u32)(8000000000ULL / ps) : 0);
}

/* Rewrite the block after the IP header: `old` (`old_len` bytes: the UDP header, and at transit shim + header)
 * becomes `blk` after `add` bytes were made room for; UDP and IP lengths and checksums follow. Returns the new
 * TOS, or -1 when the packet was changed but could not be finished (the caller drops it). */
FTB_ALWAYS_INLINE int int_grow(struct __sk_buff *skb, const struct int_head *old, __u32 old_len,
			       const struct int_block *blk, __u32 add, struct ip_w0 ip, __u8 tos)
{
	struct ip_w0 ip1 = ip;
	__s64 diff;

	if (bpf_skb_adjust_room(skb, add, BPF_ADJ_ROOM_NET, 0) < 0) {
		int_count(INT_FAILED);
		return ip.tos;            /* nothing changed: forwarded uninstrumented */
	}
	if (bpf_skb_store_bytes(skb, INT_UDP_OFF, (void *)blk, INT_BLOCK, 0) < 0)
		return -1;
	diff = bpf_csum_diff((__be32 *)old, old_len, (__be32 *)blk, INT_BLOCK, 0);
	bpf_l4_csum_replace(skb, INT_CSUM_OFF, 0, diff, BPF_F_MARK_MANGLED_0);
	bpf_l4_csum_replace(skb, INT_CSUM_OFF, old->udp.len, blk->udp.len, BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 2);
	ip1.tos = tos;
	ip1.tot_len = ftb_htons(ftb_ntohs(ip.tot_len) + add);
	if (bpf_skb_store_bytes(skb, INT_IP_OFF, &ip1, 4, 0) < 0)
		return -1;
	bpf_l3_csum_replace(skb, INT_IP_OFF + 10, *(__u32 *)&ip, *(__u32 *)&ip1, 4);
	return tos;
}

/* Source: shim, header and the first record after the UDP header — if the largest stack fits the fabric MTU. */
FTB_ALWAYS_INLINE int int_source(struct __sk_buff *skb, const struct int_config *cfg, __u32 sw, __u32 in, __u32 out,
				 __u64 prio, __u64 now, struct ip_w0 ip)
{
	struct int_head old = {};
	struct int_block blk = {};
	__u32 add = INT_HDR_BYTES + INT_HOP_BYTES, hops = cfg->max_hops;

	if (hops < 1 || hops > INT_MAX_HOPS)
		hops = INT_MAX_HOPS;
	if (ftb_ntohs(ip.tot_len) + INT_HDR_BYTES + hops * INT_HOP_BYTES > cfg->mtu) {
		int_count(INT_NO_ROOM);
		return ip.tos;
	}
	if (bpf_skb_load_bytes(skb, INT_UDP_OFF, &old.udp, sizeof(old.udp)) < 0)
		return ip.tos;
	blk.udp = old.udp;
	blk.udp.len = ftb_htons(ftb_ntohs(old.udp.len) + add);
	blk.hdr.type_npt = INT_TYPE_MD << 4;
	blk.hdr.len = (INT_HDR_BYTES + INT_HOP_BYTES) / 4;
	blk.hdr.tos = ip.tos;
	blk.hdr.w0 = ftb_htonl((INT_VERSION << 28) | (INT_HOP_WORDS << 8) | (hops - 1));
	blk.hdr.instructions = ftb_htons(INT_INSTRUCTIONS);
	blk.hdr.ds_id = ftb_htons(INT_DS_ID);
	blk.hdr.ds_instructions = ftb_htons(INT_DS_INSTRUCTIONS);
	blk.hdr.ds_flags = old.udp.check;
	int_hop_record(blk.rec, sw, in, out, prio, skb->len + add, now);
	int_count(INT_SOURCED);
	return int_grow(skb, &old, sizeof(old.udp), &blk, add, ip, ip.tos | INT_DSCP_BIT);
}

/* Transit: this switch's record under the header, or the E bit when no hop count is left. `old`: the packet's
 * UDP header and shim + header as it arrived. */
FTB_ALWAYS_INLINE int int_transit(struct __sk_buff *skb, __u32 sw, __u32 in, __u32 out, __u64 prio, __u64 now,
				  struct ip_w0 ip, const struct int_head *old)
{
	struct int_block blk = {};
	__u32 w0, e;

	w0 = ftb_ntohl(old->hdr.w0);
	if ((w0 & 0xff) == 0) {                       /* no room left: say so, add nothing */
		e = ftb_htonl(w0 | INT_E_BIT);
		if (!(w0 & INT_E_BIT)) {
			bpf_skb_store_bytes(skb, INT_SHIM_OFF + 4, &e, 4, 0);
			bpf_l4_csum_replace(skb, INT_CSUM_OFF, old->hdr.w0, e, BPF_F_MARK_MANGLED_0 | 4);
		}
		int_count(INT_EXCEEDED);
		return ip.tos;
	}
	blk.udp = old->udp;
	blk.hdr = old->hdr;
	blk.udp.len = ftb_htons(ftb_ntohs(old->udp.len) + INT_HOP_BYTES);
	blk.hdr.len = old->hdr.len + INT_HOP_WORDS;
	blk.hdr.w0 = ftb_htonl(w0 - 1);
	int_hop_record(blk.rec, sw, in, out, prio, skb->len + INT_HOP_BYTES, now);
	int_count(INT_TRANSIT);
	return int_grow(skb, old, sizeof(*old), &blk, INT_HOP_BYTES, ip, ip.tos);
}

/* Export a report: this switch's record (unless the hop count ran out) and the `hops` records of the packet's
 * stack (none: a flow that enters and leaves the same leaf). */
FTB_ALWAYS_INLINE void int_export(struct __sk_buff *skb, const struct pkt *p, __u32 sw, __u32 in, __u32 out,
				  __u64 prio, __u64 now, __u32 hops, __u32 own, __u32 exceeded, __u32 len)
{
	struct int_report *r = int_reports.ringbuf_reserve(sizeof(struct int_report));
	__u64 n = hops, len_b;

	if (!r) {
		int_count(INT_EXPORT_LOST);
		return;
	}
	r->ts = now;
	r->saddr = p->saddr;
	r->daddr = p->daddr;
	r->sport = p->sport;
	r->dport = p->dport;
	r->proto = p->proto;
	r->flags = exceeded || !own;
	r->pad = 0;
	r->len = len;
	r->pad2 = 0;
	/* the bounds are checked on the very value passed (ftb_opaque): the verifier must see a non-zero size */
	if (own) {
		int_hop_record((__u32 *)r->stack, sw, in, out, prio, len + ETH_HLEN, now);
		len_b = n * INT_HOP_BYTES;
		ftb_opaque(len_b);
		if (len_b >= INT_HOP_BYTES && len_b <= (INT_MAX_HOPS - 1) * INT_HOP_BYTES) {
			if (bpf_skb_load_bytes(skb, INT_STACK_OFF, r->stack + INT_HOP_BYTES, len_b) < 0)
				n = 0;
		} else {
			n = 0;
		}
	} else {
		len_b = n * INT_HOP_BYTES;
		ftb_opaque(len_b);
		if (len_b >= INT_HOP_BYTES && len_b <= INT_MAX_HOPS * INT_HOP_BYTES) {
			if (bpf_skb_load_bytes(skb, INT_STACK_OFF, r->stack, len_b) < 0)
				n = 0;
		} else {
			n = 0;
		}
	}
	r->hops = n + (own ? 1 : 0);
	int_reports.ringbuf_submit(r, 0);
	int_count(INT_EXPORTED);
}

/* Sink: export the stack with this switch's record, then remove it and restore what the source changed. */
FTB_ALWAYS_INLINE int int_sink(struct __sk_buff *skb, const struct pkt *p, __u32 sw, __u32 in, __u32 out, __u64 prio,
			       __u64 now, struct ip_w0 ip, const struct int_head *head)
{
	struct int_head old = *head;
	struct udphdr u;
	struct ip_w0 ip1 = ip;
	__u32 total, hops, w0;

	total = (__u32)old.hdr.len * 4;
	if (total < INT_HDR_BYTES || (total - INT_HDR_BYTES) % INT_HOP_BYTES ||
	    total > INT_HDR_BYTES + INT_MAX_HOPS * INT_HOP_BYTES || total + 8 > ftb_ntohs(old.udp.len)) {
		int_count(INT_FAILED);
		return ip.tos;
	}
	hops = (total - INT_HDR_BYTES) / INT_HOP_BYTES;
	w0 = ftb_ntohl(old.hdr.w0);
	if ((w0 & 0xff) == 0)
		int_count(INT_EXCEEDED);                  /* its own record does not fit either */
	int_export(skb, p, sw, in, out, prio, now, hops, (w0 & 0xff) != 0, (w0 & INT_E_BIT) != 0,
		   ftb_ntohs(ip.tot_len) - total);
	if (p->dport == INT_PROBE_PORT) {             /* a controller's probe: measured, it goes no further */
		int_count(INT_PROBES);
		return INT_CONSUMED;
	}
	/* the UDP header, restored, goes just before the payload; then the room between goes */
	u = old.udp;
	u.len = ftb_htons(ftb_ntohs(old.udp.len) - total);
	u.check = old.hdr.ds_flags;
	if (bpf_skb_store_bytes(skb, INT_UDP_OFF + total, &u, sizeof(u), 0) < 0)
		return -1;
	if (bpf_skb_adjust_room(skb, -(__s32)total, BPF_ADJ_ROOM_NET, 0) < 0)
		return -1;
	ip1.tos = (old.hdr.tos & ~ECN_MASK) | (ip.tos & ECN_MASK);    /* a CE mark on the way stays */
	ip1.tot_len = ftb_htons(ftb_ntohs(ip.tot_len) - total);
	if (bpf_skb_store_bytes(skb, INT_IP_OFF, &ip1, 4, 0) < 0)
		return -1;
	bpf_l3_csum_replace(skb, INT_IP_OFF + 10, *(__u32 *)&ip, *(__u32 *)&ip1, 4);
	return ip1.tos;
}

/* Whether a packet goes through the INT stage: UDP carrying a stack, or (telemetry.int) entering the fabric from a
 * host. */
FTB_ALWAYS_INLINE int int_wanted(const struct pkt *p, __u32 in)
{
	__u32 zero = 0;
	struct int_config *cfg = int_config.lookup(&zero);

	return cfg && (cfg->enabled || cfg->host_stacks) && p->proto == IPPROTO_UDP && (p->sport || p->dport) &&
	       ((p->tos & INT_DSCP_BIT) || (cfg->enabled && port_is_edge(in)));
}

/* Count a sent packet against its port's tx bytes (the hop records' tx counter), with INT or host stacks on. */
FTB_ALWAYS_INLINE void int_count_tx(__u32 out, __u64 len)
{
	__u32 zero = 0;
	struct int_config *cfg = int_config.lookup(&zero);
	__u64 *tx;

	if (!cfg || !(cfg->enabled || cfg->host_stacks))
		return;
	tx = port_tx.lookup(&out);
	if (tx)
		__sync_fetch_and_add(tx, len);
}

/* The INT stage's work on a packet leaving switch `sw` through `out`: source, transit or sink. Returns the
 * packet's TOS afterwards, -1 when it is broken (drop it), INT_CONSUMED for a probe that ended at its sink. A packet
 * from a host with DSCP bit 0 already carries a stack (a host stack): it is transit here, and at its last leaf too
 * when the shim says its destination host is the sink. */
FTB_ALWAYS_INLINE int int_hop(struct __sk_buff *skb, __u32 sw, __u32 in, __u32 out, const struct pkt *p)
{
	__u32 zero = 0;
	struct int_config *cfg = int_config.lookup(&zero);
	struct flow_state *fs;
	struct int_head old;
	struct ip_w0 ip;
	__u64 prio, now;
	int out_edge, tos;

	if (!cfg || bpf_skb_load_bytes(skb, INT_IP_OFF, &ip, 4) < 0)
		return p->tos;
	if (ip.vihl != 0x45)          /* IP options: not instrumented (nor are they ever carrying a stack) */
		return ip.tos;
	prio = packet_prio(sw, ip.tos);
	now = bpf_ktime_get_ns();
	out_edge = port_is_edge(out);
	if (!(ip.tos & INT_DSCP_BIT)) {
		if (!cfg->enabled || !port_is_edge(in))
			return ip.tos;    /* host stacks only: a plain packet is not instrumented */
		if (cfg->sample > 1) {
			fs = flow_state_of(sw, p);
			if (!fs || fs->int_seq++ % cfg->sample)
				return ip.tos;
		}
		if (out_edge) {           /* enters and leaves this leaf: a one-hop report, the packet unchanged */
			int_export(skb, p, sw, in, out, prio, now, 0, 1, 0, ftb_ntohs(ip.tot_len));
			return ip.tos;
		}
		return int_source(skb, cfg, sw, in, out, prio, now, ip);
	}
	if (bpf_skb_load_bytes(skb, INT_UDP_OFF, &old, sizeof(old)) < 0)
		return ip.tos;
	if (old.hdr.type_npt >> 4 != INT_TYPE_MD) {
		int_count(INT_FAILED);
		return ip.tos;
	}
	if (!(old.hdr.flags & INT_SHIM_HOST)) {
		if (!cfg->enabled) {      /* a leaf stack while only host stacks are on: leave it alone */
			int_count(INT_FAILED);
			return ip.tos;
		}
		if (out_edge)
			return int_sink(skb, p, sw, in, out, prio, now, ip, &old);
		return int_transit(skb, sw, in, out, prio, now, ip, &old);
	}
	if (!cfg->host_stacks) {          /* a host stack while host stacks are off: not ours to extend */
		int_count(INT_FAILED);
		return ip.tos;
	}
	tos = int_transit(skb, sw, in, out, prio, now, ip, &old);
	if (out_edge && tos >= 0)
		int_count(INT_DELIVERED);
	return tos;
}

#endif
