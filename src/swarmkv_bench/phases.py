"""The decode phases the kernel studies time: a document's chunked prefill, and generation
steps of N branches forked from it, the way `fork` decodes them (bench/profile_step.py,
bench/exact_floor.py)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import swarmkv as sk
from swarmkv.engine.sequence import chunk_bounds
from swarmkv.engine.single import prefill as engine_prefill
from swarmkv.llama.batch import Batch
from swarmkv.llama.config import ContextConfig
from swarmkv.llama.context import Context
from swarmkv.llama.kernel_switches import Switches


def open_context(
    model: sk.Model,
    n_doc: int,
    n: int,
    steps: int,
    exact: bool,
    switches: Switches = (),
    profiled_runs: int = 0,
) -> Context:
    """A unified-KV context with room for the document and n branches of steps + 1 tokens per
    step phase (a warm-up and `steps` timed runs), and `profiled_runs` more when profiled."""
    n_ctx = n_doc + n * (2 * steps + profiled_runs + 8) + 256
    cfg = ContextConfig(
        n_ctx=n_ctx,
        n_seq_max=n + 1,
        kv_unified=True,
        batch_invariant=exact,
        flash_attn="on",
        kernel_switches=switches,
    )
    return Context(model, cfg)


def prefill(ctx: Context, tokens: list[int], batch: Batch) -> list[float]:
    """Decode tokens on seq 0 in n_batch chunks as the pipeline does (the engine's prefill);
    ms of each chunk."""
    marks = [time.perf_counter_ns()]
    bounds = chunk_bounds(len(tokens), ctx.n_batch)
    engine_prefill(
        ctx, tokens, bounds, on_progress=lambda _hi: marks.append(time.perf_counter_ns())
    )
    return [(b - a) / 1e6 for a, b in itertools.pairwise(marks)]


def step_runner(ctx: Context, batch: Batch, seqs: list[int], start: int) -> Callable[[], float]:
    """A function that decodes one generation step for seqs (one token each, continuing their
    positions) and returns its ms."""
    pos = {s: start for s in seqs}

    def step() -> float:
        batch.clear()
        for s in seqs:
            batch.add(1000 + s, pos[s], (s,), True)
            pos[s] += 1
        t = time.perf_counter_ns()
        ctx.decode(batch)
        return (time.perf_counter_ns() - t) / 1e6

    return step
