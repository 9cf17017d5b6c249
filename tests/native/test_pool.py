"""HostBufferPool on a CPU-only build: allocation, reuse, bookkeeping, lifetime."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from swarmkv import ClosedError, ConfigError, HostBufferPool, InitError, PoolError


@pytest.fixture
def pool() -> Iterator[HostBufferPool]:
    with HostBufferPool() as p:
        yield p


def test_kind_is_cpu_without_a_gpu_backend(pool: HostBufferPool) -> None:
    assert pool.kind == "CPU"
    assert not pool.pinned
    assert HostBufferPool(prefer_device=False).kind == "CPU"


def test_alloc_gives_a_writable_view_of_exactly_nbytes(pool: HostBufferPool) -> None:
    buf = pool.alloc(1000)
    assert buf.nbytes == 1000
    assert len(buf.view) == 1000
    assert buf.capacity >= 1000
    assert not buf.view.readonly
    buf.view[:] = bytes(range(250)) * 4
    assert bytes(buf.view[:4]) == b"\x00\x01\x02\x03"
    arr = np.frombuffer(buf.view, dtype=np.uint8)
    assert int(arr.sum()) == 4 * sum(range(250))


def test_released_buffer_is_reused(pool: HostBufferPool) -> None:
    first = pool.alloc(4096)
    handle = first.handle
    first.release()
    first.release()  # idempotent
    allocated = pool.stats().bytes_allocated
    again = pool.alloc(4096)
    assert again.handle == handle
    assert pool.stats().bytes_allocated == allocated
    smaller = pool.alloc(100)  # nothing free: a new buffer
    assert smaller.handle != handle
    assert pool.stats().n_buffers == 2
    pool.check()


def test_reuse_takes_the_best_fitting_buffer(pool: HostBufferPool) -> None:
    big, medium, small = pool.alloc(10_000), pool.alloc(3_000), pool.alloc(1_000)
    handles = {"big": big.handle, "medium": medium.handle, "small": small.handle}
    for buf in (big, medium, small):
        buf.release()
    got = pool.alloc(2_000)
    assert got.handle == handles["medium"]
    assert got.nbytes == 2_000 and len(got.view) == 2_000
    assert pool.alloc(20_000).handle not in handles.values()
    pool.check()


def test_stats_track_use_and_peak(pool: HostBufferPool) -> None:
    empty = pool.stats()
    assert (empty.bytes_allocated, empty.bytes_in_use, empty.peak_in_use) == (0, 0, 0)
    assert (empty.n_buffers, empty.n_in_use, empty.kind) == (0, 0, "CPU")

    a, b = pool.alloc(1000), pool.alloc(3000)
    s = pool.stats()
    assert s.n_buffers == s.n_in_use == 2
    assert s.bytes_in_use == s.bytes_allocated == a.capacity + b.capacity >= 4000
    assert s.peak_in_use == s.bytes_in_use

    b.release()
    s = pool.stats()
    assert (s.n_buffers, s.n_in_use) == (2, 1)
    assert s.bytes_in_use == a.capacity
    assert s.peak_in_use == a.capacity + b.capacity
    pool.check()

    freed = pool.trim()
    s = pool.stats()
    assert freed == b.capacity
    assert (s.n_buffers, s.bytes_allocated) == (1, a.capacity)
    assert s.peak_in_use == a.capacity + b.capacity
    pool.check()


def test_check_detects_broken_bookkeeping(pool: HostBufferPool) -> None:
    buf = pool.alloc(64)
    pool.check()
    lost = pool._in_use.pop(id(buf))  # held by the pool, tracked nowhere
    with pytest.raises(PoolError, match="1 buffers held, 0 tracked"):
        pool.check()
    pool._in_use[id(buf)] = lost
    pool.check()
    buf._view = None  # released behind the pool's back but still marked in use
    with pytest.raises(PoolError, match="still marked in use"):
        pool.check()


def test_use_after_release(pool: HostBufferPool) -> None:
    buf = pool.alloc(128)
    buf.release()
    assert buf.released
    with pytest.raises(ClosedError, match="after release"):
        buf.view  # noqa: B018


def test_context_manager_releases(pool: HostBufferPool) -> None:
    with pool.alloc(256) as buf:
        assert pool.stats().n_in_use == 1
    assert buf.released
    assert pool.stats().n_in_use == 0


def test_copy_of_copies_the_bytes(pool: HostBufferPool) -> None:
    src = bytearray(b"swarm" * 100)
    copy = pool.copy_of(memoryview(src))
    assert bytes(copy.view) == bytes(src)
    src[0:5] = b"XXXXX"
    assert bytes(copy.view[:5]) == b"swarm"
    other = pool.copy_of(copy.view)
    copy.view[0] = 0
    assert bytes(other.view[:5]) == b"swarm"


@pytest.mark.parametrize("nbytes", [0, -1])
def test_alloc_of_no_bytes(pool: HostBufferPool, nbytes: int) -> None:
    with pytest.raises(ConfigError, match=f"nbytes must be >= 1, got {nbytes}"):
        pool.alloc(nbytes)


def test_alloc_beyond_what_the_machine_has_raises() -> None:
    with HostBufferPool() as pool, pytest.raises(InitError, match="failed"):
        pool.alloc(1 << 60)


def test_close_frees_everything_and_refuses_further_alloc() -> None:
    pool = HostBufferPool()
    held, released = pool.alloc(1000), pool.alloc(2000)
    released.release()
    pool.close()
    pool.close()  # idempotent
    assert pool.stats().bytes_allocated == 0
    assert pool.stats().n_buffers == 0
    with pytest.raises(ClosedError, match="closed"):
        pool.alloc(10)
    with pytest.raises(ClosedError):
        held.view  # noqa: B018
    held.release()  # harmless after close
    assert pool.stats().n_in_use == 0


def test_a_second_release_does_not_free_the_next_owners_buffer(pool: HostBufferPool) -> None:
    """release() is documented idempotent, but the pool hands the same HostBuffer object out
    again on reuse, so an old owner's repeated release (or use) reaches the new owner."""
    old = pool.alloc(100)
    old.release()
    new = pool.alloc(100)
    new.view[:5] = b"owned"
    old.release()  # idempotent: the old owner already gave its buffer back
    assert not new.released
    assert bytes(new.view[:5]) == b"owned"
    assert pool.stats().n_in_use == 1
    with pytest.raises(ClosedError):
        old.view  # noqa: B018
