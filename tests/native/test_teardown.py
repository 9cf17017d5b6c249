"""Teardown with live native handles: each case crashed (SIGSEGV) before the ownership rules
in owned.py and pool.py (issue 9). Nothing here may crash, and memory must stay readable."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import swarmkv
from swarmkv import Context, ContextConfig, HostBufferPool, Model, SwarmKVError

Prefill = Callable[..., int]


def finalizer_of(owner: Model | Context) -> weakref.finalize:
    """The finalizer that frees owner's native handle (it does not keep the handle alive)."""
    keeper = owner._keeper
    assert keeper is not None
    return keeper.finalizer


def test_model_close_refuses_while_a_context_is_open(
    tiny_model_path: Path, prompt_tokens: list[int], prefill: Prefill
) -> None:
    model = Model(tiny_model_path)
    ctx = Context(model, ContextConfig(n_ctx=512, n_batch=128))
    with pytest.raises(SwarmKVError, match=r"1 context\(s\) .* still open"):
        model.close()
    assert not model.closed
    row = prefill(ctx, prompt_tokens[:50])  # the model is still there
    assert np.isfinite(ctx.logits(row)).all()
    ctx.close()
    model.close()
    assert model.closed


def test_leaving_with_model_while_a_context_is_open_raises_not_crashes(
    tiny_model_path: Path, prompt_tokens: list[int], prefill: Prefill
) -> None:
    with pytest.raises(SwarmKVError, match="still open"), Model(tiny_model_path) as model:
        ctx = Context(model, ContextConfig(n_ctx=512, n_batch=128))
    row = prefill(ctx, prompt_tokens[:20])
    assert np.isfinite(ctx.logits(row)).all()
    ctx.close()
    model.close()


def test_an_unclosed_context_keeps_its_model_alive(
    tiny_model_path: Path, prompt_tokens: list[int], prefill: Prefill
) -> None:
    model = Model(tiny_model_path)
    ctx = Context(model, ContextConfig(n_ctx=512, n_batch=128))
    model_freed = finalizer_of(model)
    del model
    gc.collect()
    assert model_freed.alive, "the context still needs the model"
    prefill(ctx, prompt_tokens[:20])
    ctx_freed = finalizer_of(ctx)
    ctx.close()
    assert not ctx_freed.alive
    assert model_freed.alive, "ctx.model still refers to the Model wrapper"
    del ctx
    gc.collect()
    assert not model_freed.alive


def test_logits_read_after_close_are_the_last_decode(
    tiny_model: Model, prompt_tokens: list[int], prefill: Prefill
) -> None:
    ctx = Context(tiny_model, ContextConfig(n_ctx=512, n_batch=128))
    row = prefill(ctx, prompt_tokens[:40])
    view = ctx.logits(row)
    expected = view.copy()
    freed = finalizer_of(ctx)
    ctx.close()
    with pytest.raises(SwarmKVError, match="closed"):
        ctx.logits(row)
    assert freed.alive, "the view keeps the context's memory"
    assert np.array_equal(view, expected)  # readable, unchanged: no use after free
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1.0
    del view
    assert not freed.alive, "freed once the last view went"


def test_numpy_over_a_pool_view_survives_pool_close() -> None:
    pool = HostBufferPool()
    buf = pool.alloc(4096)
    buf.view[:] = bytes(range(256)) * 16
    arr = np.frombuffer(buf.view, dtype=np.uint8)
    freed = buf.block.keeper.finalizer
    del buf
    pool.close()
    assert pool.stats().n_buffers == 0
    assert freed.alive
    assert arr[:4].tolist() == [0, 1, 2, 3] and int(arr.sum()) == 16 * sum(range(256))
    del arr
    assert not freed.alive


@pytest.mark.parametrize("how", ["numpy", "slice", "numpy_of_slice"])
def test_a_view_alive_after_release_is_never_handed_to_the_next_owner(how: str) -> None:
    with HostBufferPool() as pool:
        buf = pool.alloc(1000)
        buf.view[:] = b"A" * 1000
        kept = made_from(buf.view, how)
        old_block, freed = buf.block, buf.block.keeper.finalizer
        buf.release()
        assert pool.stats().n_in_use == 0
        nxt = pool.alloc(1000)
        assert nxt.block is not old_block, "a still-viewed block must not be reused"
        del buf, old_block
        nxt.view[:] = b"B" * 1000
        assert bytes(kept)[:1] == b"A"
        pool.check()
        nxt.release()
        del kept
        assert not freed.alive


def made_from(view: memoryview, how: str) -> np.ndarray | memoryview:
    if how == "numpy":
        return np.frombuffer(view, dtype=np.uint8)
    if how == "slice":
        return view[10:20]
    return np.frombuffer(view[0:100], dtype=np.uint8)


def test_a_released_block_with_no_views_left_is_reused() -> None:
    with HostBufferPool() as pool:
        buf = pool.alloc(1000)
        arr = np.frombuffer(buf.view, dtype=np.uint8)
        del arr
        block = buf.block
        buf.release()
        assert pool.alloc(1000).block is block


def test_lazy_native_names_are_the_real_classes() -> None:
    assert swarmkv.Model is Model and swarmkv.HostBufferPool is HostBufferPool
