"""Resident memory of this process, read the one way every leak test reads it."""

from __future__ import annotations

import contextlib
import ctypes
import gc

from swarmkv_bench.sysinfo import proc_status_bytes


def settled() -> None:
    """Collect garbage, then ask glibc to return freed heap pages (malloc_trim), so what
    remains resident is what is still held, not what the allocator kept for later."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_bytes(*, settle: bool = True) -> int:
    """VmRSS of this process in bytes (after settled() unless settle=False)."""
    return _field("VmRSS", settle)


def anon_rss_bytes(*, settle: bool = True) -> int:
    """RssAnon of this process in bytes: heap and anonymous mappings, no file-backed pages
    (a mapped snapshot file or the model's weights do not count)."""
    return _field("RssAnon", settle)


def _field(key: str, settle: bool) -> int:
    if settle:
        settled()
    value = proc_status_bytes(key)
    if value is None:
        raise AssertionError(f"no {key} in /proc/self/status: leak tests need Linux's /proc")
    return value
