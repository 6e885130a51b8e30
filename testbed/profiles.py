"""Scenario profiles: ``profile: infiniband | rocev2`` fills the defaults of one fabric architecture.

A profile is a table of dotted key paths and values merged *under* the raw scenario mapping before validation
(after the ``--set`` / ``--vary`` overrides, so a varied profile takes effect): a key the scenario or an
override sets explicitly always wins, also inside a nested mapping (``switch.sm.sweep_interval`` given, the
profile still fills ``switch.sm.engine``). A value that is itself a mapping or list (``traffic_classes.dscp``)
is filled whole or not at all, and the profile never reaches into a section given in another form (a
per-priority ``switch.ecn: {3: {…}}``, a section set to null). The result is then validated like any
scenario, so a profile cannot produce a configuration the validators would refuse in a file.

**infiniband** — what an InfiniBand fabric does by construction:

- ``switch.routing: sm`` with ``switch.sm.engine`` ``ftree`` on a fat-tree (OpenSM's engine for them) and
  ``minhop`` on every other kind (ftree needs fat-tree wiring; minhop routes any topology).
- ``switch.load_balancing: adaptive``, ``switch.adaptive.granularity: packet``: IB adaptive routing picks the
  least loaded allowed port per packet; the receiver tolerates the reordering (below).
- ``switch.credit.enabled: true``: link-level credit flow control on the lossless lane. The credit buffer is
  left at its default (the port's queue buffer), which can grant a frame at every link rate the testbed runs
  (a fixed small buffer is refused at high rates: testbed/qos/credits.py check_buffers).
- ``switch.traffic_classes: {dscp: {26: 3}, lossless: [3]}`` and ``traffic.dscp: 26``: the traffic rides one
  lossless priority (the "virtual lane"); credits on a fabric without one are refused.
- ``traffic.receiver: ooo``: placement by PSN, selective NAK — a receiver that per-packet routing needs.

**rocev2** — the usual RoCEv2 data-centre configuration:

- ``switch.routing: distributed``, ``switch.load_balancing: ecmp``: per-flow hashing on the UDP source port.
- ``switch.traffic_classes: {dscp: {26: 3}, lossless: [3]}``, ``traffic.dscp: 26`` (AF31, what RoCE NICs mark),
  ``switch.pfc.enabled: true`` (thresholds: PfcSpec's defaults, xoff 32 KB / headroom 48 KB per ingress) and
  ``hosts.pfc: true`` (the NICs obey pause frames, so PFC is lossless up to the sender).
- ``switch.ecn: {kmin: 20KB, kmax: 80KB, pmax: 0.2}`` (scenarios/incast-pfc.yaml's curve): marking starts below
  one ingress's Xoff, so DCQCN can slow senders before PFC has to pause them.
- ``traffic.cc: dcqcn`` (its timers scaled to the host link rate, testbed/workloads/roce/cc/dcqcn.py) and
  ``traffic.receiver: gbn`` (go-back-N, as RoCE NICs do) with ``traffic.roce.rto: auto`` (above the longest
  queueing on the path, as a NIC's RTO is: emulated queues drain 1000× slower than hardware's, and a 10 ms RTO
  made go-back-N resend thousands of packets that were only late — 0 drops, 6,144 retransmits on
  scenarios/ib-vs-roce.yaml; 0 with auto). ``auto`` is the engine's default too; filled all the same, so that a
  scenario whose file says nothing still lists it in ``profile_keys``.

**Traffic keys and the engine.** ``traffic.receiver`` and ``traffic.cc`` exist only for the built-in RoCE engine
(the scenario refuses them elsewhere), so a profile fills them only when ``traffic.engine`` is ``roce``; with
``udp`` or ``tcp`` the fabric keys are filled and rocev2 sets ``traffic.ecn: ect0`` instead, so the switches'
marks land on ECN-capable packets (with ``tcp`` that turns on the kernel's TCP ECN). ``rxe`` (Soft-RoCE +
perftest) gets the fabric keys only: perftest chooses its own DSCP and ECN.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

#: The names ``profile:`` accepts (the scenario model's Literal lists the same).
NAMES = ("infiniband", "rocev2")

_LOSSLESS = {"switch.traffic_classes.dscp": {26: 3}, "switch.traffic_classes.lossless": [3], "traffic.dscp": 26}


def _sm_engine(doc: dict) -> str:
    topo = doc.get("topology")
    kind = topo.get("kind", "leaf-spine") if isinstance(topo, dict) else "leaf-spine"
    return "ftree" if kind == "fat-tree" else "minhop"


def _engine(doc: dict) -> str:
    t = doc.get("traffic")
    return t.get("engine", "udp") if isinstance(t, dict) else "udp"


def _infiniband(doc: dict) -> dict[str, Any]:
    keys = {"switch.routing": "sm", "switch.sm.engine": _sm_engine(doc), "switch.load_balancing": "adaptive",
            "switch.adaptive.granularity": "packet", "switch.credit.enabled": True, **_LOSSLESS}
    if _engine(doc) == "roce":
        keys["traffic.receiver"] = "ooo"
    return keys


def _rocev2(doc: dict) -> dict[str, Any]:
    keys = {"switch.routing": "distributed", "switch.load_balancing": "ecmp", **_LOSSLESS,
            "switch.pfc.enabled": True, "hosts.pfc": True,
            "switch.ecn.kmin": "20KB", "switch.ecn.kmax": "80KB", "switch.ecn.pmax": 0.2}
    engine = _engine(doc)
    if engine == "roce":
        keys.update({"traffic.cc": "dcqcn", "traffic.receiver": "gbn", "traffic.roce.rto": "auto"})
    elif engine in ("udp", "tcp"):
        keys["traffic.ecn"] = "ect0"
    return keys


_TABLES: dict[str, Callable[[dict], dict[str, Any]]] = {"infiniband": _infiniband, "rocev2": _rocev2}


def defaults(name: str, doc: dict) -> dict[str, Any]:
    """The dotted keys profile ``name`` fills for this (already overridden) scenario mapping."""
    return _TABLES[name](doc)


def _place(doc: dict, dotted: str, value: Any) -> bool:
    """Put ``value`` at ``dotted`` unless the path is already set or blocked; True when it was placed."""
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        if k not in node:
            node[k] = {}
        nxt = node[k]
        # a section given as something else (null, a list, a per-priority map like ecn: {3: {…}}): explicit
        if not isinstance(nxt, dict) or any(not isinstance(x, str) or x.isdigit() for x in nxt):
            return False
        node = nxt
    if keys[-1] in node:
        return False
    node[keys[-1]] = copy.deepcopy(value)
    return True


def apply(doc: dict) -> tuple[dict, list[str]]:
    """``doc`` with its profile's defaults merged under it, and the dotted keys the profile filled (in table
    order). No ``profile`` key (or null): the document unchanged. An unknown name is left to the scenario
    model, which refuses it in its usual one line naming ``profile`` and the allowed values."""
    name = doc.get("profile")
    if not isinstance(name, str) or name not in _TABLES:
        return doc, []
    out = copy.deepcopy(doc)
    filled = [k for k, v in defaults(name, doc).items() if _place(out, k, v)]
    return out, filled


def without(doc: dict, dotted: str) -> dict:
    """A copy of ``doc`` with the key at ``dotted`` removed (back to the model's default): to find which filled
    key a validation error comes from."""
    out = copy.deepcopy(doc)
    *parents, last = dotted.split(".")
    node = out
    for k in parents:
        node = node[k]
    del node[last]
    return out
