"""Batch-invariant contexts keep each sequence's KV cells in position order (patch 0007).

Batch-invariant attention sums a row's cells in cell order, and a context of a sequence's
own holds its positions in increasing cell order. In a shared cache, removed sequences leave
holes, and llama.cpp's slot search starts from the front once enough cells are free: a live
sequence's next token then landed in a hole below its earlier cells, attention summed in
another order, and its logits differed from its own context's (found by the swarm scheduler:
max |diff| 0.6-0.9 on the real model). Here branches fork a prefix, some are removed, a new
one is admitted into the holes, and every row must equal its context-of-its-own logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from swarmkv import Batch, Context, Model

N_DOC = 40


def _alone(model: Model, tokens: Sequence[int]) -> list[np.ndarray]:
    """Logits of every position of tokens, decoded one at a time in a context of their own."""
    out = []
    cfg = {"n_ctx": 256, "n_batch": 64, "n_threads": 1, "batch_invariant": True}
    with Context(model, **cfg) as ctx, Batch(64) as b:
        b.add_sequence(list(tokens[:N_DOC]), 0, 0, logits_last=True)
        ctx.decode(b)
        out.append(ctx.logits(b.n_tokens - 1).copy())
        for pos in range(N_DOC, len(tokens)):
            b.clear()
            b.add(tokens[pos], pos, (0,), True)
            ctx.decode(b)
            out.append(ctx.logits(0).copy())
    return out


def test_rows_after_holes_equal_their_own_context(
    tiny_model: Model, prompt_tokens: list[int]
) -> None:
    doc = prompt_tokens[:N_DOC]
    own = {s: list(doc) for s in range(1, 8)}  # each branch: doc, then its own tokens
    got: dict[int, list[tuple[int, np.ndarray]]] = {s: [] for s in own}  # (pos, logits)
    cfg = {"n_ctx": 512, "n_batch": 128, "n_seq_max": 8, "kv_unified": True}
    with Context(tiny_model, n_threads=1, batch_invariant=True, **cfg) as ctx, Batch(128) as b:
        b.add_sequence(doc, 0, 0, logits_last=False)
        ctx.decode(b)

        def step(seqs: list[int], n_new: int) -> None:
            b.clear()
            rows = []
            for s in seqs:
                for k in range(n_new):
                    pos = len(own[s])
                    own[s].append(prompt_tokens[(N_DOC + 17 * s + pos) % len(prompt_tokens)])
                    if k == n_new - 1:
                        rows.append((s, pos, b.add(own[s][-1], pos, (s,), True)))
                    else:
                        b.add(own[s][-1], pos, (s,))
            ctx.decode(b)
            for s, pos, row in rows:
                got[s].append((pos, ctx.logits(row).copy()))

        for s in range(1, 7):
            ctx.seq_cp(0, s, 0, N_DOC)
        step([1, 2, 3, 4, 5, 6], 12)  # prompts
        for _ in range(4):
            step([1, 2, 3, 4, 5, 6], 1)
        for s in (1, 2, 3):  # finished: their cells become holes below those of 4..6
            ctx.seq_rm(s)
        ctx.seq_cp(0, 7, 0, N_DOC)
        step([4, 5, 6, 7], 1)
        step([7], 11)  # 7's prompt goes into the holes; 4..6 must still go after their own
        for _ in range(4):
            step([4, 5, 6, 7], 1)
    for s in (4, 5, 6, 7):
        ref = _alone(tiny_model, own[s])  # ref[j]: logits at position N_DOC - 1 + j
        for pos, logits in got[s]:
            assert np.array_equal(logits, ref[pos - N_DOC + 1]), f"seq {s} at pos {pos}"


def test_a_full_tail_is_compacted_in_order_not_filled_out_of_order(
    tiny_model: Model, prompt_tokens: list[int]
) -> None:
    """Holes below a live sequence's last cell and no free cell after it: the cache closes the
    holes (every cell keeping its order) before it places the next token, which used to land
    in a hole below its sequence's cells and give other logits than a context of its own."""
    doc = prompt_tokens[:N_DOC]
    own = {s: list(doc) for s in (1, 2)}
    got: list[tuple[int, np.ndarray]] = []
    cfg = {"n_ctx": 256, "n_batch": 128, "n_seq_max": 4, "kv_unified": True}
    with Context(tiny_model, n_threads=1, batch_invariant=True, **cfg) as ctx, Batch(128) as b:
        assert ctx.n_ctx == 256
        b.add_sequence(doc, 0, 0, logits_last=False)
        ctx.decode(b)

        def extend(s: int, n: int, keep: bool) -> None:
            b.clear()
            for k in range(n):
                pos = len(own[s])
                own[s].append(prompt_tokens[(N_DOC + 7 * s + pos) % len(prompt_tokens)])
                b.add(own[s][-1], pos, (s,), keep and k == n - 1)
            ctx.decode(b)
            if keep:
                got.append((pos, ctx.logits(b.n_tokens - 1).copy()))

        for s in (1, 2):
            ctx.seq_cp(0, s, 0, N_DOC)
        extend(1, 100, keep=False)  # cells 40-139
        extend(2, 100, keep=True)  # cells 140-239
        ctx.seq_rm(1)  # a hole of 100 cells below all of 2's; 16 free after its last
        for _ in range(30):  # past the 16: the cache must compact to keep 2's order
            extend(2, 1, keep=True)
    ref = _alone(tiny_model, own[2])  # ref[j]: logits at position N_DOC - 1 + j
    for pos, logits in got:
        assert np.array_equal(logits, ref[pos - N_DOC + 1]), f"position {pos}"
