"""The swarm on the real model: 12 agents arriving as a Poisson process over one document,
8 live at most, under each policy, answer exactly what a context of their own answers
(batch-invariant kernels), and the swarm's statistics describe them."""

from __future__ import annotations

import random
import time

import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.swarm import Swarm

N_AGENTS = 12
N_PREDICT = 8


@pytest.fixture(scope="module")
def reference(exact_model: sk.Model, doc_short: str) -> list[tuple[int, ...]]:
    with Pipeline(exact_model, n_threads=2) as p:
        p.prefill("doc", text=doc_short)
        for i in range(N_AGENTS):
            p.branch(f"q{i}", prompt=_prompt(i), n_predict=N_PREDICT)
        res = p.run(mode="fork")  # bit-identical to the baseline (test_batch_invariant)
    return [res[f"q{i}"].tokens for i in range(N_AGENTS)]


def _prompt(i: int) -> str:
    return f"\n\nQuestion {i}: what does the text say about point {i * 7 % 11}?\nAnswer:"


SLOW = pytest.mark.slow  # one policy in the fast tier; the others in the slow one


@pytest.mark.parametrize(
    "policy", [pytest.param("fifo", marks=SLOW), "fair", pytest.param("priority", marks=SLOW)]
)
def test_poisson_arrivals_answer_exactly(
    exact_model: sk.Model, doc_short: str, reference: list[tuple[int, ...]], policy: str
) -> None:
    rng = random.Random(3)
    with Swarm(exact_model, n_ctx=2048, max_live=8, n_threads=2, policy=policy) as sw:
        sw.add_document("doc", text=doc_short)
        handles = []
        for i in range(N_AGENTS):
            time.sleep(rng.expovariate(40.0))  # about 40 arrivals per second
            handles.append(sw.submit("doc", _prompt(i), n_predict=N_PREDICT, priority=i % 3))
        results = [h.result(300) for h in handles]
        stats = sw.stats()
    assert [r.tokens for r in results] == reference
    assert stats.n_branches == N_AGENTS and stats.tokens == N_AGENTS * N_PREDICT
    assert stats.tokens_per_s > 0 and 0 < stats.fairness <= 1
    print(f"\n[{policy}] {stats.to_dict()}")
