"""Turn ebpf/switch.c and its lib/*.h into one C text for BCC.

BCC rewrites its map syntax (``map.lookup(&k)``) only in the main file it compiles; the same code in an
included header compiles but fails to load ("unknown opcode"). Keeping the logic in headers (readable, shared by
entry programs) therefore needs the quoted includes inlined. ``#line`` markers keep compiler messages pointing
at the real file and line.
"""
from __future__ import annotations

import re
from pathlib import Path

EBPF_DIR = Path(__file__).resolve().parents[2] / "ebpf"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def render(path: Path | str) -> str:
    """The text of ``path`` with every ``#include "…"`` replaced by the file (each file once)."""
    seen: set[Path] = set()
    out: list[str] = []

    def emit(p: Path) -> None:
        p = p.resolve()
        if p in seen:
            return
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
