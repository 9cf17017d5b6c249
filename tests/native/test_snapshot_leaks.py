"""1,000 capture/fork/restore cycles and 100 Pipeline runs in one process leak nothing:
resident memory grows under 5% after a warm-up, no pool buffer stays in use, and every
context is freed.

A leaked snapshot buffer would add 50 KiB a cycle (the state of 200 tokens; 3 buffers per
cycle: 150 MiB over the run), a leaked context its KV cache and compute buffers (MiBs a run):
either is far over 5% of this process's resident memory.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import swarmkv
from swarmkv import Context, HostBufferPool, KVSnapshot, Model, Pipeline
from swarmkv.llama.owned import Keeper

from support.decoding import prefill
from support.memory import rss_bytes
from support.scale import scaled

pytestmark = pytest.mark.slow  # the slow tier: a leak loop

# Scaled by SWARMKV_TEST_SCALE. Floors: 200 cycles leak 20 MiB if one 50 KiB buffer per
# cycle stays (4x the 5% bound here); 20 runs leak tens of MiB if a context does.
CYCLES = scaled(1000, floor=200)
PIPELINE_RUNS = scaled(100, floor=20)  # half in host mode, half in fork mode
WARMUP_CYCLES = 50
WARMUP_RUNS = 50  # glibc grows its per-thread arenas over the first ~40 runs, then stops
MAX_GROWTH = 0.05
N_PREFIX = 200
DOC = "SwarmKV prefills a shared document once and fans it out to many branches. " * 6


def test_snapshot_cycles_and_pipeline_runs_do_not_leak(
    tiny_model_path: Path, prompt_tokens: list[int], tmp_path: Path
) -> None:
    model = Model(tiny_model_path)  # its own: model._contexts holds this test's contexts only
    pool = HostBufferPool()
    ctx = Context(model, n_ctx=512, n_batch=64, n_seq_max=2, n_threads=1)
    prefix = tuple(prompt_tokens[:N_PREFIX])
    prefill(ctx, prefix, logits_last=False)
    path = tmp_path / "prefix.swkv"

    def cycle(i: int) -> None:
        snap = swarmkv.capture(ctx, 0, pool, prefix)
        fork = snap.fork(pool)
        swarmkv.restore(ctx, 1, fork)
        if i % 10 == 0:  # the file paths as well: save, load, a shared mapping
            snap.save(path)
            with KVSnapshot.load(path, pool) as loaded:
                swarmkv.restore(ctx, 1, loaded)
            with KVSnapshot.open_shared(path) as mapped:
                swarmkv.restore(ctx, 1, mapped)
        fork.release()
        snap.release()
        assert ctx.seq_len(1) == N_PREFIX

    def run_pipeline(i: int) -> None:
        mode = ("host", "fork")[i % 2]
        p = Pipeline(model, n_threads=1)
        p.prefill("doc", text=DOC)
        p.branch("a", prompt=" one", n_predict=4)
        p.branch("b", prompt=" two two", n_predict=4)
        with p:
            res = p.run(mode=mode)
            assert res.ok and all(len(res[name].tokens) >= 1 for name in ("a", "b"))
            assert p._pool is not None and p._pool.stats().bytes_in_use == 0
            p._pool.check()

    for i in range(WARMUP_CYCLES):
        cycle(i)
    for i in range(WARMUP_RUNS):
        run_pipeline(i)
    before = rss_bytes()
    for i in range(CYCLES):
        cycle(i)
    mid = rss_bytes()
    for i in range(PIPELINE_RUNS):
        run_pipeline(i)
    after = rss_bytes()
    growth = (after - before) / before
    print(
        f"\nRSS {before / 2**20:.1f} MiB -> {mid / 2**20:.1f} MiB after {CYCLES} "
        f"capture/fork/restore cycles -> {after / 2**20:.1f} MiB after {PIPELINE_RUNS} "
        f"pipeline runs ({growth:+.2%}); pool {pool.stats()}"
    )
    assert growth < MAX_GROWTH, f"RSS grew {growth:.1%}: {before >> 20} -> {after >> 20} MiB"

    stats = pool.stats()
    assert (stats.n_in_use, stats.bytes_in_use) == (0, 0)
    assert stats.n_buffers <= 4, "released buffers were not reused"
    pool.check()
    pool.close()

    ctx.close()
    gc.collect()
    assert [c for c in model._contexts if not c.closed] == []
    # a context's native handle is freed when its Keeper goes (owned.py): none may be left
    contexts = [o for o in gc.get_objects() if isinstance(o, Keeper) and o.parent is model._keeper]
    assert contexts == [], f"{len(contexts)} llama contexts of this model were not freed"
    model.close()  # refuses while a context is open
    assert model.closed
