"""64 branches of one document in fork and in host mode on the real model, with fidelity.

Pipeline(exact=True), the default, runs every context batch-invariant: each branch must
produce the tokens and every step's logits of the baseline (a context of its own that
prefilled the document and the prompt), bit for bit, however many branches share the run.
The baseline runs all 64 branches too (about 64 x 300 prefill tokens, which stays cheap), so
every branch is checked, not a sample. Timings are printed; run with -s to see them.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.pipeline.results import PipelineResult

pytestmark = pytest.mark.slow  # the slow tier: many-branch runs

N_BRANCHES = 64
N_PREDICT = 5
# Stems of different lengths: the 64 prompts differ in text and in token count, so the fork's
# batches are ragged and no two branches could share an answer by construction.
STEMS = (
    "What is this document about?",
    "Who should be contacted?",
    "Summarize the text above in one sentence:",
    "What comes next?",
    "Which word appears most often?",
    "Is anything in the text above unclear, and if so what?",
    "Name one rule.",
    "Translate the first sentence into French:",
)


def _prompt(i: int) -> str:
    return f"\n\nQuestion {i}: {STEMS[i % len(STEMS)]}\nAnswer:"


def _run(model: sk.Model, doc: str, mode: str) -> tuple[PipelineResult, float]:
    """One run of the 64-branch pipeline; returns the result and its wall time in seconds."""
    t = time.perf_counter()
    with Pipeline(model, exact=True) as p:
        p.prefill("doc", text=doc)
        for i in range(N_BRANCHES):
            p.branch(f"b{i:02d}", prompt=_prompt(i), n_predict=N_PREDICT)
        res = p.run(mode=mode, keep_logits="all")
    return res, time.perf_counter() - t


@pytest.fixture(scope="module")
def baseline(exact_model: sk.Model, doc_short: str) -> PipelineResult:
    res, wall = _run(exact_model, doc_short, "baseline")
    print(
        f"\n[64 branches] baseline: {res.prefix_tokens} prefix tokens, e2e {res.e2e_ms:.0f} ms, "
        f"wall {wall:.1f} s"
    )
    assert len(res.branches) == N_BRANCHES
    return res


@pytest.mark.parametrize("mode", ["fork", "host"])
def test_64_branches_equal_the_baseline_bit_for_bit(
    exact_model: sk.Model, doc_short: str, baseline: PipelineResult, mode: str
) -> None:
    """fork (one context, the 64 branches as sequences decoded together) and host (the
    prefix captured once, restored into a context per branch) complete every branch, and
    each branch's tokens and every step's logits equal its baseline's exactly."""
    res, wall = _run(exact_model, doc_short, mode)
    print(
        f"[64 branches] {mode}: prefill {res.prefill_ms:.0f} ms, e2e {res.e2e_ms:.0f} ms, "
        f"wall {wall:.1f} s (baseline e2e {baseline.e2e_ms:.0f} ms)"
    )
    assert res.ok
    assert set(res.branches) == set(baseline.branches)
    answers = set()
    for name, b in baseline.branches.items():
        got = res[name]
        assert len(b.tokens) == N_PREDICT, name  # no stop string: every branch runs to the end
        assert got.tokens == b.tokens, f"{mode}/{name}: {got.tokens} != {b.tokens}"
        assert len(got.step_logits) == len(b.step_logits) == N_PREDICT, name
        for k, (x, y) in enumerate(zip(got.step_logits, b.step_logits, strict=True)):
            assert np.array_equal(x, y), f"{mode}/{name} step {k}"
        answers.add(tuple(b.tokens))
    # the comparison is not vacuous: the branches do not all say the same thing
    assert len(answers) > 1
