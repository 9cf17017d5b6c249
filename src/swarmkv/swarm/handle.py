"""What a submitted swarm branch gives back: a handle (future + token stream) and its result."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..checks import check_seconds
from ..engine.work import Request
from ..errors import TimeoutError


@dataclass(frozen=True)
class SwarmBranchResult:
    """One finished swarm branch: output and latencies in milliseconds from its arrival.

    queue_ms: arrival to admission (a sequence and KV cells given); activation_ms: arrival
    to the first generated token; completion_ms: arrival to the last; inter_token_ms: the
    gaps between consecutive generated tokens.
    """

    name: str
    doc: str
    text: str
    tokens: tuple[int, ...]
    stop_reason: str
    priority: int
    prompt_tokens: int
    arrival_s: float  # seconds since the swarm started
    queue_ms: float
    activation_ms: float
    completion_ms: float
    inter_token_ms: tuple[float, ...] = field(default=(), repr=False)

    @staticmethod
    def of(req: Request, doc: str) -> SwarmBranchResult:
        """A finished engine request's output and latencies (ms from its arrival)."""
        st = req.state
        assert st is not None and req.admit_ns is not None
        first, end = st.span_ns()
        return SwarmBranchResult(
            name=req.name,
            doc=doc,
            text=st.text,
            tokens=tuple(st.tokens),
            stop_reason=st.stop_reason or "error",
            priority=req.priority,
            prompt_tokens=len(req.prompt),
            arrival_s=req.arrival_s,
            queue_ms=(req.admit_ns - req.arrival_ns) / 1e6,
            activation_ms=(first - req.arrival_ns) / 1e6,
            completion_ms=(end - req.arrival_ns) / 1e6,
            inter_token_ms=req.inter_token_ms(),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "name": self.name,
            "doc": self.doc,
            "text": self.text,
            "tokens": list(self.tokens),
            "stop_reason": self.stop_reason,
            "priority": self.priority,
            "prompt_tokens": self.prompt_tokens,
            "arrival_s": self.arrival_s,
            "queue_ms": self.queue_ms,
            "activation_ms": self.activation_ms,
            "completion_ms": self.completion_ms,
            "inter_token_ms": list(self.inter_token_ms),
        }


class BranchHandle:
    """A submitted branch: result() waits for it, stream() yields its token pieces as they
    are generated (every call from the first piece: a second stream() replays), done() polls.
    Thread-safe; the scheduler thread completes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._done = False
        self._result: SwarmBranchResult | None = None
        self._error: BaseException | None = None
        self._pieces: list[str] = []

    def done(self) -> bool:
        """Whether the branch finished (with a result or an error)."""
        with self._cond:
            return self._done

    def result(self, timeout: float | None = None) -> SwarmBranchResult:
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

    def _finish(self, result: SwarmBranchResult | None, error: BaseException | None) -> None:
        with self._cond:
            self._result, self._error, self._done = result, error, True
            self._cond.notify_all()
