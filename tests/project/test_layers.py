"""The package's structure holds: the layers contract in pyproject.toml (lint-imports) and no import cycle
between any two modules, counting imports inside functions (which hide upward dependencies)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parents[2]


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


#: one name per job, one file per family for these: a family's scenario keys and its cross-field checks
FAMILY_FILES = {"spec.py", "checks.py"}


def test_no_two_modules_share_a_name_with_different_jobs():
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "testbed").rglob("*.py")):
        if path.name != "__init__.py" and path.name not in FAMILY_FILES:
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}


def test_package_inits_and_modules_stay_small():
    """A package's __init__ says what it holds (≤ 150 lines); no module is over 800 lines."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "testbed").rglob("*.py")}
    assert {p: n for p, n in sizes.items() if p.endswith("__init__.py") and n > 150} == {}
    assert {p: n for p, n in sizes.items() if n > 800} == {}
