#!/usr/bin/env python3
"""Does `swarmkv run` agree with llama.cpp's own completion tool? (batch-invariant mode)

Builds nothing itself: first `TARGET=llama-completion bash bench/build_llama_server.sh`
(the same pinned, patched tree SwarmKV binds). Then, for one document and question, runs
SwarmKV's batch-invariant fork and llama-completion with LLAMA_BATCH_INVARIANT=1, weights not
repacked (-nr), flash attention on and greedy sampling, at several -b/-ub settings, and
compares the generated text. Exit status 0 when every setting agrees.

    python bench/agree_llama_tool.py --doc vendor/llama.cpp/SECURITY.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv_bench.workload import document

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "build" / "llama-server" / "bin" / "llama-completion"
QUESTION = "\n\nQuestion: What should a reporter of a security issue do?\nAnswer:"
SPLITS = ((2048, 512), (512, 512), (256, 64), (2048, 2048), (64, 7))


def swarmkv_answer(doc: str, n_predict: int, threads: int) -> str:
    """SwarmKV's exact fork answer to QUESTION after doc (greedy)."""
    with Pipeline(exact=True, n_threads=threads) as p:
        p.prefill("doc", text=doc).branch("q", prompt=QUESTION, n_predict=n_predict)
        return p.run(mode="fork")["q"].text


def tool_answer(
    prompt: str, n_predict: int, threads: int, batch: int, ubatch: int, invariant: bool = True
) -> str:
    """llama-completion's greedy answer to prompt at the given -b/-ub (batch-invariant or not)."""
    cmd = [
        str(TOOL),
        "-m",
        str(sk.default_model_path()),
        "-p",
        prompt,
        "-n",
        str(n_predict),
        "--temp",
        "0",
        "-nr",
        "-fa",
        "on",
        "-no-cnv",
        "--no-display-prompt",
        "-b",
        str(batch),
        "-ub",
        str(ubatch),
        "-c",
        "4096",
        "-t",
        str(threads),
        "--no-warmup",
        "-v",
    ]  # fmt: skip (-v: its log names the mode)
    env = {**os.environ, "LLAMA_BATCH_INVARIANT": "1" if invariant else "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"llama-completion failed ({proc.returncode}): {proc.stderr[-2000:]}")
    if invariant and "batch_invariant = true" not in proc.stderr:
        raise SystemExit("llama-completion did not report batch_invariant = true: old build?")
    return proc.stdout.rstrip("\n")  # the tool ends its output with blank lines


def main() -> int:
    """Compare SwarmKV with llama.cpp's tool at several batch sizes; 0 when all agree."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", type=Path, default=ROOT / "vendor" / "llama.cpp" / "SECURITY.md")
    ap.add_argument("--doc-tokens", type=int, default=751 - 20)
    ap.add_argument("-n", "--n-predict", type=int, default=24)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    if not TOOL.is_file():
        sys.exit(f"{TOOL} not found: run TARGET=llama-completion bash bench/build_llama_server.sh")
    with sk.Model(sk.default_model_path()) as model:
        doc = document(model, args.doc_tokens, args.doc)
    ours = swarmkv_answer(doc, args.n_predict, args.threads).rstrip("\n")
    print(f"swarmkv run --exact: {ours!r}")
    ok = True
    for batch, ubatch in SPLITS:
        theirs = tool_answer(doc + QUESTION, args.n_predict, args.threads, batch, ubatch)
        same = theirs.removesuffix(" [end of text]") == ours  # said when it stopped early
        ok &= same
        print(f"llama-completion -b {batch} -ub {ubatch}: {'same' if same else 'DIFFERENT'}"
              + ("" if same else f": {theirs!r}"))  # fmt: skip
    # the control: llama.cpp's own kernels at the same settings (differing here is expected)
    for batch, ubatch in SPLITS:
        plain = tool_answer(doc + QUESTION, args.n_predict, args.threads, batch, ubatch, False)
        print(f"control without the mode, -b {batch} -ub {ubatch}: "
              + ("same" if plain == ours else f"differs: {plain!r}"))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
