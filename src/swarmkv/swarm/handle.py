"""What a submitted swarm branch gives back: a handle (future + token stream) to its result
(the engine's one BranchResult)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

from ..checks import check_seconds
from ..engine.result import BranchResult
from ..errors import TimeoutError


class BranchHandle:
    """A submitted branch: result() waits for it, stream() yields its token pieces as they
    are generated (every call from the first piece: a second stream() replays), done() polls.
    Thread-safe; the scheduler thread completes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._done = False
        self._result: BranchResult | None = None
        self._error: BaseException | None = None
        self._pieces: list[str] = []

    def done(self) -> bool:
        """Whether the branch finished (with a result or an error)."""
        with self._cond:
            return self._done

    def result(self, timeout: float | None = None) -> BranchResult:
        """The branch's result; raises its error, or swarmkv.TimeoutError after timeout s."""
        check_seconds("timeout", timeout, zero_ok=True)  # a wait of nan would not wait
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError(f"swarm branch {self.name!r} not finished after {timeout} s")
            if self._error is not None:
                raise self._error
            assert self._result is not None
            return self._result

    def stream(self) -> Iterator[str]:
        """Each generated token's text piece, from the first, as it comes; ends when the
        branch does (its error, if any, is raised at the end)."""
        seen = 0
        while True:
            with self._cond:
                self._cond.wait_for(functools.partial(self._has_more, seen))
                pieces, done = self._pieces[seen:], self._done
            yield from pieces
            seen += len(pieces)
            if done and not pieces:
                break
        if self._error is not None:
            raise self._error

    def _has_more(self, seen: int) -> bool:
        return seen < len(self._pieces) or self._done

    # -- the scheduler's side --------------------------------------------------------------
    def _piece(self, text: str) -> None:
        with self._cond:
            self._pieces.append(text)
            self._cond.notify_all()

    def _finish(self, result: BranchResult | None, error: BaseException | None) -> None:
        with self._cond:
            self._result, self._error, self._done = result, error, True
            self._cond.notify_all()
