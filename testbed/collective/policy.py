"""What a collective policy is, what it decides over, and the registry of policies by name.

An ``Operation`` is one iteration of one collective job: its flows (each with its step, bytes and the source
port of the queue pair it was made for). A ``Policy`` gets the operation and a ``NetworkView`` when the
operation starts and returns, per flow it changes, the source port it is to be sent with — the path it takes
(a RoCE QP's UDP source port, a UDP flow's source port) — or None when the flow is not to run (an all-reduce
laying out several ring orders runs one). A flow it does not name is sent as the static collective would.

Policies register under the entry-point group ``fabric_testbed.collective_policy`` (importlib.metadata; the
entry point names a ``Policy`` subclass); the built-ins register the same way (pyproject.toml), with the table
below as the fallback for a checkout whose installed metadata predates them. A new policy is a new module.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from typing import ClassVar

GROUP = "fabric_testbed.collective_policy"
BUILTIN = {"weighted-split": "testbed.collective.weighted_split:WeightedSplit",
           "ring-order": "testbed.collective.ring_order:RingOrder",
           "paced": "testbed.collective.paced:Paced",
           "static": "testbed.collective.static:Static"}


class UnknownPolicy(ValueError):
    pass


@dataclass(frozen=True)
class OpFlow:
    """One flow of an operation: ``plan`` is everything ECMP hashes but the source port (planner.PlanFlow);
    ``sport``: the port of its own queue pair; ``conn``: (src, dst, rail), the connection its QPs belong to."""
    flow_id: int
    step: int
    bytes: int
    sport: int
    plan: object
    conn: tuple
    variant: int = 0          # the ring order it belongs to (adapt.rings > 1; 0: the job's own)


@dataclass
class Operation:
    key: str                   # "<job>.<iteration>": what the hosts ask for
    job: str
    iteration: int
    pattern: str
    flows: list[OpFlow] = field(default_factory=list)

    def steps(self) -> dict[int, list[OpFlow]]:
        """The flows of each step (a step's flows run at once; the next step waits for them)."""
        out: dict[int, list[OpFlow]] = defaultdict(list)
        for f in self.flows:
            out[f.step].append(f)
        return dict(sorted(out.items()))

    def variants(self) -> dict[int, list[OpFlow]]:
        """The flows of each ring order laid out (one, 0, unless adapt.rings > 1)."""
        out: dict[int, list[OpFlow]] = defaultdict(list)
        for f in self.flows:
            out[f.variant].append(f)
        return dict(sorted(out.items()))

    def qp_ports(self) -> dict[tuple, list[int]]:
        """Each connection's queue pairs, by their source ports (in first-seen order)."""
        out: dict[tuple, list[int]] = defaultdict(list)
        for f in self.flows:
            if f.sport not in out[f.conn]:
                out[f.conn].append(f.sport)
        return dict(out)


class Policy:
    """A collective policy (``traffic.collective.adapt.policy``). ``picks_rings``: it runs one of several ring
    orders an all-reduce lays out (``adapt.rings``), skipping the flows of the others."""
    name: ClassVar[str] = ""
    picks_rings: ClassVar[bool] = False

    @classmethod
    def check(cls, scen) -> None:
        """Raise ValueError("@key: why") where the scenario gives this policy nothing to decide."""

    def decide(self, op: Operation, view) -> dict[int, int | None]:
        """flow id → the source port to send it with, or None: it does not run (a ring order not picked);
        flows not named are sent from their own QP's port."""
        raise NotImplementedError

    def delays(self, op: Operation, view, ports: dict[int, int | None]) -> dict[int, float]:
        """flow id → seconds its host holds it back once it could start (its step's turn came and the decision
        is known), given ``ports`` as ``decide`` returned them; flows not named start at once (the default)."""
        return {}


def _load(target: str):
    import importlib
    mod, _, attr = target.partition(":")
    return getattr(importlib.import_module(mod), attr)


@lru_cache(maxsize=1)
def policies() -> dict[str, str]:
    """name → "module:Class" of every registered policy (read once per process)."""
    out = dict(BUILTIN)
    for ep in metadata.entry_points(group=GROUP):
        out[ep.name] = ep.value
    return out


def get_policy(name: str) -> type[Policy]:
    known = policies()
    if not isinstance(name, str) or name not in known:
        raise UnknownPolicy(f"unknown collective policy {name!r} (registered: {', '.join(sorted(known))})")
    cls = _load(known[name])
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise UnknownPolicy(f"collective policy {name!r}: {known[name]} is not a Policy subclass")
    return cls
