"""One ggml MUL_MAT on the CPU backend, timed: the int8 multiply-add rate this build's weight
kernels reach on this machine, for the floor table's arithmetic floor and bench/gemm_shapes.py.

The rate is measured on a product that fits in L2 (a Q5_0 [2048 x 640] weight, the model's
ffn_up, times 64 activation rows), so it is bound by arithmetic, not memory: the best rate
the kernels reach here, not the CPU's peak, which no kernel of this build attains.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

# enum ggml_type values (as in gguf's GGMLQuantizationType)
GGML_TYPES = {"Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
# bytes per block (32 weights; K-quants: 256) and where its f16 scales sit
BLOCK_BYTES = {"Q5_0": 22, "Q8_0": 34, "Q4_K": 144, "Q6_K": 210}
SCALE_AT = {"Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}
RATE_SHAPE = ("Q5_0", 640, 2048, 64)  # type, k, m, n: ffn_up by 64 rows


@contextmanager
def cpu_backend(
    threads: int, exact: bool, switches: Mapping[str, int] | None = None
) -> Iterator[Any]:
    """A CPU backend with the thread count, batch-invariant mode and kernel switches
    (swarmkv.llama.kernel_switches) set, freed on exit; the kernel tests' one-op graphs
    (tests/native/ggml_graph.py) run on it too."""
    from swarmkv._native import ffi, lib
    from swarmkv.llama.cpu_backend import check_switch_values, cpu_proc, switch_id
    from swarmkv.llama.kernel_switches import normalize_switches

    chosen = normalize_switches(switches or {})
    check_switch_values(chosen)
    dev = lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU)
    backend = lib.ggml_backend_dev_init(dev, ffi.NULL)
    if backend == ffi.NULL:
        raise RuntimeError("ggml_backend_dev_init failed for the CPU device")
    try:
        cpu_proc("ggml_backend_set_n_threads", "void (*)(ggml_backend_t, int)")(backend, threads)
        cpu_proc("ggml_backend_cpu_set_batch_invariant", "void (*)(ggml_backend_t, bool)")(
            backend, exact
        )
        set_switch = cpu_proc(
            "ggml_backend_cpu_set_switch", "bool (*)(ggml_backend_t, enum ggml_cpu_switch, int32_t)"
        )
        for name, value in chosen:
            if not set_switch(backend, switch_id(name), value):
                raise RuntimeError(f"the CPU backend refused kernel switch {name}={value}")
        yield backend
    finally:
        lib.ggml_backend_free(backend)


def _weights(type_name: str, nbytes: int) -> np.ndarray:
    """Random quantized blocks, every f16 scale of a block 2^-7 (bytes 0x00 0x20)."""
    w = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    blocks = w.reshape(-1, BLOCK_BYTES[type_name])
    for at in SCALE_AT[type_name]:
        blocks[:, at], blocks[:, at + 1] = 0, 0x20
    return w


def mul_mat_ms(
    type_name: str,
    k: int,
    m: int,
    n: int,
    threads: int,
    exact: bool,
    reps: int,
    switches: Mapping[str, int] | None = None,
) -> list[float]:
    """ms of each of reps runs of MUL_MAT [m x k] x [n x k] (after one warm-up run), on a CPU
    backend with these kernel switches."""
    if type_name not in GGML_TYPES:
        raise ValueError(f"kernel_rate times {sorted(GGML_TYPES)} weights, not {type_name!r}")
    from swarmkv._native import ffi, lib

    size = 8 * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead() + 1024
    params = ffi.new("struct ggml_init_params *", {"mem_size": size, "no_alloc": True})
    ctx = lib.ggml_init(params[0])
    buf = ffi.NULL
    try:
        with cpu_backend(threads, exact, switches) as backend:
            a = lib.ggml_new_tensor_2d(ctx, GGML_TYPES[type_name], k, m)
            b = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, k, n)
            graph = lib.ggml_new_graph(ctx)
            lib.ggml_build_forward_expand(graph, lib.ggml_mul_mat(ctx, a, b))
            buf = lib.ggml_backend_alloc_ctx_tensors(ctx, backend)
            if buf == ffi.NULL:
                raise RuntimeError("could not allocate the product's tensors")
            w = _weights(type_name, lib.ggml_nbytes(a))
            lib.ggml_backend_tensor_set(a, ffi.from_buffer(w), 0, w.nbytes)
            x = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
            lib.ggml_backend_tensor_set(b, ffi.from_buffer(x), 0, x.nbytes)
            times = []
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                if lib.ggml_backend_graph_compute(backend, graph) != lib.GGML_STATUS_SUCCESS:
                    raise RuntimeError("ggml_backend_graph_compute failed")
                times.append((time.perf_counter() - t0) * 1e3)
            return times[1:]
    finally:
        if buf != ffi.NULL:
            lib.ggml_backend_buffer_free(buf)
        lib.ggml_free(ctx)


def int8_gmacs(threads: int, exact: bool = True, reps: int = 15) -> float:
    """Multiply-adds per second (G) of the best of reps runs of RATE_SHAPE."""
    type_name, k, m, n = RATE_SHAPE
    best = min(mul_mat_ms(type_name, k, m, n, threads, exact, reps))
    return k * m * n / (best * 1e6)
