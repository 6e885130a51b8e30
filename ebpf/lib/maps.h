/* Every map of the switch datapath. One set serves all switches: keys carry the switch id or a fabric-unique
 * ifindex. Names are read by testbed/datapath/__init__.py. */
#ifndef FTB_MAPS_H
#define FTB_MAPS_H

#include "common.h"

BPF_ARRAY(ports, struct port_info, PORT_SLOTS);
BPF_LPM_TRIE(fib, struct fib_key, struct nh_group, FIB_SIZE);
BPF_ARRAY(sw_config, struct sw_config, N_SWITCHES);
/* 1: the port has lost its link (no carrier, or set down); kept by the link-state watcher (control/routing.py).
 * Every egress choice skips such ports: local fast failover. */
BPF_ARRAY(port_down, __u32, PORT_SLOTS);
BPF_ARRAY(rr_next, __u32, N_SWITCHES);
BPF_TABLE("lru_hash", struct flow_key, struct flow_state, flows, FLOW_SIZE);
/* One all-zero flow_state, the initial value of new `flows` entries (too big for the 512-byte stack when
 * MAX_NH is large). Never written. */
BPF_ARRAY(flow_zero, struct flow_state, 1);
BPF_PERCPU_ARRAY(port_stats, struct port_stats, PORT_SLOTS);
BPF_ARRAY(port_load, struct port_load, PORT_SLOTS);     /* adaptive routing's load metric (lib/port_load.h) */
BPF_PERCPU_ARRAY(fwd_scratch, struct fwd_ctx, 1);
BPF_PERCPU_ARRAY(ar_scratch, struct ar_scratch, 1);       /* the decision handed between stages (tail calls) */
BPF_PERCPU_ARRAY(fo_scratch, struct fo_scratch, 1);     /* the failover stage's choice (lib/fib.h) */
BPF_PROG_ARRAY(stages, N_STAGES);                       /* STAGE_*: filled by the loader */
BPF_PERCPU_ARRAY(drop_reason_counts, __u64, DROP_MAX);   /* not "drop_reasons": a kernel symbol in full headers */

/* Congestion and flow control (lib/qos.h and the headers it composes). */
BPF_ARRAY(qos_config, struct qos_config, N_SWITCHES);
BPF_ARRAY(port_qos, struct port_qos, PORT_SLOTS);
BPF_ARRAY(vq, struct vqueue, PORT_SLOTS * N_PRIO);      /* the model of each egress queue */
BPF_ARRAY(egress_paused, __u64, PORT_SLOTS * N_PRIO);   /* paused since (ns), 0 = running; written by the agent */
BPF_ARRAY(ingress_state, struct ingress_state, PORT_SLOTS * N_PRIO);
BPF_PERCPU_ARRAY(acct_scratch, struct acct_scratch, 1);
BPF_PERCPU_ARRAY(queue_stats, struct queue_stats, PORT_SLOTS * N_PRIO);
BPF_PERCPU_ARRAY(queue_max, __u64, PORT_SLOTS * N_PRIO); /* max depth seen; zeroed by the telemetry reader */
BPF_ARRAY(sw_queues, struct sw_queues, N_SWITCHES);    /* shared buffers: the queues of each switch */
BPF_PERCPU_ARRAY(shared_peak, __u64, N_SWITCHES);        /* highest occupancy seen; zeroed by the telemetry reader */
BPF_RINGBUF_OUTPUT(pfc_events, 16);
/* Written only by the PFC agent (user space): pause frames it sent out of a port for a priority, time paused. */
struct pfc_agent_stats {
	__u64 pause_tx;
	__u64 paused_ns;          /* completed pauses of this port's egress */
};
BPF_ARRAY(pfc_stats, struct pfc_agent_stats, PORT_SLOTS * N_PRIO);
/* Written only by the agent's credit meter (testbed/control/credits.py), per receiving port and lane. */
struct credit_agent_stats {
	__u64 stalls;             /* times the sender ran out of credit (less than a frame granted) */
	__u64 stall_ns;           /* time it spent stalled */
	__u64 updates;            /* grants sent */
	__u64 granted;            /* credit bytes granted in all */
	__u64 since;              /* stalled since (ns), 0 = has credit */
};
BPF_ARRAY(credit_stats, struct credit_agent_stats, PORT_SLOTS * N_PRIO);

/* In-band network telemetry (lib/int.h). */
BPF_ARRAY(int_config, struct int_config, 1);
BPF_ARRAY(port_tx, __u64, PORT_SLOTS);                  /* bytes each switch port sent (with INT on): hop records */
BPF_PERCPU_ARRAY(int_stats, __u64, INT_STATS);
BPF_RINGBUF_OUTPUT(int_reports, 256);                   /* the sinks' exports → telemetry/int.py */

#ifdef FTB_PLUGIN
/* load_balancing: plugin — switch.plugin.params by index (PLUGIN_PARAM_<NAME>, lb/choose.h ftb_plugin_param). */
#ifndef PLUGIN_PARAMS
#define PLUGIN_PARAMS 1
#endif
BPF_ARRAY(plugin_params, __u64, PLUGIN_PARAMS);
#endif

#endif
