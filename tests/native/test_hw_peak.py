"""The hardware peaks (swarmkv/_native/peak.c through swarmkv_bench/hw_peak.py): the loop
each rate uses is the best the running CPU has, each loop counts what it did, and a model's
shape comes from its GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest

import swarmkv as sk
from swarmkv._native import ffi, lib
from swarmkv_bench.hw_floor import ModelShape
from swarmkv_bench.hw_peak import measure_peaks


def _cpu_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def test_each_loop_is_the_best_this_cpu_has_and_counts_its_work() -> None:
    flags = _cpu_flags()
    if "avx2" not in flags:
        pytest.skip("no AVX2 on this CPU: the peaks are not measured here (said in results)")
    int8 = ffi.string(lib.swarmkv_peak_int8_isa()).decode()
    want = (
        "AVX512_VNNI"
        if {"avx512_vnni", "avx512bw"} <= flags
        else "AVX_VNNI"
        if "avx_vnni" in flags
        else "AVX2"
    )
    assert int8 == want
    per_pass = {"AVX512_VNNI": 64, "AVX_VNNI": 32, "AVX2": 32}[int8] * 16  # 16 accumulators
    assert lib.swarmkv_peak_int8(1000) == 1000 * per_pass
    fma = ffi.string(lib.swarmkv_peak_fma_isa()).decode()
    assert fma == ("AVX512F" if "avx512f" in flags else "AVX2_FMA")
    assert lib.swarmkv_peak_fma(1000) == 1000 * 16 * (16 if fma == "AVX512F" else 8)
    buf = ffi.new("char[]", 4096 + 64)
    aligned = ffi.cast("char *", (int(ffi.cast("uintptr_t", buf)) + 63) // 64 * 64)
    assert lib.swarmkv_peak_read(aligned, 4096, 3) == 3 * 4096


def test_the_peaks_are_measured_on_every_thread() -> None:
    peaks = measure_peaks(threads=2, reps=1)
    assert peaks.threads == 2
    for rate in (peaks.int8_gmacs, peaks.fma_gfmas, peaks.read_gbps):
        assert rate is None or rate > 0
    if "avx2" in _cpu_flags():
        assert peaks.int8_gmacs and peaks.fma_gfmas and peaks.read_gbps


def test_the_shape_comes_from_the_gguf(tiny_model_path: Path, tiny_model: sk.Model) -> None:
    shape = ModelShape.from_gguf(tiny_model_path)
    assert shape.n_layer == tiny_model.n_layer and shape.n_head > 0
    assert 0 < shape.layer_weights < tiny_model.n_params
    assert shape.weight_bytes > 0 and shape.output_weights > 0
