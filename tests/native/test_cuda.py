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


def test_exact_none_runs_plain_on_a_gpu_and_exact_true_is_refused(tiny_model_path) -> None:
    """The default on a GPU context: llama.cpp's kernels (the CUDA backend has no
    batch-invariant mode), said in the result; insisting on exact is a ConfigError."""
    import swarmkv as sk
    from swarmkv.errors import ConfigError

    with sk.Pipeline(tiny_model_path, n_ctx=512) as pipe:
        assert pipe.exact is False and "CUDA" in pipe.exact_choice.reason
        pipe.prefill(text="one two three four five six seven eight")
        pipe.branch("a", prompt=" nine", n_predict=4)
        pipe.branch("b", prompt=" ten", n_predict=4)
        fork, base = pipe.run("fork"), pipe.run("baseline")
    assert fork.exact is False and base.exact is False
    assert fork["a"].tokens == base["a"].tokens  # one short greedy answer: no near-tie here
    with pytest.raises(ConfigError, match="batch-invariant"):
        sk.Pipeline(tiny_model_path, n_ctx=512, exact=True)


def test_device_mode_copies_the_prefix_on_the_gpu(tiny_model_path) -> None:
    import swarmkv as sk

    with sk.Pipeline(tiny_model_path, n_ctx=512) as pipe:
        pipe.prefill(text="alpha beta gamma delta epsilon zeta eta theta")
        for i in range(3):
            pipe.branch(f"b{i}", prompt=f" iota {i}", n_predict=4)
        dev, host = pipe.run("device"), pipe.run("host")
    assert all(dev[n].tokens == host[n].tokens for n in dev.branches)
