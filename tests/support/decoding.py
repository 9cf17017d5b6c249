"""The tests' one chunked-prefill loop, and greedy continuation at explicit positions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import swarmkv as sk
from swarmkv.engine.sequence import chunk_bounds
from swarmkv.llama.batch import Batch, Sampler


def prefill(
    ctx: sk.Context,
    tokens: Sequence[int],
    *,
    seq_id: int = 0,
    pos0: int | None = None,
    n_batch: int | None = None,
    logits_last: bool = True,
) -> int:
    """Decode tokens into seq_id in chunks of n_batch (default: ctx.n_batch), at positions
    continuing the sequence (or from pos0), cut where the pipeline's shared prefill cuts them
    (`chunk_bounds`), so a test decodes with the batch shapes of a real run.

    With logits_last (the default) the last token's logits are kept: returns its batch row,
    valid for ctx.logits until the next decode. Otherwise returns -1.
    """
    n_batch = n_batch or ctx.n_batch
    start = ctx.seq_len(seq_id) if pos0 is None else pos0
    row = -1
    with Batch(n_batch, ctx.n_seq_max) as batch:
        for lo, hi in chunk_bounds(len(tokens), n_batch):
            batch.clear()
            last = logits_last and hi == len(tokens)
            row = batch.add_sequence(list(tokens[lo:hi]), start + lo, seq_id, last)
            ctx.decode(batch)
    return row if logits_last else -1


def continue_greedy(
    ctx: sk.Context, seq_id: int, suffix: list[int], pos0: int, n: int = 32
) -> tuple[list[int], list[np.ndarray]]:
    """Decode suffix at pos0.., then greedy-generate n tokens; returns tokens and step logits."""
    out: list[int] = []
    logits: list[np.ndarray] = []
    with Batch(max(len(suffix), 1)) as batch, Sampler() as sampler:
        batch.add_sequence(suffix, pos0, seq_id, logits_last=True)
        ctx.decode(batch)
        pos, row = pos0 + len(suffix), batch.n_tokens - 1
        for _ in range(n):
            logits.append(ctx.logits(row).copy())
            tok = sampler.sample(ctx, row)
            out.append(tok)
            batch.clear()
            row = batch.add(tok, pos, (seq_id,), True)
            ctx.decode(batch)
            pos += 1
    return out, logits
