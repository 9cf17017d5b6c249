#!/usr/bin/env python3
"""Exact for free? The batch-invariant kernels (the default) against llama.cpp's own (plain:
repacked weights), phase by phase, each also as a multiple of this CPU's hardware floor
measured in the same run.

    python bench/exact_floor.py [--doc-tokens 3501] [--branches 32] [--steps 8] [--trials 3]
                                [--switch NAME=VALUE ...] [-o f.json]

In one process: this CPU's peaks (swarmkv_bench/hw_peak.py: int8 multiply-adds, f32 FMAs,
read bandwidth, every thread; measured before every trial and after the last, the largest of
each reading taken) and the kernels' own best int8 rate; then one warm-up and
--trials measured trials, each running plain and exact in an order that rotates from trial
to trial, a fresh context each: the document prefilled in 512-token chunks (as `fork` does),
then --steps 1-branch and N-branch generation steps at the positions after it (each phase's
median within the trial). Prints median [min-max] over trials per phase and setting, the
exact/plain ratio paired within each trial, each phase's floor (hw_floor.py) and how far
from it each setting is, and the targets. --switch sets a kernel switch of the exact
contexts (swarmkv.llama.kernel_switches). Run on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import swarmkv as sk
from swarmkv.engine.sequence import chunk_bounds
from swarmkv.llama.batch import Batch
from swarmkv.llama.kernel_switches import Switches, parse_switch_assignments
from swarmkv_bench.hw_floor import ModelShape, decode_floor
from swarmkv_bench.hw_peak import best_of, measure_peaks
from swarmkv_bench.kernel_rate import int8_gmacs
from swarmkv_bench.metrics import spread
from swarmkv_bench.phases import open_context, prefill, step_runner
from swarmkv_bench.provenance import write_result
from swarmkv_bench.workload import document

SETTINGS = ("plain", "exact")
# (phase, goal, what): exact/plain ratios and x-floor multiples the issue sets
TARGETS = (
    ("1-branch step", "ratio", 1.10),
    ("prefill", "ratio", 1.10),
    ("N-branch step", "floor", 2.0),
    ("prefill", "floor", 2.5),
)


def one_setting(
    model: sk.Model, tokens: list[int], n: int, steps: int, exact: bool, switches: Switches
) -> dict[str, float]:
    """A fresh context: the prefill (ms in all, and per chunk), then a 1-branch and an
    n-branch step, each the median of `steps` after a warm-up."""
    ctx = open_context(model, len(tokens), n, steps, exact, switches if exact else ())
    with ctx, Batch(max(ctx.n_batch, n), 1) as batch:
        chunks = prefill(ctx, tokens, batch)
        out = {"prefill": sum(chunks), "prefill chunk": sum(chunks) / len(chunks)}
        for s in range(1, n + 1):
            ctx.seq_cp(0, s)
        for name, seqs in (("1-branch step", [1]), ("N-branch step", list(range(1, n + 1)))):
            step = step_runner(ctx, batch, seqs, len(tokens))
            step()  # warm-up
            out[name] = statistics.median(step() for _ in range(steps))
            for s in seqs:
                ctx.seq_rm(s, len(tokens), None)
    return out


def floors(shape: ModelShape, peaks: Any, n_doc: int, n_batch: int, n: int) -> dict[str, Any]:
    """Each phase's floor: the prefill's chunks (rows see every cell before them), a step of
    one branch and of n branches right after the document."""
    chunks = [
        decode_floor(shape, peaks, list(range(lo + 1, hi + 1)), 1, hi)
        for lo, hi in chunk_bounds(n_doc, n_batch)
    ]
    total = sum(c.floor_ms or 0.0 for c in chunks) or None
    one = decode_floor(shape, peaks, [n_doc + 1], 1, n_doc + 1)
    many = decode_floor(shape, peaks, [n_doc + 1] * n, n, n_doc + n)
    return {
        "prefill": {"floor_ms": total, "bound": chunks[0].bound, "chunks": len(chunks)},
        "prefill chunk": {"floor_ms": total / len(chunks) if total else None},
        "1-branch step": one.to_dict(),
        "N-branch step": many.to_dict(),
    }


def summarize(trials: list[dict[str, dict[str, float]]], floor: dict[str, Any]) -> list[dict]:
    """Per phase: each setting's median [min-max], exact/plain paired within each trial, and
    each setting's multiple of the phase's floor."""
    rows = []
    for phase in trials[0]["plain"]:
        row: dict[str, Any] = {"phase": phase, "floor_ms": floor[phase]["floor_ms"]}
        for s in SETTINGS:
            row[s] = spread([t[s][phase] for t in trials])
            if row["floor_ms"]:
                row[f"{s}_x_floor"] = spread([t[s][phase] / row["floor_ms"] for t in trials])
        row["exact_over_plain"] = spread([t["exact"][phase] / t["plain"][phase] for t in trials])
        rows.append(row)
    return rows


def judge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target on the trials: PASS when every trial meets it, FAIL when the median does
    not, else WITHIN SPREAD (a pass by less than the spread is not a pass)."""
    by_phase = {r["phase"]: r for r in rows}
    out = []
    for phase, kind, goal in TARGETS:
        key = "exact_over_plain" if kind == "ratio" else "exact_x_floor"
        med, lo, hi = by_phase[phase].get(key) or (None, None, None)
        verdict = (
            "NOT MEASURED"
            if med is None
            else "PASS"
            if hi <= goal
            else ("WITHIN SPREAD" if med <= goal else "FAIL")
        )
        what = "exact / plain" if kind == "ratio" else "exact / hardware floor"
        out.append(
            {
                "phase": phase,
                "target": f"{what} <= {goal}",
                "value": [med, lo, hi],
                "verdict": verdict,
            }
        )
    return out


def print_table(rows: list[dict[str, Any]], targets: list[dict[str, Any]]) -> None:
    def cell(v: list[float] | None, fmt: str) -> str:
        return "-" if not v else f"{v[0]:{fmt}} [{v[1]:{fmt}}-{v[2]:{fmt}}]"

    print(
        f"{'phase':16} {'floor ms':>9} {'plain ms':>24} {'exact ms':>24} {'exact/plain':>20}"
        f" {'plain x floor':>20} {'exact x floor':>20}"
    )
    for r in rows:
        floor = f"{r['floor_ms']:.1f}" if r["floor_ms"] else "-"
        print(
            f"{r['phase']:16} {floor:>9} {cell(r['plain'], '.1f'):>24} "
            f"{cell(r['exact'], '.1f'):>24} {cell(r['exact_over_plain'], '.2f'):>20} "
            f"{cell(r.get('plain_x_floor'), '.2f'):>20} {cell(r.get('exact_x_floor'), '.2f'):>20}"
        )
    for t in targets:
        print(f"  {t['verdict']:13} {t['phase']}: {t['target']}: {cell(t['value'], '.2f')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("--branches", type=int, default=32, help="N of the N-branch step")
    ap.add_argument("--steps", type=int, default=8, help="runs per step phase (after a warm-up)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None, help="default: every core")
    ap.add_argument("--switch", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    switches = parse_switch_assignments(args.switch)
    path = sk.default_model_path()
    shape = ModelShape.from_gguf(path)
    with sk.Model(path, repack=True) as plain, sk.Model(path) as exact:
        tokens = exact.tokenize(document(exact, args.doc_tokens))
        threads = args.threads or sk.llama.config.default_threads()
        kernel_rate = int8_gmacs(threads=threads, exact=True)
        models = {"plain": plain, "exact": exact}
        trials, readings = [], []
        for trial in range(args.trials + 1):  # trial 0: the warm-up, not kept
            readings.append(measure_peaks(threads))  # before each trial, and after the last
            order = SETTINGS[trial % 2 :] + SETTINGS[: trial % 2]
            run = {
                s: one_setting(models[s], tokens, args.branches, args.steps, s == "exact", switches)
                for s in order
            }
            if trial:
                trials.append(run)
        readings.append(measure_peaks(threads))
    peaks = best_of(readings)
    floor = floors(shape, peaks, len(tokens), 512, args.branches)
    rows = summarize(trials, floor)
    targets = judge(rows)
    print(f"peaks ({threads} threads): {peaks.to_dict()}; kernels' int8 {kernel_rate:.1f} G/s")
    print_table(rows, targets)
    if args.out:
        result = {
            "args": vars(args) | {"out": str(args.out)},
            "doc_tokens": len(tokens),
            "peaks": peaks.to_dict(),
            "peak_readings": [p.to_dict() for p in readings],
            "kernel_int8_gmacs": kernel_rate,
            "model_shape": shape.__dict__,
            "floors": floor,
            "trials": trials,
            "table": rows,
            "targets": targets,
        }
        write_result(args.out, result, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
