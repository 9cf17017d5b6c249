#!/usr/bin/env python3
"""llama.cpp's llama-batched against SwarmKV's fork: one prompt, N continuations (n > 1).

llama-batched (examples/batched of the vendored tree, TARGET=llama-batched bash
bench/build_llama_server.sh) decodes one prompt once, every token of it in all N sequences'
cells, then N continuations together, one llama_decode per step: the n > 1 case of a single
request. SwarmKV's fork does the same with the document on one sequence copied by seq_cp.

Per trial, per N and kernel family (plain: both as built; exact: llama-batched with
LLAMA_BATCH_INVARIANT=1 and weights not repacked, SwarmKV's batch-invariant default), the two
run in an order that rotates, after one warm-up of each: llama-batched on "document + prompt"
with -np N and -n (prompt tokens + n), its time read from its log's timestamps: from the line
it prints once its context exists ("n_predict = ...") to the one after its last token
("decoded ... in S s"), so the prompt's evaluation and the generation; SwarmKV's fork on
the same text once (the prompt in its document but for one character, each branch's own) and
N branches of n tokens each (its e2e_ms, context creation included, which llama-batched's
span leaves out). Their sampling differs (llama-batched samples with top-k/top-p/
temperature, SwarmKV is greedy), so only the work is the same: N x n generated tokens after
one prefill. Reported: each one's e2e ms and tokens/s, and SwarmKV's speed over llama-batched's.

    python bench/batched_peer.py [--branches 2,8,32] [--doc-tokens 3501] [-n 32] [--trials 3]
                                 [--kernels plain,exact] [-o f.json]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import swarmkv as sk
from swarmkv_bench.metrics import spread
from swarmkv_bench.provenance import write_result
from swarmkv_bench.serve_systems import binary_info
from swarmkv_bench.workload import document

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build/llama-server/bin/llama-batched"
PROMPT = "\n\nQuestion: what comes next in the text above?\nAnswer:"
# common's log prefix, minutes.seconds.milliseconds.microseconds since the start: one digit of
# minutes, because llama-batched ends a stream's line without a newline, so the next stamp
# follows its last number (a run is stopped before 10 minutes: RUN_LIMIT_S)
STAMP = r"(\d)\.(\d\d)\.(\d\d\d)\.(\d\d\d) I\s+"
RUN_LIMIT_S = 590
CONTEXT_READY = re.compile(STAMP + r"main: n_predict = ")
DECODED = re.compile(STAMP + r"main: decoded (\d+) tokens in\s+([\d.]+) s")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_batched(args: argparse.Namespace, text: str, n: int, exact: bool) -> dict[str, float]:
    """One llama-batched run of N continuations of text; its prompt and generation times."""
    n_prompt = len(args.tokenize(text))
    cmd = [
        str(args.binary),
        "-m",
        str(args.model),
        "-t",
        str(args.threads),
        "-np",
        str(n),
        "-n",
        str(n_prompt + args.n_predict),
        "-fa",
        "on",
        "--kv-unified",
        "-p",
        text,
    ]
    env = dict(os.environ)
    if exact:
        cmd.append("-nr")
        env["LLAMA_BATCH_INVARIANT"] = "1"
    else:
        env.pop("LLAMA_BATCH_INVARIANT", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    log = ANSI.sub("", proc.stdout + proc.stderr)
    ready, gen = CONTEXT_READY.search(log), DECODED.search(log)
    if proc.returncode != 0 or ready is None or gen is None:
        raise SystemExit(f"llama-batched failed ({proc.returncode}): {log[-2000:]}")
    e2e = _stamp_ms(gen) - _stamp_ms(ready)
    return {
        "e2e_ms": e2e,
        "prompt_ms": e2e - float(gen[6]) * 1000,
        "gen_tokens": int(gen[5]),
        "tokens_per_s": int(gen[5]) / (e2e / 1000),
    }


def _stamp_ms(line: re.Match[str]) -> float:
    """A log line's time since the start, from its prefix, in ms."""
    minutes, seconds, ms, us = (int(line[i]) for i in range(1, 5))
    return (minutes * 60 + seconds) * 1000 + ms + us / 1000


def run_fork(args: argparse.Namespace, model: sk.Model, doc: str, n: int) -> dict[str, float]:
    """SwarmKV's fork: document + prompt prefilled once, N branches. llama-batched prefills
    its one prompt once for all sequences, so the prompt goes into SwarmKV's document too,
    but for its last character, each branch's own prompt (a branch decodes at least one
    token of its own): the same text prefilled once, not N times."""
    with sk.Pipeline(model, n_threads=args.threads, exact=args.exact_now) as pipe:
        pipe.prefill("doc", text=doc + PROMPT[:-1])
        for i in range(n):
            pipe.branch(f"b{i}", prompt=PROMPT[-1:], n_predict=args.n_predict)
        r = pipe.run("fork")
    gen = sum(len(b.tokens) for b in r.branches.values())
    return {
        "e2e_ms": r.e2e_ms,
        "prompt_ms": r.prefill_ms,
        "gen_tokens": gen,
        "tokens_per_s": gen / (r.e2e_ms / 1000),
    }


def one_pair(args: argparse.Namespace, model: sk.Model, doc: str, n: int, trial: int) -> dict:
    order = ("batched", "swarmkv")[:: 1 if trial % 2 == 0 else -1]
    return {
        s: run_batched(args, doc + PROMPT, n, args.exact_now)
        if s == "batched"
        else run_fork(args, model, doc, n)
        for s in order
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--branches", default="2,8,32")
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--kernels", default="plain,exact")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-m", "--model", type=Path, default=None)
    ap.add_argument("--binary", type=Path, default=BINARY, help="llama-batched")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    args.model = args.model or sk.default_model_path()
    if not args.binary.is_file():
        ap.error(f"no {args.binary}: TARGET=llama-batched bash bench/build_llama_server.sh")
    rows, trials = [], {}
    with sk.Model(args.model, repack=True) as plain, sk.Model(args.model) as flat:
        args.tokenize = flat.tokenize
        doc = document(flat, args.doc_tokens)
        for n in (int(x) for x in args.branches.split(",")):
            for family in (k for k in args.kernels.split(",") if k):
                args.exact_now = family == "exact"
                model = flat if args.exact_now else plain
                one_pair(args, model, doc, n, 0)  # the warm-up of both
                runs = [one_pair(args, model, doc, n, t) for t in range(args.trials)]
                key = f"N{n}-{family}"
                trials[key] = runs
                rows.append(_row(key, runs))
                print(_line(rows[-1]))
    if args.out:
        result = {
            "args": {k: str(v) for k, v in vars(args).items() if k != "tokenize"},
            "trials": trials,
            "table": rows,
            "peer_binary": binary_info(args.binary),  # its version and build switches
        }
        write_result(args.out, result, args.model)
    return 0


def _row(key: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "setup": key,
        "batched_e2e_ms": spread([r["batched"]["e2e_ms"] for r in runs]),
        "swarmkv_e2e_ms": spread([r["swarmkv"]["e2e_ms"] for r in runs]),
        "batched_tokens_per_s": spread([r["batched"]["tokens_per_s"] for r in runs]),
        "swarmkv_tokens_per_s": spread([r["swarmkv"]["tokens_per_s"] for r in runs]),
        "speedup": spread([r["batched"]["e2e_ms"] / r["swarmkv"]["e2e_ms"] for r in runs]),
    }


def _line(row: dict[str, Any]) -> str:
    b, s, x = row["batched_e2e_ms"], row["swarmkv_e2e_ms"], row["speedup"]
    return (
        f"{row['setup']}: llama-batched {b[0]:.0f} ms [{b[1]:.0f}-{b[2]:.0f}], swarmkv fork "
        f"{s[0]:.0f} ms [{s[1]:.0f}-{s[2]:.0f}]: {x[0]:.2f}x [{x[1]:.2f}-{x[2]:.2f}]"
    )


if __name__ == "__main__":
    sys.exit(main())
