"""Run data → result files (the contract in results/README.md), one-row summary, plots, sweep tables.

The run hands over plain Python (manifest dict, link samples, flow records, the CPU guard's result, run
metadata); :func:`write_run` turns it into ``manifest.json``, ``links.csv``, ``flows.csv``, ``summary.csv``
and PNG plots. :func:`report` recomputes the summary and plots of an existing result directory from its files
alone, and :func:`sweep_table` / :func:`write_sweep` join the summaries of several runs into one table.

Modules: columns (the contract's names), files (atomic writes, reading), frames (rows → frames), summary (every
headline number), plots; the HTML/Markdown report: study (a run or sweep directory read back), figures (the
comparison figures), graph (the topology drawing), page (blocks → HTML and Markdown), document (what the report
says: :func:`write_report`).
"""
from __future__ import annotations

from .columns import (COLLECTIVE_COLUMNS, FAILURE_COLUMNS, FLOW_COLUMNS, LINK_COLUMNS, PLOT_FILES, SM_COLUMNS,
                      SUMMARY_COLUMNS, SUMMARY_EXTRA_COLUMNS, SWEEP_CSV)
from .files import ReportError, atomic_write, read_csv, read_manifest, write_csv, write_json
from .frames import cc_frame, collectives_frame, failures_frame, flows_frame, int_frame, links_frame, sm_frame
from .plots import plots
from .run_files import report, sweep_table, write_report, write_run, write_sweep
from .summary import summarize

__all__ = ["ReportError", "LINK_COLUMNS", "FLOW_COLUMNS", "SUMMARY_COLUMNS", "SUMMARY_EXTRA_COLUMNS",
           "COLLECTIVE_COLUMNS", "FAILURE_COLUMNS", "SM_COLUMNS", "PLOT_FILES", "links_frame", "flows_frame",
           "cc_frame", "collectives_frame", "failures_frame", "sm_frame", "summarize", "plots", "write_run", "report",
           "sweep_table", "write_sweep", "atomic_write", "write_report", "SWEEP_CSV", "int_frame", "read_csv",
           "read_manifest", "write_csv", "write_json"]
