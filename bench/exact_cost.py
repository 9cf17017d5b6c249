#!/usr/bin/env python3
"""What batch-invariant decoding costs: fork with llama.cpp's fastest kernels (exact=False, repacked
weights), the batch-invariant fork (the default: weights as stored), the batch-invariant fork on
repacked weights (patch 0011), and the exact fork of the first design (per-sequence streams, one
decode per branch), at 2 and 32 branches.

One warm-up, then --trials measured trials of each; prints median [min-max] of e2e, prefill
and generation ms per decode, and writes every trial as JSON (-o). Run on an idle machine.

    python bench/exact_cost.py --doc vendor/llama.cpp/SECURITY.md -o results/exact-cost.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.pipeline.modes import ForkOptions
from swarmkv_bench.metrics import spread
from swarmkv_bench.provenance import write_result
from swarmkv_bench.workload import document

STREAMS = ForkOptions(layout="streams", packing="per_branch")
# name -> (exact, repacked weights, fork options)
VARIANTS: dict[str, tuple[bool, bool, ForkOptions | None]] = {
    "fork --no-exact": (False, True, None),
    "fork (exact)": (True, False, None),
    "fork (exact, repacked)": (True, True, None),
    "fork+exact (streams)": (False, True, STREAMS),
}


def one_run(
    model: sk.Model, doc: str, n: int, n_predict: int, exact: bool, fork: ForkOptions | None
) -> dict[str, float]:
    """One fork run of n branches over doc; its wall, prefill and per-step times (ms)."""
    with Pipeline(model, exact=exact, fork=fork) as p:
        p.prefill("doc", text=doc)
        for i in range(n):
            p.branch(f"b{i}", prompt=f"\n\nQuestion {i}: what comes next?", n_predict=n_predict)
        r = p.run(mode="fork")
    return {
        "e2e_ms": r.e2e_ms,
        "prefill_ms": r.prefill_ms,
        "ms_per_decode": r.decode_stats["gen_ms_per_step"],
    }


def summary(trials: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per metric: [median, min, max] over the measured trials."""
    return {k: spread([t[k] for t in trials]) for k in trials[0]}


def main() -> None:
    """Parse flags, run every setting for the given trials, print and save the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", type=Path, help="text to cut the document from (default: fox)")
    ap.add_argument("--doc-tokens", type=int, default=700)
    ap.add_argument("--branches", default="2,32")
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-streams", action="store_true", help="leave out fork+exact (streams)")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    out: dict[str, Any] = {}
    path = sk.default_model_path()
    with sk.Model(path, repack=True) as fast, sk.Model(path) as flat:
        doc = document(flat, args.doc_tokens, args.doc)
        for n in (int(x) for x in args.branches.split(",")):
            for name, (exact, repacked, fork) in VARIANTS.items():
                if args.no_streams and fork is STREAMS:
                    continue
                model = fast if repacked else flat
                runs = [
                    one_run(model, doc, n, args.n_predict, exact, fork)
                    for _ in range(args.trials + 1)
                ][1:]
                out[f"{n} {name}"] = {"trials": runs, "median_min_max": summary(runs)}
                cells = ", ".join(
                    f"{k} {v[0]:.1f} [{v[1]:.1f}-{v[2]:.1f}]" for k, v in summary(runs).items()
                )
                print(f"{n:>3} branches  {name:<22} {cells}", flush=True)
    if args.out:
        write_result(args.out, out, path)


if __name__ == "__main__":
    main()
