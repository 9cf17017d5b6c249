"""Grouping perf samples by ggml op (swarmkv_bench.perf_samples), without perf or native code."""

from __future__ import annotations

from swarmkv_bench.perf_samples import classify, op_table


def test_kernels_map_to_their_op() -> None:
    lib = "libggml-cpu.so"
    skinny = classify(lib, "swarmkv_skinny<block_q8_0>::rows<2>")
    assert skinny == "MUL_MAT skinny GEMM (patch 0004)"
    assert classify(lib, "tinyBLAS_Q0_AVX<block_q5_0, block_q8_0, float>::gemm4xN<4>").startswith(
        "MUL_MAT llamafile"
    )
    assert classify(lib, "ggml_vec_dot_q4_K_q8_K") == "MUL_MAT vec_dot"
    assert classify(lib, "ggml_vec_dot_q6_K_q8_K_rows").startswith("MUL_MAT K-quant rows")
    assert classify(lib, "ggml_vec_dot_f16") == "FLASH_ATTN_EXT"
    # the batch-invariant attention's out-of-line helpers (a frame without flash_attn in it)
    assert classify(lib, "ggml_fa_bi_walk(ggml_fa_bi_op const&, long)") == "FLASH_ATTN_EXT"
    assert classify(lib, "ggml_fa_bi_rows(ggml_fa_bi_op const&, long, long)") == "FLASH_ATTN_EXT"
    assert classify("libgomp.so.1.0.0", "0x1f7da").startswith("thread sync")
    assert classify("libm.so.6", "0x72c29").startswith("libm")
    assert classify("libc.so.6", "0x16d9fd").startswith("other")


def test_op_table_splits_the_phase_time_by_share() -> None:
    samples = [
        (0.5, "libggml-cpu.so", "ggml_vec_dot_q6_K_q8_K"),
        (0.25, "libggml-cpu.so", "ggml_vec_dot_q4_K_q8_K"),
        (0.25, "libggml-cpu.so", "ggml_compute_forward_flash_attn_ext"),
    ]
    rows = op_table(samples, phase_ms=100.0)
    assert rows[0] == {"op": "MUL_MAT vec_dot", "share": 0.75, "ms": 75.0}
    assert rows[1]["op"] == "FLASH_ATTN_EXT" and rows[1]["ms"] == 25.0
