"""The swarm scheduler on the tiny model: branches arriving while others decode, under each
policy, answer exactly what the baseline answers; a full cache queues instead of failing;
streams, errors and shutdown behave."""

from __future__ import annotations

import random
import threading
import time

import pytest

from swarmkv import Model, Pipeline
from swarmkv.errors import ClosedError, ConfigError, ContextBudgetError
from swarmkv.swarm import Swarm

DOCS = {
    "a": "SwarmKV prefills a shared document once and fans it out to many branches.\n" * 5,
    "b": "A second document, about lighthouses and their keepers, read by other agents.\n" * 4,
}
PROMPTS = [f" question {i}" + " more" * (i % 5) for i in range(12)]


def _baseline(model: Model, doc: str, prompts: list[str], n: int) -> list[tuple[int, ...]]:
    with Pipeline(model, n_threads=1) as p:
        p.prefill("doc", text=doc)
        for i, q in enumerate(prompts):
            p.branch(f"b{i}", prompt=q, n_predict=n)
        res = p.run(mode="baseline")
    return [res[f"b{i}"].tokens for i in range(len(prompts))]


@pytest.mark.parametrize("policy", ["fifo", "fair", "priority"])
def test_branches_arriving_over_time_answer_like_the_baseline(
    tiny_model: Model, policy: str
) -> None:
    rng = random.Random(7)
    with Swarm(tiny_model, n_ctx=2048, max_live=4, max_docs=2, n_threads=1, policy=policy) as sw:
        for name, text in DOCS.items():
            sw.add_document(name, text=text)
        handles = []
        for i, q in enumerate(PROMPTS):  # more branches than max_live: some queue
            doc = "a" if i % 3 else "b"
            handles.append((doc, i, sw.submit(doc, q, n_predict=6 + i % 3, priority=i % 3)))
            time.sleep(rng.uniform(0, 0.004))
        results = [(doc, i, h.result(60)) for doc, i, h in handles]
        stats = sw.stats()
    for doc in DOCS:
        mine = [(i, r) for d, i, r in results if d == doc]
        for i, r in mine:
            assert r.tokens == _baseline(tiny_model, DOCS[doc], [PROMPTS[i]], 6 + i % 3)[0], i
    assert stats.n_branches == len(PROMPTS)
    assert stats.tokens == sum(len(r.tokens) for _, _, r in results)
    assert 0 < stats.fairness <= 1 and stats.activation_ms.p99 >= stats.activation_ms.p50


def test_a_full_cache_queues_branches_instead_of_failing(tiny_model: Model) -> None:
    doc = DOCS["a"]
    n_doc = len(tiny_model.tokenize(doc))
    with Swarm(tiny_model, n_ctx=256, max_live=8, n_threads=1, n_batch=64) as sw:
        # room beside the document for two branches at a time, not three
        n_predict = (sw.ctx.n_ctx - n_doc) // 2 - 12
        sw.add_document("a", text=doc)
        hs = [sw.submit("a", q, n_predict=n_predict) for q in PROMPTS[:6]]
        peak = 0
        while not all(h.done() for h in hs):
            peak = max(peak, len(sw._engine.live))
            time.sleep(0.0005)
        results = [h.result() for h in hs]
    assert peak <= 2
    assert all(len(r.tokens) > 0 for r in results)
    assert max(r.queue_ms for r in results) > 0


def test_stream_yields_the_text_as_it_comes(tiny_model: Model) -> None:
    with Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1) as sw:
        sw.add_document("a", text=DOCS["a"])
        h = sw.submit("a", PROMPTS[1], n_predict=10)
        pieces = list(h.stream())
        assert "".join(pieces) == h.result().text
        assert len(h.result().inter_token_ms) == len(h.result().tokens) - 1


def test_bad_submissions_are_refused_at_once(tiny_model: Model) -> None:
    with Swarm(tiny_model, n_ctx=512, max_live=2, n_threads=1) as sw:
        sw.add_document("a", text=DOCS["a"])
        with pytest.raises(ConfigError, match="unknown document 'nope'"):
            sw.submit("nope", " hi")
        with pytest.raises(ConfigError, match="prompt is empty"):
            sw.submit("a", "  ")
        with pytest.raises(ConfigError, match="prompt is not valid UTF-8"):
            sw.submit("a", " bad \udcff byte")  # a pipeline branch's checks, before tokenizing
        with pytest.raises(ContextBudgetError, match=r"exceed the \d+ cells left"):
            sw.submit("a", " hi", n_predict=5000)
        with pytest.raises(ConfigError, match="already in the swarm"):
            sw.add_document("a", text="x")
    with pytest.raises(ConfigError, match="sum to at most 256"):
        Swarm(tiny_model, max_live=300)


def test_close_fails_what_is_unfinished(tiny_model: Model) -> None:
    sw = Swarm(tiny_model, n_ctx=1024, max_live=1, n_threads=1)
    sw.add_document("a", text=DOCS["a"])
    hs = [sw.submit("a", q, n_predict=200) for q in PROMPTS[:3]]
    sw.close()
    errors = []
    for h in hs:
        try:
            h.result(10)
        except ClosedError as exc:
            errors.append(exc)
    assert errors  # at least the queued ones; nothing hangs
    assert sw.ctx.closed
    assert not any(t.name == "swarm-scheduler" for t in threading.enumerate())
    with pytest.raises(ClosedError, match="the swarm is closed"):
        sw.submit("a", " hi")
