#!/usr/bin/env python3
"""Prefill and decode speed of the installed build on the default model (or -m MODEL).

Compares a native with a portable install: run it once under each install, on an idle
machine. Prefill: a 1024-token document decoded in two 512-token chunks. Decode: 64 greedy
single-token steps after it. One warm-up, then --trials measured trials; prints the median
with [min-max] and writes JSON with every trial (-o).

    python bench/cpu_speed.py --trials 3 -o results/speed-native.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import swarmkv
from swarmkv import Batch, Context, ContextConfig, Model
from swarmkv_bench.provenance import write_result

DOC_TOKENS = 1024
N_DECODE = 64


def one_trial(model: Model, doc: list[int], threads: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) for one fresh context."""
    config = ContextConfig(n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads)
    with Context(model, config) as ctx, Batch(512) as batch:
        t0 = time.perf_counter_ns()
        for start in range(0, len(doc), 512):
            batch.clear()
            batch.add_sequence(doc[start : start + 512], start, 0)
            ctx.decode(batch)
        t1 = time.perf_counter_ns()
        token, pos = int(np.argmax(ctx.logits(batch.n_tokens - 1))), len(doc)
        for _ in range(N_DECODE):
            batch.clear()
            batch.add(token, pos, (0,), logits=True)
            ctx.decode(batch)
            token, pos = int(np.argmax(ctx.logits(0))), pos + 1
        t2 = time.perf_counter_ns()
    return len(doc) / ((t1 - t0) / 1e9), N_DECODE / ((t2 - t1) / 1e9)


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of the measured trials."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    """Parse flags, measure, print (and optionally write) the table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", type=Path, default=None)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("-o", "--out", type=Path, default=None)
    args = parser.parse_args()
    facts = swarmkv.info()
    with Model(args.model or swarmkv.default_model_path()) as model:
        text = "The quick brown fox jumps over the lazy dog. " * 200
        doc = model.tokenize(text)[:DOC_TOKENS]
        one_trial(model, doc, args.threads)  # warm-up
        trials = [one_trial(model, doc, args.threads) for _ in range(args.trials)]
    result = {
        "build": facts["build"],
        "ggml_cpu_features": list(facts["ggml_cpu_features"]),
        "machine_cpu": facts["machine_cpu"]["name"],
        "threads": args.threads,
        "prefill_tokens_per_s": spread([t[0] for t in trials]),
        "decode_tokens_per_s": spread([t[1] for t in trials]),
        "trials": [{"prefill_tokens_per_s": p, "decode_tokens_per_s": d} for p, d in trials],
    }
    if args.out:
        write_result(args.out, result, args.model or swarmkv.default_model_path())
    pre, dec = result["prefill_tokens_per_s"], result["decode_tokens_per_s"]
    sys.stdout.write(
        f"{facts['build']['cpu_mode']}: prefill {pre['median']:.1f} tok/s "
        f"[{pre['min']:.1f}-{pre['max']:.1f}], decode {dec['median']:.2f} tok/s "
        f"[{dec['min']:.2f}-{dec['max']:.2f}] ({args.trials} trials after a warm-up)\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
