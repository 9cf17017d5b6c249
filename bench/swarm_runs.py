#!/usr/bin/env python3
"""Median [min-max] over several `swarmkv bench --swarm` runs of one rate (seeds or repeats),
per system, and the target ratios per run: the spread one run cannot give. Prints Markdown;
with -o also writes it as JSON with its provenance (and each input's path).

    python bench/swarm_runs.py --rate 5 docs/results/swarm/rate5-seed1 \\
        docs/results/swarm/rate5-seed2 docs/results/swarm/rate5-seed3 -o summary.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from snapshot_times import spread

from swarmkv_bench.provenance import write_result
from swarmkv_bench.swarm_report import format_value, live_branches, targets

P = ("p50", "p95", "p99")


def entry_at(run: Path, rate: float) -> dict[str, Any]:
    report = json.loads((run / "swarm.json").read_text())
    for entry in report["rates"]:
        if entry["rate"] == rate:
            return entry
    raise SystemExit(f"{run}: no entry for rate {rate:g}")


def cell(values: list[float], digits: int) -> str:
    med, lo, hi = spread(values, digits)
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="output folders of --swarm runs")
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("-o", "--out", type=Path, help="also write the summary as JSON")
    args = ap.parse_args()
    entries = [entry_at(run, args.rate) for run in args.runs]
    print(f"{len(entries)} runs at {args.rate:g}/s; median [min-max]\n")
    print("| system | activation p50 | p95 | p99 | fairness | tokens/s | live (mean) |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name in entries[0]["systems"]:
        runs = [e["systems"][name] for e in entries]
        act = [[r["activation_ms"][p] for r in runs] for p in ("p50", "p95", "p99")]
        print(
            f"| {name} | {cell(act[0], 0)} | {cell(act[1], 0)} | {cell(act[2], 0)} "
            f"| {cell([r['fairness'] for r in runs], 3)} "
            f"| {cell([r['tokens_per_s'] for r in runs], 1)} "
            f"| {cell([live_branches(r['branches']) for r in runs], 1)} |"
        )
    print("\n| target | per run | median [min-max] |")
    print("|---|---|--:|")
    per_run = [targets(e) for e in entries]
    for i, (name, _, op, goal) in enumerate(per_run[0]):
        values = [t[i][1] for t in per_run]
        shown = ", ".join(format_value(v) for v in values)
        known = [v for v in values if v is not None]
        print(f"| {name} {op} {goal} | {shown} | {cell(known, 2) if known else 'n/a'} |")
    if args.out:
        write_result(args.out, summary(args.runs, entries, per_run, args.rate), None)


def summary(
    runs: list[Path], entries: list[dict[str, Any]], per_run: list[Any], rate: float
) -> dict[str, Any]:
    """The printed tables as data: per system and per target, every run's value and the
    [median, min, max] over runs."""

    def stat(values: list[float]) -> dict[str, Any]:
        return {"runs": values, "spread": list(spread(values, 6))}

    systems = {}
    for name in entries[0]["systems"]:
        rs = [e["systems"][name] for e in entries]
        systems[name] = {
            **{f"activation_{p}": stat([r["activation_ms"][p] for r in rs]) for p in P},
            "fairness": stat([r["fairness"] for r in rs]),
            "tokens_per_s": stat([r["tokens_per_s"] for r in rs]),
            "live_mean": stat([live_branches(r["branches"]) for r in rs]),
            "tokens_identical_to_host_lock": [r["tokens_identical_to_host_lock"] for r in rs],
        }
    goals = {}
    for i, (name, _, op, goal) in enumerate(per_run[0]):
        values = [t[i][1] for t in per_run]
        known = [v for v in values if v is not None]
        goals[name] = {"op": op, "goal": goal, **(stat(known) if known else {"runs": values})}
    return {"rate": rate, "inputs": [str(r) for r in runs], "systems": systems, "targets": goals}


if __name__ == "__main__":
    main()
