"""Repacked weights in batch-invariant mode (patch 0011). The CPU backend's repack buffer
(CPU_REPACK, what Model(repack=True) loads into) interleaves Q4_K, Q4_0, IQ4_NL and MXFP4
weights (and, with AVX-512, Q2_K) 8 rows at a time for its gemm and gemv kernels (AVX2 and up).
Upstream sends the activation rows past a multiple of 4 through gemv and, with AVX-512, groups
of 16 rows through a 16-row path; Q4_K's and Q2_K's sum a row differently, so a row's bits
depended on its batch. In batch-invariant mode every row now goes through the 4-row gemm, a
short last tile padded: a row's bits are the same alone and in any batch, at any thread count,
and the products are right, for every type this CPU repacks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from ggml_graph import assert_right_product, compiled_in, repack_buffer_type, weight_product
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

K = 2048  # 8 super-blocks of 256
M = 72  # weight rows: a multiple of the 8 interleaved, not of AVX-512's 16 columns


@dataclass(frozen=True)
class Layout:
    """Where a block keeps its scales, so that random blocks get small finite ones."""

    qtype: GGMLQuantizationType
    scale_at: int  # byte offset of the block's scales
    n_scales: int  # f16 scales there (d, then dmin); 0: one E8M0 exponent byte (MXFP4)


# ggml-cpu/repack.cpp's choice on x86: AVX2 repacks these, AVX-512 adds Q2_K
LAYOUTS = {
    "q4_K": Layout(GGMLQuantizationType.Q4_K, 0, 2),
    "q4_0": Layout(GGMLQuantizationType.Q4_0, 0, 1),
    "iq4_nl": Layout(GGMLQuantizationType.IQ4_NL, 0, 1),
    "mxfp4": Layout(GGMLQuantizationType.MXFP4, 0, 0),
    "q2_K": Layout(GGMLQuantizationType.Q2_K, 80, 2),  # scales and quants, then d, dmin
}
AVX512_ONLY = {"q2_K"}
TYPES = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            name in AVX512_ONLY and not compiled_in("AVX512"),
            reason="ggml repacks Q2_K only with AVX-512 (this backend has none)",
        ),
    )
    for name in LAYOUTS
]

pytestmark = pytest.mark.skipif(
    not compiled_in("AVX2"), reason="the x86 repack kernels need AVX2 (this backend has none)"
)


def weights(wtype: str, seed: int = 0) -> bytes:
    """Random blocks with small finite scales (every quant and sub-scale random)."""
    layout, rng = LAYOUTS[wtype], np.random.default_rng(seed)
    per_block, size = GGML_QUANT_SIZES[layout.qtype]
    blocks = rng.integers(0, 256, (M * K // per_block, size), np.uint8)
    at = layout.scale_at
    if layout.n_scales == 0:  # E8M0: 2^(e-127), here 2^-9 to 2^-4
        blocks[:, at] = rng.integers(118, 124, blocks.shape[0], np.uint8)
    else:
        scale = rng.uniform(2e-3, 2e-2, size=(blocks.shape[0], layout.n_scales))
        blocks[:, at : at + 2 * layout.n_scales] = scale.astype(np.float16).view(np.uint8)
    return blocks.tobytes()


def activations(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, K)).astype(np.float32)


def product(wtype: str, w: bytes, acts: np.ndarray, threads: int, invariant: bool) -> np.ndarray:
    return weight_product(int(LAYOUTS[wtype].qtype), M, w, acts, threads, invariant, repacked=True)


def test_the_build_has_the_repack_buffer() -> None:
    assert repack_buffer_type() is not None


@pytest.mark.parametrize("wtype", TYPES)
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


# Upstream's gemm and gemv sum a row alike for Q4_0, IQ4_NL and MXFP4 (measured: plain mode's
# batch equals its rows alone), so for them the tests above guard the padding and the tiles;
# for the K-quants they are what the patch changed.
DIFFER_UPSTREAM = [p for p in TYPES if p.values[0] in ("q4_K", "q2_K")]


@pytest.mark.parametrize("wtype", DIFFER_UPSTREAM)
def test_upstreams_mix_of_kernels_is_the_control(wtype: str) -> None:
    """Plain mode keeps upstream's kernels: a batch's K-quant rows differ from the rows alone
    (gemm against gemv), which is what the batch-invariant path removes."""
    w, acts = weights(wtype), activations(40)
    batch = product(wtype, w, acts, threads=2, invariant=False)
    alone = [product(wtype, w, acts[j : j + 1], threads=2, invariant=False) for j in range(40)]
    assert not np.array_equal(np.concatenate(alone), batch)


@pytest.mark.parametrize("wtype", TYPES)
def test_the_repack_kernels_ran(wtype: str) -> None:
    """The weights went through the repack kernels, not the GGUF layout's (patch 0008's
    K-quant rows, vec_dot): the two sum differently, so their bits differ."""
    w, acts = weights(wtype), activations(9)
    repacked = product(wtype, w, acts, threads=2, invariant=True)
    as_stored = weight_product(int(LAYOUTS[wtype].qtype), M, w, acts, 2, True)
    assert not np.array_equal(repacked, as_stored)


@pytest.mark.parametrize("wtype", TYPES)
def test_planes_each_pad_their_own_last_tile(wtype: str) -> None:
    """Activations of 2 planes x 7 rows (a 3-D product): each plane's rows equal the rows
    alone."""
    w = weights(wtype)
    acts = np.stack([activations(7, seed=2), activations(7, seed=3)])
    both = product(wtype, w, acts, threads=2, invariant=True)
    for p in range(2):
        alone = [product(wtype, w, acts[p, j : j + 1], threads=2, invariant=True) for j in range(7)]
        np.testing.assert_array_equal(np.concatenate(alone), both[p], err_msg=f"plane {p}")


@pytest.mark.parametrize("wtype", TYPES)
def test_products_are_right(wtype: str) -> None:
    w, acts = weights(wtype, seed=5), activations(19, seed=6)
    exact_w = dequantize(np.frombuffer(w, dtype=np.uint8).reshape(M, -1), LAYOUTS[wtype].qtype)
    assert_right_product(product(wtype, w, acts, threads=2, invariant=True), acts, exact_w)
