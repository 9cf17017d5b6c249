#!/usr/bin/env python3
"""Patches 0004 (skinny GEMM), 0005 (batch-invariant attention) and 0008 (K-quant rows)
against the kernels they replace, side by side in one run: prefill chunk, 1-branch step and
N-branch steps, measured with all on and all off (the context's kernel switches skinny_gemm,
bi_attn and kquant_rows = 1 / 0; swarmkv.llama.kernel_switches). Every one of them serves
batch-invariant mode only by default, so with --no-exact nothing changes unless --after asks
for skinny_gemm=2 (the skinny GEMM in plain mode too).

--before/--after set other switches to compare, e.g. patch 0005's row tiles against
row-by-row walking: --before bi_attn_tile=1 --after bi_attn_tile=128.

Each trial runs bench/profile_step.py --no-perf in a fresh process per setting, alternating
on and off; one warm-up trial of each first, then --trials measured ones. Prints median
[min-max] over trials of each phase's median ms, and the off/on ratio, and writes JSON (-o).
Run on an idle machine.

    python bench/kernel_ab.py --branches 2,32,64 --trials 3 -o results/kernel-ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import swarmkv
from swarmkv.errors import ConfigError
from swarmkv.llama.kernel_switches import parse_switch_assignments
from swarmkv_bench.provenance import write_result

HERE = Path(__file__).resolve().parent
SWITCHES = ("skinny_gemm", "bi_attn", "kquant_rows")
SETTINGS = ("before", "after")


def switches_of(assignments: list[str] | None, default: int) -> dict[str, int]:
    """NAME=VALUE assignments as a dict (checked by the kernel_switches module); every patch
    switch set to `default` when none."""
    if not assignments:
        return dict.fromkeys(SWITCHES, default)
    try:
        return dict(parse_switch_assignments(assignments))
    except ConfigError as exc:
        raise SystemExit(str(exc)) from exc


def one_trial(flags: list[str], settings: dict[str, int]) -> dict[str, float]:
    """Phase name -> median ms of one profile_step run with the given kernel switches."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        switch_flags = [f"--switch={k}={v}" for k, v in settings.items()]
        cmd = [sys.executable, str(HERE / "profile_step.py"), "--no-perf", *flags, *switch_flags]
        subprocess.run([*cmd, "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
        phases = json.loads(out.read_text())["phases"]
    return {p["phase"]: p["ms_median"] for p in phases}


def table(trials: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """Per phase: median, min and max over trials of each setting, and the off/on ratio."""
    rows = []
    for phase in trials["after"][0]:
        row: dict[str, Any] = {"phase": phase}
        for name, runs in trials.items():
            values = [t[phase] for t in runs]
            row[name] = [statistics.median(values), min(values), max(values)]
        row["speedup"] = row["before"][0] / row["after"][0]
        rows.append(row)
    return rows


def main() -> int:
    """Parse flags, run the alternating trials, print the table (and write JSON with -o)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("--branches", default="2,32,64")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--before", nargs="+", metavar="NAME=VALUE", help="default: switches 0")
    ap.add_argument("--after", nargs="+", metavar="NAME=VALUE", help="default: switches 1")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    settings = {"before": switches_of(args.before, 0), "after": switches_of(args.after, 1)}
    flags = ["--doc-tokens", str(args.doc_tokens), "--branches", args.branches]
    flags += ["--steps", str(args.steps), "--exact" if args.exact else "--no-exact"]
    print(f"before: {settings['before']}  after: {settings['after']}")
    trials: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for trial in range(args.trials + 1):  # trial 0 is the warm-up
        for name in SETTINGS:
            result = one_trial(flags, settings[name])
            if trial > 0:
                trials[name].append(result)
    rows = table(trials)
    print(f"{'phase':28} {'before ms':>24} {'after ms':>24} {'speedup':>8}")
    for r in rows:
        cells = [f"{r[n][0]:8.1f} [{r[n][1]:.1f}-{r[n][2]:.1f}]" for n in SETTINGS]
        print(f"{r['phase']:28} {cells[0]:>24} {cells[1]:>24} {r['speedup']:7.2f}x")
    if args.out:
        result = {"args": vars(args) | {"out": str(args.out)}, "trials": trials, "table": rows}
        write_result(args.out, result, swarmkv.default_model_path())
    return 0


if __name__ == "__main__":
    sys.exit(main())
