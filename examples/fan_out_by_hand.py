"""The paper's pipeline with only the low-level API: prefill once, fan out by copying bytes.

1. chunked prefill of the document on sequence 0, at absolute positions 0..P-1;
2. export sequence 0's KV state into a pool buffer (llama_state_seq_get_data_ext);
3. per branch: copy the bytes (copy-on-fork), restore them into a fresh context;
4. decode the branch's prompt at positions P, P+1, ... and generate greedily.
Each answer is checked against a context that decoded document + prompt itself.
"""

from __future__ import annotations

import numpy as np

import swarmkv as sk
from swarmkv.cli.demo_doc import DEMO_DOCUMENT, DEMO_QUESTIONS, demo_prompt

N_PREDICT = 16


def decode(ctx: sk.Context, tokens: list[int], pos0: int, seq_id: int = 0) -> None:
    """Decode tokens at positions pos0.. in n_batch chunks, logits for the last one only."""
    with sk.Batch(ctx.n_batch) as batch:
        for lo in range(0, len(tokens), ctx.n_batch):
            batch.clear()
            chunk = tokens[lo : lo + ctx.n_batch]
            batch.add_sequence(chunk, pos0 + lo, seq_id, logits_last=lo + len(chunk) == len(tokens))
            ctx.decode(batch)


def generate(ctx: sk.Context, pos: int, n: int) -> list[int]:
    """Greedy tokens after the last decode, each decoded at the next position."""
    out = []
    with sk.Batch(1) as batch:
        for _ in range(n):
            out.append(int(np.argmax(ctx.logits(-1))))
            batch.clear()
            batch.add(out[-1], pos, (0,), logits=True)
            ctx.decode(batch)
            pos += 1
    return out


with sk.Model(sk.default_model_path()) as model, sk.HostBufferPool() as pool:
    config = sk.ContextConfig(n_ctx=1280, n_batch=256)
    doc = model.tokenize(DEMO_DOCUMENT)  # with BOS
    with sk.Context(model, config) as ctx:
        decode(ctx, doc, 0)
        snap = sk.capture(ctx, 0, pool, tuple(doc))  # the one prefill, now host bytes
    print(
        f"prefilled {len(doc)} tokens once; snapshot {snap.nbytes / 2**20:.1f} MiB in {pool.kind}"
    )
    for name, question in DEMO_QUESTIONS:
        prompt = model.tokenize(demo_prompt(question), add_special=False)
        own = snap.fork(pool)  # this branch's private copy of the bytes
        with sk.Context(model, config) as branch:
            sk.restore(branch, 0, own)
            decode(branch, prompt, pos0=len(doc))  # positions continue after the document
            tokens = generate(branch, len(doc) + len(prompt), N_PREDICT)
        own.release()
        with sk.Context(model, config) as fresh:  # the reference: no snapshot at all
            decode(fresh, doc, 0)
            decode(fresh, prompt, len(doc))
            expected = generate(fresh, len(doc) + len(prompt), N_PREDICT)
        text = model.detokenize(tokens).strip().splitlines()[0]
        print(f"{name}: {text!r} identical to a fresh prefill: {tokens == expected}")
    snap.release()
