"""The scenario's ``topology`` section: the kind of fabric and its counts, the links' rate, buffer and delay,
and per-pair overrides."""
from __future__ import annotations

from fractions import Fraction
from typing import Literal, Optional

from pydantic import Field, model_validator

from .. import units
from ..spec_types import Delay, NodeName, Rate, Ratio, Size, Strict, whole_us as _whole_us
from .model import TIERS


class LinkSpec(Strict):
    rate: Rate = units.rate_bps("100mbit")
    buffer: Size = units.size_bytes("256KB")
    # One-way propagation delay of the link (each direction), e.g. 50us. Emulated with netem under the shaping
    # qdisc, so it needs a kernel with sch_netem (`testbed doctor`: netem) — a distribution kernel or the VM.
    delay: Delay = 0

    @model_validator(mode="after")
    def _delay_in_us(self):
        _whole_us(self.delay)
        return self


class LinkOverrideSpec(Strict):
    """One ``topology.links`` entry: the link between two nodes (both directions) gets these instead of its
    kind's host_link / fabric_link values — a degraded or slower link, an asymmetric fabric."""
    between: tuple[NodeName, NodeName]
    rate: Optional[Rate] = None
    buffer: Optional[Size] = None
    delay: Optional[Delay] = None
    weight: Optional[int] = Field(None, ge=1, le=65535)   # stored on the link and its ports for a later WCMP

    @model_validator(mode="after")
    def _says_something(self):
        _whole_us(self.delay)
        if self.rate is None and self.buffer is None and self.delay is None and self.weight is None:
            raise ValueError("give at least one of rate, buffer, delay, weight for this link")
        return self


#: Keys that only some kinds use, with each kind's defaults (a key another kind uses must stay unset there).


_KIND_KEYS = {
    "leaf-spine": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2},
    "clos3": {"pods": 2, "leaves_per_pod": 2, "spines_per_pod": 2, "cores": 2, "planes": 1, "hosts_per_leaf": 2},
    "fat-tree": {"k": None, "oversubscription": "1:1", "hosts_per_leaf": None},
}
_WHY_NOT = {"fat-tree": "k sets every count of a fat-tree", "clos3": "use pods, leaves_per_pod, spines_per_pod, "
            "cores, planes, hosts_per_leaf", "leaf-spine": "use spines, leaves, hosts_per_leaf"}


class TopologySpec(Strict):
    kind: Literal["leaf-spine", "clos3", "fat-tree"] = "leaf-spine"
    # leaf-spine (spines and leaves per rail)
    spines: Optional[int] = Field(None, ge=1, le=64)
    leaves: Optional[int] = Field(None, ge=1, le=256)
    hosts_per_leaf: Optional[int] = Field(None, ge=1, le=253)      # every kind; fat-tree: k/2
    rails: int = Field(1, ge=1, le=8)
    rails_share_spines: bool = False      # rails' leaves share one spine layer (SuperPOD); default: planes
    # fat-tree
    k: Optional[int] = Field(None, ge=4, le=16)
    oversubscription: Optional[Ratio] = None    # a:b hosts to uplinks per leaf; removes uplinks (clos.py)
    # clos3
    pods: Optional[int] = Field(None, ge=1, le=64)
    leaves_per_pod: Optional[int] = Field(None, ge=1, le=64)
    spines_per_pod: Optional[int] = Field(None, ge=1, le=64)
    cores: Optional[int] = Field(None, ge=1, le=256)
    planes: Optional[int] = Field(None, ge=1, le=64)       # core planes; spine a of a pod → plane a mod planes
    mtu: int = Field(1500, ge=576, le=9000)
    host_link: LinkSpec = LinkSpec()
    fabric_link: LinkSpec = LinkSpec()
    links: list[LinkOverrideSpec] = []
    offloads: bool = False

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data):
        """Fill the defaults of the keys this kind uses, so that the resolved scenario shows them and the keys
        of other kinds stay None (and are refused when given)."""
        if not isinstance(data, dict):
            return data
        kind = data.get("kind", "leaf-spine")
        own = _KIND_KEYS.get(kind) if isinstance(kind, str) else None
        if own is None:
            return data                   # an unknown kind, or not a name: the field says so
        data = dict(data)
        for key, value in own.items():
            if data.get(key) is None:
                data[key] = value
        k = data.get("k")
        if "k" in own and data.get("hosts_per_leaf") is None and isinstance(k, int) and not isinstance(k, bool):
            data["hosts_per_leaf"] = k // 2
        return data

    @model_validator(mode="after")
    def _fits_kind(self):
        own = _KIND_KEYS[self.kind]
        for key in ("spines", "leaves", "k", "oversubscription", "pods", "leaves_per_pod", "spines_per_pod",
                    "cores", "planes"):
            if key not in own and getattr(self, key) is not None:
                raise ValueError(f"{key}: not a key of kind {self.kind} ({_WHY_NOT[self.kind]})")
        if self.kind != "leaf-spine" and self.rails != 1:
            raise ValueError(f"rails: multi-rail hosts are a leaf-spine layout (kind {self.kind} gives each host "
                             f"one NIC), got {self.rails}")
        if self.rails_share_spines and self.kind != "leaf-spine":
            raise ValueError(f"rails_share_spines: rails are a leaf-spine layout, got kind {self.kind}")
        if self.rails_share_spines and self.rails < 2:
            raise ValueError("rails_share_spines: needs rails ≥ 2 (one rail has no other rail to share spines "
                             f"with), got rails: {self.rails}")
        if self.kind == "leaf-spine":
            from . import max_leaves_per_rail
            limit = max_leaves_per_rail(self.rails)
            if self.leaves > limit:
                raise ValueError(f"leaves: at most {limit} leaves per rail fit the address plan with "
                                 f"{self.rails} rail(s), got {self.leaves}")
        elif self.kind == "fat-tree":
            self._fat_tree()
        else:
            self._clos3()
        self._links_exist()
        return self

    def _fat_tree(self) -> None:
        from .clos import fat_tree_uplinks
        k = self.k
        if k is None:
            raise ValueError("k: kind fat-tree needs k (even, 4–16: k pods, k³/4 hosts)")
        if k % 2:
            raise ValueError(f"k: must be even, got {k}")
        if self.hosts_per_leaf != k // 2:
            raise ValueError(f"hosts_per_leaf: a fat-tree of k = {k} has k/2 = {k // 2} hosts per leaf (leave the "
                             f"key out), got {self.hosts_per_leaf}")
        up = fat_tree_uplinks(k, self.oversubscription_ratio)
        if up < 1:
            raise ValueError(f"oversubscription: {self.oversubscription} leaves no uplink (k/2 = {k // 2} uplinks "
                             f"per leaf ÷ {self.oversubscription_ratio} = {up})")
        if up.denominator != 1:
            raise ValueError(f"oversubscription: {self.oversubscription} does not leave a whole number of uplinks "
                             f"(k/2 = {k // 2} ÷ {self.oversubscription_ratio} = {up}); use a ratio that divides "
                             f"{k // 2}, e.g. {k // 2}:1")

    def _clos3(self) -> None:
        from .clos import MAX_SLASH24, shape
        if self.planes > self.spines_per_pod or self.spines_per_pod % self.planes:
            raise ValueError(f"planes: must divide spines_per_pod ({self.spines_per_pod}), got {self.planes}")
        if self.cores % self.planes:
            raise ValueError(f"cores: must be a multiple of planes ({self.planes}), got {self.cores}")
        sh = shape(self)
        if sh.slash24s > MAX_SLASH24:
            raise ValueError(f"pods: {self.pods} pods × {1 << sh.leaf_bits} leaf /24s (leaves_per_pod rounded up "
                             f"to a power of two) do not fit 198.18.0.0/15 ({MAX_SLASH24} /24s), got {self.pods}")

    def _links_exist(self) -> None:
        """Every ``links`` entry names two nodes of this topology that a link joins, once."""
        if not self.links:
            return
        from . import build, node_names
        names = set(node_names(self))
        seen: dict[frozenset, int] = {}
        linked = None
        for i, o in enumerate(self.links):
            a, b = o.between
            where = f"@topology.links.{i}.between"
            for n in (a, b):
                if n not in names:
                    raise ValueError(f"{where}: no node {n!r} in this topology")
            if a == b:
                raise ValueError(f"{where}: a link joins two different nodes, got [{a}, {b}]")
            pair = frozenset((a, b))
            if pair in seen:
                raise ValueError(f"{where}: {a}–{b} is already overridden by topology.links.{seen[pair]}")
            seen[pair] = i
            if linked is None:
                linked = {frozenset((ln.a.node, ln.b.node)) for ln in build(self).links}
            if pair not in linked:
                raise ValueError(f"{where}: {a} and {b} are not linked")

    @property
    def oversubscription_ratio(self) -> Fraction:
        a, _, b = (self.oversubscription or "1:1").partition(":")
        return Fraction(int(a), int(b))

    @property
    def tiers(self) -> tuple[str, ...]:
        """The switch tiers this kind has (the keys switch.tiers may use)."""
        return TIERS[:2] if self.kind == "leaf-spine" else TIERS

    @property
    def path_switches(self) -> int:
        """Switches on the longest host-to-host path (up every tier and down again)."""
        return 2 * len(self.tiers) - 1

    @property
    def hosts(self) -> int:
        if self.kind == "leaf-spine":
            return self.leaves * self.hosts_per_leaf
        from .clos import shape
        s = shape(self)
        return s.pods * s.leaves * s.hosts
