"""Pipeline behaviour on the tiny model: validation before native work, failure isolation,
branch dependencies, timeouts, and exactness of host/fork-exact against the baseline."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest

from swarmkv import Context, Model, Pipeline
from swarmkv.errors import ConfigError, ContextBudgetError, CycleError, DagError, PipelineError
from swarmkv.pipeline.fidelity import nmse
from swarmkv.pipeline.handoff import ForkOptions

DOC = "SwarmKV prefills a shared document once and fans it out to many branches. " * 6
MODES = ("baseline", "host", "fork")


def _pipe(model: Model, **kw: Any) -> Pipeline:
    p = Pipeline(model, n_threads=1, **kw)
    p.prefill("doc", text=DOC)
    return p


@pytest.fixture()
def no_native_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any llama context is created (validation must come first)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a llama context was created before validation finished")

    monkeypatch.setattr(Context, "__init__", refuse)


@pytest.mark.usefixtures("no_native_contexts")
@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (
            lambda p: p.branch("a", prompt="hi", n_predict=5000),
            ContextBudgetError,
            "n_predict 5000",
        ),
        (lambda p: p.branch("a", prompt="   "), ConfigError, "prompt is empty"),
        (lambda p: p.branch("a", prompt="hi", n_predict=0), ConfigError, "n_predict"),
        (
            lambda p: p.branch("a", prompt="hi", required_prefix_tokens=10_000),
            ConfigError,
            "exceeds the document",
        ),
        (
            lambda p: p.branch("a", prompt="hi", after=["doc", "b"]).branch(
                "b", prompt="x", after=["a"]
            ),
            CycleError,
            "a -> b -> a|b -> a -> b",
        ),
        (lambda p: p.branch("a", prompt="hi", after="nowhere"), DagError, "nowhere"),
        (
            lambda p: p.branch("a", prompt="use {b}", after="doc").branch("b", prompt="x"),
            ConfigError,
            "after=",
        ),
    ],
)
def test_bad_pipelines_fail_before_native_work(
    tiny_model: Model, build: Any, error: type, match: str
) -> None:
    p = _pipe(tiny_model, n_ctx=512)
    with pytest.raises(error, match=match):
        build(p)
        p.run(mode="host")


@pytest.mark.usefixtures("no_native_contexts")
def test_unknown_mode_and_empty_document(tiny_model: Model, tmp_path: Any) -> None:
    p = _pipe(tiny_model).branch("a", prompt="hi")
    with pytest.raises(ConfigError, match="unknown mode 'turbo'"):
        p.run(mode="turbo")
    with pytest.raises(ConfigError, match="empty"):
        Pipeline(tiny_model).prefill("doc", text=" \n ")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        Pipeline(tiny_model).prefill("doc", path=tmp_path / "empty.txt")
    with pytest.raises(ConfigError, match="not found"):
        Pipeline(tiny_model).prefill("doc", path=tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match="no branches"):
        _pipe(tiny_model).run()


@pytest.mark.parametrize("mode", MODES)
def test_raising_branch_leaves_others_intact_and_frees_everything(
    tiny_model: Model, mode: str
) -> None:
    def explode(name: str, token: int, piece: str) -> None:
        raise RuntimeError(f"{name} callback failed")

    p = _pipe(tiny_model)
    p.branch("good", prompt=" first", n_predict=6)
    p.branch("bad", prompt=" second", n_predict=6, on_token=explode)
    p.branch("downstream", prompt=" after {bad}", after=["doc", "bad"], n_predict=4)
    p.branch("also_good", prompt=" third", n_predict=6)
    with p:
        res = p.run(mode=mode, raise_on_failure=False)
        assert res.outcomes["bad"].status == "failed"
        assert "callback failed" in str(res.outcomes["bad"].error)
        assert res.outcomes["downstream"].status == "skipped"
        assert "bad" in (res.outcomes["downstream"].reason or "")
        for name in ("good", "also_good"):
            assert res.outcomes[name].status == "ok" and len(res[name].tokens) >= 1
        with pytest.raises(PipelineError, match="bad"):
            p.run(mode=mode)
        assert p._pool is not None and p._pool.stats().bytes_in_use == 0
        p._pool.check()
    gc.collect()
    live = [o for o in gc.get_objects() if isinstance(o, Context) and not o.closed]
    assert live == [], f"{len(live)} contexts left open"


@pytest.mark.parametrize("mode", MODES)
def test_branch_uses_upstream_text(tiny_model: Model, mode: str) -> None:
    p = _pipe(tiny_model)
    p.branch("first", prompt=" Topic:", n_predict=4)
    p.branch("second", prompt=" More on {first}:", after=["doc", "first"], n_predict=4)
    with p:
        res = p.run(mode=mode)
    assert res["second"].prompt_tokens > len(tiny_model.tokenize(" More on :", add_special=False))
    assert res["second"].first_token_ms > res["first"].end_ms - 1e-6


def test_user_names_like_internal_wave_nodes_do_not_collide(tiny_model: Model) -> None:
    # fork mode adds one DAG node per wave of branches; its name must never be a user's
    p = Pipeline(tiny_model, n_threads=1)
    p.prefill("wave-1", text=DOC)
    p.branch("wave-0", prompt=" Topic:", n_predict=3)
    p.branch("_wave-0", prompt=" Again on {wave-0}:", after=["wave-1", "wave-0"], n_predict=3)
    with p:
        res = p.run(mode="fork")
        ref = p.run(mode="baseline")
    assert set(res.branches) == {"wave-0", "_wave-0"}
    assert all(o.status == "ok" for o in res.outcomes.values())
    assert [b.tokens for b in res.branches.values()] == [b.tokens for b in ref.branches.values()]


def test_timeout_and_cancel_return_promptly(tiny_model: Model) -> None:
    cancel = threading.Event()
    cancel.set()
    p = _pipe(tiny_model).branch("a", prompt=" x", n_predict=50)
    with p:
        res = p.run(mode="host", cancel=cancel, raise_on_failure=False)
    assert res.outcomes["a"].status in ("cancelled", "skipped")


@pytest.mark.parametrize("fork", [None, ForkOptions("streams", "per_branch")])
def test_exact_modes_equal_baseline_on_tiny_model(
    tiny_model: Model, fork: ForkOptions | None
) -> None:
    prompts = {"a": " one", "b": " two two", "c": " three three three"}
    with _pipe(tiny_model, fork=fork) as p:
        for name, prompt in prompts.items():
            p.branch(name, prompt=prompt, n_predict=8)
        base = p.run(mode="baseline", keep_logits=True)
        other = p.run(mode="fork" if fork else "host", keep_logits=True)
    for name in prompts:
        assert other[name].tokens == base[name].tokens, name
        assert nmse(other[name].first_logits, base[name].first_logits) == 0.0


def test_fork_refuses_window_sized_swa_cache_before_native_work(tiny_model: Model) -> None:
    """The tiny model has no sliding window, so fork with swa_full=False is fine there; the
    refusal for SWA models is checked on the real model (tests/model)."""
    with _pipe(tiny_model, swa_full=False) as p:
        p.branch("a", prompt=" x", n_predict=2)
        assert p.run(mode="fork").ok


@pytest.mark.usefixtures("no_native_contexts")
def test_bad_settings_fail_when_the_pipeline_is_built(tiny_model: Model) -> None:
    with pytest.raises(ConfigError, match="flash_attn"):
        Pipeline(tiny_model, flash_attn="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fork layout"):
        Pipeline(tiny_model, fork=ForkOptions(layout="ring"))
    with pytest.raises(ConfigError, match="n_threads"):
        Pipeline(tiny_model, n_threads=0)


@pytest.mark.parametrize("packing", ["batched", "per_branch"])
def test_device_mode_equals_baseline_on_tiny_model(tiny_model: Model, packing: str) -> None:
    """device mode (the prefix restored through ON_DEVICE state, one KV stream per branch)
    answers what each branch's own context answers, logits bit for bit; a watermark branch
    gets its prefix from an earlier capture than the others."""
    prompts = {"a": " one", "b": " two two", "c": " three three three"}
    with _pipe(tiny_model, fork=ForkOptions("unified", packing)) as p:
        for name, prompt in prompts.items():
            p.branch(name, prompt=prompt, n_predict=8)
        p.branch("early", prompt=" four", n_predict=8, required_prefix_tokens=20)
        base = p.run(mode="baseline", keep_logits=True)
        dev = p.run(mode="device", keep_logits=True)
    for name in [*prompts, "early"]:
        assert dev[name].tokens == base[name].tokens, name
        assert nmse(dev[name].first_logits, base[name].first_logits) == 0.0
        assert dev[name].restore_ms is not None and dev[name].restore_ms > 0


@pytest.mark.parametrize("mode", ["fork", "device"])
def test_branches_finishing_at_different_steps_stay_exact(tiny_model: Model, mode: str) -> None:
    """Early finishers free their cells mid-wave; the others' later tokens must still land
    after their own cells (patch 0007), or their logits stop matching the baseline's."""
    lengths = {"a": 2, "b": 30, "c": 5, "d": 30, "e": 12}
    with _pipe(tiny_model) as p:
        for name, n in lengths.items():
            p.branch(name, prompt=f" {name} asks a question", n_predict=n)
        base = p.run(mode="baseline", keep_logits="all")
        got = p.run(mode=mode, keep_logits="all")
    for name in lengths:
        assert got[name].tokens == base[name].tokens, name
        for k, (x, y) in enumerate(zip(got[name].step_logits, base[name].step_logits, strict=True)):
            assert nmse(x, y) == 0.0, f"{name} step {k}"


@pytest.mark.parametrize("mode", MODES)
def test_results_keep_the_order_branches_were_declared(tiny_model: Model, mode: str) -> None:
    # the short branches finish first; the result still lists them as declared
    names = ["long", "short", "mid", "tiny"]
    with _pipe(tiny_model) as p:
        for name, n in zip(names, (12, 1, 6, 2), strict=True):
            p.branch(name, prompt=f" {name}:", n_predict=n)
        result = p.run(mode)
    assert list(result.branches) == names
    assert [b["name"] for b in result.to_dict()["branches"]] == names
