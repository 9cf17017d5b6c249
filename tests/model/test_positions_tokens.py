"""Positions and tokenization: what the fidelity checks would catch, and how to write prompts."""

from __future__ import annotations

import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv._native import lib
from swarmkv.errors import BatchError
from swarmkv.llama.batch import Batch
from swarmkv.pipeline.fidelity import NMSE_LIMIT, compare, nmse

from support.decoding import continue_greedy, prefill
from support.realmodel import document

PROMPT = "\n\nQuestion: What is this document about?\nAnswer:"


def test_branch_positions_must_continue_the_prefix(model: sk.Model) -> None:
    """Starting a branch at position 0 instead of the prefix length is caught three ways:
    our batch check, llama.cpp's own check, and (on a sequence that lacks the prefix, the
    form the mistake takes when positions restart) logits far from the baseline's."""
    doc = model.tokenize(document(model, 700))
    prompt = model.tokenize(PROMPT, add_special=False)
    with (
        sk.HostBufferPool() as pool,
        sk.Context(model, n_ctx=2048, n_seq_max=2, kv_unified=True) as ctx,
    ):
        prefill(ctx, doc, logits_last=False)
        snap = sk.capture(ctx, 0, pool, tuple(doc))
        _, right = continue_greedy(ctx, 0, prompt, len(doc), n=1)
        sk.restore(ctx, 1, snap)
        with Batch(len(prompt)) as batch:
            batch.add_sequence(prompt, 0, 1)
            with pytest.raises(BatchError, match="position gap in seq 1"):
                ctx.decode(batch)
            assert lib.llama_decode(ctx.ptr, batch.raw) == -1  # llama.cpp refuses it too
        ctx.seq_rm(1)
        _, wrong = continue_greedy(ctx, 1, prompt, 0, n=1)
    drift = nmse(wrong[0], right[0])
    print(f"\n[positions] prompt at 0 without the prefix: NMSE {drift:.3g}")
    assert drift > 1e-2 > NMSE_LIMIT


@pytest.mark.slow
def test_separate_tokenization_equals_concatenation_at_boundaries(model: sk.Model) -> None:
    """Document with BOS then prompt without: equal to tokenizing the whole text when the
    prompt starts with a newline or space; a prompt glued to a word is tokenized otherwise."""
    doc = document(model, 300)
    for prompt in ("\n\nSummarize:", " and then", "\nQ: why?"):
        joined = model.tokenize(doc + prompt)
        split = model.tokenize(doc) + model.tokenize(prompt, add_special=False)
        assert split == joined, repr(prompt)
    glued_doc = doc.rstrip() + " the"
    assert model.tokenize(glued_doc) + model.tokenize(
        "refore", add_special=False
    ) != model.tokenize(glued_doc + "refore")


@pytest.mark.slow
def test_one_pass_concatenation_gives_the_same_tokens_and_logits(exact_model: sk.Model) -> None:
    """Against `document + prompt` tokenized and decoded in one pass with llama.cpp's default
    ubatch of 512 (so cut at other places than the document's chunks and the prompt), a
    batch-invariant run must give the same tokens and the same logits at every step: this is
    what llama.cpp's own tools built from our tree compute with LLAMA_BATCH_INVARIANT=1."""
    doc = document(exact_model, 1500)
    with Pipeline(exact_model, exact=True) as p:
        p.prefill("doc", text=doc).branch("q", prompt=PROMPT, n_predict=32)
        host = p.run(mode="host", keep_logits="all")["q"]
    tokens = exact_model.tokenize(doc + PROMPT)
    with sk.Context(
        exact_model, n_ctx=2048, n_batch=2048, n_ubatch=512, batch_invariant=True
    ) as ctx:
        got, logits = continue_greedy(ctx, 0, tokens, 0, n=len(host.tokens))
    fid = compare(list(host.tokens), got, host.step_logits, logits, exact=True)
    print(f"\n[one-pass, exact] {fid.describe()}")
    assert fid.ok, fid.describe()
