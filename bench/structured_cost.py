#!/usr/bin/env python3
"""What structured output costs: 32 fork branches over one document, each asked for a
different 5-field JSON object (swarmkv_bench.field_schemas), decoded unconstrained and
constrained by their schemas (llguidance), side by side in one run.

Each trial runs both settings, alternating which goes first, after one warm-up of each.
Every branch decodes --n-predict tokens or stops: a constrained one when its object is
complete. Reported per setting, median [min-max] over the trials: ms per decode step
(every row of the step), ms per generated token, and for the constrained runs the tokens
fast-forward appended without sampling, each branch's mask time per step (its share of
the step's masks, computed together on llguidance's threads; p50 and p99 over every
branch-step of the trial), and all the constraint work the engine timed per step (masks,
applying them, accepting, fast-forward) as a share of the paired free run's step time.
Run on an idle machine.

    python bench/structured_cost.py --doc-tokens 3501 --trials 3 -o results/structured.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

import swarmkv as sk
from swarmkv import Constraint, Pipeline
from swarmkv_bench.field_schemas import field_prompt, field_schema
from swarmkv_bench.metrics import spread
from swarmkv_bench.provenance import write_result
from swarmkv_bench.workload import document


def one_run(model: sk.Model, doc: str, n: int, n_predict: int, constrained: bool) -> dict:
    """One fork run of n branches; its times, tokens and (constrained) mask times."""
    with Pipeline(model) as p:
        p.prefill("doc", text=doc)
        for k in range(n):
            schema = field_schema(k)
            c = Constraint.json_schema(schema) if constrained else None
            p.branch(f"b{k:02d}", prompt=field_prompt(schema), n_predict=n_predict, constraint=c)
        r = p.run(mode="fork")
    stats = r.decode_stats
    tokens = sum(len(b.tokens) for b in r.branches.values())
    masks = [m for b in r.branches.values() for m in b.mask_ms]
    out = {
        "e2e_ms": r.e2e_ms,
        "ms_per_step": stats["gen_ms_per_step"],
        "steps": stats["gen_steps"],
        "ms_per_token": stats["gen_ms"] / max(tokens, 1),
        "tokens": float(tokens),
    }
    if constrained:
        stops = [b.stop_reason for b in r.branches.values()]
        out.update(
            forced_tokens=float(sum(b.forced_tokens for b in r.branches.values())),
            complete=float(stops.count("grammar")),
            constraint_ms_per_step=sum(b.constraint_ms for b in r.branches.values())
            / max(stats["gen_steps"], 1),
            mask_ms_p50=float(np.percentile(masks, 50)),
            mask_ms_p99=float(np.percentile(masks, 99)),
            mask_ms_max=float(max(masks)),
        )
    return out


def summary(trials: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per metric: [median, min, max] over the measured trials."""
    return {k: spread([t[k] for t in trials]) for k in trials[0]}


def main() -> None:
    """Parse flags, run both settings for the trials (alternating), print and save."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", type=Path, help="text to cut the document from (default: fox)")
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("--branches", type=int, default=32)
    ap.add_argument("-n", "--n-predict", type=int, default=48)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    path = sk.default_model_path()
    runs: dict[str, list[dict[str, float]]] = {"free": [], "constrained": []}
    with sk.Model(path) as model:
        doc = document(model, args.doc_tokens, args.doc)
        for trial in range(args.trials + 1):  # trial 0 warms both up and is not kept
            order = ["free", "constrained"] if trial % 2 else ["constrained", "free"]
            for name in order:
                got = one_run(model, doc, args.branches, args.n_predict, name == "constrained")
                if trial:
                    runs[name].append(got)
                    print(f"trial {trial} {name:<11} " + ", ".join(
                        f"{k} {v:.2f}" for k, v in got.items()), flush=True)  # fmt: skip
    out: dict[str, Any] = {
        "branches": args.branches,
        "n_predict": args.n_predict,
        "doc_tokens": args.doc_tokens,
    }
    for name, trials in runs.items():
        out[name] = {"trials": trials, "median_min_max": summary(trials)}
    pairs = list(zip(runs["constrained"], runs["free"], strict=True))
    # the constraint work the engine timed in each constrained run, over its paired free
    # run's step time; and the wall-clock step ratio of the pair (noisier: two runs apart)
    shares = [c["constraint_ms_per_step"] / f["ms_per_step"] for c, f in pairs]
    walls = [c["ms_per_step"] / f["ms_per_step"] - 1 for c, f in pairs]
    for key, values in (("constraint_share", shares), ("wall_step_cost", walls)):
        out[key] = {"trials": values, "median_min_max": spread(values)}
        print(f"{key}: " + ", ".join(f"{100 * v:+.1f}%" for v in values))
    if args.out:
        write_result(args.out, out, path)


if __name__ == "__main__":
    main()
