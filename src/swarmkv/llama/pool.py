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

Memory safety of views. Each ggml buffer is freed by a finalizer that every memoryview over
it keeps alive (through the cffi pointer its buffer object holds), so no view, numpy array or
slice made from one can ever outlive the memory under it: `close()` and `trim()` only drop
the pool's own references, and a buffer still viewed is freed when its last view goes.
A released HostBuffer's block is reused (best fit by size) only if nothing made from its view
is still alive; otherwise it is retired, so a stale view can never read the next owner's
bytes. A long run that forks the same snapshot size again and again does not grow memory.

Whether something made from a view is alive is tracked explicitly, not with reference counts
(which free-threaded CPython and PyPy do not report as live counts): a numpy array over the
view holds an export of it (releasing the view then fails), and every other view made from
it (a slice, memoryview(view), view.obj) holds the buffer object the view was made from,
which the HostBuffer watches through a weak reference. Where objects are not freed at once
(PyPy), a block may be retired that could have been reused; never the reverse.

Sizes are checked before any native call (ConfigError naming the argument); a buffer the
machine cannot give is an InitError; a closed pool or a released buffer raises ClosedError.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from .._native import ffi, lib
from ..checks import check_int
from ..errors import ClosedError, InitError, PoolError


@dataclass(frozen=True)
class PoolStats:
    """A consistent snapshot of a pool's bookkeeping; sizes in bytes (see the module table)."""

    kind: str
    bytes_allocated: int
    bytes_in_use: int
    peak_in_use: int
    n_buffers: int
    n_in_use: int


log = logging.getLogger("swarmkv.llama.pool")
_SIZE_MAX = 2**63 - 1  # ggml takes a size_t; no machine has more bytes than this


class _Keeper:
    """Frees one ggml buffer when the last reference to it goes (weakref.finalize)."""

    def __init__(self, handle: Any) -> None:
        self.finalizer = weakref.finalize(self, lib.ggml_backend_buffer_free, handle)


@dataclass
class _Block:
    """One ggml buffer the pool holds; HostBuffers are one-use tickets for it.

    `ptr` is the buffer's base address as a cffi pointer whose lifetime holds the keeper: a
    memoryview over it (through ffi.buffer) keeps the ggml buffer alive.
    """

    handle: Any
    ptr: Any
    capacity: int
    keeper: _Keeper = field(repr=False)


def _new_block(buft: Any, kind: str, nbytes: int) -> _Block:
    handle = lib.ggml_backend_buft_alloc_buffer(buft, nbytes)
    if handle == ffi.NULL:
        raise InitError(f"ggml_backend_buft_alloc_buffer({kind}, {nbytes}) failed")
    keeper = _Keeper(handle)  # from here on the buffer is freed exactly once, whatever happens
    size = int(lib.ggml_backend_buffer_get_size(handle))
    base = lib.ggml_backend_buffer_get_base(handle)
    if size < nbytes or base == ffi.NULL:
        keeper.finalizer()
        raise InitError(f"{kind} buffer of {nbytes} bytes came back with {size} bytes")
    # ffi.gc ties the keeper to this pointer object: the destructor (a no-op) holds it.
    ptr = ffi.gc(ffi.cast("char *", base), lambda _p, _k=keeper: None)
    return _Block(handle, ptr, size, keeper)


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
        exporter = ffi.buffer(block.ptr, nbytes)  # one per ticket: see _drop_view
        # every view made from ours (a slice, memoryview(view), view.obj) holds the exporter
        self._exporter_ref: weakref.ref[Any] = weakref.ref(exporter)
        self._view: memoryview | None = memoryview(exporter)

    @property
    def handle(self) -> Any:
        """The ggml_backend_buffer_t behind this allocation (shared with later reuses)."""
        return self.block.handle

    @property
    def view(self) -> memoryview:
        """Writable memoryview of exactly nbytes bytes; ClosedError after release() (or the
        pool's close())."""
        if self._view is None:
            raise ClosedError("HostBuffer used after release")
        return self._view

    @property
    def released(self) -> bool:
        """Whether release() (or the pool's close()) has ended this buffer's use."""
        return self._view is None

    def release(self) -> None:
        """Give the memory back to the pool (idempotent)."""
        if self._view is not None:
            still_viewed = self._drop_view()
            self._pool._give_back(self, reusable=not still_viewed)

    def _drop_view(self) -> bool:
        """Drop our view; True if something made from it (a numpy array, a slice, another
        memoryview) is still alive and so still reads this memory."""
        view, self._view = self._view, None
        if view is None:
            return False
        try:
            view.release()  # fails while an export of it (a numpy array over it) is alive
        except BufferError:
            return True
        del view
        # nothing of ours holds the exporter now: alive means a view made from ours holds it
        return self._exporter_ref() is not None

    def __enter__(self) -> HostBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


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
        self._blocks: list[_Block] = []  # every ggml buffer the pool holds
        self._free: list[_Block] = []
        self._in_use: dict[int, HostBuffer] = {}
        self._peak = 0
        self._closed = False

    @property
    def pinned(self) -> bool:
        """Whether the pool got a device host (pinned) buffer type rather than plain CPU memory."""
        return self.kind != "CPU"

    def alloc(self, nbytes: int) -> HostBuffer:
        """A buffer of at least nbytes (reused when a released one fits).

        ConfigError for an nbytes that is not an int >= 1 (before any native call),
        ClosedError after close(), InitError when the machine cannot give the memory.
        """
        check_int("nbytes", nbytes, lo=1, hi=_SIZE_MAX)
        with self._lock:
            if self._closed:
                raise ClosedError("HostBufferPool is closed")
            block = self._take_free(nbytes) or self._new_block(nbytes)
            buf = HostBuffer(self, block, nbytes)
            self._in_use[id(buf)] = buf
            self._peak = max(self._peak, self._bytes_in_use())
            return buf

    def copy_of(self, src: memoryview | bytes) -> HostBuffer:
        """A new buffer holding a copy of src's bytes (copy-on-fork of snapshot bytes); src
        may be any contiguous buffer, its size counted in bytes, not items."""
        data = memoryview(src).cast("B")
        buf = self.alloc(data.nbytes)
        buf.view[:] = data
        return buf

    def _take_free(self, nbytes: int) -> _Block | None:
        fits = [b for b in self._free if b.capacity >= nbytes]
        if not fits:
            return None
        best = min(fits, key=lambda b: b.capacity)
        self._free.remove(best)
        return best

    def _new_block(self, nbytes: int) -> _Block:
        block = _new_block(self._buft, self.kind, nbytes)
        self._blocks.append(block)
        return block

    def _give_back(self, buf: HostBuffer, reusable: bool) -> None:
        with self._lock:
            if self._in_use.pop(id(buf), None) is None or self._closed:
                return
            if reusable:
                self._free.append(buf.block)
            else:
                # Something made from the view still reads this memory: never hand it out
                # again. It is freed when the last such view goes.
                self._blocks.remove(buf.block)
                log.debug("retired a %d-byte buffer still viewed after release", buf.capacity)

    def _bytes_in_use(self) -> int:
        return sum(b.capacity for b in self._in_use.values())

    def trim(self) -> int:
        """Free every released buffer; returns the bytes freed."""
        with self._lock:
            freed = 0
            for block in self._free:
                self._blocks.remove(block)  # the last reference: the keeper frees it now
                freed += block.capacity
            self._free.clear()
            return freed

    def stats(self) -> PoolStats:
        """The pool's kind, byte totals and buffer counts (PoolStats), read under its lock."""
        with self._lock:
            return PoolStats(
                self.kind,
                sum(b.capacity for b in self._blocks),
                self._bytes_in_use(),
                self._peak,
                len(self._blocks),
                len(self._in_use),
            )

    def check(self) -> None:
        """Raise PoolError if the bookkeeping disagrees with the buffers held."""
        with self._lock:
            held = [id(b) for b in self._blocks]
            tracked = [id(b) for b in self._free]
            tracked += [id(b.block) for b in self._in_use.values()]
            if len(set(held)) != len(held) or sorted(held) != sorted(tracked):
                raise PoolError(
                    f"pool integrity: {len(held)} buffers held, {len(tracked)} "
                    "tracked (each must be held and tracked exactly once)"
                )
            if any(b.released for b in self._in_use.values()):
                raise PoolError("pool integrity: a released buffer is still marked in use")

    def close(self) -> None:
        """Free every buffer now, except those a live view still reads (freed when it goes);
        HostBuffers handed out refuse further use. Idempotent."""
        with self._lock:
            for buf in self._in_use.values():
                buf._drop_view()
            self._free.clear()
            self._in_use.clear()
            self._blocks.clear()
            self._closed = True

    def __enter__(self) -> HostBufferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
