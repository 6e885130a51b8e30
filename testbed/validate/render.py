"""The validation report page: the table, then one plot per reference — each seed's value, the mean with its
95 % interval, the published value and the band that passes (report/page.py renders it)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..report.page import Image, Note, Table, Text, write
from ..report.plots import _figure, png_bytes


def _plot(o, r: dict) -> Image:
    spec = o.ref.spec
    fig = _figure(6.0, 3.2)
    ax = fig.add_subplot()
    vals = list(o.values.values())
    lo, hi = spec.bounds()
    ax.axhline(spec.value, color="black", lw=1.2, label=f"reference {spec.value:g}")
    span = [v for v in vals + [spec.value, lo, hi] if math.isfinite(v)]
    top, bottom = max(span) * 1.1, min(span) * 0.9
    ax.axhspan(lo if math.isfinite(lo) else bottom, hi if math.isfinite(hi) else top, color="tab:green",
               alpha=0.15, label=f"passes ({spec.kind.replace('_', ' ')}, ±{spec.tolerance:g})")
    if vals:
        ax.plot([0.8 + 0.4 * i / max(1, len(vals) - 1) for i in range(len(vals))], vals, "o", color="tab:blue",
                alpha=0.6, label="one seed")
        ci = r["ci95"] if r["ci95"] is not None and math.isfinite(r["ci95"]) else 0.0
        ax.errorbar([1.4], [r["measured"]], yerr=[ci], fmt="s", color="tab:red", capsize=4,
                    label="mean ± ci95")
    ax.set_xlim(0.5, 1.7)
    ax.set_xticks([])
    ax.set_ylabel(spec.metric)
    ax.set_title(f"{o.ref.name}: {r['verdict']}")
    ax.legend(fontsize=7, loc="best")
    return Image(o.ref.name, png_bytes(fig), f"{o.ref.name} — {spec.source}. Normalised: {spec.normalisation}")


def write_page(outdir: Path, outcomes: list, table: pd.DataFrame) -> None:
    blocks = [Text("Each reference's metric over its seeds (runs the CPU guard calls valid), against the "
                   "published value normalised to the testbed's rates; columns as in docs/validation.md."),
              Table(list(table.columns), table.astype(object).where(table.notna(), None).values.tolist())]
    rows = {r["name"]: r for r in table.to_dict("records")}
    for o in outcomes:
        if o.values:
            blocks.append(_plot(o, rows[o.ref.name]))
        else:
            blocks.append(Note(f"{o.ref.name}: no valid run to plot ({rows[o.ref.name]['notes']})"))
    write(outdir, "testbed validate", blocks)
