"""The Python API without a kernel: `import testbed` stays light, load_scenario's forms, Result on files."""
from __future__ import annotations

import subprocess
import sys

import pytest

import testbed
from testbed import report as rp
from testbed.report.files import ReportError
from testbed.scenario import ScenarioError

from conftest import ROOT
from test_report import CPU, EVEN, MANIFEST, META, make_flows, make_links

SCEN = str(ROOT / "scenarios" / "default.yaml")


def test_import_testbed_loads_neither_the_api_nor_pandas():
    code = ("import sys, testbed; assert 'pandas' not in sys.modules and 'testbed.api' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('testbed', 'pandas'))); "
            "from testbed import load_scenario, Lab, run; assert 'testbed.api' in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert {"load_scenario", "Lab", "run", "Result"} <= set(dir(testbed))
    with pytest.raises(AttributeError):
        testbed.no_such_thing           # noqa: B018


def test_load_scenario_from_a_file_a_mapping_and_a_scenario():
    from testbed import load_scenario
    s = load_scenario(SCEN, "switch.load_balancing=spray", overrides={"topology.spines": 2, "duration": "1s"})
    assert (s.name, s.switch.load_balancing, s.topology.spines, s.duration) == ("default", "spray", 2, 10**9)
    again = load_scenario(s, overrides={"switch.load_balancing": "flowlet"})
    assert (again.switch.load_balancing, again.topology.spines, again.duration) == ("flowlet", 2, 10**9)
    d = load_scenario({"topology": {"hosts_per_leaf": 2}}, "seed=5")
    assert d.seed == 5 and d.topology.hosts_per_leaf == 2
    with pytest.raises(ScenarioError, match="switch.load_balancing"):
        load_scenario(SCEN, overrides={"switch.load_balancing": "bogus"})


def test_result_reads_a_result_directory(tmp_path):
    from testbed import Result, load_result, load_sweep
    row = rp.write_run(tmp_path, MANIFEST, make_links(EVEN), make_flows([0.01, 0.02]), CPU, META)
    res = load_result(tmp_path)
    assert res.summary["uplink_imbalance"] == pytest.approx(row["uplink_imbalance"])
    assert res.summary["run_id"] == "r1" and res.failed is None
    assert len(res.flows) == 2 and res.flows["fct_s"].tolist() == [0.01, 0.02]
    assert len(res.links) == len(make_links(EVEN)) and "util" in res.links.columns
    assert res.collectives is None and res.failures is None
    assert "r1" not in repr(res) and "ecmp" in repr(res)
    with pytest.raises(ReportError, match="not a result directory"):
        Result(tmp_path / "nothing")
    with pytest.raises(ReportError, match="not a sweep directory"):
        load_sweep(tmp_path)
