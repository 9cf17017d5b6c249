#!/usr/bin/env python3
"""Workload (c)'s burst against the saved-slots llama-server peer, run after run.

A burst's arrivals do not depend on the seed, but what `server-np16-restore` computes in one
depends on the order in which its queue takes the 48 simultaneous requests (which is why
`swarmkv bench --serve` now repeats a burst per seed): 16 slots hold the 4 heads, 4 slots
each; a request that finds no idle slot with its head goes to another head's slot and loads
its head from the RAM prompt cache, and a cache entry moves into the slot it is loaded into
(it is not copied), so once a head's entries are used up its next request computes the head
again. This script runs the same
burst --runs times against each given llama-server binary, interleaved (the order rotates
each run), and reports per run the requests that recomputed their head (fewer cached
tokens than the head has), the prompt tokens computed, tokens/s, p99 time to first token,
and the answers the same as alone. Run it on an idle machine.

    python bench/restore_burst.py --runs 3 \\
        -o docs/results/serve-scale/restore-burst/restore_burst.json
    python bench/restore_burst.py --binary as-built=build/llama-server/bin/llama-server \\
        --binary other=/path/to/llama-server --runs 3
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from snapshot_times import spread

from swarmkv.llama.model import Model
from swarmkv.llama.models import default_model_path
from swarmkv_bench.peer_server import find_llama_server
from swarmkv_bench.provenance import write_result
from swarmkv_bench.serve_bench import one_run, rotated
from swarmkv_bench.serve_systems import Setup, binary_info, sizes
from swarmkv_bench.serve_workloads import Shapes, Workload, build

SYSTEM = "server-np16-restore"


def binaries(given: list[str]) -> dict[str, Path]:
    """LABEL=PATH pairs, or the repository's llama-server labelled as-built."""
    if not given:
        found = find_llama_server()
        if found is None:
            raise SystemExit("no llama-server built (bench/build_llama_server.sh)")
        return {"as-built": found}
    out = {}
    for item in given:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path).is_file():
            raise SystemExit(f"--binary takes LABEL=PATH to a llama-server, got {item!r}")
        out[label] = Path(path)
    return out


def head_recomputes(run: dict[str, Any], head_tokens: int) -> int:
    """Requests whose cached tokens fall short of their head: the head was computed again."""
    return sum(1 for r in run["requests_log"] if (r["cached_tokens"] or 0) < head_tokens)


def one_burst(
    label: str, binary: Path, opts: argparse.Namespace, work: Workload, size: Any, head_tokens: int
) -> dict[str, Any]:
    setup = Setup(opts.model, opts.threads, "exact", binary)
    run = one_run(SYSTEM, setup, work, size, math.inf, 0)
    return {
        "binary": label,
        "head_recomputes": head_recomputes(run, head_tokens),
        "prompt_tokens_computed": run["prompt_tokens_computed"],
        "tokens_per_s": run["tokens_per_s"],
        "ttft_p99_ms": run["ttft_ms"]["p99"],
        "identical_to_alone": run["identical_to_alone"],
        "compared": run["compared"],
        "errors": run["errors"],
        "command": run["command"],
    }


def summary(runs: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    out = {}
    for label in labels:
        mine = [r for r in runs if r["binary"] == label]
        out[label] = {
            "head_recomputes_per_run": [r["head_recomputes"] for r in mine],
            **{
                key: spread([r[key] for r in mine], 1)
                for key in (
                    "head_recomputes",
                    "prompt_tokens_computed",
                    "tokens_per_s",
                    "ttft_p99_ms",
                )
            },
            "identical_to_alone": f"{sum(r['identical_to_alone'] for r in mine)}/"
            f"{sum(r['compared'] for r in mine)}",
            "errors": sum(r["errors"] for r in mine),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", action="append", default=[], metavar="LABEL=PATH")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-agents", type=int, default=12)
    ap.add_argument("--group-tokens", type=int, default=2000)
    ap.add_argument("-n", "--n-predict", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-m", "--model", type=Path, default=None)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    args.model = args.model or default_model_path()
    bins = binaries(args.binary)
    shapes = Shapes(
        groups=args.groups,
        group_agents=args.group_agents,
        group_tokens=args.group_tokens,
        n_predict=args.n_predict,
    )
    with Model(args.model) as model:
        work = build("groups", model, shapes)
        size = sizes(work, model)
        head_tokens = min(len(model.tokenize(h)) for h in work.heads)
    labels = list(bins)
    runs = []
    for k in range(args.runs):
        for label in rotated(labels, k):
            runs.append(one_burst(label, bins[label], args, work, size, head_tokens))
            r = runs[-1]
            print(
                f"run {k} {label}: {r['head_recomputes']} heads recomputed, "
                f"{r['prompt_tokens_computed']} prompt tokens computed, "
                f"{r['tokens_per_s']:.1f} tokens/s, p99 TTFT {r['ttft_p99_ms']:.0f} ms, "
                f"{r['identical_to_alone']}/{r['compared']} as alone",
                flush=True,
            )
    result = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "head_tokens": head_tokens,
        "binaries": {label: binary_info(path) for label, path in bins.items()},
        "runs": runs,
        "summary": summary(runs, labels),
    }
    if args.out:
        write_result(args.out, result, args.model)


if __name__ == "__main__":
    main()
