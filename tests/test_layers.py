"""The package's structure holds: the layers contract in pyproject.toml (lint-imports) and no import cycle
between any two modules, counting imports inside functions (which hide upward dependencies)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parent.parent


def test_the_layers_contract_is_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is missing: pip install -e '.[test]'"
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]


def import_graph() -> nx.DiGraph:
    g = grimp.build_graph("testbed", include_external_packages=False, cache_dir=None)
    return nx.DiGraph((m, i) for m in g.modules for i in g.find_modules_directly_imported_by(m))


def test_no_module_imports_itself_through_others():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert cycles == []


def test_the_cycle_check_sees_a_cycle():
    g = nx.DiGraph([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])
    assert [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1] == [["a", "b", "c"]]
