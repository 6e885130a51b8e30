"""The congestion-control registry: every ``traffic.cc`` name, built-in or installed from another package.

A CC is registered under the entry-point group ``fabric_testbed.cc`` (importlib.metadata): the entry point names
a ``CongestionControl`` subclass (or an instance of one). The built-ins register the same way (pyproject.toml);
the table below is the fallback for a checkout whose installed metadata predates them, so an editable install
never loses a built-in. docs/extending.md walks through adding one.
"""
from __future__ import annotations

from importlib import metadata
from typing import ClassVar, Optional

from pydantic import BaseModel

from .base import CCConfig, SenderCC
from .dcqcn import DcqcnConfig, DcqcnParams, ReactionPoint
from .eqds import EqdsConfig, EqdsParams, EqdsSender, NsccEqds
from .hpcc import HpccConfig, HpccParams, HpccSender
from .nscc import NsccConfig, NsccParams, NsccSender
from .swift import SwiftConfig, SwiftParams, SwiftSender
from .timely import TimelyConfig, TimelyParams, TimelySender

GROUP = "fabric_testbed.cc"


class CongestionControl:
    """One ``traffic.cc`` choice: its name, its parameter model, how its defaults scale to the run's line rate
    and base RTT, and the factory of a flow's ``SenderCC``.

    ``scale`` runs once per run, in the controller; its dict (JSON-able) travels to every sender agent, where
    ``make`` builds each flow's controller from it. ``extended``: the flows need the extended transport
    (transmit times in data packets → RTT samples, CE echoes in ACKs → ``on_ack(ecn=…)``); ``cnp``: receivers
    send DCQCN-style CNPs for CE-marked packets (→ ``on_cnp``)."""
    name: ClassVar[str] = ""
    params_model: ClassVar[type[BaseModel]] = CCConfig
    extended: ClassVar[bool] = True
    cnp: ClassVar[bool] = False
    #: the ``traffic.<key>`` sections holding this CC's parameters besides ``traffic.cc_params`` (built-ins)
    sections: ClassVar[tuple[str, ...]] = ()

    def scale(self, line_rate_bps: float, base_rtt_s: float, params: BaseModel, mss: int) -> dict:
        """The runtime parameters: the defaults scaled to (line rate, base RTT), ``params``' given keys over
        them. ``mss``: payload bytes per full packet."""
        raise NotImplementedError

    def make(self, params: dict, now: float) -> SenderCC:
        """A flow's controller, from what ``scale`` returned; ``now``: the flow's start (epoch seconds)."""
        raise NotImplementedError


class _Family(CongestionControl):
    """A built-in with one parameter family (``traffic.<name>``): its params dataclass scales itself."""
    params_cls: ClassVar[type] = None
    sender_cls: ClassVar[type] = None

    def scale(self, line_rate_bps, base_rtt_s, params, mss):
        return self.params_cls.scaled(line_rate_bps, base_rtt_s, **{"mss": mss, **params.overrides()}).to_dict()

    def make(self, params, now):
        return self.sender_cls(self.params_cls.from_dict(params), now)


class Dcqcn(CongestionControl):
    """DCQCN: the uniform slow-down of the paper's 40 Gbit/s settings (cc/dcqcn.py); CNP-driven."""
    name, params_model, extended, cnp, sections = "dcqcn", DcqcnConfig, False, True, ("dcqcn",)

    def scale(self, line_rate_bps, base_rtt_s, params, mss):
        return DcqcnParams.scaled(line_rate_bps, **params.overrides()).to_dict()

    def make(self, params, now):
        return ReactionPoint(DcqcnParams(**params), now)


class Nscc(_Family):
    name, params_model, sections, params_cls, sender_cls = "nscc", NsccConfig, ("nscc",), NsccParams, NsccSender


class Swift(_Family):
    name, params_model, sections, params_cls, sender_cls = "swift", SwiftConfig, ("swift",), SwiftParams, SwiftSender


class Timely(_Family):
    name, params_model, sections = "timely", TimelyConfig, ("timely",)
    params_cls, sender_cls = TimelyParams, TimelySender


class Hpcc(_Family):
    name, params_model, sections, params_cls, sender_cls = "hpcc", HpccConfig, ("hpcc",), HpccParams, HpccSender


class Eqds(_Family):
    name, params_model, sections, params_cls = "eqds", EqdsConfig, ("eqds",), EqdsParams

    def make(self, params, now):
        return EqdsSender.from_params(EqdsParams.from_dict(params))


class NsccEqdsConfig(BaseModel):
    """``traffic.cc_params`` of ``nscc+eqds``: the two families' parameters."""
    model_config = CCConfig.model_config
    nscc: NsccConfig = NsccConfig()
    eqds: EqdsConfig = EqdsConfig()


class NsccPlusEqds(CongestionControl):
    """The NSCC window and the EQDS credit gate together; each family keeps its own ``base_rtt``."""
    name, params_model, sections = "nscc+eqds", NsccEqdsConfig, ("nscc", "eqds")

    def scale(self, line_rate_bps, base_rtt_s, params, mss):
        out = {}
        for fam, cls in (("nscc", NsccParams), ("eqds", EqdsParams)):
            sub = getattr(params, fam)
            rtt = sub.base_rtt / 1e9 if sub.base_rtt else base_rtt_s
            out[fam] = cls.scaled(line_rate_bps, rtt, **{"mss": mss, **sub.overrides()}).to_dict()
        return out

    def make(self, params, now):
        return NsccEqds(NsccParams.from_dict(params["nscc"]), EqdsParams.from_dict(params["eqds"]), now)


BUILTINS: dict[str, type[CongestionControl]] = {c.name: c for c in (Dcqcn, Nscc, Swift, Timely, Hpcc, Eqds,
                                                                     NsccPlusEqds)}
_loaded: dict[str, CongestionControl] = {}


class UnknownCC(ValueError):
    """``traffic.cc`` names no registered congestion control."""


def _entry_points() -> dict:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def names() -> tuple[str, ...]:
    """Every registered name, built-ins first (``none`` is not a CC: it is the absence of one)."""
    extra = sorted(n for n in _entry_points() if n not in BUILTINS)
    return tuple(BUILTINS) + tuple(extra)


def get(name: str) -> CongestionControl:
    """The registered CC called ``name``; ``UnknownCC`` (one line listing the known ones) when there is none."""
    cc = _loaded.get(name)
    if cc is not None:
        return cc
    eps = _entry_points()
    if name in eps:
        try:
            obj = eps[name].load()
        except Exception as e:                       # a broken plugin: say which, not a traceback
            raise UnknownCC(f"congestion control {name!r} ({eps[name].value}) failed to load: "
                            f"{type(e).__name__}: {e}") from None
    elif name in BUILTINS:
        obj = BUILTINS[name]
    else:
        raise UnknownCC(f"unknown congestion control {name!r} (known: none, {', '.join(names())})")
    cc = obj() if isinstance(obj, type) else obj
    if not isinstance(cc, CongestionControl):
        raise UnknownCC(f"congestion control {name!r}: {eps[name].value} is not a CongestionControl")
    _loaded[name] = cc
    return cc


def maybe(name: str) -> Optional[CongestionControl]:
    """``get`` for a ``traffic.cc`` value that may be ``none``."""
    return None if name == "none" else get(name)
