"""One native handle, one owner: the pattern every wrapper shares.

The constructor acquires and calls `_own(free, ptr)`. A keeper object then frees the handle
exactly once (`weakref.finalize`), when the last reference to the keeper goes: the wrapper's
own (dropped by `close()`, `with` exit or collection), a child's (a context keeps its model's
keeper, so the model is freed after it), or an exported view's (`_export`: a numpy array over
a context's logits keeps the context's memory alive). So `close()` frees now unless something
still reads the memory, and nothing can read freed memory. The finalizer holds the raw pointer
and the free function, never `self`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Self

from ..errors import ClosedError


class Keeper:
    """Frees `handle` with `free` when the last reference to this object goes.

    `parent` (another Keeper) is held until then, so a parent is always freed after its child.
    """

    __slots__ = ("__weakref__", "finalizer", "parent")

    def __init__(self, free: Callable[[Any], None], handle: Any, parent: Keeper | None) -> None:
        self.parent = parent
        self.finalizer = weakref.finalize(self, free, handle)


class Owned:
    """Base of every native wrapper: acquire in the constructor, free through a Keeper."""

    _keeper: Keeper | None = None

    def _own(
        self, free: Callable[[Any], None], handle: Any, parent: Owned | Keeper | None = None
    ) -> None:
        """Own handle from now on; parent (an Owned, or a Keeper taken from one with `_hold`)
        is freed after it."""
        if isinstance(parent, Owned):
            parent = parent._keeper
        self._keeper = Keeper(free, handle, parent)

    def _hold(self) -> Keeper:
        """This wrapper's Keeper: while the caller holds it, the native handle lives on even
        if another thread closes the wrapper. ClosedError once closed."""
        keeper = self._keeper
        if keeper is None:
            raise ClosedError(f"{type(self).__name__} is closed")
        return keeper

    def _live(self, handle: Any) -> Any:
        """handle, or ClosedError once this wrapper is closed (never a dangling pointer)."""
        if self._keeper is None:
            raise ClosedError(f"{type(self).__name__} is closed")
        return handle

    def _export(self, ffi: Any, ptr: Any) -> Any:
        """`ptr` as a cffi pointer that keeps the handle alive as long as it (or a buffer or
        array made from it) lives."""
        keeper = self._hold()
        return ffi.gc(ptr, lambda _p, _k=keeper: None)

    def close(self) -> None:
        """Drop this wrapper's hold on the native handle (idempotent); it is freed now unless
        a child or an exported view still holds it, and then when the last one goes."""
        self._keeper = None

    @property
    def closed(self) -> bool:
        """Whether close() was called; the native handle may live on for children or views."""
        return self._keeper is None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
