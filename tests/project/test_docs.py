"""The documentation: README.md is the front page, docs/ a MkDocs site (mkdocs.yml) that builds with --strict, and
every scenario key is documented. Pure and fast: no root, no kernel (the build needs the `docs` extra, which
scripts/test-setup.sh installs)."""
import importlib.util
import os
import re
import subprocess
import sys
import typing
from collections import Counter
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from testbed.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
QUICK_START = ("bash scripts/quickstart.sh", "bash scripts/test.sh")


def _nav_pages(nav) -> list[str]:
    """Every page file named in mkdocs.yml's nav, in order (entries are 'file', {title: file} or {title: [...]})."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return []


def _config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_mkdocs_build_strict(tmp_path):
    """`mkdocs build --strict` succeeds: no broken link or anchor, no missing page, no page left out of the nav."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (the docs extra: scripts/test-setup.sh installs it)")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                        "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    for page in _nav_pages(_config()["nav"]):
        out = "index.html" if page == "index.md" else page[:-len(".md")] + "/index.html"
        assert (tmp_path / "site" / out).is_file(), page


def test_readme_is_the_front_page():
    """README.md stays short and shows the two quick-start commands, as root without sudo."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for cmd in QUICK_START:
        assert cmd in text, cmd
        assert f"sudo {cmd}" not in text, cmd


def test_site_index_is_the_readme():
    """docs/index.md is README.md with its links made relative to docs/ (the site's front page is the repository's)."""
    readme = (ROOT / "README.md").read_text()
    want = readme.replace("](docs/", "](").replace("](results/README.md)", "](columns.md)")
    assert (DOCS / "index.md").read_text() == want, (
        "docs/index.md is out of date: sed -e 's#](docs/#](#g' -e 's#](results/README.md)#](columns.md)#g' "
        "README.md > docs/index.md")


def test_every_page_is_in_the_nav():
    nav = _nav_pages(_config()["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice"
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages


def _models_in(tp) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models_in(a)]


def scenario_keys(model=Scenario, prefix="", seen=()) -> list[str]:
    """Every leaf key of the scenario as a dotted path (`switch.pfc.xoff`): fields of nested models, recursively."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        sub = [m for m in _models_in(field.annotation) if m not in seen]
        if _models_in(field.annotation):
            for m in sub:
                keys += scenario_keys(m, key + ".", seen + (m,))
        else:
            keys.append(key)
    return sorted(set(keys))


def _word(name: str, text: str) -> bool:
    return re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", text) is not None


def test_every_scenario_key_is_documented():
    """Each leaf key's name appears as code in the docs (a `span` or a fenced block, e.g. a YAML example); a name
    several keys share (`rate`, `enabled`, `base_rtt`) must appear in one code span or block together with its
    parent's name, or as code in a paragraph that names the parent (`pfc`), so that dropping one of them from the
    docs is noticed."""
    texts = [p.read_text() for p in sorted(DOCS.rglob("*.md"))] + [(ROOT / "results" / "README.md").read_text()]
    text = "\n".join(texts)
    spans = re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", text)
    paragraphs = re.split(r"\n\s*\n", text)
    keys = scenario_keys()
    assert len(keys) > 100 and "switch.pfc.xoff" in keys
    shared = Counter(k.rsplit(".", 1)[-1] for k in keys)
    missing = []
    for key in keys:
        *parents, last = key.split(".")
        if not any(_word(last, s) for s in spans):
            missing.append(key)
        elif shared[last] > 1 and parents:
            parent = parents[-1]
            if not (any(_word(last, s) and _word(parent, s) for s in spans)
                    or any(_word(parent, p) and any(_word(last, s) for s in re.findall(r"`[^`\n]+`", p))
                           for p in paragraphs)):
                missing.append(key)
    assert not missing, f"scenario keys not documented in docs/: {missing}"
