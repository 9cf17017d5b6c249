"""The error contract of the native owners, on the tiny model: a closed object raises
ClosedError, a native object that cannot be made raises InitError (or ModelLoadError /
ContextCreateError), a bad size is a ConfigError before any native call; Ctrl-C belongs to
the run it interrupted; pool views are tracked without reference counts; a model's contexts
can be made and closed from many threads while it closes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import swarmkv.llama.batch as batch_module
import swarmkv.llama.pool as pool_module
from swarmkv import (
    Batch,
    ClosedError,
    ConfigError,
    Context,
    HostBufferPool,
    InitError,
    Model,
    Pipeline,
    Sampler,
    SwarmKVError,
)
from swarmkv.dist.fanout import RayFanout
from swarmkv.llama.sampling import SamplerConfig
from swarmkv.process.interrupt import Interrupted, ctrl_c_sets_flag

SMALL: dict[str, Any] = {"n_ctx": 256, "n_batch": 64, "n_threads": 1}
DOC = "SwarmKV prefills a shared document once and fans it out to many branches. " * 4


class _Patched:
    """A cffi object (lib or ffi) with some attributes replaced: cffi's own objects take no
    new attributes, so a test swaps the module's name for this proxy."""

    def __init__(self, real: Any, **fake: Any) -> None:
        self._real = real
        self.__dict__.update(fake)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


# -- 1. closed means ClosedError, whatever the object ------------------------------------


def test_a_closed_model_raises_closed_error(tiny_model_path: Path) -> None:
    model = Model(tiny_model_path)
    model.close()
    for use in (
        lambda: model.n_vocab,
        lambda: model.tokenize("hi"),
        lambda: model.ptr,
        lambda: Context(model, **SMALL),
    ):
        with pytest.raises(ClosedError, match="Model is closed"):
            use()


def test_a_closed_context_raises_closed_error(tiny_model: Model) -> None:
    ctx = Context(tiny_model, **SMALL)
    ctx.close()
    with Batch(4) as batch:
        batch.add(1, 0, [0], logits=True)
        for use in (
            lambda: ctx.ptr,
            lambda: ctx.decode(batch),
            lambda: ctx.logits(0),
            lambda: ctx.seq_rm(0),
        ):
            with pytest.raises(ClosedError, match="Context is closed"):
                use()


def test_a_closed_batch_and_sampler_raise_closed_error(tiny_model: Model) -> None:
    batch = Batch(4)
    batch.close()
    for use in (lambda: batch.raw, lambda: batch.add(1, 0, [0]), batch.clear):
        with pytest.raises(ClosedError, match="Batch is closed"):
            use()
    sampler = Sampler()
    sampler.close()
    with Context(tiny_model, **SMALL) as ctx:
        for use in (lambda: sampler.ptr, sampler.reset, lambda: sampler.sample(ctx, 0)):
            with pytest.raises(ClosedError, match="Sampler is closed"):
                use()


def test_a_closed_pool_and_a_released_buffer_raise_closed_error() -> None:
    pool = HostBufferPool()
    released, held = pool.alloc(64), pool.alloc(64)
    released.release()
    with pytest.raises(ClosedError, match="HostBuffer used after release"):
        released.view  # noqa: B018
    pool.close()
    with pytest.raises(ClosedError, match="HostBufferPool is closed"):
        pool.alloc(16)
    with pytest.raises(ClosedError, match="HostBufferPool is closed"):
        pool.copy_of(b"abc")
    with pytest.raises(ClosedError, match="HostBuffer used after release"):
        held.view  # noqa: B018


def test_a_closed_ray_fanout_raises_closed_error(tiny_model: Model) -> None:
    # a fan-out whose workers are gone, as close() leaves it (no Ray needed to build it)
    fan = RayFanout.__new__(RayFanout)
    fan._actors, fan._started_ray, fan.exact, fan.threads, fan.infos = [], False, True, 1, []
    with Pipeline(tiny_model, n_threads=1) as p:
        p.prefill("doc", text=DOC)
        p.branch("a", prompt=" Q:", n_predict=2)
        with pytest.raises(ClosedError, match="RayFanout is closed"):
            fan.run(p)


# -- 2. a native object that cannot be made: InitError -----------------------------------


def test_a_pool_buffer_the_machine_cannot_give_raises_init_error() -> None:
    with HostBufferPool() as pool, pytest.raises(InitError, match="failed"):
        pool.alloc(1 << 60)
    assert pool.stats().n_buffers == 0


def test_a_null_pool_buffer_raises_init_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Patched(pool_module.lib, ggml_backend_buft_alloc_buffer=lambda *_: pool_module.ffi.NULL)
    monkeypatch.setattr(pool_module, "lib", fake)
    with HostBufferPool() as pool:
        with pytest.raises(InitError, match=r"ggml_backend_buft_alloc_buffer\(CPU, 100\)"):
            pool.alloc(100)
        pool.check()
        assert pool.stats().n_buffers == 0


def test_a_short_pool_buffer_raises_init_error_and_is_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freed: list[object] = []
    real = pool_module.lib

    def free(handle: object) -> None:
        freed.append(handle)
        real.ggml_backend_buffer_free(handle)

    fake = _Patched(real, ggml_backend_buffer_get_size=lambda _h: 10, ggml_backend_buffer_free=free)
    monkeypatch.setattr(pool_module, "lib", fake)
    with HostBufferPool() as pool, pytest.raises(InitError, match="came back with 10 bytes"):
        pool.alloc(100)
    assert len(freed) == 1


def test_a_batch_without_memory_raises_init_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memory(*_args: object) -> object:
        raise MemoryError

    monkeypatch.setattr(batch_module, "ffi", _Patched(batch_module.ffi, new=no_memory))
    with pytest.raises(InitError, match="batch of 8 tokens"):
        Batch(8, 2)


def test_a_null_sampler_chain_raises_init_error(monkeypatch: pytest.MonkeyPatch) -> None:
    null = batch_module.ffi.NULL
    fake = _Patched(batch_module.lib, llama_sampler_chain_init=lambda _params: null)
    monkeypatch.setattr(batch_module, "lib", fake)
    with pytest.raises(InitError, match="llama_sampler_chain_init"):
        Sampler()


def test_a_null_sampler_stage_raises_init_error_and_frees_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = batch_module.lib
    freed: list[object] = []

    def free(chain: object) -> None:
        freed.append(chain)
        real.llama_sampler_free(chain)

    fake = _Patched(
        real,
        llama_sampler_init_top_k=lambda _k: batch_module.ffi.NULL,
        llama_sampler_free=free,
    )
    monkeypatch.setattr(batch_module, "lib", fake)
    with pytest.raises(InitError, match="llama_sampler_init_top_k"):
        Sampler(SamplerConfig(temperature=0.8, top_k=40))
    assert len(freed) == 1, "the chain made before the failing stage is freed at once"


# -- 3. sizes are checked before any native call -----------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "match"),
    [
        (10.5, r"nbytes must be an integer, got 10\.5 \(float\)"),
        (10.0, r"nbytes must be an integer, got 10\.0 \(float\)"),
        ("10", r"nbytes must be an integer, got '10' \(str\)"),
        (True, r"nbytes must be an integer, got True \(bool\)"),
        (None, r"nbytes must be an integer, got None"),
        (0, r"nbytes must be >= 1, got 0"),
        (-1, r"nbytes must be >= 1, got -1"),
        (1 << 70, r"nbytes must be <= "),
    ],
)
def test_pool_sizes_are_checked_before_any_native_call(
    monkeypatch: pytest.MonkeyPatch, nbytes: object, match: str
) -> None:
    def refuse(*_args: object) -> object:
        raise AssertionError("a native allocation was attempted")

    with HostBufferPool() as pool:
        monkeypatch.setattr(
            pool_module, "lib", _Patched(pool_module.lib, ggml_backend_buft_alloc_buffer=refuse)
        )
        with pytest.raises(ConfigError, match=match):
            pool.alloc(nbytes)  # type: ignore[arg-type]


def test_copy_of_counts_bytes_not_items() -> None:
    src = np.arange(10, dtype=np.float32)
    with HostBufferPool() as pool:
        copy = pool.copy_of(src.data)  # a memoryview of 4-byte items
        assert copy.nbytes == 40
        assert np.array_equal(np.frombuffer(copy.view, dtype=np.float32), src)
        with pytest.raises(ConfigError, match="nbytes must be >= 1, got 0"):
            pool.copy_of(b"")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1.5,), r"batch capacity must be an integer, got 1\.5"),
        ((0,), r"batch capacity 0 is out of range \[1, 2\*\*31\)"),
        ((1 << 40,), r"batch capacity 1099511627776 is out of range"),
        ((8, 2.0), r"batch n_seq_max must be an integer, got 2\.0"),
        ((8, 0), r"batch n_seq_max 0 is out of range \[1, 257\)"),
        ((8, 1000), r"batch n_seq_max 1000 is out of range \[1, 257\)"),
    ],
)
def test_batch_sizes_are_checked_before_any_native_call(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Batch(*args)


# -- 5. Ctrl-C belongs to the run it interrupted -------------------------------------------


def test_a_run_after_an_interrupted_run_succeeds(tiny_model: Model) -> None:
    def ctrl_c(_name: str, _token: int, _piece: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # what a user's Ctrl-C does, mid-run
        time.sleep(0.05)  # the handler runs in the main thread at its next bytecode

    for mode in ("fork", "host"):
        with Pipeline(tiny_model, n_threads=1, n_ctx=512) as p:
            p.prefill("doc", text=DOC)
            p.branch("a", prompt=" Question:", n_predict=8, on_token=ctrl_c)
            with ctrl_c_sets_flag(), pytest.raises(Interrupted):
                p.run(mode=mode)
        with Pipeline(tiny_model, n_threads=1, n_ctx=512) as again:
            again.prefill("doc", text=DOC)
            again.branch("a", prompt=" Question:", n_predict=4)
            result = again.run(mode=mode)  # the same process, a later run: not interrupted
        assert result.outcomes["a"].status == "ok", result.outcomes["a"]
        assert len(result["a"].tokens) >= 1


# -- 6. pool views are tracked without reference counts ------------------------------------


@pytest.fixture
def no_refcounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """sys.getrefcount as free-threaded CPython or PyPy may answer it: not a live count
    (immortal, deferred or unsupported), here a large number."""
    monkeypatch.setattr(sys, "getrefcount", lambda _obj: 1 << 30)


@pytest.mark.usefixtures("no_refcounts")
def test_a_released_block_is_reused_without_refcounts() -> None:
    with HostBufferPool() as pool:
        buf = pool.alloc(1000)
        arr = np.frombuffer(buf.view, dtype=np.uint8)
        sliced = buf.view[10:20]
        del arr, sliced
        block = buf.block
        buf.release()
        assert pool.alloc(1000).block is block, "no view is left: the block is reused"


def _made_from(view: memoryview, how: str) -> Any:
    if how == "numpy":
        return np.frombuffer(view, dtype=np.uint8)
    if how == "slice":
        return view[10:20]
    if how == "numpy_of_slice":
        return np.frombuffer(view[0:100], dtype=np.uint8)
    if how == "memoryview":
        return memoryview(view)
    return view.obj  # the buffer object under the view


@pytest.mark.usefixtures("no_refcounts")
@pytest.mark.parametrize("how", ["numpy", "slice", "numpy_of_slice", "memoryview", "obj"])
def test_a_block_still_viewed_is_retired_without_refcounts(how: str) -> None:
    with HostBufferPool() as pool:
        buf = pool.alloc(1000)
        buf.view[:] = b"A" * 1000
        kept = _made_from(buf.view, how)
        old_block, freed = buf.block, buf.block.keeper.finalizer
        buf.release()
        nxt = pool.alloc(1000)
        assert nxt.block is not old_block, "a still-viewed block must not be reused"
        nxt.view[:] = b"B" * 1000
        assert bytes(kept)[:1] == b"A"
        pool.check()
        del buf, old_block, kept
        assert not freed.alive, "freed once the last view went"


# -- 7. a model's contexts, from many threads, while it closes ----------------------------


def _close_while_threads_make_contexts(path: Path) -> list[BaseException]:
    """One round: 4 threads make and close contexts while this thread closes the model
    (retrying while it refuses); returns what went wrong beyond the contract."""
    model = Model(path)
    closed_ones = [Context(model, **SMALL) for _ in range(3)]
    for c in closed_ones:
        c.close()  # still referenced: the model's set of contexts stays long
    errors: list[BaseException] = []
    go = threading.Event()

    def churn() -> None:
        go.wait()
        try:
            for _ in range(15):
                with Context(model, **SMALL):
                    pass
        except ClosedError:
            pass  # the model closed between two contexts: the contract
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: inside close()'s look at the set too
    try:
        go.set()
        while not model.closed:
            try:
                model.close()
            except ClosedError as exc:
                errors.append(exc)
                break
            except SwarmKVError as exc:  # refused while a context is open: the contract
                if "still open" not in str(exc):
                    errors.append(exc)
                    break
            except BaseException as exc:  # "Set changed size during iteration"
                errors.append(exc)
                break
    finally:
        sys.setswitchinterval(switch)
        for t in threads:
            t.join()
    if not model.closed:
        model.close()
    with pytest.raises(ClosedError):
        Context(model, **SMALL)
    return errors


def test_contexts_made_and_closed_on_many_threads_while_the_model_closes(
    tiny_model_path: Path,
) -> None:
    """Before the lock, close() could free the model while a thread was inside
    llama_init_from_model (an abort: "pure virtual method called"), or iterate the set while
    a thread added to it."""
    for _ in range(6):  # the old code crashed within 8 rounds, 4 runs out of 4
        assert _close_while_threads_make_contexts(tiny_model_path) == []


# -- 8. dead code --------------------------------------------------------------------------


def test_context_has_no_state_size() -> None:
    assert not hasattr(Context, "state_size")
