"""`testbed validate` end to end: the quick references pass on real runs (each seed a whole run: namespaces,
eBPF switches, real packets), validation.csv and the report page say so; a reference the testbed cannot meet
fails the command with one line and keeps its results; bad input is one line and leaves nothing behind."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from testbed.validate import suite

from conftest import run_cli

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_references_pass_and_write_their_table_and_page(tmp_path):
    """A reference whose runs the CPU guard flagged twice is ``invalid``: those are run once more here, as the
    suite's own tests re-run a flagged run; a valid reference that misses its band fails the test."""
    out = tmp_path / "v"
    res = run_cli("validate", "--quick", "--out", str(out), timeout=600)
    table = pd.read_csv(out / suite.VALIDATION_CSV)
    print("\n" + res.stdout)
    quick = sorted(r.name for r in suite.discover() if r.spec.quick)
    assert sorted(table["name"]) == quick
    invalid = table.loc[table["verdict"] == "invalid", "name"].tolist()
    if invalid:
        again = run_cli("validate", "--only", ",".join(invalid), "--out", str(tmp_path / "again"), timeout=600)
        print(again.stdout)
        table = pd.concat([table[table["verdict"] != "invalid"],
                           pd.read_csv(tmp_path / "again" / suite.VALIDATION_CSV)])
    assert (table["verdict"] == "pass").all(), table[["name", "measured", "reference", "verdict", "notes"]]
    if not invalid:
        assert res.returncode == 0, res.stderr
    assert list(pd.read_csv(out / suite.VALIDATION_CSV).columns) == suite.COLUMNS
    page = (out / "report.html").read_text()
    assert all(f"{n} — " in page for n in quick)                   # one plot per reference, captioned
    for n in quick:
        assert (out / n / "seed-1" / "flows.csv").is_file()


def test_a_reference_the_testbed_misses_fails_the_command_and_keeps_its_results(tmp_path):
    refs = tmp_path / "refs"
    refs.mkdir()
    text = (ROOT / "scenarios" / "validation" / "ecmp-balls-in-bins-4.yaml").read_text()
    text = text.replace("  value: 2.125\n", "  value: 4.0\n").replace("  seeds: 5\n", "  seeds: 1\n")
    (refs / "impossible.yaml").write_text(text)
    for k in range(3):                               # a run flagged twice makes it invalid: judge another
        out = tmp_path / f"v{k}"
        res = run_cli("validate", "--dir", str(refs), "--out", str(out), timeout=300)
        row = pd.read_csv(out / suite.VALIDATION_CSV).iloc[0]
        if row["verdict"] != "invalid":
            break
    assert row["verdict"] == "fail" and row["reference"] == 4.0 and row["seeds"] == 1
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == "error: 1 of 1 reference(s) failed: impossible"
    assert (out / "report.html").is_file() and (out / "impossible" / "seed-1" / "summary.csv").is_file()


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "v"
    res = run_cli("validate", "--only", "nosuch", "--out", str(out))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith("error: --only: no reference 'nosuch'; known: ")
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(ROOT / "scenarios" / "validation" / "ecmp-balls-in-bins-4.yaml", bad / "x.yaml")
    (bad / "x.yaml").write_text((bad / "x.yaml").read_text().replace("metric: uplink_load_max", "metric: nope"))
    res = run_cli("validate", "--dir", str(bad), "--out", str(out))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().startswith(f"error: {bad / 'x.yaml'}: reference.metric: ")
    assert not out.exists()
