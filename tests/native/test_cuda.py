"""GPU-only checks: run with a CUDA build on a machine with a GPU; skipped (and counted)
elsewhere."""

from __future__ import annotations

import pytest

from swarmkv import HostBufferPool
from swarmkv._native import ffi, lib


def _gpu_present() -> bool:
    return lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_GPU) != ffi.NULL


pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not _gpu_present(), reason="no GPU backend device (CPU build or no GPU)"),
]


def test_pool_uses_pinned_cuda_host_memory() -> None:
    with HostBufferPool() as pool:
        assert pool.kind == "CUDA_Host"
        assert pool.pinned
        buf = pool.alloc(1 << 20)
        buf.view[:4] = b"swkv"
        assert bytes(buf.view[:4]) == b"swkv"
