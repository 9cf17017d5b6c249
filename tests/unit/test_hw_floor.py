"""The hardware floor's arithmetic (swarmkv_bench/hw_floor.py) on a made-up model and CPU."""

from __future__ import annotations

import pytest

from swarmkv_bench.hw_floor import ModelShape, decode_floor
from swarmkv_bench.hw_peak import HardwarePeaks

# 2 layers, 2 query heads of 64 + 64 dims, 1 KV head, a 100-cell window
SHAPE = ModelShape(
    layer_weights=10**9,
    output_weights=10**8,
    weight_bytes=10**9,
    n_layer=2,
    n_head=2,
    n_head_kv=1,
    head_k=64,
    head_v=64,
    window=100,
)
PEAKS = HardwarePeaks(2, "AVX2", 100.0, "AVX2_FMA", 1e-3, 50.0)


def test_each_bound_counts_its_own_work() -> None:
    f = decode_floor(SHAPE, PEAKS, [10, 300], logit_rows=1, shared_cells=300)
    assert f.int8_ms == pytest.approx((2 * 10**9 + 10**8) / 100e6)  # 21 ms
    # attention: 2 layers x 2 heads x 128 dims x (10 + min(300, window 100)) cells
    assert f.fma_ms == pytest.approx(2 * 2 * 128 * 110 / (1e-3 * 1e6))
    # bytes: the weights, and each layer's K and V (f16) of the cells the rows share, once
    assert f.read_ms == pytest.approx((10**9 + 2 * 2 * 128 * 100) / 50e6)
    assert f.bound == "fma" and f.floor_ms == f.fma_ms


def test_the_floor_is_the_largest_bound_and_missing_peaks_are_left_out() -> None:
    fast_attention = HardwarePeaks(2, "AVX2", 100.0, "AVX2_FMA", 1e3, 50.0)
    f = decode_floor(SHAPE, fast_attention, [10] * 4, logit_rows=4, shared_cells=14)
    assert f.bound == "int8" and f.floor_ms == pytest.approx((4 * 10**9 + 4 * 10**8) / 100e6)
    unknown = HardwarePeaks(2, "", None, "", None, None)
    f = decode_floor(SHAPE, unknown, [10], 1, 10)
    assert f.floor_ms is None and f.bound == "none"


def test_a_model_without_a_window_sees_every_cell() -> None:
    flat = ModelShape(**{**SHAPE.__dict__, "window": 0})
    assert flat.seen(3000) == 3000 and SHAPE.seen(3000) == 100 and SHAPE.seen(7) == 7


def test_the_best_reading_of_each_rate_counts() -> None:
    from swarmkv_bench.hw_peak import best_of

    slow = HardwarePeaks(2, "AVX2", 200.0, "AVX2_FMA", 120.0, None)
    fast = HardwarePeaks(2, "AVX2", 400.0, "AVX2_FMA", 100.0, 60.0)
    assert best_of([slow, fast]) == HardwarePeaks(2, "AVX2", 400.0, "AVX2_FMA", 120.0, 60.0)
