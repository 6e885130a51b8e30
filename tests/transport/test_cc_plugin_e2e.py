"""A congestion control from outside the tree: examples/plugins/aimd_cc is pip-installed into the test venv
(a wheel: the running interpreter sees it at once, an editable install's .pth would need a new process), an 8 → 1
RoCE incast runs with ``traffic.cc: aimd``, and the package is uninstalled afterwards."""
from __future__ import annotations

import importlib
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from testbed import scenario

from conftest import ROOT, guarded_run

pytestmark = pytest.mark.e2e

PLUGIN = ROOT / "examples" / "plugins" / "aimd_cc"
FLOW = 128 * 1024


def _pip(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture
def aimd_installed(tmp_path):
    src = tmp_path / "aimd_cc"                   # built from a copy: the build leaves nothing in the checkout
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _pip("install", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(src))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        _pip("uninstall", "-y", "-q", "fabric-testbed-aimd-cc")
        sys.modules.pop("aimd_cc", None)
        from testbed.workloads.roce.cc import registry
        registry._loaded.pop("aimd", None)


def test_an_installed_plugin_cc_runs_an_8_to_1_incast(aimd_installed, tmp_path):
    from testbed.workloads.roce.cc import cc_names
    assert "aimd" in cc_names()
    with pytest.raises(scenario.ScenarioError, match=r"^traffic\.cc_params\.beta: must be < 1"):
        scenario.from_dict({"traffic": {"engine": "roce", "cc": "aimd", "cc_params": {"beta": 1.5}}})
    scen = scenario.from_dict({
        "name": "aimd-incast", "seed": 1, "duration": "10s",
        "topology": {"spines": 1, "leaves": 1, "hosts_per_leaf": 9,
                     "host_link": {"rate": "20mbit", "buffer": "128KB"},
                     "fabric_link": {"rate": "40mbit", "buffer": "128KB"}},
        "switch": {"ecn": {"kmin": "10KB", "kmax": "40KB", "pmax": 0.2}},
        "traffic": {"engine": "roce", "pattern": "incast", "incast": {"receiver": "h0", "senders": 8},
                    "flow_size": "128KB", "receiver": "ooo", "cc": "aimd", "cc_params": {"beta": 0.7},
                    "roce": {"rto": "50ms"}}})
    d, row = guarded_run(scen, tmp_path / "aimd")
    flows, cc = pd.read_csv(d / "flows.csv"), pd.read_csv(d / "cc.csv")
    links = pd.read_csv(d / "links.csv")
    span = flows["end_s"].max() - flows["start_s"].min()
    print(f"\n[aimd 8→1] {span:.3f} s ({span / (8 * FLOW * 8 / 20e6):.3f} × ideal payload time); CC rate p50 "
          f"{(flows['cc_rate_p50'] / 1e6).round(2).tolist()} Mbit/s; window final "
          f"{cc.groupby('flow_id')['cwnd_bytes'].last().round(0).tolist()} B; drops "
          f"{int(links[links['direction'] == 'tx']['drops'].sum())}, marks {int(flows['ce_marks'].sum())}, "
          f"timeouts {int(flows['timeouts'].sum())}")
    assert len(flows) == 8 and flows["complete"].all() and flows["checksum_ok"].all()
    assert (flows["bytes"] == FLOW).all() and not flows["error"].notna().any()
    assert flows["cc_rate_p50"].notna().all() and (flows["cc_rate_p50"] > 0).all()     # the CC's rate
    assert set(cc["flow_id"]) == set(flows["flow_id"]) and cc["cwnd_bytes"].notna().all()   # … and its window
    assert cc["cwnd_bytes"].min() >= 1024 * 0.999
