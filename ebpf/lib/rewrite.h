/* What a router does to a forwarded frame: TTL − 1 (checksum fixed incrementally), new Ethernet addresses. */
#ifndef FTB_REWRITE_H
#define FTB_REWRITE_H

#include "common.h"

/* RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), on the 16-bit word holding TTL and protocol. */
FTB_ALWAYS_INLINE __u16 csum_replace16(__u16 check, __u16 old, __u16 new)
{
	__u32 sum = (__u16)~ftb_ntohs(check);
	sum += (__u16)~old;
	sum += new;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ftb_htons((__u16)~sum);
}

/* Return 0, or -1 when the headers are no longer reachable (cannot happen after a successful parse). */
FTB_ALWAYS_INLINE int forward_rewrite(struct __sk_buff *skb, const struct port_info *out)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = (void *)(eth + 1);
	__u16 old, new;

	if ((void *)(iph + 1) > data_end)
		return -1;
	old = ((__u16)iph->ttl << 8) | iph->protocol;
	iph->ttl--;
	new = ((__u16)iph->ttl << 8) | iph->protocol;
	iph->check = csum_replace16(iph->check, old, new);
	__builtin_memcpy(eth->h_source, out->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, out->peer_mac, ETH_ALEN);
	return 0;
}

#endif
