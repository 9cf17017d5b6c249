"""Prefill a document once and capture its KV state as a KVSnapshot (`swarmkv snapshot create`).

The capturing context has one sequence and one KV stream, the layout host and fork contexts
restore into, and the pipeline's own settings, so the snapshot serves its runs exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..kv.snapshot import KVSnapshot, capture
from ..llama.budget import DEFAULT_HEADROOM, round_ctx
from ..llama.config import ContextConfig
from ..llama.context import Context
from ..llama.model import Model
from ..llama.pool import HostBufferPool
from .sequence import chunk_bounds
from .single import prefill


def snapshot_tokens(
    model: Model,
    base: ContextConfig,
    tokens: Sequence[int],
    pool: HostBufferPool,
    progress: Callable[[int, int], None] | None = None,
    check: Callable[[], None] | None = None,
) -> KVSnapshot:
    """Decode tokens on seq 0 of a fresh context (n_batch chunks, absolute positions) and
    capture them (exact flags); the snapshot's capture_ms covers prefill and capture.
    check() runs between chunks and may raise to stop (Ctrl-C: process.interrupt.check)."""
    t0 = time.perf_counter_ns()
    n = len(tokens)
    config = replace(base, n_ctx=round_ctx(n + DEFAULT_HEADROOM), n_seq_max=1, kv_unified=False)
    with Context(model, config) as ctx:

        def on_progress(hi: int) -> None:
            if progress is not None:
                progress(hi, n)

        prefill(ctx, tokens, chunk_bounds(n, config.n_batch), on_progress=on_progress, check=check)
        snap = capture(ctx, 0, pool, tuple(tokens))
    snap.capture_ms = (time.perf_counter_ns() - t0) / 1e6
    return snap
