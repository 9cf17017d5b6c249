"""The SwarmKV benchmark application: `swarmkv bench`, or `python -m swarmkv_bench`.

Not part of the library: swarmkv never imports it (only the CLI dispatches `swarmkv bench`
here). It reproduces the "prefill once, fan out" table against the baseline and llama-server
peers, and writes JSON, CSV, plots and a report. Trial records, summaries, speedups and
writers are pure Python + numpy; the plots (matplotlib, the [bench] extra) live in
`swarmkv_bench.plots`, imported on demand.
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
