#!/usr/bin/env python3
"""Where a decode step goes on this CPU: per-op time of a prefill chunk, a 1-branch generation
step and an N-branch generation step, the way `fork` decodes them (perf).

    python bench/profile_step.py [--doc-tokens 3501] [--branches 2,32,64] [--no-exact]
                                 [--switch NAME=VALUE ...] [-o f.json]

--switch sets one of the CPU backend's kernel switches for the context (names and values in
swarmkv.llama.kernel_switches; bench/kernel_ab.py compares settings side by side).

Each phase is first timed without the profiler (median of --steps runs after a warm-up), then
`perf record` attaches to this process for the same phase and the samples are grouped by
ggml op (MUL_MAT by kernel family, FLASH_ATTN_EXT, ...). Symbols of the installed (stripped)
libraries are read from their unstripped copies in the build folder. Needs `perf` and the
permission to attach (perf_event_paranoid <= 1, or root). Run on an idle machine: ggml's
threads spin at barriers, and any other load distorts every number here.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import swarmkv as sk
from swarmkv.llama.batch import Batch
from swarmkv.llama.context import Context
from swarmkv.llama.kernel_switches import parse_switch_assignments
from swarmkv_bench.perf_samples import PerfError, op_table, profile
from swarmkv_bench.phases import open_context, prefill, step_runner
from swarmkv_bench.provenance import write_result
from swarmkv_bench.workload import document

ROOT = Path(__file__).resolve().parents[1]


# A profiled phase runs until perf has this much of it (at 2000 samples/s a thread: enough
# that an op with a few percent of the time is never missed by chance), within MAX_PROFILED
# times the timed runs (the context's room for them).
MIN_PROFILED_MS = 400.0
MAX_PROFILED = 8


class Measure:
    """Times a phase (median of `steps` runs after a warm-up), then profiles it for at least
    MIN_PROFILED_MS (at most MAX_PROFILED x steps runs)."""

    def __init__(self, steps: int, use_perf: bool, build_dir: Path) -> None:
        self.steps = steps
        self.use_perf = use_perf
        self.build_dir = build_dir

    def profiled_runs(self, steps: int, ms_median: float) -> int:
        """How many runs to profile: the timed runs, more where they are short."""
        wanted = math.ceil(MIN_PROFILED_MS / max(ms_median, 1e-3))
        return min(MAX_PROFILED * steps, max(steps, wanted))

    def __call__(self, name: str, run: Callable[[], float], steps: int = 0) -> dict[str, Any]:
        steps = steps or self.steps
        run()  # warm-up
        ms = [run() for _ in range(steps)]
        out: dict[str, Any] = {
            "phase": name,
            "ms_median": statistics.median(ms),
            "ms_min": min(ms),
            "ms_max": max(ms),
            "runs": steps,
        }
        if self.use_perf:
            out["profiled_runs"] = self.profiled_runs(steps, out["ms_median"])
            with profile(self.build_dir) as prof:
                for _ in range(out["profiled_runs"]):
                    run()
            out["ops"] = op_table(prof.rows, out["ms_median"])
            out["top_symbols"] = prof.top_symbols(12)
        return out


def main() -> int:
    """Parse flags, profile the three phases, print per-op tables (and write JSON with -o)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("--branches", default="32", help="branch counts of the N-branch steps")
    ap.add_argument("--steps", type=int, default=8, help="runs per step phase (after a warm-up)")
    ap.add_argument("--prefill-runs", type=int, default=2, help="measured prefills of the doc")
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--no-perf", action="store_true", help="time the phases only")
    ap.add_argument(
        "--switch", action="append", default=[], metavar="NAME=VALUE", help="a kernel switch"
    )
    ap.add_argument("--build-dir", type=Path, default=None, help="unstripped libraries")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    build_dir = args.build_dir or next((ROOT / "build").glob("cp*/bin"), ROOT / "build")
    counts = sorted({int(c) for c in args.branches.split(",")})
    if counts[0] < 1:
        ap.error("--branches: counts must be at least 1")
    measure = Measure(args.steps, not args.no_perf, build_dir)
    with sk.Model(sk.default_model_path(), repack=not args.exact) as model:
        tokens = model.tokenize(document(model, args.doc_tokens))
        switches = parse_switch_assignments(args.switch)
        room = 0 if args.no_perf else MAX_PROFILED * args.steps
        ctx = open_context(
            model, len(tokens), counts[-1], args.steps, args.exact, switches, profiled_runs=room
        )
        kernel_switches = ctx.kernel_switches()
        with ctx, Batch(max(ctx.n_batch, counts[-1]), 1) as batch:
            phases = run_phases(ctx, batch, tokens, counts, measure, args.prefill_runs)
    result = {
        "doc_tokens": len(tokens),
        "exact": args.exact,
        "kernel_switches": kernel_switches,
        "phases": phases,
    }
    for ph in phases:
        print_phase(ph)
    if args.out:
        write_result(args.out, result, sk.default_model_path())
    return 0


def run_phases(
    ctx: Context,
    batch: Batch,
    tokens: list[int],
    counts: list[int],
    measure: Measure,
    prefill_runs: int,
) -> list[dict[str, Any]]:
    """Prefill (profiled as a whole, reported per chunk), the 1-branch step, then an
    n-branch step for each n in counts, every step at the positions right after the prefix."""
    chunks = prefill(ctx, tokens, batch)  # warm prefill: the threads exist for perf to find

    def one_prefill() -> float:
        ctx.seq_rm(0)
        return sum(prefill(ctx, tokens, batch)) / len(chunks)

    phases = [measure(f"prefill chunk ({ctx.n_batch} tokens)", one_prefill, steps=prefill_runs)]
    p = len(tokens)
    for s in range(1, counts[-1] + 1):
        ctx.seq_cp(0, s)
    for n in [1, *(c for c in counts if c > 1)]:
        seqs = list(range(1, n + 1))
        phases.append(measure(f"{n}-branch step", step_runner(ctx, batch, seqs, p)))
        for s in seqs:
            ctx.seq_rm(s, p, None)
    return phases


def print_phase(ph: dict[str, Any]) -> None:
    """One phase: its time, then ms per op group and the top kernels."""
    print(f"\n## {ph['phase']}: {ph['ms_median']:.1f} ms [{ph['ms_min']:.1f}-{ph['ms_max']:.1f}]")
    for row in ph.get("ops", []):
        print(f"  {row['share'] * 100:5.1f}%  {row['ms']:8.1f} ms  {row['op']}")
    for sym in ph.get("top_symbols", []):
        print(f"    {sym['share'] * 100:5.1f}%  {sym['symbol'][:110]}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PerfError as exc:
        sys.exit(f"profile_step: {exc}")
