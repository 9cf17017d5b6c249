"""Zero-copy fan-out inside one context: llama_memory_seq_cp, then one batch for all branches.

The document is decoded once on sequence 0 of a context with a unified KV cache. Each branch
gets its own sequence id; seq_cp makes it share the document's cells (no bytes copied). Every
generation step then decodes the next token of every branch in one llama_batch: row i holds
branch i's token, at that branch's own next position, tagged with its sequence id.
"""

from __future__ import annotations

import numpy as np

import swarmkv as sk
from swarmkv.cli.demo_doc import DEMO_DOCUMENT, demo_prompt

QUESTIONS = [
    "How high did the tide peak during the storm of 14 February?",
    "What went wrong at the Quay Lane pumping station during the storm?",
    "How many people live in Port Alder?",
]
N_PREDICT = 16

with sk.Model(sk.default_model_path()) as model:
    n_seq = len(QUESTIONS) + 1
    config = sk.ContextConfig(n_ctx=2048, n_batch=256, n_seq_max=n_seq, kv_unified=True)
    doc = model.tokenize(DEMO_DOCUMENT)
    prompts = [model.tokenize(demo_prompt(q), add_special=False) for q in QUESTIONS]
    with sk.Context(model, config) as ctx, sk.Batch(256, n_seq) as batch:
        for lo in range(0, len(doc), 256):  # the document, once, on seq 0
            batch.clear()
            batch.add_sequence(doc[lo : lo + 256], lo, 0, logits_last=False)
            ctx.decode(batch)
        for seq in range(1, n_seq):
            ctx.seq_cp(0, seq, 0, len(doc))  # branch seq shares cells [0, len(doc))
        batch.clear()  # every prompt in one batch, each at positions len(doc)...
        rows = [batch.add_sequence(p, len(doc), seq) for seq, p in enumerate(prompts, 1)]
        ctx.decode(batch)
        pos = [len(doc) + len(p) for p in prompts]
        answers: list[list[int]] = [[] for _ in QUESTIONS]
        for _ in range(N_PREDICT):
            batch.clear()
            for i, row in enumerate(rows):
                answers[i].append(int(np.argmax(ctx.logits(row))))
            rows = [batch.add(a[-1], pos[i], (i + 1,), logits=True) for i, a in enumerate(answers)]
            ctx.decode(batch)  # one llama_decode for all branches
            pos = [p + 1 for p in pos]
        print(f"document: {len(doc)} tokens, decoded once; {len(QUESTIONS)} branches")
        print(f"KV cells used: seq 0 holds {ctx.seq_len(0)}, branch 1 ends at {pos[0]}")
        for q, a in zip(QUESTIONS, answers, strict=True):
            print(f"{q}\n  -> {model.detokenize(a).strip().splitlines()[0]!r}")
