"""ON_DEVICE snapshots on the tiny model: the KV data stays in the context's own buffers,
only metadata reaches the host buffer, and a device snapshot restores only where it can:
into the context that captured it, until that sequence is captured on device again."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import swarmkv
from swarmkv import Context, HostBufferPool, Model, SnapshotMismatchError

Prefill = Callable[..., int]
CTX = {"n_ctx": 768, "n_batch": 64, "n_seq_max": 3, "n_threads": 1, "batch_invariant": True}
N_PREFIX = 100


@pytest.fixture
def pool() -> Iterator[HostBufferPool]:
    with HostBufferPool() as p:
        yield p


@pytest.fixture
def ctx(tiny_model: Model) -> Iterator[Context]:
    with Context(tiny_model, **CTX) as c:
        yield c


def _continue(ctx: Context, seq: int, tokens: list[int], prefill: Prefill) -> np.ndarray:
    row = prefill(ctx, tokens, seq_id=seq)
    return ctx.logits(row).copy()


def test_device_snapshot_keeps_kv_off_the_host_and_restores_exactly(
    ctx: Context, pool: HostBufferPool, prompt_tokens: list[int], prefill: Prefill
) -> None:
    prefix = tuple(prompt_tokens[:N_PREFIX])
    suffix = prompt_tokens[N_PREFIX : N_PREFIX + 6]
    prefill(ctx, prefix, seq_id=0, logits_last=False)
    host_bytes = ctx.state_seq_size(0, ctx.exact_state_flags)
    snap = swarmkv.capture(ctx, 0, pool, prefix, on_device=True)
    assert snap.on_device
    assert snap.nbytes < host_bytes // 10  # metadata only: the K/V rows stayed in the context
    swarmkv.restore(ctx, 1, snap)
    swarmkv.restore(ctx, 2, snap)
    ref = _continue(ctx, 0, suffix, prefill)
    for seq in (1, 2):
        assert np.array_equal(_continue(ctx, seq, suffix, prefill), ref)


def test_device_snapshot_is_refused_elsewhere_and_after_a_newer_capture(
    ctx: Context,
    pool: HostBufferPool,
    prompt_tokens: list[int],
    prefill: Prefill,
    tiny_model: Model,
) -> None:
    prefix = tuple(prompt_tokens[:N_PREFIX])
    prefill(ctx, prefix, seq_id=0, logits_last=False)
    old = swarmkv.capture(ctx, 0, pool, prefix, on_device=True)
    with Context(tiny_model, **CTX) as other:
        with pytest.raises(SnapshotMismatchError, match="only into the context that captured"):
            swarmkv.restore(other, 1, old)
        assert other.seq_pos_max(1) is None
    new = swarmkv.capture(ctx, 0, pool, prefix, on_device=True)
    with pytest.raises(SnapshotMismatchError, match="captures the same sequence on device again"):
        swarmkv.restore(ctx, 1, old)
    swarmkv.restore(ctx, 1, new)
    assert ctx.seq_pos_max(1) == N_PREFIX - 1
    with pytest.raises(SnapshotMismatchError, match="lives in its context's device buffers"):
        new.save("unused.swkv")
