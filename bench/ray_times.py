#!/usr/bin/env python3
"""Where a Ray fan-out's time goes, beside the same job run locally (one process).

A --branches-branch job (distinct prompts, --n-predict tokens each) over the benchmark's
document of --doc-tokens tokens on the default model, batch-invariant: run locally in fork
mode, then on --workers local Ray workers (swarmkv.dist.RayFanout, --threads each), one
warm-up then --trials measured trials of each, side by side. Reports median [min-max] of the
driver's prefill and object-store put, the slowest worker's get, verify, restore and run,
and both end-to-end times; and whether every branch's tokens equal the local run's. Run it
on an idle machine.

    python bench/ray_times.py --trials 3 -o bench/results/ray-times.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import ray
from snapshot_times import spread, timed

from swarmkv import Pipeline
from swarmkv.dist import RayFanout
from swarmkv_bench.provenance import write_result
from swarmkv_bench.workload import document

WORKER_KEYS = ("get_ms", "verify_ms", "restore_ms", "run_ms")


def job(pipe: Pipeline, n: int, n_predict: int) -> None:
    for i in range(n):
        pipe.branch(
            f"q{i}",
            prompt=f"\n\nAgent {i}: what does the text say next?\nAnswer:",
            n_predict=n_predict,
        )


def trial(pipe: Pipeline, fan: RayFanout) -> dict[str, Any]:
    local_ms, local = timed(lambda: pipe.run("fork"))
    ray_ms, got = timed(lambda: fan.run(pipe))
    dist = got.dist
    out: dict[str, Any] = {
        "local_e2e_ms": local_ms,
        "ray_e2e_ms": ray_ms,
        "driver_prefill_ms": dist["driver_prefill_ms"],
        "put_ms": dist["put_ms"],
        "snapshot_bytes": dist["snapshot_bytes"],
        "tokens_identical": all(got[n].tokens == b.tokens for n, b in local.branches.items()),
    }
    for key in WORKER_KEYS:  # the slowest worker's, which the job waits for
        out[f"worker_{key}"] = max(w[key] for w in dist["workers"])
    out["worker_branches"] = [w["branches"] for w in dist["workers"]]
    out["worker_model_load"] = [w["load_ms"] for w in dist["workers"]]  # ms, once each
    return out


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens_identical": all(t["tokens_identical"] for t in trials)}
    for key in [k for k in trials[0] if k.endswith("_ms")]:
        out[key] = spread([t[key] for t in trials], 1)
    out["snapshot_bytes"] = trials[0]["snapshot_bytes"]
    out["worker_branches"] = trials[0]["worker_branches"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("--branches", type=int, default=32)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per Ray worker")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("-o", "--out")
    args = ap.parse_args()
    ray.init(num_cpus=args.workers * args.threads, include_dashboard=False, logging_level="WARNING")
    with Pipeline() as pipe:  # local: every CPU, as `swarmkv run` uses
        model_path = pipe.model.path
        pipe.prefill("doc", text=document(pipe.model, args.doc_tokens))
        job(pipe, args.branches, args.n_predict)
        with RayFanout(pipe.model.path, workers=args.workers, threads=args.threads) as fan:
            trial(pipe, fan)  # warm-up
            trials = [trial(pipe, fan) for _ in range(args.trials)]
    ray.shutdown()
    result = {"options": vars(args), "trials": trials, "summary": summary(trials)}
    for key, value in result["summary"].items():
        shown = f"{value[0]} [{value[1]}-{value[2]}]" if key.endswith("_ms") else value
        print(f"{key:<22} {shown}")
    if args.out:
        write_result(Path(args.out), result, model_path)


if __name__ == "__main__":
    main()
