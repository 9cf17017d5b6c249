"""mkdocs hook: the results' plots, drawn from the committed data when the docs build.

Plots are not committed: each study folder under docs/results/ keeps its data as text (a
benchmark's all_trials.csv, a swarm run's swarm.json), and this hook draws the same plots the
benchmark draws (swarmkv_bench.plots, swarmkv_bench.swarm_plots) into a temporary folder and
adds them to the site at <study>/plots/, where the reports beside the data link to them.
Needs matplotlib (the [test] and [bench] extras) and the installed swarmkv_bench.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

_OUT: list[Path] = []  # the temporary folder of this build, removed when the build ends


def on_files(files: Files, config: Any) -> Files:
    import matplotlib

    matplotlib.use("Agg")
    from swarmkv_bench.metrics import summarize
    from swarmkv_bench.plots import make_all_plots
    from swarmkv_bench.swarm_plots import write_plots
    from swarmkv_bench.writers import read_csv

    docs = Path(config["docs_dir"])
    out = Path(tempfile.mkdtemp(prefix="swarmkv-plots."))
    _OUT.append(out)
    for csv in sorted((docs / "results").rglob("all_trials.csv")):
        records = read_csv(csv)
        # both write into <folder>/plots/, as the benchmark does
        make_all_plots(records, summarize(records), out / csv.parent.relative_to(docs))
    for report in sorted((docs / "results").rglob("swarm.json")):
        folder = out / report.parent.relative_to(docs)
        folder.mkdir(parents=True, exist_ok=True)
        write_plots(json.loads(report.read_text()), folder)
    for png in sorted(out.rglob("*.png")):
        rel = png.relative_to(out).as_posix()
        files.append(File(rel, str(out), config["site_dir"], config["use_directory_urls"]))
    return files


def on_post_build(config: Any) -> None:
    while _OUT:
        shutil.rmtree(_OUT.pop(), ignore_errors=True)
