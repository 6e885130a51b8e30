/* Shared definitions of the fabric switch datapath: constants, map value layouts, byte order.
 *
 * The Python side (testbed/datapath) reads these layouts through BCC's generated ctypes types, so a field
 * added here is visible there by name; keep names stable. Sizes come from -D flags set by the loader so maps
 * are proportionate to the topology.
 */
#ifndef FTB_COMMON_H
#define FTB_COMMON_H

#include <uapi/linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>

#ifndef MAX_NH
#define MAX_NH 16                 /* next hops in one group (ports[] size) */
#endif
#ifndef PORT_SLOTS
#define PORT_SLOTS 1024           /* port maps are arrays indexed by ifindex: largest ifindex + 1 */
#endif
#ifndef WCMP_SLOTS
#define WCMP_SLOTS 64             /* entries of a next-hop group's weighted table (switch.wcmp.slots) */
#endif
#ifndef SWQ_MAX
#define SWQ_MAX 16                /* queues of one switch: its ports × the priorities in use */
#endif
#ifndef ACCT_SLOTS
#define ACCT_SLOTS 8              /* most ports of one switch: an ingress feeds at most that many egress ports */
#endif
#ifndef N_SWITCHES
#define N_SWITCHES 64
#endif
#ifndef FIB_SIZE
#define FIB_SIZE 4096
#endif
#ifndef FLOW_SIZE
#define FLOW_SIZE 16384           /* LRU: per-(switch, 5-tuple) state at switches with a choice */
#endif
#ifndef FTB_INT_STAGE
#define FTB_INT_STAGE 1           /* 0: the INT stage is left out (INT off: nothing tail-calls it; saves compile time) */
#endif

#define FTB_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Hide what the compiler knows about a value, so an explicit bounds check survives optimisation and the
 * verifier sees it (clang drops `slot >= MAX_NH` when it can prove slot < n <= MAX_NH by other paths). */
#define ftb_opaque(x) asm volatile("" : "+r"(x))

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ftb_htons(x) __builtin_bswap16(x)
#define ftb_ntohs(x) __builtin_bswap16(x)
#define ftb_ntohl(x) __builtin_bswap32(x)
#define ftb_htonl(x) __builtin_bswap32(x)
#else
#define ftb_htonl(x) (x)
#define ftb_htons(x) (x)
#define ftb_ntohs(x) (x)
#define ftb_ntohl(x) (x)
#endif

/* Load-balancing modes (sw_config.mode) and spray kinds (sw_config.spray). */
enum { MODE_ECMP = 0, MODE_FLOWLET = 1, MODE_SPRAY = 2, MODE_ADAPTIVE = 3, MODE_WCMP = 4, MODE_DLB = 5,
       MODE_PLUGIN = 6 };
/* WCMP (MODE_WCMP): which packets share a choice of slot (sw_config.wcmp_granularity). */
enum { WCMP_FLOW = 0, WCMP_FLOWLET = 1, WCMP_PACKET = 2 };
enum { SPRAY_RANDOM = 0, SPRAY_ROUND_ROBIN = 1 };
/* Adaptive routing (MODE_ADAPTIVE): what "least loaded" means (sw_config.ar_metric), and when to choose. */
enum { AR_QUEUE = 0, AR_LOAD = 1, AR_QUEUE_LOAD = 2 };
enum { AR_PACKET = 0, AR_FLOWLET = 1 };

/* Drop reasons: index into port_stats.drops and drop_reason_counts. Mirrored in testbed/datapath DROP_REASONS. */
enum {
	DROP_NOT_IPV4 = 0,        /* not an IPv4 frame (IPv6, ARP, …) */
	DROP_MALFORMED = 1,       /* truncated or bad IPv4 header */
	DROP_NO_ROUTE = 2,        /* no FIB entry for (switch, dst) */
	DROP_EMPTY_GROUP = 3,     /* FIB entry with no next hop (unknown local address) */
	DROP_TTL = 4,             /* TTL would expire */
	DROP_NO_PORT = 5,         /* ingress ifindex is not a switch port (only in drop_reason_counts) */
	DROP_BAD_EGRESS = 6,      /* next hop is not a known port: inconsistent maps */
	DROP_PORT_DOWN = 7,       /* every port the group allows has lost its link (port_down) */
	DROP_MAX = 8,
};

#define PORT_VALID 1
#define PORT_EDGE 2               /* the port faces a host (a leaf's down port): where INT starts and ends */

/* Congestion and flow control (lib/qos.h). Queues are per (egress port, priority): index ifindex * N_PRIO + prio. */
#define N_PRIO 8
#define ETH_P_MACCTL 0x8808       /* MAC control: PFC frames (opcode 0x0101) */
#define PFC_OPCODE 0x0101
#define CREDIT_OPCODE 0xFC01      /* MAC control, local: a credit grant over a link between two machines (FCCL) */
#define ETH_P_KICK 0x88B5         /* local experimental: the agent's "kick" frame after a resume; dropped silently */
/* HTB_MAJOR / HTB_CLASS_BASE are mirrored by testbed/qos_classes.py (qdisc handles, hosts' SO_PRIORITY) */
#define HTB_MAJOR 0x10000         /* classid 1:(0x10 + prio) of the HTB class of a priority (skb->priority) */
#define HTB_CLASS_BASE 0x10
#define ECN_MASK 3
#define EVT_XOFF 1                /* an ingress (port, prio) passed Xoff: send a PFC frame upstream */
#define EVT_PFC_RX 2              /* a PFC frame arrived on a port: pause/resume its egress classes */
#define EVT_CREDIT_RX 3           /* a credit frame arrived on a port: its sender may send up to `limit` bytes */

struct qos_config {               /* qos_config[switch_id] */
	__u8 dscp_prio[64];       /* DSCP → priority */
	__u32 lossless;           /* bit per priority */
	__u32 pfc;                /* 1: PFC on for the lossless priorities */
	__u32 ecn_on;             /* bit per priority */
	__u32 credit;             /* 1: credit flow control for the lossless priorities (accounting, no Xoff) */
	__u64 xoff;               /* bytes of one ingress (port, priority) still queued in the switch */
	__u64 kmin[N_PRIO];
	__u64 kmax[N_PRIO];
	__u64 pmax[N_PRIO];       /* probability at kmax, scaled by 2^32 */
	__u64 shared_pool;        /* shared buffer: what all queues share after the reserved headroom; 0 = a buffer
	                           * per queue */
	__u64 alpha;              /* dynamic threshold = alpha × the free pool (alpha scaled by 2^10) */
	__u64 headroom;           /* shared buffer: bytes a lossless ingress may take beyond its (dynamic) Xoff */
	__u32 trim_on;            /* 1: trim this switch's lossy RoCEv2 packets instead of dropping them (lib/trim.h) */
	__u32 trim_classify;      /* 1: packets flagged trimmed go to trim_prio (every switch, when any tier trims) */
	__u64 trim_prio;          /* the priority of trimmed headers */
	__u64 trim_threshold;     /* queue depth (bytes) past which a packet is trimmed; 0 = the tail-drop limit */
};

/* sw_queues[switch_id]: the vq index of every queue of the switch, whose depths add up to its shared buffer's
 * occupancy (only switches with a shared buffer have entries). */
struct sw_queues {
	__u32 n;
	__u32 key[SWQ_MAX];
	__u64 ps_per_byte[SWQ_MAX];   /* each queue's port's (port_qos), so the sum needs no lookup of it */
};

struct port_qos {                 /* port_qos[ifindex]: the egress port's serialiser */
	__u64 ps_per_byte;        /* 8e12 / rate (picoseconds per byte); 0 = no queue model */
	__u64 buffer;             /* bytes per queue; lossy packets beyond it are tail-dropped */
	__u32 classes;            /* 1: HTB with one class per priority (skb->priority selects it) */
	__u32 local;              /* index of the port within its switch (0 .. ACCT_SLOTS − 1) */
	__u64 lossless_limit;     /* bytes the qdisc holds for a lossless queue: beyond, it is lost anyway */
	__u64 ingress_limit;      /* bytes one lossless ingress (this port, a priority) may have queued in the
	                           * switch: PFC xoff + headroom, or the credit buffer; 0 = no limit */
};

struct queue_stats {              /* per CPU, index ifindex * N_PRIO + prio */
	__u64 packets;            /* accepted into the queue */
	__u64 bytes;
	__u64 depth_sum;          /* sum of the depth each accepted packet saw (bytes): mean = depth_sum / packets */
	__u64 ecn_marks;
	__u64 ect_packets;        /* accepted ECT packets (the marking population) */
	__u64 drops;              /* tail drops at the buffer */
	__u64 pause_rx;           /* PFC frames received on this port for this priority (counted per priority) */
	__u64 xoff_events;        /* Xoff crossings this ingress (port, prio) raised */
	__u64 overflows;          /* lossless packets of this ingress dropped: its buffer (ingress_limit) was full */
	__u64 trims;              /* packets of this queue cut to their headers and sent on the trim priority */
};

/* PFC ingress accounting: the bytes that arrived on ingress (port, prio) and still sit in an egress queue of the
 * switch, one chunk per egress port it fed (chunks[local(out)]). Positions are in the egress queue's byte stream
 * (vqueue.enq: cumulative bytes enqueued); the queue has sent everything up to D = enq − depth. A chunk's
 * `bytes` lie between `start` and `end` of that stream, interleaved with other ingresses' bytes: all gone once
 * D ≥ end, and in between they are taken to be spread evenly (the drained part is attributed proportionally). */
struct ingress_chunk {
	__u64 start;              /* stream position before the oldest of these bytes that may still be queued */
	__u64 end;                /* position just after the newest */
	__u64 bytes;              /* this ingress's bytes still counted in the queue */
	__u32 port;               /* the egress port (ifindex) */
	__u32 pad;
};

/* ingress_state[ifindex * N_PRIO + prio]: PFC state and accounting of one ingress queue. Packets of one ingress
 * can be processed on two CPUs at once (veth delivers on the sender's CPU), so everything here is updated under
 * `lock`; user space changes it only through the control program (ftb_ctl). */
struct ingress_state {
	struct bpf_spin_lock lock;
	__u32 cause;              /* the egress port whose queue passed Xoff */
	__u64 bytes;              /* running sum of the chunks (refreshed lazily) */
	__u64 xoff_ns;            /* when Xoff was passed (0: not paused) */
	__u64 last_ns;            /* last lossless arrival on it while paused (measures the upstream reaction) */
	__u32 leaked;             /* packets that arrived after Xoff */
	__u32 pad;
	__u64 arrived;            /* bytes ever charged to this ingress (credits: what the sender used) */
	__u64 xoff_level;         /* shared buffer: its bytes when Xoff was raised; headroom counts from there */
	struct ingress_chunk chunks[ACCT_SLOTS];
};

struct vqueue {                   /* vq[ifindex * N_PRIO + prio]: the model of one egress queue */
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 finish;             /* when it would be empty, draining at the port rate (ns, CLOCK_MONOTONIC) */
	__u64 enq;                /* bytes ever enqueued */
	__u64 cap;                /* credits: the stream position it may send up to (its receiver's grant); 0 = none */
};

/* Bytes a queue holds by its credit cap: what it enqueued beyond the position its receiver let it send to. */
FTB_ALWAYS_INLINE __u64 vq_capped(__u64 enq, __u64 cap)
{
	return cap && enq > cap ? enq - cap : 0;
}

struct acct_scratch {             /* per CPU: where each chunk's egress queue has sent up to, for a recount */
	__u64 sent[ACCT_SLOTS];
};

/* Commands of the control program (ftb_ctl), run by user space with BPF_PROG_TEST_RUN on a packet that holds
 * one struct ctl_cmd: changes to the queue model that must be atomic with the switch program's updates. */
enum { CTL_VQ_RESYNC = 1, CTL_VQ_SHIFT = 2, CTL_XON_RESET = 3, CTL_VQ_CREDIT = 4, CTL_INGRESS_RECOUNT = 5 };
struct ctl_cmd {
	__u32 op;
	__u32 key;                /* vq index (ifindex * N_PRIO + prio) or ingress_state index */
	__u64 a;                  /* RESYNC, CREDIT: base time (ns); SHIFT: only if the finish time is after a */
	__u64 b;                  /* RESYNC: backlog (ns of service); SHIFT: ns to add; CREDIT: bytes really sent */
	__u64 c;                  /* RESYNC: the finish time read before the backlog was read; CREDIT: the cap */
};

struct pfc_event {
	__u64 ts;
	__u32 kind;               /* EVT_* */
	__u32 port;               /* ifindex the event is about */
	__u32 prio;               /* EVT_XOFF, EVT_CREDIT_RX: the priority; EVT_PFC_RX: class-enable vector */
	__u32 cause;              /* EVT_XOFF: the egress port; EVT_CREDIT_RX: µs the link has been stalled in all */
	__u16 quanta[N_PRIO];     /* EVT_PFC_RX; EVT_CREDIT_RX: [0] flags (1: stalled now) */
	__u64 limit;              /* EVT_CREDIT_RX: bytes of the priority the port may have sent in all (FCCL) */
};

struct port_info {                /* ports[ifindex] */
	__u32 switch_id;
	__u32 flags;              /* PORT_VALID when this ifindex is a switch port */
	__u8 mac[ETH_ALEN];       /* this port's MAC: source of frames it sends */
	__u8 peer_mac[ETH_ALEN];  /* MAC at the other end of its link: destination of those frames */
};

struct fib_key {                  /* LPM key: prefixlen covers switch_id (32 bits) + IPv4 prefix */
	__u32 prefixlen;
	__u32 switch_id;
	__u32 addr;               /* network byte order */
};

struct nh_group {
	__u32 n;                  /* 0: drop */
	__u32 ports[MAX_NH];      /* egress ifindexes */
	__u32 nslots;             /* WCMP: entries of wslot in use (0: no weights, plain ECMP over ports) */
	__u8 wslot[WCMP_SLOTS];   /* WCMP: each member (index into ports) replicated by its weight, as hardware does */
};

struct sw_config {                /* sw_config[switch_id] */
	__u32 mode;
	__u32 spray;
	__u32 seed;               /* per-switch hash seed (hashing.switch_seed) */
	__u32 ar_metric;          /* AR_*: queue depth, recent load, or both */
	__u64 flowlet_timeout_ns;
	__u32 ar_granularity;     /* AR_PACKET | AR_FLOWLET */
	__u32 track;              /* 1: per-flow path counters on single-port groups too (SM routing) */
	__u64 load_window_ns;     /* the load metric: bytes a port sent over about this long */
	__u32 wcmp_granularity;   /* WCMP_FLOW | WCMP_FLOWLET | WCMP_PACKET */
	__u32 hash_fields;        /* HASH_* bits the flow hash covers (lib/hash.h pkt_hash); 0 = the 5-tuple */
	/* DLB (MODE_DLB: the adaptive stage with a quality-band cost, lib/adaptive.h dlb_band; the loader sets
	 * ar_granularity = AR_FLOWLET, flowlet_timeout_ns = the inactivity, load_window_ns = dlb.load_window) */
	__u32 dlb_bands;          /* quality bands 0 .. dlb_bands − 1 (0 best), 2..16 */
	__u32 dlb_load_weight;    /* weight of the quantised load in the band (weighted mean with the queue's) */
	__u32 dlb_queue_weight;   /* weight of the quantised queue depth; not both 0 */
	__u32 dlb_pad;
};

/* A parsed packet: what forwarding and load balancing need (lib/parse.h fills it). */
struct pkt {
	__u32 saddr;              /* network byte order */
	__u32 daddr;
	__u16 sport;              /* host byte order */
	__u16 dport;
	__u8 proto;
	__u8 ttl;
	__u8 tos;
	__u8 pad;
	__u32 dqp;                /* RoCEv2 (UDP 4791): the BTH destination QP; else 0 */
};

/* The forwarding decision handed from one stage (program) to the next by a tail call: the entry program parses
 * and looks up the route, the adaptive stage chooses the port, the forward stage sends. Per CPU: a tail call
 * runs on the same CPU, before anything else can. */
enum { STAGE_ADAPTIVE = 0, STAGE_FORWARD = 1, STAGE_FAILOVER = 2, STAGE_INT = 3, N_STAGES = 4 };
struct fwd_ctx {
	struct pkt p;
	__u32 sw;
	__u32 in;
	__u32 out;
	__u32 pad;
};

#define AR_CANDIDATES 12          /* ports adaptive routing compares (a random window of larger groups; 16
                                   * candidates exceeded the verifier's 1M-instruction budget, 12 take 260k) */
struct ar_scratch {               /* per CPU: the adaptive stage's cost of each candidate port */
	__u64 cost[AR_CANDIDATES];
};

struct fo_scratch {               /* per CPU: the failover stage's best live port so far (kept in memory, not a
                                   * register, so the verifier does not tell iterations apart by it) */
	__u64 best;               /* slot, MAX_NH = none alive */
	__u64 score;
};

struct port_load {                /* port_load[ifindex]: recent tx load of a switch port (adaptive routing) */
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 bytes;              /* decaying byte count: about what it sent over the last load window */
	__u64 last_ns;
};

struct flow_key {
	__u32 switch_id;
	__u32 saddr;              /* network byte order */
	__u32 daddr;              /* network byte order */
	__u16 sport;              /* host byte order; 0 for other protocols and fragments */
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct flow_state {
	__u64 last_ns;            /* flowlet: time of the flow's last packet at this switch */
	__u32 slot;               /* flowlet: current next-hop slot */
	__u32 int_seq;            /* INT source: the flow's packets seen (every sample-th is instrumented) */
	__u64 flowlets;           /* flowlet, WCMP per flowlet, adaptive per flowlet, DLB: flowlets started */
	__u64 bytes;              /* frame bytes of the packets counted in pkts */
	__u64 pkts[MAX_NH];       /* packets sent through each next-hop slot */
};

/* In-band network telemetry, INT-MD over UDP (lib/int.h; the wire format in docs/int.md). */
#ifndef INT_MAX_HOPS
#define INT_MAX_HOPS 8
#endif
#define INT_HOP_BYTES 32          /* one hop's record: 8 words */
#define INT_HDR_BYTES 16          /* shim (4 B) + INT-MD metadata header (12 B) */
#define INT_DSCP_BIT 0x04         /* TOS bit of DSCP value 1: the packet carries an INT stack */
#define INT_SHIM_HOST 0x01        /* shim flags: a host started the stack and its destination host is the sink
                                   * (HPCC: the receiver echoes the records to the sender) */

struct int_config {               /* int_config[0] */
	__u32 enabled;            /* telemetry.int: leaves start stacks (every sample-th packet), sinks export */
	__u32 sample;             /* instrument every sample-th packet of a flow (1: all) */
	__u32 max_hops;           /* hop records a stack may hold */
	__u32 mtu;                /* the largest IP packet links between switches carry (fabric MTU) */
	__u32 host_stacks;        /* every switch adds its record to stacks hosts start (traffic.cc: hpcc) */
};

enum { INT_SOURCED = 0, INT_NO_ROOM = 1, INT_TRANSIT = 2, INT_EXCEEDED = 3, INT_EXPORTED = 4, INT_EXPORT_LOST = 5,
       INT_FAILED = 6, INT_PROBES = 7, INT_DELIVERED = 8, INT_STATS = 9 };
#define INT_PROBE_PORT 0xFA7E     /* UDP destination port of the WCMP controller's probes: they end at the sink */

struct int_report {               /* a sink's export (ring buffer int_reports) */
	__u64 ts;                 /* when the sink saw it, ns (CLOCK_MONOTONIC) */
	__u32 saddr;              /* network byte order */
	__u32 daddr;
	__u16 sport;              /* host byte order */
	__u16 dport;
	__u8 proto;
	__u8 hops;                /* records in stack */
	__u8 flags;               /* 1: a hop found no room (max_hops exceeded, the E bit) */
	__u8 pad;
	__u32 len;                /* the original packet's IP length */
	__u32 pad2;
	__u8 stack[INT_MAX_HOPS * INT_HOP_BYTES];   /* hop records as on the wire, newest (the sink's) first */
};

struct port_stats {               /* per CPU, indexed by ifindex */
	__u64 rx_packets;
	__u64 rx_bytes;
	__u64 tx_packets;
	__u64 tx_bytes;
	__u64 drops[DROP_MAX];    /* by reason, charged to the ingress port */
};

#endif
