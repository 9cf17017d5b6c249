"""The Q8_0 / Q5_0 weight kernels that decode steps use, run as one ggml MUL_MAT on the CPU
backend: in batch-invariant mode every activation row gets the same bits whether it shares
the call with 0 or 63 others and however many threads run it, and the products are right
(against a float64 reference).

On AVX-512 VNNI builds patch 0004's skinny GEMM serves these: under 16 rows its few-row kernel
(weight rows in the lanes), from 16 rows its many-row kernel (activation rows in the lanes),
two different codes that must agree bit for bit. AVX2 + F16C + FMA builds have their own pair
(vpmaddubsw instead of VNNI; 8 lanes, so the switch is at 8 rows) with the same per-element
arithmetic; elsewhere tinyBLAS serves them.
(Upstream's own kernels for these types already sum a lone row like a batch's, so there is no
failing "mode off" control here; tests/model/test_batch_invariant.py has one for the model.)

The kernel is the backend switch `skinny_gemm` (swarmkv.llama.kernel_switches): every
invariance test runs with it on and off (tinyBLAS then serves every shape), and
test_the_switch_picks_the_kernel shows each value takes the path it names: plain mode keeps
upstream's kernels unless a backend asks for this one."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_graph import has_skinny_gemm, weight_product
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

K = 640  # 20 blocks of 32, as in the default model's layers
M = 53  # weight rows: not a multiple of 16 (the lanes of the few-row kernel) nor of 4
WEIGHT_TYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q5_0": GGMLQuantizationType.Q5_0}


def mul_mat(
    wtype: str, weights: bytes, acts: np.ndarray, threads: int, invariant: bool, skinny: int = 1
) -> np.ndarray:
    """ggml_mul_mat(weights [M x K], acts [n x K] f32) on the CPU backend, with the
    skinny_gemm switch at `skinny`: [n x M] f32."""
    switches = {"skinny_gemm": skinny}
    return weight_product(int(WEIGHT_TYPES[wtype]), M, weights, acts, threads, invariant, switches)


def operands(wtype: str, n: int, seed: int = 0) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Quantized weights (and their exact values) and n activation rows that Q8_0 holds
    exactly: integers with 127 in every block, so each block's scale is 1.0."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((M, K)).astype(np.float32)
    q = quantize(w, WEIGHT_TYPES[wtype])
    acts = rng.integers(-127, 128, size=(n, K)).astype(np.float32)
    acts[:, ::32] = 127.0
    return q.tobytes(), dequantize(q, WEIGHT_TYPES[wtype]).astype(np.float64), acts


@pytest.mark.parametrize("skinny", [1, 0], ids=["skinny", "tinyblas"])
@pytest.mark.parametrize("wtype", sorted(WEIGHT_TYPES))
def test_every_row_count_gives_the_same_bits(wtype: str, skinny: int) -> None:
    weights, _, acts = operands(wtype, 64)
    full = mul_mat(wtype, weights, acts, threads=2, invariant=True, skinny=skinny)
    for n in (1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 63):
        part = mul_mat(wtype, weights, acts[:n], threads=2, invariant=True, skinny=skinny)
        np.testing.assert_array_equal(part, full[:n], err_msg=f"{n} rows")
    for threads in (1, 3):
        again = mul_mat(wtype, weights, acts, threads=threads, invariant=True, skinny=skinny)
        np.testing.assert_array_equal(again, full, err_msg=f"{threads} threads")
    # one row alone, at each position of the batch
    for j in (0, 16, 40):
        alone = mul_mat(wtype, weights, acts[j : j + 1], threads=2, invariant=True, skinny=skinny)
        np.testing.assert_array_equal(alone[0], full[j], err_msg=f"row {j} alone")


@pytest.mark.parametrize("wtype", sorted(WEIGHT_TYPES))
def test_the_switch_picks_the_kernel(wtype: str) -> None:
    """Random activations, so that the skinny kernel's per-block sums and tinyBLAS's lane
    sums round differently: 32 rows in plain mode go through tinyBLAS (upstream's kernel)
    unless the switch is 2, which gives the skinny kernel's bits (batch-invariant mode's);
    under 16 rows plain mode keeps tinyBLAS even at 2; in batch-invariant mode 0 is
    tinyBLAS and 1 the skinny kernel."""
    if not has_skinny_gemm():
        pytest.skip("this CPU backend has no skinny GEMM (needs AVX-512 VNNI or AVX2+FMA+F16C)")
    weights, _, _ = operands(wtype, 1)
    acts = np.random.default_rng(5).standard_normal((32, K)).astype(np.float32)

    def run(invariant: bool, skinny: int, n: int = 32) -> np.ndarray:
        return mul_mat(wtype, weights, acts[:n], threads=2, invariant=invariant, skinny=skinny)

    upstream = run(False, 1)
    np.testing.assert_array_equal(run(False, 0), upstream)
    skinny_bits = run(True, 1)
    assert not np.array_equal(skinny_bits, upstream), "the two kernels must round differently"
    np.testing.assert_array_equal(run(False, 2), skinny_bits)
    np.testing.assert_array_equal(run(False, 2, n=8), run(False, 1, n=8))
    assert not np.array_equal(run(True, 0), skinny_bits)


@pytest.mark.parametrize("wtype", sorted(WEIGHT_TYPES))
@pytest.mark.parametrize("n", [1, 5, 16, 40])
def test_products_are_right(wtype: str, n: int) -> None:
    weights, exact_w, acts = operands(wtype, n, seed=n)
    want = acts.astype(np.float64) @ exact_w.T
    for invariant in (True, False):
        for skinny in (0, 1, 2):
            got = mul_mat(wtype, weights, acts, threads=2, invariant=invariant, skinny=skinny)
            scale = np.abs(acts) @ np.abs(exact_w).T  # the size of the terms summed
            ok = np.abs(got - want) <= 1e-6 * scale + 1e-6
            assert np.all(ok), f"invariant={invariant}, skinny_gemm={skinny}"


def test_the_benchs_product_timer_runs_the_same_kernels_and_rates_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kernel_rate (the floor table's int8 rate, bench/gemm_shapes.py) times a real product on
    the CPU backend in batch-invariant mode: every run is timed, and the rate is the shape's
    multiply-adds over the best time. (The rate's formula is checked on given times, not on a
    second timing: on a shared VM two timings of the same product differed 17x.)"""
    from swarmkv_bench import kernel_rate
    from swarmkv_bench.kernel_rate import RATE_SHAPE, int8_gmacs, mul_mat_ms

    times = mul_mat_ms("Q8_0", K, M, 16, threads=2, exact=True, reps=4)
    assert len(times) == 4 and all(t > 0 for t in times)
    type_name, k, m, n = RATE_SHAPE
    assert (type_name, k, n) == ("Q5_0", 640, 64)
    assert int8_gmacs(threads=2, reps=2) > 0  # one real timing of the rate shape
    seen: list[tuple] = []

    def given_times(*args: object) -> list[float]:
        seen.append(args)
        return [4.0, 2.0, 3.0]  # ms

    monkeypatch.setattr(kernel_rate, "mul_mat_ms", given_times)
    assert int8_gmacs(threads=2, exact=False, reps=3) == k * m * n / 2e6  # best of the runs
    assert seen == [(type_name, k, m, n, 2, False, 3)]
    monkeypatch.undo()
    with pytest.raises(ValueError, match="not 'Q2_K'"):
        mul_mat_ms("Q2_K", K, M, 1, threads=1, exact=True, reps=1)  # refused before ggml
