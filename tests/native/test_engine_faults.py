"""Faults of the swarm and the pipeline found by probing them as a user would, on the tiny
model: each was a hang, a wedge, lost work or a late or unclear answer before the engine
and the one validation of branch options."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from swarmkv import Model, Pipeline
from swarmkv.engine.core import DecodeFailed
from swarmkv.errors import ClosedError, ConfigError, SwarmKVError
from swarmkv.pipeline.concurrency import ConcurrencyPolicy
from swarmkv.swarm import Swarm

DOC_A = "SwarmKV prefills a shared document once and fans it out to many branches.\n" * 5
DOC_B = "A second document, about lighthouses and their keepers, read by other agents.\n" * 6


def _alone(model: Model, doc: str, prompt: str, n: int) -> tuple[int, ...]:
    with Pipeline(model, n_threads=1) as p:
        p.prefill("doc", text=doc)
        p.branch("q", prompt=prompt, n_predict=n)
        return p.run(mode="baseline")["q"].tokens


def test_a_failed_decode_mid_document_fails_its_branches_and_the_swarm_serves_others(
    tiny_model: Model,
) -> None:
    """Before: the document's tokens were counted as decoded before the decode ran, so after
    a failed step later branches forked a document whose cells were missing."""
    with Swarm(tiny_model, n_ctx=2048, max_live=4, max_docs=2, n_threads=1, n_batch=32) as sw:
        sw.add_document("a", text=DOC_A)
        eng = sw._engine
        real = eng.decode
        calls = {"n": 0}

        def fail_document_b(batch: Any) -> None:  # the test hook: the second chunk of "b"
            if 1 in batch.seq_spans():
                calls["n"] += 1
                if calls["n"] == 2:
                    raise RuntimeError("injected: llama_decode returned 1")
            real(batch)

        eng.decode = fail_document_b
        with pytest.raises(DecodeFailed, match=r"document 'b'.*injected"):
            sw.add_document("b", text=DOC_B)
        with pytest.raises(SwarmKVError, match="document 'b' failed"):
            sw.submit("b", " what keeps the light?", n_predict=4)
        got = sw.submit("a", " why once?", n_predict=6).result(60)
    assert got.tokens == _alone(tiny_model, DOC_A, " why once?", 6)


def test_branches_waiting_for_a_failed_document_fail_with_its_reason(tiny_model: Model) -> None:
    with Swarm(tiny_model, n_ctx=2048, max_live=4, max_docs=2, n_threads=1, n_batch=16) as sw:
        eng = sw._engine
        real = eng.decode
        submitted = threading.Event()

        def fail_document_once(batch: Any) -> None:
            if 0 in batch.seq_spans():
                submitted.wait(30)  # fail once the branch waits for the document
                raise RuntimeError("injected: out of KV slots")
            real(batch)

        eng.decode = fail_document_once
        sw.add_document("a", text=DOC_A, wait=False)
        h = sw.submit("a", " anyone?", n_predict=4)
        submitted.set()
        with pytest.raises(DecodeFailed, match=r"document 'a'.*injected"):
            h.result(30)


@pytest.mark.parametrize("priority", ["high", None, 1.5])
def test_a_wrong_type_priority_is_refused_and_cannot_wedge_the_swarm(
    tiny_model: Model, priority: object
) -> None:
    """Before: every later scheduling step failed (1.8 million log lines in 40 s) and no
    branch ever finished, the valid ones included; under `fair` the string was accepted."""
    for policy in ("priority", "fair"):
        with Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1, policy=policy) as sw:
            sw.add_document("a", text=DOC_A)
            with pytest.raises(ConfigError, match="priority must be an integer"):
                sw.submit("a", " hi", n_predict=2, priority=priority)  # type: ignore[arg-type]
            assert sw.submit("a", " hi", n_predict=2, priority=3).result(30).tokens


def test_stream_can_be_read_twice_on_a_finished_or_failed_branch(tiny_model: Model) -> None:
    """Before: the second stream() blocked forever (the first had consumed the end)."""
    with Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1) as sw:
        sw.add_document("a", text=DOC_A)
        h = sw.submit("a", " tell me", n_predict=5)
        first = "".join(h.stream())
        assert "".join(h.stream()) == first == h.result(1).text
        sw._engine.decode = _always_fails
        bad = sw.submit("a", " and again", n_predict=5)
        for _ in range(2):
            with pytest.raises(DecodeFailed):
                list(bad.stream())


def _always_fails(_batch: Any) -> None:
    raise RuntimeError("injected")


def test_submit_after_close_names_the_swarm(tiny_model: Model) -> None:
    sw = Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1)
    sw.add_document("a", text=DOC_A)
    sw.close()
    with pytest.raises(ClosedError, match="the swarm is closed"):
        sw.submit("a", " late", n_predict=2)
    with pytest.raises(ClosedError, match="the swarm is closed"):
        sw.add_document("b", text=DOC_B)


@pytest.mark.parametrize(
    ("n_predict", "message"),
    [
        (1.5, r"n_predict must be an integer, got 1\.5 \(float\)"),
        ("4", r"n_predict must be an integer, got '4' \(str\)"),
        (True, r"n_predict must be an integer, got True \(bool\)"),
        (0, "n_predict must be >= 1, got 0"),
    ],
)
def test_n_predict_must_be_an_integer_everywhere(
    tiny_model: Model, n_predict: object, message: str
) -> None:
    """Before: 1.5 was accepted (2 tokens generated) and '4' gave a raw TypeError."""
    with Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1) as sw:
        sw.add_document("a", text=DOC_A)
        with pytest.raises(ConfigError, match=message):
            sw.submit("a", " hi", n_predict=n_predict)  # type: ignore[arg-type]
    with Pipeline(tiny_model, n_threads=1) as p:
        p.prefill("doc", text=DOC_A)
        with pytest.raises(ConfigError, match=message):
            p.branch("q", prompt=" hi", n_predict=n_predict)  # type: ignore[arg-type]


def test_a_swarm_too_small_for_its_branches_names_n_ctx(tiny_model: Model) -> None:
    """Before: Swarm(n_ctx=1) blamed n_batch."""
    with pytest.raises(ConfigError, match="n_ctx=1 is too small"):
        Swarm(tiny_model, n_ctx=1, n_threads=1)
    with pytest.raises(ConfigError, match="max_live must be an integer"):
        Swarm(tiny_model, max_live=2.0, n_threads=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "   \n"])
def test_an_empty_swarm_document_is_refused_like_a_pipelines(tiny_model: Model, text: str) -> None:
    empty = pytest.raises(ConfigError, match="document 'a': the document is empty")
    with Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1) as sw, empty:
        sw.add_document("a", text=text)
    with Pipeline(tiny_model, n_threads=1) as p, pytest.raises(ConfigError, match="empty"):
        p.prefill("doc", text=text)


@pytest.mark.parametrize("name", ["a\nb", "nul\x00", "bidi\u202etxt", "zero\u200bwidth", ""])
def test_names_that_do_not_print_as_themselves_are_refused(tiny_model: Model, name: str) -> None:
    """Before: a branch named "a\\nb" printed as two branches in every listing."""
    with Pipeline(tiny_model, n_threads=1) as p:
        p.prefill("doc", text=DOC_A)
        with pytest.raises(ConfigError, match="branch name"):
            p.branch(name, prompt=" hi", n_predict=2)
    with Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1) as sw:
        with pytest.raises(ConfigError, match="document name"):
            sw.add_document(name, text=DOC_A)
        sw.add_document("a", text=DOC_A)
        with pytest.raises(ConfigError, match="branch name"):
            sw.submit("a", " hi", n_predict=2, name=name)


def test_256_host_branches_run_on_a_bounded_number_of_threads(tiny_model: Model) -> None:
    """Before: Dag.run started one thread per node up front (257 for 256 branches)."""
    peak = {"n": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak["n"] = max(peak["n"], threading.active_count())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    base = threading.active_count() + 1  # the watcher
    with Pipeline(tiny_model, n_threads=1, policy=ConcurrencyPolicy(max_contexts=2)) as p:
        p.prefill("doc", text="A short shared document.\n")
        for i in range(256):
            p.branch(f"b{i}", prompt=f" q{i}", n_predict=1)
        watcher.start()
        res = p.run(mode="host")
        stop.set()
        watcher.join()
    assert len(res.branches) == 256
    # the prefill and max_contexts branches at once, plus one thread ending as the next starts
    assert peak["n"] - base <= 2 + 1 + 1, peak["n"] - base


def test_a_wait_that_times_out_raises_swarmkvs_timeout_error(tiny_model: Model) -> None:
    """One TimeoutError for every wait: a SwarmKVError, and still a builtin TimeoutError."""
    import builtins

    from swarmkv.errors import TimeoutError as SwarmTimeout

    with Swarm(tiny_model, n_ctx=1024, max_live=2, n_threads=1) as sw:
        sw.add_document("a", text=DOC_A)
        h = sw.submit("a", " a long answer", n_predict=200)
        with pytest.raises(SwarmTimeout, match="not finished after 0 s") as got:
            h.result(0)
        assert isinstance(got.value, SwarmKVError) and isinstance(got.value, builtins.TimeoutError)
        with pytest.raises(SwarmTimeout, match="the swarm to drain"):
            sw.drain(0)


def test_a_branch_reading_another_starts_when_that_one_ends_not_its_wave(
    tiny_model: Model,
) -> None:
    """Before: fork mode decoded branches in waves, and wave k+1 waited for the whole of
    wave k. Now a branch that reads `a` joins the running batch as soon as `a` finishes,
    while the long `b` is still generating, and still answers what the baseline answers."""
    with Pipeline(tiny_model, n_threads=1) as p:
        p.prefill("doc", text=DOC_A)
        p.branch("a", prompt=" short", n_predict=2)
        p.branch("b", prompt=" long", n_predict=40)
        p.branch("c", prompt=" after {a}:", after=["a"], n_predict=3)
        fork = p.run(mode="fork")
        base = p.run(mode="baseline")
    assert fork["c"].first_token_ms < fork["b"].end_ms
    for name in "abc":
        assert fork[name].tokens == base[name].tokens, name
