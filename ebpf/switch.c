/* fabric-testbed switch datapath: tc ingress program of every switch port.
 *
 * One compiled object serves every switch of the fabric: ports have fabric-unique ifindexes, so skb->ifindex
 * names both the switch and the port. Per packet: parse, look up (switch, dst) in the FIB, choose the egress
 * port by the switch's load-balancing mode (a port that lost its link is skipped: local fast failover), TTL − 1,
 * rewrite MACs, count, bpf_redirect (through the egress port's qdisc, which shapes the link). The logic lives
 * in the headers under lib/.
 *
 * BCC rewrites its map syntax (map.lookup(...)) only in the main file, so the loader inlines the quoted
 * includes below into one text before compiling (testbed/datapath/source.py); #line keeps error locations.
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/fib.h"
#include "lib/hash.h"
#include "lib/lb.h"
#include "lib/counters.h"
#include "lib/rewrite.h"
#include "lib/qos.h"
#include "lib/int.h"

/* Hand the decision so far (the parsed packet, switch, ports) to `stage` by a tail call; returns only when the
 * stage is missing (counted as a bad egress). */
FTB_ALWAYS_INLINE int to_stage(struct __sk_buff *skb, const struct pkt *p, __u32 sw, __u32 in, __u32 out,
			       __u32 stage)
{
	__u32 zero = 0;
	struct fwd_ctx *ctx = fwd_scratch.lookup(&zero);

	if (!ctx)
		return drop(in, DROP_BAD_EGRESS);
	ctx->p = *p;
	ctx->sw = sw;
	ctx->in = in;
	ctx->out = out;
	stages.call(skb, stage);
	return drop(in, DROP_BAD_EGRESS);
}

/* Send a packet whose egress port is chosen: rewrite, egress queueing (drop, ECN, PFC), counters, redirect. */
FTB_ALWAYS_INLINE int forward_out(struct __sk_buff *skb, __u32 sw, __u32 in, __u32 out, __u8 tos)
{
	struct port_info *egress = port_lookup(out);

	if (!egress)
		return drop(in, DROP_BAD_EGRESS);
	if (forward_rewrite(skb, egress) < 0)
		return drop(in, DROP_MALFORMED);
	if (qos_egress(skb, sw, in, out, tos) < 0)
		return TC_ACT_SHOT;        /* tail drop: counted per (egress port, priority) in queue_stats */
	count_tx(out, skb->len);
	count_load(sw, out, skb->len);
	int_count_tx(out, skb->len);
	return bpf_redirect(out, 0);
}

/* Send a packet, through the INT stage first where telemetry is due (lib/int.h). */
FTB_ALWAYS_INLINE int forward(struct __sk_buff *skb, __u32 sw, __u32 in, __u32 out, const struct pkt *p)
{
	if (int_wanted(p, in))
		return to_stage(skb, p, sw, in, out, STAGE_INT);
	return forward_out(skb, sw, in, out, p->tos);
}

int ftb_switch_ingress(struct __sk_buff *skb)
{
	__u32 in = skb->ifindex;
	__u64 slot;
	struct port_info *ingress;
	struct nh_group *group;
	struct sw_config *cfg;
	struct flow_state *fs;
	struct pkt p = {};
	__u32 out;
	int reason;

	ingress = port_lookup(in);
	if (!ingress)
		return drop(in, DROP_NO_PORT);
	count_rx(in, skb->len);

	ensure_headers(skb);
	reason = qos_control_rx(skb, in);
	if (reason >= 0)
		return reason;
	reason = parse_ipv4(skb, &p);
	if (reason >= 0)
		return drop(in, reason);
	if (p.ttl <= 1)
		return drop(in, DROP_TTL);

	group = fib_lookup(ingress->switch_id, p.daddr);
	if (!group)
		return drop(in, DROP_NO_ROUTE);
	if (group->n == 0)
		return drop(in, DROP_EMPTY_GROUP);

	cfg = sw_config.lookup(&ingress->switch_id);
	if (cfg && (cfg->mode == MODE_ADAPTIVE || cfg->mode == MODE_DLB) && group->n > 1) {
		/* adaptive routing and DLB read the state of every candidate: a stage of its own (verifier
		 * complexity) — except for a packet inside a flowlet, which keeps its port and is sent from here */
		slot = ar_kept_slot(cfg, ingress->switch_id, group, &p, &fs);
		if (slot >= MAX_NH)
			return to_stage(skb, &p, ingress->switch_id, in, 0, STAGE_ADAPTIVE);
	} else {
		slot = lb_choose(ingress->switch_id, group, &p, &fs);
	}
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		return drop(in, DROP_BAD_EGRESS);
	out = group->ports[slot];
	if (port_is_down(out)) {
		/* the chosen port lost its link: another live port of the group, in a stage of its own (a loop over
		 * the group, paid only while a link is down) */
		return to_stage(skb, &p, ingress->switch_id, in, 0, STAGE_FAILOVER);
	}
	lb_count(fs, slot, skb->len);
	return forward(skb, ingress->switch_id, in, out, &p);
}

/* Stage: the port the load balancer chose has lost its link; take another live port of the group (rendezvous
 * over the flow's hash, or a random number when spraying), or drop the packet when none is left. */
int ftb_stage_failover(struct __sk_buff *skb)
{
	__u32 zero = 0, h;
	struct fwd_ctx *ctx = fwd_scratch.lookup(&zero);
	struct nh_group *group;
	struct sw_config *cfg;
	struct flow_state *fs = 0;
	__u64 slot;
	__u32 n;

	if (!ctx)
		return TC_ACT_SHOT;
	cfg = sw_config.lookup(&ctx->sw);
	group = fib_lookup(ctx->sw, ctx->p.daddr);
	if (!cfg || !group)
		return drop(ctx->in, DROP_NO_ROUTE);
	n = group->n < MAX_NH ? group->n : MAX_NH;
	if (cfg->mode == MODE_SPRAY)
		h = bpf_get_prandom_u32();
	else
		h = pkt_hash(cfg->seed, cfg->hash_fields, &ctx->p);
	slot = failover_slot(group, n, h);
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		return drop(ctx->in, DROP_PORT_DOWN);
	if (n > 1 || cfg->track)
		fs = flow_state_of(ctx->sw, &ctx->p);
	lb_count(fs, slot, skb->len);
	ctx->out = group->ports[slot];
	stages.call(skb, STAGE_FORWARD);
	return drop(ctx->in, DROP_BAD_EGRESS);
}

/* Stage: adaptive routing chooses the least loaded allowed port, DLB a port of the best quality band at a
 * flowlet's start (lb/adaptive.h, lb/dlb.h), then hands over to STAGE_FORWARD. */
int ftb_stage_adaptive(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct fwd_ctx *ctx = fwd_scratch.lookup(&zero);
	struct nh_group *group;
	struct sw_config *cfg;
	__u64 slot;

	if (!ctx)
		return TC_ACT_SHOT;
	cfg = sw_config.lookup(&ctx->sw);
	group = fib_lookup(ctx->sw, ctx->p.daddr);
	if (!cfg || !group)
		return drop(ctx->in, DROP_NO_ROUTE);
	slot = lb_stage_choose(cfg, ctx->sw, group, &ctx->p, packet_prio(ctx->sw, ctx->p.tos), skb->len);
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		return drop(ctx->in, DROP_PORT_DOWN);       /* every candidate lost its link */
	ctx->out = group->ports[slot];
	stages.call(skb, STAGE_FORWARD);
	return drop(ctx->in, DROP_BAD_EGRESS);
}

/* Stage: send a packet whose egress port an earlier stage chose. */
int ftb_stage_forward(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct fwd_ctx *ctx = fwd_scratch.lookup(&zero);

	if (!ctx)
		return TC_ACT_SHOT;
	return forward(skb, ctx->sw, ctx->in, ctx->out, &ctx->p);
}

#if FTB_INT_STAGE
/* Stage: in-band telemetry on a packet whose egress port is chosen (source, transit or sink), then send it. */
int ftb_stage_int(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct fwd_ctx *ctx = fwd_scratch.lookup(&zero);
	int tos;

	if (!ctx)
		return TC_ACT_SHOT;
	tos = int_hop(skb, ctx->sw, ctx->in, ctx->out, &ctx->p);
	if (tos == INT_CONSUMED)
		return TC_ACT_SHOT;                           /* a probe, exported by its sink: counted in int_stats */
	if (tos < 0)
		return drop(ctx->in, DROP_MALFORMED);
	return forward_out(skb, ctx->sw, ctx->in, ctx->out, (__u8)tos);
}
#endif

/* XDP on the leaf's host-facing ports: the host NIC's "transmit completion".
 *
 * veth keeps the sending socket's reference on an skb across namespaces, so without this a host's socket would
 * stay charged for its packets until they leave the *last* hop: every queue in the fabric would back-pressure
 * the sender, and a blasting UDP sender would never see congestion loss (the fabric would behave as if it were
 * lossless end to end). With an XDP program attached, veth rebuilds the skb for XDP and frees the original,
 * which releases the socket the way a real NIC does once the frame is on the wire. The packet goes on
 * unchanged (XDP_PASS) to the tc ingress program above.
 */
int ftb_nic_release(struct xdp_md *ctx)
{
	return XDP_PASS;
}

/* Host NICs that obey PFC (hosts.pfc): pause frames from the leaf go to the agent; everything else passes. */
int ftb_host_ingress(struct __sk_buff *skb)
{
	int verdict = qos_control_rx(skb, skb->ifindex);
	return verdict >= 0 ? verdict : TC_ACT_OK;
}

/* User space's atomic changes to the queue model (resync with the real backlog, shift after a pause, Xon reset),
 * run with BPF_PROG_TEST_RUN on a packet holding one struct ctl_cmd (testbed/datapath: Datapath.control). */
int ftb_ctl(struct __sk_buff *skb)
{
	struct ctl_cmd c = {};

	if (bpf_skb_load_bytes(skb, 0, &c, sizeof(c)) < 0)
		return -3;
	return qos_control(&c);
}
