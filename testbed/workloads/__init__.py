"""Workloads: plan flows from a scenario, run them with one agent process per host, collect per-flow results.

    flows = plan(scenario.traffic, topo, scenario.seed, duration_s)
    results = run(flows, ns_of=lambda host: f"ftb-{host}", duration_s=5, packet_size=1500)

``run`` starts an agent in every involved host's namespace (agents.py), waits until each has started, picks t0
a little later, hands every agent its job (the flows it sends and receives), waits for the results and always
kills and reaps every agent it started. Gated flows (``Flow.after``) start when the agents receiving the flows
they wait for announce their completion to the gated senders' agents (gating.py; sockets in a per-run directory
removed afterwards). Result times are seconds relative to ``origin`` (the run's time zero,
shared with the link samples) or, without one, to t0.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from typing import Callable, Optional

from .agent_set import AgentSet, WorkloadError
from .engines import ENGINES
from .flows import Flow, derangement, offered_mbps, plan
from .gating import Dependencies, gates_dir
from .results import FlowResult, flow_result

START_MARGIN_S = 0.05       # from the last agent bound to t0, + 2 ms per agent for writing the start lines
DEFAULT_SNDBUF = 212992     # net.core.wmem_default: what one socket would get, shared by a host's UDP senders


def _jobs(flows: list[Flow], hosts: list[str], duration_s: float, packet_size: int, grace_s: float,
          drain_s: float, sndbuf_bytes: Optional[int], timeline_bin_s: Optional[float] = None,
          deps: Optional[Dependencies] = None, gates: str = "", controller: Optional[dict] = None,
          adapt: Optional[dict] = None) -> dict[str, dict]:
    by_src: dict[str, list] = {h: [] for h in hosts}
    by_dst: dict[str, list] = {h: [] for h in hosts}
    for f in flows:
        by_src[f.src].append(f.to_dict())
        by_dst[f.dst].append(f.to_dict())
    jobs = {h: {"host": h, "duration_s": duration_s, "packet_size": packet_size, "grace_s": grace_s,
                "drain_s": drain_s, "sndbuf_bytes": sndbuf_bytes, "send": by_src[h], "recv": by_dst[h],
                "timeline_bin_s": timeline_bin_s, "controller": controller, "adapt": adapt}
            for h in hosts}
    if deps is not None:
        def gate_of(h):
            return os.path.join(gates, h)
        for h, job in jobs.items():
            job["notify"] = deps.notify(h, gate_of)
            if h in deps.gated_hosts:
                job["gate"] = gate_of(h)
    return jobs


def run(flows: list[Flow], ns_of: Callable[[str], str], duration_s: float, packet_size: int,
        timeout_s: Optional[float] = None, *, grace_s: float = 2.0, drain_s: float = 0.3,
        sndbuf_bytes: Optional[int] = DEFAULT_SNDBUF,
        info: Optional[dict] = None, origin: Optional[float] = None,
        check: Optional[Callable[[], None]] = None, on_t0: Optional[Callable[[float], None]] = None,
        timeline_bin_s: Optional[float] = None, containers: Optional[dict] = None,
        agent_set: Callable = AgentSet, controller: Optional[dict] = None,
        adapt: Optional[dict] = None) -> list[FlowResult]:
    """Run ``flows`` for at most ``duration_s`` (+ ``grace_s`` to drain), one agent per involved host, and return
    one FlowResult per flow, in the order given.

    ``packet_size`` is the IP packet size of UDP datagrams (and sets TCP's MSS to packet_size − 40).
    ``sndbuf_bytes``: send-buffer budget (kernel truesize accounting) that a host's UDP senders share; it must
    stay below the host link's qdisc limit so that blasting senders block instead of overflowing their own
    qdisc (≥ ~8 KB per socket whatever the budget). None = the kernel default for every socket.
    ``timeout_s``: hard limit for the whole run (default: duration + last start + grace + 30 s).
    ``info``: if given, receives ``t0`` (epoch seconds) and ``unknown_packets`` per host.
    ``origin``: epoch seconds result times are relative to (default t0).
    ``check``: called while traffic runs; may raise to abort (e.g. a helper process of the run died).
    ``on_t0``: called with t0 once it is chosen, before the agents get their jobs (the failure scheduler's
    clock). ``timeline_bin_s``: receivers also record bytes per bin of this length and UDP sequence gaps;
    ``info["timelines"]`` gets them per flow id. ``containers``: host → its ``container.hosts.Container``
    (hosts.docker): that host's agent runs inside the container. ``agent_set``: AgentSet's interface over
    (hosts, ns_of, containers) — the agents of a fabric over several machines run on their machines
    (cluster/run.py RemoteAgents). ``controller``: {"path", "timeout_s"} of the fabric controller the agents ask
    for their flows' source ports (controller_channel.py). ``adapt``: {"path", "timeout_s"} of the collective
    helper the agents ask how to send each adapted operation (collective/channel.py).
    """
    if not flows:
        return []
    ids = [f.flow_id for f in flows]
    if len(set(ids)) != len(ids):
        raise ValueError("flow ids must be unique")
    hosts = list(dict.fromkeys([h for f in flows for h in (f.src, f.dst)]))
    if timeout_s is None:
        timeout_s = duration_s + max(f.start_s for f in flows) + grace_s + 30.0
    deps = Dependencies(flows) if any(f.after for f in flows) else None
    t_begin = time.time()
    hard_end = t_begin + timeout_s
    with contextlib.ExitStack() as stack:
        gates = ""
        if deps is not None:                 # the gate sockets (gating.py): a fresh directory per run
            os.makedirs(gates_dir(), exist_ok=True)
            gates = stack.enter_context(tempfile.TemporaryDirectory(prefix="run-", dir=gates_dir()))
        agents = stack.enter_context(agent_set(hosts, ns_of, containers))
        agents.wait_ready(hard_end, t_begin)
        agents.hand_jobs(_jobs(flows, hosts, duration_s, packet_size, grace_s, drain_s, sndbuf_bytes,
                               timeline_bin_s, deps, gates, controller, adapt))
        # t0 once every agent has bound its receivers and opened its senders (however long a busy machine took
        # to parse the jobs): the start line only has to reach them
        agents.wait_bound(hard_end)
        t0 = time.time() + START_MARGIN_S + 0.002 * len(hosts) + agents.start_latency_s
        if on_t0 is not None:
            on_t0(t0)
        agents.start(t0)
        outputs = agents.collect(hard_end, timeout_s, check)
    for host, out in outputs.items():
        late = out.get("started_at", 0) - t0
        if late > 0:
            logging.getLogger(__name__).warning("traffic agent on %s read its start line %.3f s after t0", host,
                                                late)
    if info is not None:
        info["t0"] = t0
        info["unknown_packets"] = {h: out.get("unknown_packets", 0) for h, out in outputs.items()}
        info["agent_problems"] = agents.problems
        info["skipped"] = sorted(f.flow_id for f in flows if outputs[f.src]["send"].get(str(f.flow_id), {}).get("skipped"))
        if timeline_bin_s:
            info["timelines"] = {f.flow_id: outputs[f.dst]["recv"].get(str(f.flow_id), {}).get("timeline")
                                 for f in flows}
    base = origin if origin is not None else t0
    if info is not None:
        info["cc_traces"] = {f.flow_id: [(t - base, w, r) for t, w, r in tx["cc_trace"]]
                             for f in flows if (tx := outputs[f.src]["send"].get(str(f.flow_id), {})).get("cc_trace")}
    return [flow_result(f, base, outputs[f.src]["send"].get(str(f.flow_id), {}),
                        outputs[f.dst]["recv"].get(str(f.flow_id), {})) for f in flows]


__all__ = ["ENGINES", "DEFAULT_SNDBUF", "Flow", "FlowResult", "WorkloadError", "derangement", "offered_mbps",
           "plan", "run"]
