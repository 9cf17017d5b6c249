"""Context on the tiny llama: configuration, decode and logits, sequence ops, perf counters."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from swarmkv import Batch, BatchError, Context, ContextConfig, Model, Sampler

Prefill = Callable[..., int]


@pytest.fixture
def ctx2(tiny_model: Model) -> Iterator[Context]:
    with Context(tiny_model, n_ctx=512, n_batch=64, n_threads=1, n_seq_max=2) as ctx:
        yield ctx


def test_config_fields_are_applied(tiny_model: Model) -> None:
    config = ContextConfig(n_ctx=1024, n_batch=128, n_seq_max=4, n_threads=1)
    with Context(tiny_model, config) as ctx:
        assert (ctx.n_ctx, ctx.n_batch, ctx.n_seq_max) == (1024, 128, 4)
        assert ctx.config is config
        assert ctx.n_vocab == tiny_model.n_vocab
        assert ctx.model is tiny_model
    with Context(tiny_model, config, n_batch=32, n_seq_max=1) as ctx:  # overrides win
        assert (ctx.n_ctx, ctx.n_batch, ctx.n_seq_max) == (1024, 32, 1)
        assert ctx.config.n_threads == 1


def test_n_ctx_is_padded_by_llama_cpp(tiny_model: Model) -> None:
    # llama.cpp rounds n_ctx up to a multiple of 256; Context reports what it got.
    with Context(tiny_model, n_ctx=300, n_batch=64, n_threads=1) as ctx:
        assert ctx.config.n_ctx == 300
        assert ctx.n_ctx == 512


def test_swa_full_resolves_false_for_a_model_without_sliding_window(tiny_model: Model) -> None:
    assert ContextConfig().resolved_swa_full(tiny_model) is False
    assert ContextConfig(swa_full=True).resolved_swa_full(tiny_model) is True


def test_decode_gives_finite_float32_logits(ctx2: Context, prompt_tokens: list[int]) -> None:
    with Batch(64, 2) as batch:
        rows = [batch.add(t, p, [0], logits=True) for p, t in enumerate(prompt_tokens[:8])]
        ctx2.decode(batch)
    first = ctx2.logits(rows[0]).copy()
    last = ctx2.logits(-1)
    assert np.array_equal(last, ctx2.logits(rows[-1]))
    for logits in (first, last):
        assert logits.shape == (ctx2.n_vocab,) == (32000,)
        assert logits.dtype == np.float32
        assert np.isfinite(logits).all()
        assert logits.std() > 1e-3
    assert not np.array_equal(first, last)


def test_logits_are_deterministic_and_depend_on_the_weights(
    tiny_model: Model, other_tiny_model: Model, prompt_tokens: list[int], prefill: Prefill
) -> None:
    def run(model: Model) -> np.ndarray:
        with Context(model, n_ctx=256, n_batch=64, n_threads=1) as ctx:
            row = prefill(ctx, prompt_tokens[:40])
            return ctx.logits(row).copy()

    a, b, other = run(tiny_model), run(tiny_model), run(other_tiny_model)
    assert np.array_equal(a, b)
    assert not np.allclose(a, other)


@pytest.mark.parametrize("kv_unified", [False, True])
def test_seq_cp_rm_add_clear_and_positions(
    tiny_model: Model, prefill: Prefill, kv_unified: bool
) -> None:
    tokens = [1, 100, 101, 102, 103, 104, 105, 106, 107, 108]
    with Context(
        tiny_model, n_ctx=512, n_batch=64, n_threads=1, n_seq_max=2, kv_unified=kv_unified
    ) as ctx:
        assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0), ctx.seq_len(0)) == (None, None, 0)
        prefill(ctx, tokens, seq_id=0)
        assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0), ctx.seq_len(0)) == (0, 9, 10)

        ctx.seq_cp(0, 1)
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, 9)

        ctx.seq_rm(1, 5)
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, 4)
        assert ctx.seq_pos_max(0) == 9

        ctx.seq_rm(1, 0, 2)
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (2, 4)

        ctx.memory_clear()
        assert ctx.seq_pos_max(0) is None and ctx.seq_pos_max(1) is None

        # (in a unified cache a shift moves cells shared with a copy too: so none are shared)
        prefill(ctx, tokens[:3], seq_id=0)
        prefill(ctx, tokens[:4], seq_id=1)
        ctx.seq_add(0, 0, None, 3)
        assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (3, 5)
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, 3)

        ctx.seq_rm(None)  # every sequence
        assert ctx.seq_pos_max(0) is None and ctx.seq_pos_max(1) is None


def test_seq_keep_and_partial_seq_cp_in_a_unified_cache(
    tiny_model: Model, prefill: Prefill
) -> None:
    # Both need one KV stream for all sequences: with kv_unified=False (one stream per
    # sequence) llama.cpp's seq_keep only cleans the kept sequence's own stream, and a
    # partial cross-stream seq_cp aborts (see test_bad_input).
    with Context(
        tiny_model, n_ctx=512, n_batch=64, n_threads=1, n_seq_max=3, kv_unified=True
    ) as ctx:
        prefill(ctx, [1, 100, 101, 102, 103, 104], seq_id=0)
        ctx.seq_cp(0, 1, 2, 5)
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (2, 4)
        ctx.seq_cp(0, 2)
        ctx.seq_keep(2)
        assert ctx.seq_pos_max(0) is None and ctx.seq_pos_max(1) is None
        assert (ctx.seq_pos_min(2), ctx.seq_pos_max(2)) == (0, 5)


def test_a_copied_sequence_continues_like_its_source(
    ctx2: Context, prompt_tokens: list[int], prefill: Prefill
) -> None:
    prefill(ctx2, prompt_tokens[:50], seq_id=0, logits_last=False)
    ctx2.seq_cp(0, 1)
    suffix = prompt_tokens[50:54]
    row0 = prefill(ctx2, suffix, seq_id=0)
    on_0 = ctx2.logits(row0).copy()
    row1 = prefill(ctx2, suffix, seq_id=1)
    on_1 = ctx2.logits(row1).copy()
    assert np.array_equal(on_0, on_1)

    ctx2.seq_rm(1)  # without the prefix the same suffix predicts something else
    row1 = prefill(ctx2, suffix, seq_id=1)
    assert not np.allclose(ctx2.logits(row1), on_0, atol=1e-3)


def test_greedy_sampler_picks_the_argmax(ctx2: Context, prompt_tokens: list[int]) -> None:
    with Batch(64) as batch, Sampler() as sampler:
        row = batch.add_sequence(prompt_tokens[:20], 0, 0)
        ctx2.decode(batch)
        assert sampler.sample(ctx2, row) == int(np.argmax(ctx2.logits(row)))


def test_perf_counters_increase(ctx2: Context, prompt_tokens: list[int]) -> None:
    with Batch(64) as batch:
        row = batch.add_sequence(prompt_tokens[:20], 0, 0)
        ctx2.decode(batch)
        ctx2.logits(row)
        after_prompt = ctx2.perf()
        assert after_prompt.n_p_eval >= 20
        assert after_prompt.t_p_eval_ms > 0

        batch.clear()
        row = batch.add_sequence(prompt_tokens[20:21], 20, 0)
        ctx2.decode(batch)
        ctx2.logits(row)
        after_token = ctx2.perf()
        assert after_token.n_eval >= 1
        assert after_token.n_p_eval == after_prompt.n_p_eval

    ctx2.perf_reset()
    reset = ctx2.perf()
    assert reset.t_p_eval_ms == reset.t_eval_ms == 0.0
    assert reset.n_p_eval <= 1  # llama.cpp reports max(1, n) to avoid divisions by zero


def test_perf_counts_a_decode_whose_logits_were_not_read(
    ctx2: Context, prompt_tokens: list[int], prefill: Prefill
) -> None:
    """llama.cpp books a decode into the perf counters only at llama_synchronize (which
    llama_get_logits_ith calls); Context.perf must not report a prefill as 0 tokens."""
    ctx2.perf_reset()
    prefill(ctx2, prompt_tokens[:40], seq_id=0, logits_last=False)
    assert ctx2.perf().n_p_eval == 40


def test_n_batch_is_clamped_to_n_ctx_like_llama_cpp(tiny_model: Model) -> None:
    with Context(tiny_model, n_ctx=256, n_batch=512, n_threads=1) as ctx:
        assert ctx.n_batch == 256


def test_position_ranges_are_checked_before_the_native_call(tiny_model: Model) -> None:
    # None is the open end; llama.cpp's -1 sentinel is not accepted, so a computed negative
    # bound (an off-by-one in a user's script) is an error instead of "everything".
    with Context(tiny_model, n_ctx=512, n_batch=64, n_threads=1, n_seq_max=2) as ctx:
        with pytest.raises(BatchError, match="p0 must be >= 0"):
            ctx.seq_rm(0, -1)
        with pytest.raises(BatchError, match="p1 must be >= 0"):
            ctx.seq_add(0, 0, -3, 1)
        with pytest.raises(BatchError, match="empty position range"):
            ctx.seq_cp(0, 1, 5, 2)
