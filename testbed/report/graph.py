"""The topology drawn by tier — hosts at the bottom, then leaves, spines, cores — with each link coloured by its
mean utilisation (``testbed graph`` writes it alone, like containerlab's graph; the HTML report embeds it).

From a scenario there is no utilisation: every link is drawn grey. From a run directory a link's colour is the
mean utilisation over the run's traffic window of its busier direction (results/README.md, "report").
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from .plots import _figure
from .summary import traffic_window

if TYPE_CHECKING:                 # networkx is imported where a graph is built: `import testbed.report` stays light
    import networkx as nx

#: Drawing rows, hosts upwards (a node's kind → its row).
LEVELS = {"host": 0, "leaf": 1, "spine": 2, "core": 3}
_ROLE_KIND = {"up": "leaf", "down": "leaf", "spine": "spine", "spine-up": "spine", "core": "core"}
_NODE_STYLE = {"host": ("o", "#d9d9d9"), "leaf": ("s", "#6baed6"), "spine": ("s", "#74c476"),
               "core": ("D", "#9e9ac8")}
CMAP = "RdYlGn_r"


def from_topology(topo) -> nx.MultiGraph:
    """The graph of a laid-out ``Topology``: nodes with ``kind``; every link an edge with the links.csv rows that
    measure its two directions (``dirs``: (switch, port, direction)) — a host's own sending is the leaf's rx."""
    import networkx as nx

    g = nx.MultiGraph()
    for name, node in topo.nodes.items():
        g.add_node(name, kind=node.kind)
    for link in topo.links:
        a, b = link.a, link.b                     # a: the end closer to the hosts
        up = (a.node, a.ifname, "tx") if a.tier != "host" else (b.node, b.ifname, "rx")
        g.add_edge(a.node, b.node, dirs=(up, (b.node, b.ifname, "tx")), host=a.tier == "host")
    return g


def from_links(links_df: pd.DataFrame) -> nx.MultiGraph:
    """The graph as far as links.csv shows it (runs whose manifest has no usable scenario): switches' kinds from
    their ports' roles, hosts from the leaves' ``down`` ports."""
    import networkx as nx

    g = nx.MultiGraph()
    if links_df is None or not len(links_df):
        return g
    ports = links_df[["switch", "port", "peer", "role"]].drop_duplicates(["switch", "port"])
    for r in ports.itertuples(index=False):
        g.add_node(r.switch, kind=_ROLE_KIND.get(r.role, "leaf"))
    seen = set()
    for r in ports.itertuples(index=False):
        if r.role == "down":
            g.add_node(r.peer, kind="host")
            g.add_edge(r.peer, r.switch, dirs=((r.switch, r.port, "rx"), (r.switch, r.port, "tx")), host=True)
            continue
        pair = frozenset((r.switch, r.peer))
        if pair in seen or r.peer not in g:
            continue
        seen.add(pair)
        back = ports[(ports["switch"] == r.peer) & (ports["peer"] == r.switch)]
        dirs = [(r.switch, r.port, "tx")] + [(r.peer, p, "tx") for p in back["port"]]
        lo, hi = sorted((r.switch, r.peer), key=lambda n: LEVELS.get(g.nodes[n]["kind"], 1))
        g.add_edge(lo, hi, dirs=tuple(dirs), host=False)
    return g


def port_utilisation(links_df: pd.DataFrame, flows_df: pd.DataFrame | None) -> dict[tuple[str, str, str], float]:
    """(switch, port, direction) → bytes × 8 / (rate × window) over the samples whose interval overlaps the
    traffic window (as the summary's uplink utilisation); over the whole sampled time when no flow delivered."""
    if links_df is None or not len(links_df):
        return {}
    df = links_df
    t0, t1 = traffic_window(flows_df) if flows_df is not None else (math.nan, math.nan)
    if not (math.isnan(t0) or math.isnan(t1)) and t1 > t0:
        end = df["time_s"].astype(float)
        df = df[(end > t0) & (end - df["interval_s"].astype(float) < t1)]
        span = {k: t1 - t0 for k in df.groupby(["switch", "port", "direction"]).groups}
    else:
        span = df.groupby(["switch", "port", "direction"])["interval_s"].sum().to_dict()
    g = df.groupby(["switch", "port", "direction"]).agg(b=("bytes", "sum"), rate=("rate_bps", "max"))
    out = {}
    for key, r in g.iterrows():
        s = float(span.get(key, 0.0) or 0.0)
        out[key] = float(r["b"]) * 8.0 / (float(r["rate"]) * s) if s > 0 and r["rate"] > 0 else math.nan
    return out


def edge_utilisation(g: nx.MultiGraph, port_util: dict) -> dict[tuple, float]:
    """(u, v, key) → the larger utilisation of the link's two directions (NaN where links.csv has neither)."""
    out = {}
    for u, v, k, d in g.edges(keys=True, data=True):
        vals = [port_util[x] for x in d["dirs"] if x in port_util and not math.isnan(port_util[x])]
        out[(u, v, k)] = max(vals) if vals else math.nan
    return out


def layout(g: nx.MultiGraph) -> dict[str, tuple[float, float]]:
    """Each tier one row (hosts at y 0, leaves 1, spines 2, cores 3), its nodes spread evenly over the full
    width in the graph's order (topology order: hosts next to their leaves)."""
    pos = {}
    for kind, level in LEVELS.items():
        row = [n for n, d in g.nodes(data=True) if d["kind"] == kind]
        for i, n in enumerate(row):
            pos[n] = ((i + 0.5) / len(row), float(level))
    return pos


def draw(g: nx.MultiGraph, util: dict[tuple, float] | None = None, title: str = "Topology") -> Any:
    """The drawing as a matplotlib Figure; with ``util`` (edge → fraction) edges are coloured on a 0–1 scale and
    a colour bar explains it, edges without a value are grey and dashed."""
    import matplotlib
    import networkx as nx
    from matplotlib import cm, colors
    from matplotlib.lines import Line2D

    widest = max([sum(1 for _, d in g.nodes(data=True) if d["kind"] == k) for k in LEVELS] + [1])
    levels = sorted({LEVELS[d["kind"]] for _, d in g.nodes(data=True)}) or [0]
    fig = _figure(min(24.0, max(7.0, 2.0 + 0.32 * widest)), 1.6 + 1.3 * len(levels))
    ax = fig.add_subplot()
    pos = layout(g)
    many = g.number_of_nodes() > 64
    norm = colors.Normalize(0.0, 1.0)
    cmap = matplotlib.colormaps[CMAP]
    edges = list(g.edges(keys=True, data=True))
    known = [(u, v, k) for u, v, k, _ in edges if util and not math.isnan(util.get((u, v, k), math.nan))]
    known_set = set(known)
    unknown = [(u, v, k) for u, v, k, _ in edges if (u, v, k) not in known_set]
    width = 0.6 if many else 1.8
    # arrows=False: one LineCollection (a multigraph's default, one patch per edge, takes 10 s for a k=16 fat-tree)
    if unknown:
        nx.draw_networkx_edges(g, pos, edgelist=unknown, ax=ax, arrows=False, edge_color="#9a9a9a",
                               width=width * 0.7, style="dashed" if util else "solid")
    if known:
        vals = [min(1.0, util[e]) for e in known]
        nx.draw_networkx_edges(g, pos, edgelist=known, ax=ax, arrows=False,
                               edge_color=[cmap(norm(v)) for v in vals], width=width * 1.4)
    handles = []
    for kind, (shape, colour) in _NODE_STYLE.items():
        nodes = [n for n, d in g.nodes(data=True) if d["kind"] == kind]
        if not nodes:
            continue
        size = 60 if many and kind == "host" else (160 if many else 420)
        nx.draw_networkx_nodes(g, pos, nodelist=nodes, ax=ax, node_shape=shape, node_color=colour,
                               node_size=size, edgecolors="#333333", linewidths=0.6)
        handles.append(Line2D([], [], ls="", marker=shape, markerfacecolor=colour, markeredgecolor="#333333",
                              markersize=8, label=f"{kind} ({len(nodes)})"))
    labels = {n: n for n, d in g.nodes(data=True) if not many or (d["kind"] != "host" and g.number_of_nodes() < 200)}
    nx.draw_networkx_labels(g, pos, labels=labels, ax=ax, font_size=6 if many else 8)
    if util is not None:
        sm = cm.ScalarMappable(norm=norm, cmap=cmap)
        cb = fig.colorbar(sm, ax=ax, fraction=0.03, pad=0.01)
        cb.set_label("mean utilisation, busier direction (fraction of link rate)")
        if unknown:
            handles.append(Line2D([], [], color="#9a9a9a", ls="--", label="no samples"))
    ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(0.0, -0.02), ncol=len(handles),
              frameon=False)
    ax.set_title(title)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(min(levels) - 0.3, max(levels) + 0.3)
    return fig


def save(fig, path) -> Path:
    """Write the drawing as PNG or SVG, chosen by the file's suffix."""
    from .files import ReportError, atomic_write
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise ReportError(f"{path}: the drawing is written as .png or .svg, not {path.suffix or 'no suffix'}")
    return atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, metadata={"Software": None}) if fmt == "png"
                        else fig.savefig(fh, format=fmt), binary=True)
