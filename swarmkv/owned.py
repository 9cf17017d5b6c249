"""One native handle, one owner: the pattern every wrapper shares.

The constructor acquires and calls `_own(free, ptr)`; `weakref.finalize` then frees the handle
exactly once, on `close()`, on `with` exit, or when the wrapper is collected. The finalizer
holds the raw pointer and the free function, never `self`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Self

from .errors import SwarmKVError


class Owned:
    _finalizer: weakref.finalize

    def _own(self, free: Callable[[Any], None], handle: Any) -> None:
        self._finalizer = weakref.finalize(self, free, handle)

    def _live(self, handle: Any) -> Any:
        """handle, or SwarmKVError once this wrapper is closed (never a dangling pointer)."""
        if not self._finalizer.alive:
            raise SwarmKVError(f"{type(self).__name__} is closed")
        return handle

    def close(self) -> None:
        """Free the native handle now (idempotent)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
