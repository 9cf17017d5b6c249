"""Run one ggml op on the CPU backend from Python (cdef_graph.h), for kernel tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from swarmkv._native import ffi, lib
from swarmkv_bench.kernel_rate import cpu_backend

# build(ctx) -> ([(input tensor, its bytes)], output tensor)
Builder = Callable[[Any], tuple[list[tuple[Any, bytes]], Any]]


def compiled_in(*features: str) -> bool:
    """Whether the loaded CPU backend (a portable build's variant, tests/native/
    test_cpu_variants.py, or the native one) was compiled with every one of these ggml
    features: which of SwarmKV's kernels it has."""
    from swarmkv.llama.install_info import ggml_cpu_features

    have = ggml_cpu_features()
    return all(f in have for f in features)


def has_batched_kernels() -> bool:
    """Whether upstream's batched paths (tiled matmul and attention) differ from its one-row
    ones on this backend: they are SIMD kernels, so a backend without AVX2 (x64) sums a batch
    the way it sums a row, and an invariance test has no failing control there."""
    return compiled_in("AVX2")


def has_skinny_gemm() -> bool:
    """Patch 0004's kernels: AVX-512 VNNI, or AVX2 with FMA and F16C."""
    return compiled_in("AVX512_VNNI") or compiled_in("AVX2", "FMA", "F16C")


def has_bi_attention() -> bool:
    """Patch 0005's attention: AVX-512, or AVX2 with FMA and F16C."""
    return compiled_in("AVX512") or compiled_in("AVX2", "FMA", "F16C")


def compute(
    build: Builder,
    threads: int = 2,
    invariant: bool = True,
    switches: Mapping[str, int] | None = None,
) -> np.ndarray:
    """The float32 output (flat) of the one-op graph that build makes, on a CPU backend with
    these kernel switches (swarmkv.llama.kernel_switches; the rest at their defaults)."""
    size = 8 * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead() + 1024
    params = ffi.new("struct ggml_init_params *", {"mem_size": size, "no_alloc": True})
    ctx = lib.ggml_init(params[0])
    assert ctx != ffi.NULL
    buf = ffi.NULL
    try:
        with cpu_backend(threads, invariant, switches) as backend:
            inputs, out = build(ctx)
            graph = lib.ggml_new_graph(ctx)
            lib.ggml_build_forward_expand(graph, out)
            buf = lib.ggml_backend_alloc_ctx_tensors(ctx, backend)
            assert buf != ffi.NULL
            for tensor, data in inputs:
                assert lib.ggml_nbytes(tensor) == len(data)
                lib.ggml_backend_tensor_set(tensor, data, 0, len(data))
            assert lib.ggml_backend_graph_compute(backend, graph) == lib.GGML_STATUS_SUCCESS
            result = np.empty(lib.ggml_nbytes(out) // 4, dtype=np.float32)
            lib.ggml_backend_tensor_get(out, ffi.from_buffer(result), 0, result.nbytes)
            return result
    finally:
        if buf != ffi.NULL:
            lib.ggml_backend_buffer_free(buf)
        lib.ggml_free(ctx)


def weight_product(
    type_id: int,
    m: int,
    weights: bytes,
    acts: np.ndarray,
    threads: int,
    invariant: bool,
    switches: Mapping[str, int] | None = None,
    repacked: bool = False,
) -> np.ndarray:
    """ggml_mul_mat(weights [m x k] of ggml type type_id, acts [n x k] f32): [n x m] f32.
    acts may have a third axis, planes in front ([planes x n x k] gives [planes x n x m]).
    repacked: the weights in the repack buffer type, repacked as they are set (the caller
    makes sure this CPU repacks that type at m rows, or ggml aborts)."""
    k, n = acts.shape[-1], acts.shape[-2]
    planes = acts.shape[0] if acts.ndim == 3 else 1
    src = np.ascontiguousarray(acts, dtype=np.float32).tobytes()
    with repacked_tensor(type_id, k, m, weights) if repacked else nullcontext() as stored:

        def build(ctx: Any) -> tuple[list[tuple[Any, bytes]], Any]:
            a, inputs = stored, []
            if a is None:
                a = lib.ggml_new_tensor_2d(ctx, type_id, k, m)
                inputs.append((a, weights))
            b = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, k, n, planes, 1)
            return [*inputs, (b, src)], lib.ggml_mul_mat(ctx, a, b)

        out = compute(build, threads, invariant, switches)
    return out.reshape((*acts.shape[:-1], m))


def repack_buffer_type() -> Any:
    """The CPU backend's repack buffer type (CPU_REPACK: weights interleaved for its gemm and
    gemv kernels, what Model(repack=True) loads into), or None in a build without one."""
    from swarmkv.llama.cpu_backend import extra_buffer_type_handles

    return extra_buffer_type_handles().get("CPU_REPACK")


@contextmanager
def repacked_tensor(type_id: int, k: int, m: int, weights: bytes) -> Iterator[Any]:
    """A [m x k] weight tensor of ggml type type_id in the repack buffer type, set (and so
    repacked) from weights; freed on exit."""
    buft = repack_buffer_type()
    assert buft is not None, "this build's CPU backend has no repack buffer type"
    size = 2 * lib.ggml_tensor_overhead()
    params = ffi.new("struct ggml_init_params *", {"mem_size": size, "no_alloc": True})
    ctx = lib.ggml_init(params[0])
    assert ctx != ffi.NULL
    buf = ffi.NULL
    try:
        w = lib.ggml_new_tensor_2d(ctx, type_id, k, m)
        buf = lib.ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft)
        assert buf != ffi.NULL and lib.ggml_nbytes(w) == len(weights)
        lib.ggml_backend_tensor_set(w, weights, 0, len(weights))
        yield w
    finally:
        if buf != ffi.NULL:
            lib.ggml_backend_buffer_free(buf)
        lib.ggml_free(ctx)


def assert_right_product(got: np.ndarray, acts: np.ndarray, exact_w: np.ndarray) -> None:
    """got is acts @ exact_w.T (the dequantized weights) up to the activations' 8-bit
    quantization (Q8_K or Q8_0, one scale per block): a relative error of the summed terms'
    size around 1/127 at most."""
    want = acts.astype(np.float64) @ exact_w.astype(np.float64).T
    scale = np.abs(acts).astype(np.float64) @ np.abs(exact_w).astype(np.float64).T
    assert np.all(np.abs(got - want) <= 1e-2 * scale)
