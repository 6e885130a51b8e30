"""`testbed routes`: the SM's tables without a fabric, from the same functions the running SM uses."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from testbed import scenario, topology
from testbed.cli import cli
from testbed.routing import algorithms

FT4 = "topology: {kind: fat-tree, k: 4}\nswitch: {routing: sm, sm: {engine: updn}}\n"


def _run(tmp_path, *args):
    path = tmp_path / "ft4.yaml"
    path.write_text(FT4)
    return CliRunner().invoke(cli, ["routes", str(path), *args])


def test_routes_writes_every_switch_destination_pair_as_the_sm_computes_it(tmp_path):
    res = _run(tmp_path, "--out", str(tmp_path / "routes.csv"))
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "routes.csv")
    assert list(df.columns[:3]) == ["switch", "destination", "port"]
    topo = topology.build(scenario.from_dict({"topology": {"kind": "fat-tree", "k": 4}}).topology)
    want = algorithms.compute("updn", algorithms.graph(topo))
    assert len(df) == len(want) == 20 * 16          # 20 switches × 16 host addresses
    for r in df.itertuples():
        assert topo.port(want[(r.switch, r.destination)][0]).ifname == r.port
    links = pd.read_csv(tmp_path / "routes-links.csv")
    assert links.routes.sum() == len(want) - 16      # every entry but the leaves' own host ports
    up = links[(links.switch == "leaf0") & (links.role == "up")]
    assert sorted(up.routes) == [7, 7]               # 14 remote destinations over leaf0's two uplinks


def test_a_down_link_carries_nothing_and_the_other_uplink_takes_its_routes(tmp_path):
    res = _run(tmp_path, "--down", "leaf0-spine0", "--engine", "minhop", "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == 0, res.output
    links = pd.read_csv(tmp_path / "r-links.csv").set_index(["switch", "peer"])
    assert links.loc[("leaf0", "spine0"), "routes"] == 0
    assert links.loc[("leaf0", "spine1"), "routes"] == 14
    assert "busiest: " in res.output


def test_a_link_the_topology_lacks_is_one_line_and_nothing_is_written(tmp_path):
    (tmp_path / "ft4.yaml").write_text(FT4)
    exe = Path(sys.executable).parent / "testbed"
    res = subprocess.run([exe, "routes", tmp_path / "ft4.yaml", "--down", "leaf0-spine9", "--out", tmp_path / "x.csv"],
                         capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.strip() == "error: --down leaf0-spine9: leaf0 and spine9 are not linked in this topology"
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x-links.csv").exists()
