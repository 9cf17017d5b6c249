"""Why branch positions must continue the prefix, and what you get when they restart at 0.

A branch's prompt must be decoded at positions P, P+1, ... after a P-token document: the
rotary position embedding (RoPE) of every token encodes where it sits. Decoding it at 0:
1. onto the restored document: SwarmKV refuses before llama.cpp sees it (and llama.cpp
   refuses it too), so the mistake cannot silently happen here;
2. on a sequence that does not hold the document (how the mistake looks when a branch
   "starts fresh" at 0): the model answers without the document, and the answer shows it.
"""

from __future__ import annotations

import numpy as np

import swarmkv as sk
from swarmkv.cli.demo_doc import DEMO_DOCUMENT, DEMO_QUESTIONS, demo_prompt

N_PREDICT = 16


def answer(ctx: sk.Context, seq: int, prompt: list[int], pos: int) -> tuple[str, np.ndarray]:
    """Decode prompt on seq from pos, then greedy tokens; the text and first-step logits."""
    tokens: list[int] = []
    with sk.Batch(len(prompt), 2) as batch:
        batch.add_sequence(prompt, pos, seq)
        ctx.decode(batch)
        first = ctx.logits(-1).copy()
        pos += len(prompt)
        for _ in range(N_PREDICT):
            tokens.append(int(np.argmax(ctx.logits(-1))))
            batch.clear()
            batch.add(tokens[-1], pos, (seq,), logits=True)
            ctx.decode(batch)
            pos += 1
    text = ctx.model.detokenize(tokens).strip().splitlines()
    return (text[0] if text else ""), first


with sk.Model(sk.default_model_path()) as model, sk.HostBufferPool() as pool:
    doc = model.tokenize(DEMO_DOCUMENT)
    prompt = model.tokenize(demo_prompt(DEMO_QUESTIONS[0][1]), add_special=False)
    with sk.Context(model, n_ctx=2560, n_batch=2048, n_seq_max=2, kv_unified=True) as ctx:
        with sk.Batch(len(doc)) as batch:
            batch.add_sequence(doc, 0, 0, logits_last=False)
            ctx.decode(batch)
        snap = sk.capture(ctx, 0, pool, tuple(doc))
        sk.restore(ctx, 1, snap)
        right, right_logits = answer(ctx, 1, prompt, len(doc))
        print(f"question: {DEMO_QUESTIONS[0][1]}")
        print(f"prompt at positions {len(doc)}.. (after the document): {right!r}")
        sk.restore(ctx, 1, snap)
        try:
            answer(ctx, 1, prompt, 0)
        except sk.BatchError as exc:
            print(f"prompt at 0 onto the restored document: refused: {exc}")
        ctx.seq_rm(1)  # the branch sequence without the document's cells
        wrong, wrong_logits = answer(ctx, 1, prompt, 0)
        print(f"prompt at 0 on a sequence without the document: {wrong!r}")
        drift = float(np.sum((wrong_logits - right_logits) ** 2) / np.sum(right_logits**2))
        print(f"first-token logits differ by NMSE {drift:.3g} (identical would be 0)")
    snap.release()
