/* fabric-testbed switch datapath: tc ingress program of every switch port.
 *
 * One compiled object serves every switch of the fabric: ports have fabric-unique ifindexes, so skb->ifindex
 * names both the switch and the port. Per packet: parse, look up (switch, dst) in the FIB, choose the egress
 * port by the switch's load-balancing mode, TTL − 1, rewrite MACs, count, bpf_redirect (through the egress
 * port's qdisc, which shapes the link). The logic lives in the headers under lib/.
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

int ftb_switch_ingress(struct __sk_buff *skb)
{
	__u32 in = skb->ifindex, out;
	__u64 slot;
	struct port_info *ingress, *egress;
	struct nh_group *group;
	struct pkt p = {};
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

	slot = lb_choose(ingress->switch_id, group, &p);
	ftb_opaque(slot);
	if (slot >= MAX_NH)
		return drop(in, DROP_BAD_EGRESS);
	out = group->ports[slot];
	egress = port_lookup(out);
	if (!egress)
		return drop(in, DROP_BAD_EGRESS);

	if (forward_rewrite(skb, egress) < 0)
		return drop(in, DROP_MALFORMED);
	if (qos_egress(skb, ingress->switch_id, in, out, p.tos) < 0)
		return TC_ACT_SHOT;        /* tail drop: counted per (egress port, priority) in queue_stats */
	count_tx(out, skb->len);
	return bpf_redirect(out, 0);
}

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
