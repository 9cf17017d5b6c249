"""Create/free cycles do not leak: resident memory stays within 5% after a warm-up.

The 2 MiB pool buffers are written in full, so a buffer leaked per cycle would add 400 MiB
of resident memory; a leaked llama_context keeps its logits and compute buffers (MiBs).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from swarmkv import Batch, Context, HostBufferPool, Model

from support.memory import rss_bytes
from support.scale import scaled

pytestmark = pytest.mark.slow  # the slow tier: leak loops

CYCLES = scaled(200, floor=50)  # a leaked 2 MiB buffer per cycle: 100 MiB at the floor
WARMUP = 5
MAX_GROWTH = 0.05
POOL_SIZES = (2 << 20, (2 << 20) - 4096, 1 << 20, 3 << 19)  # different sizes, all reusable


def _growth(cycle: Callable[[int], None]) -> tuple[float, int, int]:
    for i in range(WARMUP):
        cycle(i)
    before = rss_bytes()
    for i in range(CYCLES):
        cycle(i)
    after = rss_bytes()
    return (after - before) / before, before, after


def _fill(view: memoryview, i: int) -> None:
    view[:] = bytes([i % 251]) * len(view)


def test_context_create_free_cycles_do_not_grow_rss(tiny_model: Model) -> None:
    def cycle(i: int) -> None:
        with Context(tiny_model, n_ctx=512, n_batch=64, n_threads=1) as ctx, Batch(8) as batch:
            batch.add_sequence([1, 100 + i % 50, 200], 0, 0)
            ctx.decode(batch)
            assert ctx.logits(-1).shape == (tiny_model.n_vocab,)

    growth, before, after = _growth(cycle)
    assert growth < MAX_GROWTH, f"RSS {before >> 20} -> {after >> 20} MiB over {CYCLES} contexts"


@pytest.mark.parametrize("trim", [False, True], ids=["release", "release+trim"])
def test_pool_alloc_release_cycles_do_not_grow_rss(trim: bool) -> None:
    with HostBufferPool() as pool:

        def cycle(i: int) -> None:
            buf = pool.alloc(POOL_SIZES[i % len(POOL_SIZES)])
            _fill(buf.view, i)
            buf.release()
            if trim:
                assert pool.trim() == buf.capacity
                assert pool.stats().n_buffers == 0

        growth, before, after = _growth(cycle)
        assert growth < MAX_GROWTH, f"RSS {before >> 20} -> {after >> 20} MiB, {CYCLES} buffers"
        stats = pool.stats()
        pool.check()
        assert stats.n_in_use == 0
        if trim:
            assert stats.bytes_allocated == 0
        else:
            assert stats.n_buffers == 1  # the biggest buffer fits every size: always reused
            assert stats.bytes_allocated == max(POOL_SIZES)
