#!/usr/bin/env python3
"""ECMP vs per-packet spraying on the default scenario, through the Python API; prints one row per mode.

    sudo .venv/bin/python examples/compare_lb.py [--out DIR] [--set KEY.PATH=VALUE …]

Each mode is one `testbed.run` (its own lab, torn down after); the table comes from the runs' summaries and
their links.csv / flows.csv read as pandas frames.
"""
from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import pandas as pd

from testbed import load_scenario, run

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "default.yaml"))
    ap.add_argument("--out", type=Path, default=Path("results") / f"compare-lb-{dt.datetime.now():%Y%m%d-%H%M%S}")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="a scenario override, as after `testbed run --set` (repeatable)")
    args = ap.parse_args()
    rows = []
    for lb in ("ecmp", "spray"):
        scn = load_scenario(args.scenario, *args.sets, f"switch.load_balancing={lb}")
        res = run(scn, out=args.out / lb, log=lambda line: print(f"  [{lb}] {line}", flush=True))
        s, links, flows = res.summary, res.links, res.flows
        up = links[(links["role"] == "up") & (links["direction"] == "tx")]
        per_uplink = up.groupby(["switch", "port"])["bytes"].sum()        # bytes each leaf uplink sent
        rows.append({"load_balancing": lb,
                     "goodput_mbps": s["goodput_mbps"],
                     "mean_uplink_util": s["mean_uplink_util"],
                     "uplink_imbalance": s["uplink_imbalance"],
                     "busiest_uplink_MB": per_uplink.max() / 1e6,
                     "idlest_uplink_MB": per_uplink.min() / 1e6,
                     "slowest_flow_mbps": flows["goodput_mbps"].min(),
                     "fct_p99_ms": s["fct_p99_ms"],
                     "cpu_bound": s["cpu_bound"],
                     "dir": str(res.dir)})
    table = pd.DataFrame(rows)
    with pd.option_context("display.float_format", "{:.2f}".format, "display.width", 200):
        print(table.to_string(index=False))


if __name__ == "__main__":
    main()
