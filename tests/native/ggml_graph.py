"""Run one ggml op on the CPU backend from Python (cdef_graph.h), for kernel tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from swarmkv._native import ffi, lib
from swarmkv_bench.kernel_rate import cpu_backend

# build(ctx) -> ([(input tensor, its bytes)], output tensor)
Builder = Callable[[Any], tuple[list[tuple[Any, bytes]], Any]]


def compute(build: Builder, threads: int = 2, invariant: bool = True) -> np.ndarray:
    """The float32 output (flat) of the one-op graph that build makes."""
    size = 8 * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead() + 1024
    params = ffi.new("struct ggml_init_params *", {"mem_size": size, "no_alloc": True})
    ctx = lib.ggml_init(params[0])
    assert ctx != ffi.NULL
    buf = ffi.NULL
    try:
        with cpu_backend(threads, invariant) as backend:
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
    type_id: int, m: int, weights: bytes, acts: np.ndarray, threads: int, invariant: bool
) -> np.ndarray:
    """ggml_mul_mat(weights [m x k] of ggml type type_id, acts [n x k] f32): [n x m] f32."""
    n, k = acts.shape
    src = np.ascontiguousarray(acts, dtype=np.float32).tobytes()

    def build(ctx: Any) -> tuple[list[tuple[Any, bytes]], Any]:
        a = lib.ggml_new_tensor_2d(ctx, type_id, k, m)
        b = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, k, n)
        return [(a, weights), (b, src)], lib.ggml_mul_mat(ctx, a, b)

    return compute(build, threads, invariant).reshape(n, m)
