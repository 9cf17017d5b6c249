"""Fidelity of every handoff mode against the baseline on the real model (measuring.md), with
llama.cpp's own kernels (exact=False): the judge's rules for modes that are not batch-invariant.

The document ends mid-sentence (it is cut by tokens) and one prompt starts without a space.
Numbers are printed; run with -s to see them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.pipeline.fidelity import NMSE_LIMIT, compare
from swarmkv.pipeline.handoff import ForkOptions
from swarmkv.pipeline.results import PipelineResult

PROMPTS = {
    "question": "\n\nQuestion: What should a reporter of a security issue do?\nAnswer:",
    "summary": "\n\nSummarize the text above in one sentence:",
    "continue": " and furthermore",
    "nospace": "Therefore, the most important point is",
}
N_PREDICT = 32


def _pipeline(model: sk.Model, doc: str, prompts: dict[str, str]) -> Pipeline:
    p = Pipeline(model, exact=False)
    p.prefill("doc", text=doc)
    for name, prompt in prompts.items():
        p.branch(name, prompt=prompt, n_predict=N_PREDICT)
    return p


def _report(
    mode: str, res: PipelineResult, base: PipelineResult, replay: PipelineResult | None = None
) -> dict[str, object]:
    out = {}
    for name, b in base.branches.items():
        o = res[name]
        again = replay[name].tokens if replay is not None else None
        fid = compare(o.tokens, b.tokens, o.step_logits, b.step_logits, replay_tokens=again)
        print(f"  [{mode}] {name}: {fid.describe()} ({len(b.tokens)} tokens)")
        out[name] = fid
    return out


@pytest.fixture(scope="module", params=["doc_short", "doc_long"])
def runs(request: pytest.FixtureRequest, model: sk.Model) -> Iterator[dict[str, PipelineResult]]:
    doc = request.getfixturevalue(request.param)
    with _pipeline(model, doc, PROMPTS) as p:
        out = {m: p.run(mode=m, keep_logits="all") for m in ("baseline", "host", "fork")}
    print(
        f"\n[{request.param}] {out['baseline'].prefix_tokens} prefix tokens; e2e ms: "
        + ", ".join(f"{m}={r.e2e_ms:.0f}" for m, r in out.items())
    )
    yield out


@pytest.mark.slow
def test_host_is_bit_exact(runs: dict[str, PipelineResult]) -> None:
    """host decodes each branch with the baseline's exact shapes: tokens and logits equal."""
    for name, fid in _report("host", runs["host"], runs["baseline"]).items():
        assert fid.tokens_equal, f"{name}: {fid.describe()}"
        assert fid.first_nmse is not None and fid.first_nmse <= NMSE_LIMIT, name


@pytest.mark.slow
def test_fork_tokens_match_or_diverge_only_at_near_ties(runs: dict[str, PipelineResult]) -> None:
    """fork batches 4 branches per decode, which changes kernel shapes: tokens must match;
    a divergence passes only where host (each branch alone, the baseline's shapes, the same
    restored KV state) reproduces the baseline and the top-2 gap is below 4 sd of the noise."""
    fids = _report("fork", runs["fork"], runs["baseline"], replay=runs["host"])
    for name, fid in fids.items():
        assert fid.ok, f"{name}: {fid.describe()}"


@pytest.mark.slow
def test_fork_streams_per_branch_is_bit_exact(model: sk.Model, doc_long: str) -> None:
    """Per-sequence KV streams and one decode per branch reproduce the baseline exactly,
    for all 4 branches at once (the exact fork option)."""
    fork_opts = ForkOptions(layout="streams", packing="per_branch")
    with _pipeline(model, doc_long, PROMPTS) as p:
        base = p.run(mode="baseline", keep_logits="all")
    with Pipeline(model, fork=fork_opts, exact=False) as p:
        p.prefill("doc", text=doc_long)
        for name, prompt in PROMPTS.items():
            p.branch(name, prompt=prompt, n_predict=N_PREDICT)
        fork = p.run(mode="fork", keep_logits="all")
    for name, fid in _report("fork-exact", fork, base).items():
        assert fid.tokens_equal, f"{name}: {fid.describe()}"
        assert fid.first_nmse == 0.0, name


@pytest.mark.slow
def test_every_branch_generated_tokens(runs: dict[str, PipelineResult]) -> None:
    for mode, res in runs.items():
        assert res.ok, mode
        assert res.prefill_ms > 0
        for b in res.branches.values():
            assert b.tokens, f"{mode}/{b.name} generated nothing"
            assert b.prefix_tokens == res.prefix_tokens


@pytest.mark.parametrize(
    "doc_fixture", ["doc_short", pytest.param("doc_long", marks=pytest.mark.slow)]
)
def test_fork_single_branch_is_bit_exact(
    model: sk.Model, doc_fixture: str, request: pytest.FixtureRequest
) -> None:
    doc = request.getfixturevalue(doc_fixture)
    with _pipeline(model, doc, {"question": PROMPTS["question"]}) as p:
        base = p.run(mode="baseline", keep_logits=True)
        fork = p.run(mode="fork", keep_logits=True)
    fid = _report("fork-1", fork, base)["question"]
    assert fid.tokens_equal
    assert fid.first_nmse == 0.0 or fid.first_nmse <= NMSE_LIMIT


@pytest.mark.slow
def test_watermark_branch_equals_baseline_of_its_prefix(model: sk.Model, doc_long: str) -> None:
    """A branch needing the first W tokens sees exactly those, starts before the prefill
    ends (host), and answers what a baseline that prefilled only W tokens answers."""
    w = 600
    p = Pipeline(model, exact=False)
    p.prefill("doc", text=doc_long)
    p.branch("early", prompt=PROMPTS["summary"], n_predict=16, required_prefix_tokens=w)
    p.branch("full", prompt=PROMPTS["question"], n_predict=16)
    with p:
        base = p.run(mode="baseline", keep_logits="all")
        host = p.run(mode="host", keep_logits="all")
        fork = p.run(mode="fork", keep_logits="all")
    assert base["early"].prefix_tokens == w == host["early"].prefix_tokens
    for mode, res in (("host", host), ("fork", fork)):
        fids = _report(mode, res, base, replay=host)
        assert all(f.ok for f in fids.values()), mode
    assert _report("host", host, base)["early"].tokens_equal
    early = host["early"]
    ready_ms = early.first_token_ms - early.activation_ms
    assert ready_ms < host.prefill_ms, "the watermark branch did not start before prefill ended"


@pytest.mark.slow
def test_fork_refuses_swa_window_on_gemma(model: sk.Model, doc_short: str) -> None:
    with Pipeline(model, swa_full=False, exact=False) as p:
        p.prefill("doc", text=doc_short).branch("q", prompt=PROMPTS["question"], n_predict=4)
        with pytest.raises(sk.ConfigError, match="swa_full=True"):
            p.run(mode="fork")
        assert p.run(mode="host").ok  # host mode works with the window-sized cache
