"""Flash attention in batch-invariant mode, run as one ggml op on the CPU backend: a query row
gets the same bits alone as among 31 other rows whose cells are interleaved with its own in
the cache (patch 0005's attention on AVX-512 builds and, as two 8-float halves per block, on
AVX2 + FMA + F16C builds; the one-row path elsewhere), and the result is
softmax(q.K * scale + mask).V.

Each test runs under the backend switches that pick the path (swarmkv.llama.kernel_switches):
patch 0005's attention with its row tiles (bi_attn=1, bi_attn_tile=128), row by row
(bi_attn_tile=1), and patch 0003's one-row path (bi_attn=0)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from ggml_graph import compute, has_batched_kernels, has_bi_attention

from swarmkv._native import lib

DK = DV = 128
HEADS, KV_HEADS = 4, 1  # grouped-query attention, as in Gemma 3
SCALE = 0.125
PATHS = {
    "tiles": {"bi_attn": 1, "bi_attn_tile": 128},
    "rows": {"bi_attn": 1, "bi_attn_tile": 1},
    "one-row": {"bi_attn": 0},
}


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, **kw: Any
) -> np.ndarray:
    """ggml_flash_attn_ext: q [n_q, HEADS, DK] f32, k/v [n_kv, KV_HEADS, D] f16, mask [n_q, n_kv]
    (0 or -inf); returns [n_q, HEADS, DV] f32."""
    n_q, n_kv = mask.shape
    data = [
        np.ascontiguousarray(q.transpose(1, 0, 2), dtype=np.float32).tobytes(),
        np.ascontiguousarray(k.transpose(1, 0, 2), dtype=np.float16).tobytes(),
        np.ascontiguousarray(v.transpose(1, 0, 2), dtype=np.float16).tobytes(),
        np.ascontiguousarray(mask, dtype=np.float16).tobytes(),
    ]

    def build(ctx: Any) -> tuple[list[tuple[Any, bytes]], Any]:
        tq = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, DK, n_q, HEADS, 1)
        tk = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F16, DK, n_kv, KV_HEADS, 1)
        tv = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F16, DV, n_kv, KV_HEADS, 1)
        tm = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F16, n_kv, n_q, 1, 1)
        out = lib.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, SCALE, 0.0, 0.0)
        return list(zip([tq, tk, tv, tm], data, strict=True)), out

    return compute(build, **kw).reshape(n_q, HEADS, DV)


def scattered_batch(rng: np.random.Generator, alone_k: np.ndarray, alone_v: np.ndarray, row: int):
    """32 query rows over a cache whose cells interleave row `row`'s own cells (same values,
    same order) with cells only the other rows see."""
    n_vis = alone_k.shape[0]
    n_kv = 3 * n_vis
    slots = np.sort(rng.choice(n_kv, size=n_vis, replace=False))
    k = rng.standard_normal((n_kv, KV_HEADS, DK)).astype(np.float16)
    v = rng.standard_normal((n_kv, KV_HEADS, DV)).astype(np.float16)
    k[slots], v[slots] = alone_k, alone_v
    mask = np.where(rng.random((32, n_kv)) < 0.5, 0.0, -np.inf)
    mask[row] = -np.inf
    mask[row, slots] = 0.0
    return k, v, mask


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_row_gets_the_same_bits_alone_and_among_others(path: str) -> None:
    rng = np.random.default_rng(7)
    n_vis, row = 157, 11  # not a multiple of the 16-cell groups
    q = rng.standard_normal((32, HEADS, DK)).astype(np.float32)
    k_alone = rng.standard_normal((n_vis, KV_HEADS, DK)).astype(np.float16)
    v_alone = rng.standard_normal((n_vis, KV_HEADS, DV)).astype(np.float16)
    sw = PATHS[path]
    alone = attention(q[row : row + 1], k_alone, v_alone, np.zeros((1, n_vis)), switches=sw)
    k, v, mask = scattered_batch(rng, k_alone, v_alone, row)
    for threads in (1, 2, 3):
        batch = attention(q, k, v, mask, threads=threads, switches=sw)
        np.testing.assert_array_equal(batch[row], alone[0], err_msg=f"{threads} threads")
    # the control: upstream's tiled path for these 32 rows sums otherwise (the one-row path is
    # upstream's own for them, and a backend without SIMD kernels has no tiled path)
    if path != "one-row" and has_batched_kernels():
        control = attention(q, k, v, mask, invariant=False)
        assert not np.array_equal(control[row], alone[0]), "upstream's path sums differently"


def test_the_switches_pick_the_path() -> None:
    """Row tiles change only the order in which rows advance (the same bits as row by row);
    patch 0003's one-row path accumulates V in f16 and sums in another order (other bits). A
    backend without patch 0005's kernels has only the one-row path, whatever the switch."""
    rng = np.random.default_rng(2)
    n_q, n_kv = 8, 200
    q = rng.standard_normal((n_q, HEADS, DK)).astype(np.float32)
    k = rng.standard_normal((n_kv, KV_HEADS, DK)).astype(np.float16)
    v = rng.standard_normal((n_kv, KV_HEADS, DV)).astype(np.float16)
    mask = np.zeros((n_q, n_kv))
    got = {name: attention(q, k, v, mask, switches=sw) for name, sw in PATHS.items()}
    np.testing.assert_array_equal(got["tiles"], got["rows"])
    if has_bi_attention():
        assert not np.array_equal(got["tiles"], got["one-row"])
    else:
        np.testing.assert_array_equal(got["tiles"], got["one-row"])


@pytest.mark.parametrize("path", sorted(PATHS))
def test_matches_softmax_attention(path: str) -> None:
    """Finite mask values count, and runs of -inf (whole 16-cell blocks of the mask, which the
    scan skips at once, and a run ending in the ragged tail) hide their cells."""
    rng = np.random.default_rng(3)
    n_q, n_kv = 5, 300
    q = rng.standard_normal((n_q, HEADS, DK)).astype(np.float32)
    k = rng.standard_normal((n_kv, KV_HEADS, DK)).astype(np.float16)
    v = rng.standard_normal((n_kv, KV_HEADS, DV)).astype(np.float16)
    bias = -2.0 * rng.random((n_q, n_kv)).astype(np.float16).astype(np.float64)
    mask = np.where(rng.random((n_q, n_kv)) < 0.3, -np.inf, bias)
    mask[:, 37:131] = -np.inf
    mask[2:, 283:] = -np.inf
    got = attention(q, k, v, mask, switches=PATHS[path])
    kf, vf = k[:, 0].astype(np.float64), v[:, 0].astype(np.float64)
    for t in range(n_q):
        for h in range(HEADS):
            s = q[t, h].astype(np.float64) @ kf.T * SCALE + mask[t]
            p = np.exp(s - s.max())
            want = (p / p.sum()) @ vf
            # the one-row path keeps its V sum in f16 (an 11-bit significand), rounded again at
            # each of ~200 cells: errors of a few 1e-3 on values of size 1
            one_row = path == "one-row" or not has_bi_attention()
            atol = 1e-2 if one_row else 2e-5
            np.testing.assert_allclose(got[t, h], want, rtol=0, atol=atol)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_one_agents_row_split_over_the_threads_gets_its_bits_among_others(path: str) -> None:
    """Patch 0010: a row's visible cells go in parts of 128, merged in order. One token's
    heads are too few rows for the threads, so their parts run on every thread at once (the
    split path) and are merged after; among 31 other rows each thread walks whole rows, the
    parts one after another. 613 visible cells: 5 parts, the last one short and ragged."""
    rng = np.random.default_rng(5)
    n_vis, row = 613, 20
    q = rng.standard_normal((32, HEADS, DK)).astype(np.float32)
    k_alone = rng.standard_normal((n_vis, KV_HEADS, DK)).astype(np.float16)
    v_alone = rng.standard_normal((n_vis, KV_HEADS, DV)).astype(np.float16)
    sw = PATHS[path]
    k, v, mask = scattered_batch(rng, k_alone, v_alone, row)
    among = attention(q, k, v, mask, threads=2, switches=sw)[row]
    for threads in (1, 2, 3, 4):
        alone = attention(
            q[row : row + 1], k_alone, v_alone, np.zeros((1, n_vis)), threads=threads, switches=sw
        )
        np.testing.assert_array_equal(alone[0], among, err_msg=f"alone on {threads} threads")
    kf, vf = k_alone[:, 0].astype(np.float64), v_alone[:, 0].astype(np.float64)
    for h in range(HEADS):
        s = q[row, h].astype(np.float64) @ kf.T * SCALE
        p = np.exp(s - s.max())
        atol = 1e-2 if path == "one-row" or not has_bi_attention() else 2e-5
        np.testing.assert_allclose(among[h], (p / p.sum()) @ vf, rtol=0, atol=atol)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_row_of_a_forked_batch_gets_its_bits_alone(path: str) -> None:
    """The fork layout: 32 rows share a 203-cell prefix, then each sees its own 1 to 32 cells,
    interleaved in the cache with the others'. Rows are walked in tiles that advance group by
    group together and share the f32 copy of a group's K and V when they read the same cells:
    rows that run out early, and odd rows that skip cell 5 (so every group of theirs holds
    other cells than the even rows'), must get their own cells' values all the same."""
    rng = np.random.default_rng(11)
    n_q, prefix = 32, 203
    own = [1 + (7 * r) % 32 for r in range(n_q)]
    owner = rng.permutation(np.repeat(np.arange(n_q), own))  # whose cell each tail slot is
    n_kv = prefix + owner.size
    q = rng.standard_normal((n_q, HEADS, DK)).astype(np.float32)
    k = rng.standard_normal((n_kv, KV_HEADS, DK)).astype(np.float16)
    v = rng.standard_normal((n_kv, KV_HEADS, DV)).astype(np.float16)
    mask = np.full((n_q, n_kv), -np.inf)
    mask[:, :prefix] = 0.0
    mask[1::2, 5] = -np.inf
    mask[owner, prefix + np.arange(owner.size)] = 0.0
    sw = PATHS[path]
    batch = attention(q, k, v, mask, threads=2, switches=sw)
    for r in range(n_q):
        seen = mask[r] == 0.0
        alone = attention(
            q[r : r + 1], k[seen], v[seen], np.zeros((1, int(seen.sum()))), switches=sw
        )
        np.testing.assert_array_equal(batch[r], alone[0], err_msg=f"row {r}")
