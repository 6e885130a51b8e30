/* Ethernet + IPv4 (+ TCP/UDP ports) parsing with direct packet access. */
#ifndef FTB_PARSE_H
#define FTB_PARSE_H

#include "common.h"

/* Bytes the parser may touch: Ethernet, the longest IPv4 header, UDP and the first 8 bytes of a BTH. */
#define PARSE_BYTES (ETH_HLEN + 60 + 8 + 8)
#define ROCE_UDP_PORT 4791

/* Make the headers linear so direct access can see them (GRO'd or paged skbs). */
FTB_ALWAYS_INLINE void ensure_headers(struct __sk_buff *skb)
{
	__u32 have = (__u32)((long)skb->data_end - (long)skb->data);
	if (have < PARSE_BYTES && skb->len > have)
		bpf_skb_pull_data(skb, skb->len < PARSE_BYTES ? skb->len : PARSE_BYTES);
}

/* Fill *p; return -1 on success or the drop reason. */
FTB_ALWAYS_INLINE int parse_ipv4(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph;
	__u32 ihl;

	if ((void *)(eth + 1) > data_end)
		return DROP_MALFORMED;
	if (eth->h_proto != ftb_htons(ETH_P_IP))
		return DROP_NOT_IPV4;
	iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end)
		return DROP_MALFORMED;
	ihl = iph->ihl * 4;
	if (iph->version != 4 || ihl < sizeof(*iph))
		return DROP_MALFORMED;
	p->saddr = iph->saddr;
	p->daddr = iph->daddr;
	p->proto = iph->protocol;
	p->ttl = iph->ttl;
	p->tos = iph->tos;
	p->sport = 0;
	p->dport = 0;
	p->pad = 0;
	p->dqp = 0;
	/* Fragments (MF set or offset != 0) hash without ports, so all pieces of a datagram take one path. */
	if ((p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) && !(iph->frag_off & ftb_htons(0x3fff))) {
		__u16 *l4 = (void *)iph + ihl;
		if ((void *)(l4 + 2) > data_end)
			return DROP_MALFORMED;
		p->sport = ftb_ntohs(l4[0]);
		p->dport = ftb_ntohs(l4[1]);
		if (p->proto == IPPROTO_UDP && p->dport == ROCE_UDP_PORT) {
			__u8 *bth = (void *)l4 + 8;          /* a short datagram keeps dqp 0 */
			if ((void *)(bth + 8) <= data_end)
				p->dqp = ((__u32)bth[5] << 16) | ((__u32)bth[6] << 8) | bth[7];
		}
	}
	return -1;
}

#endif
