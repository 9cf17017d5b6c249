"""HostBufferPool: host memory for KV snapshots, allocated through ggml.

The pool asks ggml for the host buffer type of the GPU device when a GPU backend is loaded
(pinned `CUDA_Host` memory under CUDA, so host<->device copies run at full PCIe speed) and for
the plain CPU buffer type otherwise; `pool.kind` says which it got.

Invariants (checked by `check()`):

| quantity         | meaning                                               |
|------------------|-------------------------------------------------------|
| bytes_allocated  | sum of sizes of every ggml buffer the pool holds      |
| bytes_in_use     | sum of sizes of buffers handed out and not released   |
| bytes_free       | bytes_allocated - bytes_in_use, kept for reuse        |
| peak_in_use      | max of bytes_in_use over the pool's life              |

A HostBuffer's memoryview is valid until the buffer is released; released buffers are kept
for reuse (best fit by size) until `trim()` or `close()` frees them, so a long run that
forks the same snapshot size again and again does not grow memory.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ._native import ffi, lib
from .errors import PoolError


@dataclass(frozen=True)
class PoolStats:
    kind: str
    bytes_allocated: int
    bytes_in_use: int
    peak_in_use: int
    n_buffers: int
    n_in_use: int


@dataclass
class _Block:
    """One ggml buffer the pool holds; HostBuffers are one-use tickets for it."""

    handle: Any
    base: Any
    capacity: int


class HostBuffer:
    """One allocation from the pool. `view` is a writable memoryview of exactly `nbytes` bytes.

    A HostBuffer is used once: after release() it (and its view) refuses further use, and a
    later alloc that reuses the same memory gets a new HostBuffer, so a stale reference can
    neither read nor release the next owner's bytes.
    """

    def __init__(self, pool: HostBufferPool, block: _Block, nbytes: int) -> None:
        self._pool = pool
        self.block = block
        self.capacity = block.capacity
        self.nbytes = nbytes
        self._view: memoryview | None = memoryview(ffi.buffer(block.base, nbytes))

    @property
    def handle(self) -> Any:
        """The ggml_backend_buffer_t behind this allocation (shared with later reuses)."""
        return self.block.handle

    @property
    def view(self) -> memoryview:
        if self._view is None:
            raise PoolError("HostBuffer used after release")
        return self._view

    @property
    def released(self) -> bool:
        return self._view is None

    def release(self) -> None:
        """Give the memory back to the pool (idempotent)."""
        if self._view is not None:
            self._drop_view()
            self._pool._give_back(self)

    def _drop_view(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            # someone may still export it (numpy): then only our reference goes
            with contextlib.suppress(BufferError):
                view.release()

    def __enter__(self) -> HostBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _free_all(handles: list[Any]) -> None:
    for handle in handles:
        lib.ggml_backend_buffer_free(handle)
    handles.clear()


def pick_buffer_type(prefer_device: bool) -> Any:
    """The first GPU device's host (pinned) buffer type when preferred and present, else CPU."""
    if prefer_device:
        dev = lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_GPU)
        if dev != ffi.NULL:
            buft = lib.ggml_backend_dev_host_buffer_type(dev)
            if buft != ffi.NULL:
                return buft
    return lib.ggml_backend_cpu_buffer_type()


class HostBufferPool:
    """Owns every host buffer it hands out; thread-safe."""

    def __init__(self, *, prefer_device: bool = True) -> None:
        self._buft = pick_buffer_type(prefer_device)
        self.kind = ffi.string(lib.ggml_backend_buft_name(self._buft)).decode()
        self._lock = threading.Lock()
        self._handles: list[Any] = []  # every ggml buffer held; freed by the finalizer
        self._free: list[_Block] = []
        self._in_use: dict[int, HostBuffer] = {}
        self._peak = 0
        self._finalizer = weakref.finalize(self, _free_all, self._handles)

    @property
    def pinned(self) -> bool:
        return self.kind != "CPU"

    def alloc(self, nbytes: int) -> HostBuffer:
        """A buffer of at least nbytes (reused when a released one fits)."""
        if nbytes < 1:
            raise PoolError(f"cannot allocate {nbytes} bytes")
        with self._lock:
            if not self._finalizer.alive:
                raise PoolError("HostBufferPool is closed")
            block = self._take_free(nbytes) or self._new_block(nbytes)
            buf = HostBuffer(self, block, nbytes)
            self._in_use[id(buf)] = buf
            self._peak = max(self._peak, self._bytes_in_use())
            return buf

    def copy_of(self, src: memoryview | bytes) -> HostBuffer:
        """A new buffer holding a copy of src (copy-on-fork of snapshot bytes)."""
        buf = self.alloc(len(src))
        buf.view[:] = src
        return buf

    def _take_free(self, nbytes: int) -> _Block | None:
        fits = [b for b in self._free if b.capacity >= nbytes]
        if not fits:
            return None
        best = min(fits, key=lambda b: b.capacity)
        self._free.remove(best)
        return best

    def _new_block(self, nbytes: int) -> _Block:
        handle = lib.ggml_backend_buft_alloc_buffer(self._buft, nbytes)
        if handle == ffi.NULL:
            raise PoolError(f"ggml_backend_buft_alloc_buffer({self.kind}, {nbytes}) failed")
        size = int(lib.ggml_backend_buffer_get_size(handle))
        base = lib.ggml_backend_buffer_get_base(handle)
        if size < nbytes or base == ffi.NULL:
            lib.ggml_backend_buffer_free(handle)
            raise PoolError(f"{self.kind} buffer of {nbytes} bytes came back with {size} bytes")
        self._handles.append(handle)
        return _Block(handle, base, size)

    def _give_back(self, buf: HostBuffer) -> None:
        with self._lock:
            if self._in_use.pop(id(buf), None) is not None and self._finalizer.alive:
                self._free.append(buf.block)

    def _bytes_in_use(self) -> int:
        return sum(b.capacity for b in self._in_use.values())

    def trim(self) -> int:
        """Free every released buffer; returns the bytes freed."""
        with self._lock:
            freed = 0
            for block in self._free:
                self._handles.remove(block.handle)
                lib.ggml_backend_buffer_free(block.handle)
                freed += block.capacity
            self._free.clear()
            return freed

    def stats(self) -> PoolStats:
        with self._lock:
            allocated = sum(int(lib.ggml_backend_buffer_get_size(h)) for h in self._handles)
            return PoolStats(
                self.kind,
                allocated,
                self._bytes_in_use(),
                self._peak,
                len(self._handles),
                len(self._in_use),
            )

    def check(self) -> None:
        """Raise PoolError if the bookkeeping disagrees with the buffers held."""
        with self._lock:
            held = [id(h) for h in self._handles]
            tracked = [id(b.handle) for b in self._free]
            tracked += [id(b.block.handle) for b in self._in_use.values()]
            if len(set(held)) != len(held) or sorted(held) != sorted(tracked):
                raise PoolError(
                    f"pool integrity: {len(held)} buffers held, {len(tracked)} "
                    "tracked (each must be held and tracked exactly once)"
                )
            if any(b.released for b in self._in_use.values()):
                raise PoolError("pool integrity: a released buffer is still marked in use")

    def close(self) -> None:
        """Free every buffer; views handed out become invalid. Idempotent."""
        with self._lock:
            for buf in self._in_use.values():
                buf._drop_view()
            self._free.clear()
            self._in_use.clear()
            self._finalizer()

    def __enter__(self) -> HostBufferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
