"""Pipelines that start from a snapshot, on the tiny model: a `.swkv` file or an in-memory
KVSnapshot seeds the document, answers equal the baseline's bit for bit, a longer document
reuses the snapshot's tokens, and every mismatch is refused before any run."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import swarmkv
from swarmkv import Context, Model, Pipeline
from swarmkv.errors import ConfigError, SnapshotMismatchError
from swarmkv.pipeline.handoff import ForkOptions
from swarmkv.pipeline.results import PipelineResult

DOC_A = "SwarmKV prefills a shared document once and fans it out to many branches.\n" * 5
MORE = "Each branch reads it and answers a question of its own.\n" * 3
PROMPTS = {"a": " one", "b": " two two", "c": " three three three"}


def _pipe(model: Model, **kw: Any) -> Pipeline:
    return Pipeline(model, n_threads=1, **kw)


def _branches(p: Pipeline) -> Pipeline:
    for name, prompt in PROMPTS.items():
        p.branch(name, prompt=prompt, n_predict=8)
    return p


def _baseline(model: Model, text: str) -> PipelineResult:
    with _branches(_pipe(model).prefill("doc", text=text)) as p:
        return p.run(mode="baseline", keep_logits=True)


def _same(got: Any, ref: Any) -> None:
    for name in PROMPTS:
        assert got[name].tokens == ref[name].tokens, name
        assert (got[name].first_logits == ref[name].first_logits).all(), name


@pytest.fixture(scope="module")
def snap_file(tiny_model: Model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("snap") / "a.swkv"
    with _pipe(tiny_model).prefill("doc", text=DOC_A) as p:
        snap = p.snapshot()
        snap.save(path)
        snap.release()
    return path


@pytest.mark.parametrize("mode", ["host", "fork"])
def test_a_snapshot_file_alone_answers_like_the_document(
    tiny_model: Model, snap_file: Path, mode: str
) -> None:
    ref = _baseline(tiny_model, DOC_A)
    with _branches(_pipe(tiny_model).prefill("doc", snapshot=snap_file)) as p:
        got = p.run(mode=mode, keep_logits=True)
    assert got.reused_tokens == got.prefix_tokens == len(tiny_model.tokenize(DOC_A))
    _same(got, ref)


@pytest.mark.parametrize("mode", ["host", "fork"])
def test_a_longer_document_reuses_the_snapshot_and_prefills_the_rest(
    tiny_model: Model, snap_file: Path, mode: str
) -> None:
    ref = _baseline(tiny_model, DOC_A + MORE)
    with _branches(
        _pipe(tiny_model, n_batch=16).prefill("d", text=DOC_A + MORE, snapshot=snap_file)
    ) as p:
        got = p.run(mode=mode, keep_logits=True)
    assert got.reused_tokens == len(tiny_model.tokenize(DOC_A))
    assert got.prefix_tokens == len(tiny_model.tokenize(DOC_A + MORE))
    _same(got, ref)


@pytest.mark.parametrize(
    "text",
    [DOC_A[: len(DOC_A) // 2], "A different opening line.\n" + DOC_A],
    ids=["a-prefix-of-the-snapshot", "differs-after-bos"],
)
@pytest.mark.parametrize("mode", ["host", "fork"])
def test_a_document_sharing_only_the_start_reuses_that_much(
    tiny_model: Model, snap_file: Path, text: str, mode: str
) -> None:
    """The snapshot is restored and its tail past the shared tokens dropped: exact, because
    this cache keeps every cell (no sliding window)."""
    doc, snap = tiny_model.tokenize(text), swarmkv.read_snapshot_header(snap_file).tokens
    shared = next(i for i, (a, b) in enumerate(zip(doc, snap, strict=False)) if a != b)
    ref = _baseline(tiny_model, text)
    with _branches(_pipe(tiny_model).prefill("doc", text=text, snapshot=snap_file)) as p:
        got = p.run(mode=mode, keep_logits=True)
    assert 0 < got.reused_tokens == shared < len(snap)
    _same(got, ref)


def test_a_window_sized_cache_reuses_only_a_whole_snapshot(
    tiny_model: Model, snap_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without every cell kept (swa_full False in the header), dropping a tail is not safe
    on a sliding-window model: nothing is reused, with a warning."""
    from swarmkv.kv.prefix_source import SnapshotSource

    header = swarmkv.read_snapshot_header(snap_file)
    source = SnapshotSource(
        header.tokens, header.model_fingerprint, "", {**header.context, "swa_full": False}
    )
    doc = [*header.tokens[:10], 1, 2, 3]
    with caplog.at_level(logging.WARNING, logger="swarmkv.pipeline.builder"):
        assert source.reusable(doc) == 0
    assert "nothing reused" in caplog.text
    assert source.reusable([*header.tokens, 5]) == len(header.tokens)


def test_an_in_memory_snapshot_stays_the_callers(tiny_model: Model) -> None:
    ref = _baseline(tiny_model, DOC_A)
    with swarmkv.HostBufferPool() as pool:
        with _pipe(tiny_model).prefill("doc", text=DOC_A) as p:
            snap = p.snapshot(pool)
        with _branches(_pipe(tiny_model).prefill("doc", snapshot=snap)) as p:
            _same(p.run(mode="fork", keep_logits=True), ref)
            _same(p.run(mode="host", keep_logits=True), ref)
        assert not snap.buffer.released  # the run did not release what it does not own
        snap.release()
        assert pool.stats().n_in_use == 0


def test_a_snapshot_of_another_model_is_refused_at_prefill(
    other_tiny_model: Model, snap_file: Path
) -> None:
    with (
        _pipe(other_tiny_model) as p,
        pytest.raises(SnapshotMismatchError, match=r"model_fingerprint is \w+ \(tiny-llama-seed0"),
    ):
        p.prefill("doc", snapshot=snap_file)


@pytest.mark.parametrize(
    ("settings", "field"),
    [({"type_k": "q8_0"}, "type_k"), ({"exact": False}, "batch_invariant")],
)
def test_a_snapshot_for_other_context_settings_is_refused_at_prefill(
    tiny_model: Model, snap_file: Path, settings: dict[str, Any], field: str
) -> None:
    with (
        _pipe(tiny_model, **settings) as p,
        pytest.raises(
            SnapshotMismatchError, match=rf"context setting {field} is .* in the snapshot"
        ),
    ):
        p.prefill("doc", snapshot=snap_file)


def test_modes_that_cannot_start_from_a_snapshot_say_so_before_any_context(
    tiny_model: Model, snap_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _branches(_pipe(tiny_model, fork=ForkOptions("streams", "batched"))) as p:
        p.prefill("doc", snapshot=snap_file)
        monkeypatch.setattr(Context, "__init__", _refuse)
        with pytest.raises(ConfigError, match="layout 'streams'"):
            p.run(mode="fork")
    with _pipe(tiny_model).prefill("doc", text=DOC_A + MORE, snapshot=snap_file) as p:
        p.branch("w", prompt=" x", required_prefix_tokens=5)
        with pytest.raises(ConfigError, match="ends inside the snapshot"):
            p.run(mode="host")


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("a llama context was created before validation finished")


def test_the_baseline_ignores_a_snapshot_and_prefills_everything(
    tiny_model: Model, snap_file: Path
) -> None:
    with _branches(_pipe(tiny_model).prefill("doc", snapshot=snap_file)) as p:
        got = p.run(mode="baseline", keep_logits=True)
    assert got.reused_tokens == 0
    _same(got, _baseline(tiny_model, DOC_A))
