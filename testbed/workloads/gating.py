"""Flows that wait for other flows (``Flow.after``): who tells whom, and when a waiting flow may start.

The agents coordinate among themselves, as the ranks of a collective do: the receiver of an awaited flow sends
``"<flow id> <epoch s>"`` (several flows completed together: one datagram, ``;`` between them) to the gate socket (a Unix datagram socket, path-named, so it reaches
across network namespaces) of every host with a flow waiting for it, the moment the last byte arrives; that
host's agent starts each waiting flow once all it waits for have completed, at the latest completion plus its
``after_delay_s``. No hop through the orchestrator (whose link sampler holds the GIL for milliseconds at a time).
``Dependencies`` is the orchestrator's half (checks, who notifies whom), ``Waits`` the agent's. Pure and light:
every agent imports this module.
"""
from __future__ import annotations

import os


def gates_dir() -> str:
    """Where each run's directory of gate sockets is made (container hosts get it bind-mounted at the same
    path, so a path names the same socket everywhere)."""
    from ..fabric.netns import STATE_DIR      # here: the agents import this module (keep it light)
    return os.path.join(STATE_DIR, "gates")


class Dependencies:
    """The gated flows of a run: checked (every awaited flow is in the run, no cycle) and who notifies whom."""

    def __init__(self, flows):
        ids = {f.flow_id for f in flows}
        self.dst = {f.flow_id: f.dst for f in flows}
        self.waiting_hosts: dict[int, set[str]] = {}
        self.gated_hosts: set[str] = set()
        edges = []
        for f in flows:
            for d in f.after or ():
                if d not in ids:
                    raise ValueError(f"flow {f.flow_id} waits for flow {d}, which is not in this run")
                self.waiting_hosts.setdefault(d, set()).add(f.src)
                edges.append((d, f.flow_id))
            if f.after:
                self.gated_hosts.add(f.src)
        cycle = cycle_of(edges)
        if cycle:
            raise ValueError(f"flows wait for each other in a cycle: {' → '.join(map(str, cycle))}")

    def notify(self, host: str, gate_path) -> dict[str, list[str]]:
        """The job's ``notify`` for ``host``: each awaited flow it receives → the gate paths to announce it to
        (``gate_path(host)`` of each host waiting for it; JSON keys are strings)."""
        return {str(fid): sorted(gate_path(h) for h in hosts)
                for fid, hosts in self.waiting_hosts.items() if self.dst[fid] == host}


def cycle_of(edges, nodes=()) -> list | None:
    """A dependency cycle among ``edges`` (awaited, waiting) as its nodes with the first repeated at the end,
    or None; ``nodes`` in the order the search starts from (a file's order: the cycle is named from its first
    transfer)."""
    if not edges:
        return None
    import networkx as nx            # here: the agents import this module and must start fast
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    if nx.is_directed_acyclic_graph(g):   # linear; find_cycle alone took minutes on 10⁵ step-barrier edges
        return None
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return None
    return [a for a, _ in cycle] + [cycle[0][0]]


class Waits:
    """One host's gated flows (flow dicts with ``after``) and what each still waits for."""

    def __init__(self, flows):
        self.left = {f["flow_id"]: set(f["after"]) for f in flows}
        self.delay = {f["flow_id"]: float(f.get("after_delay_s") or 0.0) for f in flows}
        self.latest: dict[int, float] = {}
        self.waiters: dict[int, list[int]] = {}
        for fid, deps in self.left.items():
            for d in sorted(deps):
                self.waiters.setdefault(d, []).append(fid)

    def done(self, fid: int, t: float) -> list[tuple[int, float]]:
        """Flow ``fid`` completed at ``t``: (flow, start time) of each flow that now waits for nothing, started
        after the latest completion of those it waited for (announcements may arrive out of order); an
        announcement repeated releases nothing."""
        out = []
        for w in self.waiters.pop(fid, ()):
            deps = self.left[w]
            deps.discard(fid)
            self.latest[w] = max(self.latest.get(w, t), t)
            if not deps:
                del self.left[w]
                out.append((w, self.latest.pop(w) + self.delay[w]))
        return out

    @property
    def pending(self) -> set[int]:
        return set(self.left)


def announcement(pairs) -> bytes:
    """One datagram announcing the (flow id, completion time) ``pairs``."""
    return ";".join(f"{fid} {t!r}" for fid, t in pairs).encode()


def parse_announcement(data: bytes) -> list[tuple[int, float]]:
    out = []
    for item in data.split(b";"):
        fid, t = item.split()
        out.append((int(fid), float(t)))
    return out
