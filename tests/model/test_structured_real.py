"""Constrained branches on the real model: outputs always match their constraint, a GBNF
grammar through llama.cpp's sampler decodes what its llguidance twin decodes, and 32
constrained fork branches equal the constrained baseline bit for bit (tokens and every
step's masked logits)."""

from __future__ import annotations

import hashlib
import json
import re

import jsonschema
import pytest

import swarmkv as sk
from swarmkv import Constraint, Pipeline
from swarmkv.pipeline.results import PipelineResult
from swarmkv_bench.field_schemas import field_prompt, field_schema

from support.realmodel import document

DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
LABELS = ["approved", "rejected", "needs review"]


def _run(
    model: sk.Model, doc: str, branches: list[dict], mode: str = "fork", **kw
) -> PipelineResult:
    with Pipeline(model, exact=True, n_threads=2) as p:
        p.prefill("doc", text=doc)
        for b in branches:
            p.branch(**b)
        return p.run(mode=mode, **kw)


def test_regex_and_choice_outputs_always_match(model: sk.Model) -> None:
    doc = document(model, 120)
    branches = []
    for seed in range(4):  # greedy, then sampled hot enough to wander
        t = 0.0 if seed == 0 else 1.5
        for name, prompt, n, c in (
            ("date", "\nA date in ISO form: ", 16, Constraint.regex(DATE)),
            ("label", "\nThe verdict: ", 8, Constraint.choice(LABELS)),
        ):
            branches.append(
                dict(name=f"{name}{seed}", prompt=prompt, n_predict=n, temperature=t,
                     seed=seed, constraint=c)
            )  # fmt: skip
    result = _run(model, doc, branches)
    for name, b in result.branches.items():
        if name.startswith("date"):
            assert re.fullmatch(DATE, b.text), (name, b.text)
            assert b.forced_tokens >= 2, "the dashes are forced"  # fast-forward happened
        else:
            assert b.text in LABELS, (name, b.text)
        assert b.stop_reason == "grammar", (name, b.stop_reason)
        assert b.mask_ms and all(m >= 0 for m in b.mask_ms)


def test_gbnf_through_llama_cpp_decodes_what_its_llguidance_twin_decodes(
    model: sk.Model,
) -> None:
    # Every digit is a token of its own and nothing is forced, so both engines choose
    # among the same tokens at every step: greedy must pick the same ones.
    gbnf = "root ::= [0-9] [0-9] [0-9] [0-9] [0-9] [0-9]"
    lark = "start: /[0-9]{6}/"
    prompt = "\nA six-digit number from the text: "
    result = _run(model, document(model, 120), [
        dict(name="gbnf", prompt=prompt, n_predict=10, constraint=Constraint.gbnf(gbnf)),
        dict(name="lark", prompt=prompt, n_predict=10, constraint=Constraint.grammar(lark)),
    ])  # fmt: skip
    a, b = result.branches["gbnf"], result.branches["lark"]
    assert re.fullmatch("[0-9]{6}", a.text), a.text
    assert a.tokens == b.tokens
    assert b.forced_tokens == 0


def test_a_bad_gbnf_grammar_fails_before_the_prefill(model: sk.Model) -> None:
    seen: list[int] = []
    with Pipeline(model, exact=True, n_threads=2) as p:
        p.prefill("doc", text=document(model, 64))
        p.branch("g", prompt="\nX: ", constraint=Constraint.gbnf("root ::= [0-9"))
        with pytest.raises(sk.ConfigError, match=r"branch 'g': gbnf: llama.cpp cannot parse"):
            p.run(progress=lambda done, total: seen.append(done))
    assert seen == []


def _json_branches(n: int, **kw) -> list[dict]:
    out = []
    for k in range(n):
        schema = field_schema(k)
        out.append(dict(name=f"b{k:02d}", prompt=field_prompt(schema), n_predict=48,
                        constraint=Constraint.json_schema(schema), **kw))  # fmt: skip
    return out


def _steps(result: PipelineResult) -> dict[str, tuple[tuple[int, ...], list[bytes]]]:
    """Per branch: its tokens and a digest of each sampled step's (masked) logits."""
    return {
        name: (b.tokens, [hashlib.blake2b(x.tobytes()).digest() for x in b.step_logits])
        for name, b in result.branches.items()
    }


@pytest.mark.slow
def test_32_constrained_fork_branches_equal_the_baseline_bit_for_bit(model: sk.Model) -> None:
    doc = document(model, 200)
    branches = _json_branches(32, temperature=0.8, seed=7)
    fork = _run(model, doc, branches, "fork", keep_logits="all")
    base = _run(model, doc, branches, "baseline", keep_logits="all")
    assert _steps(fork) == _steps(base)
    for name, b in fork.branches.items():
        if b.stop_reason != "truncated":
            jsonschema.validate(json.loads(b.text), field_schema(int(name[1:])))
    assert sum(b.forced_tokens for b in fork.branches.values()) > 32  # the keys, at least
