"""A request to the server, as the engine thread sees it, and what it reports back.

The HTTP layer builds a Job, hands it to `Runtime.submit`, and reads events through its
`on_event` callback, which the engine thread calls (the HTTP layer hops them onto its own
event loop). Plain data: no native handle is reachable from here.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..llama.sampling import SamplerConfig

if TYPE_CHECKING:
    from ..engine.work import Request

# a constraint's "grammar" (complete, can take nothing more) is a stop; "truncated" (cut at
# max_tokens before the grammar completed) a length, as OpenAI and vLLM report both
FINISH_REASONS = {
    "eog": "stop",
    "stop": "stop",
    "length": "length",
    "grammar": "stop",
    "truncated": "length",
}


@dataclass(frozen=True)
class TokenEvent:
    """One generated token: its id, its bytes decoded so far (`text`, UTF-8 split across
    tokens held back until whole), and with logprobs its log-probability and the top ones."""

    token: int
    piece: bytes
    text: str
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class DoneEvent:
    """The request ended: finish_reason as OpenAI names it, the answer, token counts and
    times (ms from arrival)."""

    finish_reason: str
    text: str
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float | None
    inter_token_ms: tuple[float, ...]
    queue_ms: float


@dataclass(frozen=True)
class ErrorEvent:
    """The request failed (or was cancelled) with error."""

    error: BaseException


Event = TokenEvent | DoneEvent | ErrorEvent


@dataclass(eq=False)
class Job:
    """One completion choice: tokens to continue, how to sample, who may share its cells
    (scope), and where its events go."""

    tokens: list[int]
    max_tokens: int
    sampler: SamplerConfig
    on_event: Callable[[Event], None]
    stop: tuple[str, ...] = ()
    scope: str | None = ""
    priority: int = 0
    top_logprobs: int | None = None  # None: no logprobs; 0: the chosen token's only
    id: int = -1  # set by the runtime
    req: Request | None = field(default=None, repr=False)
    seq: int | None = None
    cached_tokens: int = 0
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"), repr=False
    )
    _row: tuple[float, tuple[tuple[int, float], ...]] | None = field(default=None, repr=False)

    def take_row(self, logits: np.ndarray, token: int) -> None:
        """Log-probabilities of the distribution this step's token was drawn from (the
        model's after an llguidance constraint's mask, before sampling settings), kept for
        the token event that follows. Tokens the constraint forbids have probability zero:
        they are left out of the top ones (JSON has no -inf), so fewer than asked may come."""
        if self.top_logprobs is None:
            return
        row = logits.astype(np.float64)
        peak = row.max()
        lse = peak + np.log(np.exp(row - peak).sum())
        top: tuple[tuple[int, float], ...] = ()
        k = min(self.top_logprobs, int(np.isfinite(row).sum()))
        if k:
            idx = np.argpartition(-row, k - 1)[:k]
            idx = idx[np.lexsort((idx, -row[idx]))]  # by logit, then id: a fixed order
            top = tuple((int(i), float(row[i] - lse)) for i in idx)
        self._row = (float(row[token] - lse), top)

    def token_event(self, token: int, piece: bytes) -> TokenEvent:
        """The event of a generated token (its logprobs taken by take_row). A token with no
        row was forced by the constraint, not drawn: its probability was one (log 0.0)."""
        text = self._decoder.decode(piece)
        lp, top = self._row if self._row is not None else self._forced(token)
        self._row = None
        return TokenEvent(token, piece, text, lp, top)

    def _forced(self, token: int) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        if self.top_logprobs is None:
            return None, ()
        return 0.0, ((token, 0.0),) if self.top_logprobs else ()
