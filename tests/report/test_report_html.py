"""The HTML/Markdown report and the topology drawing: synthetic run and sweep directories with hand-computed
values (fast), a headless-Chromium check that the page renders every image, and one real short run (e2e)."""
from __future__ import annotations

import base64
import html
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, run_cli
from testbed import report as rp
from testbed import scenario, topology
from testbed.report import document, figures, graph, stats, study

pytestmark = pytest.mark.plots

RATE = 100_000_000          # 100 Mbit/s
IV = 0.5                    # s per sample
SCEN = {"name": "synth", "duration": "2s",
        "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 1, "host_link": {"rate": "100mbit", "buffer": "256KB"},
                     "fabric_link": {"rate": "100mbit", "buffer": "256KB"}}}
U04 = int(0.4 * RATE * IV / 8)     # bytes per sample for utilisation 0.4 (2,500,000)
U01 = int(0.1 * RATE * IV / 8)
#: (switch, port, direction) → bytes per sample; every other port reads 0. h0 → h1 over spine0; spine1→leaf0 0.1.
BYTES = {("leaf0", "h0", "rx"): U04, ("leaf0", "spine0", "tx"): U04, ("spine0", "leaf1", "tx"): U04,
         ("leaf1", "h1", "tx"): U04, ("spine1", "leaf0", "tx"): U01}
CPU = dict(cpu_bound=False, cpu_busy_max=0.4, cpu_busy_mean=0.2)


def _topo():
    return topology.build(scenario.from_dict(SCEN).topology)


def make_links(scale: float = 1.0, paused: bool = True) -> list[dict]:
    topo = _topo()
    rows = []
    for i in range(4):
        t = (i + 1) * IV
        for sw in topo.switches:
            for p in topo.ports[sw]:
                for d in ("tx", "rx"):
                    b = int(BYTES.get((sw, p.ifname, d), 0) * scale)
                    q = [0, 10_000, 50_000, 0][i] if (sw, p.ifname, d) == ("leaf0", "spine0", "tx") else 0
                    ps = 0.1 if paused and (sw, p.ifname, d) == ("leaf0", "spine0", "tx") else 0.0
                    rows.append(dict(time_s=t, switch=sw, port=p.ifname, peer=p.peer_node, bytes=b, packets=b // 1000,
                                     direction=d, role=p.role, rate_bps=RATE, interval_s=IV, queue_bytes_max=q,
                                     paused_s=ps))
    return rows


def make_flows(nbytes: int = 10_000_000) -> list[dict]:
    return [dict(flow_id=0, src="h0", dst="h1", sport=1, dport=2, proto="udp", bytes=nbytes, start_s=0.0, end_s=2.0,
                 fct_s=2.0, goodput_mbps=nbytes * 8 / 2 / 1e6, paths_used=1, src_leaf="leaf0", dst_leaf="leaf1"),
            dict(flow_id=1, src="h1", dst="h0", sport=3, dport=2, proto="udp", bytes=0, start_s=0.5, end_s=None,
                 fct_s=None, goodput_mbps=None, paths_used=1, src_leaf="leaf1", dst_leaf="leaf0")]


def make_run(d: Path, *, seed=1, lb="ecmp", scale=1.0, nbytes=10_000_000, cpu=CPU, collectives=True,
             paused=True) -> Path:
    scen = scenario.from_dict(dict(SCEN, seed=seed, switch={"load_balancing": lb}))
    manifest = {"scenario": scenario.to_dict(scen), "source": "synth.yaml", "kernel": "6.18",
                "start_time": "2026-01-01T00:00:00+00:00"}
    meta = dict(run_id=d.name, scenario="synth", load_balancing=lb, seed=seed, duration_s=2.0, offered_mbps=80.0)
    coll = [dict(job="ar", iteration=0, op="allreduce", bytes=1000, start_s=0.1, end_s=0.2, jct_ms=10.0),
            dict(job="ar", iteration=1, op="allreduce", bytes=1000, start_s=0.3, end_s=0.4, jct_ms=12.0)]
    rp.write_run(d, manifest, make_links(scale, paused), make_flows(nbytes), cpu, meta,
                 collectives=coll if collectives else None)
    return d


def images(page: str) -> dict[str, bytes]:
    """figure id → the PNG bytes embedded in it."""
    out = {}
    for fid, data in re.findall(r'<figure id="([^"]+)"><img src="data:image/png;base64,([^"]+)"', page):
        out[fid] = base64.b64decode(data)
    return out


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


# --- the topology drawing ----------------------------------------------------------------------------------

def test_link_utilisation_is_the_busier_direction_over_the_traffic_window():
    links = rp.links_frame(make_links())
    flows = rp.flows_frame(make_flows())
    g = graph.from_topology(_topo())
    util = graph.edge_utilisation(g, graph.port_utilisation(links, flows))
    by = {frozenset((u, v)): x for (u, v, _), x in util.items()}
    assert by[frozenset(("h0", "leaf0"))] == pytest.approx(0.4)       # the host's own sending: the leaf's rx
    assert by[frozenset(("leaf0", "spine0"))] == pytest.approx(0.4)
    assert by[frozenset(("leaf1", "spine0"))] == pytest.approx(0.4)
    assert by[frozenset(("leaf0", "spine1"))] == pytest.approx(0.1)   # only spine1→leaf0 carried bytes
    assert by[frozenset(("leaf1", "spine1"))] == 0.0
    assert by[frozenset(("h1", "leaf1"))] == pytest.approx(0.4)
    # links.csv alone gives the same graph and the same colours
    g2 = graph.from_links(links)
    util2 = graph.edge_utilisation(g2, graph.port_utilisation(links, flows))
    assert {frozenset((u, v)): x for (u, v, _), x in util2.items()} == by
    assert {n: d["kind"] for n, d in g2.nodes(data=True)} == {n: d["kind"] for n, d in g.nodes(data=True)}


def test_window_excludes_samples_outside_the_traffic():
    links = rp.links_frame(make_links())
    flows = rp.flows_frame(make_flows())
    flows.loc[0, "end_s"] = 1.0                 # window 0–1 s: only the samples ending at 0.5 and 1.0 (and 1.5,
    pu = graph.port_utilisation(links, flows)   # whose interval starts at 1.0, is outside)
    assert pu[("leaf0", "spine0", "tx")] == pytest.approx(0.4)


def test_layout_puts_each_tier_on_its_row_and_colour_needs_a_scale():
    topo = topology.build(scenario.load(ROOT / "scenarios" / "fat-tree-k4.yaml").topology)
    g = graph.from_topology(topo)
    pos = graph.layout(g)
    for n, d in g.nodes(data=True):
        assert pos[n][1] == graph.LEVELS[d["kind"]]
    assert {d["kind"] for _, d in g.nodes(data=True)} == {"host", "leaf", "spine", "core"}
    assert len(graph.draw(g, None).axes) == 1                                # plain: no colour bar
    util = {e: 0.5 for e in g.edges(keys=True)}
    assert len(graph.draw(g, util).axes) == 2                                # coloured: a colour bar


def test_graph_command_from_a_scenario_and_a_run(tmp_path):
    r = run_cli("graph", "scenarios/fat-tree-k4.yaml", "--out", str(tmp_path / "ft.png"))
    assert r.returncode == 0, r.stderr
    w, h = png_size((tmp_path / "ft.png").read_bytes())
    assert w > 500 and h > 400
    d = make_run(tmp_path / "run")
    r = run_cli("graph", str(d))
    assert r.returncode == 0, r.stderr
    assert (d / "topology.png").is_file()
    r = run_cli("graph", str(d), "--out", str(tmp_path / "t.svg"))
    assert r.returncode == 0 and (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")
    for bad in ([str(d), "--out", str(tmp_path / "t.jpg")], [str(tmp_path)], [str(tmp_path / "nope.yaml")]):
        r = run_cli("graph", *bad)
        assert r.returncode == 1 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, \
            r.stderr


# --- the run report -----------------------------------------------------------------------------------------

RUN_FIGURES = {"topology-ecmp", "heatmap-ecmp", "uplink-util-per-config", "uplink-util-per-uplink",
               "uplink-imbalance-per-config", "fct-cdf-per-config", "goodput-per-pair", "fairness-over-time",
               "queue-ecmp", "jct-per-iteration", "losses-per-config", "paused-s-per-port", "run-uplink-util",
               "run-uplink-bytes", "run-fct-cdf"}


def test_run_report_embeds_every_figure_and_says_what_it_skipped(tmp_path):
    d = make_run(tmp_path / "run")
    page_path = document.write_report(d)
    page = page_path.read_text()
    imgs = images(page)
    assert set(imgs) == RUN_FIGURES
    for png in imgs.values():
        w, h = png_size(png)
        assert w > 300 and h > 200
    # self-contained: no script, no stylesheet link, no source but inline data
    assert "<script" not in page and "<link" not in page
    assert re.findall(r'src="([^",]*)', page) == ["data:image/png;base64"] * len(imgs)
    assert "Credit stall time per port: 0 in every run" in html.unescape(page)
    assert "uplink_imbalance" in page and ">synth<" in page                # the summary table, the scenario
    # Markdown: the same figures as files beside it
    md = (d / "report.md").read_text()
    refs = re.findall(r"\]\((report_files/[^)]+\.png)\)", md)
    assert {Path(r).stem for r in refs} == RUN_FIGURES
    for r in refs:
        assert (d / r).read_bytes() == imgs[Path(r).stem]


def test_heatmap_grid_rows_and_values():
    links = rp.links_frame(make_links())
    tx = links[links["direction"] == "tx"]
    b = (tx["time_s"] / IV).round().astype(int)
    grid = tx.assign(bin=b).pivot_table(index=["switch", "port"], columns="bin", values="util", aggfunc="mean")
    assert np.allclose(grid.loc[("leaf0", "spine0")].to_numpy(), 0.4)
    # the report orders rows leaves, spines, cores
    order = sorted(grid.index, key=lambda k: (figures._tier_key(k[0]), k[1]))
    assert [k[0] for k in order][:6] == ["leaf0"] * 3 + ["leaf1"] * 3 and order[-1][0] == "spine1"


def test_missing_inputs_are_notes_not_crashes(tmp_path):
    d = make_run(tmp_path / "run", collectives=False, paused=False)
    (d / "links.csv").unlink()
    page = html.unescape(document.write_report(d).read_text())
    assert "JCT: no collectives.csv" in page
    assert "utilisation heatmap of ecmp: no links.csv samples" in page
    assert "per-run plots: links.csv or flows.csv missing" in page
    assert "PFC pause time per port: 0 in every run" in page
    assert "fairness over time of ecmp: links.csv or flows.csv missing or empty" in page
    assert "losses and flow control: every configuration reads 0" in page
    # from summary.csv and flows.csv alone
    assert set(images(page)) == {"topology-ecmp", "uplink-util-per-config", "uplink-imbalance-per-config",
                                 "fct-cdf-per-config", "goodput-per-pair"}
    # no manifest either: the topology is a note, the rest still renders
    (d / "manifest.json").unlink()
    page = html.unescape(document.write_report(d).read_text())
    assert "topology of ecmp: no manifest scenario and no links.csv" in page
    assert "the scenario: no manifest.json" in page


def test_unreadable_directories_are_one_line_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "sweep.csv").write_bytes(b"\xff\xfe\x00garbage\n\x00\x01")
    for d in (tmp_path / "nope", tmp_path / "empty", bad):
        r = run_cli("report", str(d))
        assert r.returncode == 1, r.stdout
        assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr


def test_report_command_writes_the_page(tmp_path):
    d = make_run(tmp_path / "run")
    assert not (d / "report.html").exists()
    r = run_cli("report", str(d))
    assert r.returncode == 0, r.stderr
    assert f"report: {d / 'report.html'}" in r.stdout
    assert (d / "report.html").is_file() and (d / "report.md").is_file()


# --- the sweep report ---------------------------------------------------------------------------------------

def make_sweep(root: Path, comparison: bool = True) -> Path:
    dirs, lbs = [], []
    for lb, scale in (("ecmp", 1.0), ("spray", 2.0)):
        for seed in (1, 2, 3):
            cpu = dict(CPU, cpu_bound=(lb == "ecmp" and seed == 3))
            dirs.append(make_run(root / f"{lb}-{seed}", seed=seed, lb=lb, scale=scale, nbytes=seed * 1_000_000,
                                 cpu=cpu))
            lbs.append(lb)
    df = rp.sweep_table(dirs)
    df.insert(len(df.columns), "switch.load_balancing", lbs)
    rp.write_sweep(root, df)
    if comparison:
        pd.DataFrame([{"switch.load_balancing": "ecmp", "goodput_mbps_mean": 2.0, "goodput_mbps_ci95": 2.4843,
                       "mean_uplink_util_mean": 0.2, "mean_uplink_util_ci95": 0.05, "jct_mean_ms_mean": 11.0,
                       "jct_mean_ms_ci95": 0.5, "runs": 3, "flagged_runs": 1,
                       "runs_total": 3},
                      {"switch.load_balancing": "spray", "goodput_mbps_mean": 8.0, "goodput_mbps_ci95": None,
                       "mean_uplink_util_mean": 0.4, "mean_uplink_util_ci95": None, "runs": 3, "flagged_runs": 0,
                       "runs_total": 3}]).to_csv(root / "comparison.csv", index=False)
    return root


@pytest.fixture(scope="module")
def sweep_template(tmp_path_factory) -> Path:
    """One synthetic sweep (6 runs) made once; each test works on its own copy."""
    return make_sweep(tmp_path_factory.mktemp("sweep") / "sw")


@pytest.fixture
def sweep_dir(sweep_template, tmp_path) -> Path:
    return Path(shutil.copytree(sweep_template, tmp_path / "sw"))


def test_sweep_report_uses_comparison_csv(sweep_dir):
    d = sweep_dir
    s = study.load(d)
    assert s.kind == "sweep" and s.keys == ["switch.load_balancing"]
    assert [c.label for c in s.configs] == ["load_balancing=ecmp", "load_balancing=spray"]
    assert [len(c.runs) for c in s.configs] == [3, 3]
    # comparison.csv says the flagged run was kept (runs == runs_total): the FCT pool counts all three
    assert len(s.configs[0].counted_runs) == 3
    page = document.write_report(d).read_text()
    assert "<td>2 ± 2.5</td>" in page and "<td>8</td>" in page
    imgs = images(page)
    assert {"uplink-util-per-config", "fct-cdf-per-config", "jct-per-config", "paused-s-per-port",
            "heatmap-load-balancing-ecmp", "heatmap-load-balancing-spray", "topology-load-balancing-ecmp",
            "queue-load-balancing-spray"} <= set(imgs)
    assert "1 of 6 runs were cpu_bound" in page


def test_sweep_report_without_comparison_means_the_unflagged_runs(sweep_dir):
    d = sweep_dir
    (d / "comparison.csv").unlink()
    s = study.load(d)
    ecmp, spray = s.configs
    # goodput of run k is k MB × 8 / 2 s = 4k Mbit/s; ecmp seed 3 is cpu_bound and left out
    assert ecmp.mean("goodput_mbps") == pytest.approx(6.0)
    assert (ecmp.stats["runs"], ecmp.stats["flagged_runs"], ecmp.stats["runs_total"]) == (2, 1, 3)
    assert spray.mean("goodput_mbps") == pytest.approx(8.0)
    assert [r.dir.name for r in ecmp.counted_runs] == ["ecmp-1", "ecmp-2"]
    # both leaves source a flow: 4 counted uplinks, one at 0.4 (spray's runs: twice the bytes)
    assert ecmp.mean("mean_uplink_util") == pytest.approx(0.1)
    assert spray.mean("mean_uplink_util") == pytest.approx(0.2)
    df = pd.read_csv(d / "sweep.csv")
    df["run_dir"] = [Path(x).name for x in df["run_dir"]]          # relative: no fallback to the template's copy
    df.to_csv(d / "sweep.csv", index=False)
    shutil.rmtree(d / "spray-2")
    page = html.unescape(document.write_report(d).read_text())
    assert "no comparison.csv" in page
    assert "run directories not found, their time series are not drawn: spray-2" in page


def test_failed_runs_are_not_counted(sweep_dir):
    d = sweep_dir
    (d / "comparison.csv").unlink()
    df = pd.read_csv(d / "sweep.csv")
    df["status"] = ["ok", "ok", "ok", "ok", "ok", "failed"]          # spray seed 3
    df.to_csv(d / "sweep.csv", index=False)
    spray = study.load(d).configs[1]
    assert [r.dir.name for r in spray.counted_runs] == ["spray-1", "spray-2"]
    assert spray.mean("goodput_mbps") == pytest.approx(6.0)
    assert (spray.stats["runs"], spray.stats["failed_runs"], spray.stats["runs_total"]) == (2, 1, 3)
    # comparison.csv as the sweep writes it: failed_runs is a count, not a varied key
    pd.DataFrame([{"switch.load_balancing": lb, "runs": 2, "flagged_runs": 0, "failed_runs": f, "runs_total": 3,
                   "goodput_mbps_mean": 1.0, "goodput_mbps_ci95": 0.1} for lb, f in (("ecmp", 0), ("spray", 1))]
                 ).to_csv(d / "comparison.csv", index=False)
    s = study.load(d)
    assert s.keys == ["switch.load_balancing"] and len(s.configs) == 2 and not s.notes


def test_a_numeric_varied_key_matches_its_comparison_row(sweep_dir):
    """comparison.csv of a sweep over numbers (--vary traffic.qps_per_connection=1,4) has only numeric columns;
    its rows must still match sweep.csv's configurations (1 is 1 in both, not 1.0 in one)."""
    d = sweep_dir
    df = pd.read_csv(d / "sweep.csv")
    df = df.rename(columns={"switch.load_balancing": "traffic.qps_per_connection"})
    df["traffic.qps_per_connection"] = [1, 1, 1, 4, 4, 4]
    df.to_csv(d / "sweep.csv", index=False)
    pd.DataFrame([{"traffic.qps_per_connection": q, "runs": 3, "flagged_runs": 0, "failed_runs": 0, "runs_total": 3,
                   "jct_mean_ms_mean": m, "jct_mean_ms_ci95": 1.0} for q, m in ((1, 570.0), (4, 460.0))]
                 ).to_csv(d / "comparison.csv", index=False)
    s = study.load(d)
    assert not s.notes and [c.label for c in s.configs] == ["qps_per_connection=1", "qps_per_connection=4"]
    assert [c.mean("jct_mean_ms") for c in s.configs] == [570.0, 460.0]


# --- the figures of the ready scenarios: imbalance, goodput per pair, fairness over time, losses, JCT per job ----

def _flow(i: int, src: str, dst: str, goodput: float | None) -> dict:
    return dict(flow_id=i, src=src, dst=dst, sport=i, dport=1, proto="udp", bytes=1000, start_s=0.0,
                end_s=None if goodput is None else 1.0, fct_s=None if goodput is None else 1.0, goodput_mbps=goodput,
                paths_used=1)


def test_jain_by_hand():
    assert stats.jain([5, 5]) == 1.0
    assert stats.jain([1, 0]) == 0.5                        # one of two takes everything: 1/n
    assert stats.jain([3, 1]) == pytest.approx(0.8)         # (3 + 1)² / (2 × (9 + 1)) = 16 / 20
    assert math.isnan(stats.jain([])) and math.isnan(stats.jain([0, 0]))


def test_goodput_per_pair_sums_a_pairs_flows_and_leaves_out_unfinished_ones():
    f = rp.flows_frame([_flow(0, "h0", "h1", 3.0), _flow(1, "h0", "h1", 2.0), _flow(2, "h2", "h3", None),
                        _flow(3, "h1", "h0", 4.0)])
    assert figures.pair_goodput(f).to_dict() == {"h0→h1": 5.0, "h1→h0": 4.0}
    assert figures.pair_goodput(rp.flows_frame([_flow(0, "h0", "h1", None)])).empty


def test_receiver_rates_and_jain_over_time_by_hand():
    links = rp.links_frame(make_links())
    r = figures.receiver_rates(links, ["h1", "h0"])
    # leaf1→h1 carries U04 bytes in every 0.5 s sample: 0.4 × 100 Mbit/s; leaf0→h0 carries nothing
    assert list(r.index) == [0.5, 1.0, 1.5, 2.0] and list(r.columns) == ["h1", "h0"]
    assert np.allclose(r["h1"], 40.0) and np.allclose(r["h0"], 0.0)
    assert np.allclose(figures.jain_over_time(r), 0.5)
    j = figures.jain_over_time(pd.DataFrame({"a": [40.0, 10.0, 0.0], "b": [0.0, 10.0, 0.0]}))
    assert j.iloc[0] == 0.5 and j.iloc[1] == 1.0 and math.isnan(j.iloc[2])


def test_fairness_over_time_needs_a_destination_host_per_flow(tmp_path):
    d = make_run(tmp_path / "run")
    rp.write_csv(d / "flows.csv", rp.flows_frame([_flow(0, "h0", "h1", 3.0), _flow(1, "h0", "h1", 2.0)]))
    blocks = figures.fairness_over_time(study.load(d))
    assert [type(b).__name__ for b in blocks] == ["Note"]
    assert "2 flows to 1 hosts here" in blocks[0].text


def test_sweep_figures_of_imbalance_losses_and_jobs(sweep_dir):
    d = sweep_dir
    comp = pd.read_csv(d / "comparison.csv")
    comp["uplink_imbalance_mean"], comp["uplink_imbalance_ci95"] = [2.0, 1.0], [0.5, None]
    comp["drops_mean"], comp["drops_ci95"] = [120.0, 0.0], [10.0, None]
    comp["retransmits_mean"] = [0.0, 0.0]
    comp.to_csv(d / "comparison.csv", index=False)
    s = study.load(d)
    assert [c for c, _ in figures.loss_columns(s)] == ["drops"]       # retransmits 0 everywhere: no panel
    page = document.write_report(d).read_text()
    assert "jct-per-job" not in images(page)                         # one job: jct-per-config says it all
    # a second job beside the first in every run: ecmp's runs 30 and 50 ms, spray's 20 ms
    for run in s.runs:
        coll = pd.read_csv(run.dir / "collectives.csv")
        a2a = 30.0 if run.summary["switch.load_balancing"] == "ecmp" else 20.0
        extra = pd.DataFrame([dict(job="a2a", iteration=0, op="alltoall", bytes=1000, start_s=0.5, end_s=0.6,
                                   jct_ms=a2a), dict(job="a2a", iteration=1, op="alltoall", bytes=1000, start_s=0.7,
                                                     end_s=0.8, jct_ms=a2a + 20 if a2a == 30 else a2a)])
        pd.concat([coll, extra]).to_csv(run.dir / "collectives.csv", index=False)
    s = study.load(d)
    assert figures.job_jct(s.configs[0].runs[0].collectives) == {"ar": 11.0, "a2a": 40.0}
    assert figures.job_jct(s.configs[1].runs[0].collectives) == {"ar": 11.0, "a2a": 20.0}
    imgs = images(document.write_report(d).read_text())
    assert {"uplink-imbalance-per-config", "losses-per-config", "jct-per-job", "goodput-per-pair",
            "fairness-over-time"} <= set(imgs)


# --- headless Chromium: the page renders every image -----------------------------------------------------------

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: bash scripts/test-setup.sh")
_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var r = document.createElement('pre'); r.id = 'ftb-check';
  r.textContent = JSON.stringify({images: imgs.length,
    broken: imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; }).map(function (i) {
      return i.parentNode.id; }),
    text: document.body.innerText.length});
  document.body.appendChild(r);
});
</script>"""


def rendered(page: Path, tmp: Path) -> dict:
    """Open a copy of the page with a load-time check in headless Chromium; the check's verdict from the DOM."""
    probe = tmp / f"probe-{page.stem}.html"
    probe.write_text(page.read_text().replace("</body>", _CHECK + "</body>"))
    r = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp / 'profile'}",
                        "--virtual-time-budget=15000", "--dump-dom", probe.as_uri()],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="ftb-check">(.*?)</pre>', r.stdout, re.S)
    assert m, f"no verdict in Chromium's DOM (rc {r.returncode}): {r.stderr[-500:]}"
    return json.loads(html.unescape(m.group(1)))


def screenshot_ink(page: Path, tmp: Path) -> float:
    """Share of the first screen's pixels that are not white."""
    import matplotlib.image as mpimg
    shot = tmp / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp / 'profile'}",
                    "--hide-scrollbars", "--window-size=1200,3000", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    a = mpimg.imread(shot)[..., :3]
    return float((a.min(axis=2) < 0.9).mean())


@needs_chromium
def test_chromium_renders_every_image_of_the_report(tmp_path):
    d = make_run(tmp_path / "run")
    page = document.write_report(d)
    v = rendered(page, tmp_path)
    assert v["images"] == len(RUN_FIGURES) and v["broken"] == [] and v["text"] > 1000, v
    assert screenshot_ink(page, tmp_path) > 0.05
    # the check sees a broken image: one figure's data cut short
    broken = tmp_path / "broken.html"
    text = page.read_text()
    i = text.index('<figure id="queue-ecmp"><img src="data:image/png;base64,') + 60
    broken.write_text(text[:i] + text[i + 2000:])
    v = rendered(broken, tmp_path)
    assert v["broken"] == ["queue-ecmp"], v


@needs_chromium
def test_chromium_renders_the_sweep_report(sweep_dir, tmp_path):
    page = document.write_report(sweep_dir)
    v = rendered(page, tmp_path)
    assert v["images"] == len(images(page.read_text())) >= 10 and v["broken"] == [], v


# --- a real run --------------------------------------------------------------------------------------------

@pytest.mark.e2e
@needs_chromium
def test_a_real_run_writes_a_report_that_renders(tmp_path):
    out = tmp_path / "run"
    r = run_cli("run", "scenarios/default.yaml", "--set", "duration=1.5s", "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"report: {out / 'report.html'}" in r.stdout
    page = (out / "report.html").read_text()
    imgs = images(page)
    assert {"topology-ecmp", "heatmap-ecmp", "uplink-util-per-config", "fct-cdf-per-config", "queue-ecmp",
            "run-uplink-util", "run-uplink-bytes", "run-fct-cdf"} <= set(imgs)
    v = rendered(out / "report.html", tmp_path)
    assert v["images"] == len(imgs) and v["broken"] == [] and v["text"] > 1000, v
    assert screenshot_ink(out / "report.html", tmp_path) > 0.05
    # the permutation's 8 flows leave each leaf: every host link carried traffic, so every host edge is coloured
    s = study.load(out)
    run = s.configs[0].runs[0]
    g = graph.from_topology(topology.build(scenario.from_dict(run.manifest["scenario"]).topology))
    util = graph.edge_utilisation(g, graph.port_utilisation(run.links, run.flows))
    host_edges = [x for (u, v_, _), x in util.items() if u.startswith("h")]
    assert len(host_edges) == 8 and min(host_edges) > 0.5, host_edges
