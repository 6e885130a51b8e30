"""The result files' contract: file names and column names in order (defined in results/README.md).

Other tools (sweeps, notebooks, CI checks) select columns by these names; new columns are added after them.
"""
from __future__ import annotations

#: links.csv: these first, in this order; then LINK_KNOWN_EXTRA, then LINK_QOS_COLUMNS, then any other key seen.
LINK_COLUMNS = ["time_s", "switch", "port", "peer", "bytes", "packets", "util"]
LINK_KNOWN_EXTRA = ["direction", "role", "rate_bps", "interval_s"]
#: links.csv congestion columns, kept in this order after LINK_KNOWN_EXTRA when present.
LINK_QOS_COLUMNS = ["queue_bytes_max", "queue_bytes_mean", "ecn_marks", "drops", "discards", "pause_tx",
                    "pause_rx", "paused_s", "credit_stalls", "credit_stall_s", "credits_granted", "credit_wait_s",
                    "switch_buffer_bytes", "switch_buffer_peak_bytes", "switch_buffer_peak_frac", "trims"]
#: flows.csv: these first, in this order; then any other key seen, in first-seen order.
FLOW_COLUMNS = ["flow_id", "src", "dst", "sport", "dport", "proto", "bytes", "start_s", "end_s", "fct_s",
                "goodput_mbps", "paths_used"]
#: summary.csv: these first, in this order.
SUMMARY_COLUMNS = ["run_id", "scenario", "load_balancing", "seed", "duration_s", "offered_mbps", "goodput_mbps",
                   "mean_uplink_util", "max_uplink_util", "uplink_imbalance", "fct_p50_ms", "fct_p99_ms",
                   "cpu_bound"]
#: summary.csv: always present after SUMMARY_COLUMNS, in this order; extra scalar meta keys follow.
SUMMARY_EXTRA_COLUMNS = ["flows", "flows_completed", "fct_mean_ms", "fct_max_ms", "lost_packets", "uplinks",
                         "uplink_tx_bytes", "cpu_busy_mean", "cpu_busy_max",
                         "jct_mean_ms", "jct_p99_ms", "retransmits", "ooo_packets", "cnps",
                         "drops", "ecn_marks", "pause_frames", "paused_s_total", "queue_p99_bytes",
                         "uplink_imbalance_max", "traffic_start_s", "traffic_end_s", "traffic_window_s",
                         "discards", "ctl_lost", "cpu_worst_core", "cpu_worst_time_s", "cpu_saturated_share",
                         "backlogged_samples",
                         "starved_samples", "starved_share", "failed", "failure_lost_packets", "reroute_ms_max",
                         "credit_stalls", "credit_stall_s_total", "switch_buffer_peak_bytes",
                         "switch_buffer_peak_frac", "profile", "int_reports", "int_paths",
                         "int_path_delay_p50_ns", "int_path_delay_p99_ns", "int_path_delay_p99_max_ns", "trims",
                         "cpu_steal_mean", "cpu_steal_max", "starved_stolen_samples", "slowdown_p50",
                         "slowdown_p99", "cpu_bound_reason", "spurious_retransmits"]
#: collectives.csv (runs with collective jobs): one row per job iteration.
COLLECTIVE_COLUMNS = ["job", "iteration", "op", "bytes", "start_s", "end_s", "jct_ms"]
#: failures.csv (runs with `failures`): one row per scheduled event.
FAILURE_COLUMNS = ["event", "time_s", "at_s", "kind", "target", "change", "detected_s", "rerouted_s",
                   "lost_packets", "affected_flows", "dip_max", "flow_dips"]
#: sm.csv (runs with switch.routing: sm): one row per sweep that changed the tables (and the initial one).
SM_COLUMNS = ["sweep", "time_s", "kind", "ports", "detect_s", "compute_s", "entries", "install_s", "held_s",
              "switches"]

#: int.csv (runs with telemetry.int): one row per hop of every INT report a sink exported.
INT_COLUMNS = ["time_s", "report", "flow_id", "path", "hop", "switch", "ingress_port", "egress_port", "queue_id",
               "queue_bytes", "hop_latency_ns", "tx_bytes", "link_rate_bps", "hop_time_s", "path_delay_ns",
               "exceeded", "ip_bytes", "probe"]
#: int_paths.csv: one row per path (switch list) the reports took.
INT_PATH_COLUMNS = ["path", "reports", "flows", "delay_p50_ns", "delay_p99_ns", "delay_mean_ns", "delay_max_ns"]

#: weights.csv (runs with switch.wcmp.source int or load): every interval, every member of every leaf group.
WEIGHT_COLUMNS = ["time_s", "switch", "group", "next_hop", "weight", "port", "signal", "source"]

#: controller.csv (runs with controller.entropy plan): every entropy decision of the fabric controller.
CONTROLLER_COLUMNS = ["time_s", "flow", "old", "new", "reason"]

#: collective_signals.csv (runs with traffic.collective.adapt): what each decision read, per switch port on the
#: paths the operation's queue pairs may take.
COLLECTIVE_SIGNAL_COLUMNS = ["time_s", "job", "iteration", "switch", "port", "peer", "capacity_bps", "util", "queue",
                             "ecn", "available_bps", "int"]

#: cc.csv (RoCE runs with traffic.cc other than none): each flow's congestion window and rate over time.
CC_COLUMNS = ["flow_id", "time_s", "cwnd_bytes", "rate_bps"]

META_KEYS = SUMMARY_COLUMNS[:6]

MANIFEST = "manifest.json"
LINKS_CSV = "links.csv"
FLOWS_CSV = "flows.csv"
SUMMARY_CSV = "summary.csv"
COLLECTIVES_CSV = "collectives.csv"
FAILURES_CSV = "failures.csv"
SM_CSV = "sm.csv"
INT_CSV = "int.csv"
INT_PATHS_CSV = "int_paths.csv"
WEIGHTS_CSV = "weights.csv"
CC_CSV = "cc.csv"
CONTROLLER_CSV = "controller.csv"
COLLECTIVE_SIGNALS_CSV = "collective_signals.csv"
SWEEP_CSV = "sweep.csv"
SWEEP_PNG = "sweep.png"
#: plot name → file name.
PLOT_FILES = {"uplink_util": "uplink_util.png", "uplink_bytes": "uplink_bytes.png", "fct_cdf": "fct_cdf.png",
              "int_path_delay": "int_path_delay.png", "cc": "cc.png"}
RESULT_FILES = [MANIFEST, LINKS_CSV, FLOWS_CSV, SUMMARY_CSV, COLLECTIVES_CSV, FAILURES_CSV, SM_CSV, INT_CSV, INT_PATHS_CSV, WEIGHTS_CSV, CC_CSV,
                CONTROLLER_CSV, COLLECTIVE_SIGNALS_CSV, *PLOT_FILES.values()]
#: manifest key under which write_run stores the summary inputs, so `report` can recompute the same row.
MANIFEST_INPUTS = "report_inputs"
#: a sweep's directory: the plan (for --resume) and the per-configuration statistics.
SWEEP_JSON = "sweep.json"
COMPARISON_CSV = "comparison.csv"
