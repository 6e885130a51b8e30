/* Packet trimming (switch.trim), as UEC switches do: a RoCEv2 data packet that its lossy egress queue cannot take
 * is cut to its headers and sent on a high priority of its own, so the receiver learns of the loss one RTT
 * after it happened (and asks for that packet again) instead of after a timeout.
 *
 * The wire contract with the receiver (testbed/workloads/roce/wire.py BTH_TRIMMED): a RoCEv2 packet (IPv4 without
 * options, UDP destination port 4791) with bit 0x20 of BTH byte 4 set is a trimmed header. That byte is resv8a,
 * beside FECN (0x80) and BECN (0x40); the ICRC masks it, and no RoCE NIC sets the bit. What is kept: the IP
 * header (20 B), the UDP header (8 B) and the first TRIM_KEEP (64) bytes of the UDP payload — the BTH (12 B) and
 * the transport's own header (RETH 16 B, or whatever it carries); the IP packet is 92 bytes long, its total
 * length and header checksum fixed, the UDP length 72 and the UDP checksum 0 (none, allowed for IPv4: RoCE
 * NICs send 0). The ICRC is gone with the payload: a receiver must not check it on a trimmed header.
 *
 * Classification: at every switch of a fabric where some tier trims, a packet that arrives flagged goes to the
 * trim priority (it keeps its high priority to the receiver) and is never trimmed again. qos_egress (qos.h)
 * decides when to trim and enqueues the result; this file only recognises and cuts packets.
 */
#ifndef FTB_TRIM_H
#define FTB_TRIM_H

#include <linux/udp.h>
#include "maps.h"

#define TRIM_ROCE_PORT 4791
#define TRIM_KEEP 64              /* UDP payload bytes a trim keeps: BTH (12) + room for the transport's header */
#define TRIM_FLAG 0x20            /* in BTH byte 4 (resv8a) */
#define TRIM_IP_OFF ETH_HLEN
#define TRIM_UDP_OFF (ETH_HLEN + 20)
#define TRIM_FLAGS_OFF (TRIM_UDP_OFF + 8 + 4)
#define TRIM_IP_LEN (20 + 8 + TRIM_KEEP)

enum { TRIM_NO = 0, TRIM_CANDIDATE = 1, TRIM_FLAGGED = 2 };

struct trim_head {                /* what trim_kind reads: IPv4 header without options, UDP header, BTH bytes 0–7 */
	struct iphdr ip;
	struct udphdr udp;
	__u8 bth[8];
};

/* What trimming makes of this packet at a switch with configuration `cfg`: TRIM_FLAGGED (a trimmed header:
 * classify it to the trim priority), TRIM_CANDIDATE (a RoCEv2 packet with more than TRIM_KEEP bytes of UDP
 * payload, not a GSO aggregate: it may be trimmed here), or TRIM_NO. */
FTB_ALWAYS_INLINE int trim_kind(struct __sk_buff *skb, const struct qos_config *cfg)
{
	struct trim_head h;

	if (!cfg->trim_on && !cfg->trim_classify)
		return TRIM_NO;
	if (bpf_skb_load_bytes(skb, TRIM_IP_OFF, &h, sizeof(h)) < 0)
		return TRIM_NO;
	if (((__u8 *)&h.ip)[0] != 0x45 || h.ip.protocol != IPPROTO_UDP || (h.ip.frag_off & ftb_htons(0x3fff)) ||
	    h.udp.dest != ftb_htons(TRIM_ROCE_PORT))
		return TRIM_NO;
	if (h.bth[4] & TRIM_FLAG)
		return cfg->trim_classify ? TRIM_FLAGGED : TRIM_NO;
	if (!cfg->trim_on || ftb_ntohs(h.udp.len) <= 8 + TRIM_KEEP || skb->gso_segs > 1)
		return TRIM_NO;
	return TRIM_CANDIDATE;
}

/* Cut a TRIM_CANDIDATE to IP + UDP + TRIM_KEEP bytes: IP total length and checksum fixed, UDP length fixed and
 * its checksum 0, the trim flag set. Returns 0, or -1 when the packet could not be changed (drop it). */
FTB_ALWAYS_INLINE int trim_cut(struct __sk_buff *skb)
{
	__u16 old_len, new_len = ftb_htons(TRIM_IP_LEN);
	__u16 udp[2] = {ftb_htons(8 + TRIM_KEEP), 0};     /* UDP length, checksum */
	__u8 flags;

	if (bpf_skb_load_bytes(skb, TRIM_IP_OFF + 2, &old_len, 2) < 0 ||
	    bpf_skb_load_bytes(skb, TRIM_FLAGS_OFF, &flags, 1) < 0)
		return -1;
	if (bpf_skb_change_tail(skb, ETH_HLEN + TRIM_IP_LEN, 0) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, TRIM_IP_OFF + 2, &new_len, 2, 0) < 0 ||
	    bpf_l3_csum_replace(skb, TRIM_IP_OFF + 10, old_len, new_len, 2) < 0)
		return -1;
	flags |= TRIM_FLAG;
	if (bpf_skb_store_bytes(skb, TRIM_UDP_OFF + 4, udp, 4, 0) < 0 ||
	    bpf_skb_store_bytes(skb, TRIM_FLAGS_OFF, &flags, 1, 0) < 0)
		return -1;
	return 0;
}

#endif
