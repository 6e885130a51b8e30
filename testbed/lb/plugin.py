"""``switch.load_balancing: plugin``: a C header implementing the next-hop choice of ebpf/lb/choose.h,

    FTB_ALWAYS_INLINE __u64 ftb_plugin_choose(struct lb_args *a);

compiled into the switch program in place of a built-in mode (docs/extending.md). ``switch.plugin.source`` is
the header (relative to the scenario file), ``switch.plugin.params`` its integer parameters: they reach the
program through the BPF array ``plugin_params``, and the header reads them by index — the loader defines
``PLUGIN_PARAM_<NAME>`` (the name upper-cased) as each one's index, in the order given, and ``PLUGIN_NPARAMS``.

This module checks the keys (one-line errors, as the rest of the scenario) and turns them into the datapath's
``LbPlugin``; the datapath compiles it and reports a compile error as one line naming the header's file and line.
"""
from __future__ import annotations

import re
from pathlib import Path

from pydantic import field_validator

from ..datapath.source import LbPlugin
from ..spec_types import Strict

MAX_PARAMS = 64                 # entries of the plugin_params map at most
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


def define(name: str) -> str:
    """The C name of parameter ``name``'s index."""
    return f"PLUGIN_PARAM_{name.upper()}"


class PluginSpec(Strict):
    """``switch.plugin``: the header and its integer parameters."""
    source: str
    params: dict[str, int] = {}

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        p = Path(v).expanduser()
        if not p.is_file():
            raise ValueError("no such file (a relative path is read beside the scenario file)")
        return str(p.resolve())

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, int]) -> dict[str, int]:
        if len(v) > MAX_PARAMS:
            raise ValueError(f"at most {MAX_PARAMS} parameters, got {len(v)}")
        seen: dict[str, str] = {}
        for name, value in v.items():
            if not _NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a parameter name (a C identifier: letters, digits, _; ≤ 40)")
            if define(name) in seen:
                raise ValueError(f"{name!r} and {seen[define(name)]!r} are the same parameter ({define(name)})")
            seen[define(name)] = name
            if isinstance(value, bool) or not 0 <= value < 2**64:
                raise ValueError(f"{name}: an integer 0 .. 2^64 − 1, got {value!r}")
        return v



def resolve_source(switch: object, base: Path) -> None:
    """In a scenario document's ``switch`` mapping, make a relative ``plugin.source`` absolute against ``base``
    (the scenario file's directory) when the file is there, as traffic.replay is resolved."""
    plugin = switch.get("plugin") if isinstance(switch, dict) else None
    src = plugin.get("source") if isinstance(plugin, dict) else None
    if isinstance(src, str) and not Path(src).expanduser().is_absolute() and (base / src).is_file():
        plugin["source"] = str((base / src).resolve())


def for_datapath(switch_spec) -> LbPlugin | None:
    """What the datapath compiles in for a SwitchSpec: None unless its mode is plugin."""
    spec = getattr(switch_spec, "plugin", None)
    if switch_spec.load_balancing != "plugin" or spec is None:
        return None
    names = list(spec.params)
    defines = "".join(f"#define {define(n)} {i}\n" for i, n in enumerate(names)) + f"#define PLUGIN_NPARAMS {len(names)}\n"
    return LbPlugin(Path(spec.source), defines, tuple(int(spec.params[n]) for n in names))
