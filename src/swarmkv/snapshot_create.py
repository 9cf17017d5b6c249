"""Prefill a document once and capture its KV state as a KVSnapshot (`swarmkv snapshot create`).

The capturing context has one sequence and one KV stream, the layout host and fork contexts
restore into, and the pipeline's own settings, so the snapshot serves its runs exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from .batch import Batch
from .budget import DEFAULT_HEADROOM, round_ctx
from .context import Context
from .context_config import ContextConfig
from .decoding import chunk_bounds, prefill_chunks
from .model import Model
from .pool import HostBufferPool
from .snapshot import KVSnapshot, capture


def snapshot_tokens(
    model: Model,
    base: ContextConfig,
    tokens: Sequence[int],
    pool: HostBufferPool,
    progress: Callable[[int, int], None] | None = None,
) -> KVSnapshot:
    """Decode tokens on seq 0 of a fresh context (n_batch chunks, absolute positions) and
    capture them (exact flags); the snapshot's capture_ms covers prefill and capture."""
    t0 = time.perf_counter_ns()
    n = len(tokens)
    config = replace(base, n_ctx=round_ctx(n + DEFAULT_HEADROOM), n_seq_max=1, kv_unified=False)
    with Context(model, config) as ctx, Batch(config.n_batch) as batch:

        def on_chunk(hi: int) -> None:
            if progress is not None:
                progress(hi, n)

        prefill_chunks(ctx, tokens, 0, chunk_bounds(n, config.n_batch), batch, on_chunk)
        snap = capture(ctx, 0, pool, tuple(tokens))
    snap.capture_ms = (time.perf_counter_ns() - t0) / 1e6
    return snap
