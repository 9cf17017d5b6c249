"""Batch-invariant decoding on the real model (ContextConfig.batch_invariant, patch 0003).

With it on, a row's logits must be bit-identical whatever shares its ubatch, however the
input was cut into ubatches and wherever its KV cells sit; and the batched unified fork must
give the baseline's tokens and logits exactly, on documents shorter and longer than the
512-token sliding window. Without it the same comparisons differ (checked too, so the tests
can fail).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.pipeline.results import PipelineResult

from support.realmodel import document

N_BRANCHES = 32
N_STEPS = 32
SLOW = pytest.mark.slow


def _last_logits(
    model: sk.Model, tokens: Sequence[int], chunks: Sequence[int], n_ubatch: int, exact: bool
) -> np.ndarray:
    """Decode tokens in the given chunks (ubatches of n_ubatch); the last row's logits."""
    assert sum(chunks) == len(tokens)
    with (
        sk.Context(
            model, n_ctx=1024, n_batch=512, n_ubatch=n_ubatch, n_threads=2, batch_invariant=exact
        ) as ctx,
        sk.Batch(512) as batch,
    ):
        pos = 0
        for c in chunks:
            batch.clear()
            for i in range(pos, pos + c):
                batch.add(tokens[i], i, (0,), i == len(tokens) - 1)
            ctx.decode(batch)
            pos += c
        return ctx.logits(-1).copy()


SPLITS = [([300], 1), ([300], 2), ([300], 7), ([300], 32), ([300], 64), ([256, 44], 512),
          ([299, 1], 512), ([100, 100, 100], 512), ([1] * 20 + [280], 512)]  # fmt: skip


# weights as stored, and repacked: the repacked Q4_K weights (ffn_down, attn_output) go
# through CPU_REPACK's gemm in tiles of 4 rows in batch-invariant mode (patch 0011)
BOTH_LAYOUTS = pytest.mark.parametrize("fixture", ["exact_model", "repacked_model"])


def _model_and_tokens(request: pytest.FixtureRequest, fixture: str) -> tuple[sk.Model, list[int]]:
    model: sk.Model = request.getfixturevalue(fixture)
    return model, model.tokenize(document(model, 300), add_special=True)[:300]


@SLOW
@BOTH_LAYOUTS
def test_logits_do_not_depend_on_ubatch_size_or_prompt_split(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    model, tokens = _model_and_tokens(request, fixture)  # ubatches of 1, 2 and 7 rows padded
    ref = _last_logits(model, tokens, [300], 512, exact=True)
    for chunks, n_ubatch in SPLITS:
        got = _last_logits(model, tokens, chunks, n_ubatch, exact=True)
        assert np.array_equal(got, ref), f"chunks {chunks[:3]}.. ubatch {n_ubatch}"


@SLOW
@BOTH_LAYOUTS
def test_without_the_mode_the_same_splits_differ(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    # llama.cpp's own kernels (repacked weights, tiled matmul, sgemm only from 2 rows on,
    # split-KV flash attention) are what the mode replaces: without it, the logits really
    # depend on the split, with repacked weights and with weights as stored alike.
    model, tokens = _model_and_tokens(request, fixture)
    ref = _last_logits(model, tokens, [300], 512, exact=False)
    diffs = [
        float(np.abs(_last_logits(model, tokens, c, u, exact=False) - ref).max())
        for c, u in SPLITS[:6]
    ]
    assert max(diffs) > 0.0, diffs


def test_cells_interleaved_among_31_branches_give_the_same_logits(exact_model: sk.Model) -> None:
    """One branch alone (contiguous cells) vs the same branch stepping with 31 others."""
    doc = exact_model.tokenize(document(exact_model, 200), add_special=True)
    prompts = [exact_model.tokenize(f" Question {i}: what is it?", add_special=False) for i in
               range(N_BRANCHES)]  # fmt: skip
    cfg = dict(n_batch=512, n_threads=2, batch_invariant=True, kv_unified=True)

    def run(seqs: list[int]) -> list[np.ndarray]:
        out = []
        with (
            sk.Context(exact_model, n_ctx=2048, n_seq_max=N_BRANCHES, **cfg) as ctx,
            sk.Batch(512, 1) as batch,
        ):
            batch.add_sequence(doc, 0, 0)
            ctx.decode(batch)
            for s in seqs:
                if s:
                    ctx.seq_cp(0, s, 0, len(doc))
            batch.clear()  # every branch's prompt in one batch: their cells interleave
            last = {}
            for s in seqs:
                for k, t in enumerate(prompts[s]):
                    last[s] = batch.add(t, len(doc) + k, (s,), k == len(prompts[s]) - 1)
            ctx.decode(batch)
            out.append(ctx.logits(last[seqs[-1]]).copy())
            for step in range(3):  # then one-token steps, all branches together
                batch.clear()
                rows = {s: batch.add(7 + step, len(doc) + len(prompts[s]) + step, (s,), True)
                        for s in seqs}  # fmt: skip
                ctx.decode(batch)
                out.append(ctx.logits(rows[seqs[-1]]).copy())
        return out

    target = N_BRANCHES - 1
    alone = run([0] if target == 0 else [target])
    crowded = run(list(range(N_BRANCHES)))
    for k, (a, b) in enumerate(zip(alone, crowded, strict=True)):
        assert np.array_equal(a, b), f"step {k}: max |diff| {np.abs(a - b).max()}"


# (n_doc, n_branches) -> _steps of the baseline run: digests, not logits (1 GiB per run)
_BASELINES: dict[tuple[int, int], dict[str, tuple[list[int], list[bytes]]]] = {}


def _steps(result: PipelineResult) -> dict[str, tuple[list[int], list[bytes]]]:
    """Per branch: its tokens, and a digest of each step's logits (bit for bit)."""
    return {
        name: (b.tokens, [hashlib.blake2b(x.tobytes()).digest() for x in b.step_logits])
        for name, b in result.branches.items()
    }


def _pipeline_run(model: sk.Model, n_doc: int, n_branches: int, mode: str) -> PipelineResult:
    """n_branches questions after an n_doc-token document, N_STEPS tokens each, every step's
    logits kept."""
    with Pipeline(model, exact=True, n_threads=2) as p:
        p.prefill("doc", text=document(model, n_doc))
        for i in range(n_branches):
            p.branch(f"b{i}", prompt=f"\n\nQuestion {i}: what comes next?", n_predict=N_STEPS)
        return p.run(mode=mode, keep_logits="all")


@pytest.mark.parametrize(
    ("n_doc", "mode", "n_branches"),
    [
        # Inside the window the fast tier's smoke run takes 4 branches 32 steps, and
        # tests/model/test_many_branches.py 64 branches 5 steps (fork and host, every step's
        # logits); past it, 32 branches 32 steps below.
        pytest.param(300, "fork", 4, id="smoke-4-branches"),  # the fast tier's fork run
        pytest.param(700, "fork", N_BRANCHES, id="past-window", marks=SLOW),
        pytest.param(700, "device", N_BRANCHES, id="device-past-window", marks=SLOW),
    ],
)
def test_fork_equals_the_baseline_bit_for_bit(
    exact_model: sk.Model, n_doc: int, mode: str, n_branches: int
) -> None:
    """fork (shared cells) and device (the prefix restored on device into a stream per
    branch) against a context of their own per branch: every step's logits, bit for bit."""
    fork = _steps(_pipeline_run(exact_model, n_doc, n_branches, mode))
    key = (n_doc, n_branches)  # fork and device past the window share one baseline
    if key not in _BASELINES:
        _BASELINES[key] = _steps(_pipeline_run(exact_model, n_doc, n_branches, "baseline"))
    base = _BASELINES[key]
    assert fork.keys() == base.keys()
    for name, (tokens, digests) in base.items():
        assert fork[name][0] == tokens, name
        assert len(digests) == len(tokens)
        for k, (x, y) in enumerate(zip(fork[name][1], digests, strict=True)):
            assert x == y, f"{name} step {k}: the logits' bytes differ"
