"""Benchmark harness: trial records, summaries, speedups, CSV/JSON writers and the report.

Pure Python + numpy; the plots (matplotlib) live in `swarmkv.bench.plots`, imported on demand
so that summarizing and writing results never needs matplotlib.
"""

from __future__ import annotations

from .metrics import ModeSummary, Speedup, Stat, speedups, summarize
from .records import FidelityCheck, TrialRecord, check_fidelity, from_pipeline_result
from .report import Target, write_report
from .writers import build_best_run, read_csv, write_best_run_json, write_csv

__all__ = [
    "FidelityCheck",
    "ModeSummary",
    "Speedup",
    "Stat",
    "Target",
    "TrialRecord",
    "build_best_run",
    "check_fidelity",
    "from_pipeline_result",
    "read_csv",
    "speedups",
    "summarize",
    "write_best_run_json",
    "write_csv",
    "write_report",
]
