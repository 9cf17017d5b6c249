#!/usr/bin/env python3
"""One weight product at a time: ggml MUL_MAT of the default model's weight shapes by 1 to 64
activation rows, SwarmKV's weight kernels against the ones they replace (each setting in a
fresh process, alternating), so each shape can keep whichever is faster: patch 0004's skinny
GEMM for Q8_0/Q5_0 (the backend switch skinny_gemm) and patch 0008's K-quant rows for
Q4_K/Q6_K (kquant_rows; batch-invariant mode only), both switched together (1: on, 0: off;
swarmkv.llama.kernel_switches). Batch-invariant mode is on by default (every Q8_0/Q5_0 shape
goes through the skinny GEMM there); --no-exact measures llama.cpp's own dispatch against
skinny_gemm=2 (the skinny GEMM for shapes of 16 rows and more in plain mode too).

    python bench/gemm_shapes.py [--rows 1,2,4,8,16,32,64] [--trials 3] [-o f.json]

Prints median [min-max] over trials of each shape's median ms (of --reps runs after a warm-up)
and GMAC/s (multiply-adds per second). Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import swarmkv
from swarmkv_bench.kernel_rate import mul_mat_ms
from swarmkv_bench.provenance import write_result

# (name, ggml type name, input dim k, output rows m): the default model's weight products
SHAPES = [
    ("output 640->262144 q8_0", "Q8_0", 640, 262144),
    ("ffn_up 640->2048 q5_0", "Q5_0", 640, 2048),
    ("attn_q 640->1024 q5_0", "Q5_0", 640, 1024),
    ("ffn_down 2048->640 q4_K", "Q4_K", 2048, 640),
    ("ffn_down 2048->640 q6_K", "Q6_K", 2048, 640),
    ("attn_output 1024->640 q4_K", "Q4_K", 1024, 640),
]


def child(args: argparse.Namespace) -> None:
    out = {}
    for name, type_name, k, m in SHAPES:
        for n in args.row_counts:
            times = mul_mat_ms(
                type_name, k, m, n, args.threads, args.exact, args.reps, switches_of(args)
            )
            out[f"{name}|{n}"] = statistics.median(times)
    json.dump(out, sys.stdout)


def switches_of(args: argparse.Namespace) -> dict[str, int]:
    """The child's kernel switches: on (1) or off (0) together; plain mode's "on" is 2, the
    skinny GEMM outside batch-invariant mode."""
    on = args.setting == 1
    return {"skinny_gemm": (1 if args.exact else 2) if on else 0, "kquant_rows": int(on)}


def run_setting(args: argparse.Namespace, skinny: str) -> dict[str, float]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--setting",
        skinny,
        "--rows",
        args.rows,
        "--threads",
        str(args.threads),
        "--reps",
        str(args.reps),
        "--exact" if args.exact else "--no-exact",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7, help="runs per shape and trial (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setting", type=int, choices=(0, 1), default=1, help=argparse.SUPPRESS)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    args.row_counts = [int(x) for x in args.rows.split(",")]
    if args.child:
        child(args)
        return 0
    runs: dict[str, list[dict[str, float]]] = {"0": [], "1": []}
    for trial in range(args.trials + 1):  # trial 0: warm-up of both settings, not kept
        for skinny in ("0", "1"):
            result = run_setting(args, skinny)
            if trial:
                runs[skinny].append(result)
    mode = "exact" if args.exact else "no-exact"
    print(f"| shape | rows | off ms | on ms | off/on | on GMAC/s |  ({mode})")
    print("|---|--:|--:|--:|--:|--:|")
    table = []
    for name, _, k, m in SHAPES:
        for n in args.row_counts:
            key = f"{name}|{n}"
            off = [r[key] for r in runs["0"]]
            on = [r[key] for r in runs["1"]]
            gmacs = k * m * n / (statistics.median(on) * 1e6)
            ratio = statistics.median(off) / statistics.median(on)
            print(f"| {name} | {n} | {spread(off)} | {spread(on)} | {ratio:.2f}x | {gmacs:.1f} |")
            table.append({"shape": name, "rows": n, "off_ms": off, "on_ms": on, "gmacs_on": gmacs})
    if args.out:
        result = {"exact": args.exact, "threads": args.threads, "shapes": table}
        write_result(args.out, result, swarmkv.default_model_path())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
