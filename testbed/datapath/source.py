"""Turn ebpf/switch.c and its lib/*.h, lb/*.h into one C text for BCC.

BCC rewrites its map syntax (``map.lookup(&k)``) only in the main file it compiles; the same code in an
included header compiles but fails to load ("unknown opcode"). Keeping the logic in headers (readable, shared by
entry programs) therefore needs the quoted includes inlined. ``#line`` markers keep compiler messages pointing
at the real file and line — a load-balancing plugin's too: its header is inlined at ebpf/lb/plugin.h's place,
after the generated defines of its parameters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

EBPF_DIR = Path(__file__).resolve().parents[2] / "ebpf"
PLUGIN_SLOT = EBPF_DIR / "lb" / "plugin.h"     # the placeholder a plugin's header replaces
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


@dataclass(frozen=True)
class LbPlugin:
    """A load-balancing plugin to compile into the switch program (``load_balancing: plugin``): the header that
    defines ``ftb_plugin_choose`` (ebpf/lb/choose.h), the C text defining its parameters' indexes
    (``#define PLUGIN_PARAM_<NAME> i``), and the parameters' values by index (the ``plugin_params`` map)."""
    source: Path
    defines: str
    values: tuple[int, ...]


def render(path: Path | str, plugin: LbPlugin | None = None) -> str:
    """The text of ``path`` with every ``#include "…"`` replaced by the file (each file once); with ``plugin``,
    its header (and defines) in place of ebpf/lb/plugin.h."""
    seen: set[Path] = set()
    out: list[str] = []

    def emit(p: Path) -> None:
        p = p.resolve()
        if p in seen:
            return
        seen.add(p)
        if plugin is not None and p == PLUGIN_SLOT.resolve():
            out.append(f'#line 1 "{p}"')
            out.extend(plugin.defines.splitlines())
            p = Path(plugin.source).resolve()
            seen.add(p)
        out.append(f'#line 1 "{p}"')
        for n, line in enumerate(p.read_text().splitlines(), 1):
            m = _INCLUDE.match(line)
            if m:
                emit(p.parent / m.group(1))
                out.append(f'#line {n + 1} "{p}"')
            else:
                out.append(line)

    emit(Path(path))
    return "\n".join(out) + "\n"
