"""The Q4_K / Q6_K weight products of decode steps (ffn_down, attn_output in the default
model), run as one ggml MUL_MAT on the CPU backend. In batch-invariant mode on AVX2 builds
patch 0008 takes each weight row against up to 8 activation rows at once, unpacking its
scales and quants once; every result must be the bits upstream's vec_dot gives that pair
(what a lone row gets outside batch-invariant mode; a batch there goes through other
kernels), whatever the row count and thread count, and the products must be right (against
a float64 reference). Both run with the backend switch `kquant_rows` on (patch 0008's kernel)
and off (vec_dot pair by pair): the same bits either way, only the work differs."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_graph import assert_right_product, has_batched_kernels, weight_product
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

K = 2048  # 8 super-blocks of 256, as the default model's ffn_down
M = 37  # weight rows: not a multiple of the 16-row blocks
TYPES = {"q4_K": GGMLQuantizationType.Q4_K, "q6_K": GGMLQuantizationType.Q6_K}
BLOCK = {"q4_K": 144, "q6_K": 210}  # bytes per super-block


def weights(wtype: str, seed: int = 0) -> bytes:
    """Random super-blocks with small finite f16 scales (every quant and sub-scale random)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (M * K // 256, BLOCK[wtype]), dtype=np.uint8)
    scale = rng.uniform(2e-3, 2e-2, size=(blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if wtype == "q4_K":
        blocks[:, 0:4] = scale  # d, dmin first
    else:
        blocks[:, 208:210] = scale[:, 0:2]  # d last
    return blocks.tobytes()


def mul_mat(
    wtype: str, w: bytes, acts: np.ndarray, threads: int, invariant: bool, rows: int = 1
) -> np.ndarray:
    """ggml_mul_mat(w [M x K], acts [n x K] f32) on the CPU backend, the kquant_rows switch at
    `rows`: [n x M] f32."""
    switches = {"kquant_rows": rows}
    return weight_product(int(TYPES[wtype]), M, w, acts, threads, invariant, switches)


def activations(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, K)).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 0], ids=["kquant-rows", "vec-dot"])
@pytest.mark.parametrize("wtype", sorted(TYPES))
def test_every_row_count_gives_vec_dots_bits(wtype: str, rows: int) -> None:
    w, acts = weights(wtype), activations(40)
    full = mul_mat(wtype, w, acts, threads=2, invariant=True, rows=rows)
    # vec_dot pair by pair: each row alone, outside batch-invariant mode
    alone = [mul_mat(wtype, w, acts[j : j + 1], threads=2, invariant=False) for j in range(40)]
    np.testing.assert_array_equal(full, np.concatenate(alone))
    if has_batched_kernels():  # the control: upstream's own batch sums otherwise
        batched = mul_mat(wtype, w, acts, threads=2, invariant=False)
        assert not np.array_equal(batched, full), "upstream's batched path sums differently"
    for n in (1, 2, 15, 16, 17, 33):
        part = mul_mat(wtype, w, acts[:n], threads=2, invariant=True, rows=rows)
        np.testing.assert_array_equal(part, full[:n], err_msg=f"{n} rows")
    for threads in (1, 3):
        again = mul_mat(wtype, w, acts, threads=threads, invariant=True, rows=rows)
        np.testing.assert_array_equal(again, full, err_msg=f"{threads} threads")


@pytest.mark.parametrize("wtype", sorted(TYPES))
def test_products_are_right(wtype: str) -> None:
    w, acts = weights(wtype, seed=5), activations(19, seed=6)
    exact_w = dequantize(np.frombuffer(w, dtype=np.uint8).reshape(M, -1), TYPES[wtype])
    for rows in (1, 0):
        got = mul_mat(wtype, w, acts, threads=2, invariant=True, rows=rows)
        assert_right_product(got, acts, exact_w)
