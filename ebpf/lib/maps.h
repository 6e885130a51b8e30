/* Every map of the switch datapath. One set serves all switches: keys carry the switch id or a fabric-unique
 * ifindex. Names are read by testbed/datapath/__init__.py. */
#ifndef FTB_MAPS_H
#define FTB_MAPS_H

#include "common.h"

BPF_ARRAY(ports, struct port_info, PORT_SLOTS);
BPF_LPM_TRIE(fib, struct fib_key, struct nh_group, FIB_SIZE);
BPF_ARRAY(sw_config, struct sw_config, N_SWITCHES);
BPF_ARRAY(rr_next, __u32, N_SWITCHES);
BPF_TABLE("lru_hash", struct flow_key, struct flow_state, flows, FLOW_SIZE);
/* One all-zero flow_state, the initial value of new `flows` entries (too big for the 512-byte stack when
 * MAX_NH is large). Never written. */
BPF_ARRAY(flow_zero, struct flow_state, 1);
BPF_PERCPU_ARRAY(port_stats, struct port_stats, PORT_SLOTS);
BPF_PERCPU_ARRAY(drop_reason_counts, __u64, DROP_MAX);   /* not "drop_reasons": a kernel symbol in full headers */

#endif
