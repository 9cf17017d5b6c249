"""Low-level decoding helpers for the real-model tests (explicit positions and seq ids)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import swarmkv as sk
from swarmkv.batch import Batch, Sampler
from swarmkv.decoding import chunk_bounds, prefill_chunks

REPO = Path(__file__).resolve().parents[2]
# Natural English prose from the pinned llama.cpp tree (present after any build of swarmkv).
DOC_SOURCE = REPO / "vendor" / "llama.cpp" / "SECURITY.md"


def prefill(ctx: sk.Context, tokens: list[int], seq_id: int = 0, n_batch: int = 512) -> None:
    with Batch(n_batch) as batch:
        prefill_chunks(ctx, tokens, seq_id, chunk_bounds(len(tokens), n_batch), batch)


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


def document(model: sk.Model, n_tokens: int) -> str:
    """The first n_tokens tokens of DOC_SOURCE as text: it ends mid-sentence."""
    text = DOC_SOURCE.read_text(encoding="utf-8")
    tokens = model.tokenize(text, add_special=False)
    assert len(tokens) >= n_tokens, f"{DOC_SOURCE} has only {len(tokens)} tokens"
    return model.detokenize(tokens[:n_tokens])
