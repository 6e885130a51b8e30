/* MAC control frames arriving at a port, before any forwarding: a PFC frame (0x8808, opcode 0x0101) and a credit
 * frame (opcode 0xFC01) go to the agent (pfc.h, credit.h); the agent's kick frames are dropped. Shared by the
 * switch ports and the PFC-obeying host NICs (ftb_host_ingress). */
#ifndef FTB_MACCTL_H
#define FTB_MACCTL_H

#include "maps.h"
#include "pfc.h"
#include "credit.h"

/* Returns a tc verdict, or -1 for frames that are not MAC control (forward them). */
FTB_ALWAYS_INLINE int qos_control_rx(struct __sk_buff *skb, __u32 port)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u16 *w;

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
		credit_frame_rx(w, port);
		return TC_ACT_SHOT;
	}
	if (w[0] != ftb_htons(PFC_OPCODE))
		return TC_ACT_SHOT;
	pfc_frame_rx(w, port);
	return TC_ACT_SHOT;
}

#endif
