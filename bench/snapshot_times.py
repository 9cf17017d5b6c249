#!/usr/bin/env python3
"""What a snapshot file costs: size, and create/save/load/open_shared/restore times.

For a document of --doc-tokens tokens (the benchmark's fox document by default) on the
default model, batch-invariant (what `swarmkv run` uses): one warm-up, then --trials measured
trials of each step, median [min-max] in milliseconds; and a restore's exactness checked
(the first greedy token and its logits after a restore equal those of the context that
prefilled the document). Run it on an idle machine.

    python bench/snapshot_times.py --trials 3 -o bench/results/snapshot-times.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv_bench.provenance import write_result
from swarmkv_bench.workload import document

PROMPT = "\n\nQuestion: What is this document about?\nAnswer:"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(milliseconds, result) of one call."""
    t = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t) / 1e6, out


def first_logits(ctx: sk.Context, model: sk.Model, n_doc: int) -> np.ndarray:
    """Logits after the prompt, continuing the document in seq 0 of ctx."""
    prompt = model.tokenize(PROMPT, add_special=False)
    with sk.Batch(512) as batch:
        batch.add_sequence(prompt, n_doc, 0)
        ctx.decode(batch)
        return ctx.logits(batch.n_tokens - 1).copy()


def trial(pipe: Pipeline, folder: Path, pool: sk.HostBufferPool) -> dict[str, Any]:
    """One pass over every step; the snapshot's context is the pipeline's own config."""
    path = folder / "doc.swkv"
    create_ms, snap = timed(pipe.snapshot)
    save_ms, _ = timed(lambda: snap.save(path))
    load_ms, loaded = timed(lambda: sk.KVSnapshot.load(path, pool))
    shared_ms, shared = timed(lambda: sk.KVSnapshot.open_shared(path))
    config = sk.ContextConfig(n_ctx=snap.n_tokens + 256, n_batch=512, batch_invariant=True)
    out: dict[str, Any] = {
        "tokens": snap.n_tokens,
        "state_bytes": snap.nbytes,
        "file_bytes": path.stat().st_size,
        "create_ms": create_ms,
        "save_ms": save_ms,
        "load_ms": load_ms,
        "open_shared_ms": shared_ms,
    }
    logits = []
    for name, s in (("restore_ms", loaded), ("restore_shared_ms", shared)):
        with sk.Context(pipe.model, config) as ctx:
            out[name] = sk.restore(ctx, 0, s)
            logits.append(first_logits(ctx, pipe.model, s.n_tokens))
    with sk.Context(pipe.model, config) as ctx, sk.Batch(512) as batch:  # the reference
        toks = list(snap.tokens)
        for lo in range(0, len(toks), 512):
            batch.clear()
            batch.add_sequence(toks[lo : lo + 512], lo, 0, logits_last=False)
            ctx.decode(batch)
        ref = first_logits(ctx, pipe.model, len(toks))
    out["restore_exact"] = all(np.array_equal(x, ref) for x in logits)
    for s in (snap, loaded, shared):
        s.release()
    return out


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Median [min, max] of every timing; sizes and exactness as measured."""
    out: dict[str, Any] = {k: trials[0][k] for k in ("tokens", "state_bytes", "file_bytes")}
    out["restore_exact"] = all(t["restore_exact"] for t in trials)
    for key in [k for k in trials[0] if k.endswith("_ms")]:
        out[key] = spread([t[key] for t in trials], 2)
    return out


def spread(values: list[float], digits: int) -> list[float]:
    """[median, min, max], rounded: how measuring.md quotes a timing."""
    return [round(v, digits) for v in (statistics.median(values), min(values), max(values))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    with Pipeline(n_threads=args.threads) as pipe, sk.HostBufferPool() as pool:
        pipe.prefill("doc", text=document(pipe.model, args.doc_tokens))
        with tempfile.TemporaryDirectory() as tmp:
            trial(pipe, Path(tmp), pool)  # warm-up
            trials = [trial(pipe, Path(tmp), pool) for _ in range(args.trials)]
    result = {"trials": trials, "summary": summary(trials)}
    s = result["summary"]
    for key, value in s.items():
        shown = f"{value[0]} [{value[1]}-{value[2]}]" if isinstance(value, list) else value
        print(f"{key:<20} {shown}")
    if args.out:
        write_result(args.out, result, sk.default_model_path())


if __name__ == "__main__":
    main()
