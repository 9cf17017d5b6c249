"""Repacked weights in batch-invariant mode (patch 0011). The CPU backend's repack buffer
(CPU_REPACK, what Model(repack=True) loads into) interleaves Q4_K and Q4_0 weights 8 rows at a
time for its gemm and gemv kernels (AVX2 and up). Upstream sends the activation rows past a
multiple of 4 through gemv and, with AVX-512, groups of 16 rows through a 16-row path; Q4_K's
sum a row differently, so a row's bits depended on its batch. In batch-invariant mode every
row now goes through the 4-row gemm, a short last tile padded: a row's bits are the same alone
and in any batch, at any thread count, and the products are right."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_graph import assert_right_product, compiled_in, repack_buffer_type, weight_product
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

K = 2048  # 8 super-blocks of 256
M = 72  # weight rows: a multiple of the 8 interleaved, not of AVX-512's 16 columns
TYPES = {"q4_K": GGMLQuantizationType.Q4_K, "q4_0": GGMLQuantizationType.Q4_0}

pytestmark = pytest.mark.skipif(
    not compiled_in("AVX2"), reason="the x86 repack kernels need AVX2 (this backend has none)"
)


def weights(wtype: str, seed: int = 0) -> bytes:
    """Random blocks with small finite f16 scales (every quant and sub-scale random)."""
    rng = np.random.default_rng(seed)
    block, scales = {"q4_K": (144, 2), "q4_0": (18, 1)}[wtype]
    blocks = rng.integers(0, 256, (M * K // (256 if wtype == "q4_K" else 32), block), np.uint8)
    scale = rng.uniform(2e-3, 2e-2, size=(blocks.shape[0], scales)).astype(np.float16)
    blocks[:, 0 : 2 * scales] = scale.view(np.uint8)  # d (and dmin) first
    return blocks.tobytes()


def activations(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, K)).astype(np.float32)


def product(wtype: str, w: bytes, acts: np.ndarray, threads: int, invariant: bool) -> np.ndarray:
    return weight_product(int(TYPES[wtype]), M, w, acts, threads, invariant, repacked=True)


def test_the_build_has_the_repack_buffer() -> None:
    assert repack_buffer_type() is not None


@pytest.mark.parametrize("wtype", sorted(TYPES))
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(wtype: str) -> None:
    w, acts = weights(wtype), activations(40)
    full = product(wtype, w, acts, threads=2, invariant=True)
    alone = [product(wtype, w, acts[j : j + 1], threads=2, invariant=True) for j in range(40)]
    np.testing.assert_array_equal(np.concatenate(alone), full)
    for n in (2, 3, 4, 5, 15, 16, 17, 33):
        part = product(wtype, w, acts[:n], threads=2, invariant=True)
        np.testing.assert_array_equal(part, full[:n], err_msg=f"{n} rows")
    for threads in (1, 3, 4):
        again = product(wtype, w, acts, threads=threads, invariant=True)
        np.testing.assert_array_equal(again, full, err_msg=f"{threads} threads")


def test_upstreams_mix_of_kernels_is_the_control() -> None:
    """Plain mode keeps upstream's kernels: a batch's Q4_K rows differ from the rows alone
    (gemm against gemv), which is what the batch-invariant path removes."""
    w, acts = weights("q4_K"), activations(40)
    batch = product("q4_K", w, acts, threads=2, invariant=False)
    alone = [product("q4_K", w, acts[j : j + 1], threads=2, invariant=False) for j in range(40)]
    assert not np.array_equal(np.concatenate(alone), batch)


@pytest.mark.parametrize("wtype", sorted(TYPES))
def test_the_repack_kernels_ran(wtype: str) -> None:
    """The weights went through the repack kernels, not the GGUF layout's (patch 0008's
    K-quant rows, vec_dot): the two sum differently, so their bits differ."""
    w, acts = weights(wtype), activations(9)
    repacked = product(wtype, w, acts, threads=2, invariant=True)
    as_stored = weight_product(int(TYPES[wtype]), M, w, acts, 2, True)
    assert not np.array_equal(repacked, as_stored)


@pytest.mark.parametrize("wtype", sorted(TYPES))
def test_planes_each_pad_their_own_last_tile(wtype: str) -> None:
    """Activations of 2 planes x 7 rows (a 3-D product): each plane's rows equal the rows
    alone."""
    w = weights(wtype)
    acts = np.stack([activations(7, seed=2), activations(7, seed=3)])
    both = product(wtype, w, acts, threads=2, invariant=True)
    for p in range(2):
        alone = [product(wtype, w, acts[p, j : j + 1], threads=2, invariant=True) for j in range(7)]
        np.testing.assert_array_equal(np.concatenate(alone), both[p], err_msg=f"plane {p}")


@pytest.mark.parametrize("wtype", sorted(TYPES))
def test_products_are_right(wtype: str) -> None:
    w, acts = weights(wtype, seed=5), activations(19, seed=6)
    exact_w = dequantize(np.frombuffer(w, dtype=np.uint8).reshape(M, -1), TYPES[wtype])
    assert_right_product(product(wtype, w, acts, threads=2, invariant=True), acts, exact_w)
