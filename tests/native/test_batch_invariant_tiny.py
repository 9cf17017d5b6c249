"""Batch-invariant contexts on the tiny model: settings checked before the native call, and a
row's logits independent of the ubatch size and of how the input was split."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.errors import ConfigError

TOKENS = [1] + [100 + (7 * i) % 150 for i in range(95)]


@pytest.fixture(scope="module")
def flat_model(tiny_model: sk.Model) -> sk.Model:
    assert not tiny_model.repack  # the default: weights as stored
    return tiny_model


def test_repacked_weights_without_the_mode_are_refused_before_a_context_exists(
    monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path
) -> None:
    """Weights a build repacks into AMX (or KleidiAI) meet kernels with no batch-invariant
    mode: refused, naming the buffer type (CPU_REPACK's have the mode: patch 0011)."""
    with sk.Model(tiny_model_path, repack=True) as repacked:
        monkeypatch.setattr(repacked, "repacked_without_invariance", ("AMX",))
        with pytest.raises(ConfigError, match=r"repack=True.*repacks into AMX"):
            sk.Context(repacked, n_ctx=256, batch_invariant=True)
        with pytest.raises(ConfigError, match=r"repack=True.*repacks into AMX"):
            Pipeline(repacked, exact=True)  # (exact=None, the default, runs it plain)


def test_flash_attention_off_is_refused(flat_model: sk.Model) -> None:
    with pytest.raises(ConfigError, match="needs flash attention"):
        sk.Context(flat_model, n_ctx=256, batch_invariant=True, flash_attn="off")


def _logits(model: sk.Model, chunks: Sequence[int], n_ubatch: int) -> np.ndarray:
    with (
        sk.Context(
            model, n_ctx=256, n_batch=128, n_ubatch=n_ubatch, n_threads=2, batch_invariant=True
        ) as ctx,
        sk.Batch(128) as batch,
    ):
        pos = 0
        for c in chunks:
            batch.add_sequence(TOKENS[pos : pos + c], pos, 0)
            ctx.decode(batch)
            batch.clear()
            pos += c
        return ctx.logits(-1).copy()


@pytest.mark.parametrize(
    ("chunks", "n_ubatch"),
    [([96], 1), ([96], 2), ([96], 7), ([96], 32), ([96], 64), ([50, 46], 128), ([95, 1], 128)],
)
def test_logits_independent_of_ubatch_and_split(
    flat_model: sk.Model, chunks: list[int], n_ubatch: int
) -> None:
    ref = _logits(flat_model, [96], 128)
    assert np.array_equal(_logits(flat_model, chunks, n_ubatch), ref)


def test_fork_of_32_equals_the_baseline_bit_for_bit(flat_model: sk.Model) -> None:
    """32 branches batched in one unified context (their cells interleaved) against 32
    contexts of their own: tokens and every step's logits identical for 32 steps."""
    runs = {}
    for mode in ("fork", "baseline"):
        with Pipeline(flat_model, n_threads=2) as p:  # exact=True is the default
            p.prefill("doc", text="one two three four five six seven eight nine ten " * 4)
            for i in range(32):
                p.branch(f"b{i}", prompt=f" {i} and then", n_predict=32)
            runs[mode] = p.run(mode=mode, keep_logits="all")
    fork, base = runs["fork"], runs["baseline"]
    for name, b in base.branches.items():
        assert fork[name].tokens == b.tokens, name
        assert len(b.step_logits) == len(b.tokens) > 0
        for k, (x, y) in enumerate(zip(fork[name].step_logits, b.step_logits, strict=True)):
            assert np.array_equal(x, y), f"{name} step {k}"
