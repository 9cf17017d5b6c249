#!/usr/bin/env python3
"""llama.cpp's llama-parallel against SwarmKV on llama-parallel's own workload.

llama-parallel (examples/parallel of the vendored tree, bash bench/build_llama_server.sh with
TARGET=llama-parallel) simulates N clients of a server: a system prompt decoded once on its
own sequence and copied to every client with seq_cp (-pps), then -ns requests drawn from its
built-in questions, each "User:\\n{question}\\nAssistant:\\n", continuously batched (-cb), each
answered until "User:" appears, an end-of-generation token or -n tokens. That is SwarmKV's
idea in C++, so it is the closest peer.

Per trial, per client count and kernel family (plain: both as built; exact: llama-parallel with
LLAMA_BATCH_INVARIANT=1 and weights not repacked, SwarmKV's batch-invariant default), in an
order that rotates: llama-parallel runs (greedy, --temp 0, so the answers are reproducible),
its log gives each request's question, prompt and answer lengths and time (the warm-up run's
log is the workload: greedy answers repeat from run to run); a Swarm with the same system
prompt as its document and max_live = clients gets exactly those requests at once (the same
prompts, the same stop string, n_predict = llama-parallel's answer length). One warm-up of
each, then --trials of both in an order that rotates.
Reported: generated tokens per second over each system's whole run (system prompt included),
per-request latency from its start of decoding to its last token (p50/p95), and how many
answers had the same length. Run on an idle machine.

    python bench/parallel_peer.py [--clients 16,32] [--trials 3] [--kernels plain,exact] [-o f.json]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import swarmkv as sk
from swarmkv_bench.metrics import spread
from swarmkv_bench.provenance import write_result
from swarmkv_bench.serve_systems import binary_info

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "vendor/llama.cpp/examples/parallel/parallel.cpp"
BINARY = ROOT / "build/llama-server/bin/llama-parallel"
N_CTX = 8192
RECORD = re.compile(
    r"Client\s+(\d+), seq\s+(\d+)/\s*\d+, prompt\s+(\d+) t, response\s+(\d+) t, "
    r"time\s+([\d.]+) s.*?\n\s*\nInput:\s+(.*?)\n"
)
TOTAL_GEN = re.compile(r"Total gen tokens:\s+(\d+), speed:\s+([\d.]+) t/s")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def system_prompt() -> str:
    """llama-parallel's k_system, read from its source (the same bytes it decodes)."""
    match = re.search(r'static std::string k_system =\s*R"\((.*?)\)";', SOURCE.read_text(), re.S)
    if match is None:
        raise SystemExit(f"no k_system in {SOURCE}")
    return match.group(1)


def run_parallel(args: argparse.Namespace, clients: int, exact: bool) -> dict[str, Any]:
    """One llama-parallel run; its requests as its log reports them, and its totals."""
    seqs = clients * args.per_client
    cmd = [
        str(args.binary),
        "-m",
        str(args.model),
        "-t",
        str(args.threads),
        "-np",
        str(clients),
        "-ns",
        str(seqs),
        "-pps",
        "-n",
        str(args.n_predict),
        "-c",
        str(N_CTX),
        "--kv-unified",
        "-fa",
        "on",
        "--temp",
        "0",
        "-s",
        "1",
    ]
    env = dict(os.environ)
    if exact:
        cmd.append("-nr")
        env["LLAMA_BATCH_INVARIANT"] = "1"
    else:
        env.pop("LLAMA_BATCH_INVARIANT", None)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall_s = time.perf_counter() - t0
    log = ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"llama-parallel failed ({proc.returncode}): {log[-2000:]}")
    reqs = [
        {
            "seq": int(m[2]),
            "prompt_tokens": int(m[3]),
            "gen_tokens": int(m[4]),
            "latency_ms": float(m[5]) * 1000,
            "question": m[6].strip(),
        }
        for m in RECORD.finditer(log)
    ]
    total = TOTAL_GEN.search(log)
    if len(reqs) != seqs or total is None:
        raise SystemExit(f"could not read {seqs} requests and totals from llama-parallel's log")
    n_gen, speed = int(total[1]), float(total[2])
    return {
        "requests": sorted(reqs, key=lambda r: r["seq"]),
        "gen_tokens": n_gen,
        "tokens_per_s": speed,
        "run_s": n_gen / speed,
        "process_wall_s": wall_s,
        "command": " ".join(cmd),
    }


def run_swarm(
    args: argparse.Namespace, model: sk.Model, clients: int, reqs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The same requests through a Swarm: the system prompt as its document, max_live =
    clients, every request queued at once with llama-parallel's answer length."""
    with sk.Swarm(
        model,
        n_ctx=N_CTX,
        max_live=clients,
        max_docs=1,
        n_threads=args.threads,
        exact=args.exact_now,
    ) as swarm:
        t0 = time.perf_counter()
        swarm.add_document("system", text=system_prompt())
        handles = [
            swarm.submit(
                "system",
                f"User:\n{r['question']}\nAssistant:\n",
                n_predict=r["gen_tokens"],
                stop=("User:",),
            )
            for r in reqs
        ]
        results = [h.result() for h in handles]
        run_s = time.perf_counter() - t0
    gen = [len(r.tokens) for r in results]
    return {
        "gen_tokens": sum(gen),
        "tokens_per_s": sum(gen) / run_s,
        "run_s": run_s,
        "latency_ms": [r.completion_ms - r.queue_ms for r in results],
        "same_length": sum(g == r["gen_tokens"] for g, r in zip(gen, reqs, strict=True)),
    }


def summarize(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per client count and family: each system's tokens/s and latency percentiles over the
    trials, and SwarmKV's tokens/s over llama-parallel's paired within each trial."""
    rows = []
    for key in trials[0]:
        runs = [t[key] for t in trials]
        par_lat = [
            np.percentile([q["latency_ms"] for q in r["parallel"]["requests"]], (50, 95))
            for r in runs
        ]
        swk_lat = [np.percentile(r["swarmkv"]["latency_ms"], (50, 95)) for r in runs]
        rows.append(
            {
                "setup": key,
                "parallel_tokens_per_s": spread([r["parallel"]["tokens_per_s"] for r in runs]),
                "swarmkv_tokens_per_s": spread([r["swarmkv"]["tokens_per_s"] for r in runs]),
                "ratio": spread(
                    [r["swarmkv"]["tokens_per_s"] / r["parallel"]["tokens_per_s"] for r in runs]
                ),
                "parallel_latency_p50_ms": spread([float(p[0]) for p in par_lat]),
                "parallel_latency_p95_ms": spread([float(p[1]) for p in par_lat]),
                "swarmkv_latency_p50_ms": spread([float(p[0]) for p in swk_lat]),
                "swarmkv_latency_p95_ms": spread([float(p[1]) for p in swk_lat]),
                "same_length": [r["swarmkv"]["same_length"] for r in runs],
                "requests": len(runs[0]["parallel"]["requests"]),
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="16,32", help="comma list of -np values")
    ap.add_argument("--per-client", type=int, default=2, help="-ns = clients x this")
    ap.add_argument("-n", "--n-predict", type=int, default=128, help="llama-parallel's -n")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--kernels", default="plain,exact")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-m", "--model", type=Path, default=None)
    ap.add_argument("--binary", type=Path, default=BINARY, help="llama-parallel")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    args.model = args.model or sk.default_model_path()
    if not args.binary.is_file():
        ap.error(f"no {args.binary}: TARGET=llama-parallel bash bench/build_llama_server.sh")
    counts = [int(c) for c in args.clients.split(",")]
    families = [k for k in args.kernels.split(",") if k]
    trials: list[dict[str, Any]] = [{} for _ in range(args.trials)]
    with sk.Model(args.model, repack=True) as plain, sk.Model(args.model) as flat:
        for clients in counts:
            for family in families:
                args.exact_now = family == "exact"
                model = flat if args.exact_now else plain
                # the warm-up of both, and the workload: greedy answers repeat run to run
                reqs = run_parallel(args, clients, args.exact_now)["requests"]
                run_swarm(args, model, clients, reqs)
                for trial, run in enumerate(trials):
                    order = ("parallel", "swarmkv")[:: 1 if trial % 2 == 0 else -1]
                    got = {
                        s: run_parallel(args, clients, args.exact_now)
                        if s == "parallel"
                        else run_swarm(args, model, clients, reqs)
                        for s in order
                    }
                    run[f"np{clients}-{family}"] = got
                    par, swk = got["parallel"], got["swarmkv"]
                    print(
                        f"trial {trial} np{clients} {family}: llama-parallel "
                        f"{par['tokens_per_s']:.1f} t/s, swarmkv {swk['tokens_per_s']:.1f} t/s "
                        f"({swk['same_length']}/{len(reqs)} same length)"
                    )
    rows = summarize(trials)
    for r in rows:
        med, lo, hi = r["ratio"]
        verdict = "PASS" if lo >= 1.2 else ("WITHIN SPREAD" if med >= 1.2 else "FAIL")
        print(
            f"  {verdict:13} {r['setup']}: swarmkv / llama-parallel tokens/s >= 1.2: "
            f"{med:.2f} [{lo:.2f}-{hi:.2f}]"
        )
    if args.out:
        result = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "trials": trials,
            "table": rows,
            "peer_binary": binary_info(args.binary),  # its version and build switches
        }
        write_result(args.out, result, args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
