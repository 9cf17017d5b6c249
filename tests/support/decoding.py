"""The tests' decoding, through the library's engine (engine/single.py): a chunked prefill at
explicit positions, and greedy continuation with every step's logits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import swarmkv as sk
from swarmkv.engine.sequence import chunk_bounds
from swarmkv.engine.single import decode_branch
from swarmkv.engine.single import prefill as engine_prefill
from swarmkv.engine.work import Request
from swarmkv.llama.sampling import SamplerConfig


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
    bounds = [(lo + start, hi + start) for lo, hi in chunk_bounds(len(tokens), n_batch)]
    # the engine places token k at position k: the positions before start are never decoded
    doc = engine_prefill(
        ctx, [0] * start + list(tokens), bounds, seq_id=seq_id, done=start, logits_last=logits_last
    )
    return doc.last_row if logits_last else -1


def continue_greedy(
    ctx: sk.Context, seq_id: int, suffix: list[int], pos0: int, n: int = 32
) -> tuple[list[int], list[np.ndarray]]:
    """Decode suffix at pos0.., then greedy-generate up to n tokens (fewer at an end of
    generation); returns the tokens and every step's logits. The sequence's cells are freed
    at the end, as a finished branch's are."""
    req = Request("continue", list(suffix), n, SamplerConfig(), pos0, seq_id=seq_id)
    req.keep_logits = "all"
    decode_branch(ctx, req)
    st = req.state
    assert st is not None
    if st.error is not None:
        raise st.error
    return list(st.tokens), list(st.step_logits)
