"""Turn a BenchRun into best_run.json, all_trials.csv, plots/*.png, report.md and, with
python-docx installed, report.docx."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

from .docx_report import docx_available, write_docx
from .floor import floor_markdown
from .limitations import limitations
from .metrics import Speedup, speedups, summarize
from .plots import make_all_plots
from .report import Target, write_report
from .runner import BenchRun
from .targets import all_targets
from .writers import write_best_run_json, write_csv

BREAKDOWN_KEYS = (
    "prompt_ms",
    "gen_ms",
    "gen_steps",
    "gen_ms_per_step",
    "gen_decode_ms",
    "python_overhead_pct",
)

log = logging.getLogger("swarmkv.bench")


@dataclass(frozen=True)
class BenchOutputs:
    """What write_outputs produced: the output folder, the targets and the files written."""

    out_dir: Path
    targets: list[Target]
    files: list[Path]


def all_speedups(run: BenchRun) -> list[Speedup]:
    """Every mode's speedups against "baseline", and against each baseline+variant reference.

    A baseline+variant reference is compared only with modes whose name contains the variant.
    """
    summaries = summarize(run.records)
    refs = sorted({m for _, m in summaries if m.startswith("baseline")})
    return [
        sp
        for ref in refs
        for sp in speedups(summaries, ref)
        if ref == "baseline" or ref.split("+", 1)[1] in sp.mode
    ]


def write_outputs(run: BenchRun) -> BenchOutputs:
    """Write all_trials.csv, best_run.json, the plots and report.md into the run's out_dir."""
    out = run.options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize(run.records)
    sp = all_speedups(run)
    targets = all_targets(summaries, sp, run.records)
    plots = make_all_plots(run.records, summaries, out)
    files = [
        write_csv(run.records, out / "all_trials.csv"),
        write_best_run_json(summaries, sp, run.records, run.setup, targets, out / "best_run.json"),
    ]
    report = write_report(
        out / "report.md",
        run.setup,
        summaries,
        sp,
        run.records,
        targets,
        limitations(run, summaries),
        plots,
        run.options.command,
    )
    with report.open("a", encoding="utf-8") as f:
        f.write("\n" + breakdown_markdown(run))
        f.write("\n" + floor_markdown(run.records, run.setup))
    files += [report, *plots]
    if docx_available():
        files.append(write_docx(report, out / "report.docx"))
    else:
        log.info(
            "report.docx skipped: python-docx is not installed (pip install 'swarmkv[report]')"
        )
    return BenchOutputs(out, targets, files)


def breakdown_markdown(run: BenchRun) -> str:
    """Where the time goes: medians of the decode breakdown per config and mode (ms)."""
    lines = [
        "## Where the time goes",
        "",
        "Medians over measured trials. gen = generation steps after the prompts; Python "
        "overhead = share of a step spent outside llama_decode.",
        "",
        "| config | mode | prefill | branch prompts | generation | steps | ms/step | "
        "in llama_decode | Python overhead % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in run.records:
        if not r.is_warmup and "gen_ms" in r.extra:
            groups.setdefault((r.config_id, r.mode), []).append(
                {**r.extra, "prefill_ms": r.prefill_ms or 0.0}
            )
    for (cfg, mode), rows in sorted(groups.items()):
        med = {k: statistics.median(x[k] for x in rows) for k in ("prefill_ms", *BREAKDOWN_KEYS)}
        lines.append(
            f"| {cfg} | {mode} | {med['prefill_ms']:.1f} | {med['prompt_ms']:.1f} | "
            f"{med['gen_ms']:.1f} | {med['gen_steps']:.0f} | "
            f"{med['gen_ms_per_step']:.1f} | {med['gen_decode_ms']:.1f} | "
            f"{med['python_overhead_pct']:.2f} |"
        )
    return "\n".join(lines) + "\n"
